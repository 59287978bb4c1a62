"""Recipes: the best validation accuracy each training recipe of a generated project reaches.

Run from the template's root (the digits need scikit-learn: pip install scikit-learn):

    .venv/bin/python benchmarks/recipes.py [--datasets shapes digits] [--epochs 30] [--seeds 0 1]

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
Each run's best val/acc and its wall time are printed as a table, per seed and as a mean.
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
    "+ema": ["--trainer.callbacks+=image_classifier.ema.ModelEMA", "--trainer.callbacks.decay=0.999"],
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


def datasets(project: Path, env: dict, names: list[str]) -> dict[str, list[str]]:
    """Each dataset's options for `fit`."""
    found = {}
    if "shapes" in names:
        shapes = project / "data" / "shapes"
        draw = "from image_classifier.shapes import draw_shapes_dataset as d; import sys; d(sys.argv[1])"
        subprocess.run([sys.executable, "-c", draw, str(shapes)], cwd=project, env=env, check=True)
        found["shapes"] = [f"--data.data_dir={shapes}", "--data.image_size=64"]
    if "digits" in names:
        digits = draw_digits(project / "data" / "digits")
        found["digits"] = [f"--data.data_dir={digits}", "--data.image_size=32", "--data.hflip=false"]
    return found


def best_accuracy(run_folder: Path) -> float:
    with next(run_folder.rglob("metrics.csv")).open(newline="") as file:
        return max(float(row["val/acc"]) for row in csv.DictReader(file) if row.get("val/acc"))


def train(project: Path, env: dict, options: list[str], seed: int, epochs: int, name: str) -> tuple[float, float]:
    """(best val/acc, wall seconds) of one run."""
    command = [
        sys.executable, "-m", "image_classifier", "fit", "--data.synthetic=false",
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto",
        "--trainer.precision=32-true", f"--trainer.max_epochs={epochs}", f"--seed_everything={seed}",
        "--trainer.enable_progress_bar=false", "--trainer.logger.save_dir=runs", f"--trainer.logger.name={name}",
        # Early stopping would end the stronger recipes, which learn more slowly, before they pay off.
        f"--trainer.min_epochs={epochs}", *options,
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, cwd=project, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return best_accuracy(project / "runs" / name), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", choices=["shapes", "digits"], default=["shapes", "digits"])
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=list(RECIPES))
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()

    import lightning
    import torch

    print(f"Python {platform.python_version()}, torch {torch.__version__}, lightning {lightning.__version__}, "
          f"{os.cpu_count()} CPUs; resnet18 from scratch, {args.epochs} epochs, batch 64, CPU")  # fmt: skip
    print(f"{'dataset':<8}{'recipe':<17}{'seed':>5}{'best val/acc':>14}{'wall s':>9}")
    with tempfile.TemporaryDirectory() as folder:
        src = render_project(Path(folder))
        project = src.parent
        env = os.environ | {"PYTHONPATH": str(src), "WANDB_MODE": "offline"}
        for dataset, data_options in datasets(project, env, args.datasets).items():
            for recipe in args.recipes:
                results = []
                for seed in args.seeds:
                    name = f"{dataset}-{recipe.strip('+').replace('/', '-')}-{seed}"
                    accuracy, wall = train(project, env, [*data_options, *cumulative(recipe)], seed, args.epochs, name)
                    results.append((accuracy, wall))
                    print(f"{dataset:<8}{recipe:<17}{seed:>5}{accuracy:>14.4f}{wall:>9.0f}", flush=True)
                if len(results) > 1:
                    mean = sum(accuracy for accuracy, _ in results) / len(results)
                    print(f"{dataset:<8}{recipe:<17}{'mean':>5}{mean:>14.4f}", flush=True)


if __name__ == "__main__":
    main()
