"""Checkpoints that are either the old one or the new one, never half of one: files (through the
checkpoint plugin) and the folders of shards that FSDP and DeepSpeed write (through the Trainer);
and the small files runs and commands keep (`written_whole`)."""

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import DeepSpeedStrategy, Strategy

from ..errors import REFUSED_WRITES
from ..hardware.network import is_remote
from ..hardware.sharding import shards_weights

# What a save writes beside a checkpoint `<name>`: `.<name>.<pid>.tmp` (a file) and `.<name>.partial`
# (a folder of shards, or the file a sharding strategy gathered); and `.<name>.old`, the checkpoint it
# replaces, for a moment (`replace`), which only the next save of `<name>` may remove: it may be the
# last whole one. Removed as stale for .ckpt names only: a user's `.notes.partial` is not ours.
STAGING = re.compile(r"\..+\.ckpt\.(\d+\.tmp|partial)")
# Left by a process killed while it saved, each as large as a checkpoint; one written to within the
# hour may be another live run's (two runs sharing a folder).
STALE_SECONDS = 3600


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file beside it, flush it to disk, then rename it into place.

    Lightning's own save stages the file in the system temp folder; when that folder is on another
    file system than the checkpoints (a local /tmp, checkpoints on network storage), the final
    move is a copy, and a crash during it leaves a half-written last.ckpt.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if is_remote(path):  # object storage: Lightning's own save
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_staging(path.parent)
        with written_whole(path, "wb") as file:
            torch.save(checkpoint, file)


@contextlib.contextmanager
def written_whole(path: Path, mode: str = "w", newline: str | None = None) -> Iterator[IO]:
    """A file to write `path`'s new content into, renamed onto `path` once the block ends and the
    content is on disk: a kill or a full disk while writing leaves the old file as it was."""
    # Beside its place, not in /tmp: a rename cannot cross file systems.
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with staging.open(mode, newline=newline) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(staging, path)
    except (OSError, RuntimeError) as error:
        # torch.save's zip writer turns a write's OSError (a full disk) into "unexpected pos": the OSError is told.
        refused = error if isinstance(error, OSError) else error.__context__
        if not isinstance(refused, OSError) or (refused is not error and refused.errno not in REFUSED_WRITES):
            raise
        if refused.errno is not None and refused.filename in (None, str(staging)):
            refused.filename, refused.filename2 = str(path), None  # the file asked for, not its stand-in
        raise refused from None
    finally:
        staging.unlink(missing_ok=True)


def write_whole(path: Path, text: str) -> None:
    with written_whole(path) as file:
        file.write(text)


class Trainer(L.Trainer):
    """Lightning's Trainer; a sharding strategy's checkpoint folder appears only whole.

    FSDP and DeepSpeed write a checkpoint folder in place, from every process: a run killed while it
    saved (SLURM's KILL at the end of a preemption's grace period, the OOM killer) left new shards
    beside the old step count, which a resume then read without a word. Here every process writes
    into `.<name>.partial`, renamed into place once all have written their part.
    """

    def save_checkpoint(self, filepath, weights_only: bool | None = None, storage_options: Any = None) -> None:
        if not stages_its_saves(self.strategy) or is_remote(filepath):
            super().save_checkpoint(filepath, weights_only, storage_options)
            return
        path = Path(filepath)
        if path.is_dir() and not path.is_symlink() and not is_sharded_checkpoint(path):
            raise IsADirectoryError(f"{path} is a folder but no checkpoint: save the checkpoint under another name.")
        if self.is_global_zero:
            complete_replace(path)  # before its staging folder is cleared: it may be the newest checkpoint
            remove_stale_staging(path.parent)
            remove(staging_of(path))  # a save killed midway
        self.strategy.barrier("checkpoint staging cleared")
        super().save_checkpoint(staging_of(path), weights_only, storage_options)  # ends in a barrier
        if self.is_global_zero:
            replace(staging_of(path), path)
        self.strategy.barrier("checkpoint in place")


def stages_its_saves(strategy: Strategy) -> bool:
    """Whether `strategy`'s saves go through `.<name>.partial`: a sharding strategy's, except with
    DeepSpeed's decoupled checkpoint writers, which go on writing into the folder after a save returns."""
    engine = strategy.model if isinstance(strategy, DeepSpeedStrategy) else None
    decoupled = engine is not None and getattr(engine.checkpoint_engine, "is_decoupled", lambda: False)()
    return shards_weights(strategy) and not decoupled


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether the folder `path` is a checkpoint of FSDP, FSDP2 (torch's distributed checkpoint) or DeepSpeed."""
    return (path / ".metadata").is_file() or (path / "latest").is_file()


def staging_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.partial")


def aside_of(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def replace(staging: Path, path: Path) -> None:
    """Put `staging` at `path`. A rename cannot put a folder onto a file or a non-empty folder, or
    anything onto a folder, so the old checkpoint goes aside first: a kill between the two renames
    leaves it as `.<name>.old`, and `complete_replace` finishes the job."""
    if os.path.lexists(path) and (staging.is_dir() or path.is_dir() and not path.is_symlink()):
        remove(aside_of(path))
        os.replace(path, aside_of(path))
        complete_replace(path)
    else:
        os.replace(staging, path)


def complete_replace(path: Path) -> None:
    """Put `.<name>.partial` in place where `path` is missing and `.<name>.old` tells that its save
    was cut between `replace`'s two renames, which start once every process has written its part.
    Any process may call it at any time (a listing of the runs, every rank of a resumed job)."""
    if os.path.lexists(path) or not os.path.lexists(aside_of(path)):
        return
    with contextlib.suppress(FileNotFoundError):  # another process may have moved it first
        os.replace(staging_of(path), path)
    if os.path.lexists(path):
        remove(aside_of(path))


def remove_stale_staging(folder: Path) -> None:
    """Remove what saves killed midway left in `folder` (STAGING, untouched for STALE_SECONDS)."""
    for stale in folder.glob(".*"):
        # Another run's save may rename or remove it between the listing and here.
        with contextlib.suppress(FileNotFoundError):
            if STAGING.fullmatch(stale.name) and time.time() - stale.lstat().st_mtime > STALE_SECONDS:
                remove(stale)


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)  # another process may be removing it too
    else:
        path.unlink(missing_ok=True)
