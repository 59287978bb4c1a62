"""ImageDataModule: ImageFolder-style data, split, transformed and loaded."""

import functools
{%- if cookiecutter.streaming == "yes" %}
import inspect
{%- endif %}
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Literal

import lightning as L
import torch
from lightning.fabric.utilities.seed import pl_worker_init_function
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Dataset, Sampler
from torchvision.transforms import v2

from .datasets import shapes
from .datasets.folders import (
    SPLIT_NAMES,
    check_val_fraction,
    find_classes,
    fold_pool,
    fold_samples,
    has_test_folder,
    split_folder,
    split_samples,
    train_folder,
)
from .datasets.images import ImageFiles, collate_readable
from .datasets.sampling import (
    ClassBalancedSampler,
    EpochSampler,
    epoch_restarts,
    imbalance_warning,
    run_seed,
    unevaluated_warning,
)
from .errors import ConfigError, DataError, MissingError, changed_settings, check_choices
from .hardware.sharding import shards_weights
from .training import sigterm
from .training.progress import ends_before, next_epoch
from .training.resume import interrupts_an_epoch
from .transforms import (
    Augment,
    Interpolation,
    Preprocessing,
    ScheduledAugmentation,
    resolve_preprocessing,
    train_transform,
)


class ImageDataModule(L.LightningDataModule):
    """Images in class folders: `data_dir/<class>/*.jpg`, or `data_dir/{train,val,test}/<class>/*.jpg`
{%- if cookiecutter.streaming == "yes" %};
    or the same sharded into LitData's streaming chunks by the `shard` command (format "streaming",
    which StreamingDataModule below reads)
{%- endif %}.

    With one set of class folders (or `train/` without `val/`), a seeded split stratified by class
    holds out `val_fraction` of each class for validation. With `num_folds`, the training images (all
    of them, or train/'s) are cut into that many seeded folds stratified by class instead, and `fold`
    is validated on{{ ": cross-validation (the `cv` command)" if cookiecutter.experiments == "yes" }}; a val/ folder is then left unused.

    Args:
{%- if cookiecutter.streaming == "yes" %}
        data_dir: The image folder; with format "streaming", the folder or URL (s3://...) `shard` wrote.
        format: "folder" reads image files; "streaming" reads the chunks of `shard`, which pays off for
            hundreds of thousands of small files, on network file systems and in object storage, and
            resumes a preempted run from the next unseen image rather than the start of its epoch.
        cache_dir: Streaming from a URL: the local folder of downloaded chunks (node-local disk on a
            cluster). Unset: LitData's cache folder.
        max_cache_size: Streaming from a URL: the most disk the cache takes ("50GB").
{%- else %}
        data_dir: The image folder.
{%- endif %}
        synthetic: Draw the built-in shapes dataset into data/shapes (the default data_dir) when it is
            not there yet. A data_dir elsewhere that does not exist is an error, never drawn into.
        batch_size: Images per device and step (the effective batch is this x devices x nodes x
            gradient accumulation).
        num_workers: Data loading processes per device; "auto" picks from the CPUs per device (none
            for a fast_dev_run).
        image_size: Side in pixels of the square images the model sees.
        val_fraction: Share of each class held out for validation when there is no `val/` folder.
        split_seed: Seed of that split (or of the folds); keep it fixed so validation images never
            leak into training (an image added or removed moves at most one other across the split).
        num_folds: Cut the training images into this many stratified folds (2 or more), one of which
            is validated on (cross-validation).
        fold: The fold validated on, from 0 to num_folds - 1.
        augment: Training augmentation: "basic" (random crop and the flips below), "trivialaugment",
            "randaugment" or "autoaugment" (basic, then that policy's colour and geometry changes, as
            in torchvision's reference recipes), or "none" (the evaluation resize and crop only).
        hflip: Flip training images left-right at random. Turn it off where the mirror image is
            another thing (text, digits, some medical and satellite images).
        vflip: Flip training images upside down at random (aerial, microscopy and other images
            without an up).
        min_crop_scale: Smallest image area kept by the training random crop.
        random_erasing: Probability of erasing a random rectangle of each training image (to the
            mean colour); 0.25 is the reference recipes' value.
        basic_augment_epochs: Train this many epochs first with the basic augmentation, then add
            `augment`'s policy and random erasing: a model that has not fitted the data yet learns
            from them slowly (10-epoch runs lost 5 points on Fashion-MNIST), so a short run stays basic.
        crop_ratio: Evaluation resizes the shorter side to image_size / crop_ratio, then centre-crops
            image_size (0.875: 256 then 224). Unset: the pretrained weights' own, else 1.0.
        interpolation: Resampling of every resize and crop. Unset: the pretrained weights' own, else
            bilinear.
        mean: Per-channel mean subtracted from images scaled to [0, 1]. Unset: the pretrained
            weights' own, else ImageNet's.
        std: Per-channel standard deviation images are divided by. Unset: as for mean.
        pretrained_backbone: The backbone whose pretrained weights' preprocessing fills what is
            unset above; the CLI sets it from model.backbone when model.pretrained is true.
        prefetch_factor: Batches each worker loads ahead.
        balanced_sampling: Draw training images so that every class comes up alike (with
            replacement; an epoch is still as many images as the data has), each process taking
            its share under DDP. For strongly imbalanced data; model.class_weights is the other remedy.
        bad_images: What an unreadable (corrupt, truncated) image does: "skip" it with a warning
            that names the file, or stop with an "error" that names it.
        worker_start_method: How data workers start. "forkserver" (spawn on macOS and Windows): each
            forks from a single-threaded helper process that imported this module once (about 2.5 s
            and one more process holding torch, per training process). A plain "fork" of a run that
            has threads (gloo, NCCL, loggers) can deadlock a worker before its first batch; keep it
            for notebooks whose own classes the workers must see. With forkserver or spawn, a script
            of yours that starts workers needs an `if __name__ == "__main__":` guard.
    """

    data_format = "folder"  # what a checkpoint's position in an epoch is a position in
    loader_class = DataLoader

    def __init__(
        self,
        data_dir: str | Path = shapes.BUILT_IN_SHAPES,
{%- if cookiecutter.streaming == "yes" %}
        format: Literal["folder", "streaming"] = "folder",
        cache_dir: str | None = None,
        max_cache_size: str = "50GB",
{%- endif %}
        synthetic: bool = False,
        batch_size: int = 64,
        num_workers: int | Literal["auto"] = "auto",
        image_size: int = {{ cookiecutter.image_size }},
        val_fraction: float = 0.2,
        split_seed: int = 0,
        num_folds: int | None = None,
        fold: int = 0,
        augment: Augment = "basic",
        hflip: bool = True,
        vflip: bool = False,
        min_crop_scale: float = 0.35,
        random_erasing: float = 0.0,
        basic_augment_epochs: int = 0,
        crop_ratio: float | None = None,
        interpolation: Interpolation | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        pretrained_backbone: str | None = None,
        prefetch_factor: int = 2,
        balanced_sampling: bool = False,
        bad_images: Literal["skip", "error"] = "skip",
        worker_start_method: Literal["forkserver", "spawn", "fork"] = "forkserver",
    ) -> None:
        super().__init__()
{%- if cookiecutter.streaming == "yes" %}
        if format == "streaming" and not isinstance(self, StreamingDataModule):
            if type(self) is not ImageDataModule:  # becoming StreamingDataModule would drop its overrides
                raise ConfigError(f"{type(self).__name__} reads image folders: for --data.format streaming, subclass "
                                  "StreamingDataModule instead")  # fmt: skip
            # This object becomes the subclass that reads the shards: one class, and so one set of
            # options, for the CLI and the config files, whichever the format.
            self.__class__ = StreamingDataModule
            defaults = inspect.signature(ImageDataModule.__init__).parameters
            given = {"val_fraction": val_fraction, "split_seed": split_seed}
            if ignored := [f"data.{name}" for name, value in given.items() if value != defaults[name].default]:
                split = "the shards hold the split that `shard` made (its --val_fraction and --split_seed)"
                rank_zero_warn(f"{' and '.join(ignored)}: {split}; shard again to split otherwise.")
{%- endif %}
        check_choices(ImageDataModule.__init__, locals(), "data")
        counts = {"batch_size": batch_size, "prefetch_factor": prefetch_factor}  # image_size: Preprocessing
        for name, value in counts.items():
            if value < 1:
                raise ConfigError(f"data.{name} must be 1 or more, got {value}")
        if basic_augment_epochs < 0:
            raise ConfigError(f"data.basic_augment_epochs must be 0 or more, got {basic_augment_epochs}")
        if num_workers != "auto" and num_workers < 0:
            raise ConfigError(f"data.num_workers must be 0 or more (or auto), got {num_workers}")
        check_val_fraction(val_fraction, "data.val_fraction")
        if not 0 < min_crop_scale <= 1:
            raise ConfigError(f"data.min_crop_scale must be above 0 and at most 1, got {min_crop_scale}")
        if not 0 <= random_erasing <= 1:
            raise ConfigError(f"data.random_erasing must be a probability (0 to 1), got {random_erasing}")
        if num_folds is not None and not (num_folds >= 2 and 0 <= fold < num_folds):
            raise ConfigError(
                f"data.num_folds must be 2 or more and data.fold from 0 to num_folds - 1, got {num_folds} and {fold}"
            )
        self.save_hyperparameters()
        data_dir = os.path.expanduser(data_dir)  # no shell expands a config file's ~/datasets/...
        self.hparams.data_dir = data_dir  # a str: checkpoints must load with weights_only=True
        self._check_source()
        # Listed here, before a logger or a trainer starts, so that too many folds end in one line;
        # setup splits this list rather than walking the folder again.
        self._fold_pool = None
        if num_folds is not None and Path(data_dir).is_dir():
            self._fold_pool = fold_pool(Path(data_dir), num_folds)
        self.preprocessing = resolve_preprocessing(
            image_size, pretrained_backbone, crop_ratio=crop_ratio, interpolation=interpolation, mean=mean, std=std
        )
        self.data_dir = Path(data_dir)
        self.batch_size = batch_size
        self._class_names: list[str] | None = None
        self._epoch_position: dict | None = None  # where a resumed run's interrupted epoch goes on
        self._resumed_epoch: int | None = None  # the epoch a resumed run trains first
        self._train_loader: DataLoader | None = None  # the newest, which a checkpoint read later resumes
        self.train_set = self.val_set = self.test_set = None
        self._splits_checked = False
        self.predicted_split: str | None = None  # "test", or "val" without a test split

    def _check_source(self) -> None:
        """Refuse, before a logger or a trainer starts, data options this format cannot read."""
        data_dir = self.hparams.data_dir
        if self.hparams.synthetic and not Path(data_dir).exists() and not shapes.is_built_in(data_dir):
            raise MissingError(
                f"Data folder {data_dir} does not exist: fix --data.data_dir. (data.synthetic draws the built-in "
                f"shapes only into {shapes.BUILT_IN_SHAPES}, the default data_dir.)"
            )

    @property
    def class_names(self) -> list[str]:
        if self._class_names is None:
            if self.hparams.synthetic and not self.data_dir.exists():
                self._class_names = list(shapes.CLASSES)
            else:
                self._class_names = find_classes(train_folder(self.data_dir))
        return self._class_names

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def prepare_data(self) -> None:
        if self.hparams.synthetic and not self.data_dir.exists():
            shapes.draw_shapes_dataset(self.data_dir)
            rank_zero_info(
                f"Drew the built-in shapes dataset into {self.data_dir} ({len(shapes.CLASSES)} classes). To train on "
                "your images: --data.data_dir <folder of class folders> --data.synthetic false"
            )

    def setup(self, stage: str) -> None:
        # The splits check_folders made serve the setup that follows; a later one (a notebook's second
        # fit, a script's next fold) reads the folders again.
        if not self._splits_checked:
            self._make_splits(stage)
        self._splits_checked = False
        if stage == "fit":
            # A checkpoint is read after this, if at all: what a previous fit of this data module read is not ours.
            self._train_loader, self._epoch_position, self._resumed_epoch = None, None, None
            rank_zero_info(self.describe_splits())
            # Unsaid once a remedy it names is on: this module's balanced sampling, or the model's class weights.
            model = getattr(self.trainer, "lightning_module", None)
            weighted = model is not None and model.hparams.get("class_weights") == "balanced"
            remedied = self.hparams.balanced_sampling or weighted
            if not remedied and (warning := imbalance_warning(self.train_class_counts(), self.class_names)):
                rank_zero_warn(warning)
        split = {"fit": "val", "validate": "val", "test": "test"}.get(stage)
        evaluated = split and getattr(self.trainer, f"limit_{split}_batches", None) != 0
        evaluated = evaluated and getattr(self, f"{split}_set") is not None  # test: refused later without one
        if evaluated and (warning := unevaluated_warning(self.class_counts(split), self.class_names, split)):
            rank_zero_warn(warning)

    def check_folders(self, stage: str = "fit") -> None:
        """Read the split folders that `stage` (Lightning's: fit, validate, test, predict) uses now, before
        a logger starts a run (a W&B run online), so that a mistake in them (an empty class folder, too
        few images to split) leaves no run behind."""
        if self.data_dir.exists():  # the built-in shapes are drawn later, by prepare_data
            self._make_splits(stage)
            self._splits_checked = True

    def _make_splits(self, stage: str) -> None:
        options, classes = self.hparams, self.class_names
        pool, self._fold_pool = self._fold_pool, None  # listed on construction, for the first splits only
        if options.num_folds is None:
            training = stage == "fit"
            splits = split_samples(self.data_dir, classes, options.val_fraction, options.split_seed, training)
        else:
            splits = fold_samples(self.data_dir, classes, options.num_folds, options.fold, options.split_seed, pool)
        # Each split gets its own dataset object and transform, so augmentation never leaks into
        # validation (the bug of setting a transform on a dataset that two Subsets share).
        skip = self.hparams.bad_images == "skip"
        self.train_set = ImageFiles(splits["train"], self._train_transform(), skip)
        self.val_set = ImageFiles(splits["val"], self.preprocessing.eval_transform(), skip)
        if "test" in splits:
            self.test_set = ImageFiles(splits["test"], self.preprocessing.eval_transform(), skip)

    def describe_splits(self) -> str:
        """How many images each split of a fit holds, and per class: the one place a user sees what the
        split (val_fraction, split_seed, folds) made of the folders."""
        train, val = self.train_class_counts(), self.class_counts("val")
        per_class = f"{min(train):,} to {max(train):,}" if min(train) != max(train) else f"{min(train):,}"
        per_class += " training file a class" if max(train) == 1 else " training files a class"
        # Files: an unreadable one is found, and skipped, only when it is read.
        return (
            f"Data: {sum(train):,} training and {sum(val):,} validation image files in {self.num_classes} classes "
            f"({per_class}) from {self.data_dir}" + "".join(f"; {note}" for note in self._split_notes())
        )

    def _split_notes(self) -> list[str]:
        """Where the splits came from, where the folders do not say: a split folder of another name, a
        fold, a share of each class held out."""
        folders = {split: split_folder(self.data_dir, split) for split in SPLIT_NAMES}
        notes = [f"{folder.name}/ as {split}/" for split, folder in folders.items() if folder and folder.name != split]
        if self.hparams.num_folds is not None:
            notes.append(f"validating on fold {self.hparams.fold} of {self.hparams.num_folds}")
        elif folders["val"] is None:
            notes.append(f"no val/ folder, so validating on {self.hparams.val_fraction:g} of each class held out")
        return notes

    def train_class_counts(self) -> list[int]:
        """The training images of each class, in label order."""
        return self.class_counts("train")

    def class_counts(self, split: str) -> list[int]:
        """The images of each class in a split (train, val or test), in label order."""
        labels = torch.tensor(self._labels(split), dtype=torch.long)
        return torch.bincount(labels, minlength=self.num_classes).tolist()

    def _labels(self, split: str) -> list[int]:
        return [label for _, label in getattr(self, f"{split}_set").samples]

    def _train_transform(self) -> v2.Compose:
        options = self.hparams
        return train_transform(
            self.preprocessing,
            options.augment,
            options.hflip,
            options.vflip,
            options.min_crop_scale,
            options.random_erasing,
            options.basic_augment_epochs,
        )

    def augment_schedule(self, first_epoch: int) -> str | None:
        """When the policy joins the basic augmentation, said to a fit that trains from `first_epoch`
        on; None where nothing waits (no schedule, or a resumed run past its start)."""
        options, transform = self.hparams, self._train_transform()  # train_transform's rule, not a copy
        if not isinstance(transform, ScheduledAugmentation) or first_epoch >= transform.start:
            return None
        added = [options.augment] if options.augment not in ("none", "basic") else []
        added += [f"random erasing {options.random_erasing:g}"] if options.random_erasing > 0 else []
        line = (
            f"Until epoch {transform.start} the training images get the basic augmentation, then "
            f"{' and '.join(added)} too (data.basic_augment_epochs)"
        )
        return line + ends_before(self.trainer, transform.start)

    def _drop_last(self, share: int) -> bool:
        # A last batch of one image breaks BatchNorm, and one much shorter than the others skews its
        # statistics: it goes. One of half a batch or more stays, or a small dataset (122 images in
        # batches of 64) would train on half its images. A process's share must still fill a batch.
        return share > self.batch_size and share % self.batch_size < max(2, self.batch_size / 2)

    def train_dataloader(self) -> DataLoader:
        shards = (self.trainer.distributed_sampler_kwargs if self.trainer is not None else None) or {}
        seed = run_seed()
        if self.hparams.balanced_sampling:
            sampler = ClassBalancedSampler(self._labels("train"), **shards, seed=seed)
        else:
            # The sampler Lightning would add under DDP, on one device too: each epoch's order comes
            # from the seed and the epoch, so a resumed run sees the images in the order an
            # uninterrupted one would (a plain shuffle draws from the process's random state).
            sampler = EpochSampler(self.train_set, **(shards or {"num_replicas": 1, "rank": 0}), seed=seed)
        # Lightning gives the sampler its epoch only after making the loader's first iterator, which
        # data workers draw from at once, and on a resumed run before restoring its loop's epoch: that
        # run's first epoch would take epoch 0's order.
        sampler.set_epoch(self._next_epoch())
        self._train_loader = self._loader(self.train_set, sampler=sampler, drop_last=self._drop_last(len(sampler)))
        self._resume_train_epoch()
        return self._train_loader

    def _resume_train_epoch(self) -> None:
        """Give the training sampler a resumed run's epoch and its place in it, once both the sampler
        and the checkpoint's state are here: most strategies read the checkpoint before the loader is
        made, FSDP and DeepSpeed after their setup, by when the learning-rate schedule has asked for it."""
        if self._train_loader is None:
            return
        sampler = self._train_loader.sampler
        epoch, self._resumed_epoch = self._resumed_epoch, None
        if epoch is not None:
            sampler.set_epoch(epoch)
        if (position := self._epoch_position) is not None:
            now = {"processes": sampler.num_replicas, "batch_size": self.batch_size,
                   "training_images": len(self._train_loader.dataset)}  # fmt: skip
            if changed := changed_settings(position, now):  # training_images: none in an earlier checkpoint's
                rank_zero_warn(epoch_restarts(changed))
                self._epoch_position = None
            else:
                # Kept for a loader made later in this fit (trainer.reload_dataloaders_every_n_epochs makes
                # one as the resumed epoch starts): a sampler skips in that epoch only.
                sampler.resume_at(position["epoch"], position["batches"] * self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return self._evaluation_loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        self.check_test_split()
        return self._evaluation_loader(self.test_set)

    def check_val_split(self) -> None:
        """Refuse a fit or validate with no validation image (check_folders has read the folders): a fit
        would keep no best checkpoint, and say so only in Lightning's warnings."""
        if not self._splits_checked or self.val_set is None or len(self.val_set):
            return
        if val_dir := split_folder(self.data_dir, "val"):
            raise DataError(f"{val_dir} holds no images: add each class's, or remove it to hold out a share of train/.")
        raise DataError(
            f"No validation images: every class in {train_folder(self.data_dir)} has one image, and a share is held "
            "out only of a class of two or more. Add images, or a val/ folder of them."
        )

    def check_test_split(self) -> None:
        """Refuse `test` on data without a test split; the CLI asks before a logger starts a run."""
        if not self._has_test_split:
            raise MissingError(f"No test split: add test/ with one folder per class {self._where_test_goes}.")

    @property
    def _has_test_split(self) -> bool:
        return has_test_folder(self.data_dir) or (self.hparams.synthetic and not self.data_dir.exists())

    @property
    def _where_test_goes(self) -> str:
        if self.data_dir.is_dir() and split_folder(self.data_dir, "train") is None:  # class folders at the top
            return f"at {self.data_dir / 'test'}, and move the class folders there now into {self.data_dir / 'train'}"
        return f"at {self.data_dir / 'test'}"

    def _evaluation_loader(self, dataset: Dataset) -> DataLoader:
        return self._loader(dataset, sampler=self._evaluation_sampler(dataset), evaluated=True)

    def _evaluation_sampler(self, dataset: Dataset) -> Sampler | None:
        """Under DDP, each image once across processes. Lightning's DistributedSampler pads the
        shards to equal length with repeated images, which then count twice in the metrics. Shards
        a batch apart are safe under DDP, whose evaluation forward needs no other process; sharded
        strategies (FSDP, DeepSpeed) gather weights in every forward, so every process must run the
        same number of batches there, and Lightning's padding stays
{%- if cookiecutter.streaming == "yes" %} (streaming drops the few images
        that would make one process's share longer than another's)
{%- endif %}."""
        shards = self.trainer.distributed_sampler_kwargs if self.trainer is not None else None
        if not shards or shards["num_replicas"] == 1 or shards_weights(self.trainer.strategy):
            return None
        split = "validation" if dataset is self.val_set else "test"
        if said := too_few_to_share(len(dataset), shards["num_replicas"], split):
            raise DataError(said)  # the CLI asks before a logger starts a run (check_shares); Python code, here
        return UnrepeatedDistributedSampler(dataset, shuffle=False, **shards)

    def check_shares(self, stage: str, processes: int) -> None:
        """Refuse to evaluate (`stage`: Lightning's) a split of fewer images than data-parallel processes,
        before a logger starts a run."""
        split = {"fit": "val", "validate": "val", "test": "test", "predict": "test" if self.test_set else "val"}
        dataset = getattr(self, f"{split.get(stage)}_set", None)
        named = "validation" if split.get(stage) == "val" else "test"
        if dataset is not None and (said := too_few_to_share(len(dataset), processes, named)):
            raise DataError(said)

    def predict_dataloader(self) -> DataLoader:
        self.predicted_split = "test" if self.test_set is not None else "val"
        return self._loader(self._named_split(self.predicted_split), evaluated=True)

    def _named_split(self, name: str) -> Dataset:
        """A split's images, each with its path in place of its label."""
        split = self.test_set if name == "test" else self.val_set
        return ImageFiles(split.samples, split.image_transform, split.skip_unreadable, named=True)

    def on_after_batch_transfer(
        self, batch: tuple[torch.Tensor, torch.Tensor] | torch.Tensor, dataloader_idx: int
    ) -> tuple | torch.Tensor:
        # Batches travel as uint8, a quarter of float32's bytes through worker shared memory and
        # the host-to-GPU copy, and become normalised floats on the device, where that is fastest.
        # Images alone: the model's example input, which Lightning's model summary runs.
        images, labels = (batch, None) if isinstance(batch, torch.Tensor) else batch
        images = self.preprocessing.normalize(images)
        if self.trainer is not None:
            # Lightning casts float batches to the precision's input type before they move (bfloat16 for
            # DeepSpeed's bf16 or bf16-true, whose weights are bfloat16): ours are floats only from here.
            images = self.trainer.precision_plugin.convert_input(images)
        return images if labels is None else (images, labels)

    def state_dict(self) -> dict:
        # Saved in every checkpoint, so the label order and the preprocessing travel with the weights.
        state = {"class_names": self.class_names, "preprocessing": self.preprocessing.as_dict()}
        if self.trainer is not None:
            state["sampler_epoch"] = self._next_epoch()
        if (position := self._position_in_epoch()) is not None:
            state["epoch_position"] = position
        return state

    def _next_epoch(self) -> int:
        """The epoch the loop gives the sampler next."""
        return next_epoch(self.trainer) if self.trainer is not None else 0

    def _position_in_epoch(self) -> dict | None:
        """Where a checkpoint interrupts an epoch, for the resumed run to go on from the next unseen
        image (none at an epoch's end: the next one starts afresh): the epoch and its batches done,
        which the sampler skips."""
        trainer = self.trainer
        if not interrupts_an_epoch(trainer):
            return None
        batches = trainer.fit_loop.epoch_loop.batch_progress.current.completed
        return {"format": self.data_format, "epoch": trainer.current_epoch, "batches": batches,
                "processes": trainer.world_size, "batch_size": self.batch_size,
                "training_images": len(self.train_set)}  # fmt: skip

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("class_names")
        if saved is not None and saved != self.class_names:
            raise DataError(
                f"The checkpoint's data had the classes {saved} but {self.data_dir} has {self.class_names}."
            )
        # The weights were trained on images prepared one way: evaluating or resuming them on
        # images prepared another way would be measuring or training something else.
        self._resumed_epoch = state_dict.get("sampler_epoch")
        position = state_dict.get("epoch_position")
        self._epoch_position = position if position and position["format"] == self.data_format else None
        self._resume_train_epoch()
        trained = saved_preprocessing(state_dict, self.preprocessing.image_size)
        if trained != self.preprocessing:
            rank_zero_info(
                f"Using the checkpoint's preprocessing ({trained.describe()}) rather than the configuration's "
                f"({self.preprocessing.describe()}); to change it, start a new run."
            )
            self.preprocessing = trained
            self.hparams.update(trained.as_dict())
            # Loading a checkpoint comes after setup: the splits have the configuration's transforms.
            if self.train_set is not None:
                self.train_set.image_transform = self._train_transform()
            for evaluated in (self.val_set, self.test_set):
                if evaluated is not None:
                    evaluated.image_transform = trained.eval_transform()

    def _loader(
        self, dataset: Dataset, drop_last: bool = False, sampler: Sampler | None = None, evaluated: bool = False
    ) -> DataLoader:
        """`evaluated`: a batch whose images are all unreadable comes empty rather than as an error."""
        workers = self.worker_count()
        collate = collate_readable
        if evaluated:  # image_size squares, with paths (predict) or labels
            labels = () if getattr(dataset, "named", False) else torch.zeros(0, dtype=torch.long)
            size = self.preprocessing.image_size
            empty = [torch.zeros(0, 3, size, size, dtype=torch.uint8), labels]
            collate = functools.partial(collate_readable, empty=empty)
        return self.loader_class(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=drop_last,
            num_workers=workers,
            collate_fn=collate,
            # Page-locked host memory only speeds up copies to a CUDA device.
            pin_memory=self._on_cuda(),
            # Workers that outlive an epoch skip restarting and re-reading the file list each epoch.
            persistent_workers=workers > 0,
            prefetch_factor=self.hparams.prefetch_factor if workers > 0 else None,
            multiprocessing_context=worker_context(self.hparams.worker_start_method) if workers > 0 else None,
            worker_init_fn=functools.partial(
                start_worker, rank=self.trainer.global_rank if self.trainer else 0, trainer_pid=os.getpid()
            ),
            # Its own generator for the workers' base seed, which DataLoader otherwise draws from the
            # process's random state at each new iterator: a resumed run would draw once more.
            generator=torch.Generator().manual_seed(run_seed()),
        )

    def worker_count(self) -> int:
        if self.hparams.num_workers != "auto":
            return self.hparams.num_workers
        if self.trainer is not None and self.trainer.fast_dev_run:
            # A batch or a few: this process reads them sooner than workers start (3 of a fast_dev_run's 11 s here).
            return 0
        return auto_workers(usable_cpus(), self.trainer.num_devices if self.trainer is not None else 1)

    def _on_cuda(self) -> bool:
        if self.trainer is not None:
            return isinstance(self.trainer.accelerator, CUDAAccelerator)
        return torch.cuda.is_available()


{% if cookiecutter.streaming == "yes" -%}
class StreamingDataModule(ImageDataModule):
    """What ImageDataModule becomes for data.format streaming: the splits, classes and loaders of the
    sharded dataset at data_dir (datasets/streaming.py, imported only here: LitData is an extra). LitData
    shuffles by the seed and the epoch, and gives each process and worker its share (no sampler)."""

    data_format = "streaming"

    @property
    def loader_class(self) -> type[DataLoader]:
        from .datasets.streaming import StreamingLoader

        return StreamingLoader

    def _check_source(self) -> None:
        if self.hparams.num_folds is not None:
            raise ConfigError("data.num_folds works with data.format folder: `shard` fixes the streaming splits.")
        if self.hparams.balanced_sampling:
            raise ConfigError("data.balanced_sampling works with data.format folder; streaming reads each image once.")

    @functools.cached_property
    def manifest(self) -> dict:
        """The classes and splits of the sharded dataset."""
        from .datasets.streaming import read_manifest

        return read_manifest(self.hparams.data_dir)

    @property
    def class_names(self) -> list[str]:
        return self.manifest["classes"]

    def prepare_data(self) -> None:
        """Sharded data is made by `shard`, never drawn here."""

    def check_folders(self, stage: str = "fit") -> None:
        """`shard` checked the folders as it wrote the shards; the manifest was read on construction."""

    def _make_splits(self, stage: str) -> None:
        splits = self.manifest["splits"]  # the manifest first: a missing one is named
        self.train_set = self._split("train", self._train_transform(), shuffle=True)
        self.val_set = self._split("val", self.preprocessing.eval_transform(), shuffle=False)
        if "test" in splits:
            self.test_set = self._split("test", self.preprocessing.eval_transform(), shuffle=False)

    def _split(self, name: str, transform: v2.Transform, shuffle: bool, named: bool = False) -> Dataset:
        from .datasets.streaming import ShardedImages

        options = self.hparams
        skip = options.bad_images == "skip"
        return ShardedImages(options.data_dir, name, transform, skip, shuffle, run_seed(), options.cache_dir,
                             options.max_cache_size, named=named, sharded_from=self.manifest.get("source"))  # fmt: skip

    def _named_split(self, name: str) -> Dataset:
        return self._split(name, self.preprocessing.eval_transform(), shuffle=False, named=True)

    def class_counts(self, split: str) -> list[int]:
        return self.manifest["splits"][split]["class_counts"]

    def _split_notes(self) -> list[str]:
        return []  # the shards' splits, which `shard` made and reported

    def train_dataloader(self) -> DataLoader:
        # LitData evens out the processes' shares by dropping each one's last batch, whatever its length.
        share = sum(self.train_class_counts()) // (self.trainer.world_size if self.trainer is not None else 1)
        self._train_loader = self._loader(self.train_set, drop_last=share > self.batch_size)
        # LitData's loader counts its passes (from 1, adding one as each starts): a loader made
        # after the first epoch, or for a resumed run, would shuffle and augment as the first.
        self._train_loader.current_epoch = self._next_epoch()
        self._resume_train_epoch()
        return self._train_loader

    def _resume_train_epoch(self) -> None:
        """Continue a resumed run at its epoch, and an interrupted epoch where it stopped, once both
        the loader and the checkpoint's state are here (see ImageDataModule._resume_train_epoch)."""
        from .datasets.streaming import resume_position

        if self._train_loader is None:
            return
        epoch, self._resumed_epoch = self._resumed_epoch, None
        if epoch is not None:
            self._train_loader.current_epoch = epoch
        position, self._epoch_position = self._epoch_position, None
        if position is not None:
            resume_position(self._train_loader, position["loader"])

    @property
    def _has_test_split(self) -> bool:
        return "test" in self.manifest["splits"]

    @property
    def _where_test_goes(self) -> str:
        return "to the image folder and shard it again"

    def _evaluation_loader(self, dataset: Dataset) -> DataLoader:
        # LitData splits the images between processes: see ImageDataModule._evaluation_sampler for why
        # sharded strategies drop the few that would make one process's share longer.
        sharded = self.trainer is not None and shards_weights(self.trainer.strategy)
        return self._loader(dataset, drop_last=sharded, evaluated=True)

    def _position_in_epoch(self) -> dict | None:
        """The loader's state where a checkpoint interrupts an epoch. Lightning saves it too but loads
        it only when nothing asked for the training loader before the checkpoint was read, and the
        learning-rate schedule has (estimated_stepping_batches)."""
        loader = self.trainer.train_dataloader if interrupts_an_epoch(self.trainer) else None
        return {"format": self.data_format, "loader": loader.state_dict()} if hasattr(loader, "state_dict") else None


{% endif -%}
def worker_context(method: str) -> multiprocessing.context.BaseContext:
    """The multiprocessing context data workers start from (see ImageDataModule's worker_start_method)."""
    if method not in multiprocessing.get_all_start_methods() or (method == "forkserver" and sys.platform == "darwin"):
        method = "spawn"  # Windows has no fork; on macOS, forking a process that loaded torch's frameworks can crash
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        # The server imports this module (torch, torchvision, Lightning) once, for all the workers.
        context.set_forkserver_preload([__name__])
        sigterm.start_forkserver()
    return context


def start_worker(worker_id: int, rank: int, trainer_pid: int) -> None:
    """Each data worker leaves a scheduler's SIGTERM to the training process, which saves its
    checkpoint and then ends the workers itself (a worker killed mid-batch would crash it first).
    Then Lightning's seeding."""
    sigterm.leave_to(trainer_pid)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):
        pl_worker_init_function(worker_id, rank)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which Slurm and taskset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def too_few_to_share(images: int, processes: int, split: str) -> str | None:
    """Why `images` of an evaluated split cannot be shared by `processes` under DDP, each of which must
    evaluate one or more: one with none would skip the evaluation whose metrics the others sync."""
    if 0 < images < processes:
        return (
            f"{images} {split} image(s) for {processes} processes, each of which evaluates one or more: add "
            f"images, or evaluate on {images} process(es) or fewer (--trainer.devices, --trainer.num_nodes)."
        )
    return None


def auto_workers(cpus: int, devices: int) -> int:
    """What num_workers "auto" means: one core of this process's share stays with training, up to
    16 workers (torchvision's reference default; on an H200, resnet18 at 224 px took 13,000 images/s
    and 8 workers decoded 7,600 JPEGs/s, 16 workers 12,500). An affinity narrower than the machine
    (a SLURM task bound to its CPUs, taskset) is this process's share already; otherwise the devices
    split the CPUs."""
    share = cpus if cpus < (os.cpu_count() or cpus) else cpus // devices
    return max(0, min(16, share - 1))


def saved_preprocessing(state: dict, image_size: int) -> Preprocessing:
    """The preprocessing in a checkpoint's data state; older checkpoints saved none, and were
    trained with the defaults at their image size."""
    return Preprocessing.from_dict(state.get("preprocessing") or {"image_size": image_size})
{%- if cookiecutter.inference == "yes" %}


def checkpoint_preprocessing(checkpoint: dict) -> Preprocessing:
    """The preprocessing a checkpoint's weights were trained with (for classify, export{{ ", serving" if cookiecutter.serving == "yes" }})."""
    image_size = checkpoint.get("datamodule_hyper_parameters", {}).get("image_size", {{ cookiecutter.image_size }})
    # The data module's state, which Lightning files under the module's class name, and so under
    # another one for a subclass ({{ "datasets/streaming.py's, or yours" if cookiecutter.streaming == "yes" else "yours" }}).
    states = [value for value in checkpoint.values() if isinstance(value, dict) and "preprocessing" in value]
    return saved_preprocessing(states[0] if states else {}, image_size)
{%- endif %}
