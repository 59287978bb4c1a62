"""`python -m {{ cookiecutter.package_name }} sweep SPACE.yaml [--trials N] [fit options]`: an Optuna search.

Each trial is a `fit` run, with the options the sampler draws from SPACE (search_space.py), in a
folder of its own, sweeps/<study>/trials/<number, as 0003>/ (config.yaml, logs, checkpoints), on one device.
A median pruner stops trials whose monitored metric (the checkpoints', val/acc) falls behind
earlier trials' at the same epoch. The study lives in an Optuna storage: by default a journal file
in the sweep's folder, which every `sweep` process with the same study shares, on one machine or on
the nodes of a shared file system (scripts/sweep.sbatch); or --storage with an SQL URL. Together
they run --trials trials (pruned ones count, failed ones do not); the same command again continues
the study. At the end: the best trial's options in configs/tuned.yaml, and summary.md, history.png
and importances.png in the sweep's folder.
"""

import os
import socket
import threading
import time
import warnings
from pathlib import Path

import matplotlib.pyplot as plt

from ..cli import resolved_config
from ..errors import PACKAGE, CommandParser, ConfigError, UserError, changed_settings, one_line
from ..training.callbacks import NonFiniteLossError
from ..training.sigterm import process_alive
from .experiment_runs import (
    fit_in_folder,
    folder_name,
    gpus_for_copies,
    monitored_metric,
    option,
    run_per_gpu,
    run_settings,
    same_options,
    spelled_alike,
    without_option,
    worker_part,
)
from .search_space import read_search_space
from .tuned_config import TUNED_CONFIG, update_tuned_config

try:  # the `sweep` extra
    import optuna
    from optuna.distributions import distribution_to_json
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage
    from optuna.trial import FrozenTrial, Trial, TrialState
    from optuna.visualization import matplotlib as optuna_plots
    from optuna_integration import PyTorchLightningPruningCallback
except ImportError as missing:
    raise ConfigError('Sweeps need Optuna, the sweep extra: pip install -e ".[sweep]"') from missing

SWEEPS = Path("sweeps")
# What counts towards --trials: a failed trial is drawn again.
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
# A trial whose process failed with an error that is not the user's: this many in a row end the sweep.
MAX_FAILURES = 3
# A lock file unchanged for this long was left by a killed process, and the next one to wait breaks it.
STALE_LOCK_SECONDS = 30


class Heartbeat:
    """While a trial trains, the time is written into it every `seconds`: a trial that stops hearing
    it was killed (SIGKILL, a lost node) and is run again."""

    def __init__(self, trial: Trial, seconds: float) -> None:
        self.trial, self.seconds, self.stopped = trial, seconds, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        while True:
            self.trial.set_user_attr("alive_at", time.time())
            if self.stopped.wait(self.seconds):
                return

    def __enter__(self) -> "Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


def abandoned(trial: FrozenTrial, stale_after: float) -> bool:
    """A running trial whose process is gone: not on this host any more, or silent for too long."""
    attrs = trial.user_attrs
    if attrs.get("host") == socket.gethostname() and "pid" in attrs and not process_alive(attrs["pid"]):
        return True
    return time.time() - attrs.get("alive_at", trial.datetime_start.timestamp()) > stale_after


def fail_abandoned_trials(study: "optuna.Study", stale_after: float) -> None:
    """Mark abandoned trials failed and draw each one's options again once (a retry fails for good)."""
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not abandoned(trial, stale_after):
            continue
        study.tell(trial.number, state=TrialState.FAIL)
        retry = "retry_of" not in trial.user_attrs
        if retry:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        print(f"Trial {trial.number} was abandoned by its process: failed{', run again' if retry else ''}.", flush=True)


class SweepLock:
    """The count of trials and the draw of the next one, made by one process at a time: Optuna's file
    lock, which works on network file systems (NFS 3 and later)."""

    def __init__(self, folder: Path) -> None:
        self.lock = JournalFileOpenLock(str(folder / "trials"), grace_period=STALE_LOCK_SECONDS)

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc) -> None:
        self.lock.release()


def run_trials(
    study, distributions, cli_args: list[str], monitor: str, folder: Path, trials: int, stale_after: float
) -> None:
    failures = 0
    while True:
        with SweepLock(folder):
            fail_abandoned_trials(study, stale_after)
            if len(study.get_trials(deepcopy=False, states=COUNTED)) >= trials:
                return
            trial = study.ask(distributions)
            trial_folder = folder / "trials" / f"{trial.number:04d}"
            # Its process, at once: a sweep killed before the trial's first heartbeat leaves it for the
            # next to fail and run again now, not after stale_after.
            trial.set_user_attr("host", socket.gethostname())
            trial.set_user_attr("pid", os.getpid())
            trial.set_user_attr("folder", str(trial_folder))
            trial.set_user_attr("alive_at", time.time())
        options = [option(key, value) for key, value in trial.params.items()]
        print(f"Trial {trial.number}: {' '.join(options)} in {trial_folder}", flush=True)
        try:
            with Heartbeat(trial, stale_after / 4):
                pruning = PyTorchLightningPruningCallback(trial, monitor)
                metrics = fit_in_folder([*cli_args, *options], trial_folder, [pruning])
        except (optuna.TrialPruned, NonFiniteLossError) as stop:
            # A diverged trial is a finding about its options, not a failure to run it again: the
            # sampler takes it as the worst of the pruned.
            study.tell(trial, state=TrialState.PRUNED)
            epochs = len(study.get_trials(deepcopy=False)[trial.number].intermediate_values)
            why = "diverged" if isinstance(stop, NonFiniteLossError) else "pruned"
            print(f"Trial {trial.number} {why} after {epochs} validated epoch(s)", flush=True)
            continue
        except UserError:
            study.tell(trial, state=TrialState.FAIL)
            raise  # a mistake in the options fails every trial alike
        except Exception as error:
            study.tell(trial, state=TrialState.FAIL)
            failures += 1
            print(f"Trial {trial.number} failed: {type(error).__name__}: {error}", flush=True)
            if failures >= MAX_FAILURES:
                raise
            continue
        except BaseException:  # SIGTERM, Ctrl+C: this trial is run again, by this command or another copy
            study.tell(trial, state=TrialState.FAIL)
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            raise
        failures = 0
        trial.set_user_attr("metrics", metrics)
        study.tell(trial, metrics[monitor])
        print(f"Trial {trial.number}: {monitor} {metrics[monitor]:.4f}", flush=True)


def summary_table(study, monitor: str) -> str:
    """Every trial as a markdown row, the best first, then the others by number."""
    keys = sorted({key for trial in study.trials for key in trial.params})
    order = {"maximize": -1, "minimize": 1}[study.direction.name.lower()]
    ranked = sorted(study.trials, key=lambda t: (t.state != TrialState.COMPLETE, order * (t.value or 0), t.number))
    lines = [
        f"| trial | state | {monitor} | {' | '.join(keys)} | epochs | minutes | folder |",
        "|" + " --- |" * (len(keys) + 6),
    ]
    for trial in ranked:
        value = "" if trial.value is None else f"{trial.value:.4f}"
        params = [shown(trial.params.get(key, "")) for key in keys]
        minutes = f"{trial.duration.total_seconds() / 60:.1f}" if trial.duration else ""
        epochs = len(trial.intermediate_values)
        row = [
            str(trial.number),
            trial.state.name.lower(),
            value,
            *params,
            str(epochs),
            minutes,
            trial.user_attrs.get("folder", ""),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def shown(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def draw_plots(study, folder: Path) -> list[Path]:
    """Optuna's optimisation history and, from two finished trials, its parameter importances."""
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    plots = {"history.png": lambda: optuna_plots.plot_optimization_history(study)}
    if len(finished) >= 2:  # PED-ANOVA: no scikit-learn needed, unlike Optuna's default fANOVA
        evaluator = PedAnovaImportanceEvaluator()
        plots["importances.png"] = lambda: optuna_plots.plot_param_importances(study, evaluator=evaluator)
    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for name, plot in plots.items():
            axes = plot()
            axes.figure.savefig(folder / name, dpi=100, bbox_inches="tight")
            plt.close(axes.figure)
            written.append(folder / name)
    return written


def summarise(study, folder: Path, monitor: str) -> int:
    table = summary_table(study, monitor)
    (folder / "summary.md").write_text(f"# Sweep {study.study_name}\n\n{table}\n")
    print(table)
    plots = draw_plots(study, folder)
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if not finished:
        print(f"No trial finished: nothing written to {TUNED_CONFIG}.")
        return 1
    best = study.best_trial
    how = f"sweep {study.study_name}, trial {best.number} of {len(finished)} finished ({monitor} {best.value:.4f})"
    for key, value in best.params.items():
        update_tuned_config(key, value, how)
    options = " ".join(option(key, value) for key, value in best.params.items())
    print(f"Best: trial {best.number}, {monitor} {best.value:.4f}: {options}")
    print(f"Written to {TUNED_CONFIG}; the table and {', '.join(p.name for p in plots)} are in {folder}")
    return 0


def journal_storage(folder: Path) -> JournalStorage:
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / "journal.log")
    # Not Optuna's default lock, a symbolic link to this relative path: it dangles, and a lock left by
    # a process killed while writing could never be found stale, so the next sweep would wait forever.
    lock = JournalFileOpenLock(path, grace_period=STALE_LOCK_SECONDS)
    return JournalStorage(JournalFileBackend(path, lock_obj=lock))


def open_study(name: str, storage: str | None, folder: Path, direction: str, pruner):
    if storage is None:
        storage = journal_storage(folder)
    sampler = optuna.samplers.TPESampler(constant_liar=True)  # parallel trials spread out instead of piling up
    try:
        study = optuna.create_study(
            study_name=name, storage=storage, direction=direction, pruner=pruner, sampler=sampler, load_if_exists=True
        )
    except ImportError as error:
        raise ConfigError(f"--storage {storage}: {error}") from None
    except Exception as error:  # SQLAlchemy's, for a URL it cannot parse or a database it cannot reach
        if not isinstance(storage, str):
            raise
        raise ConfigError(
            f"--storage {storage}: {one_line(error)}. Give an SQL URL (sqlite:///sweeps/study.db, "
            "postgresql://user@host/db), or leave it out for a journal file in the study's folder."
        ) from None
    if study.direction.name.lower() != direction:
        raise ConfigError(
            f"Study {name} {study.direction.name.lower()}s its metric, and the checkpoints now {direction} it: "
            "start another with --study"
        )
    return study


def check_same_study(study, distributions: dict, cli_args: list[str], settings: dict) -> None:
    """Refuse to go on with a study started with another search space, other fit options or other
    `settings` (run_settings: what the config files set): its trials would not compare, and the best
    one's options would mix with another's in tuned.yaml."""
    space = {name: distribution_to_json(d) for name, d in distributions.items()}
    asked = {"space": space, "options": spelled_alike(cli_args), "settings": settings}
    held = {key: study.user_attrs[key] for key in asked if key in study.user_attrs}
    # A study all of whose trials failed (a bound the model refused, as its first trial started) has
    # nothing to compare: it goes on with the space and options given now.
    alive = study.get_trials(deepcopy=False, states=[s for s in TrialState if s != TrialState.FAIL])
    if not held or not alive:  # or a new study (copies on other GPUs write the same), or one recorded before
        for key, value in asked.items():
            study.set_user_attr(key, value)
        return
    same = {"space": held.get("space") == space, "options": same_options(cli_args, held.get("options") or [])}
    differ = [key for key in same if not same[key]]
    if differ:
        earlier = " ".join(held.get("options") or []) or "none"
        said = {"space": "another search space", "options": f"other fit options ({earlier})"}
        raise ConfigError(
            f"Study {study.study_name} was run with {' and '.join(said[key] for key in differ)}: "
            "give the same, or start another with --study."
        )
    if changed := changed_settings(held.get("settings", {}), settings):  # a config file edited since
        raise ConfigError(
            f"Study {study.study_name} was run with other settings ({changed}): put the config files back as they "
            "were, or start another with --study."
        )
    if "settings" not in held:  # a study begun before they were kept
        study.set_user_attr("settings", settings)


def main(args: list[str]) -> int:
    parser = CommandParser(prog=f"{PACKAGE} sweep", description=__doc__.splitlines()[0])
    parser.add_argument("space", type=Path, help="the search space, a YAML file (configs/sweep.yaml shows one)")
    parser.add_argument(
        "--trials", type=int, default=20, help="trials to run in all, by every process of the study (%(default)s)"
    )
    parser.add_argument(
        "--study", type=folder_name, help="the study's name and folder under sweeps/ (default: the space file's name)"
    )
    parser.add_argument("--storage", help="an SQL URL for the study (default: a journal file in its folder)")
    parser.add_argument(
        "--gpus-per-trial", type=int, choices=[1], help="1: one process per visible GPU, each running trials on its GPU"
    )
    parser.add_argument(
        "--pruner", choices=["median", "none"], default="median", help="stop trials that fall behind (%(default)s)"
    )
    parser.add_argument(
        "--prune-after-trials", type=int, default=5, help="finished trials before any is pruned (%(default)s)"
    )
    parser.add_argument(
        "--prune-after-epochs", type=int, default=1, help="epochs a trial trains before it may be pruned (%(default)s)"
    )
    parser.add_argument(
        "--stale-after",
        type=float,
        default=600,
        help="seconds without a heartbeat after which a running trial is taken for dead (%(default)s)",
    )
    options, cli_args = parser.parse_known_args(args)
    parser.check_at_least(options, {"--trials": 1, "--prune-after-trials": 0, "--prune-after-epochs": 1})
    if options.stale_after <= 0:
        parser.error(f"--stale-after must be above 0, got {options.stale_after:g}")
    name = options.study or options.space.stem
    folder = SWEEPS / name
    config = resolved_config(cli_args)
    distributions = read_search_space(options.space, cli_args, config)  # checked once, before any trial or copy starts
    monitor, mode = monitored_metric(config)
    gpus = gpus_for_copies() if options.gpus_per_trial else []
    pruner = optuna.pruners.NopPruner()
    if options.pruner == "median":
        # The epochs' reports count from 0: the Nth epoch's is step N - 1, the first Optuna may prune at.
        pruner = optuna.pruners.MedianPruner(options.prune_after_trials, options.prune_after_epochs - 1)
    study = open_study(name, options.storage, folder, {"max": "maximize", "min": "minimize"}[mode], pruner)
    check_same_study(study, distributions, cli_args, run_settings(config, free=tuple(distributions)))
    folder.mkdir(parents=True, exist_ok=True)  # where the trials go; a journal storage made it already
    if gpus:
        status = run_per_gpu("sweep", without_option(args, "--gpus-per-trial"), gpus)
        if status:
            return status
    else:
        run_trials(study, distributions, cli_args, monitor, folder, options.trials, options.stale_after)
        if worker_part()[1] > 1:
            return 0  # the process that started the copies sums up once they are all done
    with SweepLock(folder):
        return summarise(study, folder, monitor)
