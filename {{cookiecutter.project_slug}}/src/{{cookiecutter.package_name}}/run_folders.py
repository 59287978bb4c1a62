"""The runs under a folder: the one home of "the newest run's last checkpoint", which resuming,
classify and the smoke test look up."""

import os
from pathlib import Path


def last_checkpoints(root: Path) -> list[Path]:
    """The last.ckpt of every run under `root` (a file, or a folder of shards), oldest first."""
    return sorted(root.glob("**/checkpoints/last.ckpt"), key=os.path.getmtime)
