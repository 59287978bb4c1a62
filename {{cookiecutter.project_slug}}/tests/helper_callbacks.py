"""Callbacks the tests load into real training processes (tests/ is on their PYTHONPATH)."""

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader


class PauseAt(L.Callback):
    """Hold a run at a known step until the test has signalled it."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        self.marker.touch()
        deadline = time.monotonic() + 60
        while not stopping(trainer) and time.monotonic() < deadline:
            time.sleep(0.05)


def stopping(trainer: L.Trainer) -> bool:
    """Whether the run's CheckpointOnStop has noted a SIGTERM."""
    return any(getattr(callback, "stop_requested", False) for callback in trainer.callbacks)


class HoldOnRank(L.Callback):
    """Hold one process of a run at a training step, as a hung or busy process would, after writing
    its process id to `marker`."""

    def __init__(self, rank: int, step: int, marker: str, seconds: float = 120) -> None:
        self.rank, self.step, self.marker, self.seconds = rank, step, Path(marker), seconds

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            written = self.marker.with_suffix(".tmp")
            written.write_text(str(os.getpid()))
            written.rename(self.marker)
            time.sleep(self.seconds)


class FailOnRank(L.Callback):
    """Raise in one process of a multi-process run, as a bad batch or a full disk would."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"injected failure on rank {self.rank}")


class RecordProcess(L.Callback):
    """Write what one process of a run saw to `<folder>/rank<N>.json`: its place in the job, where it
    trained (device, strategy, precision, the step it started from), the training samples its
    sampler gave it, its first training batch and its learning rates, and the validation metrics."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.seen: dict = {}

    def on_train_start(self, trainer: L.Trainer, pl_module) -> None:
        self.seen |= {
            "world_size": trainer.world_size,
            "global_rank": trainer.global_rank,
            "node_rank": trainer.node_rank,
            "local_rank": trainer.local_rank,
            "environment": type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
            "train_indices": [index for index, *_ in trainer.train_dataloader.sampler],
            "device": str(pl_module.device),
            "strategy": type(trainer.strategy).__name__,
            "precision": trainer.precision,
            "loss_scaler": getattr(trainer.precision_plugin, "scaler", None) is not None,
            "start_step": trainer.global_step,
        }

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if batch_idx == 0 and "first_batch" not in self.seen:
            self.seen["first_batch"] = batch[0].flatten(1).sum(1).tolist()
            groups = trainer.optimizers[0].param_groups
            self.seen["first_lrs"] = {group.get("name", str(index)): group["lr"] for index, group in enumerate(groups)}

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._record(trainer, "val")

    def on_test_end(self, trainer: L.Trainer, pl_module) -> None:
        self._record(trainer, "test")

    def _record(self, trainer: L.Trainer, stage: str) -> None:
        logged = trainer.callback_metrics.items()
        self.seen[stage] = {name: float(value) for name, value in logged if name.startswith(f"{stage}/")}
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(self.seen))


class RecordOutputs(L.Callback):
    """Write what the model computed in this process during the last training and validation epoch
    to `<folder>/outputs<rank>.pt`: the logits of each batch, as the backbone gave them, and the labels."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.outputs: dict[str, dict[str, list[torch.Tensor]]] = {}
        self._logits: torch.Tensor | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module) -> None:
        # On the backbone: DDP runs the steps themselves through the LightningModule's forward.
        pl_module.backbone.register_forward_hook(self._keep)

    def _keep(self, module, inputs, logits: torch.Tensor) -> None:
        self._logits = logits.detach().double().cpu()

    def _add(self, stage: str, batch) -> None:
        self.outputs[stage]["logits"].append(self._logits)
        self.outputs[stage]["labels"].append(batch[1].cpu())

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module) -> None:
        self.outputs["train"] = {"logits": [], "labels": []}

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module) -> None:
        self.outputs["val"] = {"logits": [], "labels": []}

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._add("train", batch)

    def on_validation_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int, *args) -> None:
        self._add("val", batch)

    def on_fit_end(self, trainer: L.Trainer, pl_module) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.outputs, self.folder / f"outputs{trainer.global_rank}.pt")


class SigtermAt(L.Callback):
    """Send this process (or only the one of this global rank) a SIGTERM at a training step, as SLURM
    does before the time limit (None: as the sanity check ends, before the first step); or another
    signal by name (SIGUSR1, which Lightning's SLURM docs have a job ask for)."""

    def __init__(self, step: int | None, rank: int | None = None, signal_name: str = "SIGTERM") -> None:
        self.step, self.rank, self.signum = step, rank, getattr(signal, signal_name)

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module) -> None:
        if self.step is None:
            os.kill(os.getpid(), self.signum)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.rank in (None, trainer.global_rank) and trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


class SigtermAfterBatches(L.Callback):
    """Send this process a SIGTERM after its `batches`-th training batch, whether an optimizer step ends it or not."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.total.ready == self.batches:
            os.kill(os.getpid(), signal.SIGTERM)


class SlowToEnd(L.Callback):
    """Hold the first process a while after a run has stopped, as a slow W&B upload or data-worker
    shutdown does: longer than Lightning's launcher waits between looks at the processes it started."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_exception(self, trainer: L.Trainer, pl_module, exception: BaseException) -> None:
        if trainer.global_rank == 0:
            time.sleep(self.seconds)


class SigtermInValidation(L.Callback):
    """Send this process (or only the one of this global rank) a SIGTERM as the first validation
    batch of a fit's epoch starts."""

    def __init__(self, epoch: int, rank: int | None = None) -> None:
        self.epoch, self.rank = epoch, rank

    def on_validation_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int, *args) -> None:
        if self.rank not in (None, trainer.global_rank):
            return
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch and batch_idx == 0:
            os.kill(os.getpid(), signal.SIGTERM)


class SigtermOnCreation(L.Callback):
    """Send this process a SIGTERM as the command builds its callbacks, before training starts."""

    def __init__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


class SigtermAsTheTrainingDataLoads(L.Callback):
    """Send this process a SIGTERM as the fit starts iterating its first loader (the training one, whose
    data workers then start), before Lightning's handlers are in place: a preemption while data loads."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        start = DataLoader.__iter__

        def started(loader: DataLoader):
            DataLoader.__iter__ = start
            os.kill(os.getpid(), signal.SIGTERM)
            return start(loader)

        DataLoader.__iter__ = started


class CrashAt(L.Callback):
    """End the run at a training step without saving anything, as a SIGKILL or a power cut does."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise SystemError(f"crashed at step {self.step}")


class UnreadableAt(L.Callback):
    """Fail this process (or only the one of this global rank) at a training step as an image that
    cannot be read fails it under `data.bad_images: error`."""

    def __init__(self, step: int, rank: int | None = None) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self.rank in (None, trainer.global_rank) and trainer.global_step == self.step:
            from {{ cookiecutter.package_name }}.datasets.images import UnreadableImageError

            raise UnreadableImageError(f"Cannot read the image broken.png in process {trainer.global_rank}")


class KillWhileSavingLast(L.Callback):
    """SIGKILL this process in the middle of a save of a sharded last.ckpt (torch's distributed
    checkpoint), once its shards are written and before their index is, as SLURM's KILL at the end
    of a preemption's grace period would."""

    def setup(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        finish = FileSystemWriter.finish

        def killed_in_last(writer, *args, **kwargs):
            if "last.ckpt" in str(writer.path):
                os.kill(os.getpid(), signal.SIGKILL)
            return finish(writer, *args, **kwargs)

        FileSystemWriter.finish = killed_in_last


class StopAfterEpoch(L.Callback):
    """End a run after an epoch's validation, as an interruption between epochs would; last.ckpt
    is written as usual."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_validation_end(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch and not trainer.sanity_checking:
            trainer.should_stop = True


class RecordTrainedImages(L.Callback):
    """Append to `<folder>/trained<rank>.jsonl` the epoch and a fingerprint of each image a process
    trains on: the SHA-1 of its pixels, un-normalised back to the bytes decoded from its file (for
    runs whose training transform changes no pixel: augment none, no flips, the file's own size)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        preprocessing = trainer.datamodule.preprocessing
        mean, std = (torch.tensor(values).view(1, 3, 1, 1) for values in (preprocessing.mean, preprocessing.std))
        pixels = ((batch[0].float().cpu() * std + mean) * 255).round().to(torch.uint8)
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / f"trained{trainer.global_rank}.jsonl", "a") as record:
            for image in pixels:
                fingerprint = hashlib.sha1(image.numpy().tobytes()).hexdigest()
                record.write(json.dumps({"epoch": trainer.current_epoch, "image": fingerprint}) + "\n")
