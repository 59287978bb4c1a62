"""The logged numbers: each one over every image of the epoch, whatever the batch size and process count."""

import torch
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score


class MeanPerImage(Metric):
    """The mean of per-image values (losses) over every image seen, summed across processes.

    torchmetrics' MeanMetric either reads each batch back from the device to look for NaN, or, with
    nan_strategy="disable", ignores its weights: a mean over batches, which moves with the batch size.
    """

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, values: torch.Tensor) -> None:
        # float32 whatever the model's precision: Lightning's bf16-true and 16-true cast the module,
        # states included, and a bf16 sum of thousands of losses stops growing.
        self.total = self.total.float() + values.detach().sum(dtype=torch.float32)
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        return self.total / self.count


def classification_metrics(num_classes: int, prefix: str) -> MetricCollection:
    """Accuracy, macro F1 and (with more than five classes) top-5 accuracy, named `prefix` + name."""
    # The labels come from class folders, always in range; checking them would read tensors back
    # from the device at every step, stalling the GPU.
    checks = {"validate_args": False}
    metrics = {
        "acc": MulticlassAccuracy(num_classes, average="micro", **checks),
        "f1": MulticlassF1Score(num_classes, average="macro", **checks),
    }
    if num_classes > 5:
        metrics["top5"] = MulticlassAccuracy(num_classes, top_k=5, average="micro", **checks)
    # No compute groups: torchmetrics merges metrics whose states match after the first batch, and a
    # batch of one class, all predicted right, makes top-5 match F1's top-1 counts for the whole run.
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)


def states_so_far(metrics: dict[str, Metric]) -> dict[str, dict[str, torch.Tensor]]:
    """The states of an epoch's metrics so far, summed across processes (every process calls it),
    for a checkpoint that interrupts the epoch."""
    states = {}
    for name, metric in metrics.items():
        with metric.sync_context():
            states[name] = {state: value.detach().cpu().clone() for state, value in metric.metric_state.items()}
    return states


def add_states(metrics: dict[str, Metric], states: dict[str, dict[str, torch.Tensor]]) -> None:
    """Add a checkpoint's states so far to `metrics`, whose states are all sums."""
    for name, metric in metrics.items():
        for state, value in states.get(name, {}).items():
            current = getattr(metric, state)
            setattr(metric, state, current + value.to(current.device))
        metric._update_count += 1  # restored counts as updated: compute() would warn of no update
