"""README's set-up commands and CI stay in step."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


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


def test_readme_python_examples_run():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    offline = [b for b in blocks if not b.startswith("# Downloads the official weights")]
    assert len(blocks) - len(offline) <= 1 and offline
    for block in offline:
        exec(compile(block, "README.md", "exec"), {})
