"""The runs under a folder: the one home of "the newest run's last checkpoint", which resuming and
the smoke test look up, and of its best checkpoint, which classify and serve use by default."""

import os
from pathlib import Path

import torch

from .errors import MissingError


def last_checkpoints(root: Path) -> list[Path]:
    """The last.ckpt of every run under `root` (a file, or a folder of shards), oldest first."""
    return sorted(root.glob("**/checkpoints/last.ckpt"), key=os.path.getmtime)


def best_checkpoint(runs: Path, option: str) -> Path:
    """The best checkpoint of the newest run, as its ModelCheckpoint recorded it in last.ckpt
    (whatever the metric it monitors or its file names), else that last.ckpt. `option` names another."""
    lasts = last_checkpoints(runs)
    if not lasts:
        raise MissingError(f"No checkpoint under {runs}: train a model first, or pass {option}.")
    last = lasts[-1]
    states = torch.load(last, map_location="cpu", weights_only=True, mmap=True).get("callbacks", {})
    for key, state in states.items():
        # The callback that monitors a metric: the one that writes last.ckpt monitors none.
        best = state.get("best_model_path") if key.startswith("ModelCheckpoint") and state.get("monitor") else None
        if best:
            # Recorded as the path the run saw, maybe relative to another folder: look beside last.ckpt.
            found = next((path for path in (Path(best), last.parent / Path(best).name) if path.exists()), None)
            if found is not None:
                return found
    return last
