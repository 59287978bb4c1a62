"""One image read from a file or its bytes: decoded upright in RGB, transformed and labelled, or
skipped with a warning naming it: the one way images are read (image folders{{ ", streaming chunks" if cookiecutter.streaming == "yes" }}{{ ", classify" if cookiecutter.inference == "yes" }}{{ ", serve" if cookiecutter.serving == "yes" }})."""

import contextlib
import functools
import io
import os
import re
import warnings
from collections.abc import Callable

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch.utils.data import Dataset, default_collate
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2
from torchvision.transforms.v2.functional import pil_to_tensor

from ..errors import DataError
from ..transforms import at_epoch
from .sampling import seeded_draws

# The file types that the image folders take: torchvision's, GIF (its first frame) and JPEG's other
# names (.jfif, as Windows browsers save web images). All of them `read_rgb` decodes.
IMAGE_SUFFIXES = (*IMG_EXTENSIONS, ".gif", ".jfif", ".jpe")
# How image files begin (JPEG, PNG, GIF, BMP, TIFF both ways, WebP's and HEIC's or AVIF's containers),
# for a file saved without an extension.
IMAGE_SIGNATURES = re.compile(rb"\xff\xd8\xff|\x89PNG|GIF8|BM|II\*\x00|MM\x00\*|RIFF....WEBP|....ftyp", re.DOTALL)
# What the decoders raise for a damaged or unsupported image file.
DECODE_ERRORS = (RuntimeError, OSError, ValueError)


class SaidOnce:
    """Which of `count` images a warning has named, in shared memory: each data worker process warns
    once per message, so an unreadable image read by another worker every epoch was named by each."""

    def __init__(self, count: int) -> None:
        self.flags = torch.zeros(count, dtype=torch.bool).share_memory_()

    def first(self, index: int) -> bool:
        """Whether no process has named image `index` yet; from now on, one has."""
        said = bool(self.flags[index])
        self.flags[index] = True
        return not said


class UnreadableImageError(DataError):
    """An image file that cannot be decoded, named in the message."""


class ImageFiles(Dataset):
    """(path, label) pairs read as RGB tensors and passed through `transform`; an unreadable file
    gives None (with a warning naming it) when `skip_unreadable`, else an error naming it. `named`:
    each image comes with its path in place of its label (predict, whose rows name what was read)."""

    def __init__(
        self, samples: list[tuple[str, int]], transform: v2.Transform, skip_unreadable: bool = True, named: bool = False
    ) -> None:
        self.samples = samples
        self.image_transform = transform
        self.skip_unreadable = skip_unreadable
        self.named = named
        self._skips_said = SaidOnce(len(samples))

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: int | tuple[int, int, int]) -> tuple[torch.Tensor, int] | None:
        """The sample at an index; at (index, seed, epoch), from EpochSampler, augmented as that epoch
        is, with draws seeded by `seed`."""
        index, seed, epoch = (key, None, None) if isinstance(key, int) else key
        path, label = self.samples[index]
        first_skip = functools.partial(self._skips_said.first, index)
        transform = at_epoch(self.image_transform, epoch)
        with contextlib.nullcontext() if seed is None else seeded_draws(seed):
            return labelled_image(
                path, path if self.named else label, path, transform, self.skip_unreadable, first_skip
            )


def labelled_image(
    source: str | bytes | memoryview,
    label: int | str,
    name: str,
    transform: v2.Transform,
    skip_unreadable: bool,
    first_skip: Callable[[], bool] = lambda: True,
) -> tuple[torch.Tensor, int | str] | None:
    """(transformed image, label) of an image file or its bytes; for an unreadable one, None with a
    warning naming it (where `first_skip()` says it is the first time) when `skip_unreadable`, else an
    error naming it."""
    try:
        image = read_rgb(source)
    except DECODE_ERRORS as error:
        if not skip_unreadable:
            raise UnreadableImageError(
                f"Cannot read the image {name} ({error}): remove or replace it, or set data.bad_images to skip."
            ) from error
        if first_skip():
            warnings.warn(f"Skipping the unreadable image {name} ({error})", stacklevel=1)
        return None
    return transform(image), label


def collate_readable(samples: list, empty: list | None = None) -> list:
    """A batch of the samples that could be read (unreadable ones come as None). With none readable,
    `empty` where given: an evaluation's process still runs the batch, on no images, since under a
    sharded strategy every process gathers the weights in each forward (and one process's share of
    a small split may be all unreadable). A training step on no images would have no loss."""
    readable = [sample for sample in samples if sample is not None]
    if readable:
        return default_collate(readable)
    if empty is not None:
        return empty
    raise UnreadableImageError(
        f"Every image of a training batch ({len(samples)}) was unreadable, with nothing to train on: remove or "
        "replace the files the warnings above name, or set a larger data.batch_size."
    )


def first_readable(paths: list[str]) -> str | None:
    """The first of `paths` that decodes (at one decode for most folders), or None when none does."""
    for path in paths:
        with contextlib.suppress(*DECODE_ERRORS):
            read_rgb(path)
            return path
    return None


def read_rgb(source: str | bytes | memoryview) -> torch.Tensor:
    """Decode an image file, or its bytes, to a 3×H×W tensor (uint8, or uint16 for 16-bit PNG),
    upright as its EXIF orientation says; grey, alpha, palette and CMYK images become RGB, float
    grey ones are read as 0..1 (or as 0..255 where a value is above 1), and an animated GIF is its
    first frame."""
    in_memory = not isinstance(source, str)
    if (len(source) if in_memory else os.path.getsize(source)) == 0:
        raise UnidentifiedImageError("an empty file")
    if not pil_reads_better(source):
        encoded = torch.frombuffer(bytearray(source), dtype=torch.uint8) if in_memory else source
        with contextlib.suppress(RuntimeError):  # formats torchvision.io cannot decode (BMP, TIFF, PPM)
            decoded = decode_image(encoded, mode=ImageReadMode.RGB, apply_exif_orientation=True)
            return decoded[0] if decoded.ndim == 4 else decoded  # a GIF under another name: its frames
    try:
        opened = Image.open(io.BytesIO(source) if in_memory else source)
    except UnidentifiedImageError:
        # PIL's message names the file, or the address of the bytes' buffer, which differs each time.
        raise UnidentifiedImageError("not an image format that torchvision or PIL reads") from None
    except Image.DecompressionBombError as error:  # an Exception of its own, not an OSError
        limit = 2 * Image.MAX_IMAGE_PIXELS  # where PIL's warning becomes this error
        raise ValueError(f"more than {limit:,} pixels, the most PIL opens (against decompression bombs)") from error
    with opened as image:
        return rgb_from_pil(image)


def rgb_from_pil(image: Image.Image) -> torch.Tensor:
    """A PIL image as `read_rgb` reads a file: 3 x H x W, uint8, upright as its EXIF orientation says."""
    image = ImageOps.exif_transpose(image)
    if image.mode.startswith("I"):  # 16-bit grey: 0..65535 to 0..255, where convert() would clip
        levels = np.asarray(image, dtype=np.float32) / 257
        image = Image.fromarray(levels.clip(0, 255).astype(np.uint8))
    elif image.mode == "F":  # float grey (scientific TIFFs): 0..1 to 0..255, where convert() would go black
        levels = np.nan_to_num(np.asarray(image, dtype=np.float32))
        image = Image.fromarray((levels * 255 if levels.max() <= 1 else levels).clip(0, 255).astype(np.uint8))
    return pil_to_tensor(image.convert("RGB"))


def pil_reads_better(source: str | bytes | memoryview) -> bool:
    """Whether an image file (by its name, not to open every file twice) or its bytes is WebP, which
    torchvision.io decodes without turning it upright, or GIF, every frame of which it decodes (an
    animated one of a few MB can take GBs): PIL turns the one upright and reads the other's first frame."""
    if isinstance(source, str):
        return source.lower().endswith((".webp", ".gif"))
    return bytes(source[:4]) == b"RIFF" and bytes(source[8:12]) == b"WEBP" or bytes(source[:4]) == b"GIF8"


def looks_like_an_image(path: str) -> bool:
    """Whether a file begins as image files do, whatever its name."""
    with contextlib.suppress(OSError), open(path, "rb") as file:
        return IMAGE_SIGNATURES.match(file.read(12)) is not None
    return False
