"""`python -m {{ cookiecutter.package_name }} benchmark data|train [CLI options]`: this machine's speed on this config.

data: images/s of the training data loader for growing num_workers, until more workers stop paying;
      writes the best setting to configs/tuned.yaml (use it with --config configs/tuned.yaml).
train: images/s of training steps with the current configuration, and on NVIDIA GPUs the model
      FLOP utilisation (MFU) against the GPU's peak for the precision; with --precision, of each
      precision side by side.
Options after the command are the usual CLI options (--config, --data.batch_size 128, ...). Both time
the epochs after a recipe's basic ones: its augmentation policy and mixing on.
"""

import argparse
import statistics
import time
import typing

import lightning as L
import torch
from lightning.fabric.utilities.throughput import get_available_flops, measure_flops

from ..cli import build
from ..data import ImageDataModule, auto_workers, usable_cpus
from ..errors import PACKAGE, CommandParser, ConfigError, likely_meant, literal_choices
from ..model import ImageClassifier
from .tuned_config import TUNED_CONFIG, update_tuned_config

# More workers count as faster only past this margin: timing noise must not add idle processes.
BETTER_BY = 1.05


def loader_speed(data: ImageDataModule, workers: int, batches: int) -> float:
    """Images/s over `batches` batches, after the first (worker start-up) is excluded."""
    data.hparams.num_workers = workers
    loader = iter(data.train_dataloader())
    next(loader)
    images, started = 0, time.perf_counter()
    for _ in range(batches):
        batch = next(loader, None)
        if batch is None:  # a small dataset: start the next epoch's pass
            loader = iter(data.train_dataloader())
            batch = next(loader)
        images += len(batch[1])
    return images / (time.perf_counter() - started)


def benchmark_data(cli_args: list[str], batches: int, counts: list[int] | None) -> None:
    cli = build(cli_args)
    data, devices = cli.datamodule, cli.trainer.num_devices
    data.prepare_data()
    data.setup("fit")
    # Each device's process loads its own data: the scan stays within one process's share of the CPUs.
    cpus = auto_workers(usable_cpus(), devices) + 1
    print(f"Data loading, batch size {data.batch_size}, {data.hparams.image_size} px, {cpus} CPUs per device")
    print(f"{'workers':>8}  {'images/s':>9}")
    speeds: dict[int, float] = {}
    candidates = counts or [0, 1, *(2**power for power in range(1, 8) if 2**power <= cpus)]
    best = candidates[0]
    for workers in candidates:
        speeds[workers] = loader_speed(data, workers, batches)
        print(f"{workers:>8}  {speeds[workers]:>9.0f}")
        if speeds[workers] > speeds[best] * BETTER_BY:
            best = workers
        elif workers >= 2 and not counts:  # more workers stopped paying (one can lose to none where two win)
            break
    update_tuned_config("data.num_workers", best, f"benchmark data, {speeds[best]:.0f} images/s per device")
    print(f"Best: num_workers {best} ({speeds[best]:.0f} images/s). Written to {TUNED_CONFIG}:")
    print(f"  python -m {PACKAGE} fit --config {TUNED_CONFIG}")


class StepTimer(L.Callback):
    """Wall time of the training steps after `warmup` steps (compilation, cuDNN's search, caches).
    The device is synchronised only where timing starts and ends, so the host queues work ahead."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.images, self.started, self.elapsed = warmup, 0, 0.0, 0.0

    def _now(self, trainer: L.Trainer) -> float:
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_step == self.warmup and not self.started:
            self.started = self._now(trainer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.started:
            self.images += len(batch[1])

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        if self.started:
            self.elapsed = self._now(trainer) - self.started


def flops_per_image(model: ImageClassifier, image_size: int) -> int:
    """Forward and backward FLOPs of one image, counted on a weightless (meta-device) copy."""
    with torch.device("meta"):
        copy = ImageClassifier(**model.hparams)
        images = torch.empty(1, 3, image_size, image_size)
    return measure_flops(copy, lambda: copy(images), lambda logits: logits.sum())


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """The GPU's dense peak FLOP/s in `dtype` (float32 counts as TF32 where matmuls use it), or None."""
    if torch.cuda.get_device_name(device) != "NVIDIA H200":
        return get_available_flops(device, dtype)
    # Lightning 2.6 finds no row for a GPU named plainly "NVIDIA H200", and its H200 rows count 2:4
    # sparsity. The H200 SXM is the H100 SXM's chip at the same clocks: its dense peaks are these.
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return 494.7e12
    return {torch.bfloat16: 989.4e12, torch.float16: 989.4e12, torch.float32: 66.9e12}[dtype]


# How many times benchmark_precisions times each precision, in turn with the others.
TURNS = 3


def benchmark_train(cli_args: list[str], steps: int, warmup: int) -> tuple[str, float] | None:
    # No validation, checkpoints, logger or callbacks: only the training steps are timed.
    quiet = [f"--trainer.max_steps={warmup + steps}", "--trainer.limit_val_batches=0", "--trainer.callbacks=[]",
             "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--trainer.enable_progress_bar=false",
             "--trainer.enable_model_summary=false"]  # fmt: skip
    cli = build([*cli_args, *quiet])
    timer = StepTimer(warmup)
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, cli.datamodule)
    if timer.elapsed == 0:
        raise ConfigError(f"Too few training batches for {warmup} warm-up and {steps} timed steps: lower --steps.")
    trainer, per_process = cli.trainer, timer.images / timer.elapsed
    if not trainer.is_global_zero:
        return None
    speed = per_process * trainer.world_size
    device = trainer.strategy.root_device
    print(f"Training: {cli.model.hparams.backbone}, {trainer.precision}, {trainer.world_size} x {device.type}")
    print(f"  {speed:.0f} images/s ({per_process:.0f} per process), {1000 * timer.elapsed / steps:.1f} ms/step")
    dtypes = {"bf16": torch.bfloat16, "16": torch.float16}
    dtype = dtypes.get(trainer.precision.split("-")[0], torch.float32)
    peak = peak_flops(device, dtype) if device.type == "cuda" else None
    if peak:
        used = flops_per_image(cli.model, cli.datamodule.hparams.image_size) * per_process
        print(f"  MFU {100 * used / peak:.1f} % of {torch.cuda.get_device_name(device)}'s {peak / 1e12:.0f} TFLOP/s")
    else:
        print("  MFU: needs an NVIDIA GPU whose peak FLOP/s Lightning knows")
    return trainer.precision, speed


def benchmark_precisions(cli_args: list[str], precisions: list[str], steps: int, warmup: int) -> None:
    """benchmark_train in each precision, in turns, then the median images/s of each side by side."""
    # As asked: a run left to pick its device (accelerator auto) trains on a CPU in its fastest precision.
    on_cpu = [] if torch.cuda.is_available() or torch.backends.mps.is_available() else ["--trainer.accelerator=cpu"]
    # In turns, a share of the steps each: other work on the machine, which comes and goes, slows each
    # precision alike. One run after the other, two runs minutes apart gave 0.36x and 8.2x on a shared CPU.
    speeds, ran = {asked: [] for asked in precisions}, {}
    for _ in range(TURNS):
        for asked in precisions:
            measured = benchmark_train([*cli_args, *on_cpu, f"--trainer.precision={asked}"], -(-steps // TURNS), warmup)
            if measured is not None:  # rank 0
                ran[asked], speed = measured
                speeds[asked].append(speed)
    if not ran:
        return
    median = {asked: statistics.median(measured) for asked, measured in speeds.items()}
    baseline = median.get("32-true")
    print(f"{'precision':<12}{'images/s':>10}{'turns from-to':>16}{'vs 32-true':>12}")
    for asked in precisions:
        versus = f"{median[asked] / baseline:.2f}x" if baseline else "-"
        spread = f"{min(speeds[asked]):.0f}-{max(speeds[asked]):.0f}"
        ran_as = f"  (ran as {ran[asked]})" if ran[asked] != asked else ""
        print(f"{asked:<12}{median[asked]:>10.0f}{spread:>16}{versus:>12}{ran_as}")
    fastest = max(precisions, key=median.get)
    print(f"Fastest here: {fastest} (--trainer.precision {fastest}), the median of {TURNS} turns each")


def precision_list(text: str) -> list[str]:
    """--precision: "all" (those this machine trains in), or a comma-separated list."""
    if text == "all":
        return ["32-true", "bf16-mixed", *(["16-mixed"] if torch.cuda.is_available() else [])]
    asked = [precision.strip() for precision in text.split(",") if precision.strip()]
    known = [str(value) for value in literal_choices(typing.get_type_hints(L.Trainer.__init__)["precision"])]
    if unknown := [precision for precision in asked if precision not in known]:
        meant = f" (did you mean {meant}?)" if (meant := likely_meant(unknown[0], known, n=1)) else ""
        raise argparse.ArgumentTypeError(
            f"{unknown[0]} is no precision Lightning trains in{meant}: give some such as 32-true, bf16-mixed "
            "and 16-mixed, or all"
        )
    return asked


def worker_counts(text: str) -> list[int]:
    try:
        counts = [int(count) for count in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"worker counts are whole numbers separated by commas, got {text!r}") from None
    if min(counts) < 0:
        raise argparse.ArgumentTypeError(f"worker counts are 0 or more, got {text}")
    return counts


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} benchmark", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["data", "train"])
    parser.add_argument("--batches", type=int, default=30, help="data: batches timed per worker count")
    parser.add_argument(
        "--workers",
        type=worker_counts,
        help="data: the worker counts to time, as 0,4,8,16 (default: 0, 1, 2, 4, ... while more pay, up to the CPUs)",
    )
    parser.add_argument("--steps", type=int, default=30, help="train: steps timed")
    parser.add_argument("--warmup", type=int, default=5, help="train: steps run before timing")
    parser.add_argument(
        "--precision", type=precision_list, help="train: precisions to compare, as 32-true,bf16-mixed, or all"
    )
    options, cli_args = parser.parse_known_args(args)
    parser.check_at_least(options, {"--batches": 1, "--steps": 1, "--warmup": 0})
    if options.what == "data" and options.precision:  # the data's speed does not depend on it
        parser.error("--precision is an option of benchmark train")
    if options.what == "train" and options.workers:
        parser.error("--workers is an option of benchmark data")
    # Timed as the run's later epochs train, with a recipe's augmentation policy and mixing on.
    cli_args = [*cli_args, "--data.basic_augment_epochs=0", "--model.unmixed_epochs=0"]
    if options.what == "data":
        benchmark_data(cli_args, options.batches, options.workers)
    elif options.precision:
        benchmark_precisions(cli_args, options.precision, options.steps, options.warmup)
    else:
        benchmark_train(cli_args, options.steps, options.warmup)
    return 0
