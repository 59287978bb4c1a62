"""The wheels the GPU validation (benchmarks/gpu_validation.py) carries to a lent GPU machine.

Fetch them here, where the package registry answers, from the template's root:

    .venv/bin/python benchmarks/gpu_wheels.py             # into .whl/ (ignored by git)

The GPU machines (Python 3.12, x86-64 Linux, no network) have torch, lightning, torchvision, timm,
onnxruntime and most of what those need, but not what the template and its projects add:
jsonargparse, cookiecutter, wandb and deepspeed. `fetch` downloads these for Python 3.12 with every
requirement the machine lacks, builds DeepSpeed's wheel from its source (it publishes none; the
build needs torch, which the test environment has) and checks that everything fits in the device
tool's 64 MiB. There, `install` (run by gpu_validation.py) puts into a site folder only the wheels
whose package is missing or too old for the others, so the machine's own numpy or protobuf stay.
"""

import argparse
import email.parser
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".whl"
# What the validation needs beyond the machine's packages: the CLI's parser, the template's renderer,
# the default logger and the DeepSpeed presets.
NEEDED = ["jsonargparse[signatures]", "cookiecutter", "wandb", "deepspeed"]
# Those that publish only their source.
BUILT_FROM_SOURCE = {"deepspeed"}
# Where the packages go.
PYTHON = "3.12"
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in (17, 24, 27, 28, 31, 34, 35)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64"]
# The device tool's limit on what one call sends is 64 MiB, the template's own files included.
BUDGET_MIB = 56
# Packages the GPU machines' image holds: not fetched, unless a fetched wheel bounds their version
# and they are pure Python (a small wheel): then it travels too, and `install` uses it only where
# the machine's release is outside the bounds.
PACKAGE_LIST = (ROOT / "benchmarks" / "gpu_machine_packages.txt").read_text().splitlines()
ON_THE_GPU_MACHINE = {line.strip() for line in PACKAGE_LIST if line.strip() and not line.startswith("#")}


def target_environment() -> dict[str, str]:
    """The environment markers of the GPU machine's Python, for the requirements that depend on them."""
    environment = default_environment()
    environment.update(
        python_version=PYTHON,
        python_full_version=f"{PYTHON}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return environment


def requirements(wheel: Path, extras: set[str] = frozenset(), environment: dict | None = None) -> list[Requirement]:
    """The requirements a wheel declares that apply on the GPU machine, with the given extras."""
    environment = environment or target_environment()
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        headers = email.parser.Parser().parsestr(archive.read(metadata).decode())
    applying = []
    for line in headers.get_all("Requires-Dist") or []:
        requirement = Requirement(line)
        if requirement.marker is None or any(
            requirement.marker.evaluate(environment | {"extra": extra}) for extra in [*extras, ""]
        ):
            applying.append(requirement)
    return applying


def wheel_name(wheel: Path) -> tuple[str, Version]:
    name, version, _, _ = parse_wheel_filename(wheel.name)
    return canonicalize_name(name), version


def pip_download(specs: list[str], folder: Path, pure_python: bool = False) -> bool:
    """Download the wheels of `specs` for the GPU machine (only pure-Python ones if `pure_python`);
    False when one has no such wheel."""
    platforms = ["any"] if pure_python else PLATFORMS
    options = [option for platform in platforms for option in ("--platform", platform)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
         PYTHON, "--implementation", "py" if pure_python else "cp", *options, "-d", folder, *specs],
        check=not pure_python, capture_output=pure_python,
    )  # fmt: skip
    return done.returncode == 0


def build_from_source(spec: str, folder: Path) -> None:
    """A wheel of a package that publishes only its source (DeepSpeed), built against this torch."""
    source = folder / "source"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:", "-d", source,
                    spec], check=True)  # fmt: skip
    (archive,) = source.iterdir()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", folder,
                    archive], check=True)  # fmt: skip
    archive.unlink()
    source.rmdir()


def fetched(folder: Path) -> dict[str, Path]:
    return {wheel_name(wheel)[0]: wheel for wheel in folder.glob("*.whl")}


def fetch(folder: Path) -> list[str]:
    """Download NEEDED and what they need that the GPU machine lacks; the problems left (none when
    every requirement is met there or by a fetched wheel, and the wheels fit the budget)."""
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    wanted = [Requirement(spec) for spec in NEEDED]
    extras: dict[str, set[str]] = {}
    while wanted:
        have = fetched(folder)
        batch = {}
        for requirement in wanted:
            name = canonicalize_name(requirement.name)
            extras.setdefault(name, set()).update(requirement.extras)
            if name in have or name in batch:
                continue
            if name in ON_THE_GPU_MACHINE and not requirement.specifier:
                continue
            batch[name] = requirement
        for name in batch.keys() & BUILT_FROM_SOURCE:
            build_from_source(f"{batch[name].name}{batch[name].specifier}", folder)
        missing = [f"{r.name}{r.specifier}" for name, r in batch.items()
                   if name not in ON_THE_GPU_MACHINE | BUILT_FROM_SOURCE]  # fmt: skip
        if missing:
            pip_download(missing, folder)
        for name, requirement in batch.items():  # in case the machine's copy is too old; torch and the like are not
            if name in ON_THE_GPU_MACHINE:
                pip_download([f"{requirement.name}{requirement.specifier}"], folder, pure_python=True)
        have = fetched(folder)
        wanted = [r for name in batch if name in have for r in requirements(have[name], extras.get(name, set()))]
    return problems(folder, extras)


def problems(folder: Path, extras: dict[str, set[str]]) -> list[str]:
    have = fetched(folder)
    found = []
    for name, wheel in sorted(have.items()):
        for requirement in requirements(wheel, extras.get(name, set())):
            other = canonicalize_name(requirement.name)
            if other in have:
                version = wheel_name(have[other])[1]
                if not requirement.specifier.contains(version, prereleases=True):
                    found.append(f"{wheel.name} needs {requirement}, but {have[other].name} was fetched")
            elif other not in ON_THE_GPU_MACHINE:
                found.append(f"{wheel.name} needs {requirement}, which is neither fetched nor on the GPU machine")
    total = sum(wheel.stat().st_size for wheel in have.values()) / 2**20
    if total > BUDGET_MIB:
        found.append(f"the wheels take {total:.1f} MiB, over the {BUDGET_MIB} MiB the device tool leaves them")
    return found


def to_install(folder: Path) -> list[Path]:
    """The carried wheels this Python needs: each one whose package it lacks, or has in a release that
    another carried wheel's requirements exclude."""
    have = fetched(folder)
    bounds: dict[str, list[Requirement]] = {}
    for wheel in have.values():
        for requirement in requirements(wheel, environment=default_environment()):
            bounds.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    needed = []
    for name, wheel in sorted(have.items()):
        try:
            installed = Version(importlib.metadata.version(name))
        except importlib.metadata.PackageNotFoundError:
            needed.append(wheel)
            continue
        if any(not r.specifier.contains(installed, prereleases=True) for r in bounds.get(name, [])):
            needed.append(wheel)
    return needed


def install(folder: Path, site: Path) -> list[str]:
    """Install what this Python lacks of the carried wheels into `site` (for PYTHONPATH); their names."""
    wheels = to_install(folder)
    if wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
             "--no-cache-dir", "--upgrade", "--target", site, *wheels],
            check=True,
        )  # fmt: skip
    return [re.sub(r"-py\d.*|-cp\d.*", "", wheel.name) for wheel in wheels]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=WHEELS, help="the folder, emptied first (%(default)s)")
    options = parser.parse_args()
    found = fetch(options.dest)
    have = fetched(options.dest)
    for wheel in sorted(have.values()):
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{sum(w.stat().st_size for w in have.values()) / 2**20:7.2f} MiB  in {len(have)} wheels in {options.dest}")
    for problem in found:
        print(f"error: {problem}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
