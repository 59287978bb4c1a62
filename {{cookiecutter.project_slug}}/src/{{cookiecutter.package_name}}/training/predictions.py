"""Top classes as CSV rows, {{ "the one format of `classify` and of `predict`" if cookiecutter.inference == "yes" else "what `predict` writes" }} (PredictionsCSV)."""

import csv
import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO

import lightning as L
import torch
import torch.distributed as dist

from ..errors import ConfigError
from .checkpoint_io import written_whole
from .reports import report_folder


def shown_classes(top_k: int, class_count: int) -> int:
    """How many classes a row shows: `top_k`, or every class where there are fewer."""
    return min(top_k, class_count)


def csv_header(top_k: int, class_count: int) -> list[str]:
    """The columns of rows of the `top_k` classes."""
    shown = shown_classes(top_k, class_count)
    return ["path", *(column for k in range(1, shown + 1) for column in (f"class_{k}", f"probability_{k}"))]


def csv_row(path: str | Path, top: list[tuple[str, float]]) -> list[str]:
    return [str(path), *(item for name, value in top for item in (name, f"{value:.6f}"))]


def top_classes(probabilities: torch.Tensor, names: list[str], top_k: int) -> list[list[tuple[str, float]]]:
    """For each row of class probabilities, its `top_k` (class name, probability), best first."""
    top = probabilities.topk(shown_classes(top_k, probabilities.shape[1]), dim=-1)
    return [
        [(names[index], value) for index, value in zip(indices, values, strict=True)]
        for values, indices in zip(top.values.tolist(), top.indices.tolist(), strict=True)
    ]


def written_csv(path: Path) -> AbstractContextManager[IO]:
    """The CSV file to write at `path`: written whole, so that a full disk midway leaves an earlier one
    as it was; a link (one a user made, /dev/stdout) or a device is written through, never replaced."""
    if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
        return path.open("w", newline="")
    return written_whole(path, newline="")


class PredictionsCSV(L.Callback):
    """`predict` writes each image's top classes and their probabilities to
    <run>/reports/predictions_<split>.csv (test, or val when there is no test split), sorted by path.
    The data module labels each predicted image with its path, so an unreadable image, which the
    loader skips, is left out rather than shifting the rows after it."""

    def __init__(self, top_k: int = 3) -> None:
        if top_k < 1:
            raise ConfigError(f"PredictionsCSV top_k must be 1 or more, got {top_k}")
        self.top_k = top_k
        self.rows: dict[str, list[tuple[str, float]]] = {}

    def on_predict_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.rows = {}

    def on_predict_batch_end(
        self, trainer, pl_module, prediction: torch.Tensor, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        _, paths = batch
        if not all(isinstance(path, str) for path in paths):
            raise TypeError("PredictionsCSV needs the images' paths in the batch, as ImageDataModule's predict gives.")
        tops = top_classes(prediction.float().cpu(), pl_module.label_names(), self.top_k)
        self.rows.update(zip(paths, tops, strict=True))

    def on_predict_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        rows = self.rows
        if dist.is_available() and dist.is_initialized():  # each process predicted its share of the images
            shares = [None] * dist.get_world_size()
            dist.all_gather_object(shares, rows)
            rows = {path: top for share in shares for path, top in share.items()}
        if not trainer.is_global_zero:
            return
        folder = report_folder(trainer) or Path.cwd()
        folder.mkdir(parents=True, exist_ok=True)
        output = folder / f"predictions_{trainer.datamodule.predicted_split}.csv"
        with written_csv(output) as file:
            writer = csv.writer(file)
            writer.writerow(csv_header(self.top_k, len(pl_module.label_names())))
            writer.writerows(csv_row(path, top) for path, top in sorted(rows.items()))
        print(f"Wrote the top classes of {len(rows)} images to {output}")
