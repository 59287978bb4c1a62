"""Startup: what a generated project's `fit` costs as a whole process, against Lightning's own import.

Run from the template's root:

    .venv/bin/python benchmarks/startup.py [--repeats 5] [--lightning-hydra-template CHECKOUT]

A project is rendered from the template into a temporary folder with the default answers (the W&B
logger, offline here as without an API key) and its shapes dataset drawn once. Each repetition runs
these fresh processes, in an order that rotates between repetitions, so that a slower or busier
moment of the machine does not fall on one of them only:
  - import lightning: `python -c "import lightning.pytorch"`, the floor every Lightning program pays;
  - fit --help: the project's imports and its command-line parser, without building anything;
  - bare Lightning: a script of the same model (resnet18, 6 classes, 64 px) with no CLI, config or
    checks: Trainer(fast_dev_run=True) + a LightningModule + random tensors;
  - fast_dev_run: `fit --trainer.fast_dev_run=true` as a user runs it, the project's defaults (data
    workers auto, hardware auto): the whole process, with one batch of training and one of validation.
  - lightning-hydra-template (with its checkout given): its `python src/train.py debug=fdr`, the same
    one batch of each stage from a Hydra template, in its checkout, with this Python and the caller's
    PYTHONPATH (its requirements installed there, its MNIST files in its data/MNIST/raw).
The table gives each command's median wall seconds, what it adds over Lightning's import, and the
fast_dev_run's ratios to the bare script and to lightning-hydra-template, paired by round.
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


Run = tuple[list[str], Path, dict[str, str]]  # a command, where it runs, its environment
HYDRA = "lightning-hydra"


def commands(folder: Path, project: Path, env: dict[str, str], hydra_template: Path | None) -> dict[str, Run]:
    (folder / "bare.py").write_text(BARE_LIGHTNING)
    fit = [sys.executable, "-m", "image_classifier", "fit"]
    runs = {
        "import lightning": ([sys.executable, "-c", "import lightning.pytorch"], project, env),
        "fit --help": ([*fit, "--help"], project, env),
        "bare Lightning": ([sys.executable, str(folder / "bare.py")], project, env),
        "fast_dev_run": ([*fit, "--trainer.fast_dev_run=true"], project, env),
    }
    if hydra_template:
        # Its debug=fdr does work fit's fast_dev_run does not (a test batch, anomaly detection, DEBUG
        # logging, its config tree, a run folder in its checkout): read the ratio with that in mind.
        runs[HYDRA] = ([sys.executable, "src/train.py", "debug=fdr"], hydra_template, dict(os.environ))
    return runs


def seconds(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    run = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, errors="replace")
    elapsed = time.perf_counter() - started
    if run.returncode:
        sys.exit(f"{run.stdout[-3000:]}{run.stderr[-3000:]}\nerror: `{' '.join(command)}` in {cwd} failed (above)")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lightning-hydra-template", type=Path, metavar="CHECKOUT",
                        help="a checkout of ashleve/lightning-hydra-template to time its debug=fdr beside")  # fmt: skip
    args = parser.parse_args()
    hydra_template = args.lightning_hydra_template and args.lightning_hydra_template.resolve()
    if hydra_template and not (hydra_template / "src" / "train.py").is_file():
        sys.exit(f"error: {hydra_template} holds no src/train.py; give a checkout of lightning-hydra-template")
    with tempfile.TemporaryDirectory() as folder:
        src = render_project(Path(folder), "logger=wandb")  # what users get, not the benchmarks' csv
        project = src.parent
        env = os.environ | {"PYTHONPATH": str(src), "WANDB_MODE": "offline"}
        draw = "from image_classifier.datasets.shapes import draw_shapes_dataset as d; import sys; d(sys.argv[1])"
        subprocess.run([sys.executable, "-c", draw, "data/shapes"], cwd=project, env=env, check=True)
        runs = commands(Path(folder), project, env, hydra_template)
        times: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for repeat in range(args.repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            for name in order:
                times[name].append(seconds(*runs[name]))

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
    for other in [name for name in ("bare Lightning", HYDRA) if name in times]:
        ratios = [ours / theirs for ours, theirs in zip(times["fast_dev_run"], times[other], strict=True)]
        print(f"fast_dev_run / {other}, paired by round: median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
