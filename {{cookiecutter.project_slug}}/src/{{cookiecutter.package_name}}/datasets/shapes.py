"""The built-in dataset: coloured shapes on noisy backgrounds, drawn from a seed, in ImageFolder layout.

It lets the project train, test and benchmark on any machine with no download. The colour of a
shape and of its background are random, so only geometry tells the classes apart.
"""

import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "cross", "hexagon", "square", "star", "triangle")
IMAGES_PER_CLASS = {"train": 400, "val": 100, "test": 100}

# Where data.synthetic draws the built-in shapes: data_dir's default. Elsewhere, a data_dir that
# does not exist is a mistyped path, and training on drawn shapes instead would hide it.
BUILT_IN_SHAPES = "data/shapes"


def is_built_in(data_dir: str | Path) -> bool:
    return Path(data_dir).resolve() == Path(BUILT_IN_SHAPES).resolve()


def draw_shapes_dataset(
    root: str | os.PathLike,
    images_per_class: dict[str, int] | None = None,
    size: int = 64,
    seed: int = 0,
) -> Path:
    """Draw `root/<split>/<class>/<n>.png` and return `root`; an existing `root` is left as it is.

    The images are drawn into a temporary sibling folder that is renamed into place at the end, so
    an interrupted run never leaves a half-drawn dataset, and processes that race to draw it agree.
    """
    root = Path(root)
    if root.exists():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    counts = IMAGES_PER_CLASS if images_per_class is None else images_per_class
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        for split_index, (split, count) in enumerate(counts.items()):
            for class_index, name in enumerate(CLASSES):
                folder = staging / split / name
                folder.mkdir(parents=True)
                for i in range(count):
                    # One generator per image: the same image for a given seed whatever the order.
                    rng = np.random.default_rng([seed, split_index, class_index, i])
                    draw_shape(name, size, rng).save(folder / f"{i:05d}.png")
        staging.rename(root)
    except OSError:
        if not root.exists():  # another process won the race if it exists; otherwise a real error
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def draw_shape(name: str, size: int, rng: np.random.Generator) -> Image.Image:
    """One `size`×`size` RGB image of the shape `name` at a random place, scale, angle and colour."""
    scale = 4  # drawn large and scaled down, which anti-aliases the edges
    canvas = size * scale
    background, foreground = _contrasting_colours(rng)
    image = Image.new("RGB", (canvas, canvas), background)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(1, 4))):  # thin distractor lines
        x0, y0, x1, y1 = rng.uniform(0, canvas, size=4)
        draw.line((x0, y0, x1, y1), fill=tuple(int(c) for c in rng.integers(0, 256, 3)), width=scale)

    radius = rng.uniform(0.2, 0.38) * canvas
    cx, cy = rng.uniform(radius, canvas - radius, size=2)
    angle = rng.uniform(0, 2 * math.pi)
    if name == "circle":
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=foreground)
    else:
        draw.polygon(_outline(name, cx, cy, radius, angle), fill=foreground)

    pixels = np.asarray(image.resize((size, size), Image.Resampling.LANCZOS), dtype=np.float32)
    pixels += rng.normal(0, 18, pixels.shape)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def _outline(name: str, cx: float, cy: float, radius: float, angle: float) -> list[tuple[float, float]]:
    if name == "triangle":
        radii = [radius] * 3
    elif name == "square":
        radii = [radius] * 4
    elif name == "hexagon":
        radii = [radius] * 6
    elif name == "star":
        radii = [radius, radius * 0.42] * 5
    elif name == "cross":
        # A plus sign: twelve corners, alternating between the arm ends and the inner corners.
        arm = 0.36
        points = [(1, arm), (1, -arm), (arm, -arm), (arm, -1), (-arm, -1), (-arm, -arm),
                  (-1, -arm), (-1, arm), (-arm, arm), (-arm, 1), (arm, 1), (arm, arm)]  # fmt: skip
        cos, sin = math.cos(angle), math.sin(angle)
        return [(cx + radius * (x * cos - y * sin), cy + radius * (x * sin + y * cos)) for x, y in points]
    else:
        raise ValueError(f"unknown shape {name!r}; the shapes are {', '.join(CLASSES)}")
    step = 2 * math.pi / len(radii)
    return [(cx + r * math.cos(angle + k * step), cy + r * math.sin(angle + k * step)) for k, r in enumerate(radii)]


def _contrasting_colours(rng: np.random.Generator) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A background and a shape colour whose brightness differs enough to see the outline."""
    while True:
        background, foreground = rng.integers(0, 256, size=(2, 3))
        if abs(_luma(background) - _luma(foreground)) > 60:
            return tuple(int(c) for c in background), tuple(int(c) for c in foreground)


def _luma(rgb: np.ndarray) -> float:
    return float(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])
