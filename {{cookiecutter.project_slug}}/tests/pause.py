"""A callback for the signal tests: hold a run at a known step until the test has signalled it."""

import time
from pathlib import Path

import lightning as L


class PauseAt(L.Callback):
    def __init__(self, step: int, marker: str) -> None:
        self.step, self.marker = step, Path(marker)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        self.marker.touch()
        deadline = time.monotonic() + 60
        while not trainer.received_sigterm and time.monotonic() < deadline:
            time.sleep(0.05)
