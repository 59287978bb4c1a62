"""`sweep`: trials that train for real, each in its folder; pruning; the best options in
configs/tuned.yaml; search spaces checked before any trial. (Processes sharing a study:
test_parallel_experiments.py.)"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from contextlib import nullcontext
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import ON_CPU, PROJECT_ROOT, command_env, on_data, refusal, run_command
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from {{ cookiecutter.package_name }}.cli import resolved_config
from {{ cookiecutter.package_name }}.commands import sweep
from {{ cookiecutter.package_name }}.commands.experiment_runs import run_settings
from {{ cookiecutter.package_name }}.commands.search_space import read_search_space

# A few steps per epoch, and no progress bar in the test's output.
SHORT = ["--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", "--trainer.enable_progress_bar=false"]


def sweep_options(data: Path, *more: str) -> list[str]:
    return [*ON_CPU, *on_data(data), *SHORT, *more]


def study(name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=sweep.journal_storage(Path("sweeps", name)))


def best_checkpoint_acc(folder: Path) -> float:
    """val/acc of the trial's best checkpoint, as its file name records it (acc0.1234)."""
    (best,) = [path for path in folder.glob("**/checkpoints/*.ckpt") if path.stem != "last"]
    return float(re.search(r"acc(\d\.\d{4})", best.name).group(1))


def test_a_sweep_trains_each_trial_in_its_folder_and_keeps_the_best_options(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    Path("space.yaml").write_text("model.lr: {low: 1e-4, high: 1.0e-2, log: true}\ndata.augment: [basic, none]\n")
    run_command(monkeypatch, "sweep", "space.yaml", "--trials=2", "--pruner=none",
                *sweep_options(tiny_shapes, "--trainer.max_epochs=2"))  # fmt: skip
    trials = study("space").trials
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 2
    for trial in trials:
        folder = Path(trial.user_attrs["folder"])
        (config,) = folder.glob("**/config.yaml")
        trained = yaml.safe_load(config.read_text())
        # The trial trained with the options it was given, and its value is its best checkpoint's metric.
        assert trained["model"]["lr"] == pytest.approx(trial.params["model.lr"])
        assert trained["data"]["augment"] == trial.params["data.augment"]
        assert trial.value == pytest.approx(best_checkpoint_acc(folder), abs=5e-5)
        assert sorted(trial.intermediate_values) == [0, 1]  # one report per epoch, none from the last validation
    best = max(trials, key=lambda trial: trial.value)
    tuned = yaml.safe_load(Path("configs/tuned.yaml").read_text())
    assert tuned["model"]["lr"] == best.params["model.lr"] and tuned["data"]["augment"] == best.params["data.augment"]
    summary = Path("sweeps/space/summary.md").read_text()
    assert summary.count("| complete |") == 2
    assert Path("sweeps/space/history.png").stat().st_size and Path("sweeps/space/importances.png").stat().st_size
    # fit with the tuned file trains with them.
    capsys.readouterr()
    run_command(monkeypatch, "fit", "--config=configs/tuned.yaml", "--print_config")
    assert yaml.safe_load(capsys.readouterr().out)["model"]["lr"] == best.params["model.lr"]


def test_a_trial_behind_the_median_is_pruned_after_its_first_epoch(monkeypatch, in_project_copy, tiny_shapes):
    # A finished trial that scored 1.0 at every epoch: a new trial's first epoch falls below it.
    Path("sweeps/pruned").mkdir(parents=True)
    storage = sweep.journal_storage(Path("sweeps/pruned"))
    earlier = optuna.create_study(study_name="pruned", storage=storage, direction="maximize")
    lr = CategoricalDistribution([0.003])
    earlier.add_trial(optuna.trial.create_trial(params={"model.lr": 0.003}, distributions={"model.lr": lr}, value=1.0,
                                                intermediate_values={0: 1.0, 1: 1.0, 2: 1.0}))  # fmt: skip
    Path("space.yaml").write_text("model.lr: [0.003]\n")
    run_command(monkeypatch, "sweep", "space.yaml", "--study=pruned", "--trials=2", "--prune-after-trials=1",
                "--prune-after-epochs=1", *sweep_options(tiny_shapes, "--trainer.max_epochs=3"))  # fmt: skip
    pruned = study("pruned").trials[1]
    assert pruned.state == TrialState.PRUNED
    # It reported its first epoch's val/acc and went no further, where max_epochs allowed three.
    assert list(pruned.intermediate_values) == [0] and pruned.intermediate_values[0] < 1.0


def test_a_diverging_trial_counts_as_pruned_and_the_sweep_writes_nothing(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    Path("space.yaml").write_text("model.lr: [0.001]\n")
    # Images divided by a std of 1e-38 reach float32's largest values: the loss is not finite.
    exploding = ["--trainer.max_epochs=1", "--data.std=[1.0e-38,1.0e-38,1.0e-38]"]
    run_command(monkeypatch, "sweep", "space.yaml", "--trials=1", *sweep_options(tiny_shapes, *exploding), status=1)
    (trial,) = study("space").trials
    assert trial.state == TrialState.PRUNED
    assert "Trial 0 diverged" in capsys.readouterr().out
    assert not Path("configs/tuned.yaml").exists()


def test_a_sweep_stopped_by_sigterm_says_to_run_the_same_sweep_again(monkeypatch, capsys, in_project_copy, tiny_shapes):
    # It named the fit that checking the search space had resolved last: `fit ... --print_config --ckpt_path auto`.
    Path("space.yaml").write_text("model.lr: [0.001]\n")
    stop = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 1}})
    command = ["sweep", "space.yaml", "--trials=1", *sweep_options(tiny_shapes, "--trainer.max_epochs=1"),
               f"--trainer.callbacks+={stop}"]  # fmt: skip
    run_command(monkeypatch, *command, status=128 + signal.SIGTERM)
    told = capsys.readouterr().err.strip().splitlines()[-1]
    assert told == f"Resume this run with: {shlex.join(['python', '-m', '{{ cookiecutter.package_name }}', *command])}"


# A sweep process killed while it holds the journal's lock, as on a lost node: its first write
# ends in SIGKILL instead of the lock's release, whichever kind of lock the journal takes.
KILLED_WHILE_WRITING = """
import os, signal, sys
from pathlib import Path
from optuna.storages.journal import JournalFileOpenLock, JournalFileSymlinkLock
from {{ cookiecutter.package_name }}.commands.sweep import open_study
for lock in (JournalFileOpenLock, JournalFileSymlinkLock):
    lock.release = lambda self: os.kill(os.getpid(), signal.SIGKILL)
open_study("space", None, Path(sys.argv[1]), "maximize", None)
"""


def test_the_lock_of_a_sweep_killed_while_writing_is_broken_by_the_next_sweep(monkeypatch, in_project_copy):
    folder = Path("sweeps/space")
    folder.mkdir(parents=True)
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_WRITING, str(folder)], timeout=120, env=command_env())
    assert killed.returncode == -signal.SIGKILL and os.path.lexists(folder / "journal.log.lock")
    monkeypatch.setattr(sweep, "STALE_LOCK_SECONDS", 3)
    opened = []
    # In a thread, as a lock never broken would hang the test.
    opening = threading.Thread(target=lambda: opened.append(sweep.open_study("space", None, folder, "maximize", None)))
    opening.daemon = True
    opening.start()
    opening.join(timeout=60)
    assert opened, "the next sweep still waits for the lock of the killed one"
    assert opened[0].ask().number == 0  # and it writes to the journal


@pytest.mark.parametrize(
    ("space", "named"),
    [
        (
            "model.lrr: {low: 0.001, high: 0.1}\n",
            "model.lrr is no fit option (or a group of them): did you mean model.lr",
        ),
        ("model: {low: 0.001, high: 0.1}\n", "model is no fit option (or a group of them)"),
        ("model.lr: {low: 0.1, high: 0.001}\n", "model.lr: low (0.1) must be below high (0.001)"),
        ("model.lr: {low: 0, high: 0.1, log: true}\n", "model.lr: a log range needs low above 0"),
        ("model.lr: {low: 0.001, hi: 0.1}\n", "model.lr: {'low': 0.001, 'hi': 0.1} is no search range"),
        ("model.lr: 0.01\n", "model.lr: 0.01 is no search range"),
        ("data.augment: [basic, bogus]\n", "space.yaml: --data.augment: bogus is none of none, basic, "),
        ("data.batch_size: {low: 8.5, high: 64}\n", "--data.batch_size"),
        ("- model.lr\n", "must map fit options"),
        ("model.lr: [0.1\n", "is not valid YAML"),
        ("data.batch_size: {low: 16, high: 64, step: 0}\n", "data.batch_size: step must be above 0, got 0"),
        ('model.lr: {low: 0.001, high: 0.1, log: "no"}\n', "model.lr: log must be true or false, got 'no'"),
    ],
)
def test_a_bad_search_space_is_refused_in_one_line_naming_the_key(monkeypatch, capsys, in_project_copy, space, named):
    Path("space.yaml").write_text(space)
    message = refusal(monkeypatch, capsys, "sweep", "space.yaml", *ON_CPU)
    assert message.startswith("error: space.yaml") and named in message, message
    assert not Path("sweeps").exists()  # refused before any trial


@pytest.mark.parametrize(
    ("option", "expected"),
    [
        ("--trials=0", "--trials must be 1 or more, got 0"),
        ("--prune-after-epochs=0", "--prune-after-epochs must be 1 or more, got 0"),
        ("--prune-after-trials=-2", "--prune-after-trials must be 0 or more, got -2"),
        ("--stale-after=-5", "--stale-after must be above 0, got -5"),
    ],
)
def test_wrong_counts_and_staleness_are_refused_in_one_line(monkeypatch, capsys, in_project_copy, option, expected):
    message = refusal(monkeypatch, capsys, "sweep", "configs/sweep.yaml", option, *ON_CPU)
    assert message.startswith(f"error: {expected} (python -m"), message
    assert not Path("sweeps").exists()


def test_a_storage_that_is_no_sql_url_is_refused_in_one_line(monkeypatch, capsys, in_project_copy):
    message = refusal(monkeypatch, capsys, "sweep", "configs/sweep.yaml", "--storage=foo", *ON_CPU)
    assert message.startswith("error: --storage foo: ") and "Give an SQL URL (sqlite:///" in message, message
    # A misspelt sweep option went on to fit's parser, which offered the closest of its own: "trainer".
    message = refusal(monkeypatch, capsys, "sweep", "configs/sweep.yaml", "--trails", "3", *ON_CPU)
    assert message.startswith("error: unrecognized argument --trails: did you mean --trials?"), message
    assert not Path("sweeps").exists()


def test_sweep_sbatch_runs_the_sweep_as_a_job_step_and_requeues_a_task_stopped_by_sigterm(in_project_copy):
    # Slurm's early SIGTERM (--signal=TERM@120, no B:) reaches job steps only: a sweep that the script
    # started itself never got it, and its task was not requeued.
    fake = in_project_copy / "fake-slurm"
    fake.mkdir()
    (fake / "srun").write_text(f'#!/usr/bin/env bash\necho "$@" > {fake}/srun.log\nexit 143\n')  # stopped
    (fake / "scontrol").write_text(f'#!/usr/bin/env bash\necho "$@" > {fake}/scontrol.log\n')
    for tool in ("srun", "scontrol"):
        (fake / tool).chmod(0o755)
    slurm = {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_ID": "55", "SLURM_CPUS_PER_TASK": "8"}
    script = PROJECT_ROOT / "scripts" / "sweep.sbatch"
    env = command_env(PYTHON=sys.executable, **slurm)
    done = subprocess.run(["bash", str(script), "configs/sweep.yaml", "--trials", "4"], cwd=in_project_copy, env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 143, done.stderr
    started = (fake / "srun.log").read_text().split()
    assert started == ["--cpus-per-task=8", sys.executable, "-m", "{{ cookiecutter.package_name }}", "sweep",
                       "configs/sweep.yaml", "--trials", "4"]  # fmt: skip
    assert (fake / "scontrol.log").read_text().split() == ["requeue", "55"]


def test_the_projects_search_space_is_valid(in_project_copy):
    distributions = read_search_space(Path("configs/sweep.yaml"), ON_CPU, resolved_config(ON_CPU))
    assert {"model.lr", "data.augment"} <= distributions.keys()


def test_a_missing_search_space_and_no_gpu_are_refused(monkeypatch, capsys, in_project_copy):
    assert "No search space at nothing.yaml" in refusal(monkeypatch, capsys, "sweep", "nothing.yaml", *ON_CPU)
    Path("space.yaml").write_text("model.lr: [0.001]\n")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    message = refusal(monkeypatch, capsys, "sweep", "space.yaml", "--gpus-per-trial=1", *ON_CPU)
    assert "none is visible" in message
    assert not Path("sweeps").exists(), "a refused sweep starts no study"


def test_a_study_goes_on_only_with_the_search_space_and_options_it_was_started_with():
    # Its trials would not compare, and tuned.yaml would mix the best one's options with another's.
    started = optuna.create_study(direction="maximize")
    space = {"model.lr": CategoricalDistribution([0.001, 0.01])}
    sweep.check_same_study(started, space, ["--trainer.max_epochs=1"], {})
    started.enqueue_trial({})  # a trial to come: the study has trials to compare
    sweep.check_same_study(started, space, ["--trainer.max_epochs=1"], {})  # the same again: it goes on
    sweep.check_same_study(started, space, ["--trainer.max_epochs", "1"], {})  # spelled otherwise, the same
    with pytest.raises(sweep.ConfigError, match="another search space: give the same, or start another with --study"):
        sweep.check_same_study(started, {"model.lr": CategoricalDistribution([0.1])}, ["--trainer.max_epochs=1"], {})
    with pytest.raises(sweep.ConfigError, match=r"with other fit options \(--trainer.max_epochs=1\): give"):
        sweep.check_same_study(started, space, [], {})
    # The same options in another order are the same; config files, whose order decides, are not.
    options, configs = ["--trainer.max_epochs=1", "--model.lr=0.01"], ["--config=a.yaml", "--config=b.yaml"]
    group = ["--data.batch_size=4", "--data=d.yaml"]  # the later one sets the batch size
    for given, reordered, same in [(options, ["--model.lr", "0.01", "--trainer.max_epochs=1"], True),
                                   (configs, configs[::-1], False), (group, group[::-1], False)]:  # fmt: skip
        another = optuna.create_study(direction="maximize")
        sweep.check_same_study(another, space, given, {})
        another.enqueue_trial({})
        with nullcontext() if same else pytest.raises(sweep.ConfigError, match="with other fit options"):
            sweep.check_same_study(another, space, reordered, {})


def test_a_study_goes_on_only_with_the_settings_the_config_files_gave_it(in_project_copy):
    # configs/default.yaml edited between a stopped sweep and the call that goes on: trials of another
    # length than the first, and the best of them into tuned.yaml.
    started, space = optuna.create_study(direction="maximize"), {"model.lr": CategoricalDistribution([0.001, 0.01])}
    sweep.check_same_study(started, space, ON_CPU, run_settings(resolved_config(ON_CPU), free=tuple(space)))
    started.enqueue_trial({})
    config = in_project_copy / "configs" / "default.yaml"
    config.write_text(config.read_text() + "  num_workers: 0\nmodel:\n  lr: 0.5\n")  # how, and an option searched
    sweep.check_same_study(started, space, ON_CPU, run_settings(resolved_config(ON_CPU), free=tuple(space)))
    config.write_text(re.sub(r"max_epochs: \d+", "max_epochs: 99", config.read_text()))
    with pytest.raises(sweep.ConfigError, match=r"other settings \(trainer.max_epochs \d+ -> 99\): put the config"):
        sweep.check_same_study(started, space, ON_CPU, run_settings(resolved_config(ON_CPU), free=tuple(space)))


def test_a_study_whose_trials_all_failed_takes_the_search_space_given_now():
    # Its first trial failed on a bound that the model refused (model.lr -0.5): the file put right goes on.
    started = optuna.create_study(direction="maximize")
    sweep.check_same_study(started, {"model.lr": CategoricalDistribution([-0.5])}, [], {})
    started.tell(started.ask(), state=TrialState.FAIL)
    sweep.check_same_study(started, {"model.lr": CategoricalDistribution([0.01])}, [], {})
    started.enqueue_trial({})
    with pytest.raises(sweep.ConfigError, match="another search space"):
        sweep.check_same_study(started, {"model.lr": CategoricalDistribution([-0.5])}, [], {})
