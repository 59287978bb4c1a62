"""The README's commands are the ones that CI and the tests run."""

import json
import re

from conftest import TEMPLATE

README = (TEMPLATE / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    (command,) = [line for line in (TEMPLATE / ".ci/run").read_text().splitlines() if "pytest" in line]
    assert f"\n{command}\n" in README


def test_readme_lists_every_question_with_its_default():
    answers = json.loads((TEMPLATE / "cookiecutter.json").read_text())
    for key, value in answers.items():
        if key.startswith("_"):
            continue
        (row,) = [line for line in README.splitlines() if line.startswith(f"| `{key}` |")]
        default = value[0] if isinstance(value, list) else value
        if "{{" not in default:
            assert re.search(rf"\| {re.escape(default)} \|", row), f"README gives another default for {key}"
