"""Image folder against sharded streaming data (LitData): images/s of the training loader, and the
time to shard.

Run from the template's root:

    .venv/bin/python benchmarks/streaming.py [--images 20000] [--size 64] [--batches 0]

A project is rendered from the template into a temporary folder and run from there. The data is
`--images` small JPEGs (the shapes dataset's drawings, `--size` px, quality 90) in 6 class folders.
`shard` turns them into chunks (2 processes), then the project's own `benchmark data` code times the
training loader of each format (its decode, random crop and flip, batch 64) with 0, 1 and 2 workers
over whole epochs (or `--batches` batches), after the first batch. Each format reads files the
previous run left in the page cache: this measures decoding and file handling, not a cold disk.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rendered import render_project


def draw_jpegs(root: Path, images: int, size: int) -> None:
    import numpy as np
    from image_classifier.datasets.shapes import CLASSES, draw_shape

    for index in range(images):
        name = CLASSES[index % len(CLASSES)]
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        draw_shape(name, size, np.random.default_rng([index])).save(folder / f"{index:06d}.jpg", quality=90)


def measure(data_dir: str, data_format: str, workers: int, batches: int) -> float:
    from image_classifier.commands.benchmark import loader_speed
    from image_classifier.data import ImageDataModule

    data = ImageDataModule(data_dir, format=data_format, batch_size=64, val_fraction=0.01)
    data.setup("fit")
    epoch = sum(data.train_class_counts()) // 64 - 1
    return loader_speed(data, workers, batches or epoch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=0, help="batches timed (0: an epoch)")
    parser.add_argument("--measure", nargs=3, metavar=("DATA", "FORMAT", "WORKERS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        data_dir, data_format, workers = args.measure
        print(measure(data_dir, data_format, int(workers), args.batches))
        return

    with tempfile.TemporaryDirectory() as scratch:
        src = render_project(Path(scratch) / "project", "streaming=yes", "tuning=yes")
        env = os.environ | {"PYTHONPATH": str(src)}
        images, shards = Path(scratch) / "jpegs", Path(scratch) / "shards"
        sys.path.insert(0, str(src))
        draw_jpegs(images, args.images, args.size)
        megabytes = sum(path.stat().st_size for path in images.rglob("*.jpg")) / 1e6
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "image_classifier", "shard", str(images), str(shards), "--workers=2",
                        "--val_fraction=0.01"], check=True, capture_output=True, env=env)  # fmt: skip
        sharded = time.perf_counter() - started
        rates = {}
        for data_format, location in (("folder", images), ("streaming", shards)):
            for workers in (0, 1, 2):
                command = [sys.executable, __file__, f"--batches={args.batches}", "--measure", str(location),
                           data_format, str(workers)]  # fmt: skip
                printed = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
                rates[data_format, workers] = float(printed.splitlines()[-1])

    import torch

    machine = f"{os.cpu_count()} CPUs, torch {torch.__version__}"
    print(f"{args.images} JPEGs of {args.size} px ({megabytes:.0f} MB), {machine}")
    print(f"shard (2 processes): {sharded:.1f} s, {args.images / sharded:.0f} images/s")
    print(f"{'workers':>8} {'folder images/s':>16} {'streaming images/s':>19}")
    for workers in (0, 1, 2):
        print(f"{workers:>8} {rates['folder', workers]:>16.0f} {rates['streaming', workers]:>19.0f}")


if __name__ == "__main__":
    main()
