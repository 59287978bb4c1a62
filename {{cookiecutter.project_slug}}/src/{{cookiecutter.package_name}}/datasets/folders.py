"""Class folders and their splits: which folder holds which split, the images of each class, and
seeded train/val splits and cross-validation folds of them."""

import hashlib
import mimetypes
import os
import unicodedata
from collections import Counter
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_warn

from ..errors import ConfigError, DataError, MissingError
from .images import IMAGE_SUFFIXES, first_readable, looks_like_an_image
from .shapes import is_built_in

# Each split's folder names, in any case, as datasets name them (Roboflow's valid/, Kaggle's
# Training/ and Testing/); a case-insensitive file system would match any case anyway.
SPLIT_NAMES = {"train": ("train", "training"), "val": ("val", "valid", "validation"), "test": ("test", "testing")}


def split_folder(data_dir: Path, split: str) -> Path | None:
    """The folder of a split (train, val or test) in data_dir, by any of its names; None without one."""
    if not data_dir.is_dir():
        return None
    found = sorted(path for path in data_dir.iterdir() if path.name.lower() in SPLIT_NAMES[split] and path.is_dir())
    # Among class folders a Train or Test folder of images is a class; beside a train/ split, a split.
    if split == "train" or split_folder(data_dir, "train") is None:
        found = [path for path in found if not is_a_class_folder(path)]
    if len(found) > 1:
        raise DataError(
            f"{data_dir} has {' and '.join(path.name + '/' for path in found)}, each a {split} split's name: "
            "merge them into one."
        )
    return found[0] if found else None


def is_a_class_folder(folder: Path) -> bool:
    """Whether a folder named as a split is a class of that name (Train, Test, ...): it holds images
    and no folders, where a split holds class folders."""
    with os.scandir(folder) as entries:
        return not _subfolders(folder) and any(entry.is_file() and is_image_name(entry.name) for entry in entries)


def train_folder(data_dir: Path) -> Path:
    """The folder of the training class folders: data_dir/train, or data_dir itself."""
    if not data_dir.is_dir():
        draw = ""
        if is_built_in(data_dir) and not data_dir.exists():  # data.synthetic draws only there: elsewhere no fix
            draw = ", or set --data.synthetic=true to draw the built-in shapes dataset there"
        raise MissingError(
            f"Data folder {data_dir} {'is a file' if data_dir.exists() else 'does not exist'}. Point --data.data_dir "
            f"at a folder of class folders (or of train/ and val/ folders of class folders){draw}."
        )
    if train_dir := split_folder(data_dir, "train"):
        return train_dir
    splits = [folder.name for name in ("val", "test") if (folder := split_folder(data_dir, name))]
    if splits:
        raise DataError(
            f"{data_dir} has {' and '.join(s + '/' for s in splits)} but no train/: move the training "
            "class folders into train/, or the split folders out, so no image is both trained and tested on."
        )
    return data_dir


def check_val_fraction(val_fraction: float, option: str) -> None:
    """Refuse a held-out share that leaves no image to train on, or none to validate on."""
    if not 0 < val_fraction < 1:
        raise ConfigError(f"{option} must be above 0 and below 1, got {val_fraction}")


def split_samples(
    data_dir: Path, classes: list[str], val_fraction: float, split_seed: int, training: bool = True
) -> dict[str, list]:
    """The (path, label) pairs of each split: train and val, and test when there is a test/ folder.
    Without val/, a seeded split stratified by class holds out `val_fraction` of the training images.
    Not `training` (an evaluation), a val/ folder spares listing the training images, maybe millions."""
    train_dir, val_dir = train_folder(data_dir), split_folder(data_dir, "val")
    if val_dir:
        train = find_images(train_dir, classes) if training else []
        splits = {"train": train, "val": find_images(val_dir, classes, held_out=True)}
    else:
        samples = find_images(train_dir, classes)
        names = [same_everywhere(os.path.relpath(path, train_dir)) for path, _ in samples]
        train, val = stratified_split(names, [label for _, label in samples], val_fraction, split_seed)
        splits = {"train": [samples[i] for i in train], "val": [samples[i] for i in val]}
    return with_test_split(splits, data_dir, classes)


def has_test_folder(data_dir: Path) -> bool:
    """A test split is a test/ folder of class folders: never carved from the training images."""
    return split_folder(data_dir, "test") is not None


def with_test_split(splits: dict[str, list], data_dir: Path, classes: list[str]) -> dict[str, list]:
    """`splits` and, when there is a test/ folder, its images as the test split, whatever split the rest;
    the evaluated splits (val, test) with their classes interleaved."""
    if test_dir := split_folder(data_dir, "test"):
        splits["test"] = find_images(test_dir, classes, held_out=True)
    return {name: samples if name == "train" else interleaved(samples) for name, samples in splits.items()}


def interleaved(samples: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(path, label) pairs reordered so that any stretch of them holds each class in its share: an
    evaluation cut short (limit_val_batches) sees every class, where in class order it saw the first."""
    by_class: dict[int, list] = {}
    for sample in samples:
        by_class.setdefault(sample[1], []).append(sample)
    # Each sample at the middle of its place in its class, as a fraction of the class: 1/6, 3/6, 5/6 of 3.
    placed = [((2 * index + 1) / (2 * len(members)), label, sample) for label, members in by_class.items()
              for index, sample in enumerate(members)]  # fmt: skip
    return [sample for *_, sample in sorted(placed, key=lambda place: place[:2])]


def fold_pool(data_dir: Path, num_folds: int) -> list[tuple[str, int]]:
    """The (path, label) pairs of the training images that the folds divide. More folds than the
    rarest class has images are refused: some folds would validate on none of it."""
    train_dir = train_folder(data_dir)
    classes = find_classes(train_dir)
    samples = find_images(train_dir, classes)
    counts = Counter(label for _, label in samples)
    rarest = min(range(len(classes)), key=counts.__getitem__)
    if counts[rarest] < num_folds:
        raise DataError(
            f"The class {classes[rarest]} has {counts[rarest]} training images in {train_dir}, fewer than the "
            f"{num_folds} folds: some folds would validate on none of them. "
            + (f"Use at most {counts[rarest]} folds." if counts[rarest] > 1 else "Add images of it, or remove it.")
        )
    return samples


def fold_samples(
    data_dir: Path, classes: list[str], num_folds: int, fold: int, split_seed: int, pool: list | None = None
) -> dict[str, list]:
    """The (path, label) pairs of the training images outside `fold` and inside it, as train and val
    (and test/ when there is one). `pool`: the training images, when fold_pool has listed them."""
    samples = fold_pool(data_dir, num_folds) if pool is None else pool
    folds = stratified_folds([label for _, label in samples], num_folds, split_seed)
    splits = {
        "train": [sample for sample, k in zip(samples, folds, strict=True) if k != fold],
        "val": [sample for sample, k in zip(samples, folds, strict=True) if k == fold],
    }
    return with_test_split(splits, data_dir, classes)


class TooFewClassesError(DataError):
    """A data folder with fewer than two class folders."""

    def __init__(self, folder: Path, classes: list[str]) -> None:
        self.folder = folder
        fix = "put each class's images in a folder of its own under it"
        inner = folder / _subfolders(folder)[0] if len(classes) == 1 else None
        if inner is not None and len(within := _subfolders(inner)) > 1:  # a dataset unpacked into a folder of its own
            fix = f"if the {len(within)} folders in {inner.name} are the classes or the splits, "
            fix += f"set data.data_dir to {inner}"
        super().__init__(
            f"{folder} has {len(classes)} class folder(s) ({', '.join(classes) or 'none'}); a classifier needs "
            f"at least two: {fix}."
        )


def find_classes(folder: Path) -> list[str]:
    """The class folders' names, sorted, in Unicode's composed form: macOS and some zip tools write é
    as e and an accent, and a copy of the folders made there must name and order the classes alike."""
    classes = sorted(class_folders(folder))
    if len(classes) < 2:
        raise TooFewClassesError(folder, classes)
    return classes


def same_everywhere(path: str) -> str:
    """A path as any system spells it: composed Unicode and "/". The split and the order of images
    follow from this, so that a copy made on macOS (which decomposes accents) or Windows holds out the
    same images, not ones the run trained on."""
    return unicodedata.normalize("NFC", path.replace(os.sep, "/"))


def find_images(folder: Path, classes: list[str], held_out: bool = False) -> list[tuple[str, int]]:
    """Every image under `folder/<class>/`, labelled by the class's index in `classes`. The validation
    or test images (`held_out`) may lack a class, whose empty folder is then as if absent."""
    folders = class_folders(folder)
    unknown = sorted(set(folders) - set(classes))
    if unknown:
        raise DataError(
            f"{folder} has class folders the training data lacks: {', '.join(unknown)}. Add the class's training "
            "images to a folder of that name, or remove it here."
        )
    if loose := [entry.name for entry in os.scandir(folder) if entry.is_file() and is_image_name(entry.name)]:
        rank_zero_warn(
            f"{len(loose)} image(s) directly in {folder} (such as {sorted(loose)[0]}) are in no class folder, so are "
            "left out: move each into the folder of its class."
        )
    samples, empty, unreadable, other_images, links = [], [], [], Counter(), []
    for label, name in enumerate(classes):
        class_dir = folder / folders.get(name, name)
        # By whole path, cheap to spell alike: a class's images share the part up to its folder.
        paths = sorted(image_files_under(class_dir, other_images, links), key=same_everywhere)
        if class_dir.is_dir() and not paths:
            empty.append(repr(name))
        # Skipped one by one in training, a class's images all unreadable would leave it untrained, and
        # validated on nothing: its accuracy out of every metric, with no word but the skips'.
        elif paths and first_readable(paths) is None:
            unreadable.append(repr(name))
        samples += [(path, label) for path in paths]
    if warning := other_images_warning(other_images, folder):  # first: it may say why a folder is empty
        rank_zero_warn(warning)
    if links:
        rank_zero_warn(
            f"{len(links)} linked folder(s) in the class folders of {folder} (such as "
            f"{os.path.relpath(links[0], folder)}) are not followed, as a link to a parent would give the other "
            "classes' images this class: link the images themselves, or copy the folder."
        )
    if empty and (not held_out or not samples):  # validation or test images lacking a class warn (data.setup)
        raise DataError(
            f"No images ({', '.join(IMAGE_SUFFIXES)}) in the class folder(s) {', '.join(empty)} of {folder}: "
            "add images or remove the folders."
        )
    if unreadable:
        raise DataError(
            f"No image in the class folder(s) {', '.join(unreadable)} of {folder} can be read: replace the "
            "files, or remove the folders."
        )
    return samples


def image_files_under(folder: Path, other_images: Counter, links: list) -> list[str]:
    """Image files under a folder, skipping hidden files and folders (.ipynb_checkpoints, macOS ._
    files). The folder itself or an image may be a link; a linked sub-folder is not followed, as a
    link to a parent would label the other classes' images with this class: such folders are added
    to `links`. Images of other types (.heic, .avif) are counted by extension into `other_images`,
    and images saved with no extension (a scrape's) as such."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        links += [path for d in dirs if os.path.islink(path := os.path.join(root, d))]
        for name in (f for f in files if not f.startswith(".")):
            if is_image_name(name):
                found.append(os.path.join(root, name))
            elif not os.path.splitext(name)[1]:
                if looks_like_an_image(os.path.join(root, name)):  # not a LICENSE or a macOS Icon file
                    other_images["with no extension"] += 1
            elif (mimetypes.guess_type(name)[0] or "").startswith("image/"):
                other_images[os.path.splitext(name)[1].lower()] += 1
    return found


def is_image_name(name: str) -> bool:
    """A file the image folders read: not hidden (macOS ._ files), of a type in IMAGE_SUFFIXES."""
    return not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES)


def other_images_warning(other_images: Counter, folder: Path) -> str | None:
    """One line on the image files that `image_files_under` passed over, which a user would take for data."""
    if not other_images:
        return None
    kinds = ", ".join(f"{count} {extension}" for extension, count in other_images.most_common())
    return (
        f"Skipped {other_images.total()} image file(s) under {folder} of types not read ({kinds}): convert or "
        f"rename them to {', '.join(IMAGE_SUFFIXES)} to use them."
    )


def class_folders(folder: Path) -> dict[str, str]:
    """Each class folder in `folder` by its name in composed Unicode (find_classes'), or an error where two
    folders name one class so (café composed and decomposed, a macOS copy merged into another)."""
    folders: dict[str, str] = {}
    for name in _subfolders(folder):
        if (composed := unicodedata.normalize("NFC", name)) in folders:
            raise DataError(
                f"{folder} has two class folders named {composed!r}, spelled {ascii(folders[composed])} and "
                f"{ascii(name)} (accents written two ways): move the images of one into the other."
            )
        folders[composed] = name
    return folders


def _subfolders(folder: Path) -> list[str]:
    """The folders in `folder`, but hidden ones and the __MACOSX folder of a zip made on a Mac."""
    return sorted(
        entry.name
        for entry in os.scandir(folder)
        if entry.is_dir() and entry.name[0] != "." and entry.name != "__MACOSX"
    )


def stratified_split(
    names: list[str], labels: list[int], val_fraction: float, seed: int
) -> tuple[list[int], list[int]]:
    """Indices of a train/val split that holds out `val_fraction` of each class (at least one image
    of each class that has two or more). Each class is ordered by a seeded hash of each image's name
    rather than shuffled by position, so that an image added or removed (a bad one, say) moves at
    most one other of its class across the split, not most of them into training."""
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(label, []).append(index)
    train, val = [], []
    for indices in by_class.values():
        order = sorted(indices, key=lambda i: hashlib.blake2b(f"{seed}/{names[i]}".encode(), digest_size=8).digest())
        n_val = min(len(order) - 1, max(1, round(len(order) * val_fraction)))
        val += order[:n_val]
        train += order[n_val:]
    return sorted(train), sorted(val)


def stratified_folds(labels: list[int], num_folds: int, seed: int) -> list[int]:
    """The fold of each image: each class shuffled (seeded) and dealt round the folds, each class
    starting where the previous one stopped, so fold sizes differ by one image at most."""
    generator = torch.Generator().manual_seed(seed)
    by_class: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_class.setdefault(label, []).append(index)
    folds, dealt = [0] * len(labels), 0
    for label in sorted(by_class):
        indices = by_class[label]
        for index in torch.randperm(len(indices), generator=generator).tolist():
            folds[indices[index]] = dealt % num_folds
            dealt += 1
    return folds
