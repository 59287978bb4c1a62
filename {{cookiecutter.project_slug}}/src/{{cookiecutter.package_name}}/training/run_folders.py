"""The runs under a folder: the one home of "the newest run", which resuming, the smoke test,
{{ "report, classify and serve" if cookiecutter.serving == "yes" else "report and classify" }} all look up, of whether a run has finished, and of a run's
best checkpoint, which {{ "classify and serve use" if cookiecutter.serving == "yes" else "classify uses" }} by default.

A run is a folder <root>/<name>/<version> whose checkpoints/ holds last.ckpt (a file, or a folder of
shards); the newest is the one whose last.ckpt was written last. A run that ends (its epochs done,
early stopping) leaves checkpoints/finished.json; an interrupted one (SIGTERM, a crash) does not.
"""

import contextlib
import json
import os
from pathlib import Path

import torch

from ..errors import ConfigError, MissingError
from .checkpoint_io import complete_replace, write_whole

FINISHED = "finished.json"


def last_checkpoints(root: Path) -> list[Path]:
    """The last.ckpt of every run under `root` (a file, or a folder of shards), oldest first."""
    lasts = [checkpoints / "last.ckpt" for checkpoints in root.glob("**/checkpoints")]
    for last in lasts:
        with contextlib.suppress(OSError):  # a read-only folder stays as it is
            complete_replace(last)  # a save killed between its two renames
    return sorted((last for last in lasts if last.exists()), key=os.path.getmtime)


def finished(last: Path) -> bool:
    """Whether the run of a last.ckpt has ended (rather than been interrupted)."""
    return (last.parent / FINISHED).is_file()


def newest_run(root: Path) -> Path:
    """The folder of the newest run under `root`."""
    lasts = last_checkpoints(root)
    if not lasts:
        raise MissingError(f"No run under {root} has a checkpoints/last.ckpt: train a model first.")
    return lasts[-1].parent.parent


def check_writable(folder: Path, option: str) -> None:
    """Fail in one line, before training, where the runs cannot be written (a read-only mount, a
    file in the way), rather than at the first log line or checkpoint. Nothing is created."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    reason = (
        "is not a folder" if not existing.is_dir() else "" if os.access(existing, os.W_OK | os.X_OK) else "is read-only"
    )
    if reason:
        raise ConfigError(
            f"Cannot write the runs into {folder} ({existing} {reason}): point {option} at a folder you can write."
        )


def mark_finished(checkpoints: Path, epoch: int, step: int) -> None:
    write_whole(checkpoints / FINISHED, json.dumps({"epoch": epoch, "step": step}) + "\n")


def mark_unfinished(checkpoints: Path) -> None:
    """A finished run trained further (--ckpt_path last) is unfinished until it ends again."""
    (checkpoints / FINISHED).unlink(missing_ok=True)


def best_checkpoint(runs: Path, option: str) -> Path:
    """The best checkpoint of the newest run, as its ModelCheckpoint recorded it in last.ckpt
    (whatever the metric it monitors or its file names), else that last.ckpt. `option` names another."""
    lasts = last_checkpoints(runs)
    if not lasts:
        raise MissingError(f"No checkpoint under {runs}: train a model first, or pass {option}.")
    last = lasts[-1]  # newest_run's
    if last.is_dir():  # shards (FSDP, DeepSpeed), whose callbacks' states only the strategy reads
        return last
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
