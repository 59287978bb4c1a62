"""Mixup and CutMix: training images blended in pairs, and their labels blended alike (soft targets)."""

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from ..datasets.sampling import draw_seed, seeded_draws
from ..errors import ConfigError


class BatchMixing:
    """Mix a batch with torchvision's MixUp or CutMix: with probability `prob`, one of them (CutMix
    with probability `switch_prob` when both are on), else leave it whole with one-hot targets.

    The draws of each batch come from a generator seeded by the run's seed, the process and the
    batch's index in the run, so a resumed run mixes exactly as an uninterrupted one would.
    """

    def __init__(self, num_classes: int, mixup_alpha: float, cutmix_alpha: float, prob: float, switch_prob: float):
        for name, value in [("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)]:
            if value < 0:
                raise ConfigError(f"model.{name} must be 0 (off) or more, got {value}")
        for name, value in [("mix_prob", prob), ("mix_switch_prob", switch_prob)]:
            if not 0 <= value <= 1:
                raise ConfigError(f"model.{name} must be a probability (0 to 1), got {value}")
        mixes, weights = [], []
        if mixup_alpha > 0:
            mixes.append(v2.MixUp(alpha=mixup_alpha, num_classes=num_classes))
            weights.append(1 - switch_prob if cutmix_alpha > 0 else 1.0)
        if cutmix_alpha > 0:
            mixes.append(v2.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
            weights.append(switch_prob if mixup_alpha > 0 else 1.0)
        self.mix = v2.RandomChoice(mixes, p=weights) if mixes else None
        self.num_classes = num_classes
        self.prob = prob

    @property
    def enabled(self) -> bool:
        return self.mix is not None and self.prob > 0

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, seed: int, rank: int, batch_index: int):
        """(images, targets): the mixed images and their class probabilities."""
        with seeded_draws(draw_seed(seed, rank, batch_index)):
            if self.mix is None or torch.rand(()) >= self.prob:
                return images, F.one_hot(labels, self.num_classes).to(images.dtype)
            return self.mix(images, labels)
