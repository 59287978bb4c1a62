"""`python -m {{ cookiecutter.package_name }} shard IMAGES OUTPUT`: an image folder as LitData's streaming chunks.

IMAGES is laid out as `--data.data_dir` reads it (class folders, or train/, val/ and test/ of class
folders; without val/, the same seeded split holds out data.val_fraction). OUTPUT is a local folder
or a remote URL LitData writes to (s3://bucket/prefix, with the usual AWS_* variables). Train from
it with --data.format streaming --data.data_dir OUTPUT.
"""

import argparse
import inspect
import os
import random
import re
import time
from pathlib import Path

from ..data import ImageDataModule, usable_cpus
from ..datasets.folders import check_val_fraction, find_classes, split_samples, train_folder
from ..datasets.streaming import check_storage, delete_manifest, join, write_manifest, write_split
from ..errors import PACKAGE, CommandParser, ConfigError, MissingError
from ..hardware.network import is_remote


def encoded_sample(sample: tuple[str, int, str]) -> dict:
    """One image as stored: the file's bytes as they are (no re-encoding, no loss), its label and
    its path under the image folder."""
    path, label, relative = sample
    return {"image": Path(path).read_bytes(), "label": label, "path": relative}


def byte_count(text: str) -> int:
    """A size as 64MB, 512kB or 300 (bytes), in bytes; LitData's units are powers of 1000."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)b?", text.strip().lower())
    count = int(float(match[1]) * 1000 ** " kmg".index(match[2] or " ")) if match else 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"a size is bytes as 64MB, 512kB or 300, got {text!r}")
    return count


SPLITS = ("train", "val", "test")


def check_output(output: str) -> None:
    """Refuse a local output whose split folders hold .bin files that no shard run wrote: LitData's
    overwrite deletes every .bin file there, whoever wrote it."""
    if is_remote(output):
        return
    folders = [Path(output) / split for split in SPLITS if (Path(output) / split).is_dir()]
    others = sorted(path for folder in folders for path in folder.glob("*.bin") if not path.match("chunk-*.bin"))
    if others:
        shown = ", ".join(str(path.relative_to(output)) for path in others[:3]) + (", ..." if len(others) > 3 else "")
        raise ConfigError(f"The output {output} holds files that LitData would delete and no shard run wrote "
                          f"({shown}): shard into a new or empty folder.")  # fmt: skip


def shard(images: Path, output: str, val_fraction: float, split_seed: int, workers: int, chunk_bytes: int) -> dict:
    if not images.is_dir():
        raise MissingError(f"{images} is not a folder: give the image folder (class folders, or train/ and val/).")
    check_val_fraction(val_fraction, "--val_fraction")
    if not is_remote(output) and os.path.lexists(output) and not Path(output).is_dir():
        raise ConfigError(f"The output {output} is a file: name a folder to write the shards into.")
    if not is_remote(output) and Path(output).resolve().is_relative_to(images.resolve()):
        raise ConfigError(f"The output {output} is inside the image folder {images}: write it elsewhere.")
    check_output(output)
    check_storage(output)
    classes = find_classes(train_folder(images))
    splits = split_samples(images, classes, val_fraction, split_seed)
    # The manifest goes last: a run cut short leaves chunks without one, which read as unfinished.
    delete_manifest(output)
    counts = {}
    for split, samples in splits.items():
        started = time.perf_counter()
        inputs = [(path, label, os.path.relpath(path, images)) for path, label in samples]
        if split == "train":
            # LitData shuffles chunks, and items only among the few chunks a worker holds at a time:
            # written in class order, a batch would hold one or two classes. Written shuffled, every
            # chunk holds them all.
            random.Random(split_seed).shuffle(inputs)
        print(f"{split}: {len(inputs)} images into {join(output, split)}", flush=True)
        write_split(encoded_sample, inputs, join(output, split), workers, chunk_bytes)
        counts[split] = {"images": len(inputs), "seconds": round(time.perf_counter() - started, 1)}
        counts[split]["class_counts"] = [sum(1 for _, label in samples if label == i) for i in range(len(classes))]
    manifest = {"classes": classes, "splits": counts, "source": str(images.resolve())}
    write_manifest(output, manifest)
    return manifest


def main(args: list[str]) -> int:
    defaults = inspect.signature(ImageDataModule).parameters
    parser = CommandParser(prog=f"{PACKAGE} shard", description=__doc__.splitlines()[0])
    parser.add_argument("images", type=Path, help="the image folder, as --data.data_dir reads it")
    parser.add_argument("output", help="a folder, or a remote URL such as s3://bucket/prefix")
    parser.add_argument("--val_fraction", type=float, default=defaults["val_fraction"].default,
                        help="without val/: the share of each class held out, as data.val_fraction")  # fmt: skip
    parser.add_argument("--split_seed", type=int, default=defaults["split_seed"].default, help="as data.split_seed")
    parser.add_argument("--workers", type=int, default=usable_cpus(), help="processes reading images")
    parser.add_argument("--chunk_bytes", type=byte_count, default="64MB", help="size of each chunk file (%(default)s)")
    options = parser.parse_args(args)
    started = time.perf_counter()
    manifest = shard(options.images, options.output, options.val_fraction, options.split_seed,
                     options.workers, options.chunk_bytes)  # fmt: skip
    images = sum(split["images"] for split in manifest["splits"].values())
    print(f"Sharded {images} images of {len(manifest['classes'])} classes in {time.perf_counter() - started:.0f} s. "
          f"Train on them: --data.format streaming --data.data_dir {options.output}")  # fmt: skip
    return 0
