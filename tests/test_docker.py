"""The generated project's Dockerfile, read as Docker reads it, and its install step run here.

No Docker engine runs on the test machines: the static checks hold the file to what Docker needs
(an official PyTorch CUDA image new enough for the project, sources that exist and are not ignored),
and the slow test does what the image's steps do, in a Python that has torch as the image has.
"""

import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import python_with_test_packages, render, run_bounded


def instructions(project: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) pairs, comments dropped and continued lines joined, as Docker reads them."""
    lines = [line for line in (project / "Dockerfile").read_text().splitlines() if not line.lstrip().startswith("#")]
    logical = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    return [tuple(line.strip().split(maxsplit=1)) for line in logical.splitlines() if line.strip()]


def docker_pattern(pattern: str) -> re.Pattern:
    """A .dockerignore line as Docker matches it: Go's filepath.Match (`*` stops at a `/`), and `**`
    for any number of folders."""
    parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/"))
    wildcards = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    return re.compile("".join(wildcards.get(part, re.escape(part)) for part in parts))


def ignored(project: Path, path: str) -> bool:
    """Whether .dockerignore leaves `path` out of the build context: it, or a folder above it, matches."""
    lines = [line.strip() for line in (project / ".dockerignore").read_text().splitlines()]
    patterns = [docker_pattern(line) for line in lines if line and not line.startswith("#")]
    assert not any(line.startswith("!") for line in lines), "exceptions are not modelled here"
    folders = path.split("/")
    candidates = ["/".join(folders[:end]) for end in range(1, len(folders) + 1)]
    return any(pattern.fullmatch(candidate) for pattern in patterns for candidate in candidates)


def copies(steps: list[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """(sources, destination) of each COPY."""
    return [(arguments.split()[:-1], arguments.split()[-1]) for kind, arguments in steps if kind == "COPY"]


@pytest.mark.parametrize("python_version", ["3.11", "3.13"])
def test_dockerfile_installs_the_project_on_an_official_pytorch_cuda_image(tmp_path, python_version):
    project = render(tmp_path, python_version=python_version, serving="yes")
    steps = instructions(project)
    base = dict(arguments.split("=", 1) for kind, arguments in steps if kind == "ARG")["BASE_IMAGE"]
    image = re.fullmatch(r"pytorch/pytorch:(\d+)\.(\d+)\.\d+-cuda\d+\.\d+-cudnn\d+-runtime", base)
    assert image, f"{base} is not one of PyTorch's official CUDA runtime images"
    assert steps[1] == ("FROM", "${BASE_IMAGE}")
    assert base in (project / "docs" / "docker.md").read_text(), "docs/docker.md names another image"
    needed = re.search(r'"torch>=(\d+)\.(\d+)', (project / "pyproject.toml").read_text())
    assert tuple(map(int, image.groups())) >= tuple(map(int, needed.groups())), "the image's torch is too old"

    for sources, _ in copies(steps):
        for source in sources:
            assert (project / source).exists(), f"COPY {source}: no such file in the project"
            assert not ignored(project, source), f"COPY {source}: .dockerignore leaves it out of the build"
    for heavy in (".venv/bin/python", "data/shapes", "runs", ".git", "model.ckpt", "exports/best.ckpt"):
        assert ignored(project, heavy), f"{heavy} would be sent to the Docker build"
    assert not ignored(project, "src/image_classifier/data.py")

    # The installs run as root and cache in /root (BuildKit's mount); the home any user may write to
    # comes after them, or their caches would land in the image, owned by root.
    install = max(index for index, (kind, arguments) in enumerate(steps) if kind == "RUN" and "install" in arguments)
    home = next(index for index, (kind, arguments) in enumerate(steps) if kind == "ENV" and "HOME=" in arguments)
    assert home > install
    assert ("ENV", "WANDB_DATA_DIR=/app/runs/wandb-data") in steps, "offline checkpoints would die with the container"

    assert ("ENTRYPOINT", '["python", "-m", "image_classifier"]') in steps
    assert ("CMD", '["doctor"]') in steps
    # The dependencies, with an empty package in place of the code; then the code, in a layer after them.
    after = [(kind, " ".join(re.sub(r"^--mount=\S+ ", "", arguments).split())) for kind, arguments in steps]
    pip = "pip install" if python_version == "3.11" else "uv pip install"  # uv brings a Python newer than the image's
    empty = "mkdir -p src/image_classifier && touch src/image_classifier/__init__.py"
    start = after.index(("WORKDIR", "/app"))
    assert after[start + 1 : start + 5] == [("COPY", "pyproject.toml README.md ./"),
                                            ("RUN", f'{empty} && {pip} ".[export,serve,timm]"'),
                                            ("COPY", "src ./src"), ("RUN", f"{pip} --no-deps .")]  # fmt: skip
    if python_version == "3.11":  # the image's Python and torch
        assert not any("venv" in arguments for _, arguments in steps)
    else:
        assert any("uv venv --python 3.13 /opt/venv" in arguments for kind, arguments in steps if kind == "RUN")


@pytest.mark.parametrize(
    ("answers", "installed"),
    [({"timm": "no"}, '&& pip install ".[export]"'), ({"timm": "no", "inference": "no"}, "&& pip install ."),
     ({"timm": "no", "python_version": "3.13"}, '&& uv pip install ".[export]"'),
     ({}, '&& pip install ".[export,timm]"'), ({"serving": "yes"}, '&& pip install ".[export,serve,timm]"'),
     ({"serving": "yes", "streaming": "yes", "experiments": "yes"},
      '&& pip install ".[export,serve,timm,streaming,sweep]"')],
)  # fmt: skip
def test_the_image_installs_the_extras_every_command_needs(tmp_path, answers, installed):
    runs = [arguments for kind, arguments in instructions(render(tmp_path, **answers)) if kind == "RUN"]
    assert [arguments for arguments in runs if " install " in arguments][-2].endswith(installed), runs


@pytest.mark.slow
@pytest.mark.rotated(seconds=65)
def test_the_images_install_step_gives_a_cli_that_trains(tmp_path):
    project = render(tmp_path / "render", serving="yes")
    app = tmp_path / "app"  # the image's /app
    # The image's Python with its torch: a venv that sees the test environment's packages.
    python = str(python_with_test_packages(tmp_path / "image-python", with_pip=True))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "WANDB_MODE": "offline"}

    def run(*command: str) -> str:
        result = run_bounded(command, 600, cwd=app, env=env)
        assert result.returncode == 0, f"{command}: {result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result.stdout

    # The Dockerfile's copies and installs from /app on, in their order; pip without build isolation,
    # which would download hatchling.
    steps = instructions(project)
    for kind, arguments in steps[steps.index(("WORKDIR", "/app")) + 1 :]:
        if kind == "COPY":
            ((sources, destination),) = copies([(kind, arguments)])
            for source in sources:
                target = app / destination / (Path(source).name if destination.endswith("/") else "")
                target.parent.mkdir(parents=True, exist_ok=True)
                copy = shutil.copytree if (project / source).is_dir() else shutil.copy2
                copy(project / source, target, **({"dirs_exist_ok": True} if (project / source).is_dir() else {}))
        elif kind == "RUN" and " install " in arguments:
            shell = arguments.split(" ", 1)[1].replace("pip install", f"{python} -m pip install --no-build-isolation")
            run("bash", "-c", shell)
    assert "site-packages" in run(python, "-c", "import image_classifier; print(image_classifier.__file__)")
    assert "accelerator" in run(python, "-m", "image_classifier", "doctor")  # the image's default command
    assert "--max-batch-size" in run(python, "-m", "image_classifier", "serve", "--help")
    on_cpu = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.precision=32-true"]
    run(python, "-m", "image_classifier", "fit", "--trainer.fast_dev_run=true", *on_cpu, "--data.num_workers=0")
