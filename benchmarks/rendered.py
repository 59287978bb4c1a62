"""The template rendered into a folder, for the benchmarks to import the project from."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def render_project(out: Path, *answers: str) -> Path:
    """The template rendered into `out`, with `answers` ("image_size=224", ...); returns the project's src folder."""
    cookiecutter = Path(sys.executable).with_name("cookiecutter")
    subprocess.run(
        [cookiecutter, "--no-input", ROOT, "-o", out, "setup_env=none", "smoke_test=no", "logger=csv", *answers],
        check=True,
        capture_output=True,
    )
    return out / "image-classifier" / "src"
