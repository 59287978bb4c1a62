"""Startup: what a generated project's `fit` costs as a whole process, against Lightning's own import.

Run from the template's root:

    .venv/bin/python benchmarks/startup.py [--repeats 5]

A project is rendered from the template into a temporary folder (csv logger) and its shapes dataset
drawn once. Each repetition runs these fresh processes, in an order that rotates between
repetitions, so that a slower or busier moment of the machine does not fall on one of them only:
  - import lightning: `python -c "import lightning.pytorch"`, the floor every Lightning program pays;
  - fit --help: the project's imports and its command-line parser, without building anything;
  - bare Lightning: a script of the same model (resnet18, 6 classes, 64 px) with no CLI, config or
    checks: Trainer(fast_dev_run=True) + a LightningModule + random tensors;
  - fast_dev_run: `fit --trainer.fast_dev_run=true` as a user runs it, the project's defaults (data
    workers auto, hardware auto): the whole process, with one batch of training and one of validation.
The table gives each command's median wall seconds, what it adds over Lightning's import, and the
fast_dev_run's ratio to the bare script.
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

BARE_LIGHTNING = """
import lightning as L
import torch
import torchvision
from torch.utils.data import DataLoader, TensorDataset


class Bare(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torchvision.models.resnet18(num_classes=6)

    def training_step(self, batch, index):
        return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

    def validation_step(self, batch, index):
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=2e-3)


data = TensorDataset(torch.randn(128, 3, 64, 64), torch.randint(0, 6, (128,)))
L.Trainer(fast_dev_run=True).fit(Bare(), DataLoader(data, batch_size=64), DataLoader(data, batch_size=64))
"""


def commands(folder: Path) -> dict[str, list[str]]:
    (folder / "bare.py").write_text(BARE_LIGHTNING)
    return {
        "import lightning": [sys.executable, "-c", "import lightning.pytorch"],
        "fit --help": [sys.executable, "-m", "image_classifier", "fit", "--help"],
        "bare Lightning": [sys.executable, str(folder / "bare.py")],
        "fast_dev_run": [sys.executable, "-m", "image_classifier", "fit", "--trainer.fast_dev_run=true"],
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
        draw = "from image_classifier.datasets.shapes import draw_shapes_dataset as d; import sys; d(sys.argv[1])"
        subprocess.run([sys.executable, "-c", draw, "data/shapes"], cwd=project, env=env, check=True)
        runs = commands(Path(folder))
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
    ratios = [ours / bare for ours, bare in zip(times["fast_dev_run"], times["bare Lightning"], strict=True)]
    print(f"fast_dev_run / bare Lightning, paired by round: median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
