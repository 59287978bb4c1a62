"""`python -m {{ cookiecutter.package_name }} classify IMAGES...`: the top classes of images, as a CSV file.

IMAGES are image files or folders (searched recursively; a linked sub-folder is named in a warning,
not followed). The model comes from --checkpoint (a checkpoint, or an ONNX file from `export`), by
default the best checkpoint of the newest run under runs/. Runs on the CPU unless --device says
otherwise. Unreadable images are skipped with a warning naming them.
"""

import csv
import os
import sys
import warnings
from collections import Counter
from pathlib import Path

import torch

from ..cli import configured_runs
from ..datasets.folders import image_files_under, other_images_warning
from ..datasets.images import IMAGE_SUFFIXES, labelled_image
from ..errors import PACKAGE, CommandParser, ConfigError, DataError, MissingError, check_output_file
from ..training.predictions import csv_header, csv_row, top_classes, written_csv
from ..training.resume import check_checkpoint
from ..training.run_folders import best_checkpoint
from .predictor import Predictor, check_device, is_onnx


def image_files(inputs: list[Path]) -> list[Path]:
    found = []
    for given in inputs:
        if given.is_dir():  # the same walk as the training data's: hidden files and folders skipped
            other_images, links = Counter(), []
            images = sorted(Path(path) for path in image_files_under(given, other_images, links))
            if warning := other_images_warning(other_images, given):
                warnings.warn(warning, stacklevel=1)
            if links:  # a link to a parent folder would be walked for ever
                such = os.path.relpath(links[0], given)
                warnings.warn(f"{len(links)} linked folder(s) under {given} (such as {such}) are not followed: give "
                              "each as an argument of its own.", stacklevel=1)  # fmt: skip
            if not images:
                raise MissingError(f"No images ({', '.join(IMAGE_SUFFIXES)}) in {given} or its folders.")
            found += images
        elif given.is_file():
            found.append(given)
        elif given.exists():
            raise MissingError(f"{given} is neither an image file nor a folder.")
        else:
            raise MissingError(f"{given} does not exist: give image files or folders of them.")
    unique: dict[str, Path] = {}  # an image in a folder given and given itself too is classified once
    for path in found:
        unique.setdefault(os.path.abspath(path), path)
    return list(unique.values())


def classify(predictor: Predictor, paths: list[Path], batch_size: int, top_k: int):
    """Yield (path, [(class name, probability), ...]) for each readable image, best class first."""
    for start in range(0, len(paths), batch_size):
        batch = [
            labelled_image(str(path), path, str(path), predictor.transform, skip_unreadable=True)
            for path in paths[start : start + batch_size]
        ]
        readable = [sample for sample in batch if sample is not None]
        if readable:
            images, names = zip(*readable, strict=True)
            tops = top_classes(predictor(torch.stack(images)), predictor.class_names, top_k)
            yield from zip(names, tops, strict=True)


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} classify", description=__doc__.splitlines()[0])
    parser.add_argument("images", type=Path, nargs="+", help="image files or folders")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint or ONNX export (default: the newest run's best)")
    parser.add_argument("--runs", type=Path, help="where the runs are (default: where fit puts them)")
    parser.add_argument("--output", type=Path, default=Path("predictions.csv"), help="the CSV to write (%(default)s)")
    parser.add_argument("--top-k", type=int, default=3, help="classes per image")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    options = parser.parse_args(args)
    parser.check_at_least(options, {"--top-k": 1, "--batch-size": 1})
    check_output_file(options.output, "--output", "CSV file")
    check_device(options.device)

    checkpoint = options.checkpoint or best_checkpoint(options.runs or configured_runs(), "--checkpoint")
    if not is_onnx(checkpoint):
        check_checkpoint(str(checkpoint), "--checkpoint", takes_onnx=True)
    paths = image_files(options.images)
    read = {os.path.abspath(path): "one of the images" for path in paths} | {os.path.abspath(checkpoint): "the model"}
    if overwritten := read.get(os.path.abspath(options.output)):
        raise ConfigError(f"--output {options.output} is {overwritten}: name the CSV to write.")
    predictor = Predictor(checkpoint).load(options.device)
    rows = list(classify(predictor, paths, options.batch_size, options.top_k))
    if not rows:  # refused before --output is opened: an earlier file there stays
        raise DataError(f"None of the {len(paths)} images could be read (the warnings above name them).")
    options.output.parent.mkdir(parents=True, exist_ok=True)
    with written_csv(options.output) as file:
        writer = csv.writer(file)
        writer.writerow(csv_header(options.top_k, len(predictor.class_names)))
        writer.writerows(csv_row(path, top) for path, top in rows)
    print(f"Classified {len(rows)} of {len(paths)} images with {checkpoint}: {options.output}", file=sys.stderr)
    return 0
