"""An exponential moving average (EMA) of the weights, validated, checkpointed{{ " and exported" if cookiecutter.inference == "yes" }} in their place."""

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from torch.optim.swa_utils import AveragedModel

from ..errors import ConfigError
from ..hardware.sharding import shards_weights


class WarmedUpEMA:
    """The average's update: decay d_t = min(decay, (1 + t) / (10 + t)) after t updates (the warm-up
    of TensorFlow's ExponentialMovingAverage), so early on the average follows the weights closely;
    with a constant 0.9998, a run of a few thousand steps would keep a good part of its random start."""

    def __init__(self, decay: float) -> None:
        self.decay = decay

    @torch.no_grad()
    def __call__(self, averaged: list[torch.Tensor], current: list[torch.Tensor], updates: torch.Tensor) -> None:
        if not averaged[0].is_floating_point():  # counters (BatchNorm's batches seen) are not averaged
            torch._foreach_copy_(averaged, current)
            return
        decay = torch.clamp((1 + updates) / (10 + updates), max=self.decay)
        torch._foreach_lerp_(averaged, current, 1 - decay.to(averaged[0]))


class ModelEMA(WeightAveraging):
    """Lightning's weight averaging with an EMA of the weights and buffers (BatchNorm statistics),
    as the reference training recipes keep: validation runs on the average, and every
    checkpoint's weights are the average (so `best`{{ ", `classify` and `export` use" if cookiecutter.inference == "yes" else " uses" }} it), with the
    trained weights beside them for resuming, which restores both exactly.

    Args:
        decay: The average's decay per update after warm-up; 0.9998 suits runs of some thousands
            of steps or more (the average spans about 1 / (1 - decay) updates), 0.999 shorter ones.
        update_every_n_steps: Update the average every this many optimizer steps.
        device: Where the average lives: None for the model's device, "cpu" to spare accelerator memory.
    """

    def __init__(self, decay: float = 0.9998, update_every_n_steps: int = 1, device: str | None = None) -> None:
        if not 0 < decay < 1:
            raise ConfigError(f"ModelEMA decay must be above 0 and below 1, got {decay}")
        if update_every_n_steps < 1:
            raise ConfigError(f"ModelEMA update_every_n_steps must be 1 or more, got {update_every_n_steps}")
        super().__init__(device=device, use_buffers=True, multi_avg_fn=WarmedUpEMA(decay))
        self.update_every_n_steps = update_every_n_steps
        self._swapped = False  # the average in the module, the trained weights in the copy: during validation

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx % self.update_every_n_steps == 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and shards_weights(trainer.strategy):
            raise ConfigError(
                f"ModelEMA averages a whole copy of the model on each process, which {type(trainer.strategy).__name__} "
                "does not keep (FSDP shards the weights, DeepSpeed steps them in its engine): train with DDP "
                "(configs/trainer/ddp.yaml), or remove the ModelEMA callback."
            )
        if stage == "fit":
            # Lightning's setup would call configure_model first, for models that build layers there
            # (it warns so); ours builds them in __init__ and only lays them out (channels-last,
            # compile) there, which the copy need not share. Lightning has set the module's device
            # already (its parameters move later): the average is made there.
            device = pl_module.device if self._device is None else self._device
            self._average_model = AveragedModel(pl_module, device=device, use_buffers=True, **self._kwargs)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # The module holds the average after fit. Kept, it would make a later trainer.test(ckpt_path=...)
        # load the checkpoint's trained weights instead of its average.
        if stage == "fit":
            self._average_model = None

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_epoch_start(trainer, pl_module)
        self._swapped = self._average_model is not None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_epoch_end(trainer, pl_module)
        self._swapped = False

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if self._swapped and "current_model_state" in checkpoint:
            # Saved within a validation (a stop during it): Lightning's labels are the wrong way round.
            checkpoint["state_dict"], checkpoint["current_model_state"] = (
                checkpoint["current_model_state"],
                checkpoint["state_dict"],
            )

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Outside fit there is no average to restore: the checkpoint's weights are the average already.
        if self._average_model is not None:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
