"""After rendering: drop the files of options not chosen, start git, then run the project's own
scripts/make_env.py and `doctor --smoke` (which users rerun) and pass on what they say.

Standard library only: this runs under the interpreter that runs cookiecutter. It never exits
non-zero, because cookiecutter then deletes the project: a failed step says so and keeps it.
"""

from __future__ import annotations  # cookiecutter may run under a Python older than the project's

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Every answer as cookiecutter holds it, with its private keys (_output_dir; cruft's _commit).
ANSWERS = json.loads(r"""{{ cookiecutter | jsonify }}""")
PACKAGE = ANSWERS["package_name"]
# cruft sets _commit and not _output_dir; cookiecutter sets _output_dir and not _commit.
RENDERED_BY_CRUFT = "_commit" in ANSWERS and "_output_dir" not in ANSWERS
# "1" runs the environment and smoke-test steps even in CI or without a terminal; "0" never runs
# them. A template update's temporary render never runs them.
FORCE = "LIGHTNING_TEMPLATE_SETUP"
SETUP_ENV = ANSWERS["setup_env"]
MAKE_ENV = str(Path("scripts") / "make_env.py")  # the project's own, which users rerun
LOG = Path("runs") / "smoke-test" / "setup.log"
VENV_PYTHON = str(Path(".venv") / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
# A feature's own files, removed whole when the answers leave it out: (question, the answer that keeps them).
FILES_OF = {
    ("logger", "wandb"): [f"src/{PACKAGE}/wandb_logging.py", "tests/test_wandb_logging.py", "docs/wandb.md"],
    ("accelerator", "mps"): ["configs/trainer/mps.yaml"],
    ("serving", "yes"): [f"src/{PACKAGE}/{name}.py" for name in ("serve", "image_requests")]
    + ["tests/test_serve.py", "docs/serving.md"],
}


def main() -> None:
    for (question, keeping_answer), paths in FILES_OF.items():
        for path in paths if ANSWERS[question] != keeping_answer else []:
            Path(path).unlink()
    if in_temporary_folder():
        # cruft diffs renders like this one against the project: a repository, .venv or runs/ in
        # it would become part of the update.
        say("Rendered into a temporary folder (cruft update or diff): no repository, environment or smoke test.")
        return
    start_git()
    skipped = skip_reason()
    if skipped:
        say(f"No environment or smoke test: {skipped}.")
        print_next_steps(None)
        return
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    if subprocess.run([sys.executable, MAKE_ENV, SETUP_ENV, "--log", str(LOG)]).returncode != 0:
        print(f"The project is kept in {Path.cwd()}.")
        if ANSWERS["smoke_test"] == "yes":
            print("smoke test not run: the environment is not ready")
        return
    python = sys.executable if SETUP_ENV == "current" else VENV_PYTHON
    if ANSWERS["smoke_test"] == "yes" and not smoke_test(python):
        return
    print_next_steps(python)


def skip_reason() -> str | None:
    forced = os.environ.get(FORCE)
    if SETUP_ENV == "none":
        return "setup_env=none (no environment, so no smoke test either)"
    if forced in ("0", "1"):
        return f"{FORCE}=0" if forced == "0" else None
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return f"CI is set (set {FORCE}=1 to run them anyway)"
    if sys.stdin is None or not sys.stdin.isatty():
        return f"no terminal (set {FORCE}=1 to run them anyway)"
    return None


def in_temporary_folder() -> bool:
    """cruft update and cruft diff render the template into tempfile.TemporaryDirectory() folders."""
    parent = Path.cwd().parent
    return (
        bool(re.fullmatch(r"tmp[a-z0-9_]{8}", parent.name)) and parent.parent == Path(tempfile.gettempdir()).resolve()
    )


def start_git() -> None:
    if shutil.which("git") is None:
        say("git is not installed: no repository was made.")
        return
    inside = subprocess.run(["git", "rev-parse", "--git-dir"], cwd="..", capture_output=True)
    if inside.returncode == 0:
        say("The project is inside a git repository already: no new repository was made.")
        return
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["git", "add", "-A"], check=True)
    if RENDERED_BY_CRUFT:
        # cruft writes .cruft.json after this hook, and `cruft update` refuses a repository with
        # uncommitted files: the first commit must wait for it.
        say("git: a repository with the files staged. Once cruft has written .cruft.json, commit it with them:")
        say("  git add .cruft.json && git commit -m 'New project from lightning-template'")
        return
    commit = subprocess.run(["git", "commit", "-q", "-m", "New project from lightning-template"], capture_output=True)
    if commit.returncode == 0:
        say("git: a repository with a first commit of the generated files.")
    else:
        say("git: a repository with the files staged; commit them once git knows your name and email.")


def smoke_test(python: str) -> bool:
    """The project's own smoke test, which users rerun; its summary is the verdict. True when it passed."""
    say(f"Smoke test: {PACKAGE} doctor --smoke (a fast_dev_run, then a two-batch fit and its checkpoint) ...")
    command = [python, "-m", PACKAGE, "doctor", "--smoke"]
    env = os.environ | {"PYTHONPATH": f"src{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}  # for setup_env=current
    with LOG.open("a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        log.write(done.stdout)
    output = done.stdout.strip().splitlines()
    print(f"\n==== {ANSWERS['project_slug']}: setup summary ====")
    print("\n".join(output or ["(no output)"]))
    print(f"Setup log: {Path.cwd() / LOG}")
    if output[-1:] == ["smoke test passed"]:
        return True
    if output[-1:] != ["smoke test failed"]:  # it did not get to run: the project does not import
        print(f"Failed command: {' '.join(command)} (its error is at the end of the log)\nsmoke test failed")
    print(f"The project is kept in {Path.cwd()}.")
    return False


def print_next_steps(python: str | None) -> None:
    if python == sys.executable:  # setup_env=current: the Python that ran cookiecutter, which `python` may not be
        run = f"PYTHONPATH=src {shlex.quote(python)} -m"
    else:  # the project's .venv, made now or by the line below; Debian and Ubuntu have no `python` outside it
        run = ". .venv/bin/activate && python -m"
    print(f"\nNext:\n  cd {Path.cwd()}")
    if not python:
        print(f"  python3 {MAKE_ENV} {SETUP_ENV if SETUP_ENV != 'none' else 'uv'}")
    print(f"  {run} {PACKAGE} doctor")
    print(f"  {run} {PACKAGE} fit")
    print(f"  {run} pytest")


def say(message: str) -> None:
    print(message, flush=True)
    if LOG.parent.is_dir():
        with LOG.open("a") as log:
            log.write(f"# {message}\n")


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # any exit status but 0 makes cookiecutter delete the project
        print(f"\nThe setup stopped on an unexpected error: {error!r}")
        print(f"The project is kept in {Path.cwd()}; set it up with: python3 {MAKE_ENV}")
