"""Callbacks that keep a long run's progress: a checkpoint on SIGTERM or Ctrl-C, a stop on a non-finite loss,
and an end to processes whose launcher is gone."""

import functools
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DeepSpeedStrategy, Strategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from ..errors import ConfigError, UserError
from .sigterm import signal_said


class CheckpointOnStop(L.Callback):
    """Save last.ckpt when the process is asked to stop: a SIGTERM (a preemption, `scancel`, a pod
    eviction) or a first Ctrl-C during training.

    The signal is noted, and at the next batch boundary the processes of a multi-process run agree
    on whether any of them got one, so that all stop after the same batch and save one consistent
    mid-epoch checkpoint together; `--ckpt_path auto` resumes from it. A validation can outlast a
    preemption's grace period, so the run stops within it too, and the resumed run validates again
    from its first batch: the metrics of the batches before are not in the checkpoint.

    Lightning 2.6's own handler runs a collective inside the signal handler, which meets another
    process's collective of the step and hangs the run; this one replaces it. (Lightning's
    OnExceptionCheckpoint needs a fixed folder and fires on every exception, a NaN stop included.)
    A second Ctrl-C stops at once, unsaved, as Lightning stops at the first.
    """

    def __init__(self) -> None:
        self.stop_requested = False
        self.stopped_by = signal.SIGTERM
        self._interrupted_at: float | None = None
        self._saving_in_validation = False
        self._batches_to_agree_on = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the Trainer has installed its handlers, which it restores at the end; a SIGTERM that
        # its handler noted before (the sanity check, set-up) stops the first step.
        self.stop_requested = trainer.received_sigterm
        signal.signal(signal.SIGTERM, functools.partial(self._note, trainer))
        signal.signal(signal.SIGINT, functools.partial(self._note_interrupt, trainer))

    def _note(self, trainer: L.Trainer, signum: int, frame) -> None:
        if not self.stop_requested and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)  # the processes Lightning started get it too
        self.stop_requested = True

    def _note_interrupt(self, trainer: L.Trainer, signum: int, frame) -> None:
        # A terminal sends Ctrl-C to every process in its group, and the tools pass it on to the runs
        # they start: one press may come twice. Only a press a second after the first is a second one.
        # Not passed on: the other processes see the stop at the batch boundary.
        if self._interrupted_at is not None:
            if time.monotonic() - self._interrupted_at > 1.0:
                raise KeyboardInterrupt
            return
        self._interrupted_at = time.monotonic()
        if not self.stop_requested:
            self.stopped_by = signal.SIGINT
        self.stop_requested = True
        if trainer.is_global_zero:  # os.write: print is not safe in a signal handler
            step = "validation batch" if trainer.validating else "training step"
            said = f"Ctrl-C: stopping after this {step}, to save the run (Ctrl-C again: at once, unsaved)"
            os.write(2, f"\n{said}\n".encode())

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        if trainer.fit_loop.epoch_loop._should_accumulate():  # Lightning's own test, alike in every process
            # Inside an accumulation window, whose gradients a checkpoint does not hold: stopped at its end.
            trainer._signal_connector.received_sigterm = False
            return
        self._agree_on_stop(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Agreed on over the batches that every process runs and that are not its last (after which
        # Lightning stops none): DDP's shards of the images can differ by a batch.
        self._batches_to_agree_on = 0
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        if trainer.received_sigterm:
            # Agreed on at the epoch's last step: stopped before the first batch, in every process alike.
            # Lightning would stop after it, unless it is a process's last, and that process alone would go on.
            raise SIGTERMException
        batches = min(trainer.num_val_batches, default=0)
        common = torch.tensor(int(batches) if math.isfinite(batches) else 0, device=trainer.strategy.root_device)
        if trainer.world_size > 1:
            torch.distributed.all_reduce(common, op=torch.distributed.ReduceOp.MIN)
        self._batches_to_agree_on = int(common) - 1

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int, *args
    ) -> None:
        if batch_idx < self._batches_to_agree_on:
            self._agree_on_stop(trainer)

    def _agree_on_stop(self, trainer: L.Trainer) -> None:
        requested = torch.tensor(int(self.stop_requested), device=trainer.strategy.root_device)
        if trainer.world_size > 1:
            torch.distributed.all_reduce(requested, op=torch.distributed.ReduceOp.MAX)
        # Lightning raises SIGTERMException on this flag after the batch, in every process alike.
        trainer._signal_connector.received_sigterm = bool(requested)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        if not self._saving_in_validation:
            return
        # Counted as a validation stopped in its first batch, which Lightning's resume runs again whole.
        progress = checkpoint["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]
        done = progress["current"]["completed"]
        for counts in progress["total"], progress["current"]:
            counts["processed"] = counts["completed"] = counts["completed"] - done
            counts["ready"] = counts["started"] = counts["completed"] + 1
        progress["is_last_batch"] = False

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        exception.signal = self.stopped_by  # cli.main exits with the shell's status for it
        checkpoint = trainer.checkpoint_callback
        # An evaluation has nothing to save, and its model is the checkpoint it evaluates (the best,
        # often): written as last.ckpt, the run would resume from that epoch.
        if trainer.state.fn == TrainerFn.FITTING and checkpoint is not None and checkpoint.dirpath:
            self._save_last(trainer, Path(checkpoint.dirpath), exception)
        # After the save, whose collectives the launcher's watch still guards; cli.main waits for them.
        exception.started = take_over_started_processes(trainer.strategy)

    def _save_last(self, trainer: L.Trainer, folder: Path, exception: SIGTERMException) -> None:
        path = folder / f"{ModelCheckpoint.CHECKPOINT_NAME_LAST}{ModelCheckpoint.FILE_EXTENSION}"
        self._saving_in_validation = trainer.validating
        trainer.save_checkpoint(path, weights_only=False)  # every rank takes part, as sharded strategies need
        exception.saved = path  # cli.main then prints the command that resumes, as the last line
        during = ", during validation, which the resumed run does again" if trainer.validating else ""
        rank_zero_info(f"{signal_said(self.stopped_by)}: saved {path} at step {trainer.global_step}{during}.")


def take_over_started_processes(strategy: Strategy) -> list[subprocess.Popen]:
    """The processes Lightning's launcher started from this one, taken from its watch. Each ends with
    the stop's status too, and its watcher, which looks at the same list every 5 s, would SIGKILL this
    process on seeing one (the status and the command that resumes lost) unless this one ended first."""
    started = getattr(strategy.launcher, "procs", [])
    taken = list(started)
    started.clear()
    return taken


def started_by_local_rank_0() -> bool:
    """Whether Lightning's launcher in this machine's first process started this one (not torchrun or
    SLURM, whose processes each report to the job), so that the first one tells what all of them met."""
    launched = os.environ.get("LOCAL_RANK", "0") != "0"
    return launched and "TORCHELASTIC_RUN_ID" not in os.environ and "SLURM_PROCID" not in os.environ


def wait_for(processes: list[subprocess.Popen], seconds: float = 30) -> None:
    """Wait for processes to end, and end those still running after `seconds`, as Lightning would."""
    deadline = time.monotonic() + seconds
    for process in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            process.kill()


class NonFiniteLossError(UserError, RuntimeError):
    """A NaN or infinite training loss, raised before it reaches the weights, in every process alike."""

    in_every_process = True  # told once, by the first


class StopOnNonFiniteLoss(L.Callback):
    """Stop before a NaN or infinite loss can touch the weights, naming the step and the batch.

    The run stops before the bad update and before any further checkpoint, so the last checkpoint
    is a good one. With `skip_batches`, such batches are dropped with a warning instead. The loss is
    checked on the device and read back once per optimizer step, after the backward pass has been
    queued, so the GPU stays busy while the host waits for the answer.

    Args:
        skip_batches: Drop the update of a batch whose loss is not finite instead of stopping.
    """

    def __init__(self, skip_batches: bool = False) -> None:
        self.skip_batches = skip_batches
        self._finite: torch.Tensor | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.skip_batches and isinstance(trainer.strategy, DeepSpeedStrategy):
            # DeepSpeed has reduced the gradients into its own buffers by then: zeroing ours skips nothing.
            raise ConfigError("skip_batches does not work under DeepSpeed: set it to false to stop at a NaN loss.")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        self._batch_idx = batch_idx

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        finite = torch.isfinite(loss.detach())
        self._finite = finite if self._finite is None else self._finite & finite  # over accumulated batches

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self._finite is None:
            return
        here, self._finite = bool(self._finite.item()), None
        # Decided together: gradient averaging spreads one process's NaN to all of them, and a
        # process that stopped alone would leave the others waiting.
        if trainer.strategy.reduce_boolean_decision(here, all=True):
            return
        where = f"global step {trainer.global_step} (epoch {trainer.current_epoch}, batch {self._batch_idx})"
        if not self.skip_batches:
            folder = getattr(trainer.checkpoint_callback, "dirpath", None)
            kept = f"; the last checkpoint in {folder} is intact" if folder and any(Path(folder).glob("*.ckpt")) else ""
            error = NonFiniteLossError(
                f"Loss is not finite at {where}: stopped before the update{kept}. Lower model.lr, "
                "use precision bf16-mixed or 32-true, check that batch's images, or set "
                "skip_batches: true on StopOnNonFiniteLoss to drop such batches."
            )
            error.started = take_over_started_processes(trainer.strategy)  # each ends with this error's status too
            raise error
        rank_zero_warn(f"Loss is not finite at {where}: dropping this batch's update.")
        # Parameters without gradients are left alone by the optimizer: the batch never happened.
        optimizer.zero_grad(set_to_none=True)


class EndWithLauncher(L.Callback):
    """A process that a launcher started (Lightning's, for local ranks 1 and up; torchrun's agent)
    exits as soon as that launcher is gone, with a line naming it.

    Otherwise, when the launcher dies (the OOM killer, a SIGKILL), such a process keeps its GPU until
    its next collective times out: NCCL never notices a dead peer. (When a child dies instead,
    Lightning's launcher ends the others, and torchrun's agent and `srun --kill-on-bad-exit` do the same.)
    The watch starts with the process, so it covers the rendezvous too, and ends with each stage's
    collectives, after which the launcher may exit first.

    Args:
        poll_seconds: How often the process looks for its launcher.
    """

    def __init__(self, poll_seconds: float = 1.0) -> None:
        self.poll_seconds = poll_seconds
        # Lightning's launcher sets LOCAL_RANK in the processes it starts, and 0 in its own (rank 0,
        # which a person or a scheduler started); torchrun in all of its workers.
        launched = os.environ.get("LOCAL_RANK", "0") != "0" or "TORCHELASTIC_RUN_ID" in os.environ
        self._launcher = os.getppid() if launched else None
        self._done: threading.Event | None = None
        self._watch()

    def __getstate__(self) -> dict:
        # A copy in another process (ddp_spawn pickles the Trainer) watches nothing: threads don't travel,
        # and multiprocessing ends spawned processes with their parent.
        return self.__dict__ | {"_launcher": None, "_done": None}

    def _watch(self) -> None:
        if self._launcher is None or (self._done is not None and not self._done.is_set()):
            return
        self._done = threading.Event()
        watch = threading.Thread(target=self._exit_without_launcher, args=(self._done,), name="launcher-watch")
        watch.daemon = True
        watch.start()

    def _exit_without_launcher(self, done: threading.Event) -> None:
        while not done.wait(self.poll_seconds):
            if os.getppid() != self._launcher:
                torchrun = "TORCHELASTIC_RUN_ID" in os.environ
                launcher = "torchrun's agent" if torchrun else "local rank 0, which started this process,"
                print(
                    f"error: {launcher} (pid {self._launcher}) has exited: local rank {os.environ['LOCAL_RANK']} "
                    "stops too, instead of waiting for it at the next collective.",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(1)

    def _stop(self) -> None:
        if self._done is not None:
            self._done.set()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._watch()  # again, for a later stage in the same process

    # The stage's collectives are over (or abandoned): the launcher may now exit first.
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            self._stop()

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._stop()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop()
