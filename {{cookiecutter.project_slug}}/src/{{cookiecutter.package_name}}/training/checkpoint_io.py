"""Checkpoint files that are either the old one or the new one, never half of one."""

import contextlib
import os
import re
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

# A save's staging file: `.<checkpoint name>.<pid>.tmp`.
STAGING = re.compile(r"\..+\.\d+\.tmp")
STALE_SECONDS = 3600


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each checkpoint to a temporary file beside it, flush it to disk, then rename it into place.

    Lightning's own save stages the file in the system temp folder; when that folder is on another
    file system than the checkpoints (a local /tmp, checkpoints on network storage), the final
    move is a copy, and a crash during it leaves a half-written last.ckpt.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        if "://" in str(path):  # object storage: Lightning's own save
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Left by a process killed while it saved (its `finally` never ran), each as large as a checkpoint;
        # one written to within the hour may be another live run's (two runs sharing a folder).
        for stale in path.parent.glob(".*.tmp"):
            # Another run's save may rename or remove its file between the listing and here.
            with contextlib.suppress(FileNotFoundError):
                if STAGING.fullmatch(stale.name) and time.time() - stale.stat().st_mtime > STALE_SECONDS:
                    stale.unlink()
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # a name STAGING matches
        try:
            with staging.open("wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(staging, path)
        finally:
            staging.unlink(missing_ok=True)
