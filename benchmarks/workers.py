"""What starting data workers from a fork server costs, against a plain fork and spawn.

Run from the template's root:

    .venv/bin/python benchmarks/workers.py [--workers 2] [--images-per-class 100] [--repeats 3]

A project is rendered from the template into a temporary folder and imported from there. Each
measurement is a fresh Python process, as a training run is: it builds the project's data module
on the shapes dataset (64 px PNGs) and, with each worker start method, times
  - first batch: from making the training loader's iterator to its first batch (the workers start,
    and with forkserver the server starts and imports the data module once);
  - second loader: the same for the validation loader, made after the first one (a run's second
    loader, which finds the fork server running);
  - images/s: one epoch of the training loader after its first batch.
The project's default is forkserver (data.worker_start_method); fork is the Linux default before
Python 3.14, which it replaces, and spawn the macOS and Windows default. The table gives medians of `--repeats`.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rendered import render_project

METHODS = ("fork", "forkserver", "spawn")


def measure(data_dir: Path, method: str, workers: int, images_per_class: int) -> dict[str, float]:
    from image_classifier import data as project_data  # from the rendered project, on PYTHONPATH
    from image_classifier.datasets.shapes import draw_shapes_dataset

    draw_shapes_dataset(data_dir, images_per_class={"train": images_per_class, "val": images_per_class // 4})
    datamodule = project_data.ImageDataModule(data_dir, num_workers=workers, batch_size=32, worker_start_method=method)
    datamodule.setup("fit")
    train, val = datamodule.train_dataloader(), datamodule.val_dataloader()

    start = time.perf_counter()
    batches = iter(train)
    next(batches)
    first = time.perf_counter() - start
    start = time.perf_counter()
    images = sum(len(labels) for _, labels in batches)
    rate = images / (time.perf_counter() - start)
    start = time.perf_counter()
    next(iter(val))
    second = time.perf_counter() - start
    return {"first": first, "second": second, "rate": rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--images-per-class", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measure", nargs=2, metavar=("DATA", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        data_dir, method = args.measure
        print(json.dumps(measure(Path(data_dir), method, args.workers, args.images_per_class)))
        return

    with tempfile.TemporaryDirectory() as scratch:
        src = render_project(Path(scratch) / "project")
        data_dir = Path(scratch) / "shapes"
        results: dict[str, list[dict[str, float]]] = {method: [] for method in METHODS}
        for repeat in range(args.repeats):
            order = METHODS[repeat % 3 :] + METHODS[: repeat % 3]  # each method takes its turn first
            for method in order:
                sizes = [f"--workers={args.workers}", f"--images-per-class={args.images_per_class}"]
                command = [sys.executable, __file__, *sizes, "--measure", str(data_dir), method]
                # On PYTHONPATH, as an installed project is on sys.path: the fork server imports from there.
                env = os.environ | {"PYTHONPATH": str(src)}
                printed = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
                results[method].append(json.loads(printed.splitlines()[-1]))

    import torch

    print(f"python {platform.python_version()}, torch {torch.__version__}, {args.workers} workers, "
          f"{args.images_per_class} training images per class (6 classes), median of {args.repeats}")  # fmt: skip
    print(f"{'start method':<12} {'first batch s':>14} {'second loader s':>16} {'images/s':>10}")
    for method, runs in results.items():
        first, second, rate = (statistics.median(run[key] for run in runs) for key in ("first", "second", "rate"))
        print(f"{method:<12} {first:>14.2f} {second:>16.2f} {rate:>10.0f}")


if __name__ == "__main__":
    main()
