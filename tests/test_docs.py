"""The documentation: README's set-up commands and CI stay in step; the site builds with
mkdocs in strict mode (a warning fails it, a broken link or API reference included); every
Python block of README and of the guides runs.

The Python blocks of one page run in order in one namespace, as a reader runs them top to
bottom, with the repository root as the working directory (they read shipped files such as
the test fixtures). They write only to temporary folders they make themselves
(`tempfile.mkdtemp()`), and the download cache (`$KERAS_VIT_HOME`) is a temporary folder
too: the test fails if a page leaves anything new or changed in the checkout."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from keras_vit import weights

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


def checkout_files():
    """Every file of the checkout outside hidden folders and caches, with its size and
    modification time."""
    files = {}
    for folder, subfolders, names in os.walk(ROOT):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d != "__pycache__"]
        for name in names:
            path = os.path.join(folder, name)
            stat = os.stat(path)
            files[os.path.relpath(path, ROOT)] = (stat.st_size, stat.st_mtime_ns)
    return files


@pytest.mark.parametrize("page", [p for p in PAGES if python_blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the blocks name files of the checkout (the shipped fixtures)
    monkeypatch.setattr(weights.registry, "_REGISTERED", {})  # a block's registrations end here
    monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / "keras_vit_home"))
    blocks = python_blocks(page)
    offline = [b for b in blocks if not b.startswith(DOWNLOADS)]
    assert offline
    before = checkout_files()
    namespace = {"__name__": "__docs__"}  # one page, one reader: the blocks build on each other
    for block in offline:
        exec(compile(block, str(page.relative_to(ROOT)), "exec"), namespace)
    after = checkout_files()
    changed = sorted(path for path in set(before) | set(after) if before.get(path) != after.get(path))
    assert not changed, f"{page.name} wrote into the checkout: {changed[:10]}"


def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # The API reference is generated from the docstrings: the builder's section is there.
    page = (tmp_path / "site" / "reference" / "models" / "index.html").read_text()
    assert 'id="keras_vit.model.ViT"' in page and "position_embedding" in page
