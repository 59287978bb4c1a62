"""Training-loop overhead: the generated project's `fit`, as its defaults build it, against a plain PyTorch loop.

Run from the template's root:

    .venv/bin/python benchmarks/parity.py [--steps 30] [--warmup 5] [--repeats 5]
                                          [--precision P] [--num-workers N] [--batch-size B]

A project is rendered from the template with the default answers into a temporary folder and
imported from there, so the figures follow the template as it changes. The Lightning side is what
`fit` builds from the project's configs (its trainer preset and configs/default.yaml) on image
files of the project's shapes dataset: the data workers, augmentation, metrics, callbacks,
progress lines, the W&B logger (offline, as without an API key) and the precision the hardware
rules choose; only a step timer is added. The plain loop trains a model and data module built the
same way (same seed, same batches and augmentation, same workers) with a hand-written loop: the
model's forward, loss and metric updates, backward, AdamW and its warmup-cosine schedule, and the
hooks Lightning would call (configure_model, the data module's on_after_batch_transfer); no
logging, callbacks or progress. The options above override the configs' values, which are the
defaults. Each repetition runs the two loops one after the other, in alternating order, within one
epoch, and times each step after the warmup ones from the end of the step before (so data loading
and all loop overhead count). The first table gives each repetition's median ms per step of each
loop, their ratio (Lightning / plain) and each loop's last loss: equal losses show that both loops
did the same computation. The summary pools the timed steps of all repetitions and gives the ratio
of the median ms per step.
"""

import argparse
import contextlib
import gc
import logging
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import torch
import torch.nn.functional as F
from rendered import ROOT, render_project


class Project:
    """The rendered project, and the model, data and trainer its `fit` builds, alike for both loops."""

    def __init__(self, src: Path, args, total: int) -> None:
        sys.path.insert(0, str(src))
        os.chdir(src.parent)  # where `fit` runs: its configs/ and runs/
        from image_classifier import cli
        from image_classifier.datasets.shapes import CLASSES, draw_shapes_dataset

        self.cli = cli
        # One epoch holds every step of a batch size up to 64, so no epoch-end work (validation,
        # checkpoints) lands in the timed steps. The one val image per class only gives the folder layout.
        per_class = math.ceil((total + 1) * max(args.batch_size or 64, 64) / len(CLASSES))
        data_dir = draw_shapes_dataset(Path("shapes"), images_per_class={"train": per_class, "val": 1}, size=64)
        given = {"trainer.precision": args.precision, "data.num_workers": args.num_workers,
                 "data.batch_size": args.batch_size}  # fmt: skip
        self.options = [f"--data.data_dir={data_dir}", "--data.synthetic=false", f"--trainer.max_steps={total}"]
        self.options += [f"--{name}={value}" for name, value in given.items() if value is not None]

    def build(self):
        """The model, data module and trainer, as `fit` with these options would build them."""
        return self.cli.build(self.options)

    def end_run(self) -> None:
        self.cli.finish_wandb_run()  # as the end of `fit`'s process does; the next run opens its own


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepTimer(L.Callback):
    """The end time of each step from the last warmup one on, and the last loss."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.ends: list[float] = []
        self.loss = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 >= self.warmup:
            sync(pl_module.device)
            self.ends.append(time.perf_counter())
            self.loss = outputs["loss"]


def step_times(ends: list[float]) -> list[float]:
    """Seconds of each step: from the end of the one before to its own end, data loading included."""
    return [end - start for start, end in zip(ends[:-1], ends[1:], strict=True)]


def run_lightning(project: Project, args, total: int) -> tuple[list[float], float]:
    built = project.build()
    timer = StepTimer(args.warmup)
    built.trainer.callbacks.append(timer)
    built.trainer.fit(built.model, built.datamodule)
    project.end_run()
    return step_times(timer.ends), timer.loss.item()


def run_plain(project: Project, args, total: int) -> tuple[list[float], float]:
    built = project.build()
    datamodule, model, precision = built.datamodule, built.model, built.trainer.precision
    # What the model's hooks read from the trainer, for a single device, no accumulation, clipping or checkpoint.
    model.trainer = SimpleNamespace(
        estimated_stepping_batches=total,
        accumulate_grad_batches=1,
        distributed_sampler_kwargs=None,
        strategy=SimpleNamespace(),
        ckpt_path=None,
        gradient_clip_val=None,
    )
    # The hooks Lightning calls around the training step, in its order: the model may change its
    # layout (channels_last) in configure_model, and the data module finish batches on the device.
    model.configure_model()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).train()
    config = model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    after_transfer = "on_after_batch_transfer" in vars(type(datamodule))
    project.resolved = f"{precision}, batch {loader.batch_size}, {loader.num_workers} data workers"
    if precision == "bf16-mixed":
        autocast = torch.autocast(device.type, dtype=torch.bfloat16)
    elif precision == "32-true":
        autocast = contextlib.nullcontext()
    else:
        sys.exit(f"error: the plain loop trains in bf16-mixed or 32-true, not {precision}; pass --precision")
    label_smoothing = model.hparams.label_smoothing
    ends = []

    for step, batch in enumerate(loader, start=1):
        batch = [tensor.to(device, non_blocking=True) for tensor in batch]
        if after_transfer:
            batch = datamodule.on_after_batch_transfer(batch, 0)
        images, labels = batch
        with autocast:
            logits = model(images)
            losses = F.cross_entropy(logits, labels, label_smoothing=label_smoothing, reduction="none")
            loss = losses.mean()
            model.train_loss(losses)
            model.train_metrics.update(logits, labels)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        if step >= args.warmup:
            sync(device)
            ends.append(time.perf_counter())
        if step == total:
            return step_times(ends), loss.item()
    raise ValueError(f"The training set gives fewer than {total} batches")


def machine() -> str:
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name()
    else:
        cpuinfo = Path("/proc/cpuinfo")
        lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        device = f"CPU ({names[0] if names else platform.processor() or platform.machine()})"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"device: {device}; CPUs: {cpus} usable of {os.cpu_count()}; torch threads: {torch.get_num_threads()}\n"
        f"python {platform.python_version()}, torch {torch.__version__}, lightning {L.__version__}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="timed steps per loop and repetition")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before them")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--precision", choices=["bf16-mixed", "32-true"], help="default: the hardware rules' choice")
    parser.add_argument("--num-workers", type=int, help="default: the config's (auto)")
    parser.add_argument("--batch-size", type=int, help="default: the config's")
    args = parser.parse_args()
    if args.warmup < 1 or args.steps < 1:
        parser.error("--warmup and --steps must be at least 1")
    total = args.warmup + args.steps

    # Lightning's info lines, the project's and W&B's would break up the table.
    for name in ("lightning.pytorch", "lightning.fabric", "image_classifier"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    # The timed epoch ends at max_steps, before any validation: the best-checkpoint callback says it has no val/acc.
    warnings.filterwarnings("ignore", message=r"`ModelCheckpoint\(monitor='val/acc'\)` could not find")
    print(machine())
    loops = {"lightning": run_lightning, "plain": run_plain}
    reps = []
    with tempfile.TemporaryDirectory(prefix="parity-") as tmp:
        project = Project(render_project(Path(tmp), "logger=wandb"), args, total)
        for rep in range(args.repeats):
            # Alternate which loop goes first, so neither always inherits the other's warm caches.
            order = list(loops) if rep % 2 == 0 else list(reversed(loops))
            reps.append({})
            for name in order:
                reps[-1][name] = loops[name](project, args, total)
                gc.collect()  # ends the run's persistent loader workers before the next run
        os.chdir(ROOT)  # out of the folder before it goes
    print(f"fit {' '.join(project.options)}: resnet18, 64 px, {project.resolved}")
    print(f"{args.steps} timed steps after {args.warmup} warmup, {args.repeats} repetitions")

    # A median per step rather than a mean: a busy machine stalls a few steps for seconds.
    print(
        f"\n{'rep':>3}  {'lightning ms':>12}  {'plain ms':>8}  {'ratio':>6}  {'last loss lightning':>19}  {'plain':>8}"
    )
    for rep, runs in enumerate(reps):
        (light, light_loss), (plain, plain_loss) = runs["lightning"], runs["plain"]
        light, plain = statistics.median(light) * 1e3, statistics.median(plain) * 1e3
        print(
            f"{rep:>3}  {light:>12.1f}  {plain:>8.1f}  {light / plain:>5.2f}x  {light_loss:>19.5f}  {plain_loss:>8.5f}"
        )

    print(f"\nover all {args.repeats * args.steps} timed steps of each loop, ms/step:")
    print(f"{'loop':>9}  {'median':>7}  {'mean':>7}  {'min':>7}")
    medians = {}
    for name in loops:
        times = [t * 1e3 for runs in reps for t in runs[name][0]]
        medians[name] = statistics.median(times)
        print(f"{name:>9}  {medians[name]:>7.1f}  {statistics.mean(times):>7.1f}  {min(times):>7.1f}")
    print(f"\nlightning / plain (median ms/step): {medians['lightning'] / medians['plain']:.2f}x (target <= 1.05x)")


if __name__ == "__main__":
    main()
