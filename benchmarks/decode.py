"""Data-loading throughput with two image decoders: torchvision.io against PIL.

Run from the template's root:

    .venv/bin/python benchmarks/decode.py [--images-per-class 100] [--workers 0 1 2] [--epochs 1]
                                          [--repeats 3] [--batch-size 64]

A project is rendered from the template into a temporary folder and imported from there, so the
figures follow the template as it changes. Images per second through a DataLoader that decodes
each file, applies the project's training transform and collates the batch, for
  - torchvision: the project's `read_rgb` (torchvision.io.decode_image), and
  - PIL: `Image.open(path).convert("RGB")` and then `pil_to_tensor`,
on the same files of two datasets: the project's shapes PNGs at 64 px (transformed at 64 px), and
JPEG copies of them at 256 px and quality 90 (transformed at 224 px), which decode more like real
photos. Each measurement takes a fresh DataLoader through one untimed epoch (starting its workers
and filling the page cache) and then times `--epochs` epochs; the table gives the median of
`--repeats` measurements, with the two decoders taking turns to go first, and the faster decoder
of each dataset and worker count.
"""

import argparse
import inspect
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import PIL
import torch
import torchvision
from PIL import Image
from rendered import render_project
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.v2.functional import pil_to_tensor


def pil_rgb(path: str) -> torch.Tensor:
    with Image.open(path) as image:
        return pil_to_tensor(image.convert("RGB"))


class DecodedImages(Dataset):
    def __init__(self, samples: list[tuple[str, int]], decode, transform) -> None:
        self.samples, self.decode, self.transform = samples, decode, transform

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return self.transform(self.decode(path)), label


def jpeg_copies(samples: list[tuple[str, int]], folder: Path, size: int) -> list[tuple[str, int]]:
    folder.mkdir()
    copies = []
    for index, (path, label) in enumerate(samples):
        copy = folder / f"{index:05d}.jpg"
        with Image.open(path) as image:
            image.convert("RGB").resize((size, size), Image.Resampling.BICUBIC).save(copy, quality=90)
        copies.append((str(copy), label))
    return copies


def images_per_second(dataset: Dataset, workers: int, batch_size: int, epochs: int, collate) -> float:
    loader = DataLoader(
        dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate, persistent_workers=workers > 0
    )
    for _ in loader:  # warmup: starts the workers and reads the files into the page cache
        pass
    start = time.perf_counter()
    for _ in range(epochs):
        for _ in loader:
            pass
    return epochs * len(dataset) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images-per-class", type=int, default=100, help="of the 6 shape classes")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="num_workers values")
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per row")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"CPUs: {cpus} usable of {os.cpu_count()}; torch threads: {torch.get_num_threads()}; "
        f"python {platform.python_version()}, torch {torch.__version__}, torchvision {torchvision.__version__}, "
        f"Pillow {PIL.__version__}"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="decode-") as tmp:
        sys.path.insert(0, str(render_project(Path(tmp))))
        from image_classifier import data, transforms
        from image_classifier.datasets import folders, images, shapes

        root = shapes.draw_shapes_dataset(Path(tmp) / "shapes", images_per_class={"train": args.images_per_class})
        pngs = folders.find_images(root / "train", folders.find_classes(root / "train"))
        datasets = {"PNG 64 px": (pngs, 64), "JPEG 256 px q90": (jpeg_copies(pngs, Path(tmp) / "jpeg", 256), 224)}
        # The default recipe's training augmentation, as ImageDataModule's defaults give it.
        defaults = inspect.signature(data.ImageDataModule).parameters
        augmentation = {
            name: defaults[name].default for name in ("augment", "hflip", "vflip", "min_crop_scale", "random_erasing")
        }
        decoders = {"torchvision": images.read_rgb, "PIL": pil_rgb}
        print(f"{len(pngs)} images per epoch, batch {args.batch_size}, {args.epochs} timed epoch(s) per measurement")

        for name, (samples, image_size) in datasets.items():
            transform = transforms.train_transform(transforms.Preprocessing(image_size), **augmentation)
            for workers in args.workers:
                measured = {decoder: [] for decoder in decoders}
                for repeat in range(args.repeats):
                    # Taking turns to go first, so neither decoder always runs on a warmer machine.
                    order = list(decoders) if repeat % 2 == 0 else list(reversed(decoders))
                    for decoder in order:
                        dataset = DecodedImages(samples, decoders[decoder], transform)
                        collate = images.collate_readable
                        rate = images_per_second(dataset, workers, args.batch_size, args.epochs, collate)
                        measured[decoder].append(rate)
                rows.append((name, workers, {decoder: statistics.median(rates) for decoder, rates in measured.items()}))

    print(f"\n{'dataset':<16}  {'decoder':<11}  {'workers':>7}  {'images/s':>9}  faster")
    for name, workers, rates in rows:
        (fast, fast_rate), (slow, slow_rate) = sorted(rates.items(), key=lambda item: -item[1])
        for decoder, rate in rates.items():
            verdict = f"{fast} by {fast_rate / slow_rate:.2f}x" if decoder == fast else ""
            print(f"{name:<16}  {decoder:<11}  {workers:>7}  {rate:>9.0f}  {verdict}")


if __name__ == "__main__":
    main()
