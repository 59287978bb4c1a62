"""Startup: what a generated project's `fit` costs as a whole process, against Lightning's own import.

Run from the template's root:

    .venv/bin/python benchmarks/startup.py [--repeats 5]

A project is rendered from the template into a temporary folder (csv logger) and its shapes dataset
drawn once. Each repetition runs these fresh processes, in an order that rotates between
repetitions, so that a slower or busier moment of the machine does not fall on one of them only:
  - import lightning: `python -c "import lightning.pytorch"`, the floor every Lightning program pays;
  - fit --help: the project's imports and its command-line parser, without building anything;
  - fast_dev_run: `fit --trainer.fast_dev_run=true` on the CPU, no data workers: the whole process,
    with one batch of training and one of validation.
The table gives each command's median wall seconds and what it adds over Lightning's import.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rendered import render_project


def commands(data_dir: Path) -> dict[str, list[str]]:
    cli = [sys.executable, "-m", "image_classifier"]
    cpu = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto"]
    data = [f"--data.data_dir={data_dir}", "--data.synthetic=false", "--data.num_workers=0"]
    return {
        "import lightning": [sys.executable, "-c", "import lightning.pytorch"],
        "fit --help": [*cli, "fit", "--help"],
        "fast_dev_run": [*cli, "fit", "--trainer.fast_dev_run=true", *cpu, *data],
    }


def seconds(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        src = render_project(Path(folder))
        project = src.parent
        env = os.environ | {"PYTHONPATH": str(src), "WANDB_MODE": "offline"}
        data_dir = project / "data" / "shapes"
        draw = "from image_classifier.shapes import draw_shapes_dataset as d; import sys; d(sys.argv[1])"
        subprocess.run([sys.executable, "-c", draw, str(data_dir)], cwd=project, env=env, check=True)
        runs = commands(data_dir)
        times: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                times[name].append(seconds(runs[name], project, env))

    import lightning
    import torch

    print(f"Python {platform.python_version()}, torch {torch.__version__}, lightning {lightning.__version__}, "
          f"{os.cpu_count()} CPUs; median of {args.repeats} fresh processes each")  # fmt: skip
    floor = statistics.median(times["import lightning"])
    print(f"{'command':<18}{'median s':>10}{'over import':>13}   each run (s)")
    for name, measured in times.items():
        median = statistics.median(measured)
        over = "" if name == "import lightning" else f"{median - floor:+.2f}"
        print(f"{name:<18}{median:>10.2f}{over:>13}   {' '.join(f'{t:.2f}' for t in measured)}")


if __name__ == "__main__":
    main()
