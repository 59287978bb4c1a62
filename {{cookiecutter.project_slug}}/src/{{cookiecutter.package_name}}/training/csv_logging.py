"""CSV metrics that survive a resume.

Lightning's CSVLogger deletes metrics.csv when it finds its run folder in use, which is exactly
what `--ckpt_path auto` does: the resumed run would wipe the metrics of the run so far.
"""

import csv
import io
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from .checkpoint_io import write_whole


def forget_rows_from(metrics_file: Path, step: int) -> None:
    """Drop the rows of `step` and later from a run's metrics.csv: those the run logged after the
    checkpoint it resumes from was written (before a SIGKILL, or a save cut short), which it logs again."""
    if not metrics_file.is_file():
        return
    with metrics_file.open(newline="") as file:
        header, *rows = list(csv.reader(file)) or [[]]
    if "step" not in header:
        return
    column = header.index("step")
    kept = [row for row in rows if not row[column:] or not row[column] or int(float(row[column])) < step]
    if len(kept) < len(rows):
        text = io.StringIO()
        csv.writer(text).writerows([header, *kept])  # as Lightning writes them
        write_whole(metrics_file, text.getvalue())


class AppendingExperimentWriter(ExperimentWriter):
    """Append to an existing metrics.csv, keeping its columns, instead of deleting it; epochs as whole numbers.

    Lightning offers no public hook for this: the overridden method and the attributes used here are
    its private ones, which pyproject.toml's bound on lightning keeps to the releases tested."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys = next(csv.reader(file), [])

    def log_metrics(self, metrics_dict: dict[str, float], step: int | None = None) -> None:
        # An evaluation logs its checkpoint's epoch through LightningModule.log, which makes it a float:
        # written as the fit writes it (1, not 1.0).
        epoch = metrics_dict.get("epoch")
        if epoch is not None and float(epoch).is_integer():
            metrics_dict = metrics_dict | {"epoch": int(epoch)}
        super().log_metrics(metrics_dict, step)


class ResumableCSVLogger(CSVLogger):
    """Lightning's CSVLogger, whose metrics.csv a resumed run appends to."""

    @property
    @rank_zero_experiment
    def experiment(self) -> AppendingExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = AppendingExperimentWriter(log_dir=self.log_dir)
        return self._experiment
