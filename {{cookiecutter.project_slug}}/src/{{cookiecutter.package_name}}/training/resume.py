"""`--ckpt_path auto`: continue the newest run that did not finish, where it stopped, in its own
folder, with the options it was trained with; or start a new one. `--ckpt_path last`: the newest
run, finished or not (to train a finished run further). validate, test and predict evaluate the
newest run's best checkpoint unless `--ckpt_path` names another.

Lightning's own `--ckpt_path last` looks only in the new run's (empty) checkpoint folder, because
every run gets a folder of its own; here `last` and `auto` search all of this project's runs.
Evaluating a run's checkpoint (validate, test, predict) logs into that run too, not into a new one.
"""

import json
import math
import os
import shlex
import time
import zipfile
from importlib.util import find_spec
from pathlib import Path
from typing import NoReturn

import lightning as L
import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from ..errors import PACKAGE, ConfigError, DataError, MissingError, likely_meant
from ..hardware.network import is_remote
from ..hardware.rules import strategy_class_name
from .checkpoint_io import complete_replace, is_sharded_checkpoint, write_whole
from .run_folders import (
    best_checkpoint,
    finished,
    hold_run,
    in_use,
    is_first_process,
    last_checkpoints,
    leave_choice,
    run_to_resume,
    trained_by_job,
    trained_elsewhere,
)

# Options that change how the data is read, not what is trained on: a resume may change them.
HOW_NOT_WHAT = ("data.num_workers", "data.prefetch_factor", "data.worker_start_method"
{%- if cookiecutter.streaming == "yes" %}, "data.cache_dir",
                "data.max_cache_size"
{%- endif %})  # fmt: skip
# Options that the CLI links from others (add_arguments_to_parser): compared through those.
LINKED = ("model.batch_size", "model.num_classes", "model.class_names", "data.pretrained_backbone")
# Where a new run's first weights come from: a resume has its own.
FIRST_WEIGHTS = ("model.init_weights",)
# Data options an evaluation takes from its own command and configs, not from the checkpoint: how
# the images are read, and the batch size, which changes no evaluated number.
EVALUATION_KEEPS = (*HOW_NOT_WHAT, *LINKED, "data.batch_size")
# The trainer's options that set the epochs and the learning-rate schedule: continued with others,
# the run would train to another schedule under its name (`last` is there to raise the two limits).
SCHEDULE = ("max_epochs", "max_steps", "limit_train_batches", "accumulate_grad_batches")
LIMITS = ("max_epochs", "max_steps")
# What lets a resume change the other data, model and schedule options.
ALLOW_CHANGES = "allow_resume_changes"

RESUME_WORDS = ("auto", "last")
EVALUATIONS = ("validate", "test", "predict")
# What Lightning itself takes for ckpt_path besides a path.
LIGHTNING_WORDS = ("best", "hpc", "registry")
# What each command here takes, for --help and for a word it does not take.
CKPT_PATH_TAKES = {
    "fit": "auto (continue the newest run that did not finish, or start one), last (train the newest run "
    "further) or a checkpoint file (a new run from its weights, epoch and optimizer)",
    "evaluation": "best or nothing (the newest run's best checkpoint), last (the newest run's last.ckpt) or a "
    "checkpoint file",
}


def ckpt_path_takes(subcommand: str) -> str:
    return CKPT_PATH_TAKES["fit" if subcommand == "fit" else "evaluation"]


def is_registry(ckpt_path: str | None) -> bool:
    """Lightning's model registry words, `registry` and `registry:<model>`, in any case as Lightning takes them."""
    word = str(ckpt_path).lower()
    return word == "registry" or word.startswith("registry:")


def resolve_resume(config: Namespace, subcommand: str, defaults: dict[str, dict]) -> bool:
    """Replace `auto` or `last` in `config.ckpt_path` by the run's last.ckpt (an evaluation's `best` or
    none by the newest run's best checkpoint), and point the logger at the run of the checkpoint, so
    that a `fit` carries on in its folder and an evaluation's metrics, reports and config land beside
    the run they evaluate. Whether a fit continues a run. `defaults`: each option's default in the
    code, by section (data, model)."""
    requested = config.get("ckpt_path")
    logger = first_logger(config.trainer)
    own = requeued_run(config, logger, requested) if subcommand == "fit" else None
    if own is not None:
        requested = config.ckpt_path = "auto"
    if subcommand in EVALUATIONS and requested in (None, "best"):
        # Lightning's "best" is that of a fit in the same process, and no checkpoint means the untrained
        # weights: evaluating them would log chance accuracy as if it were the model's.
        if logger is None:
            raise ConfigError(f"{subcommand} with no logger has no runs to look in: pass --ckpt_path <file>.")
        runs, version = chosen_runs(logger), logger.init_args.get("version")
        if version is not None and runs == run_root(logger):  # a mistyped run would evaluate the newest
            named = sorted(path.name for path in runs.iterdir() if path.is_dir()) if runs.is_dir() else []
            meant = likely_meant(str(version), named)
            raise MissingError(
                f"--trainer.logger.version {version}: no run of that name under {runs}"
                + (f". Did you mean {meant}?" if meant else "; leave it out to evaluate the newest run.")
            )
        config.ckpt_path = str(best_checkpoint(runs, "--ckpt_path <file>"))
        rank_zero_info(f"--ckpt_path {requested or 'best (the default)'}: evaluating {config.ckpt_path}")
    elif requested in RESUME_WORDS:
        root, runs = runs_of(config, logger)
        found, unfinished = runs, [last for last in runs if not finished(last)]
        if requested == "auto" and subcommand == "fit":
            chosen = own or run_to_resume(root, unfinished)
            found = [chosen] if chosen else []
        if not found:
            if requested == "last" or subcommand != "fit":  # an evaluation would take untrained weights
                fix = "Train one." if subcommand != "fit" else "Use --ckpt_path auto to start one when there is none."
                raise MissingError(f"--ckpt_path {requested}: there is no */checkpoints/last.ckpt under {root}. {fix}")
            if unfinished:  # each one passed over: other processes train them
                rank_zero_info(f"--ckpt_path auto: every unfinished run under {root} is being trained: a new run")
            else:
                further = " (to train the newest further: --ckpt_path last --trainer.max_epochs=<more>)" if runs else ""
                rank_zero_info(  # a run whose last.ckpt is gone cannot go on, finished or not
                    f"--ckpt_path auto: no unfinished run with a checkpoints/last.ckpt under {root}, so this is a "
                    f"new run{further}"
                )
            config.ckpt_path = None
            return False
        config.ckpt_path = str(found[-1])
        check_checkpoint(config.ckpt_path)  # a damaged last.ckpt, before its limits are read
        run = found[-1].parent.parent
        # Before its limit, moot meanwhile; asked by the first process, which holds the run for the others.
        if subcommand == "fit" and requested == "last" and is_first_process() and (holder := trained_elsewhere(run)):
            raise in_use(run.resolve(), holder, subcommand)
        if subcommand == "fit" and (reached := limit_reached(found[-1], config.trainer)):
            # Lightning would end at once with no word on how to go on, or fail past the limit. Asked
            # for by `last`, a mistake; by `auto` (a requeued job whose run ended before it could say
            # so), the job's work is done. Either way before the run's folder and logger are touched.
            said = f"--ckpt_path {requested}: {run} already reached {reached}, so there is "
            said += f"nothing left to train. {raise_limit(reached, requested)}"
            if requested == "last":
                raise ConfigError(said)
            job_done(said)
        gained = []
        if subcommand == "fit" and not config.get(ALLOW_CHANGES):  # refused before "resuming" is said
            gained = check_same_options(config, found[-1], requested, defaults)
        doing = "resuming from" if subcommand == "fit" else "evaluating"
        rank_zero_info(f"--ckpt_path {requested}: {doing} {found[-1]}")
        if subcommand == "fit" and requested == "last" and (raised := limits_raised(found[-1], config.trainer)):
            rank_zero_info(f"--ckpt_path last: {raised}")  # maybe by the configs, where it was given to the run
        if gained:
            rank_zero_info(f"Options new since {run} was saved, at their defaults: {', '.join(gained)}")
    elif subcommand == "fit":
        # A checkpoint given by path starts a new run from it (a copied file), from its epoch on.
        if requested and Path(requested).is_file() and (reached := limit_reached(Path(requested), config.trainer)):
            raise ConfigError(
                f"{requested} has already trained to {reached}: Lightning would restore its epoch and train nothing. "
                + raise_limit(reached, requested)
            )
        return False
    run = run_of(config.get("ckpt_path"), logger)
    if run is None:
        return False
    if subcommand != "fit" and logger.class_path == "lightning.pytorch.loggers.CSVLogger":
        return False  # it deletes the metrics.csv of a folder it reuses (csv_logging.py's logger appends)
    logger.init_args.version = run  # W&B's logger takes it for the id of the run to resume
    return subcommand == "fit"


def requeued_run(config: Namespace, logger: Namespace | None, requested: str | None) -> Path | None:
    """The last.ckpt of the run that this SLURM job trained before its requeue, which the requeued
    job goes on with, whatever --ckpt_path its first start was given (another job's unfinished run is
    that job's to go on with); None where it saved none yet, or where this is no requeued job."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        return None
    _, runs = runs_of(config, logger)
    # Without a logger, the one checkpoint folder is the job's.
    own = trained_by_job(runs, job) if logger is not None else (runs or [None])[-1]
    if own is None:
        return None
    if finished(own):  # stopped as its run closed (W&B's last upload): a new run would train it all again
        job_done(f"Requeued job {job}: {own.parent.parent} finished before the requeue: nothing left to train")
    if requested not in (None, "auto"):
        rank_zero_info(f"Requeued job {job}: going on with its own run, not its first start's --ckpt_path {requested}")
    return own


def job_done(said: str) -> NoReturn:
    """End a requeued job that has nothing left to train, saying why, before the run's folder and
    logger are touched."""
    rank_zero_info(said)
    leave_choice()  # the job's other tasks may not have read it yet
    raise SystemExit(0)


def check_same_options(config: Namespace, checkpoint: Path, requested: str, defaults: dict[str, dict]) -> list[str]:
    """Refuse to continue a run from `checkpoint` with other data, model or schedule options than it
    was trained with: the weights would go on training towards something else under the run's name.
    An option the code gained since, at its default (`defaults`, by section), is no change: those are
    returned, to be named once the resume is said."""
    run = checkpoint.parent.parent
    saved, trained = config_at(checkpoint)
    if saved is None:
        return []  # a run without a config (trained outside the CLI): nothing to compare
    changed, gained = [], []
    for section in ("data", "model"):
        was, default = trained.get(section) or {}, defaults[section]
        for name, before, now in differences(was, as_plain(config.get(section))):
            key = f"{section}.{name}"
            if key in HOW_NOT_WHAT + LINKED + FIRST_WEIGHTS or same_data_option(name, before, now):
                continue
            if name not in was and name in default and now == default[name]:
                gained.append(f"{key} {now!r}")  # added to the code since, at its default
            elif name not in was:
                changed.append(f"{key} {now!r} (an option the run's code did not have)")
            elif name not in default:
                changed.append(f"{key} {before!r} (an option this code no longer has)")
            else:
                changed.append(f"{key} {before!r} -> {now!r}")
    schedule = [name for name in SCHEDULE if requested == "auto" or name not in LIMITS]
    was, now = trained.get("trainer") or {}, config.trainer
    changed += [f"trainer.{name} {was.get(name)!r} -> {now.get(name)!r}" for name in schedule
                if was.get(name) != now.get(name)]  # fmt: skip
    # `last` raises a limit to train further; lowered, the schedule would end sooner, its rate dropping at once.
    # Training stops at the first limit it meets: one lowered while the other rises may still end later.
    before, after = stop_limits(was), stop_limits(now)
    if requested != "auto" and not any(after[name] > before[name] for name in LIMITS):
        changed += [f"trainer.{name} {was.get(name)!r} -> {now.get(name)!r} (last may raise it, not lower it)"
                    for name in LIMITS if after[name] < before[name]]  # fmt: skip
    if changed:
        raise ConfigError(
            f"--ckpt_path {requested} would continue {run} with other options than {saved.name} has: "
            f"{', '.join(changed)}. Resume with the run's options, start a new run (no --ckpt_path), or pass "
            f"--{ALLOW_CHANGES}=true to continue it with these."
        )
    return gained


def limits_raised(checkpoint: Path, trainer: Namespace) -> str:
    """The limits (max_epochs, max_steps) that `trainer` sets above those the run of `checkpoint` was
    started with, as `trainer.max_epochs raised to 20 (the run was started with 1)`; "" for none."""
    was = config_at(checkpoint)[1].get("trainer") or {}
    before, after = stop_limits(was), stop_limits(trainer)
    return ", ".join(f"trainer.{name} raised to {trainer.get(name)} (the run was started with {was.get(name)})"
                     for name in LIMITS if after[name] > before[name])  # fmt: skip


def stop_limits(trainer: Namespace | dict) -> dict[str, float]:
    """The trainer's max_epochs and max_steps as Lightning stops at them, none being infinite: without
    either, 1,000 epochs; max_epochs left out beside a max_steps, none."""
    steps = -1 if trainer.get("max_steps") is None else trainer.get("max_steps")
    epochs = trainer.get("max_epochs")
    if epochs is None:
        epochs = 1000 if steps == -1 else -1
    return {"max_epochs": math.inf if epochs == -1 else epochs, "max_steps": math.inf if steps == -1 else steps}


def evaluate_on_trained_data(config: Namespace, given: set[str], subcommand: str) -> None:
    """Evaluate a checkpoint on the data it was trained on: each data option the command line leaves
    out takes the checkpoint's value (its folder, split and preprocessing), since the configs' would
    take another dataset, or with another split_seed put training images into the validation ones.
    How the images are read (EVALUATION_KEEPS) stays this machine's. An option given that differs
    evaluates on other data, which logs as a new run: in the checkpoint's run, its val/ or test/
    numbers would sit at the run's step as if they were on the run's own images. So does a validate
    of other batches than the run's validation (trainer.limit_val_batches)."""
    trained = as_plain(saved_checkpoint(config.get("ckpt_path")).get("datamodule_hyper_parameters"))
    now = as_plain(config.data)
    differs = {name: value for name, value in trained.items() if name in now and f"data.{name}" not in EVALUATION_KEEPS
               and not same_data_option(name, value, now[name])}  # fmt: skip
    taken = {name: value for name, value in differs.items() if name not in given}
    for name, value in taken.items():
        config.data[name] = value
    if taken:
        said = " ".join(f"--data.{name} {shlex.quote(value if isinstance(value, str) else json.dumps(value))}"
                        for name, value in taken.items())  # fmt: skip
        rank_zero_info(f"On the data the checkpoint was trained on: {said} (options given here evaluate on other data)")
    other = [f"--data.{name}" for name in sorted(differs.keys() - taken.keys())]
    if subcommand == "validate" and (batches := other_validation_batches(config)):
        other.append(batches)
    logger = first_logger(config.trainer)
    if other and logger is not None and (run := logger.init_args.get("version")) is not None:
        logger.init_args.version = None
        rank_zero_info(f"On other data than the checkpoint's ({', '.join(other)}): logged as a new run, not into {run}")


def other_validation_batches(config: Namespace) -> str | None:
    """How a validate of a run's checkpoint covers other batches than the run's validation did, as
    `trainer.limit_val_batches <the run's> -> <this one's>` (given, or by the configs); None if not."""
    saved, trained = config_at(Path(config.ckpt_path))
    if saved is None:
        return None  # a checkpoint from elsewhere, evaluated in a run of its own
    was, now = (trained.get("trainer") or {}).get("limit_val_batches"), config.trainer.limit_val_batches
    shown = ["null" if limit is None else limit for limit in (was, now)]  # null (as in a config): every batch
    return f"trainer.limit_val_batches {shown[0]} -> {shown[1]}" if val_batches(was) != val_batches(now) else None


def val_batches(limit: float | None) -> tuple[type, float]:
    """A limit_val_batches as Lightning reads it: None and 1.0 are every batch, an int counts batches,
    a float is a fraction of them."""
    limit = 1.0 if limit is None else limit
    return type(limit), limit


def same_data_option(name: str, trained, now) -> bool:
    """Whether an option names the same data: a data_dir as the folder it is, however written."""
    if name == "data_dir" and isinstance(trained, str) and isinstance(now, str):
        return os.path.realpath(trained) == os.path.realpath(now)
    return trained == now


def config_at(checkpoint: Path) -> tuple[Path | None, dict]:
    """The config file its run was trained with when `checkpoint` (<run>/checkpoints/<file or folder>)
    was written, and its settings: the newest written before it (config.yaml, or a resume's), since a
    resume that failed before saving wrote one whose options trained nothing; the newest where none
    was (a copied folder). None and {} for a run trained outside the CLI."""
    run, written = checkpoint.parent.parent, checkpoint.stat().st_mtime_ns
    saved = [path for path in [run / "config.yaml", *sorted(run.glob("config_resumed_*.yaml"))] if path.is_file()]
    before = [path for path in saved if path.stat().st_mtime_ns <= written] or saved
    return (before[-1], yaml.safe_load(before[-1].read_text()) or {}) if before else (None, {})


def resumed_config_name() -> str:
    """The file a resume writes its config to, beside the run's config.yaml, which stays as it was."""
    return f"config_resumed_{time.strftime('%Y%m%d-%H%M%S')}.yaml"


class SaveConfigWhole(SaveConfigCallback):
    """LightningCLI's saving of a run's config, written whole: a resume reads the newest one back to
    compare options, and Lightning writes it in place (a kill while it wrote left half a file). It
    always overwrites: a resume's config has a name of its own. It also holds the run for this process
    (hold_run), once the logger has made its folder."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.already_saved:
            return
        folder = trainer.log_dir  # a collective call: every process asks
        if is_remote(folder):  # object storage, where each object is written whole: Lightning's own save
            super().setup(trainer, pl_module, stage)
            return
        if trainer.is_global_zero:
            folder = self.run_folder(trainer, folder)
            hold_run(folder, TrainerFn(stage).value)
            write_whole(folder / self.config_filename, self.parser.dump(self.config, skip_unset=False))
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True

    def run_folder(self, trainer, log_dir: str) -> Path:
        """The run's own folder, where its config goes (rank 0 only)."""
        return Path(log_dir)


def as_plain(options: Namespace | dict | None) -> dict:
    """Options as YAML would read them back (paths as strings, tuples as lists)."""
    options = options.as_dict() if isinstance(options, Namespace) else options or {}
    return json.loads(json.dumps(options, default=str))


def differences(saved: dict, now: dict) -> list[tuple[str, object, object]]:
    """(name, saved value, value now) of each option that differs between two plain dicts."""
    return [(name, saved.get(name), now.get(name)) for name in sorted(saved.keys() | now.keys())
            if saved.get(name) != now.get(name)]  # fmt: skip


def resume_command(given: list[str]) -> str:
    """The command that continues this run: the fit it was started with (`given`, its arguments), with
    --ckpt_path auto; a command that trains runs of its own goes on when started again."""
    if given[:1] != ["fit"]:
        return shlex.join(["python", "-m", PACKAGE, *given])
    kept = []
    for arg in given:
        if kept and kept[-1] == "--ckpt_path":
            kept.pop()  # and its value
        elif not arg.startswith("--ckpt_path="):
            kept.append(arg)
    return shlex.join(["python", "-m", PACKAGE, *kept, "--ckpt_path", "auto"])


def raise_limit(reached: str, requested: str) -> str:
    """How to train further a run that reached `reached` (a limit_reached answer)."""
    limit = reached.split("=")[0]
    return f"To train it longer, raise the limit: fit --ckpt_path {shlex.quote(requested)} --trainer.{limit}=<more>."


def interrupts_an_epoch(trainer: L.Trainer | None) -> bool:
    """Whether a checkpoint saved now falls inside a training epoch: in a training step, or in a
    validation that val_check_interval runs before the epoch's end."""
    return (
        trainer is not None
        and trainer.state.fn == TrainerFn.FITTING
        and not trainer.sanity_checking
        and not trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
    )


def epoch_goes_on_after(trainer: L.Trainer) -> bool:
    """Whether the run resumed from a checkpoint saved now goes on inside the same training epoch:
    one saved inside it, or a stop within its closing validation (CheckpointOnStop), which the
    resumed run does again before it ends the epoch."""
    return interrupts_an_epoch(trainer) or (trainer.validating and trainer.received_sigterm)


def limit_reached(checkpoint: Path, trainer: Namespace) -> str | None:
    """`max_epochs=N` or `max_steps=N` when the run saved in `checkpoint` has done that much."""
    if checkpoint.is_dir():
        return None  # shards of FSDP or DeepSpeed: no cheap read of the loop state; Lightning will tell
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    epochs = saved.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {}).get("processed")
    if trainer.get("max_steps") and trainer.max_steps > 0 and saved.get("global_step", 0) >= trainer.max_steps:
        return f"max_steps={trainer.max_steps}"
    if trainer.get("max_epochs") and trainer.max_epochs > 0 and epochs is not None and epochs >= trainer.max_epochs:
        return f"max_epochs={trainer.max_epochs}"
    return None


def run_of(ckpt_path: str | None, logger: Namespace | None) -> str | None:
    """The run folder's name when `ckpt_path` is a checkpoint of one of `logger`'s runs
    (<root>/<run>/checkpoints/<file or folder of shards>), else None."""
    if logger is None or not ckpt_path or ckpt_path in LIGHTNING_WORDS or is_remote(ckpt_path):
        return None
    checkpoints = Path(ckpt_path).resolve().parent
    in_a_run = checkpoints.name == "checkpoints" and checkpoints.parent.parent == run_root(logger).resolve()
    return checkpoints.parent.name if in_a_run else None


def check_ckpt_path_word(ckpt_path: str | None, subcommand: str) -> None:
    """Refuse those of Lightning's words for ckpt_path that do nothing here but fail with a traceback."""
    word = str(ckpt_path)  # Lightning compares best and hpc exactly: Best is a file
    takes = f"pass {ckpt_path_takes(subcommand)}"
    if word == "best" and subcommand == "fit":
        raise ConfigError(f"--ckpt_path best is the best checkpoint of a fit earlier in the same process: {takes}.")
    if word == "hpc":  # scripts/slurm.sbatch's requeue (on SIGTERM) goes on with auto
        raise ConfigError(f"--ckpt_path hpc is the checkpoint of Lightning's SLURM requeue, which this project does "
                          f"not use: {takes}.")  # fmt: skip
    if is_registry(word) and find_spec("litmodels") is None:
        raise ConfigError(f"--ckpt_path {ckpt_path}: Lightning's model registry needs the litmodels package "
                          f"(pip install litmodels); else {takes}.")  # fmt: skip


def check_sharded_strategy(ckpt_path: str | None, strategy: str | Namespace | None) -> None:
    """Refuse a sharded checkpoint (a folder of FSDP's or DeepSpeed's shards) under a strategy that
    takes the model whole: it loads only into a model sharded as when it was written."""
    if ckpt_path is None or is_remote(ckpt_path) or not Path(ckpt_path).is_dir():
        return
    if strategy_class_name(strategy or "auto") in ("auto", "DDPStrategy", "SingleDeviceStrategy"):
        raise ConfigError(
            f"{ckpt_path} is a sharded checkpoint, which loads under the strategy that wrote it: pass the preset "
            f"its run's config.yaml names (--config configs/trainer/fsdp.yaml, fsdp1.yaml or a deepspeed one), or "
            f"make one file of it with `python -m {PACKAGE} consolidate {ckpt_path} model.ckpt` and pass that."
        )


def check_checkpoint(ckpt_path: str | None, option: str = "--ckpt_path"{{ ", takes_onnx: bool = False" if cookiecutter.inference == "yes" }}) -> None:
    """Refuse a --ckpt_path that is no checkpoint, before anything reads it: torch.load would fail
    with an error that names neither (`KeyError: 101`, `Unsupported operand 35`).{{ " `takes_onnx`: the\n    command also takes an .onnx export (checked where it is read)." if cookiecutter.inference == "yes" }}"""
    words = (*RESUME_WORDS, *LIGHTNING_WORDS)
    if ckpt_path is None or ckpt_path in words or is_registry(ckpt_path) or is_remote(ckpt_path):
        return  # Lightning's words, and remote files (s3://...) that Lightning reads through fsspec
    path = Path(ckpt_path)
    if not path.exists():
        raise MissingError(f"{option} {path}: no such file or folder.")
    if path.is_dir():
        if not is_sharded_checkpoint(path):  # a run folder, or its checkpoints/, given for one of its files
            inside = sorted(path.glob("*.ckpt"), key=lambda file: file.name != "last.ckpt")
            inside = inside or sorted(path.glob("checkpoints/*.ckpt"), key=lambda file: file.name != "last.ckpt")
            fix = f"name a checkpoint in it, such as {inside[0]}" if inside else "name a checkpoint file"
            raise DataError(f"{option} {path} is a folder, and no sharded checkpoint (FSDP or DeepSpeed): {fix}.")
        return
    if not zipfile.is_zipfile(path) or "state_dict" not in _checkpoint_keys(path):
        raise DataError(
            f"{path} is not a Lightning checkpoint, or is damaged: point {option} at a .ckpt file that training wrote "
{%- if cookiecutter.inference == "yes" %}
            "(runs/<project>/<run>/checkpoints/)" + (" or at an .onnx export." if takes_onnx else ".")
{%- else %}
            "(runs/<project>/<run>/checkpoints/)."
{%- endif %}
        )


def refuse_sharded(path: Path) -> None:
    """Tools that load the model alone need it in one file; FSDP and DeepSpeed save a folder of shards."""
    if path.is_dir():
        raise DataError(f"{path} is a sharded checkpoint: make it one file with `consolidate` first.")


def saved_checkpoint(ckpt_path: str | Path | None) -> dict:
    """A checkpoint file's contents, memory-mapped (no weights read); empty without a file."""
    if ckpt_path is None or not Path(ckpt_path).is_file():
        return {}
    return torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)


def _checkpoint_keys(path: Path) -> list:
    """The top-level keys of a file torch.save wrote (memory-mapped: no weights read), or none."""
    try:
        saved = saved_checkpoint(path)
    except Exception:  # whatever torch.load makes of a file that is no checkpoint
        return []
    return list(saved) if isinstance(saved, dict) else []


def configured_loggers(setting) -> list:
    """The loggers that a trainer's `logger` setting names, parsed or as a config file has it: one, a
    list, or none (true, false, null: Lightning's default logger or none)."""
    return [logger for logger in (setting if isinstance(setting, list) else [setting])
            if isinstance(logger, Namespace | dict)]  # fmt: skip


def is_wandb(logger: Namespace | dict) -> bool:
    """Whether a configured logger is W&B's: Lightning's WandbLogger or a subclass named as such."""
    return str(logger.get("class_path", "")).endswith("WandbLogger")


def first_logger(trainer: Namespace) -> Namespace | None:
    """The logger of a trainer config that lays out the run folders (the first, as in Lightning), if any."""
    return next(iter(configured_loggers(trainer.logger)), None)


def runs_of(config: Namespace, logger: Namespace | None) -> tuple[Path, list[Path]]:
    """Where the runs of `logger` are, and their last.ckpt files, oldest first."""
    if logger is None:  # without a logger, checkpoints go to default_root_dir/checkpoints
        last = Path(config.trainer.default_root_dir or os.getcwd()) / "checkpoints" / "last.ckpt"
        complete_replace(last)
        return last.parent.parent, [last] if last.exists() else []
    root = run_root(logger)
    return root, last_checkpoints(root)


def chosen_runs(logger: Namespace) -> Path:
    """The folder of the run that `logger`'s version names (W&B's id, version_<n>), else of all its runs."""
    root, version = run_root(logger), logger.init_args.get("version")
    named = [root / str(version), root / f"version_{version}"] if version is not None else []
    return next((folder for folder in named if folder.is_dir()), root)


def run_root(logger: Namespace) -> Path:
    """The folder that holds `logger`'s run folders."""
    args = logger.init_args
    if is_wandb(logger):
        name = args.get("project") or os.environ.get("WANDB_PROJECT", "lightning_logs")
    else:  # CSV and TensorBoard: a name given as null or "" (or carried over from W&B's) puts the runs in save_dir
        name = args.get("name", "lightning_logs") or ""
    return Path(args.get("save_dir") or ".") / name
