"""The generated project's tooling: its CI workflow, pre-commit hooks and Makefile."""

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import render, run_bounded

# The test environment's tools (ruff, pre-commit) stand in for the project's own .venv.
TOOLS = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def test_workflow_keeps_its_github_expressions_and_the_answers(tmp_path):
    project = render(tmp_path, python_version="3.12")
    workflow = yaml.safe_load((project / ".github/workflows/tests.yml").read_text())
    job = workflow["jobs"]["test"]
    assert job["strategy"]["matrix"]["python-version"] == ["3.12"]
    assert job["steps"][1]["with"]["python-version"] == "${{ matrix.python-version }}"
    assert workflow["concurrency"]["group"] == "${{ github.workflow }}-${{ github.ref }}"
    # Each command in the environment the CPU wheels went into: `uv run` alone syncs it from PyPI first.
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert "uv run --no-sync pytest -n auto" in runs
    assert all(" --no-sync " in part for line in runs for part in line.split("&&") if "uv run" in part)


def pre_commit(project: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pre_commit", "run", "--all-files"]
    return run_bounded(command, 300, cwd=project, env=os.environ | TOOLS)


def test_pre_commit_hooks_pass_on_the_project_and_fix_a_bad_file(tmp_path):
    project = render(tmp_path)
    assert (project / ".git").is_dir()
    clean = pre_commit(project)
    assert clean.returncode == 0, clean.stdout + clean.stderr

    bad = project / "src" / "image_classifier" / "scratch.py"
    bad.write_text("import os\nx=[1,\n2]\n")
    subprocess.run(["git", "add", str(bad)], cwd=project, check=True)
    fixed = pre_commit(project)
    assert fixed.returncode != 0, "the hooks should have changed the file"
    assert bad.read_text() == "x = [1, 2]\n"


def test_pre_commit_hooks_find_the_ruff_of_venv_with_no_environment_activated(tmp_path):
    # A commit from an IDE or a new terminal: "Executable `ruff` not found", and the commit was blocked.
    project = render(tmp_path)
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / ".venv" / "bin" / "ruff").symlink_to(Path(sys.executable).parent / "ruff")
    bad = project / "src" / "image_classifier" / "scratch.py"
    bad.write_text("import os\nx=[1,\n2]\n")
    subprocess.run(["git", "add", str(bad)], cwd=project, check=True)
    bare = {"PATH": os.pathsep.join(("/usr/bin", "/bin"))}  # git and sh, and no environment's tools
    command = [sys.executable, "-m", "pre_commit", "run", "--files", str(bad)]
    fixed = run_bounded(command, 300, cwd=project, env=os.environ | bare)
    assert "not found" not in fixed.stdout + fixed.stderr, fixed.stdout + fixed.stderr
    assert bad.read_text() == "x = [1, 2]\n"


def test_make_lint_and_test_run_the_projects_commands(tmp_path):
    project = render(tmp_path)
    # `make` alone lists the targets; it was `install`, which builds .venv (5 GB of torch).
    listed = subprocess.run(["make"], cwd=project, capture_output=True, text=True)
    assert listed.returncode == 0 and not (project / ".venv").exists(), listed.stderr
    targets = re.findall(r"^  make (\w+) +\S", listed.stdout, re.MULTILINE)
    assert targets == ["help", "install", "test", "lint", "format", "doctor", "fit", "resume", "image"], listed.stdout
    # Without .venv (setup_env current), python3 with src/ on its path.
    for venv, python in ((False, "python3"), (True, ".venv/bin/python")):
        if venv:
            (project / ".venv/bin").mkdir(parents=True)
            (project / ".venv/bin/python").touch()
        printed = subprocess.run(["make", "-n", "test", "fit"], cwd=project, capture_output=True, text=True)
        assert printed.stdout.split("\n")[:2] == [f"{python} -m pytest -n auto", f"{python} -m image_classifier fit"]
    lint = subprocess.run(["make", "lint", f"PYTHON={sys.executable}"], cwd=project, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
