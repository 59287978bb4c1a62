"""After rendering: drop the files of options not chosen, start git, make the environment, smoke-test.

Standard library only: this runs under the interpreter that runs cookiecutter. It never exits
non-zero, because cookiecutter deletes the project when a post-generation hook fails: a failed
install or smoke test prints what failed, the log and the likely fix, and keeps the project.
"""

from __future__ import annotations  # cookiecutter may run under a Python older than the project's

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse

# Every answer as cookiecutter holds it, with its private keys (_output_dir; cruft's _commit).
ANSWERS = json.loads(r"""{{ cookiecutter | jsonify }}""")
PACKAGE = ANSWERS["package_name"]
# cruft sets _commit and not _output_dir; cookiecutter sets _output_dir and not _commit.
RENDERED_BY_CRUFT = "_commit" in ANSWERS and "_output_dir" not in ANSWERS
# "1" runs the environment and smoke-test steps even in CI or without a terminal; "0" never runs
# them. A template update's temporary render never runs them.
FORCE = "LIGHTNING_TEMPLATE_SETUP"
# PyTorch's CPU-only wheels, for projects that train on the CPU; the variable points at a mirror.
CPU_WHEELS = os.environ.get("LIGHTNING_TEMPLATE_CPU_WHEELS", "https://download.pytorch.org/whl/cpu")
LOG = Path("runs") / "smoke-test" / "setup.log"
VENV_PYTHON = str(Path(".venv") / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
UNSELECTED = {
    Path("src") / PACKAGE / "wandb_logging.py": ANSWERS["logger"] != "wandb",
    Path("tests") / "test_wandb_logging.py": ANSWERS["logger"] != "wandb",
    Path("configs") / "trainer" / "mps.yaml": ANSWERS["accelerator"] != "mps",
}


class StepFailed(Exception):
    def __init__(self, command: list[str], fix: str) -> None:
        super().__init__(" ".join(command))
        self.command, self.fix = command, fix


def main() -> None:
    for path, unselected in UNSELECTED.items():
        if unselected:
            path.unlink()
    if in_temporary_folder():
        # cruft diffs renders like this one against the project: a repository, .venv or runs/ in
        # it would become part of the update.
        say("Rendered into a temporary folder (cruft update or diff): no repository, environment or smoke test.")
        return
    start_git()
    skipped = skip_reason()
    if skipped:
        say(f"No environment or smoke test: {skipped}. Set {FORCE}=1 to run them anyway.")
        print_next_steps(None)
        return
    LOG.parent.mkdir(parents=True, exist_ok=True)
    LOG.write_text("")
    try:
        python = make_environment()
    except StepFailed as failure:
        report_failure("environment setup failed", failure)
        return
    if python and ANSWERS["smoke_test"] == "yes" and not smoke_test(python):
        return
    print_next_steps(python)


def skip_reason() -> str | None:
    if ANSWERS["setup_env"] == "none" and ANSWERS["smoke_test"] == "no":
        return "setup_env=none and smoke_test=no"
    forced = os.environ.get(FORCE)
    if forced == "1":
        return None
    if forced == "0":
        return f"{FORCE}=0"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return "CI is set"
    if sys.stdin is None or not sys.stdin.isatty():
        return "no terminal"
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


def make_environment() -> str | None:
    """The Python that runs the project: a new .venv, the current interpreter, or None."""
    choice = ANSWERS["setup_env"]
    if choice == "none":
        say("setup_env=none: no environment made, so no smoke test either.")
        return None
    if choice == "current":
        missing = run_logged([sys.executable, "-c", MISSING_MODULES], allow_failure=True).strip()
        if missing:
            fix = f"cd {shlex.quote(str(Path.cwd()))} && {shlex.quote(sys.executable)} -m pip install -e '.[dev]'"
            note(f"{sys.executable} lacks {missing}. To install them into it: {fix}")  # the log the report names
            raise StepFailed(
                [sys.executable, "-c", "import torch, lightning, ..."],
                f"this Python lacks {missing}: install them into it with `{fix}`, or choose setup_env=uv or venv",
            )
        say(f"Using {sys.executable} as it is (with src/ on PYTHONPATH); nothing was installed into it.")
        return sys.executable

    cpu_wheels = cpu_wheel_index()
    unreachable = package_index_unreachable()
    if unreachable:
        raise StepFailed(["(package index)"], f"{unreachable}; when online: {install_hint(choice)}")
    # uv installed beside cookiecutter (in its venv or pipx environment) counts too.
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if choice == "uv" and uv is None:
        say("uv is not installed (https://docs.astral.sh/uv/): using python -m venv and pip instead.")
    if choice == "uv" and uv:
        step("Making .venv with uv", [uv, "venv", "--quiet", "--python", interpreter_for_venv(), ".venv"])
        install = [uv, "pip", "install", "--python", VENV_PYTHON]
    else:
        step("Making .venv", [interpreter_for_venv(), "-m", "venv", ".venv"])
        install = [VENV_PYTHON, "-m", "pip", "install"]
    if cpu_wheels:
        # First, alone: the project's install then keeps this torch, which satisfies its requirement.
        step("Installing PyTorch's CPU build", [*install, "torch", "torchvision", "--index-url", cpu_wheels], show=True)
    step("Installing the project and its dependencies (torch is large: minutes)", [*install, "-e", ".[dev]"], show=True)
    return VENV_PYTHON


def cpu_wheel_index() -> str | None:
    """PyTorch's index of CPU-only wheels, for a project that trains on the CPU, on Linux (where the
    default torch is a CUDA build, about 5 GB against 1 GB), when it answers; else None."""
    accelerator = ANSWERS["accelerator"]
    if not sys.platform.startswith("linux") or accelerator not in ("cpu", "auto"):
        return None  # PyPI's torch for macOS and Windows holds no CUDA already
    if accelerator == "auto" and (shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists()):
        return None  # auto on a machine with an NVIDIA GPU: it will train there
    why = unreachable(CPU_WHEELS)
    if why:
        say(f"PyTorch's CPU wheels: {why}; installing the default torch instead, a CUDA build (about 5 GB).")
        return None
    reason = "accelerator=cpu" if accelerator == "cpu" else "accelerator=auto and no NVIDIA GPU here"
    say(f"{reason}: torch from PyTorch's CPU wheels ({CPU_WHEELS}), about 1 GB instead of 5.")
    return CPU_WHEELS


MISSING_MODULES = (
    "import importlib.util as u;"
    "print(' '.join(m for m in ('torch', 'torchvision', 'lightning', 'torchmetrics', 'jsonargparse', 'rich', 'yaml', 'matplotlib')"
    " if u.find_spec(m) is None))"
)


def interpreter_for_venv() -> str:
    wanted = tuple(int(part) for part in ANSWERS["python_version"].split("."))
    if sys.version_info[:2] >= wanted[:2]:
        return sys.executable
    found = shutil.which(f"python{ANSWERS['python_version']}")
    if found is None:
        raise StepFailed(
            [f"python{ANSWERS['python_version']}"],
            f"the project needs Python {ANSWERS['python_version']}+ and cookiecutter runs under "
            f"{sys.version.split()[0]}: install it, or run cookiecutter with a newer Python",
        )
    return found


def package_index_unreachable() -> str | None:
    """Why the package index cannot be reached, tried in seconds rather than an installer's minutes."""
    why = unreachable(os.environ.get("UV_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple")
    return f"the package index {why}" if why else None


def unreachable(url: str) -> str | None:
    """Why `url`'s server cannot be reached, or None (also when a proxy decides)."""
    if any(os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY")):
        return None  # a proxy decides; the installers' own timeouts apply
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        return None
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        socket.create_connection((parsed.hostname, port), timeout=5).close()
    except OSError as error:
        return f"{parsed.hostname} cannot be reached ({error})"
    return None


def install_hint(choice: str) -> str:
    if choice == "uv":
        return "uv venv && uv pip install -e '.[dev]'"
    return "python3 -m venv .venv && .venv/bin/python -m pip install -e '.[dev]'"


def smoke_test(python: str) -> bool:
    """The project's own smoke test, which users rerun; its summary is the verdict. True when it passed."""
    say(f"Smoke test: {PACKAGE} doctor --smoke (a fast_dev_run, then a two-batch fit and its checkpoint) ...")
    command = [python, "-m", PACKAGE, "doctor", "--smoke"]
    output = run_logged(command, allow_failure=True).strip().splitlines()
    print(f"\n==== {ANSWERS['project_slug']}: setup summary ====")
    print("\n".join(output or ["(no output)"]))
    print(f"Setup log: {Path.cwd() / LOG}")
    if output[-1:] == ["smoke test passed"]:
        return True
    if output[-1:] != ["smoke test failed"]:  # it did not get to run: the project does not import
        print(f"Failed command: {' '.join(command)}\nLikely fix: {likely_fix(LOG.read_text())}\nsmoke test failed")
    print(f"The project is kept in {Path.cwd()}.")
    return False


def step(title: str, command: list[str], show: bool = False) -> None:
    say(f"{title} ...")
    run_logged(command, show=show)


def run_logged(command: list[str], allow_failure: bool = False, show: bool = False) -> str:
    """Run a command into the log, with a progress line on a terminal when `show`; return its standard output."""
    env = os.environ | {"PYTHONUNBUFFERED": "1", "PYTHONPATH": f"src{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.setdefault("PIP_DEFAULT_TIMEOUT", "30")
    env.setdefault("UV_HTTP_TIMEOUT", "30")
    output = []
    with LOG.open("a") as log:
        log.write(f"\n$ {' '.join(command)}\n")
        log.flush()
        stderr = subprocess.STDOUT if show else log
        show = show and sys.stdout.isatty()
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env) as process:
            for count, line in enumerate(process.stdout, 1):
                output.append(line)
                log.write(line)
                if show:  # one line, rewritten in place: the installers' hundreds of lines stay in the log
                    print(f"\r    {count:>4} lines, the last: {line.strip()[:60]:<60}", end="", flush=True)
        if show:
            print()
    if process.returncode != 0 and not allow_failure:
        raise StepFailed(command, likely_fix(LOG.read_text()))
    return "".join(output)


def likely_fix(log: str) -> str:
    tail = [line for line in log.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
    if "No space left on device" in log:
        return "free disk space (torch with CUDA needs about 6 GB) and run the command again"
    if re.search(r"Could not find a version|No solution found|ResolutionImpossible", log):
        return "the dependencies could not be resolved for this Python: see the log"
    return f"the last line of the log says: {tail[0].strip()[:300]}"


def report_failure(what: str, failure: StepFailed) -> None:
    print(f"\n==== {ANSWERS['project_slug']}: {what} ====")
    print(f"Failed command: {' '.join(failure.command)}")
    print(f"Likely fix: {failure.fix}")
    print(f"Full log: {Path.cwd() / LOG}")
    print(f"The project is kept in {Path.cwd()}.")
    if ANSWERS["smoke_test"] == "yes":
        print("smoke test not run: the environment is not ready")


def print_next_steps(python: str | None) -> None:
    if python == sys.executable:  # setup_env=current: the Python that ran cookiecutter, which `python` may not be
        run = f"PYTHONPATH=src {shlex.quote(python)} -m"
    else:  # the project's .venv, made now or by the line below; Debian and Ubuntu have no `python` outside it
        run = ". .venv/bin/activate && python -m"
    print(f"\nNext:\n  cd {Path.cwd()}")
    if not python:
        print(f"  {install_hint(ANSWERS['setup_env'])}")
    print(f"  {run} {PACKAGE} doctor")
    print(f"  {run} {PACKAGE} fit")
    print(f"  {run} pytest")


def say(message: str) -> None:
    print(message, flush=True)
    note(message)


def note(message: str) -> None:
    """A line in the log only."""
    if LOG.parent.is_dir():
        with LOG.open("a") as log:
            log.write(f"# {message}\n")


if __name__ == "__main__":
    try:
        main()
    except Exception as error:  # any exit status but 0 makes cookiecutter delete the project
        print(f"\nThe setup stopped on an unexpected error: {error!r}")
        print(f"The project is kept in {Path.cwd()}; set it up by hand: {install_hint(ANSWERS['setup_env'])}")
