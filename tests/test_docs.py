"""The documentation: README's set-up commands and CI stay in step; the site builds with
mkdocs in strict mode (a warning fails it, a broken link or API reference included); every
Python block of README and of the guides runs."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The first line of the one kind of block that is not run: it downloads the official weights.
DOWNLOADS = "# Downloads the official weights"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    commands = readme_commands()
    assert len(commands) == 2, commands
    main_job, test_command = commands
    assert "pytest" in test_command and "pytest" not in main_job
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test_command in ci_lines


def python_blocks(page):
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.S)


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the blocks name files of the checkout (the shipped fixtures)
    blocks = python_blocks(page)
    offline = [b for b in blocks if not b.startswith(DOWNLOADS)]
    assert offline
    for block in offline:
        exec(compile(block, str(page.relative_to(ROOT)), "exec"), {"__name__": "__docs__"})


def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # The API reference is generated from the docstrings: the builder's section is there.
    page = (tmp_path / "site" / "reference" / "models" / "index.html").read_text()
    assert 'id="keras_vit.model.ViT"' in page and "position_embedding" in page
