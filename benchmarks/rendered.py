"""The template rendered into a folder, for the benchmarks to import the project from."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def render_project(out: Path, *answers: str, env: dict[str, str] | None = None) -> Path:
    """The template rendered into `out`, with `answers` ("image_size=224", ...) and cookiecutter run in
    `env` (default: this one); returns the project's src folder."""
    # As a module: where cookiecutter was installed with --target (the GPU validation), no script stands beside Python.
    quiet = ["setup_env=none", "smoke_test=no", "logger=csv"]
    command = [sys.executable, "-m", "cookiecutter", "--no-input", ROOT, "-o", out, *quiet, *answers]
    subprocess.run(command, check=True, capture_output=True, env=env)
    return out / "image-classifier" / "src"
