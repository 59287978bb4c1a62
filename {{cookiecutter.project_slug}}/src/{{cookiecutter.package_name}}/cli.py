"""The command line: LightningCLI over ImageClassifier and ImageDataModule.

Every option is an `__init__` argument of the model, the data module or the Trainer; YAML files
hold them, composed by repeating --config (the later file wins).
"""

import difflib
import re
import signal
import sys
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import SIGTERMException

from . import benchmark, classify, consolidate, curves, doctor, export, tune
from .callbacks import EndWithLauncher
from .data import ImageDataModule
from .hardware import HardwareError, check_hardware
from .model import ImageClassifier
from .resume import resolve_resume
{%- if cookiecutter.logger == "wandb" %}
from .wandb_logging import SaveConfigToRun, go_offline_unless_reachable
{%- endif %}

# Relative to where the command runs: the project folder, as for data/ and runs/. The hardware
# preset chosen when the project was generated, then the recipe; --config files given on the
# command line come after both and win (--config configs/trainer/fsdp.yaml switches the hardware).
DEFAULT_CONFIGS = [Path("configs/trainer/{{ cookiecutter.__trainer_preset }}.yaml"), Path("configs/default.yaml")]
# This project's commands beside LightningCLI's fit, validate, test and predict (and doctor).
TOOLS = {
    "benchmark": benchmark.main,
    "classify": classify.main,
    "consolidate": consolidate.main,
    "export": export.main,
    "report": curves.main,
    "tune": tune.main,
}


class SuggestingParser(LightningArgumentParser):
    """Name the closest option when one is misspelt, on the command line or in a config file."""

    def error(self, message: str, *args, **kwargs):
        wrong = re.search(r"unrecognized arguments: --([\w.]+)", message)
        in_file = re.search(r"(Group|Subcommand) '([\w.]+)' does not accept option '([\w.]+)'", message)
        if wrong:
            key = wrong.group(1)
        elif in_file:
            kind, group, option = in_file.groups()
            key = f"{group}.{option}" if kind == "Group" else option
        else:
            key = None
        close = difflib.get_close_matches(key, self._option_names(), n=3, cutoff=0.6) if key else []
        if close:
            message += f". Did you mean {' or '.join(close)}?"
        super().error(message, *args, **kwargs)

    def _option_names(self) -> list[str]:
        names = [option[2:] for option in self._option_string_actions if option.startswith("--")]
        for action in self._actions:  # the options of the subcommands (fit, validate, ...)
            for parser in (getattr(action, "choices", None) or {}).values():
                if isinstance(parser, SuggestingParser):
                    names += parser._option_names()
        return names


class ClassifierCLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        # The model sizes its head from the data and scales its learning rate by the data's batch.
        parser.link_arguments("data.batch_size", "model.batch_size")
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"],
            default="high",
            help="float32 matrix multiplications: 'high' lets them use TF32 tensor cores on NVIDIA GPUs "
            "(Ampere and newer), several times faster at a precision training does not notice.",
        )

    def before_instantiate_classes(self) -> None:
{%- if cookiecutter.logger == "wandb" %}
        go_offline_unless_reachable()
{%- endif %}
        config = self.config[self.subcommand] if self.subcommand else self.config  # run=False: no subcommand
        check_hardware(config.trainer)
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        if config.trainer.benchmark is None:
            # cuDNN tries its convolution algorithms once per input shape and keeps the fastest; that
            # choice is not reproducible, so deterministic runs keep the default algorithms.
            config.trainer.benchmark = config.trainer.deterministic in (None, False)
        resolve_resume(config, self.subcommand)


def main(args: list[str] | None = None) -> None:
    command = sys.argv[1:] if args is None else args
    if command[:1] == ["doctor"]:
        sys.exit(doctor.main(command[1:], DEFAULT_CONFIGS))
    if command[:1] and command[0] in TOOLS:
        sys.exit(TOOLS[command[0]](command[1:]))
    defaults = [str(path) for path in DEFAULT_CONFIGS if path.is_file()]
    if len(defaults) < len(DEFAULT_CONFIGS):
        missing = ", ".join(str(path) for path in DEFAULT_CONFIGS if not path.is_file())
        print(f"No {missing} in {Path.cwd()}: run from the project folder or pass --config.", file=sys.stderr)
    try:
        run_cli(defaults, args)
    except HardwareError as error:
        sys.exit(f"error: {error}")
    except SIGTERMException:
        # Lightning ends a SIGTERM'd run with exit status 0; schedulers must not take it for a success.
        sys.exit(128 + signal.SIGTERM)


def run_cli(defaults: list[str], args: list[str] | None) -> None:
    ClassifierCLI(
        ImageClassifier,
        ImageDataModule,
        parser_class=SuggestingParser,
        parser_kwargs={
            command: {"default_config_files": defaults} for command in ("fit", "validate", "test", "predict")
        },
{%- if cookiecutter.logger == "wandb" %}
        save_config_callback=SaveConfigToRun,
{%- endif %}
        # A resumed run writes its config.yaml again, into its own folder.
        save_config_kwargs={"overwrite": True},
        # Always on, whatever callbacks a config lists: no process outlives its launcher.
        trainer_defaults={"callbacks": [EndWithLauncher()]},
        args=args,
    )
