"""`python -m {{ cookiecutter.package_name }} tune lr|batch_size [CLI options]`: Lightning's finders, kept in a config file.

lr: the learning-rate range test (Tuner.lr_find); batch_size: the largest batch that fits in the
device's memory (Tuner.scale_batch_size, doubling until it runs out), worth running on a GPU. The
result goes into configs/tuned.yaml, beside what `benchmark data` wrote there; train with it:
`python -m {{ cookiecutter.package_name }} fit --config configs/tuned.yaml`.
"""

import argparse
import platform
from datetime import date
from pathlib import Path

import yaml
from lightning.pytorch.tuner import Tuner

TUNED_CONFIG = Path("configs/tuned.yaml")


def update_tuned_config(section: str, key: str, value, how: str) -> None:
    """Set one option in configs/tuned.yaml, keeping the others and a comment line on how each was found."""
    text = TUNED_CONFIG.read_text() if TUNED_CONFIG.is_file() else ""
    tuned = yaml.safe_load(text) or {}
    replaced = f"# {section}.{key}:"
    notes = [line for line in text.splitlines()[1:] if line.startswith("# ") and not line.startswith(replaced)]
    tuned.setdefault(section, {})[key] = value
    notes.append(f"# {section}.{key}: {how}; on {platform.node()}, {date.today()}")
    header = f"# Measured on this machine. Use with: python -m {{ cookiecutter.package_name }} fit --config {TUNED_CONFIG}"
    TUNED_CONFIG.parent.mkdir(parents=True, exist_ok=True)
    TUNED_CONFIG.write_text("\n".join([header, *notes]) + "\n" + yaml.safe_dump(tuned, sort_keys=True))


def find_lr(cli, steps: int) -> None:
    model, trainer = cli.model, cli.trainer
    finder = Tuner(trainer).lr_find(model, datamodule=cli.datamodule, num_training=steps, update_attr=False)
    found = finder.suggestion() if finder is not None else None
    if found is None:
        raise SystemExit("The learning-rate range test found no clear minimum: run it with more --steps.")
    # The test ran at the effective batch; model.lr is the rate at base_batch_size, scaled from there.
    lr = found / (model.scaled_lr() / model.hparams.lr) if model.hparams.scale_lr else found
    update_tuned_config("model", "lr", float(f"{lr:.3g}"), f"Tuner.lr_find over {steps} steps (suggested {found:.3g})")
    print(f"Learning rate: {lr:.3g} at base batch {model.hparams.base_batch_size} (suggested {found:.3g}).")


def find_batch_size(cli, max_trials: int) -> None:
    # Doubling from the configured batch, not from Lightning's default of 2: fewer trials.
    found = Tuner(cli.trainer).scale_batch_size(
        cli.model,
        datamodule=cli.datamodule,
        mode="power",
        init_val=cli.datamodule.batch_size,
        max_trials=max_trials,
        batch_arg_name="batch_size",
    )
    update_tuned_config("data", "batch_size", int(found), f"Tuner.scale_batch_size, {max_trials} doublings at most")
    print(f"Batch size: {found} per device (model.scale_lr adjusts the learning rate to it).")


def main(args: list[str]) -> int:
    from .benchmark import build

    parser = argparse.ArgumentParser(prog="{{ cookiecutter.package_name }} tune", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["lr", "batch_size"])
    parser.add_argument("--steps", type=int, default=100, help="lr: steps of the range test")
    parser.add_argument("--max-trials", type=int, default=8, help="batch_size: doublings to try at most")
    options, cli_args = parser.parse_known_args(args)
    # Nothing to keep from a tuning run: no logger, checkpoints or callbacks.
    quiet = ["--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.callbacks=[]"]
    cli = build([*cli_args, *quiet])
    if options.what == "lr":
        find_lr(cli, options.steps)
    else:
        find_batch_size(cli, options.max_trials)
    print(f"Written to {TUNED_CONFIG}: python -m {{ cookiecutter.package_name }} fit --config {TUNED_CONFIG}")
    return 0
