"""`python -m {{ cookiecutter.package_name }} tune lr|batch_size [CLI options]`: Lightning's finders, kept in a config.

lr: the learning-rate range test (Tuner.lr_find) over two decades either side of the current rate,
    its curve drawn to runs/tune/lr_find.png; its suggestion is then trained for a few epochs
    against the current rate, from the same seed, and written only if its validation loss is as low.
batch_size: the largest batch that fits in the GPU's memory (Tuner.scale_batch_size, doubling),
    up to a batch that still leaves each process 8 steps per epoch.
Results go into configs/tuned.yaml, beside what `benchmark data` wrote there; train with it:
`python -m {{ cookiecutter.package_name }} fit --config configs/tuned.yaml`. The command exits with 1 when it writes
nothing.
"""

import math
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.tuner import Tuner

from ..cli import build
from ..errors import PACKAGE, CommandParser, ConfigError
from .tuned_config import TUNED_CONFIG, update_tuned_config

LR_CURVE = Path("runs/tune/lr_find.png")
# The range test searches RANGE times below and above the current rate; a suggestion more than
# BAND times away from it is shown but written only with --write: a short, noisy range test is
# more likely wrong than a rate that trains.
RANGE, BAND = 100, 10
# Lightning smooths the range test's losses with a running mean (beta 0.98) whose first values come
# out low: about 1 / (1 - beta) points pass before they are the loss.
SETTLING = 50
# Less of a fall than this is the noise of a model that has not started to learn.
FALL = 0.05
# Lightning ends the test when the loss passes 4 times its lowest: the loss diverged.
DIVERGED = 4
MIN_RANGE_STEPS = 2  # Lightning's range test spreads its rates over steps - 1 intervals
# A batch is searched up to the size that still gives each process this many steps per epoch.
MIN_STEPS_PER_EPOCH = 8


def suggest_lr(rates: list[float], losses: list[float]) -> float | None:
    """A tenth of the rate at the lowest smoothed loss of a range test, where the loss still falls
    fast, before it turns up. (Lightning's own suggestion, the steepest slope, lands on noise in
    short tests: 1.2e-6 on the shapes data, where 2e-3 trains to 98 %.) The first SETTLING points
    are left out: Lightning's running mean starts them low. None: the loss never fell by FALL after them."""
    start = min(SETTLING, len(losses) // 2)
    lowest = start + int(np.nanargmin(losses[start:]))
    if not losses[lowest] < (1 - FALL) * losses[start]:
        return None
    return rates[lowest] / 10


def validation_after(cli_args: list[str], lr: float, epochs: int) -> tuple[float, float]:
    """(val/acc, val/loss) after `epochs` epochs at model.lr `lr`, from the configured seed."""
    short = [f"--model.lr={lr}", f"--trainer.max_epochs={epochs}", "--trainer.num_sanity_val_steps=0"]
    cli = build([*cli_args, *short])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    metrics = cli.trainer.callback_metrics
    return float(metrics["val/acc"]), float(metrics["val/loss"])


def find_lr(cli, cli_args: list[str], steps: int, epochs: int, write: bool) -> int:
    model, trainer = cli.model, cli.trainer
    model.trainer = trainer  # scaled_lr reads the devices and the gradient accumulation from it
    current = model.scaled_lr()  # the rate training would use at this effective batch
    if current == 0:
        raise ConfigError("model.lr is 0: the range test searches around the current rate; give one above 0.")
    search = {"min_lr": current / RANGE, "max_lr": current * RANGE, "num_training": steps}
    finder = Tuner(trainer).lr_find(model, datamodule=cli.datamodule, update_attr=False, **search)
    rates, losses = finder.results["lr"], finder.results["loss"]
    found = suggest_lr(rates, losses)
    draw_lr_curve(rates, losses, current, found)
    if found is None and losses[-1] > DIVERGED * np.nanmin(losses):  # Lightning then stops the test
        print(
            f"The loss rose before it fell by {FALL:.0%}, from rate {rates[-1]:.3g} (curve: {LR_CURVE}): nothing "
            "written; the current rate may already be near the highest that trains."
        )
        return 1
    if found is None:
        # As fit counts them: batches (a short last one kept) over those accumulated into each step.
        epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        ended = "" if len(rates) == steps else f" (trainer.max_epochs ended it after {len(rates)} of {steps})"
        print(
            f"The loss never fell by {FALL:.0%} in the range test{ended} (curve: {LR_CURVE}): the model had not "
            f"started to learn. Nothing written; try --steps of a few epochs (one is {epoch} steps)."
        )
        return 1
    # The test ran at the effective batch; model.lr is the rate at base_batch_size, scaled from there.
    lr, now = float(f"{found * model.hparams.lr / current:.3g}"), model.hparams.lr
    ratio = lr / now
    where = f"{max(ratio, 1 / ratio):.1f}x {'above' if ratio > 1 else 'below'} the current {now:.3g}"
    if lr == now:
        where = "the current rate"
    how = f"Tuner.lr_find over {len(rates)} steps, a tenth of the lowest loss's rate"
    if not write:
        if not 1 / BAND <= found / current <= BAND * (1 + 1e-9):  # the top of the search is BAND above
            print(
                f"The range test suggests model.lr {lr:.3g}, {where}: not written, as a rate that far off most "
                f"likely comes from a noisy test. Look at {LR_CURVE}; write it anyway with --write."
            )
            return 1
        # A range test mixes the rate with the progress of training: check its pick against the current
        # rate by the validation loss, which a short run moves more smoothly than the accuracy.
        (acc, loss), (acc_now, loss_now) = (validation_after(cli_args, rate, epochs) for rate in (lr, now))
        print(f"After {epochs} epochs: model.lr {lr:.3g} reaches val/loss {loss:.4f} (val/acc {acc:.4f}), "
              f"the current {now:.3g} {loss_now:.4f} ({acc_now:.4f}).")  # fmt: skip
        if loss > loss_now:
            print(f"The current model.lr trains better: nothing written (range test curve: {LR_CURVE}).")
            return 1
        how += f", then a val/loss of {loss:.4f} after {epochs} epochs against {loss_now:.4f} at {now:.3g}"
    update_tuned_config("model.lr", lr, how)
    print(f"Learning rate: model.lr {lr:.3g} at base batch {model.hparams.base_batch_size}, {where}; curve: {LR_CURVE}")
    print(f"Written to {TUNED_CONFIG}: python -m {PACKAGE} fit --config {TUNED_CONFIG}")
    return 0


def draw_lr_curve(rates: list[float], losses: list[float], current: float, found: float | None) -> None:
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(rates, losses)
    axes.set(xscale="log", xlabel="learning rate (at this effective batch)", ylabel="training loss (smoothed)")
    axes.axvline(current, color="grey", linestyle=":", label=f"current {current:.3g}")
    if found is not None:
        axes.axvline(found, color="red", linestyle="--", label=f"suggested {found:.3g}")
    axes.legend()
    LR_CURVE.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(LR_CURVE, dpi=100, bbox_inches="tight")
    plt.close(figure)


def batch_search(images_per_process: int, batch_size: int, max_trials: int) -> tuple[int, int]:
    """The largest batch worth trying (one that leaves MIN_STEPS_PER_EPOCH steps per epoch) and the
    doublings of `batch_size` that stay within it."""
    cap = images_per_process // MIN_STEPS_PER_EPOCH
    return cap, min(max_trials, int(math.log2(cap / batch_size))) if cap >= batch_size else 0


def find_batch_size(cli, max_trials: int) -> int:
    trainer, data, model = cli.trainer, cli.datamodule, cli.model
    if isinstance(trainer.accelerator, CPUAccelerator):
        print(
            "tune batch_size looks for the largest batch that fits in a GPU's memory; on the CPU there is no "
            f"such limit to find. Pick data.batch_size by speed: python -m {PACKAGE} benchmark train"
        )
        return 1
    data.setup("fit")
    per_process = len(data.train_set) // trainer.world_size
    cap, doublings = batch_search(per_process, data.batch_size, max_trials)
    if doublings < 1:
        print(
            f"data.batch_size {data.batch_size} is already the largest that gives each process "
            f"{MIN_STEPS_PER_EPOCH} steps per epoch of its {per_process} training images: nothing larger to try."
        )
        return 1
    # Doubling from the configured batch, not from Lightning's default of 2: fewer trials.
    # Lightning's trials count the sizes it tries: the configured one, then each doubling.
    found = Tuner(trainer).scale_batch_size(
        model, datamodule=data, mode="power", init_val=data.batch_size, max_trials=doublings + 1
    )
    update_tuned_config(
        "data.batch_size", int(found), f"Tuner.scale_batch_size, at most {doublings} doublings (to {cap} images)"
    )
    print(
        f"Batch size: {found} per device, the largest of at most {doublings} doublings that fit "
        f"(capped at {cap}: {MIN_STEPS_PER_EPOCH} steps per epoch). Written to {TUNED_CONFIG}."
    )
    devices, accumulate = trainer.world_size, trainer.accumulate_grad_batches
    effective = int(found) * devices * accumulate
    if model.hparams.scale_lr:
        rate = model.hparams.lr * effective / model.hparams.base_batch_size
        base = model.hparams.base_batch_size
        print(
            f"model.scale_lr is on: training at this batch uses learning rate {rate:.3g} "
            f"(model.lr {model.hparams.lr:.3g} x {effective} / base batch {base})."
        )
    else:
        print(f"model.scale_lr is off: model.lr {model.hparams.lr:.3g} stays as it is at this batch: scale it by hand.")
    return 0


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} tune", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["lr", "batch_size"])
    parser.add_argument("--steps", type=int, default=200, help="lr: steps of the range test (%(default)s)")
    parser.add_argument(
        "--epochs", type=int, default=3, help="lr: epochs the suggestion trains against the current rate (%(default)s)"
    )
    parser.add_argument("--write", action="store_true", help="lr: write the suggestion without those checks")
    parser.add_argument("--max-trials", type=int, default=8, help="batch_size: doublings to try at most (%(default)s)")
    options, cli_args = parser.parse_known_args(args)
    parser.check_at_least(options, {"--steps": MIN_RANGE_STEPS, "--epochs": 1, "--max-trials": 1})
    # Nothing to keep from a tuning run: no logger, checkpoints or callbacks. Unlike benchmark's, its steps
    # train as a fit's first epochs do, before a recipe's delayed policy and mixing: where the rate peaks.
    cli_args += ["--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]"]
    cli = build(cli_args)
    if options.what == "lr":
        return find_lr(cli, cli_args, options.steps, options.epochs, options.write)
    return find_batch_size(cli, options.max_trials)
