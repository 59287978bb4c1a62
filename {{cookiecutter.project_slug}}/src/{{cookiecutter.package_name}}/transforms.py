"""What an image goes through before the model: the preprocessing a trained model expects (saved in
its checkpoints, read back by evaluation{{ ", `classify` and `export`" if cookiecutter.inference == "yes" }}) and the training augmentation."""

from dataclasses import asdict, dataclass, fields
from typing import Literal, get_args

import torch
import torchvision
from torchvision.transforms import InterpolationMode, v2
from torchvision.transforms.v2.functional import normalize, to_dtype

{% if cookiecutter.timm == "yes" -%}
from . import timm_backbones
{% endif -%}
from .backbone import check_backbone_name
from .errors import ConfigError

Interpolation = Literal["bilinear", "bicubic", "nearest"]
Augment = Literal["none", "basic", "trivialaugment", "randaugment", "autoaugment"]

# The statistics ImageNet-trained weights expect, and a fair default for photos trained from scratch.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Preprocessing:
    """Resize the shorter side to `image_size / crop_ratio`, centre-crop `image_size`, scale to [0, 1]
    and standardise with `mean` and `std`: the evaluation input; training crops at random instead."""

    image_size: int
    crop_ratio: float = 1.0
    interpolation: Interpolation = "bilinear"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        # Tuples, however given (lists from YAML or a checkpoint): equal to the saved ones, hashable.
        for name in ("mean", "std"):
            value = tuple(float(channel) for channel in getattr(self, name))
            if len(value) != 3:
                raise ConfigError(f"data.{name} needs one value per RGB channel (3), got {list(value)}")
            object.__setattr__(self, name, value)
        if self.interpolation not in get_args(Interpolation):
            choices = ", ".join(get_args(Interpolation))
            raise ConfigError(f"data.interpolation must be one of {choices}, got {self.interpolation!r}")
        if self.image_size < 1:
            raise ConfigError(f"data.image_size must be 1 or more, got {self.image_size}")
        if not 0 < self.crop_ratio <= 1:
            raise ConfigError(f"data.crop_ratio must be above 0 and at most 1, got {self.crop_ratio}")
        if min(self.std) <= 0:
            raise ConfigError(f"data.std must be above 0 in every channel, got {list(self.std)}")

    @property
    def resize_size(self) -> int:
        return round(self.image_size / self.crop_ratio)

    @property
    def interpolation_mode(self) -> InterpolationMode:
        return InterpolationMode(self.interpolation)

    def eval_transform(self) -> v2.Compose:
        """uint8 (or 16-bit) images to uint8 image_size squares; see normalize."""
        return v2.Compose(
            [
                v2.Resize(self.resize_size, interpolation=self.interpolation_mode, antialias=True),
                v2.CenterCrop(self.image_size),
                v2.ToDtype(torch.uint8, scale=True),
            ]
        )

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images as the floats the model takes: scaled to [0, 1] and standardised. Batches
        travel as uint8 (a quarter of float32's bytes) and become floats on the device."""
        return normalize(to_dtype(images, torch.float32, scale=True), list(self.mean), list(self.std))

    def describe(self) -> str:
        return (
            f"resize the shorter side to {self.resize_size} px ({self.interpolation}, antialiased), centre-crop "
            f"{self.image_size} x {self.image_size}, scale to [0, 1], subtract mean {list(self.mean)}, "
            f"divide by std {list(self.std)}"
        )

    def as_dict(self) -> dict:
        # Lists, not tuples: checkpoints must load with weights_only=True.
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, saved: dict) -> "Preprocessing":
        """From `as_dict`; keys a checkpoint lacks (older ones saved only the image size) keep the
        defaults those checkpoints were trained with."""
        known = {field.name for field in fields(cls)}
        return cls(**{key: value for key, value in saved.items() if key in known})


def weights_preprocessing(backbone: str) -> dict:
    """The crop ratio, interpolation, mean and std that a backbone's default pretrained weights were
    trained and evaluated with (as torchvision's `weights.transforms()`{{ " or timm's config" if cookiecutter.timm == "yes" }} states them)."""
    check_backbone_name(backbone)
{%- if cookiecutter.timm == "yes" %}
    if timm_backbones.is_timm(backbone):
        return timm_backbones.weights_preprocessing(backbone)
{%- endif %}
    transform = torchvision.models.get_model_weights(backbone).DEFAULT.transforms()
    return {
        "crop_ratio": transform.crop_size[0] / transform.resize_size[0],
        "interpolation": transform.interpolation.value,
        "mean": tuple(transform.mean),
        "std": tuple(transform.std),
    }


def resolve_preprocessing(image_size: int, pretrained_backbone: str | None, **given) -> Preprocessing:
    """The options given (those not None) win; then the pretrained weights' own; then the defaults."""
    options = weights_preprocessing(pretrained_backbone) if pretrained_backbone else {}
    options |= {key: value for key, value in given.items() if value is not None}
    return Preprocessing(image_size, **options)


class ScheduledAugmentation(v2.Compose):
    """A training augmentation whose policy and erasing start at epoch `start`: the epochs before it
    train on `basic` (the crop and flips alone)."""

    def __init__(self, transforms: list[v2.Transform], basic: v2.Compose, start: int) -> None:
        super().__init__(transforms)
        self.basic, self.start = basic, start

    def at(self, epoch: int) -> v2.Transform:
        return self.basic if epoch < self.start else self


def at_epoch(transform: v2.Transform, epoch: int | None) -> v2.Transform:
    """The transform an image of `epoch` goes through (None: not a training epoch's image)."""
    return transform.at(epoch) if epoch is not None and isinstance(transform, ScheduledAugmentation) else transform


def train_transform(
    preprocessing: Preprocessing,
    augment: Augment,
    hflip: bool,
    vflip: bool,
    min_crop_scale: float,
    random_erasing: float,
    basic_augment_epochs: int = 0,
) -> v2.Compose:
    """The training augmentation, on uint8 images, in the order of torchvision's reference recipe:
    random crop, flips, an automatic policy, then RandomErasing; the policy and erasing from epoch
    `basic_augment_epochs` on."""
    if augment == "none":
        if random_erasing > 0:
            raise ConfigError("data.random_erasing needs an augmentation: set data.augment to basic or a policy.")
        return preprocessing.eval_transform()
    interpolation = preprocessing.interpolation_mode
    # The policies rotate and shear tensors, which torchvision does bilinearly at best.
    policy_interpolation = InterpolationMode.BILINEAR if interpolation == InterpolationMode.BICUBIC else interpolation
    steps = [v2.RandomResizedCrop(preprocessing.image_size, scale=(min_crop_scale, 1.0), interpolation=interpolation)]
    if hflip:
        steps.append(v2.RandomHorizontalFlip())
    if vflip:
        steps.append(v2.RandomVerticalFlip())
    steps.append(v2.ToDtype(torch.uint8, scale=True))  # the policies' colour operations take 8-bit images
    basic = list(steps)
    if augment == "trivialaugment":
        steps.append(v2.TrivialAugmentWide(interpolation=policy_interpolation))
    elif augment == "randaugment":
        steps.append(v2.RandAugment(interpolation=policy_interpolation))
    elif augment == "autoaugment":
        steps.append(v2.AutoAugment(v2.AutoAugmentPolicy.IMAGENET, interpolation=policy_interpolation))
    if random_erasing > 0:
        # Erased to the mean colour, which is what erasing to 0 after normalisation (torchvision's
        # reference) means: the patch carries no signal, only the absence of one.
        mean_colour = [round(channel * 255) for channel in preprocessing.mean]
        steps.append(v2.RandomErasing(p=random_erasing, value=mean_colour))
    if basic_augment_epochs and len(steps) > len(basic):
        return ScheduledAugmentation(steps, v2.Compose(basic), basic_augment_epochs)
    return v2.Compose(steps)
