"""The documentation site as a reader sees it at a laptop's 1280 px: the rendered HTML of one
strict build (made once for this module) says what each argument of the API reference is
(its type) and what it defaults to (a value, not a constant's name), its code blocks wrap
instead of hiding their ends behind a scroll bar, and the home page installs the package as
the README does. Where a headless Chromium is installed (Debian's `chromium-headless-shell`
or `chromium`), four pages are also laid out at 1280 px and measured: nothing is cut off.

(tests/test_docs.py checks that the site builds strictly and that its Python blocks run.)"""

import ast
import html
import json
import pathlib
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXTRA_CSS = "stylesheets/extra.css"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs_site") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(folder)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


def text_of(fragment):
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def parameter_rows(site):
    """`(page, name, type, default)` for each row of the API reference's parameter tables."""
    rows = []
    for page in sorted((site / "reference").rglob("index.html")):
        for table in re.findall(r"<table>(.*?)</table>", page.read_text(), re.S):
            heads = [text_of(h) for h in re.findall(r"<th[^>]*>(.*?)</th>", table, re.S)]
            if heads[:2] != ["Name", "Type"]:
                continue
            for row in re.findall(r'<tr class="doc-section-item">(.*?)</tr>', table, re.S):
                cells = dict(zip(heads, map(text_of, re.findall(r"<td[^>]*>(.*?)</td>", row,
                                                                re.S))))
                rows.append((page.parent.name, cells["Name"], cells["Type"],
                             cells.get("Default", "")))
    return rows


def package_constants():
    """Every module-level UPPER_CASE name of keras_vit with its defining expression's source."""
    constants = {}
    for path in (ROOT / "keras_vit").rglob("*.py"):
        source = path.read_text()
        for node in ast.parse(source).body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]+",
                                                                     target.id):
                        constants[target.id] = ast.get_source_segment(source, node.value)
    return constants


def test_every_parameter_of_the_reference_has_a_type(site):
    rows = parameter_rows(site)
    assert len(rows) > 200, len(rows)  # the tables were found
    untyped = [(page, name) for page, name, kind, _ in rows if not kind]
    assert not untyped, f"{len(untyped)} parameters without a type: {untyped[:10]}"
    # The keras-hub form `name: type. What it is.` gives the type; the description goes on.
    vit = {name: kind for page, name, kind, _ in rows if page == "models"}
    assert vit["image_size"] == "int or (height, width)" and vit["include_top"] == "bool"


def test_defaults_show_values_not_the_names_of_constants(site):
    constants = package_constants()
    assert "DEFAULT_TOP_K" in constants
    named = r"\b(?:\w+\.)*(%s)\b" % "|".join(sorted(constants, key=len, reverse=True))
    shown = [(page, name, default) for page, name, _, default in parameter_rows(site)
             if re.fullmatch(named, default)]
    assert not shown, f"defaults shown as constant names: {shown[:10]}"
    # Nor in a signature (`fewshot_table(..., l2_regs=DEFAULT_L2_REGS)`).
    for page in sorted((site / "reference").rglob("index.html")):
        signatures = re.findall(r"=\s*" + named, text_of(page.read_text()))
        assert not signatures, f"{page.parent.name}: defaults named {sorted(set(signatures))}"
    # The value is the constant's: `export_saved_model(top_k=DEFAULT_TOP_K)` shows 5.
    export = {name: default for page, name, _, default in parameter_rows(site)
              if page == "export"}
    assert export["top_k"] == str(ast.literal_eval(constants["DEFAULT_TOP_K"]))


def css_rules(css):
    """`{selector: declarations}` of a stylesheet without at-rules."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return {" ".join(selector.split()): " ".join(body.split())
            for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css)
            for selector in selectors.split(",")}


def test_code_blocks_wrap_instead_of_scrolling(site):
    rules = css_rules((site / EXTRA_CSS).read_text())
    wrap = rules.get(".md-typeset pre > code", "")
    assert "white-space: pre-wrap" in wrap and "overflow-wrap: anywhere" in wrap, rules
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        text = page.read_text()
        if "<pre" not in text:
            continue
        # Every page links the stylesheet, and each of its code blocks is a `pre > code` in
        # the page's `md-typeset` content, which the rule reaches.
        assert re.search(r'<link[^>]+href="[./]*%s"' % re.escape(EXTRA_CSS), text), page
        content = re.search(r'<article class="[^"]*\bmd-typeset\b[^"]*">(.*)</article>', text,
                            re.S).group(1)
        assert content.count("<pre") == text.count("<pre"), page
        for block in re.findall(r"<pre[^>]*>(.*?)</pre>", content, re.S):
            assert re.match(r"(<span></span>)?<code", block), (page, block[:80])


def install_commands(text):
    """The commands of the first bash block after the "## Install" heading."""
    section = text.split("\n## Install\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_home_page_installs_as_the_readme_does(site):
    readme = (ROOT / "README.md").read_text()
    home = install_commands((ROOT / "docs" / "index.md").read_text())
    expected = install_commands(readme)
    assert expected and home[:len(expected)] == expected, (home, expected)
    # What the home page adds (the docs extra) is the README's command too.
    for command in home[len(expected):]:
        assert command in readme, command
    # And the rendered page shows them.
    rendered = text_of((site / "index.html").read_text())
    assert all(command in rendered for command in home)


def browser():
    return shutil.which("chromium-headless-shell") or shutil.which("chromium")


# Each code block and table of the content, laid out at 1280 px: its width in the page, and
# whether anything in it lies beyond what it shows (a horizontal scroll bar).
MEASURE = """<script>
addEventListener("load", () => {
  const cut = [];
  for (const el of document.querySelectorAll(".md-content pre > code, .md-content table")) {
    const box = el.closest(".md-typeset__scrollwrap") || el;
    if (el.scrollWidth > el.clientWidth + 1 || box.scrollWidth > box.clientWidth + 1)
      cut.push(el.textContent.slice(0, 60));
  }
  const content = document.querySelector(".md-content").getBoundingClientRect().width;
  const result = document.createElement("pre");
  result.id = "measured";
  result.textContent = JSON.stringify({cut, content, width: innerWidth});
  document.body.appendChild(result);
});
</script>"""


@pytest.mark.parametrize("page", ["index.html", "guides/models/index.html",
                                  "guides/errors/index.html", "reference/models/index.html"])
def test_nothing_is_cut_off_at_1280_px_in_a_browser(site, page, tmp_path):
    if browser() is None:  # .ci/run installs it: there, its absence fails the test
        reason = "no headless Chromium installed (Debian: apt-get install chromium-headless-shell)"
        (pytest.fail if os.environ.get("KERAS_VIT_CI") == "1" else pytest.skip)(reason)
    # A copy of the page with the measuring script, beside the site's assets.
    copy = tmp_path / "site"
    shutil.copytree(site, copy)
    target = copy / page
    target.write_text(target.read_text().replace("</head>", MEASURE + "</head>"))
    dom = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu",
                          "--window-size=1280,900", "--virtual-time-budget=5000", "--dump-dom",
                          target.as_uri()], capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    measured = json.loads(html.unescape(found.group(1)))
    assert measured["width"] == 1280, measured
    # The page gives its content most of the window (the table of contents sits in the
    # navigation column), and no code block or table hides its end.
    assert measured["content"] > 900, measured
    assert not measured["cut"], measured["cut"]
