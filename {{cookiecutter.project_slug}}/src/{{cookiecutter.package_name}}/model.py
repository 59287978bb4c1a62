"""ImageClassifier: a torchvision backbone, its metrics and its optimisation recipe."""

import difflib
import json
import math
from functools import partial
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassConfusionMatrix

from .backbone import (
    BUILT_WITH,
    build_as,
    build_backbone,
    built_with,
    check_image_size,
    head_names,
    load_trained_weights,
)
from .datasets.sampling import run_seed
from .errors import ConfigError, DataError, check_choices
from .hardware.sharding import cast_buffers_with_parameters, fully_shard_blocks, shards_weights, share_buffers
from .training import random_state
from .training.batch_mixing import BatchMixing
from .training.checkpoint_io import write_whole
from .training.csv_logging import forget_rows_from
from .training.metrics import MeanPerImage, add_states, classification_metrics, states_so_far
from .training.progress import ends_before, next_epoch
from .training.reports import write_report
from .training.resume import epoch_goes_on_after
from .training.run_folders import mark_finished, mark_unfinished


class ImageClassifier(L.LightningModule):
    """Classify images with any torchvision classification backbone.

    Args:
        num_classes: Number of classes; the CLI takes it from the data.
        class_names: Class names in label order; the CLI takes them from the data and they are
            saved with every checkpoint.
{%- if cookiecutter.timm == "yes" %}
        backbone: A torchvision classification model name, such as resnet18 or efficientnet_b0, or
            a timm one as timm/<model>[.<pretrained tag>], such as timm/convnext_tiny.fb_in1k (the
            timm extra: pip install -e ".[timm]").
        pretrained: Start from the ImageNet weights (torchvision's, downloaded once into TORCH_HOME;
            timm's, from the Hugging Face Hub into its cache); the
            images are then prepared as those weights expect (data.mean, std, crop_ratio, interpolation).
{%- else %}
        backbone: A torchvision classification model name, such as resnet18 or efficientnet_b0.
        pretrained: Start from torchvision's ImageNet weights, downloaded once into TORCH_HOME; the
            images are then prepared as those weights expect (data.mean, std, crop_ratio, interpolation).
{%- endif %}
        init_weights: A checkpoint file of this project whose weights start this new run, in place of
            `pretrained`'s (none are downloaded): its backbone's, and its head's where it was trained on
            the same classes, else a new head, as for ImageNet's. The optimizer, schedule and epochs
            start afresh; --ckpt_path is the way to continue a run.
        lr: Peak learning rate for an effective batch of `base_batch_size` images.
        weight_decay: AdamW weight decay for weight matrices and kernels; biases and norms get none.
        warmup_fraction: Fraction of the optimizer steps spent warming the learning rate up linearly
            before the cosine decay.
        label_smoothing: Label smoothing of the training loss (0 turns it off); composes with mixing.
        mixup_alpha: Mixup: blend pairs of training images and their labels, with weights drawn from
            Beta(alpha, alpha); 0.2 to 0.8 in the reference recipes, 0 turns it off.
        cutmix_alpha: CutMix: paste a rectangle of another training image, labels weighted by area;
            1.0 in the reference recipes, 0 turns it off. With mixing on, the train/ accuracy metrics
            are off (a blended image has no one label); validation runs on whole images.
        mix_prob: Share of the training batches that are mixed.
        mix_switch_prob: With both Mixup and CutMix on, the share of mixed batches that get CutMix.
        unmixed_epochs: Train this many epochs first on whole images, then mix: a model that has not
            fitted the data yet learns little from blends, so a short run is not mixed at all.
        class_weights: Weigh the training loss per class: "balanced" by images / (classes x the
            class's training images), so each class counts alike whatever its size (the train/ losses
            are then the weighted loss); "none" counts each image alike.
        stochastic_depth: Probability that training skips the deepest residual block (drop path;
            shallower blocks less, in proportion), for the backbones that have it (ConvNeXt,
            EfficientNet, Swin, MaxViT{{ "; timm's drop_path_rate" if cookiecutter.timm == "yes" }}). Unset: the library's value for the
            backbone (torchvision: 0.1 to 0.5{{ "; timm: 0" if cookiecutter.timm == "yes" }}).
        backbone_lr_scale: The learning rate of every layer but the classification head, as a share
            of `lr`: below 1 (0.1, say) changes pretrained features less than the new head.
        frozen_backbone_epochs: Train only the head for this many epochs first (the backbone's
            learning rate is 0 until then, and warms up after), so its random start does not
            disturb pretrained features.
        batch_size: Images per device and step; the CLI takes it from the data.
        base_batch_size: The effective batch size at which `lr` applies unscaled.
        scale_lr: Scale `lr` linearly by effective batch size / `base_batch_size`.
        channels_last: Lay convolutional backbones and their inputs out channels-last (NHWC), the
            layout tensor cores and cuDNN's fastest kernels use (about 1.2-1.5x faster convolutions
            under bf16/fp16 on current NVIDIA GPUs). No effect on transformers.
        small_image_stem: Keep a ResNet's input resolution through its stem (stride 1, no max-pool),
            as small-image recipes (CIFAR's ResNets) do: its ImageNet stem divides the side by 4
            before the first block, to 8 x 8 for 32 px images. About a point more accuracy at the same
            epochs, at 3 to 5.5 times the time per epoch on a CPU (32 px digits, Fashion-MNIST);
            pretrained weights still load. For resnet*, resnext*{{ ", wide_resnet* and timm's plain ResNets" if cookiecutter.timm == "yes" else " and wide_resnet*" }}.
        compile_mode: `torch.compile` the backbone with this mode ("default", "reduce-overhead",
            "max-autotune"), or "off". Compiling takes a minute or more at the start of each run;
            TORCHINDUCTOR_CACHE_DIR on a persistent disk keeps the compiled kernels across runs.
    """

    def __init__(
        self,
        num_classes: int,
        class_names: list[str] | None = None,
        backbone: str = "{{ cookiecutter.backbone }}",
        pretrained: bool = False,
        init_weights: str | None = None,
        lr: float = 2e-3,
        weight_decay: float = 0.05,
        warmup_fraction: float = 0.05,
        label_smoothing: float = 0.0,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mix_prob: float = 1.0,
        mix_switch_prob: float = 0.5,
        unmixed_epochs: int = 0,
        class_weights: Literal["none", "balanced"] = "none",
        stochastic_depth: float | None = None,
        backbone_lr_scale: float = 1.0,
        frozen_backbone_epochs: int = 0,
        batch_size: int = 64,
        base_batch_size: int = 64,
        scale_lr: bool = True,
        channels_last: bool = True,
        small_image_stem: bool = False,
        compile_mode: Literal["off", "default", "reduce-overhead", "max-autotune"] = "off",
    ) -> None:
        super().__init__()
        if class_names is not None and len(class_names) != num_classes:
            raise ConfigError(f"num_classes={num_classes} but {len(class_names)} class names were given")
        check_choices(ImageClassifier.__init__, locals(), "model")
        below_one = "0 or more and below 1"
        for name, value, allowed, wanted in [
            ("num_classes", num_classes, num_classes >= 2, "2 or more (a classifier tells classes apart)"),
            ("lr", lr, lr >= 0, "0 or more"),
            ("weight_decay", weight_decay, weight_decay >= 0, "0 or more"),
            ("warmup_fraction", warmup_fraction, 0 <= warmup_fraction < 1, below_one),
            ("label_smoothing", label_smoothing, 0 <= label_smoothing < 1, below_one),
            ("stochastic_depth", stochastic_depth, stochastic_depth is None or 0 <= stochastic_depth < 1, below_one),
            ("backbone_lr_scale", backbone_lr_scale, backbone_lr_scale >= 0, "0 or more"),
            ("frozen_backbone_epochs", frozen_backbone_epochs, frozen_backbone_epochs >= 0, "0 or more"),
            ("unmixed_epochs", unmixed_epochs, unmixed_epochs >= 0, "0 or more"),
            ("batch_size", batch_size, batch_size >= 1, "1 or more"),
            ("base_batch_size", base_batch_size, base_batch_size >= 1, "1 or more"),
        ]:
            if not allowed:
                raise ConfigError(f"model.{name} must be {wanted}, got {value}")
        self.save_hyperparameters()
        self.backbone = build_backbone(
            backbone, num_classes, pretrained and not init_weights, stochastic_depth, small_image_stem
        )
        if init_weights:
            load_trained_weights(self.backbone, backbone, init_weights, num_classes, class_names)
        self.batch_mixing = BatchMixing(num_classes, mixup_alpha, cutmix_alpha, mix_prob, mix_switch_prob)
        # From the training data's class counts when the fit starts (class_weights: balanced). Not a
        # buffer: ModelEMA copies the model before that, and pairs the copy's buffers with the model's.
        self.loss_weights: torch.Tensor | None = None
        # The class and parameter groups of a checkpoint's optimizer, to refuse one this model's cannot load.
        self._saved_optimizer_class: str | None = None
        self._saved_param_groups: list[dict] | None = None
        self._optimizer_class: str | None = None  # configure_optimizers's, saved with each checkpoint
        self._resumed_random_state: dict | None = None  # a checkpoint's (training/random_state.py), for on_train_start
        self._resumed_train_metrics: dict | None = None  # the interrupted epoch's so far, for on_train_start
        self._memory_format = torch.contiguous_format  # configure_model picks the training layout
        self.train_metrics = classification_metrics(num_classes, "train/")
        self.val_metrics = classification_metrics(num_classes, "val/")
        self.test_metrics = classification_metrics(num_classes, "test/")
        self.train_loss, self.val_loss, self.test_loss = MeanPerImage(), MeanPerImage(), MeanPerImage()
        # For the confusion-matrix picture and per-class accuracy written after each evaluation.
        self.val_confusion = MulticlassConfusionMatrix(num_classes, validate_args=False)
        self.test_confusion = MulticlassConfusionMatrix(num_classes, validate_args=False)
        self._compiled = False
        # The epoch and step of the checkpoint loaded, if any: what an evaluation reports them at.
        self.trained_until: dict[str, int] | None = None
        self._size_checked: int | None = None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.backbone(images.contiguous(memory_format=self._memory_format))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        targets = labels
        if self.mixes_at(self.current_epoch):
            images, targets = self.batch_mixing(
                images, labels, run_seed(), self.global_rank, self.trainer.fit_loop.total_batch_idx
            )
        logits = self(images)
        weight = None if self.loss_weights is None else self.loss_weights.to(logits.device)
        losses = F.cross_entropy(
            logits, targets, weight=weight, label_smoothing=self.hparams.label_smoothing, reduction="none"
        )
        # train/loss_step is this process's batch (an all-reduce per step would stall every step for a
        # number only plotted); train/loss_epoch, like every metric object, is summed across processes.
        self.train_loss(losses)
        self.log("train/loss", self.train_loss, on_step=True, on_epoch=True, prog_bar=True)
        if not self.batch_mixing.enabled:
            self.train_metrics.update(logits, labels)
            self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return losses.mean()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics, self.val_loss, self.val_confusion, "val")

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics, self.test_loss, self.test_confusion, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_at_checkpoint()
        write_report(self.trainer, self.val_confusion, self.label_names(), "val", self._epoch(), self._step())

    def on_test_epoch_end(self) -> None:
        self._log_at_checkpoint()
        write_report(self.trainer, self.test_confusion, self.label_names(), "test", self._epoch(), self._step())

    def _evaluated_checkpoint(self) -> dict[str, int] | None:
        """The epoch and step of the checkpoint an evaluation runs on; None in fit or without one."""
        return None if self.trainer.state.fn == TrainerFn.FITTING else self.trained_until

    def _log_at_checkpoint(self) -> None:
        """An evaluation of a checkpoint logs at the checkpoint's epoch and step (Lightning takes a
        logged "step" for the loggers' step), so its numbers sit at the end of the curves of the run
        it evaluates, not at step 0: where the run's own validation of those weights sits, at the
        index of the last step taken (a fit logs it before counting that step)."""
        if self._evaluated_checkpoint():
            at = {"epoch": self._epoch(), "step": self._step()}
            # The same on every process: synced only so that Lightning need not warn that it is not.
            self.log_dict({name: float(value) for name, value in at.items()}, sync_dist=True)

    def _epoch(self) -> int:
        """The epoch of the weights being evaluated: the current one in fit, else the checkpoint's."""
        position = self._evaluated_checkpoint()
        return position["epoch"] if position else self.trainer.current_epoch

    def _step(self) -> int:
        """The step the numbers of these weights are logged at: the index of the last step they took
        (a fit logs before counting it), in fit the current one, in an evaluation the checkpoint's."""
        position = self._evaluated_checkpoint()
        return max((position["step"] if position else self.trainer.global_step) - 1, 0)

    def label_names(self) -> list[str]:
        return self.names_of(self.hparams)

    @staticmethod
    def names_of(hyper_parameters: dict) -> list[str]:
        """The class names, or the class indices as text when the model has no names."""
        names = hyper_parameters.get("class_names")
        return list(names) if names else [str(index) for index in range(hyper_parameters["num_classes"])]

    def _evaluate(
        self,
        batch: tuple[torch.Tensor, torch.Tensor],
        metrics: MetricCollection,
        mean_loss: MeanPerImage,
        confusion: MulticlassConfusionMatrix,
        stage: str,
    ) -> None:
        images, labels = batch
        # A batch whose every image was unreadable comes empty: its forward still runs, since sharded
        # strategies gather the weights in each, but metrics take no update (torchmetrics fails on none).
        logits = self(images)
        if len(labels):
            confusion.update(logits, labels)
            # Plain cross-entropy, so evaluation losses compare across label-smoothing settings.
            mean_loss.update(F.cross_entropy(logits, labels, reduction="none"))
            metrics.update(logits, labels)
        # Metric objects sync their states across processes when computed at epoch end, so every
        # rank logs the same values: those one process would compute over all the images.
        self.log(f"{stage}/loss", mean_loss, on_epoch=True)
        self.log_dict(metrics, on_epoch=True, prog_bar=stage == "val")

    def predict_step(self, batch: tuple[torch.Tensor, list[str]] | torch.Tensor, batch_idx: int) -> torch.Tensor:
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        return self(images).float().softmax(dim=-1)  # bf16-mixed's logits: probabilities to float32's digits

    def configure_model(self) -> None:
        if self._trainer is None:  # load_from_checkpoint calls this too: the model stays as built
            return
        cast_buffers_with_parameters(self.trainer.strategy)
        # FSDP2 (configs/trainer/fsdp.yaml): ModelParallelStrategy hands over a device mesh and
        # leaves the sharding to the model. Every other strategy has no mesh and takes the model whole.
        if self.device_mesh is not None:
            fully_shard_blocks(self.backbone, self.device_mesh["data_parallel"])
        elif self.hparams.channels_last and self._takes_channels_last():
            self.backbone.to(memory_format=torch.channels_last)
            self._memory_format = torch.channels_last
        if self.hparams.compile_mode != "off" and not self._compiled:
            # In place, after sharding: the state_dict keeps its names, so checkpoints load uncompiled.
            self.backbone.compile(mode=self.hparams.compile_mode)
            self._compiled = True

    def _takes_channels_last(self) -> bool:
        # Sharding engines (FSDP, DeepSpeed) need contiguous parameters; a ViT's one patch-embedding
        # convolution gains nothing from the layout.
        convolutions = sum(isinstance(module, torch.nn.Conv2d) for module in self.backbone.modules())
        return not shards_weights(self.trainer.strategy) and convolutions > 1

    def on_validation_epoch_start(self) -> None:
        # Sharding engines leave BatchNorm statistics to each process: validate one model, rank 0's.
        if self.trainer.world_size > 1 and shards_weights(self.trainer.strategy):
            share_buffers(self.backbone)

    def parameter_groups(self) -> list[dict]:
        """AdamW's groups, named for the learning-rate curves: the head's and the backbone's (whose
        learning rate may be a share of the head's), each split into decayed and not."""
        heads = tuple(f"{name}." for name in head_names(self.backbone, self.hparams.num_classes))
        groups = []
        for part in ("head", "backbone"):
            named = [(name, p) for name, p in self.backbone.named_parameters() if p.requires_grad]
            in_part = [p for name, p in named if name.startswith(heads) == (part == "head")]
            # Biases and norm scales (the 1-D parameters) only fight the normalisation when decayed.
            for decayed in (True, False):
                params = [p for p in in_part if (p.ndim >= 2) == decayed]
                if params:
                    name = part if decayed else f"{part}_no_decay"
                    decay = self.hparams.weight_decay if decayed else 0.0
                    groups.append({"name": name, "params": params, "weight_decay": decay})
        return groups

    def configure_optimizers(self) -> dict:
        groups = self.parameter_groups()
        check_same_optimizer_layout(self._saved_param_groups, groups)
        resumed = self.trainer.ckpt_path is not None  # its optimizer's state, learning rates included, follows
        if self._offloads_optimizer():
            # DeepSpeed steps an offloaded optimizer on the CPU and accepts only its own fused CPU
            # Adam there; adamw_mode gives it AdamW's decoupled weight decay.
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            optimizer = DeepSpeedCPUAdam(groups, lr=self.scaled_lr(report=not resumed), adamw_mode=True)
        else:
            # On a CPU torch steps AdamW one tensor at a time unless asked (a fifth of a resnet18 step);
            # its fused kernel steps them all at once. Elsewhere torch's own pick (foreach on GPUs) stays,
            # as it does for sharded parameters, and where gradients are clipped: Lightning refuses to
            # clip a fused optimizer's under mixed precision.
            fused = self.device.type == "cpu" and not shards_weights(self.trainer.strategy)
            fused = fused and not self.trainer.gradient_clip_val
            optimizer = torch.optim.AdamW(groups, lr=self.scaled_lr(report=not resumed), fused=fused or None)
        self._optimizer_class = type(optimizer).__name__
        check_same_optimizer_class(self._saved_optimizer_class, self._optimizer_class)
        total_steps = self.trainer.estimated_stepping_batches
        if not math.isfinite(total_steps):
            raise ConfigError(
                "The learning-rate schedule needs the run's length: set trainer.max_epochs or trainer.max_steps."
            )
        warmup_steps = round(total_steps * self.hparams.warmup_fraction)
        schedule = partial(warmup_cosine, warmup_steps=warmup_steps, total_steps=int(total_steps))
        # Freezing is a learning rate of 0, not requires_grad=False: DDP and the sharding engines
        # expect a gradient for every parameter they were given.
        backbone = partial(
            backbone_factor,
            schedule=schedule,
            scale=self.hparams.backbone_lr_scale,
            frozen_steps=self._frozen_steps(),
            warmup_steps=warmup_steps,
        )
        factors = [schedule if group["name"].startswith("head") else backbone for group in groups]
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": LambdaLR(optimizer, factors), "interval": "step"},
        }

    def _frozen_steps(self) -> int:
        """The optimizer steps of frozen_backbone_epochs."""
        epochs = self.hparams.frozen_backbone_epochs
        if not epochs:
            return 0
        batches = self.trainer.num_training_batches
        if not math.isfinite(batches):
            raise ConfigError("model.frozen_backbone_epochs needs epochs of known length: a sized dataset.")
        return epochs * math.ceil(batches / self.trainer.accumulate_grad_batches)

    def _offloads_optimizer(self) -> bool:
        zero = getattr(self.trainer.strategy, "config", None) or {}
        return "offload_optimizer" in zero.get("zero_optimization", {})

    def scaled_lr(self, report: bool = False) -> float:
        """`lr` scaled by the effective batch size; `report` logs the arithmetic (once, as training starts)."""
        lr = self.hparams.lr
        say = rank_zero_info if report else lambda line: None
        if not self.hparams.scale_lr:
            say(f"Learning rate {lr:.3g} (scale_lr is off)")
            return lr
        # Processes that each take a different batch: every process, unless some split one model
        # between them (tensor parallelism), which the sampler's replica count leaves out.
        devices = (self.trainer.distributed_sampler_kwargs or {}).get("num_replicas", 1)
        accumulate = self.trainer.accumulate_grad_batches
        effective = self.hparams.batch_size * devices * accumulate
        # Linear scaling keeps the update per image steady when the batch grows (Goyal et al., 2017).
        scaled = lr * effective / self.hparams.base_batch_size
        say(
            f"Learning rate {scaled:.3g} = {lr:.3g} x effective batch {effective} "
            f"({self.hparams.batch_size} per device x {devices} devices x {accumulate} accumulated) "
            f"/ base batch {self.hparams.base_batch_size}"
        )
        return scaled

    def logged_metrics(self) -> list[str]:
        """Every name this model logs, for checking what callbacks monitor."""
        names = ["train/loss", "train/loss_step", "train/loss_epoch", "val/loss", "test/loss"]
        logged = (self.val_metrics, self.test_metrics)
        if not self.batch_mixing.enabled:
            logged = (self.train_metrics, *logged)
        for metrics in logged:
            names += list(metrics.keys(keep_base=False))
        return names

    def setup(self, stage: str) -> None:
        self.check_run(self.trainer.callbacks, self.trainer.datamodule, self.trainer.max_epochs)
        batch_size = getattr(getattr(self.trainer.datamodule, "hparams", None), "batch_size", None)
        if batch_size is not None and batch_size != self.hparams.batch_size:
            # The CLI links them; made in Python, they may differ. The learning rate is scaled by the batch
            # the data gives (and Lightning's logger refuses two batch sizes in the run's hyperparameters).
            self.save_hyperparameters({**self.hparams, "batch_size": batch_size})  # the logged ones too
        image_size = getattr(getattr(self.trainer.datamodule, "hparams", None), "image_size", None)
        if image_size and not shards_weights(self.trainer.strategy) and self.hparams.compile_mode == "off":
            # Lightning's model summary runs one such image through the model to count its FLOPs (it
            # says 0 without one). Not sharded (every process would have to take part), nor compiled
            # (it would compile once more, for a batch of one).
            self.example_input_array = torch.zeros(1, 3, image_size, image_size, dtype=torch.uint8)
        if stage == "fit" and self.hparams.class_weights == "balanced":
            data = self.trainer.datamodule
            if not hasattr(data, "train_class_counts"):
                raise ConfigError("model.class_weights balanced counts the classes of an ImageDataModule's images.")
            if data.hparams.balanced_sampling:
                rank_zero_warn(
                    "model.class_weights balanced and data.balanced_sampling each even out the classes: together they "
                    "favour the rare ones. Use one."
                )
            counts = torch.tensor(data.train_class_counts(), dtype=torch.float32)
            self.loss_weights = counts.sum() / (len(counts) * counts.clamp(min=1))
        if stage == "fit" and self.batch_mixing.enabled:
            rank_zero_info(
                "Mixup/CutMix on: train/loss_step and train/loss_epoch are the loss on the blended images; the train/ "
                "accuracy metrics are off for the whole run (a blended image has no one label); val/ metrics are on "
                "whole images."
            )

    def check_run(self, callbacks: list, datamodule, max_epochs: int | None = None) -> None:
        """Refuse what would fail only later: a monitored metric that is never logged (after the first
        epoch), data with other classes, an image size the backbone cannot take (after loading data)."""
        frozen = self.hparams.frozen_backbone_epochs
        if frozen and max_epochs not in (None, -1) and frozen >= max_epochs:
            raise ConfigError(
                f"model.frozen_backbone_epochs ({frozen}) must be below trainer.max_epochs ({max_epochs}): "
                "the backbone would never train."
            )
        logged = self.logged_metrics()
        for callback in callbacks:
            monitor = getattr(callback, "monitor", None)
            if monitor and monitor not in logged:
                close = difflib.get_close_matches(monitor, logged, n=3, cutoff=0.3)
                raise ConfigError(
                    f"{type(callback).__name__} monitors {monitor!r}, which is never logged. "
                    f"Did you mean {' or '.join(repr(name) for name in close)}? Logged: {', '.join(logged)}"
                )
        class_names = getattr(datamodule, "class_names", None)
        if class_names is not None and len(class_names) != self.hparams.num_classes:
            raise DataError(
                f"The model has {self.hparams.num_classes} classes but the data has {len(class_names)} "
                f"({', '.join(class_names)}). Train a model on this data, or point --data.data_dir at data "
                "with the model's classes."
            )
        image_size = getattr(getattr(datamodule, "hparams", None), "image_size", None)
        if image_size is not None and image_size != self._size_checked:  # one dry forward is enough
            check_image_size(self.backbone, self.hparams.backbone, image_size)
            self._size_checked = image_size

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # The weights are in the checkpoint: rebuilding the model from it must not download or read them.
        checkpoint["hyper_parameters"].update(pretrained=False, init_weights=None)
        checkpoint[BUILT_WITH] = built_with(self.backbone)  # what the rebuilt model then lacks
        checkpoint["random_state"] = random_state.capture()
        checkpoint["optimizer_class"] = self._optimizer_class
        if epoch_goes_on_after(self.trainer):
            # For the resumed run's epoch metrics to be over the whole epoch, not only its part.
            checkpoint["train_metrics_so_far"] = states_so_far(self._train_epoch_metrics())

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if states := checkpoint.get("optimizer_states"):
            self._saved_param_groups = states[0]["param_groups"]
            self._saved_optimizer_class = checkpoint.get("optimizer_class")  # saved since the class was checked
        self.trained_until = {"epoch": checkpoint.get("epoch", 0), "step": checkpoint.get("global_step", 0)}
        self._resumed_random_state = checkpoint.get("random_state")
        self._resumed_train_metrics = checkpoint.get("train_metrics_so_far")
        build_as(self.backbone, checkpoint.get(BUILT_WITH, {}))
        check_same_classes(checkpoint.get("hyper_parameters", {}).get("class_names"), self.hparams.class_names)
        fitting = self._trainer is not None and self._trainer.state.fn == TrainerFn.FITTING  # not load_from_checkpoint
        averaged = fitting and any(isinstance(callback, WeightAveraging) for callback in self._trainer.callbacks)
        if fitting and "current_model_state" in checkpoint and not averaged:
            # Its state_dict is the average (ModelEMA's), which training would otherwise go on from.
            checkpoint["state_dict"] = checkpoint["current_model_state"]
            rank_zero_info(
                "The checkpoint holds an average of the weights (ModelEMA), which is not among the callbacks "
                "now: training goes on from the trained weights, without the average."
            )

    def on_train_start(self) -> None:
        # Restored here, after the last draws that an uninterrupted run would not make (setup, the
        # sanity check), so that training draws on from where the checkpoint was written.
        if self._resumed_random_state is not None:
            random_state.restore(self._resumed_random_state)
            self._resumed_random_state = None
        if self._resumed_train_metrics is not None:
            if self.global_rank == 0:  # the sum over every process, to which each adds its own part
                add_states(self._train_epoch_metrics(), self._resumed_train_metrics)
            self._resumed_train_metrics = None
            if self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
                # Resumed from a stop in the epoch's closing validation: no step is left to log the epoch's
                # numbers, and logged at its end they would come after the progress callbacks read them.
                self.log("train/loss_epoch", self.train_loss)
                if not self.batch_mixing.enabled:
                    self.log_dict(self.train_metrics)
        if self.trainer.ckpt_path is not None:
            self.resume_schedule()
            self.say_restored_lr()
            if (folder := self._checkpoint_folder()) is not None:
                forget_rows_from(folder.parent / "metrics.csv", self.trainer.global_step)
        self.say_schedules()

    def say_schedules(self) -> None:
        """When the augmentation policy and the mixing start, said as training starts: a resumed run
        knows its epoch only then, and one past their start says nothing of them."""
        epoch, unmixed = next_epoch(self.trainer), self.hparams.unmixed_epochs
        augment_schedule = getattr(self.trainer.datamodule, "augment_schedule", None)
        if augment_schedule is not None and (line := augment_schedule(epoch)):
            rank_zero_info(line)
        if self.batch_mixing.enabled and not self.mixes_at(epoch):
            line = f"Until epoch {unmixed} the model trains on whole images, then on Mixup/CutMix blends"
            rank_zero_info(f"{line} (model.unmixed_epochs){ends_before(self.trainer, unmixed)}")

    def mixes_at(self, epoch: int) -> bool:
        """Whether the training batches of `epoch` are blended: Mixup/CutMix on, from model.unmixed_epochs."""
        return self.batch_mixing.enabled and epoch >= self.hparams.unmixed_epochs

    def _train_epoch_metrics(self) -> dict:
        return {"loss": self.train_loss, **self.train_metrics}

    def resume_schedule(self) -> None:
        """Go on at this fit's schedule where the checkpoint stopped. The optimizer comes back with the
        rate of the run's last step, and the scheduler sets the next only after a step: a finished
        run's cosine stretched by `--ckpt_path last` would train a step at its end's 0. An interrupted
        run's schedule gives the rate it saved."""
        scheduler = self.lr_schedulers()
        groups = scheduler.optimizer.param_groups
        for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
            group["lr"] = base * factor(scheduler.last_epoch)

    def say_restored_lr(self) -> None:
        """The learning rate a resumed run goes on with: its checkpoint's, which other settings (the
        devices, accumulation) would have scaled otherwise for a new run."""
        scheduler = self.lr_schedulers()
        names = [group.get("name") for group in scheduler.optimizer.param_groups]
        head = names.index("head") if "head" in names else 0
        restored, now = scheduler.base_lrs[head], scheduler.optimizer.param_groups[head]["lr"]
        scaled = self.scaled_lr()
        other = "" if math.isclose(restored, scaled) else f"; these settings would give a new run {scaled:.3g}"
        # The schedule's end is this fit's: `--ckpt_path last` with a higher limit stretches it to there.
        end = int(self.trainer.estimated_stepping_batches)
        rank_zero_info(
            f"Learning rate {restored:.3g} at its peak ({now:.3g} at this step of its schedule, which ends at step "
            f"{end}), the checkpoint's, restored with its optimizer{other}"
        )

    def on_fit_start(self) -> None:
        if (folder := self._checkpoint_folder()) is None:
            return
        mark_unfinished(folder)  # until this fit ends: --ckpt_path auto continues it if it does not
        rank_zero_info(f"Run folder: {folder.parent} (config.yaml, {folder.name}/)")
        if self.hparams.class_names:  # the label order next to the checkpoints, for tools that read none
            write_whole(folder / "class_names.json", json.dumps(self.hparams.class_names, indent=2) + "\n")

    def on_fit_end(self) -> None:
        # Not reached when a run is interrupted (SIGTERM, an error): --ckpt_path auto then goes on with it.
        if (folder := self._checkpoint_folder()) is not None:
            mark_finished(folder, self.trainer.current_epoch, self.trainer.global_step)

    def _checkpoint_folder(self) -> Path | None:
        """The run's checkpoint folder, made, on the process that writes files; None where none is kept."""
        checkpoint = self.trainer.checkpoint_callback
        keeps_checkpoints = checkpoint is not None and checkpoint.dirpath and not self.trainer.fast_dev_run
        if not (self.trainer.is_global_zero and keeps_checkpoints):
            return None
        folder = Path(checkpoint.dirpath)
        folder.mkdir(parents=True, exist_ok=True)
        return folder


def backbone_factor(step: int, schedule, scale: float, frozen_steps: int, warmup_steps: int) -> float:
    """The backbone's learning-rate factor: 0 while it is frozen, then `scale` x the schedule,
    warmed up again over `warmup_steps` after a freeze (its first steps would otherwise be at full rate)."""
    if step < frozen_steps:
        return 0.0
    ramp = min(1.0, (step - frozen_steps + 1) / warmup_steps) if frozen_steps and warmup_steps else 1.0
    return scale * ramp * schedule(step)


def warmup_cosine(step: int, warmup_steps: int, total_steps: int) -> float:
    """Learning-rate factor: linear from ~0 to 1 over `warmup_steps`, then cosine down to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def check_same_optimizer_layout(saved_groups: list[dict] | None, groups: list[dict]) -> None:
    """Refuse to resume an optimizer whose parameter groups (their tensor counts) are not this model's:
    torch would stop on them with a traceback, or, same in size, pair moments with other tensors."""
    if saved_groups is None:
        return
    saved, ours = ([len(group["params"]) for group in each] for each in (saved_groups, groups))
    if saved == ours:
        return
    said = (f"{len(saved)} parameter groups and this model's {len(ours)}" if len(saved) != len(ours)
            else f"parameter groups of {saved} tensors and this model's of {ours}")  # fmt: skip
    raise ConfigError(
        f"The checkpoint's optimizer has {said}: the trainable parameters changed since it was saved (model.py "
        "edited, layers frozen with requires_grad, or an earlier version of the project). Resume it with the code "
        "that saved it, or start a new run."
    )


def check_same_optimizer_class(saved: str | None, ours: str) -> None:
    """Refuse to resume the state of another kind of optimizer: torch would load its settings into
    this one's groups, and stop at the first step with a KeyError for a setting it lacks."""
    if saved not in (None, ours):
        raise ConfigError(
            f"The checkpoint's optimizer is {saved} and this model's {ours} (configure_optimizers in model.py "
            "edited): its state cannot carry over. Resume it with the code that saved it, or start a new run."
        )


def check_same_architecture(saved: dict, model: L.LightningModule) -> None:
    """Refuse a checkpoint whose weights do not fit `model` (another backbone, stem or head) in one
    line, where loading it would list every missing, unexpected and misshapen tensor."""
    weights, ours = saved.get("state_dict"), model.state_dict()
    if weights is None:  # shards (FSDP, DeepSpeed), which the strategy checks as it loads them
        return
    # getattr: a module's _extra_state may be any object.
    misfits = sorted(name for name in weights.keys() | ours.keys() if name not in weights or name not in ours
                     or getattr(weights[name], "shape", None) != getattr(ours[name], "shape", None))  # fmt: skip
    if misfits:
        trained, backbone = saved.get("hyper_parameters", {}).get("backbone", "another model"), model.hparams.backbone
        model_now, fix = f"this model ({backbone})", "the model options it was trained with (its run's config.yaml)"
        if trained == backbone:  # the same options: the code that builds the model changed
            model_now, fix = f"the {backbone} this code builds", "the model code it was trained with, or train anew"
        raise ConfigError(
            f"The checkpoint's weights ({trained}) do not fit {model_now}: {len(misfits)} tensors differ, "
            f"{misfits[0]} first. Use {fix}."
        )
{%- if cookiecutter.inference == "yes" %}


def load_trained(checkpoint: str | Path, map_location: str | torch.device) -> ImageClassifier:
    """The model of a checkpoint, built from its options; refused in one line where its weights no
    longer fit what this code builds from them (the model's code changed since it was trained)."""
    try:
        return ImageClassifier.load_from_checkpoint(checkpoint, map_location=map_location, weights_only=True)
    except RuntimeError as error:
        if not str(error).startswith("Error(s) in loading state_dict"):
            raise
        first = str(error).splitlines()[1].strip().rstrip(".")
        raise ConfigError(
            f"The weights in {checkpoint} do not fit the model this code builds from its options ({first}): the "
            "model's code changed since it was trained. Use the code it was trained with, or train anew."
        ) from None
{%- endif %}


def check_same_classes(trained: list[str] | None, given: list[str] | None) -> None:
    """Refuse weights trained on other classes than the data's (or the model's) names, where both are known."""
    if trained and given and list(trained) != list(given):
        raise DataError(
            f"The checkpoint was trained on the classes {list(trained)} but this model (and its data) has "
            f"{list(given)}. Use data with the checkpoint's classes, or train on these from its weights: fit "
            "--model.init_weights <checkpoint>."
        )
