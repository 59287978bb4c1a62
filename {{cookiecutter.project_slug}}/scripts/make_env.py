"""Make this project's environment: `python3 scripts/make_env.py [uv|venv|current] [--smoke]`.

uv (the default when installed) or venv makes `.venv` and installs the project with its dev
extras; on Linux, a project that trains on the CPU gets PyTorch's CPU-only wheels (about 1 GB
against 5). `current` only checks that the Python running this has what the project needs.
`--smoke` then runs the project's smoke test; the commands to run next end the output. The
post-generation hook runs this too. Standard library only, and for any Python 3.9+: it may run
under a Python older than the project's.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse

PROJECT = Path(__file__).resolve().parents[1]
SCRIPT = str(Path(__file__).resolve().relative_to(PROJECT))
ANSWERS_FILE = PROJECT / ".cookiecutter.json"  # the answers the project was generated with
ACCELERATOR = json.loads(ANSWERS_FILE.read_text()).get("accelerator", "auto") if ANSWERS_FILE.is_file() else "auto"
REQUIRES = re.search(r'requires-python\s*=\s*">=\s*(3\.\d+)', (PROJECT / "pyproject.toml").read_text())
OLDEST_PYTHON = REQUIRES.group(1) if REQUIRES else "3.10"
# PyTorch's CPU-only wheels; the variable points at a mirror.
CPU_WHEELS = os.environ.get("LIGHTNING_TEMPLATE_CPU_WHEELS", "https://download.pytorch.org/whl/cpu")
PACKAGE = "{{ cookiecutter.package_name }}"
LOG = Path("runs") / "smoke-test" / "setup.log"  # beside the smoke test's own log
# What the smoke test (commands/smoke_test.py) says before the options it fell back to on this machine.
HERE = "On this machine, fit with: "
VENV_PYTHON = str(Path(".venv") / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
# The comparisons of pyproject.toml's version ranges; others (!=, ~=, wildcards) are left to the installers.
COMPARISONS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}


class StepFailed(Exception):
    def __init__(self, command: list[str], fix: str) -> None:
        super().__init__(" ".join(command))
        self.command, self.fix = command, fix


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("how", nargs="?", choices=["uv", "venv", "current"], default="uv")
    parser.add_argument("--log", type=Path, default=LOG, help="where the installers' output goes")
    parser.add_argument("--smoke", action="store_true", help="then run the smoke test, `doctor --smoke`")
    options = parser.parse_args()
    os.chdir(PROJECT)
    options.log.parent.mkdir(parents=True, exist_ok=True)
    try:
        return make_and_check(options.how, options.log, options.smoke)
    except KeyboardInterrupt:  # what is installed stays, for the next run to go on from
        python = shlex.quote(sys.executable) if options.how == "current" else "python3"  # current: this one
        again = " ".join([python, SCRIPT, options.how, "--smoke" if options.smoke else ""]).rstrip()
        say(f"\nSetup interrupted. To finish it: {again}", options.log)
        return 130


def make_and_check(how: str, log: Path, smoke: bool) -> int:
    try:
        make(how, log)
    except StepFailed as failure:
        print(f"\n==== environment setup failed ====\nFailed command: {' '.join(failure.command)}")
        say(f"Likely fix: {failure.fix}", log)
        print(f"Full log: {log.resolve()}")
        if smoke:
            print("smoke test not run: the environment is not ready")
        return 1
    python = sys.executable if how == "current" else VENV_PYTHON
    said = smoke_test(python, log) if smoke else []
    if said is None:
        return 1
    # After a fallback from hardware this machine lacks, the options the smoke test trained with.
    here = next((line.partition(HERE)[2] for line in said if HERE in line), "")
    print_next_steps(python, here)
    return 0


def make(how: str, log: Path) -> None:
    if how == "current":
        if not new_enough():
            raise StepFailed(
                [sys.executable, "(requires-python in pyproject.toml)"],
                f"this Python is {sys.version.split()[0]} and the project needs {OLDEST_PYTHON}+: run this with a "
                "newer Python, or use uv or venv (which find one)",
            )
        missing = unmet_requirements()
        if missing:
            fix = f"cd {PROJECT} && {sys.executable} -m pip install -e '.[dev]'"
            raise StepFailed(
                [sys.executable, "(the dependencies in pyproject.toml)"],
                f"this Python lacks {', '.join(missing)}: install them into it with `{fix}`, or use uv or venv",
            )
        say(f"Using {sys.executable} as it is (with src/ on PYTHONPATH); nothing was installed into it.", log)
        return
    cpu_wheels = cpu_wheel_index(log)
    index = os.environ.get("UV_INDEX_URL") or os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    unreachable_index = unreachable(index)
    if unreachable_index:
        raise StepFailed(["(package index)"], f"the package index {unreachable_index}; when online, run this again")
    # uv installed beside this Python (in the venv or pipx environment it runs from) counts too.
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if how == "uv" and uv is None:
        say("uv is not installed (https://docs.astral.sh/uv/): using python -m venv and pip instead.", log)
    if how == "uv" and uv:
        # uv finds (or fetches) a Python of the version itself, wherever pyenv, conda or uv put it.
        python = sys.executable if new_enough() else OLDEST_PYTHON
        step("Making .venv with uv", [uv, "venv", "--quiet", "--python", python, ".venv"], log)
        install = [uv, "pip", "install", "--python", VENV_PYTHON]
    else:
        step("Making .venv", [interpreter(), "-m", "venv", ".venv"], log)
        install = [VENV_PYTHON, "-m", "pip", "install"]
    if cpu_wheels:
        # First, alone: the project's install then keeps this torch, which satisfies its requirement.
        step("Installing PyTorch's CPU build", [*install, "torch", "torchvision", "--index-url", cpu_wheels], log)
    step("Installing the project and its dependencies (torch is large: minutes)", [*install, "-e", ".[dev]"], log)


def unmet_requirements() -> list[str]:
    """The project's dependencies that this Python lacks ("wandb"), or has outside their range
    ("lightning 2.4.0, not >=2.6,<2.7"), read from pyproject.toml: the training commands need them all.
    One with an environment marker (`; sys_platform == "linux"`) is left to the installers."""
    unmet = []
    for requirement in listed_dependencies((PROJECT / "pyproject.toml").read_text()):
        name, wanted = re.match(r"([\w.-]+)(?:\[[^\]]*\])?\s*(.*)", requirement).groups()
        if ";" in wanted:
            continue
        have = installed_version(name)
        if have is None:
            unmet.append(name)
        elif not all(within(have, part.strip()) for part in wanted.split(",") if part.strip()):
            unmet.append(f"{name} {have}, not {wanted}")
    return unmet


def listed_dependencies(pyproject: str) -> list[str]:
    """The strings of [project]'s `dependencies` array, on one line or many, with comments (tomllib
    is not in every Python this runs under)."""
    start = re.search(r"^dependencies\s*=\s*\[", pyproject, re.MULTILINE)
    listed = []
    for item in re.finditer(r'"([^"]*)"|\'([^\']*)\'|#[^\n]*|(\])', pyproject[start.end() :] if start else "]"):
        if item.group(3):
            break
        listed += [text for text in item.group(1, 2) if text]
    return listed


def installed_version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def within(version: str, specifier: str) -> bool:
    """Whether `version` (2.14.1+cu130) meets one comparison (>=2.6), by release numbers: a pre-,
    post- or dev release counts as its release. Others (!=, ~=, wildcards) are left to the installers."""
    comparison, wanted = re.match(r"(>=|<=|==|>|<)?\s*(.*)", specifier).groups()
    if comparison is None or not re.fullmatch(r"\d+(\.\d+)*", wanted):
        return True
    have, want = (tuple(map(int, re.match(r"\d+(\.\d+)*", text).group().split("."))) for text in (version, wanted))
    width = max(len(have), len(want))  # 2.7 is 2.7.0
    return COMPARISONS[comparison](have + (0,) * (width - len(have)), want + (0,) * (width - len(want)))


def smoke_test(python: str, log: Path) -> list[str] | None:
    """The project's own smoke test, whose summary is the verdict: its lines when it passed, else None."""
    say(f"Smoke test: {PACKAGE} doctor --smoke (a fast_dev_run, then a two-batch fit and its checkpoint) ...", log)
    command = [python, "-m", PACKAGE, "doctor", "--smoke"]
    # src/ for `current`; no empty entry, which would put the working folder on the path too.
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, ["src", os.environ.get("PYTHONPATH")]))}
    with log.open("a") as file:
        file.write(f"\n$ {' '.join(command)}\n")
        file.flush()
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=file, text=True, env=env)
        file.write(done.stdout)
    output = done.stdout.strip().splitlines()
    summary = "\n".join(output or ["(no output)"])
    print(f"\n==== {PROJECT.name}: setup summary ====\n{summary}\nSetup log: {log.resolve()}")
    if output[-1:] == ["smoke test passed"]:
        return output
    if output[-1:] != ["smoke test failed"]:  # it did not get to run: the project does not import
        print(f"Failed command: {' '.join(command)} (its error is at the end of the log)\nsmoke test failed")
    return None


def print_next_steps(python: str, fit_options: str = "") -> None:
    if python == sys.executable:  # `current`: the Python that runs this, which `python` may not be
        run, test = f"PYTHONPATH=src {shlex.quote(python)} -m", "pytest"  # pytest-xdist may be missing there
        if installed_version("pytest") is None:  # the tests' own dependencies come with the dev extra
            test = f"pip install -e '.[dev]' && {run} pytest"
    else:  # Debian and Ubuntu have no `python` outside the activated .venv
        run, test = ". .venv/bin/activate && python -m", "pytest -n auto"
    print(f"\nNext:\n  cd {PROJECT}")
    fit = f"{PACKAGE} fit {fit_options}".rstrip()
    print("\n".join(f"  {run} {command}" for command in (f"{PACKAGE} doctor", fit, test)))


def cpu_wheel_index(log: Path) -> str | None:
    """PyTorch's CPU wheels for a project that trains on the CPU, on Linux (where the default torch is
    a CUDA build), when the index answers; else None."""
    accelerator = ACCELERATOR
    if not sys.platform.startswith("linux") or accelerator not in ("cpu", "auto"):
        return None  # PyPI's torch for macOS and Windows holds no CUDA already
    if accelerator == "auto" and (shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists()):
        return None  # auto on a machine with an NVIDIA GPU: it will train there
    why = unreachable(CPU_WHEELS)
    if why:
        say(f"PyTorch's CPU wheels: {why}; installing the default torch instead, a CUDA build (about 5 GB).", log)
        return None
    reason = "accelerator=cpu" if accelerator == "cpu" else "accelerator=auto and no NVIDIA GPU here"
    say(f"{reason}: torch from PyTorch's CPU wheels ({CPU_WHEELS}), about 1 GB instead of 5.", log)
    return CPU_WHEELS


def interpreter() -> str:
    """A Python the project supports: this one, or python3.X for the oldest version it takes."""
    oldest = OLDEST_PYTHON
    if new_enough():
        return sys.executable
    found = shutil.which(f"python{oldest}")
    if found is None:
        raise StepFailed(
            [f"python{oldest}"],
            f"the project needs Python {oldest}+ and this is "
            f"{sys.version.split()[0]}: install it, or run this with a newer Python",
        )
    runs = subprocess.run([found, "-c", "pass"], capture_output=True, text=True)
    if runs.returncode != 0:  # a pyenv shim of a version that pyenv has not selected
        said = next(iter(runs.stderr.strip().splitlines()), f"status {runs.returncode}")
        raise StepFailed(
            [found],
            f"{found} does not run ({said}): select or install Python {oldest} (with pyenv: pyenv shell {oldest}), "
            f"or run this with Python {oldest}+",
        )
    return found


def new_enough() -> bool:
    return sys.version_info[:2] >= tuple(int(part) for part in OLDEST_PYTHON.split("."))


def unreachable(url: str) -> str | None:
    """Why `url`'s server cannot be reached, tried in seconds rather than an installer's minutes; None
    when it can (or when a proxy decides)."""
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


def step(title: str, command: list[str], log: Path) -> None:
    """Run a command into the log, with one progress line on a terminal."""
    say(f"{title} ...", log)
    env = os.environ | {"PYTHONUNBUFFERED": "1", "PIP_DEFAULT_TIMEOUT": "30", "UV_HTTP_TIMEOUT": "30"}
    output, show = [], sys.stdout.isatty()
    with log.open("a", buffering=1) as file:  # line by line, for a `tail -f` of the log
        file.write(f"\n$ {' '.join(command)}\n")
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as process:
            for count, line in enumerate(process.stdout, 1):
                output.append(line)
                file.write(line)
                if show:  # one line, rewritten in place: the installers' hundreds of lines stay in the log
                    print(f"\r    {count:>4} lines, the last: {line.strip()[:60]:<60}", end="", flush=True)
        if show:
            print()
    if process.returncode != 0:
        raise StepFailed(command, likely_fix("".join(output)))  # this command's, not an earlier run's in the log


def likely_fix(log: str) -> str:
    tail = [line for line in log.strip().splitlines() if line.strip()][-1:] or ["(no output)"]
    if "No space left on device" in log:
        return "free disk space (torch with CUDA needs about 6 GB) and run the command again"
    if re.search(r"Could not find a version|No solution found|ResolutionImpossible", log):
        return "the dependencies could not be resolved for this Python: see the log"
    return f"the last line of the log says: {tail[0].strip()[:300]}"


def say(message: str, log: Path) -> None:
    print(message, flush=True)
    with log.open("a") as file:
        file.write(f"# {message}\n")


if __name__ == "__main__":
    sys.exit(main())
