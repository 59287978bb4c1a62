"""Progress as plain lines, for output that is not a terminal (SLURM logs, `| tee`, CI), where a live
progress bar shows nothing until the run ends."""

import math
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.trainer.states import TrainerFn

# The run's first line comes after this many steps, so a log shows early that training goes.
FIRST_LINE_STEPS = 10


def next_epoch(trainer: L.Trainer) -> int:
    """The epoch a fit trains next. A resumed run's first, too, where Lightning's current_epoch may
    still be the checkpoint's (saved at an epoch's end, with max_steps set); in an epoch's closing
    validation, the one after it, which the loop counts only once the validation ends: a checkpoint
    saved there resumes into that epoch, which a loader that counts its own epochs must be told."""
    closing = (
        trainer.validating
        and trainer.state.fn == TrainerFn.FITTING
        and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
    )
    return trainer.fit_loop.epoch_progress.current.processed + closing


def ends_before(trainer: L.Trainer, epoch: int) -> str:
    """The end of a line saying what starts at `epoch`: "; this run ends before, at epoch N." where
    the fit's limits end it before that one, else "."."""
    last = last_epoch(trainer)
    return f"; this run ends before, at epoch {last}." if last is not None and last < epoch else "."


def last_epoch(trainer: L.Trainer) -> int | None:
    """The last epoch a fit reaches by its limits, max_epochs or max_steps, whichever comes first,
    counted from where it is (a resumed run's steps per epoch may differ from before); None where
    neither ends it. Its training data loaded."""
    ends = [trainer.max_epochs - 1] if trainer.max_epochs is not None and trainer.max_epochs >= 0 else []
    batches = trainer.num_training_batches
    if trainer.max_steps >= 0 and batches and not math.isinf(batches):  # else max_steps ends no epoch
        per_epoch = math.ceil(batches / trainer.accumulate_grad_batches)
        done = math.ceil(trainer.fit_loop.epoch_loop.batch_progress.current.completed / trainer.accumulate_grad_batches)
        left = trainer.max_steps - trainer.global_step + done  # from the current epoch's start
        ends.append(trainer.current_epoch + max(1, math.ceil(left / per_epoch)) - 1)
    return min(ends) if ends else None


class LogLines(ProgressBar):
    """A line every `every_n_steps` training steps or `every_seconds`, whichever comes first, and after
    the run's first 10 steps (epoch, step, the progress-bar metrics, images/s); and one per epoch
    after its validation (every logged metric, images/s, time)."""

    def __init__(self, every_n_steps: int = 100, every_seconds: float = 30.0) -> None:
        super().__init__()
        if every_n_steps < 1 or every_seconds <= 0:
            raise ValueError(f"every_n_steps and every_seconds must be positive, not {every_n_steps}, {every_seconds}")
        self.every_n_steps, self.every_seconds = every_n_steps, every_seconds
        self._enabled = True
        self._lines = 0  # step lines printed in this run

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.on_train_epoch_start(trainer, pl_module)  # a run resumed mid-epoch starts with no epoch start

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start = self._interval_start = time.perf_counter()
        self._epoch_images = self._interval_images = self._interval_steps = 0
        self._train_seconds = 0.0
        self._rates: dict[str, float] = {}  # of the epoch's last step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        # Read before the step, as LearningRateMonitor logs them: by the epoch's end the schedule has
        # moved on to the next step's (0 after the last epoch's, a rate no step used).
        self._rates = rates_of(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        images = len(batch[0] if isinstance(batch, (list, tuple)) else batch) * trainer.world_size
        self._epoch_images += images
        self._interval_images += images
        self._interval_steps += 1
        now = time.perf_counter()
        self._train_seconds = now - self._epoch_start
        steps = self.total_train_batches
        due = (
            self._interval_steps >= self.every_n_steps
            or now - self._interval_start >= self.every_seconds
            or (self._lines == 0 and self._interval_steps >= FIRST_LINE_STEPS)
        )
        if not due or (math.isfinite(steps) and batch_idx + 1 >= steps):
            return  # the epoch's own line follows its last step
        rate = self._interval_images / max(now - self._interval_start, 1e-9)
        self._interval_start, self._interval_images, self._interval_steps = now, 0, 0
        self._lines += 1
        total = f"/{steps}" if math.isfinite(steps) else ""
        metrics = {k: float(v) for k, v in self.get_metrics(trainer, pl_module).items() if k != "v_num"}
        self._print(f"{self._epoch(trainer)}  step {batch_idx + 1}{total}", metrics, f"{rate:.0f} img/s")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        logged = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if not isinstance(value, torch.Tensor) or value.numel() == 1
        }
        # "train/loss" beside "train/loss_epoch" is the same number; "_step" values are one batch's.
        metrics = {
            name: value
            for name, value in sorted(logged.items())
            if not name.endswith("_step") and f"{name}_epoch" not in logged and not name.startswith("lr-")
        }
        # Read here, not from LearningRateMonitor, which may have logged none this epoch. A run resumed
        # at the epoch's closing validation took no step of it: no rate (the restored optimizer's is the
        # next step's).
        rates = self._rates
        if len(set(rates.values())) == 1:  # one number where the parameter groups agree
            metrics["lr"] = next(iter(rates.values()))
        else:
            metrics |= {f"lr-{name}": value for name, value in rates.items()}
        elapsed = time.perf_counter() - self._epoch_start
        tail = f"{elapsed:.0f} s"
        if self._epoch_images:  # none where a resumed run starts at the epoch's closing validation
            tail = f"{self._epoch_images / max(self._train_seconds, 1e-9):.0f} img/s  {tail}"
        batches, done = self.total_train_batches, trainer.fit_loop.epoch_loop.batch_progress.current.completed
        # max_steps can end the fit inside an epoch: the line says how far it went.
        end = f"stopped at step {done}/{batches}" if math.isfinite(batches) and done < batches else "done"
        self._print(f"{self._epoch(trainer)}  {end}", metrics, tail)

    def _epoch(self, trainer: L.Trainer) -> str:
        # Counted from 0 to max_epochs - 1, as the checkpoint names and Lightning's bars count them.
        last = f"/{trainer.max_epochs - 1}" if trainer.max_epochs and trainer.max_epochs > 0 else ""
        return f"Epoch {trainer.current_epoch}{last}"

    def _print(self, head: str, metrics: dict, tail: str) -> None:
        if not self._enabled:
            return
        values = "  ".join(f"{name} {value:.4g}" for name, value in metrics.items())
        # Flushed: a file or pipe holds what is printed in a buffer, which is the silence this avoids.
        print("  ".join(part for part in (head, values, tail) if part), flush=True)


def rates_of(trainer: L.Trainer) -> dict[str, float]:
    """The learning rate of each parameter group of the first optimizer, by the group's name."""
    groups = trainer.optimizers[0].param_groups if trainer.optimizers else []
    return {group.get("name", str(index)): group["lr"] for index, group in enumerate(groups)}
