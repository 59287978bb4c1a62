"""Warnings and tips from the libraries we build on that say nothing about the user's run, silenced
here with the reason for each, so that what a run prints is worth reading. tests/test_warnings.py
fails on any other warning a short run prints."""

import logging
import os
import re
import warnings
from pathlib import Path

# Each pattern matches a message from its start, as warnings.filterwarnings reads it.
SILENCED_WARNINGS = [
    # Lightning checks pytree specs in a way newer torch deprecates: nothing in the run to change.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # Mixed precision keeps float32 weights: the 32-bit size the summary falls back to is the true one.
    r"Precision (bf16|16)-mixed is not supported by the model summary",
{%- if cookiecutter.streaming == "yes" %}
    # Streaming data: LitData gives each data worker its own share, so the length is right.
    r"Your `IterableDataset` has `__len__` defined",
{%- endif %}
    # A mid-epoch checkpoint: the data module resumes the epoch's data itself (datasets/sampling.py).
    r"You're resuming from a checkpoint that ended before the epoch ended",
    # A checkpoint of another run (a copied file, or an evaluation on other data) starts a run of its
    # own, which keeps its own best checkpoints: the old folder's list is rightly not carried over.
    r"The dirpath has changed from",
    # The commands that run fits of their own (doctor and the like) give LightningCLI those fits'
    # options, beside their own command line: on purpose, and the warning would land inside their
    # one-line errors.
    r"LightningCLI's args parameter is intended to run from within Python",
]


def one_line_warnings() -> None:
    """This project's warnings (an unreadable image, a class imbalance) in one line, `warning: <what
    and the fix>`, as its errors read, where Python adds the file, line and source that warned. In
    every process, data workers included: the package does this as it is imported."""
    package, others = Path(__file__).resolve().parent.parent, warnings.formatwarning

    def formatted(message, category, filename, lineno, line=None) -> str:
        if Path(filename).resolve().is_relative_to(package):
            return f"warning: {message}\n"
        return others(message, category, filename, lineno, line)

    warnings.formatwarning = formatted


def silence_dependency_noise() -> None:
    for message in SILENCED_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(drop_advertising)
    logging.getLogger("DeepSpeed").addFilter(drop_cpu_fallback_notice)
{%- if cookiecutter.streaming == "yes" %}
    logging.getLogger("litdata.streaming.dataset").addFilter(drop_uneven_shares_notice)
{%- endif %}
{%- if cookiecutter.tuning == "yes" %}
    logging.getLogger("lightning.pytorch.trainer.connectors.checkpoint_connector").addFilter(drop_weights_only_notice)
{%- endif %}


def silence_resume_notice(checkpoints: Path) -> None:
    # Lightning warns of a checkpoint folder that holds files: a resume goes on in its run's own folder.
    folder = re.escape(f"{os.sep}{checkpoints.parent.name}{os.sep}{checkpoints.name}")
    warnings.filterwarnings("ignore", message=rf"Checkpoint directory .*{folder} exists and is not empty")


def silence_training_callbacks_notice() -> None:
    # An evaluation runs without the callbacks that trained its checkpoint, and needs none: their
    # state is for a resumed fit, and ModelEMA's average is the checkpoint's weights already.
    warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`, callbacks used to create")


def silence_unmonitored_notice() -> None:
    # With validation off, ModelCheckpoint's hint to log its monitored key would send one looking for a bug.
    warnings.filterwarnings("ignore", message=r"`ModelCheckpoint\(monitor=.*could not find the monitored key")


def drop_advertising(record: logging.LogRecord) -> bool:
    # Lightning recommends its cloud logger at every start when none is in use.
    return not record.getMessage().startswith("💡 Tip")
{%- if cookiecutter.streaming == "yes" %}


def drop_uneven_shares_notice(record: logging.LogRecord) -> bool:
    # LitData's notice that evaluation shares differ between processes, which is how every image counts
    # once; under FSDP and DeepSpeed, whose forward needs every process, they are evened out (datasets/streaming.py).
    return "have disabled the `drop_last` option" not in record.getMessage()
{%- endif %}
{%- if cookiecutter.tuning == "yes" %}


def drop_weights_only_notice(record: logging.LogRecord) -> bool:
    # Lightning's learning-rate finder (tune) saves its scratch checkpoint without saying what it keeps;
    # the checkpoints of a run are written whole.
    return "`weights_only` was not set" not in record.getMessage()
{%- endif %}


def drop_cpu_fallback_notice(record: logging.LogRecord) -> bool:
    # DeepSpeed, imported on a machine without CUDA, says on stdout that it falls back to the CPU: the
    # trainer has chosen the device already, and the line would spoil `fit --print_config > run.yaml`.
    return not record.getMessage().startswith("Setting accelerator to CPU")
