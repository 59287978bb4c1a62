"""Pictures of how the model does per class: a confusion-matrix PNG and per-class accuracy.

Written into the run folder after each validation (and test), and sent to the logger as an image.
"""

import csv
from pathlib import Path

import lightning as L
import matplotlib.pyplot as plt
import torch
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger
from lightning.pytorch.loggers.logger import DummyLogger
from torchmetrics.classification import MulticlassConfusionMatrix

from .run_folders import logger_run_folder


def report_folder(trainer: L.Trainer) -> Path | None:
    """The run's folder (beside checkpoints/), where the run's other files are; None for a run that
    keeps nothing, neither checkpoints nor logs (a tuning run, a check), which writes no report."""
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.dirpath:
        return Path(checkpoint.dirpath).parent / "reports"
    # Lightning's finders log to a DummyLogger, which keeps nothing.
    if not trainer.loggers or isinstance(logger := trainer.loggers[0], DummyLogger):
        return None
    # Not trainer.log_dir, which for W&B is the folder all runs share.
    return logger_run_folder(logger, trainer.default_root_dir) / "reports"


def per_class_accuracy(matrix: torch.Tensor) -> list[float]:
    """Recall of each class: its images classified as it, over its images (NaN for an absent class)."""
    return (matrix.diag() / matrix.sum(1)).tolist()


def write_report(
    trainer: L.Trainer, metric: MulticlassConfusionMatrix, class_names: list[str], stage: str, epoch: int, step: int
) -> None:
    """Compute `metric` (every process takes part) and, on rank 0, write and log its pictures of the
    weights of `epoch`, at `step` (that of the metrics they go with)."""
    matrix = metric.compute().cpu()
    metric.reset()
    if not trainer.is_global_zero or trainer.sanity_checking or trainer.fast_dev_run:
        return
    folder = report_folder(trainer)
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"per_class_accuracy_{stage}.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["class", "images", "accuracy"])
        for name, count, accuracy in zip(class_names, matrix.sum(1).tolist(), per_class_accuracy(matrix), strict=True):
            writer.writerow([name, int(count), f"{accuracy:.4f}"])

    figure, axes = metric.plot(val=matrix, labels=class_names)
    axes.set_title(f"{stage} confusion matrix, epoch {epoch} (rows: true class)")
    figure.set_size_inches(max(5, 0.6 * len(class_names) + 2), max(4, 0.6 * len(class_names) + 1.5))
    # No tight_layout(): torchmetrics' figure has a constrained layout, and switching warns every time.
    image = folder / f"confusion_matrix_{stage}.png"
    figure.savefig(image, dpi=100)
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            logger.log_image(f"{stage}/confusion_matrix", images=[str(image)], step=step)
        elif isinstance(logger, TensorBoardLogger):
            logger.experiment.add_figure(f"{stage}/confusion_matrix", figure, global_step=step)
    plt.close(figure)
