"""Stratified folds (data.num_folds, data.fold): each fold validates on its share of every class
and trains on the rest."""

import shutil
from collections import Counter
from pathlib import Path

import pytest
from conftest import ON_CPU, on_data, refusal

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.datasets import folders
from {{ cookiecutter.package_name }}.datasets.folders import stratified_folds


def test_stratified_folds_are_disjoint_cover_every_image_and_split_each_class_evenly():
    labels = [0] * 7 + [1] * 5 + [2] * 3 + [3] * 1
    folds = stratified_folds(labels, 3, seed=0)
    assert len(folds) == len(labels) and set(folds) == {0, 1, 2}  # each image in exactly one fold
    sizes = Counter(folds).values()
    assert max(sizes) - min(sizes) <= 1  # 16 images: 6, 5, 5
    for label in set(labels):
        per_fold = Counter(fold for fold, own in zip(folds, labels, strict=True) if own == label)
        counts = [per_fold.get(fold, 0) for fold in range(3)]
        assert max(counts) - min(counts) <= 1, (label, counts)  # 7 images of class 0: 3, 2, 2 in some order
    assert stratified_folds(labels, 3, seed=0) == folds and stratified_folds(labels, 3, seed=1) != folds


def test_each_fold_validates_on_its_share_and_trains_on_the_rest(tiny_shapes):
    sets = []
    for fold in range(3):
        data = ImageDataModule(tiny_shapes, num_folds=3, fold=fold, num_workers=0)
        data.setup("fit")
        train, val = (set(dataset.samples) for dataset in (data.train_set, data.val_set))
        assert not train & val
        sets.append((train, val))
    everything = sets[0][0] | sets[0][1]
    assert all(train | val == everything for train, val in sets)
    validated = [val for _, val in sets]
    assert sum(len(val) for val in validated) == len(everything) and set().union(*validated) == everything
    # The folds cut train/ only: val/ stays held out.
    assert all(Path(path).parent.parent.name == "train" for path, _ in everything)


def test_a_fold_lists_the_training_images_once(monkeypatch, tiny_shapes):
    # Checked at construction (too many folds) and split at setup: one walk of the folder serves both.
    walked = []
    walk = folders.image_files_under

    def walked_once(folder, *more):
        walked.append(Path(folder))
        return walk(folder, *more)

    monkeypatch.setattr(folders, "image_files_under", walked_once)
    data = ImageDataModule(tiny_shapes, num_folds=3, fold=1, num_workers=0)
    data.setup("fit")
    in_train = sorted(folder for folder in walked if folder.parent == tiny_shapes / "train")
    assert in_train == sorted((tiny_shapes / "train").iterdir())


def test_a_second_setup_reads_the_folders_again(tmp_path, tiny_shapes):
    # The CLI reads the folders before its logger starts (check_folders), and setup takes those splits;
    # a script that sets up again, for its next fold or after adding images, gets the folders as they are.
    tiny_shapes = Path(shutil.copytree(tiny_shapes, tmp_path / "shapes"))
    data = ImageDataModule(tiny_shapes, num_folds=3, fold=0, num_workers=0)
    data.check_folders()
    data.setup("fit")
    data.hparams.fold = 1
    data.setup("fit")
    other = ImageDataModule(tiny_shapes, num_folds=3, fold=1, num_workers=0)
    other.setup("fit")
    assert data.val_set.samples == other.val_set.samples
    added = tiny_shapes / "train" / data.class_names[0] / "added.png"
    added.write_bytes(next((tiny_shapes / "train" / data.class_names[0]).iterdir()).read_bytes())
    data.setup("fit")
    assert str(added) in {str(path) for path, _ in data.train_set.samples + data.val_set.samples}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--data.num_folds=1"], "data.num_folds must be 2 or more"),
        (["--data.num_folds=3", "--data.fold=3"], "data.fold from 0 to num_folds - 1, got 3 and 3"),
{%- if cookiecutter.streaming == "yes" %}
        (["--data.num_folds=3", "--data.format=streaming"], "data.num_folds works with data.format folder"),
{%- endif %}
        # 12 training images of each class: a 13th fold would validate on none of some class's.
        (["--data.num_folds=13"], "has 12 training images in"),
    ],
)
def test_impossible_folds_are_refused_in_one_line(monkeypatch, capsys, in_project_copy, tiny_shapes, options, named):
    assert named in refusal(monkeypatch, capsys, "fit", *ON_CPU, *on_data(tiny_shapes), *options)


def test_folds_over_a_class_of_one_image_are_refused_with_a_fix_that_exists(tiny_shapes, tmp_path):
    # It said "Use at most 1 folds", which data.num_folds refuses.
    shutil.copytree(tiny_shapes / "train", tmp_path / "train")
    for extra in sorted((tmp_path / "train" / "circle").iterdir())[1:]:
        extra.unlink()
    with pytest.raises(folders.DataError) as refused:
        folders.fold_pool(tmp_path, 3)
    assert str(refused.value).endswith("fewer than the 3 folds: some folds would validate on none of them. Add images "
                                       "of it, or remove it.")  # fmt: skip
