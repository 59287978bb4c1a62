"""The order of training images: each epoch's shuffle across processes, resumable mid-epoch
(EpochSampler), and the warning when a resume's settings cannot continue the interrupted epoch;
the random draws of each image and batch, seeded by where they are in the run (seeded_draws);
class imbalance: a sampler that draws every class alike, and the warning that points to it."""

import contextlib
import os
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import DistributedSampler

# A class with this many times fewer training images than the commonest one is warned about.
SEVERE_IMBALANCE = 10


def run_seed() -> int:
    """The seed seed_everything set (Lightning's DistributedSampler takes the same), the same on every
    process; 0 when the run is not seeded, so the data order and the mixing repeat from run to run."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def draw_seed(*keys: int) -> int:
    """A seed for the random draws that `keys` name (the run's seed, an epoch, a place in it),
    mixed so that neighbouring keys give unrelated streams."""
    return int(np.random.SeedSequence(keys).generate_state(1, dtype=np.uint64)[0] >> 1)


@contextlib.contextmanager
def seeded_draws(seed: int) -> Iterator[None]:
    """Draws from torch's CPU generator (torchvision's transforms, Mixup/CutMix) that depend on
    `seed` alone, and leave the process's own random state as it was: what a data worker or the
    main process drew before, and how many workers there are, no longer matters, so a resumed run
    draws what an uninterrupted one would."""
    with torch.random.fork_rng(devices=[]):
        # The CPU generator only: torch.manual_seed would reset the GPU's too, which dropout draws from.
        torch.default_generator.manual_seed(seed)
        yield


class EpochSampler(DistributedSampler):
    """Lightning's DistributedSampler (each epoch's order from the seed and the epoch), whose epoch
    can also start part-way: `resume_at` skips what a resumed run's process already trained on.
    The length stays the whole epoch's, which Lightning counts the interrupted epoch's batches in.

    It gives (index, seed, epoch): the seed of that image's augmentation, from the run's seed, the
    epoch and the image's place in the epoch's order across processes (ImageFiles draws with it), and
    the epoch, which data workers that outlive epochs know only from here.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.resume_epoch, self.resume_skip = -1, 0

    def resume_at(self, epoch: int, seen: int) -> None:
        self.resume_epoch, self.resume_skip = epoch, seen

    def epoch_indices(self) -> list[int]:
        return list(super().__iter__())

    def __iter__(self) -> Iterator[tuple[int, int, int]]:
        start = self.resume_skip if self.epoch == self.resume_epoch else 0
        for place, index in enumerate(self.epoch_indices()[start:], start):
            yield index, draw_seed(self.seed, self.epoch, self.rank + place * self.num_replicas), self.epoch


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


def unevaluated_warning(counts: list[int], names: list[str], split: str = "val") -> str | None:
    """A line naming the classes that the validation (or test) images hold none of: their metrics say
    nothing of them."""
    missing = [name for count, name in zip(counts, names, strict=True) if count == 0]
    if not missing:
        return None
    listed = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
    them = "it" if len(missing) == 1 else "them"
    if split == "test":
        return (
            f"The test images hold none of {listed}: test/acc says nothing of {them}, and test/f1 averages over "
            "the other classes. Add some to test/."
        )
    return (
        f"The validation images hold none of {listed}: val/acc and the checkpoints chosen by it say nothing of "
        f"{them}, and val/f1 averages over the other classes. Add some to val/ "
        "(without val/, to train/: the split holds out data.val_fraction of each class with two images or more)."
    )


def epoch_restarts(changed: str) -> str:
    return (
        f"The interrupted epoch cannot go on where it stopped with other settings ({changed}): it starts "
        "again from its first image. Resume with the run's settings to continue exactly."
    )
