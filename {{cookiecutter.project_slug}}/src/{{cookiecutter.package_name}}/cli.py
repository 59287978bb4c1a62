"""The command line: LightningCLI over ImageClassifier and ImageDataModule, and the table of the
project's other commands.

Every option is an `__init__` argument of the model, the data module or the Trainer; YAML files
hold them, composed by repeating --config (the later file wins).
"""

import argparse
import contextlib
import enum
import functools
import importlib
import inspect
import io
import itertools
import json
import logging
import os
import re
import signal
import sys
import textwrap
import traceback
import warnings
from collections.abc import Callable, Mapping
from importlib.util import find_spec
from pathlib import Path
from typing import Literal

import jsonargparse
import lightning
import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import ParallelStrategy
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException

from .data import ImageDataModule
from .datasets.folders import TooFewClassesError
from .errors import (
    PACKAGE,
    ConfigError,
    DataError,
    MissingError,
    UserError,
    likely_meant,
    one_line,
    other_process_gone,
    refused_by_file_system,
    wants_traceback,
)
from .hardware.checks import check_hardware, settle_precision
from .hardware.sharding import shards_weights
from .model import ImageClassifier, check_same_architecture, check_same_classes, check_same_optimizer_layout
from .training.callbacks import EndWithLauncher, started_by_local_rank_0, take_over_started_processes, wait_for
from .training.checkpoint_io import Trainer
from .training.progress import LogLines
from .training.quiet import (
    silence_dependency_noise,
    silence_resume_notice,
    silence_training_callbacks_notice,
    silence_unmonitored_notice,
)
from .training.resume import (
    ALLOW_CHANGES,
    EVALUATIONS,
    FIRST_WEIGHTS,
    LINKED,
{%- if cookiecutter.logger != "wandb" %}
    SaveConfigWhole,
{%- endif %}
    as_plain,
    check_checkpoint,
    check_ckpt_path_word,
    check_sharded_strategy,
    chosen_runs,
    ckpt_path_takes,
{%- if cookiecutter.logger == "wandb" %}
    configured_loggers,
{%- endif %}
    evaluate_on_trained_data,
    first_logger,
{%- if cookiecutter.logger == "wandb" %}
    is_wandb,
{%- endif %}
    resolve_resume,
    resume_command,
    resumed_config_name,
    run_root,
    saved_checkpoint,
)
from .training.run_folders import check_writable, hold_run, is_first_process, refuse_choice, release_run
from .training.sigterm import REQUEUE_SIGNALS, ends_while_blocked, requeue_signal_as_sigterm, signal_said
{%- if cookiecutter.logger == "wandb" %}
from .training.wandb_logging import SaveConfigToRun, go_offline_unless_reachable
{%- endif %}

# Relative to where the command runs: the project folder, as for data/ and runs/. The hardware
# preset chosen when the project was generated, then the recipe; --config files given on the
# command line come after both and win (--config configs/trainer/fsdp.yaml switches the hardware).
DEFAULT_CONFIGS = [Path("configs/trainer/{{ cookiecutter.__trainer_preset }}.yaml"), Path("configs/default.yaml")]
SUBCOMMANDS = ("fit", *EVALUATIONS)
# Lightning's --optimizer and --lr_scheduler would replace the model's parameter groups, warm-up and
# scaled learning rate whole, or (a scheduler alone) be ignored.
OWN_OPTIMIZER = (
    "--optimizer and --lr_scheduler are not used: the model makes its own (AdamW, warm-up then cosine). "
    "Set model.lr, model.weight_decay or model.warmup_fraction, or change configure_optimizers in model.py"
)
COMMAND_HELP = {
    "fit": "Train a model: a new run, or one that goes on (--ckpt_path auto or last).",
    "validate": "Evaluate a checkpoint on the validation images (default: the newest run's best).",
    "test": "Evaluate a checkpoint on the test images (default: the newest run's best).",
    "predict": "Write the top classes of the test (or validation) images as CSV, into the run's reports/.",
}
SEEDS = range(2**32)  # what numpy's generator takes, which Lightning seeds with the rest
# What writes a run's config.yaml.
{%- if cookiecutter.logger == "wandb" %}
SAVE_CONFIG = SaveConfigToRun
{%- else %}
SAVE_CONFIG = SaveConfigWhole
{%- endif %}
# The command line being run, and the folder it started in: jsonargparse reads a config file from
# inside the file's folder, where the paths on the command line lead nowhere.
GIVEN: list[str] = []
STARTED_IN: list[Path] = []
# Where an error raised while the Trainer is built means that Lightning refuses a setting.
LIGHTNING_SOURCE = os.path.join(os.path.dirname(lightning.__file__), "")
JSONARGPARSE_SOURCE = os.path.join(os.path.dirname(jsonargparse.__file__), "")
# This project's commands beside LightningCLI's fit, validate, test and predict: the module of each in commands/,
# whose main(argv) -> int runs it (or module:function). Imported only when its command runs, so
# `fit` loads none of them.
TOOLS = {
{%- if cookiecutter.tuning == "yes" %}
    "benchmark": "benchmark",
{%- endif %}
{%- if cookiecutter.inference == "yes" %}
    "classify": "classify",
{%- endif %}
    "consolidate": "consolidate",
{%- if cookiecutter.experiments == "yes" %}
    "cv": "crossval",
{%- endif %}
    "doctor": "doctor",
{%- if cookiecutter.inference == "yes" %}
    "export": "export",
{%- endif %}
{%- if cookiecutter.experiments == "yes" %}
    "repeat": "crossval:repeat",
{%- endif %}
    "report": "curves",
{%- if cookiecutter.serving == "yes" %}
    "serve": "serve",
{%- endif %}
{%- if cookiecutter.streaming == "yes" %}
    "shard": "shard",
{%- endif %}
{%- if cookiecutter.experiments == "yes" %}
    "sweep": "sweep",
{%- endif %}
{%- if cookiecutter.tuning == "yes" %}
    "tune": "tune",
{%- endif %}
}

# Trainer options of Lightning 1.x, in configs and scripts written for it, and what replaced them: their
# spellings are close to nothing of 2.x's (gpus would be taken for plugins).
LIGHTNING_1_OPTIONS = {
    "gpus": "trainer.accelerator gpu and trainer.devices <count>",
    "tpu_cores": "trainer.accelerator tpu and trainer.devices <count>",
    "num_processes": "trainer.devices <count>",
    "auto_select_gpus": "trainer.devices <count>, which takes free GPUs",
    "resume_from_checkpoint": "--ckpt_path <file> (or auto, or last)",
    "checkpoint_callback": "trainer.enable_checkpointing",
    "weights_summary": "trainer.enable_model_summary",
    "replace_sampler_ddp": "trainer.use_distributed_sampler",
    "amp_backend": "trainer.precision",
    "amp_level": "trainer.precision",
    "terminate_on_nan": "the StopOnNonFiniteLoss callback, on in every preset",
    "stochastic_weight_avg": "the StochasticWeightAveraging callback",
{%- if cookiecutter.tuning == "yes" %}
    "auto_lr_find": f"python -m {PACKAGE} tune lr",
    "auto_scale_batch_size": f"python -m {PACKAGE} tune batch_size",
{%- endif %}
}

# The classes the commands build, by section, and their modules: a config names none of them.
BUILT = {"model": ("ImageClassifier", "model.py"), "data": ("ImageDataModule", "data.py")}

# Some of Lightning's callbacks default an option to an Enum member (Timer's interval), which YAML
# cannot write: --print_config and the runs' config.yaml write its value, which the option reads back.
yaml.SafeDumper.add_multi_representer(enum.Enum, lambda dumper, member: dumper.represent_data(member.value))


def code_defaults(built: type) -> dict:
    """The defaults of a class's options, as a config holds them (tuples as lists)."""
    parameters = inspect.signature(built.__init__).parameters
    return {name: json.loads(json.dumps(parameter.default, default=str)) for name, parameter in parameters.items()}


def check_options_still_taken(ckpt_path: str) -> None:
    """Refuse, in one line, a checkpoint saved with model options that ImageClassifier no longer takes
    (renamed or removed since): Lightning would blame them on the command line, then add a line."""
    saved = saved_checkpoint(ckpt_path).get("hyper_parameters") or {}
    taken = code_defaults(ImageClassifier)
    if gone := [f"model.{name}" for name in saved if name not in taken and not name.startswith("_")]:
        raise ConfigError(
            f"{ckpt_path} was saved with {', '.join(gone)}, which ImageClassifier no longer takes: its code changed "
            "since. Put the option back in model.py to use this checkpoint, or train a new run."
        )


class SuggestingParser(LightningArgumentParser):
    """Tell a mistake in the options in one line, naming the closest option to a misspelt one, on the
    command line or in a config file, and the file and line of a YAML syntax error."""

    def error(self, message: str, *args, **kwargs):
        wrong = re.search(r"unrecognized arguments: --([\w.]+)", message)
        in_file = re.search(r"(Group|Subcommand) '([\w.]+)' does not accept option '([\w.]+)'", message)
        names = self._option_names()
        unknown = re.search(r"invalid choice: '([^']*)'", message)  # `fitt`, or a tool's name mistyped
        if unknown or re.search(r'expected "subcommand" .* not provided', message):
            names = [*SUBCOMMANDS, *TOOLS]
            said = f"{unknown.group(1)!r} is no command" if unknown else "no command given"
            message = f"{said}; the commands are {', '.join(names)}"
        # Lightning's docs give --trainer a file of the trainer's options alone; the presets start with trainer:.
        whole = in_file and re.match(r"(\w+)\.(trainer|model|data|optimizer|lr_scheduler)\b", in_file[3])
        wholes = wholes_given(GIVEN or sys.argv[1:], whole[1]) if whole else []
        if given := next((value for value, read in wholes if whole[2] in read), None):
            message = f"{given} is a whole config (it sets {whole[2]}:): give it as --config {given}, not --{whole[1]}"
            in_file = None
        if unknown:
            key = unknown.group(1)
        elif wrong:
            key = wrong.group(1)
        elif in_file:
            kind, group, option = in_file.groups()
            key = f"{group}.{option}" if kind == "Group" else option
            if kind == "Subcommand" and (command := self._subcommand(group)):
                names = command._option_names()
                if option in self._option_names():  # verbose, in the config an evaluation saved
                    message += f": it is another command's; {group} takes the run's config.yaml"
            if setting := config_setting(key):
                message = f"{setting}: {message}"
        else:
            key = None
        section, _, option = (key or "").partition(".")
        if not option and section in LIGHTNING_1_OPTIONS:  # Lightning 1's Trainer flag, as its scripts took it
            section, option = "trainer", section
        if section == "trainer" and (instead := LIGHTNING_1_OPTIONS.get(option)):
            message += f": Lightning 2 replaced it with {instead}"
        elif section in BUILT and option.split(".")[0] in ("class_path", "init_args"):
            built, module = BUILT[section]
            message += (
                f": the commands build {built} themselves, so {section}: takes its options alone, with no class_path "
                f"or init_args. Code of your own goes in src/{PACKAGE}/{module} (README: Where to edit)"
            )
        elif key and (close := likely_meant(key, names)):
            message += f". Did you mean {close}?"
        if not self.exit_on_error or wants_traceback():
            super().error(message, *args, **kwargs)  # with the usage, or raised for jsonargparse to handle
        if message.startswith("Problems parsing config"):
            message = yaml_syntax_error() or message
        elif message.startswith("Unexpected config"):
            message = config_without_settings(message) or message
        # A run's config.yaml from before a template update that moved modules: every class it names.
        named = "\n".join([message, *map(text_of, given_configs())])
        moved = [f"{old} is now {new}" for old, new in moved_names(named)]
        if moved:
            message = f"{'; '.join(moved)}: change the config"
        elif stale := stale_options(given_configs()):
            message = f"{'; '.join(stale)}: correct or delete them in the config"
        print(f"error: {where_set(condensed(message))}", file=sys.stderr)
        sys.exit(2)

    def _subcommand(self, name: str) -> "SuggestingParser | None":
        for action in self._actions:
            if isinstance(parser := (getattr(action, "choices", None) or {}).get(name), SuggestingParser):
                return parser
        return None

    def _option_names(self) -> list[str]:
        # Not the targets of links (model.batch_size), which take no value of their own.
        links = getattr(getattr(self, "_links_group", None), "_group_actions", [])
        linked = {f"--{link.target[0]}" for link in links}
        names = [
            option[2:] for option in self._option_string_actions if option.startswith("--") and option not in linked
        ]
        for action in self._actions:  # the options of the subcommands (fit, validate, ...)
            for parser in (getattr(action, "choices", None) or {}).values():
                if isinstance(parser, SuggestingParser):
                    names += parser._option_names()
        return list(dict.fromkeys(names))


def pretrained_backbone(backbone: str, pretrained: bool) -> str | None:
    return backbone if pretrained else None


def where_set(said: str) -> str:
    """`--data.batch_size: ...` said of a value that a config file set, not the command line: with the
    file named, as a misspelt key in one is."""
    key = re.match(r"--([\w.]+): ", said)
    if key is None:
        return said
    section, _, name = key.group(1).partition(".")
    given = name.partition(".")[0] in options_given(GIVEN or sys.argv[1:], section)
    setting = None if given else config_setting(key.group(1))
    return f"{setting}: {said.removeprefix('--')}" if setting else said


def condensed(message: str) -> str:
    """jsonargparse's message on one line: `Parser key "data.batch_size":`, its first reason, and the
    types and value it lists after that."""
    message = re.sub(r"<class '([\w.]+)'>", r"\1", message)
    if reason := class_option_problem(message) or union_problem(message):
        return reason
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return message
    head = re.sub(r'^Parser key "([\w.]+)":', r"--\1:", lines[0])
    one_type = re.fullmatch(r"Expected (?:a )?([\w.]+(?:\[.*\])?)\. Got value: (.*)", lines[1]) if lines[1:] else None
    if one_type and one_type.group(1) in VALUE_TYPES:  # --data.batch_size=many
        return f"{head} {one_type.group(2)} is not {VALUE_TYPES[one_type.group(1)]}"
    if one_type and (values := literal_values(one_type.group(1))):  # --data.augment=x
        return f"{head} {one_type.group(2)} is none of {', '.join(values)}"
    # The reasons of a union's subtypes ("- Option 'y' is not accepted"), and the value given.
    details = [line for line in lines[2:] if line.startswith(("- ", "Given value:"))]
    return "; ".join([" ".join([head, *lines[1:2]]), *details])


VALUE_TYPES = {"int": "a whole number", "float": "a number", "bool": "true or false", "NoneType": "null"}


def literal_values(type_name: str) -> list[str]:
    """The values of `typing.Literal['a', 'b']` as jsonargparse prints it; none for another type."""
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", type_name)
    return [value.strip(" '") for value in literal.group(1).split(",")] if literal else []


def union_problem(message: str) -> str | None:
    """A value that none of an option's types takes, said as the values it takes (precision 17) or as
    the class it likely means (--trainer.logger=TensorBoardLoger), rather than type by type."""
    key = re.match(r'\s*Parser key "([\w.]+)":', message)
    given = re.search(r"^\s*Given value: (.+)$", message, re.MULTILINE)
    if not key or not given:
        return None
    # The subtypes, not the reasons, which jsonargparse words differently for some values ("a").
    subtypes = re.search(r"^\s*Subtypes: \[(.*)\]$", message, re.MULTILINE)
    takes: dict[str, None] = {}  # what the option takes, in words: a whole number, auto
    for subtype in re.split(r",\s*(?![^\[]*\])", subtypes.group(1)) if subtypes else []:
        if values := literal_values(subtype):
            takes.update(dict.fromkeys(values))
        elif subtype in VALUE_TYPES:
            takes[VALUE_TYPES[subtype]] = None
        else:
            takes.clear()  # a class among them: its reasons are the ones to give
            break
    if "a number" in takes:
        takes.pop("a whole number", None)
    if len(takes) > 1:
        *others, last = takes
        said = f"neither {others[0]} nor {last}" if not others[1:] else f"none of {', '.join(takes)}"
        return f"--{key.group(1)}: {given.group(1)} is {said}"
    expected = re.findall(r"^\s*- Expected (?:a )?(.+)$", message, re.MULTILINE)
    if f"dot import path string: {given.group(1)}" in expected:
        from lightning.pytorch import callbacks, loggers

        bases = {"logger": loggers.__all__, "callbacks": callbacks.__all__}
        classes = next((names for end, names in bases.items() if key.group(1).endswith(end)), [])
        if close := likely_meant(given.group(1), list(classes), n=1):
            return f"--{key.group(1)}: no class {given.group(1)!r}. Did you mean {close}?"
    return None


def class_option_problem(message: str) -> str | None:
    """Where an option of a logger or callback is wrong, the reason its class gives, which jsonargparse
    lists among those of the option's other types (bool, None): the option named, with its likeliest
    spellings for an unknown one."""
    lines = message.strip().splitlines()
    key = re.match(r'Parser key "([\w.]+)":', lines[0]) if lines else None
    problem = re.compile(r"(\s*)- Problem with given class_path '([\w.]+)':$")
    found = next(((i, match) for i, line in enumerate(lines) if (match := problem.match(line))), None)
    if not key or found is None:
        return None
    start, (indent, class_path) = found[0], found[1].groups()
    below = itertools.takewhile(lambda line: not line.strip() or line.startswith(indent + " "), lines[start + 1 :])
    reason = textwrap.dedent("\n".join(below)).strip()
    name = class_path.rpartition(".")[2]
    if reason.startswith("Parser key"):  # a wrong value: about the option in full (--trainer.logger.log_model)
        return condensed(reason.replace('Parser key "', f'Parser key "{key.group(1)}.', 1))
    if not (unknown := re.fullmatch(r"Option '(\w+)' is not accepted", reason)):
        # The class's own words: it cannot be imported, or lacks a required option.
        said = f"--{key.group(1)}: {class_path}: {condensed(reason) if reason else 'cannot be imported'}"
        if missing := re.fullmatch(r"module '([\w.]+)' has no attribute '(\w+)'", reason):  # a misspelt class
            module, attribute = missing.groups()
            names = [n for n in dir(sys.modules[module]) if not n.startswith("_")] if module in sys.modules else []
            close = likely_meant(attribute, names, n=1)
            said += f". Did you mean {module}.{close}?" if close else ""
        return said
    option = unknown.group(1)
    if class_path == "lightning.Callback":  # the list is empty: the option has no callback to go to
        return f"--{key.group(1)}.{option}: no callback is listed to take it; add one with --{key.group(1)}+=<class>"
    if close := likely_meant(option, list(signature_parameters(class_path) or {})):
        hint = f". Did you mean {close}?"
    elif "Subtypes: [list[" in message:  # a list of callbacks: the option went to the last one
        hint = f": --{key.group(1)}.<option> sets the last one listed; set another's options in the config"
    else:
        hint = ""
    return f"--{key.group(1)}.{option}: {name} has no option {option!r}{hint}"


def moved_names(text: str) -> list[tuple[str, str]]:
    """(old, new) dotted paths of this package's classes and functions that `text` names in a module the
    package no longer has, found by their definition in the package's source."""
    package, sources, moved = Path(__file__).parent, {}, []
    for old in dict.fromkeys(re.findall(rf"\b{PACKAGE}(?:\.\w+)+", text)):
        module, _, name = old.rpartition(".")
        with contextlib.suppress(ModuleNotFoundError):  # a parent that is missing too
            if find_spec(module) is not None:
                continue
        sources = sources or {path: path.read_text() for path in sorted(package.rglob("*.py"))}
        defines = re.compile(rf"^(class|def) {name}\b", re.MULTILINE)
        homes = [path for path, source in sources.items() if defines.search(source)]
        if len(homes) == 1:
            moved.append((old, ".".join((PACKAGE, *homes[0].relative_to(package).with_suffix("").parts, name))))
    return moved


def stale_options(paths: list[str]) -> list[str]:
    """For each class that these configs give options its signature lacks, "<file>: <class> takes no
    <options>": a run's config.yaml from an earlier version of the project or of a library (the W&B
    logger's, before it listed its own)."""
    stale = []
    for path in paths:
        for entry in class_entries(settings_of(path)):
            parameters = signature_parameters(str(entry["class_path"]))
            if parameters is None or any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values()):
                continue  # a moved or unknown class (the parser's own message says so), or one taking any option
            unknown = [spelt(option, parameters) for option in entry["init_args"] if option not in parameters]
            if unknown:
                stale.append(f"{path}: {str(entry['class_path']).rpartition('.')[2]} takes no {', '.join(unknown)}")
    return stale


def signature_parameters(class_path: str) -> Mapping[str, inspect.Parameter] | None:
    """The `__init__` parameters of the class at a dotted path; None where it cannot be imported."""
    module, _, name = class_path.rpartition(".")
    try:
        return inspect.signature(getattr(importlib.import_module(module), name)).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return None


def spelt(option: str, parameters: Mapping[str, inspect.Parameter]) -> str:
    """An unknown option, with the parameter it is likely a misspelling of."""
    close = likely_meant(option, list(parameters), n=1)
    return f"{option} (did you mean {close}?)" if close else option


def class_entries(config) -> list[dict]:
    """The entries of a config that name a class and its options (class_path and init_args), at any depth."""
    if isinstance(config, list):
        return [entry for item in config for entry in class_entries(item)]
    if not isinstance(config, dict):
        return []
    own = [config] if "class_path" in config and isinstance(config.get("init_args"), dict) else []
    return own + [entry for value in config.values() for entry in class_entries(value)]


def found_defaults() -> list[Path]:
    """The default configs in the folder the command runs in: fit warns of a missing one and reads the
    rest, the commands that look for runs refuse without any (outside the project)."""
    return [path for path in DEFAULT_CONFIGS if path.is_file()]


def given_configs() -> list[str]:
    """The default configs, then those given with --config, in the order the parser reads them."""
    return [*map(str, DEFAULT_CONFIGS), *config_args(GIVEN or sys.argv[1:]).values()]


def config_args(args: list[str]) -> dict[int, str]:
    """The files given with --config (or -c) in `args`, by the place of the option there."""
    configs = {}
    for index, arg in enumerate(args):
        option, has_value, value = arg.partition("=")
        if option in ("--config", "-c"):
            configs[index] = value if has_value else next(iter(args[index + 1 :]), "")
    return configs


def settings_of(path: str) -> dict | None:
    """A config file's settings; None where it cannot be read or parsed (the parser says why)."""
    with contextlib.suppress(yaml.YAMLError):
        return yaml.safe_load(text_of(path))
    return None


def from_start(path: str) -> Path:
    """A path given to the command, from the folder it started in."""
    return STARTED_IN[0] / path if STARTED_IN else Path(path)


def text_of(path: str) -> str:
    try:
        return from_start(path).read_text()
    except (OSError, UnicodeDecodeError):
        return ""


def config_setting(key: str) -> str | None:
    """The config file that sets `key` (model.lr), among the default configs and those given with
    --config: the last, whose value wins."""
    setting = None
    for path in given_configs():
        if key in config_keys(settings_of(path)):
            setting = path
    return setting


def yaml_syntax_error() -> str | None:
    """The config file, line and problem of the YAML that does not parse, among the default configs
    and those given with --config."""
    for path in given_configs():
        try:
            yaml.safe_load(text_of(path))
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            return f"{path}{where} is not valid YAML: {getattr(error, 'problem', None) or error}"
    return None


def config_without_settings(message: str) -> str | None:
    """The config file of jsonargparse's "Unexpected config: <its text>": one with no settings (empty,
    all comments), or a lone `key:`, which jsonargparse takes for text rather than settings."""
    content = " ".join(message.partition("Unexpected config:")[2].split())
    for path in given_configs():
        if not from_start(path).is_file():
            continue  # a missing file is named apart
        if " ".join(text_of(path).split()) != content:
            continue
        settings = settings_of(path)
        if settings is None:
            what = "it is empty or all comments"
        elif isinstance(settings, dict):
            what = f"{', '.join(f'{key}:' for key in settings)} with nothing under it"
        else:
            what = "no `key: value` lines"
        fix = "restore it (every command reads it)" if Path(path) in DEFAULT_CONFIGS else f"leave out --config {path}"
        return f"{path} holds no settings ({what}): add some, or {fix}"
    return None


def meet_stoppably(setup_environment: Callable[[], None]) -> None:
    """A strategy's setup_environment, where the processes of a run wait for each other, ended by a
    SIGTERM or Ctrl-C: the wait does not return to Python's handlers until they have all started."""
    with ends_while_blocked(functools.partial(stopped_waiting, setup_environment.__self__)):
        setup_environment()


def stopped_waiting(strategy: ParallelStrategy, signum: int) -> None:
    # The processes the launcher started wait too; taken from its watch first, which would SIGKILL this
    # one on seeing one of them end.
    started = take_over_started_processes(strategy)
    for process in started:
        process.send_signal(signum)
    wait_for(started, seconds=5)  # they have nothing to save: not waited for long
    release_run()
    if is_first_process():
        waited = f"all {strategy.world_size} processes of the run"
        said = f"Stopped by {signal_said(signum)} while waiting for {waited} to start: nothing to save."
        print(said, file=sys.stderr, flush=True)


class ClassifierCLI(LightningCLI):
    """LightningCLI with this project's parser rules and launcher watch, for every command that builds one."""

    def __init__(self, *args, parser_kwargs: dict | None = None, trainer_defaults: dict | None = None, **kwargs):
        # No abbreviations, on the main parser and each subcommand's: --model.backbon must not quietly
        # mean --model.backbone.
        main = {
            "prog": f"python -m {PACKAGE}",
            "description": "Train and evaluate the image classifier.",
            "epilog": f"Besides these, each with its own --help: {', '.join(TOOLS)}.",
        }
        parser_kwargs = {"allow_abbrev": False, **main} | {
            command: {"allow_abbrev": False} | (parser_kwargs or {}).get(command, {}) for command in SUBCOMMANDS
        }
        # Always on, whatever callbacks a config lists: no process outlives its launcher.
        trainer_defaults = dict(trainer_defaults or {})
        trainer_defaults["callbacks"] = [*trainer_defaults.get("callbacks", []), EndWithLauncher()]
        kwargs.setdefault("parser_class", SuggestingParser)
        kwargs.setdefault("trainer_class", Trainer)
        super().__init__(*args, parser_kwargs=parser_kwargs, trainer_defaults=trainer_defaults, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        # The model sizes its head from the data and scales its learning rate by the data's batch.
        parser.link_arguments("data.batch_size", "model.batch_size")
        parser.link_arguments("data.num_classes", "model.num_classes", apply_on="instantiate")
        parser.link_arguments("data.class_names", "model.class_names", apply_on="instantiate")
        # Pretrained weights expect images prepared as in their own training (mean, std, resize).
        parser.link_arguments(("model.backbone", "model.pretrained"), "data.pretrained_backbone", pretrained_backbone)
        parser.add_argument(
            f"--{ALLOW_CHANGES}",
            type=bool,
            default=False,
            help="fit --ckpt_path auto/last: continue the run even where data or model options differ from its config.",
        )
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"],
            default="high",
            help="float32 matrix multiplications: 'high' lets them use TF32 tensor cores on NVIDIA GPUs "
            "(Ampere and newer), several times faster at a precision training does not notice.",
        )

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # Before LightningCLI reads the checkpoint's hyperparameters with torch.load.
        config = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        if self.config.get("subcommand") and config.get("ckpt_path") is not None:
            check_ckpt_path_word(config.ckpt_path, self.config.subcommand)
        check_checkpoint(config.get("ckpt_path"))
        if (seed := config.get("seed_everything")) is not None and not isinstance(seed, bool) and seed not in SEEDS:
            seeds = f"a whole number from 0 to {SEEDS[-1]}, or true or false"
            raise ConfigError(f"seed_everything must be {seeds}, got {seed}")

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict, subparser_kwargs: dict) -> None:
        super().setup_parser(add_subcommands, main_kwargs, subparser_kwargs)
        if not add_subcommands:  # build(): the options of fit alone
            return
        # Lightning's help of each command is its method's docstring, cut at the first line's end.
        for choice in self.parser._subcommands_action._choices_actions:
            choice.help = COMMAND_HELP.get(choice.dest, choice.help)
        for action in self.parser._actions:  # a --config there is refused (check_config_before_command)
            if "--config" in action.option_strings:
                action.help = argparse.SUPPRESS

    def _prepare_subcommand_parser(self, klass: type, subcommand: str, **kwargs) -> LightningArgumentParser:
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        # Lightning's help names its own words (hpc, registry), which do nothing here, and not auto.
        ckpt_path = next(action for action in parser._actions if action.dest == "ckpt_path")
        ckpt_path.help = ckpt_path_takes(subcommand) + "."
        for action in parser._actions:  # refused (OWN_OPTIMIZER): kept for the null they hold in runs' configs
            if action.dest.partition(".")[0] in ("optimizer", "lr_scheduler"):
                action.help = argparse.SUPPRESS
        return parser

    def _parse_ckpt_path(self) -> None:
        # Lightning builds the model of a checkpoint file from its hyperparameters, over the options:
        # one given on the command line that differs would be dropped without a word.
        subcommand = self.config.get("subcommand")
        asked = as_plain(self.config[subcommand].get("model")) if subcommand else {}
        if subcommand and (ckpt_path := self.config[subcommand].get("ckpt_path")):
            check_options_still_taken(ckpt_path)
        super()._parse_ckpt_path()
        built = as_plain(self.config[subcommand].get("model")) if subcommand else {}
        if built != asked:
            # Built with pretrained false (the checkpoint holds its weights, none to download); the data's
            # preprocessing stays the one the configs ask for, which the checkpoint's is compared with.
            data = self.config[subcommand].data
            data.pretrained_backbone = pretrained_backbone(asked.get("backbone"), asked.get("pretrained", False))
        # A new run from a checkpoint (weights come from it, not from pretrained ones).
        moot = {*LINKED, *FIRST_WEIGHTS, "model.pretrained"}
        dropped = [name for name in sorted(options_given(GIVEN, "model"))
                   if asked.get(name) != built.get(name) and f"model.{name}" not in moot]  # fmt: skip
        if dropped:
            options = ", ".join(f"--model.{name} {asked.get(name)!r}" for name in dropped)
            fix = "start a new run without --ckpt_path" if subcommand == "fit" else "evaluate another checkpoint"
            raise ConfigError(
                f"{options}: the model of the checkpoint {self.config[subcommand].ckpt_path} is built as it "
                f"was trained, with its own options. Leave them out, or {fix}."
            )
        set_aside = [f"model.{name} {built[name]!r} (the configs say {asked[name]!r})" for name in sorted(asked)
                     if name in built and asked[name] != built[name] and f"model.{name}" not in moot]  # fmt: skip
        if subcommand == "fit" and set_aside:
            ckpt_path = self.config[subcommand].ckpt_path
            rank_zero_info(f"--ckpt_path {ckpt_path}: the model is built as it was trained: {', '.join(set_aside)}")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config  # run=False: no subcommand
        if config.get("optimizer") or config.get("lr_scheduler"):
            raise ConfigError(OWN_OPTIMIZER)  # from a config file; kept as options for the null in runs' configs
        if (accumulate := config.trainer.accumulate_grad_batches) < 1:  # Lightning would divide by it
            raise ConfigError(f"trainer.accumulate_grad_batches must be 1 or more, got {accumulate}")
        if (clip := config.trainer.gradient_clip_val) is not None and clip <= 0:  # Lightning would clip nothing
            raise ConfigError(f"trainer.gradient_clip_val must be above 0, got {clip} (null clips nothing)")
        check_hardware(config.trainer)
        settle_precision(config.trainer)
        torch.set_float32_matmul_precision(config.float32_matmul_precision)
        if config.trainer.benchmark is None:
            # cuDNN tries its convolution algorithms once per input shape and keeps the fastest; that
            # choice is not reproducible, so deterministic runs keep the default algorithms.
            config.trainer.benchmark = config.trainer.deterministic in (None, False)
        # The recipe's callbacks that Lightning refuses beside a setting turned off: a progress bar beside
        # enable_progress_bar=false, checkpoints beside enable_checkpointing=false, a learning-rate monitor
        # beside logger=false (nothing to log into).
        off = {
            "ProgressBar": config.trainer.enable_progress_bar,
            "ModelCheckpoint": config.trainer.enable_checkpointing,
            "LearningRateMonitor": config.trainer.logger,
        }
        refused = tuple(name for name, setting in off.items() if setting is False)
        if refused and config.trainer.callbacks:
            config.trainer.callbacks = [
                c for c in config.trainer.callbacks if not str(c.get("class_path", "")).endswith(refused)
            ]
        place_runs(config.trainer)
{%- if cookiecutter.logger == "wandb" %}
        if wandb := [logger for logger in configured_loggers(config.trainer.logger) if is_wandb(logger)]:
            go_offline_unless_reachable(wandb[0].init_args.get("save_dir") or ".")
{%- endif %}
        defaults = {"data": code_defaults(ImageDataModule), "model": code_defaults(ImageClassifier)}
        if resolve_resume(config, self.subcommand, defaults):
            config.model.init_weights = None  # the checkpoint's weights replace them, and their file may be gone
            # The run's config.yaml stays as it was trained; each resume's config goes beside it.
            self.save_config_kwargs["config_filename"] = resumed_config_name()
            silence_resume_notice(Path(config.ckpt_path).parent)
        check_checkpoint(config.get("ckpt_path"))  # as given, checked before; as found (a run's), here
        check_sharded_strategy(config.get("ckpt_path"), config.trainer.get("strategy"))
        if self.subcommand in EVALUATIONS:
            # An evaluation logs into the run of its checkpoint: its config goes beside the run's own.
            self.save_config_kwargs["config_filename"] = f"config_{self.subcommand}.yaml"
            # The model is the checkpoint's, as Lightning makes it for a --ckpt_path given, also for the
            # one found here: a backbone changed in the configs since is for the next fit.
            self._parse_ckpt_path()
            config = self.config[self.subcommand]  # a new namespace, with the checkpoint's model
            evaluate_on_trained_data(config, options_given(GIVEN, "data"), self.subcommand)
            silence_training_callbacks_notice()
        logger = first_logger(config.trainer)
        if is_first_process() and logger is not None and (run := chosen_runs(logger)) != run_root(logger):
            hold_run(run, self.subcommand)  # a run in use is refused before this logger starts

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except TooFewClassesError as error:
            if self.subcommand != "predict":
                raise
{%- if cookiecutter.inference == "yes" %}
            # The data module reads class folders; images without labels are classify's business.
{%- endif %}
            raise DataError(
                f"{error.folder} has no class folders, and predict runs a checkpoint over a dataset laid out in "
{%- if cookiecutter.inference == "yes" %}
                f"them (its test/ or validation images). For a folder of unlabelled images: "
                f"python -m {PACKAGE} classify {error.folder} --checkpoint <file.ckpt>"
{%- else %}
                "them (its test/ or validation images): put the images in one folder per class."
{%- endif %}
            ) from error
        except UserError:
            raise
        except ValueError as error:  # jsonargparse's, around what a logger's or callback's own check refused
            if (refused := refusal_inside(error)) is None:
                raise
            raise ConfigError(refused) from error

    def instantiate_trainer(self, **kwargs) -> Trainer:
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (ValueError, TypeError, RuntimeError, ModuleNotFoundError) as error:
            if not traceback.extract_tb(error.__traceback__)[-1].filename.startswith(LIGHTNING_SOURCE):
                raise  # not Lightning's refusal of a setting
            if twice := re.search(r"more than one stateful callback of type `(\w+)`", str(error)):
                raise ConfigError(
                    f"--trainer.callbacks lists {twice.group(1)} twice (each config file's callbacks+ and each "
                    "--trainer.callbacks+= add one), and a run takes one: keep one, with the settings you want."
                ) from error
            raise ConfigError(one_line(error)) from error
        if not sys.stdout.isatty():
            # A live bar prints nothing into a file or pipe (a SLURM log, `| tee`) until the run ends.
            bars = (RichProgressBar, TQDMProgressBar)
            trainer.callbacks = [LogLines() if isinstance(c, bars) else c for c in trainer.callbacks]
        if trainer.world_size > 1:
            trainer.strategy.setup_environment = functools.partial(meet_stoppably, trainer.strategy.setup_environment)
        requeue_signal_as_sigterm(trainer)
        return trainer

    def check_run(self) -> None:
        # As the model's setup and checkpoint loading do, but before the trainer starts its loggers (W&B's lines).
        max_epochs = self.trainer.max_epochs if self.subcommand == "fit" else None  # what evaluations skip
        self.model.check_run(self.trainer.callbacks, self.datamodule, max_epochs)
        saved = saved_checkpoint(self.config[self.subcommand].get("ckpt_path"))
        check_same_classes(saved.get("hyper_parameters", {}).get("class_names"), self.datamodule.class_names)
        check_same_architecture(saved, self.model)
        if self.subcommand == "fit" and (states := saved.get("optimizer_states")):
            check_same_optimizer_layout(states[0]["param_groups"], self.model.parameter_groups())
        if self.subcommand == "fit" and self.trainer.limit_val_batches == 0:
            self.say_validation_off()
        self.datamodule.check_folders(self.subcommand)  # Lightning's stages have the subcommands' names
        evaluates = self.subcommand not in ("fit", "validate") or self.trainer.limit_val_batches != 0
        if evaluates and self.subcommand in ("fit", "validate"):
            self.datamodule.check_val_split()
        if evaluates and self.trainer.world_size > 1 and not shards_weights(self.trainer.strategy):
            self.datamodule.check_shares(self.subcommand, self.trainer.world_size)
        if self.subcommand == "test":
            self.datamodule.check_test_split()

    def say_validation_off(self) -> None:
        # Said once, instead of Lightning's warning (silenced) that the callbacks' key was never logged.
        idle = [c for c in self.trainer.callbacks if str(getattr(c, "monitor", None)).startswith("val/")]
        if idle:
            waiting = " and ".join(dict.fromkeys(type(c).__name__ for c in idle))
            metrics = " or ".join(dict.fromkeys(c.monitor for c in idle))
            rank_zero_info(
                f"Validation is off (trainer.limit_val_batches=0): {waiting} wait on {metrics}, never logged."
            )
            silence_unmonitored_notice()

    before_fit = before_validate = before_test = before_predict = check_run

    def after_fit(self) -> None:
        # Lightning's EarlyStopping stops a run in silence unless verbose, which also logs every
        # improvement. Its reason from this fit only: a run trained further restores an older one.
        if not self.trainer.should_stop:
            return
        for callback in self.trainer.early_stopping_callbacks:
            stopped_now = callback.stopped_epoch == self.trainer.current_epoch - 1
            if callback.stopping_reason_message and stopped_now and not callback.verbose:
                reason = callback.stopping_reason_message.removesuffix(" Signaling Trainer to stop.")
                rank_zero_info(f"Stopped early after epoch {callback.stopped_epoch}: {reason}")


def raised_by_jsonargparse(error: BaseException) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(JSONARGPARSE_SOURCE)


def refusal_inside(error: BaseException) -> str | None:
    """What a logger's or callback's __init__ refused ("ModelCheckpoint: `mode` can be min, max but got
    maxx"), which jsonargparse wraps in a traceback ending in "Does not validate against any of the
    Union subtypes"; None for an error of jsonargparse's own or outside it."""
    cause = error.__cause__ or error.__context__ if raised_by_jsonargparse(error) else None
    while cause is not None:
        if not raised_by_jsonargparse(cause):
            # The class jsonargparse was making: the outermost __init__ (an inner one may be a helper's).
            inits = [frame for frame in traceback.walk_tb(cause.__traceback__) if frame[0].f_code.co_name == "__init__"]
            owner = type(inits[0][0].f_locals.get("self")).__name__ if inits else ""
            message = one_line(cause)
            return message if not owner or message.startswith(owner) else f"{owner}: {message}"
        cause = cause.__cause__ or cause.__context__
    return None


def place_runs(trainer: Namespace, check: bool = True) -> None:
    """Runs go where the logger's save_dir says, under trainer.default_root_dir when one is given
    (Lightning would otherwise ignore it beside a logger); refused in one line where they cannot be written."""
    logger = first_logger(trainer)
    if logger is None:
        if check:
            check_writable(Path(trainer.default_root_dir or "."), "--trainer.default_root_dir")
        return
    save_dir = Path(logger.init_args.get("save_dir") or ".")
    if trainer.default_root_dir and not save_dir.is_absolute():
        logger.init_args.save_dir = str(Path(trainer.default_root_dir) / save_dir)
    option = "--trainer.default_root_dir" if trainer.default_root_dir else "--trainer.logger.save_dir"
    if check:
        check_writable(Path(logger.init_args.save_dir or "."), option)


def configured_runs() -> Path:
    """Where `fit` puts its runs with the configs as they are: where {{ "classify, report and serve look" if cookiecutter.serving == "yes" else "classify and report look" if cookiecutter.inference == "yes" else "report looks" }} for
    the newest one, so that a save_dir or default_root_dir set in a config holds for {{ "them" if cookiecutter.inference == "yes" else "it" }} too."""
    if not found_defaults():
        # Outside the project the defaults would put runs here, and every folder below would be searched.
        configs = ", ".join(map(str, DEFAULT_CONFIGS))
        raise MissingError(f"No {configs} in {Path.cwd()}: run from the project folder, or pass --runs.")
    trainer = as_namespace(resolved_config([])["trainer"])
    place_runs(trainer, check=False)
    logger = first_logger(trainer)
    return run_root(logger) if logger is not None else Path(trainer.default_root_dir or ".")


def as_namespace(value):
    """Options read from YAML as the parser holds them: dicts as namespaces, in lists too."""
    if isinstance(value, dict):
        return Namespace(**{key: as_namespace(item) for key, item in value.items()})
    return [as_namespace(item) for item in value] if isinstance(value, list) else value


def build(cli_args: list[str], keep_config: bool = False) -> ClassifierCLI:
    """The model, data and trainer that `fit` would build from the same configuration and options.
    `keep_config`: training writes the run's config.yaml, as `fit` does (a measurement is no run to
    reproduce; a trained model is)."""
    configs = [arg for path in found_defaults() for arg in ("--config", str(path))]
    with warnings.catch_warnings():  # the options are in sys.argv too, behind the tool's own command
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return ClassifierCLI(
            ImageClassifier,
            ImageDataModule,
            save_config_callback=SAVE_CONFIG if keep_config else None,
            save_config_kwargs={"overwrite": True},
            run=False,
            args=[*configs, *cli_args],
        )


def resolved_config(cli_args: list[str]) -> dict:
    """The configuration `fit` resolves from the default files and these options, as --print_config
    prints it, without building anything."""
    silence_dependency_noise()
    printed, refused = io.StringIO(), io.StringIO()
    command, given = ["fit", *cli_args, "--print_config"], GIVEN[:]
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(refused):
            run_command(command, command)
    except SystemExit as done:
        if done.code:
            raise ConfigError(refused.getvalue().strip().removeprefix("error: ") or str(done.code)) from None
    finally:
        GIVEN[:] = given  # the command run, which a stop's resume line repeats (the command's, not this fit's)
        # A library imported meanwhile (DeepSpeed, when a preset names it) logs to the stream it found
        # then, for good: its later lines would go into these buffers.
        for logger in [logging.root, *logging.root.manager.loggerDict.values()]:
            for handler in getattr(logger, "handlers", []):
                if isinstance(handler, logging.StreamHandler) and handler.stream in (printed, refused):
                    handler.setStream(sys.stdout if handler.stream is printed else sys.stderr)
    return yaml.safe_load(printed.getvalue())


class StoppedOutsideTraining(SystemExit):
    """A SIGTERM before training's own handlers are in place, or after they are gone."""


def stop_outside_training(signum: int, frame) -> None:
    # While a Trainer runs, Lightning's handler calls this one after its own: the stop is then training's.
    if signal.getsignal(signal.SIGTERM) is stop_outside_training:
        raise StoppedOutsideTraining(128 + signum)


@contextlib.contextmanager
def stop_unhidden():
    """A SIGTERM's stop, where an error raised while handling it took its place: Lightning's teardown
    of a fit stopped as its data workers started fails in turn, on the loader it began to iterate."""
    try:
        yield
    except Exception as error:
        stop = error.__context__
        while stop is not None and not isinstance(stop, StoppedOutsideTraining):
            stop = stop.__context__
        if stop is None:
            raise
        raise stop from None


def main(args: list[str] | None = None) -> None:
    silence_dependency_noise()
    # Set before training, Lightning's handlers and CheckpointOnStop's replace it while training runs.
    outside_training = signal.signal(signal.SIGTERM, stop_outside_training)
    interrupt = signal.getsignal(signal.SIGINT)  # Lightning's shutdown at a Ctrl-C leaves it ignored
    requeue = {each: signal.getsignal(each) for each in REQUEUE_SIGNALS}  # taken as SIGTERM under SLURM
    try:
        with stop_unhidden():
            run_command(sys.argv[1:] if args is None else args, args)
        finish_wandb_run()
    except StoppedOutsideTraining as stopped:
        # Python's default would end the process silently, holding the run's lock file and W&B's run open.
        finish_wandb_run(exit_code=stopped.code)
        if is_first_process():
            print("Stopped by SIGTERM outside training: nothing to save.", file=sys.stderr)
        sys.exit(stopped.code)
    except (UserError, MisconfigurationException) as error:  # Lightning's word for a setting it refuses
        if wants_traceback():
            raise
        wait_for(getattr(error, "started", []))
        refuse_choice(one_line(error))
        if getattr(error, "in_every_process", False) and started_by_local_rank_0():
            sys.exit(1)
        sys.exit(f"error: {one_line(error)}")
    except RuntimeError as error:
        if wants_traceback() or not (gone := other_process_gone(error)):
            raise
        refuse_choice(gone)
        sys.exit(f"error: {gone}")
    except OSError as error:  # after UserError's: MissingError is one too
        if wants_traceback() or not (refused := refused_by_file_system(error)):
            raise
        refuse_choice(refused)
        sys.exit(f"error: {refused}")
    except SIGTERMException as stopped:
        # The command that resumes comes last, after W&B's closing lines (which it prints at exit, colour
        # codes and all, unless finished here); and with a failure status, which Lightning would not give.
        status = exit_status(stopped)
        wait_for(getattr(stopped, "started", []))
        finish_wandb_run(exit_code=status)
        if is_first_process() and getattr(stopped, "saved", None):  # CheckpointOnStop saved the run
            print(f"Resume this run with: {resume_command(GIVEN)}", file=sys.stderr)
        sys.exit(status)
    except (KeyboardInterrupt, SystemExit) as stop:  # after SIGTERMException's, a SystemExit too
        if not stopped_by_ctrl_c(stop):
            raise
        status = exit_status(stop)
        finish_wandb_run(exit_code=status)
        if is_first_process():
            print("\nStopped by Ctrl-C.", file=sys.stderr)  # after the ^C, or a progress bar, the terminal shows
        sys.exit(status)
    finally:
        release_run()  # a notebook's or a test's process goes on; other commands may write into the run
        GIVEN.clear()
        signal.signal(signal.SIGTERM, outside_training)
        signal.signal(signal.SIGINT, interrupt)  # for a notebook's or a test's next command, and what it starts
        for each, handler in requeue.items():
            signal.signal(each, signal.SIG_DFL if handler is None else handler)


def options_given(args: list[str], group: str) -> set[str]:
    """The options of a group (model, data) named on a command line: each --<group>.<name>, and those
    of a whole --<group>."""
    names = set()
    for arg in args:
        option = arg.partition("=")[0].removesuffix("+")  # --trainer.callbacks+=, which appends
        if option.startswith(f"--{group}."):
            names.add(option.removeprefix(f"--{group}."))
    for _, whole in wholes_given(args, group):
        inner = whole.get("init_args") or whole
        names |= set(inner) if isinstance(inner, dict) else set()
    return names


def wholes_given(args: list[str], group: str) -> list[tuple[str, dict]]:
    """Each value of a whole --<group> on a command line (a YAML file or text, as jsonargparse takes
    it), with the mapping it reads as."""
    given = []
    for index, arg in enumerate(args):
        option, has_value, value = arg.partition("=")
        if option == f"--{group}":
            value = value if has_value else next(iter(args[index + 1 :]), "")
            try:
                text = Path(value).read_text()
            except OSError:  # YAML given inline (too long a name for a file, or none)
                text = value
            with contextlib.suppress(yaml.YAMLError):  # the parser has already refused what it cannot read
                whole = yaml.safe_load(text)
                given.append((value, whole if isinstance(whole, dict) else {}))
    return given


def stopped_by_ctrl_c(error: BaseException) -> bool:
    """Python's Ctrl-C, or the exit with status 1 that Lightning makes of one in a fit or an evaluation
    (its set-up, a second Ctrl-C in training)."""
    return isinstance(error, KeyboardInterrupt) or (
        isinstance(error, SystemExit) and isinstance(error.__context__, KeyboardInterrupt)
    )


def exit_status(error: BaseException) -> int:
    """The status a command ends with on `error`: a stop's, the shell's 128 + its signal; an exit's own."""
    if isinstance(error, SIGTERMException):  # CheckpointOnStop's, a SIGTERM's or a Ctrl-C's
        return 128 + getattr(error, "signal", signal.SIGTERM)
    if stopped_by_ctrl_c(error):
        return 128 + signal.SIGINT
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else int(error.code is not None)
    return 1


def finish_wandb_run(exit_code: int | None = None) -> None:
    """End this process's W&B run, if one is open (whatever the configured logger). Lightning leaves
    it open after fit: the next run in the process would log into it, and W&B's exit hook has
    wandb-core print the closing lines, colour codes and all, into a log file."""
    wandb = sys.modules.get("wandb")  # not imported just to find no run
    if wandb is not None and wandb.run is not None:
        wandb.finish(exit_code=exit_code)


def run_command(command: list[str], args: list[str] | None) -> None:
    GIVEN[:] = command  # for the messages of parse errors, which see no arguments
    STARTED_IN[:] = [Path.cwd()]
    if command[:1] and command[0] in TOOLS:
        module, _, function = TOOLS[command[0]].partition(":")
        sys.exit(getattr(importlib.import_module(f".commands.{module}", PACKAGE), function or "main")(command[1:]))
    check_config_before_command(command)
    for index, arg in enumerate(command):  # before the parser asks for a class's own required arguments
        name, given, value = arg.partition("=")
        value = value if given else next(iter(command[index + 1 : index + 2]), "")
        if name.partition(".")[0] in ("--optimizer", "--lr_scheduler") and value.lower() not in ("null", "none"):
            raise ConfigError(OWN_OPTIMIZER)  # null: what a run's config.yaml holds, and does nothing
    check_config_order(command)
    defaults = found_defaults()
    if len(defaults) < len(DEFAULT_CONFIGS):
        missing = ", ".join(str(path) for path in DEFAULT_CONFIGS if path not in defaults)
        print(f"No {missing} in {Path.cwd()}: run from the project folder or pass --config.", file=sys.stderr)
    run_cli([*map(str, defaults)], args)


def check_config_before_command(args: list[str]) -> None:
    """Refuse a --config given before the command (`--config x.yaml fit`), which LightningCLI's help
    shows: its parser there takes no fit options, and refuses the file's first in words of its own."""
    command = next((index for index, arg in enumerate(args) if arg in (*SUBCOMMANDS, *TOOLS)), len(args))
    if given := [arg for arg in args[:command] if arg.partition("=")[0] in ("-c", "--config")]:
        named = args[command] if command < len(args) else "fit"
        raise ConfigError(
            f"{given[0].partition('=')[0]} goes after the command, as in: python -m {PACKAGE} {named} --config <file>"
        )


def check_config_order(args: list[str]) -> None:
    """Refuse an option given before a --config file that sets it too: jsonargparse applies both in
    their order, and the file's value would replace the option's without a word."""
    configs = config_args(args)
    given: list[str] = []  # each option so far, as a config file names it (trainer.max_epochs)
    for index, arg in enumerate(args):
        option = arg.partition("=")[0]
        if index not in configs:
            if option.startswith("--") and not option.endswith("+"):
                given.append(option.removeprefix("--"))
            continue
        keys = set(config_keys(settings_of(configs[index])))
        if replaced := [key for key in given if key in keys]:
            raise ConfigError(
                f"--{replaced[0]} comes before {option} {configs[index]}, which sets it too and so replaces it: "
                "put --config first, then the options that change it."
            )


def config_keys(section, prefix: str = ""):
    """The option keys a config file sets (trainer.max_epochs, trainer.logger.save_dir), as
    --trainer.max_epochs names them: a class's init_args are its options."""
    if not isinstance(section, dict):
        yield prefix
        return
    for name, value in section.items():
        key = prefix if name == "init_args" else f"{prefix}.{name}" if prefix else str(name)
        yield from config_keys(value, key)


def run_cli(defaults: list[str], args: list[str] | None) -> None:
    ClassifierCLI(
        ImageClassifier,
        ImageDataModule,
        parser_kwargs={command: {"default_config_files": defaults} for command in SUBCOMMANDS},
        save_config_callback=SAVE_CONFIG,
        # An evaluation of a run rewrites its config_<stage>.yaml (a resume writes a file of its own).
        save_config_kwargs={"overwrite": True},
        args=args,
    )
