"""Top classes as CSV rows, the one format of `classify` and of `predict` (PredictionsCSV)."""

import csv
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter

from .reports import report_folder


def csv_header(top_k: int) -> list[str]:
    return ["path", *(column for k in range(1, top_k + 1) for column in (f"class_{k}", f"probability_{k}"))]


def csv_row(path: str | Path, top: list[tuple[str, float]]) -> list[str]:
    return [str(path), *(item for name, value in top for item in (name, f"{value:.6f}"))]


def top_classes(probabilities: torch.Tensor, names: list[str], top_k: int) -> list[list[tuple[str, float]]]:
    """For each row of class probabilities, its `top_k` (class name, probability), best first."""
    top = probabilities.topk(min(top_k, probabilities.shape[1]), dim=-1)
    return [
        [(names[index], value) for index, value in zip(indices, values, strict=True)]
        for values, indices in zip(top.values.tolist(), top.indices.tolist(), strict=True)
    ]


class PredictionsCSV(BasePredictionWriter):
    """`predict` writes each image's top classes and their probabilities to
    <run>/reports/predictions_<split>.csv (test, or val when there is no test split), in the data's order."""

    def __init__(self, top_k: int = 3) -> None:
        super().__init__(write_interval="epoch")
        self.top_k = top_k

    def write_on_epoch_end(self, trainer: L.Trainer, pl_module, predictions: list, batch_indices: list) -> None:
        # One dataloader: Lightning passes its predictions as a list of batches, but its indices still
        # inside a list of dataloaders.
        if batch_indices and batch_indices[0] and isinstance(batch_indices[0][0], list):
            batch_indices = batch_indices[0]
        indices = [index for batch in batch_indices for index in batch]
        probabilities = torch.cat(predictions).float().cpu() if predictions else torch.empty(0)
        rows = list(zip(indices, top_classes(probabilities, pl_module.label_names(), self.top_k), strict=True))
        if dist.is_available() and dist.is_initialized():  # each process predicted its share of the images
            shares = [None] * dist.get_world_size()
            dist.all_gather_object(shares, rows)
            rows = [row for share in shares for row in share]
        if not trainer.is_global_zero:
            return
        dataset = trainer.predict_dataloaders.dataset
        split = "test" if dataset is getattr(trainer.datamodule, "test_set", None) else "val"
        folder = report_folder(trainer) or Path.cwd()
        folder.mkdir(parents=True, exist_ok=True)
        output = folder / f"predictions_{split}.csv"
        with output.open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(csv_header(self.top_k))
            # Sorted by image, once each: a process may repeat images to even out the shares.
            for index, top in sorted(dict(rows).items()):
                writer.writerow(csv_row(dataset.samples[index][0], top))
        print(f"Wrote the top {self.top_k} classes of {len(dict(rows))} images to {output}")
