"""What a user receives, in size: the minimal render (every capability off), the default one and the
full one (every capability on), as docs/development.md prints them."""

import re
from pathlib import Path

from conftest import CAPABILITY_FILES, EVERY_CAPABILITY, TEMPLATE, render

RENDERS = {
    "minimal": dict.fromkeys(CAPABILITY_FILES, "no"),
    "default": {},
    "full": EVERY_CAPABILITY,
}
ROW = re.compile(r"^\| (minimal|default|full) \| (\d+) \| ([\d,]+) \| (\d+) \| ([\d,]+) \| (\d+) \|$", re.MULTILINE)


def lines(files: list[Path]) -> int:
    return sum(len(path.read_text().splitlines()) for path in files)


def sizes(project: Path) -> tuple[int, int, int, int, int]:
    """Modules and lines in src/, test files and their lines, docs pages."""
    modules, tests = sorted((project / "src").rglob("*.py")), sorted((project / "tests").glob("*.py"))
    return len(modules), lines(modules), len(tests), lines(tests), len(list((project / "docs").glob("*.md")))


def table_row(name: str, measured: tuple[int, ...]) -> str:
    return f"| {name} | " + " | ".join(f"{value:,}" for value in measured) + " |"


def test_the_sizes_in_docs_development_are_the_renders(tmp_path):
    measured = {name: sizes(render(tmp_path / name, **answers)) for name, answers in RENDERS.items()}
    fresh = "\n".join(table_row(name, values) for name, values in measured.items())
    documented = {
        name: tuple(int(value.replace(",", "")) for value in values)
        for name, *values in ROW.findall((TEMPLATE / "docs" / "development.md").read_text())
    }
    assert documented.keys() == measured.keys(), f"docs/development.md lacks the table; today's:\n{fresh}"
    for name, values in measured.items():
        counts, line_counts = values[::2], values[1::2]
        stale = documented[name][::2] != counts or any(
            abs(now - then) > 0.02 * then for now, then in zip(line_counts, documented[name][1::2], strict=True)
        )
        assert not stale, f"docs/development.md's sizes are out of date (2 % on lines); today's:\n{fresh}"
    # A capability switched off takes its lines with it.
    assert measured["minimal"][1] < measured["default"][1] <= measured["full"][1]
