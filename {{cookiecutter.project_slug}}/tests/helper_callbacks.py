"""Callbacks the tests load into real training processes (tests/ is on their PYTHONPATH)."""

import time
from pathlib import Path

import lightning as L


class PauseAt(L.Callback):
    """Hold a run at a known step until the test has signalled it."""

    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        self.marker.touch()
        deadline = time.monotonic() + 60
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.05)


class FailOnRank(L.Callback):
    """Raise in one process of a multi-process run, as a bad batch or a full disk would."""

    def __init__(self, rank: int, step: int) -> None:
        self.rank, self.step = rank, step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            raise RuntimeError(f"injected failure on rank {self.rank}")
