"""Weights & Biases that never hangs or crashes for want of a key or a network."""

import netrc
import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from ..errors import PACKAGE, ConfigError, literal_choices
from ..hardware.network import reachable
from .csv_logging import AppendingExperimentWriter
from .resume import SaveConfigWhole
from .run_folders import logger_run_folder


def go_offline_unless_reachable(save_dir: str) -> None:
    """Log offline, and say so in one line naming where the runs wait (the logger's `save_dir`), when
    there is no API key or the W&B server is out of reach.

    Without this, W&B stops the run at setup when no key is set, and waits about 100 s when the
    server is unreachable. An explicit WANDB_MODE is left alone.
    """
    if os.environ.get("WANDB_MODE"):
        if problem := wandb_mode_problem():
            raise ConfigError(problem)
        return
    host = _server()
    if not has_api_key():
        reason = "no API key (set WANDB_API_KEY or run `wandb login`)"
    elif not reachable(host):
        reason = f"{host} cannot be reached"
    else:
        return
    os.environ["WANDB_MODE"] = "offline"  # inherited by the processes of a multi-device run
    waiting = Path(save_dir) / "wandb" / "offline-run-*"
    rank_zero_info(f"W&B logs offline: {reason}. Upload later with `wandb sync {waiting}`.")


def wandb_mode_problem() -> str | None:
    """What is wrong with WANDB_MODE, if W&B would refuse it (with a traceback, as its run starts)."""
    mode = os.environ.get("WANDB_MODE", "")
    try:
        from wandb.sdk.wandb_settings import Settings

        modes = [str(choice) for choice in literal_choices(Settings.model_fields["mode"].annotation)]
    except (ImportError, AttributeError, KeyError):  # another W&B than this was written against: it judges
        return None
    if not mode or not modes or mode in modes:
        return None
    return f"WANDB_MODE={mode} is no W&B mode: set it to online, offline or disabled, or unset it"


def has_api_key() -> bool:
    """A key in WANDB_API_KEY or in the netrc file that `wandb login` writes."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(_server()) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _server() -> str:
    return urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"


class BestModelWandbLogger(WandbLogger):
    """Lightning's WandbLogger, whose log_model uploads the checkpoints that monitor a metric only,
    and says so when they are folders of shards, which it cannot upload; and which keeps the metrics
    in the run's folder too (metrics.csv, appended to on resume), for `report` and for reading them
    without W&B.

    The last.ckpt callback monitors nothing, so Lightning would count its file as that callback's
    best and move the artifact's "best" alias onto it.
    """

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        save_dir: str = ".",
        log_model: bool | Literal["all"] = False,
        version: str | None = None,
        offline: bool = False,
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        job_type: str | None = None,
    ) -> None:
        """
        Args:
            project: the W&B project.
            name: the run's display name (W&B makes one up when None).
            save_dir: the folder of W&B's files (wandb/) and of the run folders (<project>/<run id>/).
            log_model: upload the best checkpoint as an artifact when training ends (true), or each new best (all).
            version: the run's id; `fit --ckpt_path auto` sets it to continue a run.
            offline: log offline; Lightning refuses it beside log_model, which WANDB_MODE=offline (as without
                an API key) keeps, its uploads waiting for `wandb sync`.
            entity: the W&B team or user the run belongs to.
            group: the group of runs it belongs to.
            tags: its tags.
            notes: a note on the run.
            job_type: the kind of run, to filter by.
        """
        # Listed here, not passed on as **kwargs: LightningCLI would read WandbLogger's own signature,
        # whose annotations import wandb (0.7 s on 2 cores) at every parse, `--help` and fast_dev_run
        # included, long before a run logs. Other wandb.init settings: its WANDB_* environment variables.
        super().__init__(
            name=name, save_dir=save_dir, version=version, offline=offline, project=project, log_model=log_model,
            entity=entity, group=group, tags=tags, notes=notes, job_type=job_type,
        )  # fmt: skip
        self._local_metrics: AppendingExperimentWriter | None = None

    @rank_zero_only
    def log_metrics(self, metrics: dict, step: int | None = None) -> None:
        super().log_metrics(metrics, step)
        # Numbers only: log_image and log_table come through here too.
        numbers = {name: value for name, value in metrics.items() if isinstance(value, (int, float, torch.Tensor))}
        if not numbers:
            return
        if self._local_metrics is None:
            self._local_metrics = AppendingExperimentWriter(log_dir=str(logger_run_folder(self, ".")))
        self._local_metrics.log_metrics(numbers, step)

    @rank_zero_only
    def save(self) -> None:
        super().save()
        if self._local_metrics is not None:
            self._local_metrics.save()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        if self._local_metrics is not None:
            self._local_metrics.save()

    @property
    def experiment(self):
        # _experiment and _wandb_init are WandbLogger's private state, the only place these
        # arguments exist before W&B starts (pyproject.toml bounds lightning to the releases tested).
        if self._experiment is None:  # before W&B starts
            # Lightning passes anonymous=None, which W&B takes for a setting, warning at every start.
            if self._wandb_init.get("anonymous", False) is None:
                del self._wandb_init["anonymous"]
            # W&B looks for a git repository from its folder and warns when that does not exist yet.
            if self._wandb_init.get("dir"):
                Path(self._wandb_init["dir"]).mkdir(parents=True, exist_ok=True)
        return super().experiment

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        if checkpoint_callback.monitor is None:
            return
        if self._log_model and Path(checkpoint_callback.best_model_path).is_dir():
            # Lightning skips folders without a word: the run would end with no model uploaded.
            rank_zero_warn(
                f"W&B log_model={self._log_model}: this strategy's checkpoints are folders of shards, which W&B's "
                f"logger does not upload. Make one a file with `python -m {PACKAGE} consolidate` "
                "and upload that with `wandb artifact put`."
            )
        super().after_save_checkpoint(checkpoint_callback)


class SaveConfigToRun(SaveConfigWhole):
    """With W&B, save the resolved config as config.yaml in the run's folder and in the W&B run.

    LightningCLI's default writes it to trainer.log_dir, which for W&B is the folder all runs
    share, so the second run would find the first one's file; other loggers' log_dir is their run's own.
    """

    def run_folder(self, trainer, log_dir: str) -> Path:
        if isinstance(trainer.logger, WandbLogger):
            return logger_run_folder(trainer.logger, trainer.default_root_dir)
        return super().run_folder(trainer, log_dir)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        # An evaluation resumes its training run: keep that run's config.
        if isinstance(trainer.logger, WandbLogger) and stage == "fit":
            trainer.logger.log_hyperparams({"config": self.config.as_dict()})
