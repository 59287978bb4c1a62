"""What `sweep`, `cv` and `repeat` share: a `fit` run in a folder of its own, in this process; the
metric the checkpoints monitor; and copies of the command, one per GPU."""

import argparse
import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
import yaml

from ..cli import build, exit_status, finish_wandb_run, stop_unhidden
from ..errors import PACKAGE, ConfigError
from ..training.quiet import silence_resume_notice
from ..training.resume import HOW_NOT_WHAT, LINKED
from ..training.run_folders import best_checkpoint, finished, last_checkpoints

# In the copies that --gpus-per-trial starts: each is one of them, and starts none.
WORKER_VARIABLE = "{{ cookiecutter.package_name | upper }}_EXPERIMENT_WORKER"
# Settings that change how the runs of a study or set run, not what they compute: a call that goes
# on with others (another machine's devices, another logger, more data workers) continues it.
HOW_RUNS_RUN = (
    *HOW_NOT_WHAT, *LINKED, "ckpt_path", "weights_only", "allow_resume_changes", "float32_matmul_precision",
    *(f"trainer.{name}" for name in ("accelerator", "strategy", "devices", "num_nodes", "logger", "default_root_dir",
                                     "enable_progress_bar", "enable_model_summary", "log_every_n_steps", "profiler",
                                     "num_sanity_val_steps", "enable_autolog_hparams", "model_registry")),
)  # fmt: skip
# The callbacks that show or record a run and change nothing it trains, by the end of their names.
HOW_CALLBACKS = ("ProgressBar", "Monitor", "PredictionsCSV")


def option(key: str, value) -> str:
    """`--key=value` as the command line reads it back to the same value."""
    text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
    if text.endswith("\n..."):  # PyYAML's end of document after a lone scalar
        text = text[: -len("\n...")]
    return f"--{key}={text}"


def folder_name(text: str) -> str:
    """A --name or --study: one folder, under cv/ or sweeps/ and not elsewhere."""
    if not text or text in (".", "..") or any(sep in text for sep in ("/", "\\")):
        raise argparse.ArgumentTypeError(f"a folder's name, without / or \\ and not . or .., got {text!r}")
    return text


def spelled_alike(args: list[str]) -> list[str]:
    """Fit options as `--name=value`, whichever way they were given (`--name value` too): a command
    line compared with the one that started a study or a set of runs."""
    spelled: list[str] = []
    for arg in args:
        if spelled and spelled[-1].startswith("--") and "=" not in spelled[-1] and not arg.startswith("--"):
            spelled[-1] += f"={arg}"
        else:
            spelled.append(arg)
    return spelled


def same_options(given: list[str], started: list[str]) -> bool:
    """Whether two fit command lines mean the same: spelled alike, in any order where it cannot matter
    (each option once, no config file, nothing appended to a list)."""
    given, started = spelled_alike(given), spelled_alike(started)

    def orderless(args: list[str]) -> bool:
        names = [arg.partition("=")[0] for arg in args]
        plain = all(name.startswith("--") and name[-1] != "+" and name != "--config" for name in names)
        # A whole group (--data=d.yaml) and one of its options replace each other in the order given.
        nested = any(other.startswith(f"{name}.") for name in names for other in names)
        return plain and not nested and len(set(names)) == len(names)

    return given == started or (orderless(given) and orderless(started) and sorted(given) == sorted(started))


def leaf_values(config: dict, prefix: str = "") -> dict[str, object]:
    """Each option that holds a value (not a group of options) in a resolved config, by dotted name."""
    values = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        values |= leaf_values(value, f"{name}.") if isinstance(value, dict) else {name: value}
    return values


def run_settings(config: dict, free: tuple[str, ...] = ()) -> dict[str, object]:
    """What the runs of a study or a set compute with, from fit's resolved `config` (cli.resolved_config):
    every setting but those of how they run, and `free` (the options a sweep searches). Kept as they
    began, so that a config file edited before a call that goes on is not missed."""
    settings = leaf_values(config)
    given = [each if isinstance(each, dict) else {"class_path": each} for each in settings["trainer.callbacks"] or []]
    callbacks = [each for each in given if not str(each.get("class_path")).endswith(HOW_CALLBACKS)]
    settings["trainer.callbacks"] = [str(each.get("class_path")).rpartition(".")[2] for each in callbacks]
    for index, callback in enumerate(callbacks):  # each setting by name: a message shows the one changed
        settings |= leaf_values(callback, f"trainer.callbacks[{index}].")
    return {
        name: value for name, value in settings.items()
        if not any(name == how or name.startswith(f"{how}.") for how in (*HOW_RUNS_RUN, *free))
    }  # fmt: skip


def monitored_metric(config: dict) -> tuple[str, str]:
    """The metric and mode ("max" or "min") of the ModelCheckpoint in fit's resolved `config` that keeps
    the best checkpoint: what a sweep optimises and its pruner watches."""
    for callback in config["trainer"].get("callbacks") or []:
        arguments = callback.get("init_args") or {}
        if str(callback.get("class_path", "")).endswith("ModelCheckpoint") and arguments.get("monitor"):
            return arguments["monitor"], arguments.get("mode", "min")
    raise ConfigError(
        "No ModelCheckpoint in the config monitors a metric, and sweeps and cross-validation compare runs by "
        "it: keep the one of configs/default.yaml (monitor: val/acc)."
    )


def fit_in_folder(cli_args: list[str], folder: Path, callbacks: list | None = None) -> dict[str, float]:
    """Train as `fit` does, with its logs, config.yaml and checkpoints under `folder`, on one device
    in this process (a launcher of more would start this command again in each); a run there that a
    stop interrupted goes on from its last.ckpt, in its own run folder. The validation metrics of the
    best checkpoint."""
    one_device = ["--trainer.devices=1", "--trainer.num_nodes=1", f"--trainer.logger.init_args.save_dir={folder}"]
    lasts = last_checkpoints(folder)
    resumed = next((last for last in reversed(lasts) if not finished(last)), None)
    # Finished, and stopped as its best checkpoint was checked: only that check is left to do.
    trained = lasts[-1] if lasts and resumed is None else None
    if kept := resumed or trained:
        print(f"{'Resuming from' if resumed else 'Validating the best checkpoint of'} {kept}", flush=True)
        one_device.append(f"--trainer.logger.init_args.version={kept.parent.parent.name}")
        silence_resume_notice(kept.parent)  # as fit's: the run goes on in its own folder
    cli = build([*cli_args, *one_device], keep_config=True)
    trainer, added = cli.trainer, callbacks or []
    trainer.callbacks.extend(added)
    status = 0  # this run's W&B run's: a stopped or failed one is no finished one
    try:
        if trained is None:
            with stop_unhidden():  # a sweep takes a stop for the trial's, and a failure for its own
                trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=resumed)
            trainer.callbacks = [callback for callback in trainer.callbacks if callback not in added]  # fit's alone
            best = next(callback for callback in trainer.checkpoint_callbacks if callback.monitor).best_model_path
        else:
            best = str(best_checkpoint(folder, "a new --name"))
        if not best or Path(best).name == "last.ckpt":
            raise ConfigError(f"The run in {folder} validated no epoch, so it has no best checkpoint to compare.")
        (metrics,) = trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=best, verbose=False)
        return {name: float(value) for name, value in metrics.items()}
    except BaseException as error:
        optuna = sys.modules.get("optuna")  # a sweep's: a pruned trial ends as planned
        status = 0 if optuna is not None and isinstance(error, optuna.TrialPruned) else exit_status(error)
        raise
    finally:
        finish_wandb_run(exit_code=status)  # this run's own W&B run: the next one starts another
        del cli
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (or their indices)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [name for name in listed.split(",") if name.strip()]
    return [str(index) for index in range(torch.cuda.device_count())]


def gpus_for_copies() -> list[str]:
    """The GPUs of --gpus-per-trial 1, refused in one line where none is visible: before a command
    writes anything."""
    if gpus := visible_gpus():
        return gpus
    raise ConfigError("--gpus-per-trial 1 runs one copy per GPU, and none is visible: leave it out to run on the CPU.")


def run_per_gpu(command: str, args: list[str], gpus: list[str]) -> int:
    """Run `python -m <package> command args` once per GPU (gpus_for_copies), each copy seeing only
    its GPU; the worst exit status. SIGTERM and Ctrl+C are passed on to every copy, which end their
    runs cleanly."""
    module = [sys.executable, "-m", PACKAGE, command, *args]
    copies = [
        subprocess.Popen(
            module, env=os.environ | {"CUDA_VISIBLE_DEVICES": gpu, WORKER_VARIABLE: f"{index}/{len(gpus)}"}
        )
        for index, gpu in enumerate(gpus)
    ]
    print(f"{command}: {len(copies)} processes, one on each GPU ({', '.join(gpus)})", flush=True)

    def pass_on(signum: int, frame) -> None:
        for copy in copies:
            copy.send_signal(signum)

    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        statuses = [copy.wait() for copy in copies]
        # A copy ended by a signal has status -signal: the shell's 128 + signal.
        return max(128 - status if status < 0 else status for status in statuses)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def worker_part() -> tuple[int, int]:
    """(this copy's index, copies) when run_per_gpu started this process, else (0, 1)."""
    index, count = os.environ.get(WORKER_VARIABLE, "0/1").split("/")
    return int(index), int(count)


def without_option(args: list[str], name: str) -> list[str]:
    """`args` less the option `name` and its value (`--name=value` or `--name value`)."""
    kept, skip = [], False
    for arg in args:
        if skip or arg == name or arg.startswith(f"{name}="):
            skip = arg == name
            continue
        kept.append(arg)
    return kept
