import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import unicodedata
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import numpy as np
import pytest
import torch
from conftest import ON_CPU, command_env, kill_group, on_data, run_cli
from PIL import Image
from torch.utils.data import Dataset

from {{ cookiecutter.package_name }} import data as data_module
from {{ cookiecutter.package_name }}.data import ImageDataModule, auto_workers
from {{ cookiecutter.package_name }}.datasets import folders
from {{ cookiecutter.package_name }}.datasets import images as images_module
from {{ cookiecutter.package_name }}.datasets.folders import stratified_split
from {{ cookiecutter.package_name }}.datasets.images import read_rgb
from {{ cookiecutter.package_name }}.datasets.shapes import CLASSES
from {{ cookiecutter.package_name }}.errors import DataError
from {{ cookiecutter.package_name }}.transforms import IMAGENET_MEAN, IMAGENET_STD


def make_folder(root, counts: dict[str, int], size: int = 20):
    for name, count in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (size, size), (i * 10 % 255, 50, 100)).save(root / name / f"{i}.png")
    return root


def test_stratified_split_keeps_class_shares_and_is_seeded():
    labels = [0] * 50 + [1] * 30 + [2] * 20
    names = [f"{label}/{index:03d}.jpg" for index, label in enumerate(labels)]
    train, val = stratified_split(names, labels, 0.2, seed=0)
    assert not set(train) & set(val)
    assert sorted(train + val) == list(range(100))
    assert Counter(labels[i] for i in val) == {0: 10, 1: 6, 2: 4}
    assert stratified_split(names, labels, 0.2, seed=0) == (train, val)
    assert stratified_split(names, labels, 0.2, seed=1) != (train, val)


def test_an_image_removed_or_added_moves_at_most_one_other_across_the_split():
    names = [f"cat/{index:03d}.jpg" for index in range(45)]

    def held_out(kept: list[str]) -> set[str]:
        return {kept[i] for i in stratified_split(kept, [0] * len(kept), 0.2, seed=0)[1]}

    val = held_out(names)
    assert len(val) == 9
    for removed in names[:10]:  # removing one (a bad image, as its error says): 9 of 44 held out still
        left = [name for name in names if name != removed]
        assert len(held_out(left) - val) <= 1 and len(val - {removed} - held_out(left)) <= 1
    for added in (f"cat/new-{index}.jpg" for index in range(10)):
        moved_to_training = val - held_out([*names, added])
        assert len(moved_to_training) <= 1


def test_split_holds_out_one_image_of_small_classes_and_keeps_one_for_training():
    train, val = stratified_split(["a/1.jpg", "a/2.jpg", "b/1.jpg"], [0, 0, 1], 0.1, seed=0)
    assert len(val) == 1 and {0, 1} <= {[0, 0, 1][i] for i in train}


def test_a_class_folder_of_which_no_image_can_be_read_is_refused(tmp_path):
    data = make_folder(tmp_path, {"cat": 4, "dog": 4})
    for image in (data / "dog").iterdir():
        image.write_bytes(b"")  # the skips alone would train and validate without the class
    with pytest.raises(DataError, match=r"^No image in the class folder\(s\) 'dog' of .+ can be read: replace"):
        ImageDataModule(data, num_workers=0).setup("fit")
    (data / "dog" / "fine.png").write_bytes((data / "cat" / "0.png").read_bytes())
    ImageDataModule(data, num_workers=0).setup("fit")  # one readable image is enough to train the class


def test_single_folder_is_split_per_class(tmp_path):
    data = ImageDataModule(make_folder(tmp_path, {"cat": 10, "dog": 5}), val_fraction=0.2, num_workers=0)
    data.setup("fit")
    assert data.class_names == ["cat", "dog"]
    assert Counter(label for _, label in data.val_set.samples) == {0: 2, 1: 1}
    assert len(data.train_set) + len(data.val_set) == 15
    assert not {p for p, _ in data.train_set.samples} & {p for p, _ in data.val_set.samples}


@pytest.mark.parametrize("split", ["held out", "folds"])
def test_a_copy_with_accents_spelled_as_macos_spells_them_splits_alike(tmp_path, split):
    # The held-out images of "Grüne Äpfel" differed: a run validated on images it had trained on.
    def images_of(form: str) -> dict[str, list[str]]:
        root = tmp_path / form
        for name in ("Grüne Äpfel", "Birnen"):
            folder = root / unicodedata.normalize(form, name)
            folder.mkdir(parents=True)
            for word in ("Äpfel", "Öl", "Zürich", "Ende", "Anfang", "Übel", "Ort", "Ähre", "Bär", "Ei"):
                Image.new("RGB", (8, 8)).save(folder / unicodedata.normalize(form, f"{word}.png"))
        data = ImageDataModule(
            root, val_fraction=0.3, num_workers=0, **({"num_folds": 3, "fold": 1} if split == "folds" else {})
        )
        data.setup("fit")
        return {name: [unicodedata.normalize("NFC", os.path.relpath(path, root)) for path, _ in dataset.samples]
                for name, dataset in (("train", data.train_set), ("val", data.val_set))}  # fmt: skip

    assert images_of("NFD") == images_of("NFC")


def test_a_class_named_as_a_split_is_a_class(tmp_path):
    # A Train class beside bus and car was read as the training split: "Train has 0 class folder(s)".
    data = ImageDataModule(make_folder(tmp_path, {"bus": 5, "car": 5, "Train": 5}), num_workers=0)
    data.setup("fit")
    assert data.class_names == ["Train", "bus", "car"]
    assert len(data.train_set) + len(data.val_set) == 15
    # Beside a train/ split, a val/ of images alone is still a split: its images are in no class folder.
    other = make_folder(tmp_path / "split" / "train", {"bus": 5, "car": 5}).parent
    (other / "val").mkdir()
    Image.new("RGB", (20, 20)).save(other / "val" / "loose.png")
    with pytest.warns(UserWarning, match=r"1 image\(s\) directly in .*val \(such as loose.png\) are in no class"):
        ImageDataModule(other, num_workers=0).setup("fit")


def test_train_val_test_folders_are_used_as_they_are(tiny_shapes):
    data = ImageDataModule(tiny_shapes, num_workers=0)
    data.setup("fit")
    assert data.class_names == list(CLASSES)
    assert (len(data.train_set), len(data.val_set), len(data.test_set)) == (72, 24, 24)
    assert all("/val/" in path for path, _ in data.val_set.samples)


def test_train_and_val_transforms_stay_separate(tiny_shapes):
    data = ImageDataModule(tiny_shapes, image_size=24, num_workers=0)
    data.setup("fit")
    assert data.train_set.image_transform is not data.val_set.image_transform
    torch.manual_seed(0)
    val_a, val_b = data.val_set[0][0], data.val_set[0][0]
    assert val_a.shape == (3, 24, 24) and torch.equal(val_a, val_b)
    train_views = [data.train_set[0][0] for _ in range(5)]
    assert train_views[0].shape == (3, 24, 24)
    assert any(not torch.equal(train_views[0], view) for view in train_views[1:]), "training is not augmented"


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_settings(tiny_shapes, workers):
    data = ImageDataModule(tiny_shapes, num_workers=workers, batch_size=8)
    data.setup("fit")
    loader = data.train_dataloader()
    assert loader.num_workers == workers
    assert loader.persistent_workers is (workers > 0)
    assert loader.prefetch_factor == (2 if workers else None)
    assert loader.pin_memory is torch.cuda.is_available()
    assert data.val_dataloader().drop_last is False


LOCK = threading.Lock()


class NeedsTheLock(Dataset):
    """Images that need LOCK, as the decoders, allocators and loggers of a real run need theirs."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with LOCK:
            return torch.zeros(3, 8, 8, dtype=torch.uint8), 0


def test_workers_start_while_a_thread_holds_a_lock_they_need(tiny_shapes):
    # A forked worker inherits the lock held, with no thread left to release it: it would never give
    # a batch. (In a run, gloo, W&B or the progress bar hold locks in threads of their own.)
    data = ImageDataModule(tiny_shapes, num_workers=1, batch_size=2)
    data.setup("fit")
    data.train_set = NeedsTheLock()
    loader = data.train_dataloader()
    loader.timeout = 30  # fail instead of waiting forever
    with LOCK:
        batches = iter(loader)  # the worker starts here
    images, labels = next(batches)
    assert images.shape == (2, 3, 8, 8)


def test_auto_workers_leave_a_core_for_training(tiny_shapes):
    count = ImageDataModule(tiny_shapes).worker_count()
    assert 0 <= count <= 8


def test_auto_workers_are_none_for_a_fast_dev_run_unless_asked_for(tiny_shapes):
    trainer = L.Trainer(fast_dev_run=True, accelerator="cpu", logger=False)
    data = ImageDataModule(tiny_shapes)
    data.trainer = trainer
    assert data.worker_count() == 0
    data = ImageDataModule(tiny_shapes, num_workers=2)
    data.trainer = trainer
    assert data.worker_count() == 2


def test_auto_workers_split_the_machine_unless_the_affinity_is_this_process_share(monkeypatch):
    monkeypatch.setattr(data_module.os, "cpu_count", lambda: 64)
    assert auto_workers(64, 8) == 7  # the whole machine: 8 CPUs per device, one of them for training
    assert auto_workers(8, 8) == 7  # a SLURM task bound to 8 CPUs: all 8 are this process's
    assert auto_workers(16, 1) == 15 and auto_workers(64, 1) == 16 and auto_workers(1, 1) == 0


def test_missing_folder_says_how_to_point_at_data(monkeypatch, tmp_path):
    data = ImageDataModule(tmp_path / "nowhere")
    data.prepare_data()
    with pytest.raises(FileNotFoundError, match=r"Point --data.data_dir at a folder of class folders .*\)\.$"):
        data.setup("fit")  # and not data.synthetic, which draws only into data/shapes
    monkeypatch.chdir(tmp_path)
    built_in = ImageDataModule(synthetic=False)
    with pytest.raises(FileNotFoundError, match="or set --data.synthetic=true to draw the built-in shapes dataset"):
        built_in.setup("fit")


def test_synthetic_data_knows_its_classes_before_it_is_drawn(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    data = ImageDataModule(synthetic=True)
    assert data.class_names == list(CLASSES) and not (tmp_path / "data").exists()


def test_the_built_in_shapes_are_drawn_only_at_the_default_path_and_said(monkeypatch, caplog, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="Data folder data/shpes does not exist: fix --data.data_dir"):
        ImageDataModule("data/shpes", synthetic=True)  # a misspelt path is not a request for shapes
    assert not (tmp_path / "data").exists()
    ImageDataModule(synthetic=True).prepare_data()
    assert "Drew the built-in shapes dataset into data/shapes" in caplog.text
    assert sorted(path.name for path in (tmp_path / "data" / "shapes").iterdir()) == ["test", "train", "val"]


def test_one_class_is_refused(tmp_path):
    data = ImageDataModule(make_folder(tmp_path, {"cat": 3}))
    with pytest.raises(ValueError, match="at least two"):
        data.setup("fit")


def test_empty_class_folder_is_named(tmp_path):
    make_folder(tmp_path, {"cat": 3, "dog": 3})
    (tmp_path / "bird").mkdir()
    data = ImageDataModule(tmp_path, num_workers=0)
    with pytest.raises(ValueError, match="bird"):
        data.setup("fit")


def test_val_class_unknown_to_training_is_refused(tmp_path):
    make_folder(tmp_path / "train", {"cat": 3, "dog": 3})
    make_folder(tmp_path / "val", {"cat": 1, "fox": 1})
    with pytest.raises(ValueError, match="fox"):
        ImageDataModule(tmp_path, num_workers=0).setup("fit")


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "CMYK"])
def test_images_of_any_mode_become_rgb(tmp_path, mode):
    path = tmp_path / ("image.jpg" if mode == "CMYK" else "image.png")
    Image.new(mode, (9, 7)).save(path)
    image = read_rgb(str(path))
    assert image.shape == (3, 7, 9) and image.dtype == torch.uint8


def test_formats_torchvision_cannot_decode_fall_back_to_pil(tmp_path):
    Image.new("RGB", (9, 7), (1, 2, 3)).save(tmp_path / "image.bmp")
    assert read_rgb(str(tmp_path / "image.bmp"))[:, 0, 0].tolist() == [1, 2, 3]


def test_val_folder_beside_class_folders_is_refused_not_trained_on(tmp_path):
    make_folder(tmp_path, {"cat": 3, "dog": 3})
    make_folder(tmp_path / "val", {"cat": 1, "dog": 1})
    with pytest.raises(ValueError, match="has val/ but no train/"):
        ImageDataModule(tmp_path, num_workers=0).setup("fit")


def test_hidden_files_and_symlink_loops_are_not_samples(tmp_path):
    make_folder(tmp_path, {"cat": 2, "dog": 2})
    (tmp_path / "cat" / "._0.png").write_bytes(b"AppleDouble")
    make_folder(tmp_path / "cat" / ".ipynb_checkpoints", {"copy": 1})
    (tmp_path / "dog" / "loop").symlink_to(tmp_path)
    data = ImageDataModule(tmp_path, num_workers=0, val_fraction=0.5)
    data.setup("fit")
    paths = [path for path, _ in data.train_set.samples + data.val_set.samples]
    assert len(paths) == 4 and not any("/." in path for path in paths)


def test_every_stretch_of_the_validation_images_holds_every_class(tiny_shapes, tmp_path):
    # A validation cut short (limit_val_batches) took its batches in class order: all of the first class.
    data = ImageDataModule(tiny_shapes, num_workers=0)
    data.setup("fit")
    labels = [label for _, label in data.val_set.samples]  # 4 of each of the 6 classes
    assert [sorted(labels[start : start + 6]) for start in range(0, 24, 6)] == [list(range(6))] * 4
    make_folder(tmp_path, {"cat": 4, "dog": 8})
    data = ImageDataModule(tmp_path, num_workers=0, val_fraction=0.5)  # 2 cats and 4 dogs held out
    data.setup("fit")
    assert [label for _, label in data.val_set.samples] == [1, 0, 1, 1, 0, 1]  # at 1/8, 1/4, 3/8, 5/8, 3/4, 7/8


def test_a_fit_says_how_many_images_each_split_holds(caplog, tiny_shapes, tmp_path):
    ImageDataModule(tiny_shapes, num_workers=0).setup("fit")
    said = "Data: 72 training and 24 validation image files in 6 classes (12 training files a class) from"
    assert f"{said} {tiny_shapes}\n" in caplog.text
    make_folder(tmp_path, {"cat": 4, "dog": 9})  # no val/: a quarter of each class held out, 1 and round(2.25)
    ImageDataModule(tmp_path, num_workers=0, val_fraction=0.25).setup("fit")
    said = "Data: 10 training and 3 validation image files in 2 classes (3 to 7 training files a class) from"
    assert f"{said} {tmp_path}; no val/ folder, so validating on 0.25 of each class held out" in caplog.text
    make_folder(tmp_path / "one", {"train/cat": 1, "train/dog": 1, "val/cat": 1, "val/dog": 1})
    ImageDataModule(tmp_path / "one", num_workers=0).setup("fit")
    assert "in 2 classes (1 training file a class) from" in caplog.text


def test_split_folders_are_read_under_the_names_datasets_give_them_in_any_case(caplog, tmp_path):
    # Kaggle's Train/ and Test/ were trained on as two classes named so, and Roboflow's valid/ left unread.
    for split in ("Train", "valid", "Test"):
        make_folder(tmp_path / split, {"cat": 3, "dog": 2})
    data = ImageDataModule(tmp_path, num_workers=0)
    data.setup("fit")
    assert data.class_names == ["cat", "dog"]
    assert [len(split.samples) for split in (data.train_set, data.val_set, data.test_set)] == [5, 5, 5]
    assert f"from {tmp_path}; Train/ as train/; valid/ as val/; Test/ as test/\n" in caplog.text
    make_folder(tmp_path / "val", {"cat": 1, "dog": 1})
    with pytest.raises(DataError, match=" has val/ and valid/, each a val split.s name: merge them into one"):
        ImageDataModule(tmp_path, num_workers=0).setup("fit")


def test_a_linked_folder_inside_a_class_folder_is_not_followed_and_said_so(tmp_path):
    make_folder(tmp_path / "data", {"cat": 2, "dog": 2})
    make_folder(tmp_path / "more", {"cats": 3})
    (tmp_path / "data" / "cat" / "extra").symlink_to(tmp_path / "more" / "cats")
    with pytest.warns(UserWarning, match=r"^1 linked folder\(s\) in the class folders of .+ \(such as cat/extra\) "
                      "are not followed, as a link to a parent would give"):  # fmt: skip
        samples = folders.find_images(tmp_path / "data", ["cat", "dog"])
    assert len(samples) == 4


def test_class_folders_named_in_another_unicode_form_are_the_same_classes(tmp_path):
    # A val/ copied on macOS or out of a zip spells é as e and an accent: "class folders the training data lacks".
    make_folder(tmp_path / "train", {"caf\u00e9": 2, "d\u00e9j\u00e0": 2})
    make_folder(tmp_path / "val", {"cafe\u0301": 1, "de\u0301ja\u0300": 1})
    data = ImageDataModule(tmp_path, num_workers=0)
    data.setup("fit")
    assert data.class_names == ["caf\u00e9", "d\u00e9j\u00e0"]
    assert sorted(label for _, label in data.val_set.samples) == [0, 1]
    assert folders.find_classes(tmp_path / "val") == data.class_names


@pytest.mark.parametrize("split", ["train", "val"])
def test_two_class_folders_named_alike_in_two_unicode_forms_are_refused(tmp_path, split):
    # A macOS copy merged into a Linux one: both read one folder under two labels, the other's images unread.
    make_folder(tmp_path / "train", {"caf\u00e9": 2, "th\u00e9": 2} | ({"cafe\u0301": 2} if split == "train" else {}))
    make_folder(tmp_path / "val", {"caf\u00e9": 1, "th\u00e9": 1} | ({"cafe\u0301": 1} if split == "val" else {}))
    said = f"{tmp_path / split} has two class folders named 'caf\u00e9', spelled 'cafe\\u0301' and 'caf\\xe9' "
    with pytest.raises(DataError, match=re.escape(f"{said}(accents written two ways): move the images of one into")):
        ImageDataModule(tmp_path, num_workers=0).setup("fit")


def test_an_evaluation_with_a_val_folder_reads_nothing_of_the_training_images(tmp_path):
    # It listed them all (minutes for millions on a network file system) and warned of their files.
    make_folder(tmp_path / "train", {"cat": 3, "dog": 3})
    make_folder(tmp_path / "val", {"cat": 1, "dog": 2})
    (tmp_path / "train" / "cat" / "scraped.heic").write_bytes(b"")
    for stage, warned in ("validate", []), ("fit", ["Skipped 1 image file(s) under"]):
        data = ImageDataModule(tmp_path, num_workers=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            data.setup(stage)
        assert [str(warning.message)[:29] for warning in caught if "Skipped" in str(warning.message)] == warned
        assert len(data.val_set) == 3


def test_a_data_dir_under_the_home_folder_is_found_as_a_config_file_writes_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    make_folder(tmp_path / "datasets" / "pets", {"cat": 2, "dog": 2})
    data = ImageDataModule("~/datasets/pets", num_workers=0)  # no shell expands ~ in a YAML file
    assert (data.class_names, data.hparams.data_dir) == (["cat", "dog"], f"{tmp_path}/datasets/pets")


def test_images_of_types_not_read_or_outside_the_class_folders_are_counted_in_one_warning(tmp_path):
    # An iPhone's .heic photos or a scrape's files saved with no extension were left out without a word:
    # classes smaller than the user thinks. Other files (notes, label lists) are no images and pass unsaid.
    make_folder(tmp_path, {"cat": 2, "dog": 2})
    for name in ("cat/a.HEIC", "cat/b.heic", "dog/c.avif", "dog/notes.txt", "dog/.hidden.gif", "dog/LICENSE"):
        (tmp_path / name).write_bytes(b"")
    for name in "xyz":  # PNGs saved with no extension
        shutil.copy(tmp_path / "dog" / "0.png", tmp_path / "dog" / name)
    (tmp_path / "b.png").write_bytes(b"")
    (tmp_path / "a.jpg").write_bytes(b"")  # beside the class folders: no class of its own
    data = ImageDataModule(tmp_path, num_workers=0, val_fraction=0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data.setup("fit")
    assert [str(warning.message) for warning in caught if "directly in" in str(warning.message)] == [
        f"2 image(s) directly in {tmp_path} (such as a.jpg) are in no class folder, so are left out: move each into "
        "the folder of its class."
    ]
    said = [str(warning.message) for warning in caught if "Skipped" in str(warning.message)]
    assert said == [f"Skipped 6 image file(s) under {tmp_path} of types not read (3 with no extension, 2 .heic, 1 "
                    ".avif): convert or rename them to .jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, .webp, .gif, "
                    ".jfif, .jpe to use them."]  # fmt: skip
    assert len(data.train_set.samples + data.val_set.samples) == 4


def trainer_of(processes: int) -> SimpleNamespace:
    """What the data module reads of the Trainer of rank 0 of `processes`, in the first epoch."""
    first_epoch = SimpleNamespace(epoch_progress=SimpleNamespace(current=SimpleNamespace(processed=0)))
    shards = {"num_replicas": processes, "rank": 0}
    return SimpleNamespace(world_size=processes, num_devices=processes, accelerator=None, global_rank=0,
                           distributed_sampler_kwargs=shards, fit_loop=first_epoch, validating=False)  # fmt: skip


def test_every_process_keeps_a_full_batch(tiny_shapes):
    data = ImageDataModule(tiny_shapes, batch_size=40, num_workers=0)
    data.setup("fit")
    data.trainer = trainer_of(2)
    # 72 images over 2 processes is 36 each: dropping the last short batch would leave none.
    assert data.train_dataloader().drop_last is False


@pytest.mark.parametrize(
    ("classes", "processes", "batch_size", "trained"),
    [
        # 24 training images: batches of 16 leave 8 (half a batch: kept), of 7 leave 3, of 23 leave 1 (dropped).
        ({"cat": 15, "dog": 15}, 1, 16, 24),
        ({"cat": 15, "dog": 15}, 1, 7, 21),
        ({"cat": 15, "dog": 15}, 1, 23, 23),
        # 25 over 2 processes: 13 each (one image twice, as DistributedSampler evens them), in batches of 5.
        ({"cat": 16, "dog": 15}, 2, 5, 13),
    ],
)
def test_an_epoch_keeps_a_last_batch_of_half_a_batch_or_more(tmp_path, classes, processes, batch_size, trained):
    data = ImageDataModule(make_folder(tmp_path, classes), num_workers=0, batch_size=batch_size)
    data.setup("fit")
    assert len(data.train_set) == sum(classes.values()) - 6  # 3 of each class validate
    data.trainer = trainer_of(processes)
    assert sum(len(labels) for _, labels in data.train_dataloader()) == trained


def test_hyperparameters_hold_plain_types(tmp_path):
    data = ImageDataModule(tmp_path / "images")
    assert data.hparams.data_dir == str(tmp_path / "images")


def test_exif_orientation_is_applied(tmp_path):
    image = Image.new("RGB", (40, 20))
    exif = image.getexif()
    exif[0x0112] = 6  # rotated 90 degrees: shown 20 wide and 40 high
    for suffix in ("jpg", "png", "webp", "tiff"):
        image.save(tmp_path / f"photo.{suffix}", exif=exif)
        assert read_rgb(str(tmp_path / f"photo.{suffix}")).shape == (3, 40, 20), suffix
        assert read_rgb((tmp_path / f"photo.{suffix}").read_bytes()).shape == (3, 40, 20), f"{suffix} in memory"


def test_a_gif_and_a_jfif_are_read_from_the_class_folders_an_animated_gif_as_its_first_frame(tmp_path):
    # They were left out as types not read, though read_rgb decodes them; an animated GIF came as all its frames.
    make_folder(tmp_path, {"cat": 2, "dog": 2})
    frames = [Image.new("RGB", (12, 8), (value, 0, 0)) for value in (200, 30, 90)]
    frames[0].save(tmp_path / "cat" / "moving.gif", save_all=True, append_images=frames[1:], duration=100)
    Image.new("RGB", (12, 8), (0, 200, 0)).save(tmp_path / "dog" / "saved.jfif", format="JPEG")
    assert read_rgb(str(tmp_path / "cat" / "moving.gif")).shape == (3, 8, 12)
    assert read_rgb((tmp_path / "cat" / "moving.gif").read_bytes()).shape == (3, 8, 12)  # its bytes, decoded alike
    assert read_rgb(str(tmp_path / "cat" / "moving.gif"))[0, 0, 0] > 150  # the first frame's red
    data = ImageDataModule(tmp_path, num_workers=0, val_fraction=0.3)
    data.setup("fit")
    read = [Path(path).name for path, _ in data.train_set.samples + data.val_set.samples]
    assert {"moving.gif", "saved.jfif"} <= set(read) and len(read) == 6


def test_an_animated_gif_is_read_without_decoding_its_other_frames(monkeypatch, tmp_path):
    # torchvision decoded every frame, and the first was kept: a GIF of a few MB took GBs.
    frames = [Image.new("RGB", (12, 8), (value, 0, 0)) for value in (200, 30, 90)]
    frames[0].save(tmp_path / "moving.gif", save_all=True, append_images=frames[1:], duration=100)
    (tmp_path / "moving.jpg").write_bytes((tmp_path / "moving.gif").read_bytes())  # misnamed: torchvision decodes it
    assert read_rgb(str(tmp_path / "moving.jpg"))[:, 0, 0].tolist() == [200, 0, 0]
    monkeypatch.setattr(images_module, "decode_image", lambda *args, **kwargs: pytest.fail("every frame decoded"))
    assert read_rgb(str(tmp_path / "moving.gif"))[:, 0, 0].tolist() == [200, 0, 0]
    assert read_rgb((tmp_path / "moving.gif").read_bytes())[:, 0, 0].tolist() == [200, 0, 0]


@pytest.mark.parametrize("split", ["val", "test"])
def test_held_out_images_may_lack_a_class_but_not_every_class(tmp_path, split):
    # An empty class folder among them is a class they lack, as a missing one; with every one empty there
    # is nothing to evaluate, which Lightning let pass with a note on a loader of length zero.
    make_folder(tmp_path / "train", {"cat": 3, "dog": 3})
    make_folder(tmp_path / split, {"cat": 1})
    (tmp_path / split / "dog").mkdir()
    stage = {"val": "validate", "test": "test"}[split]
    ImageDataModule(tmp_path, num_workers=0).setup(stage)
    (tmp_path / split / "cat" / "0.png").unlink()
    with pytest.raises(DataError, match=rf"No images .* in the class folder\(s\) 'cat', 'dog' of {tmp_path / split}:"):
        ImageDataModule(tmp_path, num_workers=0).setup(stage)


def test_16_bit_grey_tiff_keeps_its_levels(tmp_path):
    Image.fromarray(np.full((4, 4), 32768, dtype=np.uint16)).save(tmp_path / "grey.tif")
    assert read_rgb(str(tmp_path / "grey.tif"))[:, 0, 0].tolist() == [127, 127, 127]


def test_float_grey_tiff_keeps_its_levels(tmp_path):
    Image.fromarray(np.array([[0.0, 0.5], [1.0, np.nan]], dtype=np.float32)).save(tmp_path / "unit.tif")
    assert read_rgb(str(tmp_path / "unit.tif"))[0].tolist() == [[0, 127], [255, 0]]
    Image.fromarray(np.array([[0.0, 100.0], [255.0, 300.0]], dtype=np.float32)).save(tmp_path / "levels.tif")
    assert read_rgb(str(tmp_path / "levels.tif"))[0].tolist() == [[0, 100], [255, 255]]


def with_broken_images(root):
    make_folder(root, {"cat": 4, "dog": 4})
    good = (root / "cat" / "0.png").read_bytes()
    (root / "cat" / "truncated.png").write_bytes(good[: len(good) // 2])
    (root / "dog" / "garbage.jpg").write_bytes(b"not an image at all")
    return root


def test_unreadable_images_are_skipped_with_a_warning_naming_them(tmp_path):
    data = ImageDataModule(with_broken_images(tmp_path), num_workers=0, batch_size=16, val_fraction=0.1)
    data.setup("fit")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        images, labels = next(iter(data.train_dataloader()))
    skipped = [str(w.message) for w in caught if "unreadable image" in str(w.message)]
    assert any("garbage.jpg" in message for message in skipped)
    assert len(labels) == len(data.train_set) - len(skipped)


def test_an_empty_file_is_said_to_be_empty(tmp_path):
    (tmp_path / "photo.jpg").write_bytes(b"")
    for source in (str(tmp_path / "photo.jpg"), b""):
        with pytest.raises(OSError, match="^an empty file$"):  # not "not an image format"
            read_rgb(source)


def test_an_image_too_large_for_pil_is_skipped_as_unreadable(monkeypatch, tmp_path):
    # PIL's guard against decompression bombs raises an error of its own: it stopped fit with a traceback.
    make_folder(tmp_path, {"cat": 4, "dog": 4})
    Image.new("RGB", (60, 50)).save(tmp_path / "cat" / "!large.bmp")  # PIL's, not torchvision's, to decode
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = ImageDataModule(tmp_path, num_workers=0, batch_size=16, val_fraction=0.1)
    data.setup("fit")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(data.train_dataloader()) + list(data.val_dataloader())
    (skipped,) = [str(w.message) for w in caught if "unreadable image" in str(w.message)]
    assert "!large.bmp (more than 2,000 pixels, the most PIL opens" in skipped, skipped


def test_an_unreadable_image_is_named_once_whichever_data_worker_reads_it(tmp_path):
    # Each persistent worker process warned once per message: the image was named once by each worker
    # that met it, epoch after epoch (up to num_workers times: auto gives up to a CPU's count).
    with_broken_images(tmp_path)
    epochs = f"""
import torch
from torch.utils.data import DataLoader
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.datasets.images import collate_readable
data = ImageDataModule({str(tmp_path)!r}, num_workers=0, val_fraction=0.1)
data.setup("fit")
torch.manual_seed(0)  # the order, and so which worker reads each image, changes from epoch to epoch
loader = DataLoader(data.train_set, batch_size=4, shuffle=True, drop_last=True, collate_fn=collate_readable,
                    num_workers=2, persistent_workers=True, multiprocessing_context="forkserver")
for epoch in range(6):
    list(loader)
"""
    command = [sys.executable, "-c", epochs]
    done = subprocess.run(command, capture_output=True, text=True, env=command_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    named = re.findall(r"Skipping the unreadable image .*/(\S+) \(", done.stderr)
    assert sorted(named) == ["garbage.jpg", "truncated.png"], done.stderr[-3000:]


def test_a_batch_of_unreadable_images_alone_stops_training_with_the_fix_and_comes_empty_to_evaluations(tmp_path):
    # An evaluation stopped with the training's error: one process's share of a small split (under DDP)
    # or a batch of one can be all unreadable, which an evaluation skips as it skips one image.
    with_broken_images(tmp_path / "train"), with_broken_images(tmp_path / "val")
    data = ImageDataModule(tmp_path, num_workers=0, batch_size=1, image_size=32)
    data.setup("fit")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batches = list(data.val_dataloader())
        named = [paths for _, paths in data.predict_dataloader()]
        fix = r"training batch \(1\) was unreadable.*: remove or replace the files the warnings above name"
        with pytest.raises(DataError, match=fix):
            list(data.train_dataloader())
    assert sorted(len(labels) for _, labels in batches) == [0, 0, *[1] * 8]
    assert {(images.shape[1:], images.dtype, labels.dtype) for images, labels in batches} == {
        ((3, 32, 32), torch.uint8, torch.int64)
    }
    assert sorted(map(len, named)) == [0, 0, *[1] * 8] and all(isinstance(paths, tuple) for paths in named)


def test_unreadable_image_can_stop_the_run_naming_the_file(tmp_path):
    data = ImageDataModule(with_broken_images(tmp_path), num_workers=2, batch_size=16, bad_images="error")
    data.setup("fit")
    with pytest.raises(Exception, match=r"Cannot read the image .*(garbage\.jpg|truncated\.png)"):
        list(data.train_dataloader())


def test_batches_travel_as_uint8_and_become_normalised_floats_on_the_device(tiny_shapes):
    data = ImageDataModule(tiny_shapes, num_workers=0, batch_size=8, image_size=32)
    data.setup("fit")
    images, labels = next(iter(data.val_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (8, 3, 32, 32)
    normalised, same_labels = data.on_after_batch_transfer((images, labels), 0)
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    assert normalised.dtype == torch.float32 and torch.allclose(normalised, (images / 255 - mean) / std, atol=1e-6)
    assert same_labels is labels


def test_batches_take_the_precisions_input_type_once_they_are_floats(monkeypatch, in_project_copy, tiny_shapes):
    # bf16-true (like DeepSpeed's bf16) holds the weights in bfloat16: a float32 batch stopped the first
    # convolution ("Input type (torch.FloatTensor) and weight type (CPUBFloat16Type) should be the same").
    bf16_true = ["--trainer.precision=bf16-true", "--trainer.fast_dev_run=true"]
    run_cli(monkeypatch, "fit", *ON_CPU, *bf16_true, *on_data(tiny_shapes))


LOADER_LEFT_OPEN = """
import sys
from {{ cookiecutter.package_name }}.data import ImageDataModule

if __name__ == "__main__":
    data = ImageDataModule(sys.argv[1], num_workers=2, batch_size=8, image_size=32)
    data.setup("fit")
    batches = iter(data.train_dataloader())
    next(batches)
    print("done", flush=True)
"""


def test_a_process_whose_workers_are_still_up_exits_at_once(tiny_shapes, tmp_path):
    # The workers leave others' SIGTERMs to the training process, not its own: multiprocessing ends
    # the workers it left running with one as the process exits.
    script = tmp_path / "open_loader.py"
    script.write_text(LOADER_LEFT_OPEN)
    command = [sys.executable, str(script), str(tiny_shapes)]
    process = subprocess.Popen(command, env=command_env(), stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout.readline().strip() == "done"
        printed = time.monotonic()
        process.wait(timeout=60)
        assert time.monotonic() - printed < 5, "the process hung at exit on its data workers"
    finally:
        kill_group(process)


LOADER_SIGNALLED = """
import os
import re
import signal
import sys
import time
from {{ cookiecutter.package_name }}.data import ImageDataModule

if __name__ == "__main__":
    handled, stop = sys.argv[2] == "handled", getattr(signal, sys.argv[3] if len(sys.argv) > 3 else "SIGTERM")
    if handled:  # noted and left for later, as Lightning's handler does (and fit's, of SLURM's SIGUSR1)
        signal.signal(stop, lambda *_: None)
    data = ImageDataModule(sys.argv[1], num_workers=2, batch_size=8, image_size=32)
    data.setup("fit")
    batches = iter(data.train_dataloader())
    if handled and os.fork() == 0:  # a first one while the workers start, from another process
        os.killpg(0, stop)
        os._exit(0)
    next(batches)
    print("ready", flush=True)
    sys.stdin.readline()  # the SIGTERM to the whole group has come
    time.sleep(7)  # longer than PyTorch's workers take to see that their parent has ended (5 s)
    print("batches", 1 + sum(1 for _ in batches), flush=True)
"""


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGUSR1"])
def test_a_sigterm_to_the_process_group_leaves_the_data_workers_of_the_default_start_method_reading(
    tiny_shapes, tmp_path, stop
):
    # scancel and `timeout` signal every process of the group, the fork server that starts the
    # workers too, at any moment (here as the workers start, and once they run); the command reads
    # batches until its checkpoint is saved, and the workers must live. SLURM's --signal=USR1 too,
    # which Lightning's docs give: its default ended the workers, and the run failed unsaved.
    script = tmp_path / "signalled_loader.py"
    script.write_text(LOADER_SIGNALLED)
    command = [sys.executable, str(script), str(tiny_shapes), "handled", stop]
    process = subprocess.Popen(
        command, env=command_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert process.stdout.readline().strip() == "ready", process.stderr.read()[-3000:]
        os.killpg(process.pid, getattr(signal, stop))
        out, err = process.communicate("\n", timeout=120)
        assert process.returncode == 0, err[-3000:]
        assert out.split() == ["batches", "9"]  # 72 training images in batches of 8
    finally:
        kill_group(process)


def running_in_group(group: int) -> list[int]:
    """The processes of a process group that run (zombies left for an init that does not reap excluded)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, _, process_group = stat.read_text().rpartition(")")[2].split()[:3]
            if int(process_group) == group and state not in ("Z", "X"):
                found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table in /proc")
def test_a_command_that_a_sigterm_ends_leaves_no_data_worker_behind(tiny_shapes, tmp_path):
    # No handler (a script of the user's that reads batches): the SIGTERM ends the command at once,
    # and its workers and the fork server must follow, not wait for a signal that never comes.
    script = tmp_path / "signalled_loader.py"
    script.write_text(LOADER_SIGNALLED)
    command = [sys.executable, str(script), str(tiny_shapes), "unhandled"]
    process = subprocess.Popen(command, env=command_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)  # fmt: skip
    try:
        assert process.stdout.readline().strip() == "ready"
        assert len(running_in_group(process.pid)) >= 4  # the command, the fork server, 2 workers
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=60) == -signal.SIGTERM
        deadline = time.monotonic() + 20
        while running_in_group(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running_in_group(process.pid) == [], "data workers or the fork server outlived their command"
    finally:
        kill_group(process)
