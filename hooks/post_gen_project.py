"""After rendering: remove what the answers leave out, start git, then run the project's scripts/make_env.py
(environment, smoke test, next steps). Standard library only; never a non-zero exit (cookiecutter deletes on one)."""

from __future__ import annotations  # cookiecutter may run under a Python older than the project's

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ANSWERS = json.loads(r"""{{ cookiecutter | jsonify }}""")
SETUP_ENV = ANSWERS["setup_env"]
# Every answer, with the private keys: cruft sets _commit and not _output_dir; cookiecutter the reverse.
RENDERED_BY_CRUFT = "_commit" in ANSWERS and "_output_dir" not in ANSWERS
# "1" runs the environment and smoke-test steps even in CI or without a terminal; "0" never runs them.
FORCE = "LIGHTNING_TEMPLATE_SETUP"
MAKE_ENV = str(Path("scripts") / "make_env.py")  # the project's own, which users rerun
# How a user sets the project up later; `current` is this Python's, cookiecutter's.
SETUP = [sys.executable if SETUP_ENV == "current" else "python3", MAKE_ENV, {"none": "uv"}.get(SETUP_ENV, SETUP_ENV)]
# A feature's own files by (question, the answer that keeps them): modules by name, in any folder of src/, tests in
# tests/, others; removed whole when the answers leave it out, but a file two features share stays while either is kept.
FILES_OF = {
    ("logger", "wandb"): (["wandb_logging"], ["test_wandb_logging"], ["docs/wandb.md"]),
    ("accelerator", "mps"): ([], [], ["configs/trainer/mps.yaml"]),
    ("inference", "yes"): (
        ["classify", "export", "predictor"],
        ["test_classify", "test_export"],
        ["docs/inference.md"],
    ),
    ("serving", "yes"): (["serve", "image_requests"], ["test_serve"], ["docs/serving.md"]),
    ("experiments", "yes"): (
        ["sweep", "crossval", "search_space", "experiment_runs", "tuned_config"],
        ["test_sweep", "test_crossval", "test_parallel_experiments"],
        ["docs/experiments.md", "configs/sweep.yaml", "scripts/sweep.sbatch"],
    ),
    ("tuning", "yes"): (["tune", "benchmark", "tuned_config"], ["test_tune", "test_benchmark"], ["docs/tuning.md"]),
    ("timm", "yes"): (["timm_backbones"], ["test_timm"], []),
    ("streaming", "yes"): (["streaming", "shard"], ["test_streaming"], ["docs/streaming.md"]),
}


def remove_unchosen_features() -> None:
    kept, unchosen = set(), set()
    for (question, keeping_answer), (modules, tests, others) in FILES_OF.items():
        paths = {str(p) for m in modules for p in Path("src").rglob(f"{m}.py")} | {f"tests/{t}.py" for t in tests}
        (kept if ANSWERS[question] == keeping_answer else unchosen).update(paths | set(others))
    for path in unchosen - kept:
        Path(path).unlink()


def main() -> None:
    sys.stdout.reconfigure(line_buffering=True)  # each line before what make_env.py prints after it
    remove_unchosen_features()
    if in_temporary_folder():
        # cruft diffs renders like this one against the project: a repository, .venv or runs/ would join the update.
        print("Rendered into a temporary folder (cruft update or diff): no repository, environment or smoke test.")
        return
    start_git()
    smoke = ["--smoke"] if ANSWERS["smoke_test"] == "yes" else []
    if skipped := skip_reason():  # make_env.py, once run, says what to run next
        print(f"No environment or smoke test: {skipped}.")
        print(f"\nNext:\n  cd {Path.cwd()}\n  {shlex.join([*SETUP, *smoke])}")
        return
    setup = subprocess.Popen([sys.executable, MAKE_ENV, SETUP_ENV, *smoke])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is make_env.py's, which says how to finish
    if setup.wait() != 0:
        print(f"The project is kept in {Path.cwd()}.")


def skip_reason() -> str | None:
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if SETUP_ENV == "none":
        return "setup_env=none (no environment, so no smoke test either)"
    if os.environ.get(FORCE) in ("0", "1"):
        return f"{FORCE}=0" if os.environ[FORCE] == "0" else None
    if in_ci or sys.stdin is None or not sys.stdin.isatty():
        return f"{'CI is set' if in_ci else 'no terminal'} (set {FORCE}=1 to run them anyway)"
    return None


def in_temporary_folder() -> bool:
    """cruft update and cruft diff render the template into tempfile.TemporaryDirectory() folders."""
    outer = Path.cwd().parent
    return outer.parent == Path(tempfile.gettempdir()).resolve() and bool(re.fullmatch(r"tmp[a-z0-9_]{8}", outer.name))


def start_git() -> None:
    if shutil.which("git") is None:
        print("git is not installed: no repository was made.")
        return
    if subprocess.run(["git", "rev-parse", "--git-dir"], cwd="..", capture_output=True).returncode == 0:
        print("The project is inside a git repository already: no new repository was made.")
        return
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["git", "add", "-A"], check=True)
    if RENDERED_BY_CRUFT:
        # cruft writes .cruft.json after this hook, and `cruft update` refuses a repository with
        # uncommitted files: the first commit must wait for it.
        print("git: a repository with the files staged. Once cruft has written .cruft.json, commit it with them:")
        print("  git add .cruft.json && git commit -m 'New project from lightning-template'")
        return
    commit = subprocess.run(["git", "commit", "-q", "-m", "New project from lightning-template"], capture_output=True)
    if commit.returncode == 0:
        print("git: a repository with a first commit of the generated files.")
    else:
        print("git: a repository with the files staged; commit them once git knows your name and email.")


if __name__ == "__main__":
    try:
        main()
    except (Exception, KeyboardInterrupt) as error:  # any exit status but 0 makes cookiecutter delete the project
        print(f"\nThe setup stopped: {error!r}")
        print(f"The project is kept in {Path.cwd()}; set it up with: {shlex.join(SETUP)}")
