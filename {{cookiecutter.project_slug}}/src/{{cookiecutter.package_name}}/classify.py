"""`python -m {{ cookiecutter.package_name }} classify IMAGES...`: the top classes of images, as a CSV file.

IMAGES are image files or folders (searched recursively). The model comes from --checkpoint, by
default the best checkpoint of the newest run under runs/. Runs on the CPU unless --device says
otherwise. Unreadable images are skipped with a warning naming them.
"""

import argparse
import csv
import sys
import warnings
from pathlib import Path

import torch
from torchvision.datasets.folder import IMG_EXTENSIONS

from .data import UnreadableImageError, checkpoint_preprocessing, image_files_under, read_rgb
from .errors import DataError, MissingError
from .model import ImageClassifier
from .predictions import csv_header, csv_row, top_classes
from .resume import check_checkpoint
from .run_folders import last_checkpoints
from .transforms import Preprocessing


def best_checkpoint(runs: Path) -> Path:
    """The best checkpoint of the newest run, as its ModelCheckpoint recorded it in last.ckpt
    (whatever the metric it monitors or its file names), else that last.ckpt."""
    lasts = last_checkpoints(runs)
    if not lasts:
        raise MissingError(f"No checkpoint under {runs}: train a model first, or pass --checkpoint.")
    last = lasts[-1]
    states = torch.load(last, map_location="cpu", weights_only=True, mmap=True).get("callbacks", {})
    for key, state in states.items():
        # The callback that monitors a metric: the one that writes last.ckpt monitors none.
        best = state.get("best_model_path") if key.startswith("ModelCheckpoint") and state.get("monitor") else None
        if best:
            # Recorded as the path the run saw, maybe relative to another folder: look beside last.ckpt.
            found = next((path for path in (Path(best), last.parent / Path(best).name) if path.exists()), None)
            if found is not None:
                return found
    return last


def image_files(inputs: list[Path]) -> list[Path]:
    found = []
    for given in inputs:
        if given.is_dir():  # the same walk as the training data's: hidden files and folders skipped
            images = sorted(Path(path) for path in image_files_under(given))
            if not images:
                raise MissingError(f"No images ({', '.join(IMG_EXTENSIONS)}) in {given} or its folders.")
            found += images
        elif given.is_file():
            found.append(given)
        else:
            raise MissingError(f"{given} is neither an image file nor a folder.")
    return found


def saved_state(checkpoint: Path) -> dict:
    """A checkpoint's contents, memory-mapped: the weights, loaded already by load_from_checkpoint,
    are not read again."""
    return torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)


def classify(model: ImageClassifier, paths: list[Path], preprocessing: Preprocessing, batch_size: int, top_k: int):
    """Yield (path, [(class name, probability), ...]) for each readable image, best class first."""
    transform = preprocessing.eval_transform()
    names = model.label_names()
    device = next(model.parameters()).device
    for start in range(0, len(paths), batch_size):
        batch, readable = [], []
        for path in paths[start : start + batch_size]:
            try:
                batch.append(transform(read_rgb(str(path))))
                readable.append(path)
            except (RuntimeError, OSError, ValueError, UnreadableImageError) as error:
                warnings.warn(f"Skipping the unreadable image {path} ({error})", stacklevel=1)
        if not batch:
            continue
        with torch.inference_mode():
            probabilities = model(preprocessing.normalize(torch.stack(batch).to(device))).float().softmax(-1)
        yield from zip(readable, top_classes(probabilities, names, top_k), strict=True)


def main(args: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="{{ cookiecutter.package_name }} classify", description=__doc__.splitlines()[0])
    parser.add_argument("images", type=Path, nargs="+", help="image files or folders")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint file (default: the newest run's best)")
    parser.add_argument("--runs", type=Path, default=Path("runs"), help="where to look for the default checkpoint")
    parser.add_argument("--output", type=Path, default=Path("predictions.csv"), help="the CSV file to write")
    parser.add_argument("--top-k", type=int, default=3, help="classes per image")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, mps")
    options = parser.parse_args(args)

    if options.checkpoint is not None:
        check_checkpoint(str(options.checkpoint), "--checkpoint")
    checkpoint = options.checkpoint or best_checkpoint(options.runs)
    paths = image_files(options.images)
    if checkpoint.is_dir():
        raise DataError(f"{checkpoint} is a sharded checkpoint: make it one file with `consolidate` first.")
    model = ImageClassifier.load_from_checkpoint(checkpoint, map_location=options.device, weights_only=True).eval()
    # Prepared as in training, whatever the configuration says now: the checkpoint records how.
    preprocessing = checkpoint_preprocessing(saved_state(checkpoint))
    rows = classify(model, paths, preprocessing, options.batch_size, options.top_k)

    written = 0
    with options.output.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(csv_header(options.top_k))
        for path, top in rows:
            writer.writerow(csv_row(path, top))
            written += 1
    print(f"Classified {written} of {len(paths)} images with {checkpoint}: {options.output}", file=sys.stderr)
    return 0
