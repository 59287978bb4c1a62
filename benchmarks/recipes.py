"""Recipes: the best validation accuracy each training recipe of a generated project reaches.

Run from the template's root (the digits need scikit-learn: pip install scikit-learn):

    .venv/bin/python benchmarks/recipes.py [--datasets shapes digits fashion] [--epochs 30] [--seeds 0 1]
                                           [--targets 0.9 0.95] [--fit=--model.OPTION=VALUE]...
                                           [--fashion-mnist DIR] [--fashion-per-class 600]

A project is rendered from the template (csv logger) and each recipe trained from scratch, on the
CPU, through its own CLI (`fit`), one fresh process per run. Recipes, each adding to the one before:
  - basic: the default recipe (random crop and flips);
  - +trivialaugment: TrivialAugment and RandomErasing (p 0.25);
  - +mixup/cutmix: Mixup (alpha 0.2) and CutMix (alpha 1.0) with label smoothing 0.1;
  - +ema: an EMA of the weights (decay 0.999), which validation uses.
Datasets:
  - shapes: the project's built-in drawn dataset, 64 px, 2,400 training images (val: 600);
  - digits: scikit-learn's bundled handwritten digits (UCI, 1,797 real 8 x 8 grey scans of 10
    digits, written as 32 px PNGs; 20 % held out per class), a real image set that needs no
    download. Digits are not mirror-symmetric, so every recipe runs with hflip off there.
  - fashion: Fashion-MNIST (Zalando, MIT licence; 28 x 28 grey photos of 10 kinds of clothing,
    written as 32 px PNGs), from Debian's dataset-fashion-mnist package (apt-get install
    dataset-fashion-mnist): the first --fashion-per-class training images of each class, 20 % of
    them held out. Small real photos, as users bring, where the digits are scans of strokes. PyPI
    and npm ship no photo set whole (CIFAR's packages download it); PyPI's elpv-dataset (solar-cell
    scans) does, under a non-commercial licence and with 2 to 4 classes.
Each run's best val/acc, its wall time and the time to each --targets accuracy (the wall time up to
the first epoch that reached it, epochs taken as equally long) are printed as a table, per seed and
as a mean; each --fit adds an option to every run (--fit=--model.small_image_stem=true, say).
"""

import argparse
import csv
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rendered import render_project

RECIPES = {
    "basic": [],
    "+trivialaugment": ["--data.augment=trivialaugment", "--data.random_erasing=0.25"],
    "+mixup/cutmix": ["--model.mixup_alpha=0.2", "--model.cutmix_alpha=1.0", "--model.label_smoothing=0.1"],
    "+ema": ["--trainer.callbacks+=image_classifier.training.ema.ModelEMA", "--trainer.callbacks.decay=0.999"],
}


def cumulative(name: str) -> list[str]:
    names = list(RECIPES)
    return [option for earlier in names[: names.index(name) + 1] for option in RECIPES[earlier]]


def draw_digits(folder: Path) -> Path:
    """scikit-learn's digits as an ImageFolder of 32 px PNGs."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("error: the digits dataset comes with scikit-learn: pip install scikit-learn")
    from PIL import Image

    digits = load_digits()
    for index, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
        target = folder / str(label)
        target.mkdir(parents=True, exist_ok=True)
        grey = Image.fromarray((pixels * (255 / 16)).astype("uint8"), mode="L")
        grey.resize((32, 32), Image.Resampling.BICUBIC).save(target / f"{index:04d}.png")
    return folder


FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")  # where Debian's dataset-fashion-mnist puts it
FASHION_CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]


def draw_fashion(folder: Path, source: Path, per_class: int) -> Path:
    """The first `per_class` training images of each Fashion-MNIST class as an ImageFolder of 32 px PNGs."""
    import gzip

    import numpy as np
    from PIL import Image

    images, labels = source / "train-images-idx3-ubyte.gz", source / "train-labels-idx1-ubyte.gz"
    if not images.is_file():
        sys.exit(
            f"error: no Fashion-MNIST in {source}: apt-get install dataset-fashion-mnist (Debian's package), or "
            "unpack its .deb (dpkg-deb -x) and pass --fashion-mnist <folder of its .gz files>"
        )
    with gzip.open(images) as file:  # IDX: a 16-byte header, then 28 x 28 bytes per image
        pixels = np.frombuffer(file.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(labels) as file:
        targets = np.frombuffer(file.read(), np.uint8, offset=8)
    written = dict.fromkeys(range(len(FASHION_CLASSES)), 0)
    for index, (image, label) in enumerate(zip(pixels, targets, strict=True)):
        if written[label] == per_class:
            continue
        target = folder / FASHION_CLASSES[label]
        target.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).resize((32, 32), Image.Resampling.BICUBIC).save(target / f"{index:05d}.png")
        written[label] += 1
    return folder


def datasets(project: Path, env: dict, names: list[str], fashion: Path, per_class: int) -> dict[str, list[str]]:
    """Each dataset's options for `fit`."""
    found = {}
    if "shapes" in names:
        shapes = project / "data" / "shapes"
        draw = "from image_classifier.datasets.shapes import draw_shapes_dataset as d; import sys; d(sys.argv[1])"
        subprocess.run([sys.executable, "-c", draw, str(shapes)], cwd=project, env=env, check=True)
        found["shapes"] = [f"--data.data_dir={shapes}", "--data.image_size=64"]
    if "digits" in names:
        digits = draw_digits(project / "data" / "digits")
        found["digits"] = [f"--data.data_dir={digits}", "--data.image_size=32", "--data.hflip=false"]
    if "fashion" in names:
        clothes = draw_fashion(project / "data" / "fashion", fashion, per_class)
        found["fashion"] = [f"--data.data_dir={clothes}", "--data.image_size=32"]
    return found


def accuracy_by_epoch(run_folder: Path) -> list[float]:
    with next(run_folder.rglob("metrics.csv")).open(newline="") as file:
        return [float(row["val/acc"]) for row in csv.DictReader(file) if row.get("val/acc")]


def seconds_to(target: float, accuracies: list[float], wall: float) -> float | None:
    """The wall time until the first epoch that reached `target`, taking epochs as equally long
    (start-up shared among them); None if none did."""
    reached = next((epoch for epoch, accuracy in enumerate(accuracies) if accuracy >= target), None)
    return None if reached is None else wall * (reached + 1) / len(accuracies)


def train(project: Path, env: dict, options: list[str], seed: int, epochs: int, name: str) -> tuple[list[float], float]:
    """(val/acc of each epoch, wall seconds) of one run."""
    command = [
        sys.executable, "-m", "image_classifier", "fit", "--data.synthetic=false",
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto",
        "--trainer.precision=32-true", f"--trainer.max_epochs={epochs}", f"--seed_everything={seed}",
        "--trainer.enable_progress_bar=false", "--trainer.logger.save_dir=runs", f"--trainer.logger.name={name}",
        # Early stopping would end the stronger recipes, which learn more slowly, before they pay off.
        f"--trainer.min_epochs={epochs}", *options,
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(f"{done.stderr[-3000:]}\nerror: the run {name} failed (its output above): {' '.join(command)}")
    return accuracy_by_epoch(project / "runs" / name), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", choices=["shapes", "digits", "fashion"], default=["shapes", "digits"])
    parser.add_argument("--fashion-mnist", type=Path, default=FASHION_MNIST, help="its .gz files (%(default)s)")
    parser.add_argument("--fashion-per-class", type=int, default=600, help="training images per class (%(default)s)")
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--targets", type=float, nargs="+", default=[0.9, 0.95], help="val/acc to time")
    parser.add_argument("--fit", action="append", default=[], metavar="OPTION",
                        help="an option of every run, repeatable: --fit=--model.small_image_stem=true")  # fmt: skip
    args = parser.parse_args()

    import lightning
    import torch

    print(f"Python {platform.python_version()}, torch {torch.__version__}, lightning {lightning.__version__}, "
          f"{os.cpu_count()} CPUs; resnet18 from scratch, {args.epochs} epochs, batch 64, CPU", *args.fit)  # fmt: skip
    to = "".join(f"{f's to {target:.0%}':>10}" for target in args.targets)
    print(f"{'dataset':<8}{'recipe':<17}{'seed':>5}{'best val/acc':>14}{'wall s':>9}{to}")
    with tempfile.TemporaryDirectory() as folder:
        src = render_project(Path(folder))
        project = src.parent
        env = os.environ | {"PYTHONPATH": str(src), "WANDB_MODE": "offline"}
        chosen = datasets(project, env, args.datasets, args.fashion_mnist, args.fashion_per_class)
        for dataset, data_options in chosen.items():
            for recipe in args.recipes:
                results = []
                for seed in args.seeds:
                    name = f"{dataset}-{recipe.strip('+').replace('/', '-')}-{seed}"
                    options = [*data_options, *cumulative(recipe), *args.fit]
                    accuracies, wall = train(project, env, options, seed, args.epochs, name)
                    accuracy = max(accuracies)
                    results.append((accuracy, wall))
                    times = [seconds_to(target, accuracies, wall) for target in args.targets]
                    to = "".join(f"{'-' if t is None else f'{t:.0f}':>10}" for t in times)
                    print(f"{dataset:<8}{recipe:<17}{seed:>5}{accuracy:>14.4f}{wall:>9.0f}{to}", flush=True)
                if len(results) > 1:
                    mean = sum(accuracy for accuracy, _ in results) / len(results)
                    print(f"{dataset:<8}{recipe:<17}{'mean':>5}{mean:>14.4f}", flush=True)


if __name__ == "__main__":
    main()
