"""The order of training images: each epoch's shuffle across processes, resumable mid-epoch
(EpochSampler), and the warning when a resume's settings cannot continue the interrupted epoch;
class imbalance: a sampler that draws every class alike, and the warning that points to it."""

import os

import torch
from torch.utils.data import DistributedSampler

# A class with this many times fewer training images than the commonest one is warned about.
SEVERE_IMBALANCE = 10


def run_seed() -> int:
    """The seed seed_everything set (Lightning's DistributedSampler takes the same), the same on every
    process; 0 when the run is not seeded, so the data order and the mixing repeat from run to run."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


class EpochSampler(DistributedSampler):
    """Lightning's DistributedSampler (each epoch's order from the seed and the epoch), whose epoch
    can also start part-way: `resume_at` skips what a resumed run's process already trained on.
    The length stays the whole epoch's, which Lightning counts the interrupted epoch's batches in."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resume_epoch, self.resume_skip = -1, 0

    def resume_at(self, epoch: int, seen: int) -> None:
        self.resume_epoch, self.resume_skip = epoch, seen

    def epoch_indices(self) -> list[int]:
        return list(super().__iter__())

    def __iter__(self):
        indices = self.epoch_indices()
        return iter(indices[self.resume_skip :] if self.epoch == self.resume_epoch else indices)


class ClassBalancedSampler(EpochSampler):
    """An epoch of training images (as many as the data has) drawn with replacement, each class as
    often as any other. Every process draws the same seeded sequence and takes every
    `num_replicas`-th draw from its `rank` on, so together they take each draw once. A
    DistributedSampler, so Lightning gives it the epoch (a new sequence each) and leaves it unwrapped."""

    def __init__(self, labels: list[int], num_replicas: int = 1, rank: int = 0, seed: int = 0) -> None:
        super().__init__(labels, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        labels = torch.tensor(labels)
        self.weights = 1.0 / torch.bincount(labels)[labels].double()

    def epoch_indices(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        draws = torch.multinomial(self.weights, self.total_size, replacement=True, generator=generator)
        return draws[self.rank : self.total_size : self.num_replicas].tolist()


def imbalance_warning(counts: list[int], names: list[str]) -> str | None:
    """A line naming the rarest classes when the commonest has SEVERE_IMBALANCE times their images."""
    commonest = max(counts)
    rare = sorted(
        (count, name) for count, name in zip(counts, names, strict=True) if count * SEVERE_IMBALANCE <= commonest
    )
    if not rare:
        return None
    listed = ", ".join(f"{name} ({count})" for count, name in rare[:5]) + (", ..." if len(rare) > 5 else "")
    return (
        f"Severe class imbalance: {listed} against {commonest} training images for "
        f"{names[counts.index(commonest)]}. Accuracy will mostly reflect the common classes (watch val/f1); "
        "consider model.class_weights: balanced or data.balanced_sampling: true."
    )


def changed_settings(saved: dict, now: dict) -> str:
    """The settings that differ, as "name saved -> now", comma-separated ("" when none do)."""
    return ", ".join(f"{key} {saved[key]} -> {now[key]}" for key in now if saved.get(key) != now[key])


def epoch_restarts(changed: str) -> str:
    return (
        f"The interrupted epoch cannot go on where it stopped with other settings ({changed}): it starts "
        "again from its first image. Resume with the run's settings to continue exactly."
    )
