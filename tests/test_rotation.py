"""The slow tests that run in turn: each on exactly one day of the rotation, no day longer than it must be."""

import collections
import re
import subprocess
import sys

from conftest import ROTATION_DAYS, TEMPLATE, rotation_day


def test_each_rotated_test_runs_on_one_day_and_the_days_take_about_as_long():
    # One long test and many short ones, as CI has (its GPU dry run): turns by name put it beside half
    # of the others, and that day took 2 minutes longer.
    seconds = dict(zip([f"tests/test_tool.py::test_{letter}" for letter in "abcdefghij"],
                       [10, 240, 95, 80, 60, 50, 45, 25, 25, 10], strict=True))  # fmt: skip
    days = rotation_day(seconds)
    assert set(days) == set(seconds) and set(days.values()) == set(range(ROTATION_DAYS))
    totals = collections.Counter()
    for name, day in days.items():
        totals[day] += seconds[name]
    # No longer than the longest test or an even share, within 5 % (turns by name: 30 % longer).
    assert max(totals.values()) <= 1.05 * max(max(seconds.values()), sum(seconds.values()) / ROTATION_DAYS)
    assert rotation_day(dict(reversed(seconds.items()))) == days, "the day follows the times, not the order"


def pytest_summary(*options: str) -> str:
    # --setup-plan collects and applies the skip marks but runs no test.
    command = [sys.executable, "-m", "pytest", "-m", "rotated", "--run-slow", "-q", "-p", "no:cacheprovider", *options]
    listed = subprocess.run(command, cwd=TEMPLATE, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stdout[-2000:]
    return listed.stdout


def test_run_slow_skips_the_other_days_share_and_rotation_all_runs_every_one():
    rotated = pytest_summary("--collect-only").count("::test_")
    assert rotated >= ROTATION_DAYS
    skipped_today = re.search(r"(\d+) skipped", pytest_summary("--setup-plan"))
    assert skipped_today and 0 < int(skipped_today[1]) < rotated
    assert " skipped" not in pytest_summary("--setup-plan", "--rotation=all")
