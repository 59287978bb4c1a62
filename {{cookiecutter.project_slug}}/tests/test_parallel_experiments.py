"""Sweeps and cross-validation over several processes, as on a GPU machine or a SLURM array, here on
the CPU: two `sweep` processes sharing one journal, a killed sweep run again, `cv` with a process per
"GPU" (CUDA_VISIBLE_DEVICES names two; the runs train on the CPU)."""

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
import yaml
from conftest import ON_CPU, command_env, kill_group, on_data, run_group
from optuna.trial import TrialState

from {{ cookiecutter.package_name }}.commands.sweep import journal_storage

SHORT = [
    "--trainer.max_epochs=2",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
    "--trainer.enable_progress_bar=false",
]
MODULE = [sys.executable, "-m", "{{ cookiecutter.package_name }}"]


def sweep_command(data: Path, trials: int) -> list[str]:
    return [*MODULE, "sweep", "space.yaml", f"--trials={trials}", "--pruner=none", *ON_CPU, *on_data(data), *SHORT]


def trials_of(name: str = "space") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=journal_storage(Path("sweeps", name))).trials


def a_trial_runs() -> bool:
    try:  # once its process is named: a trial killed before that is failed only after stale_after
        return any(trial.state == TrialState.RUNNING and "pid" in trial.user_attrs for trial in trials_of())
    except (FileNotFoundError, KeyError):  # no journal, or no study in it, yet
        return False


def started(output: str) -> set[int]:
    return {int(number) for number in re.findall(r"^Trial (\d+): --", output, re.MULTILINE)}


def test_two_sweep_processes_share_one_study_and_run_each_trial_once(in_project_copy, tiny_shapes, groups):
    Path("space.yaml").write_text("model.lr: {low: 1.0e-3, high: 1.0e-2, log: true}\n")
    command = sweep_command(tiny_shapes, trials=3)
    processes = [groups(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=command_env())
                 for _ in range(2)]  # fmt: skip
    outputs = [process.communicate(timeout=600)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    trials = trials_of()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 3
    first, second = (started(output) for output in outputs)
    assert not first & second and first | second == {0, 1, 2}, (first, second)
    for trial in trials:
        assert len(list(Path(trial.user_attrs["folder"]).glob("**/config.yaml"))) == 1


def test_a_killed_sweep_run_again_fails_the_abandoned_trial_and_runs_it_again(in_project_copy, tiny_shapes, groups):
    Path("space.yaml").write_text("model.lr: {low: 1.0e-3, high: 1.0e-2, log: true}\n")
    command = sweep_command(tiny_shapes, trials=2)
    sweep = groups(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=command_env())
    deadline = time.monotonic() + 300
    while not a_trial_runs():
        assert time.monotonic() < deadline and sweep.poll() is None, "the sweep never started a trial"
        time.sleep(0.2)
    kill_group(sweep)  # SIGKILL: the trial cannot mark itself failed
    (abandoned,) = trials_of()
    assert abandoned.state == TrialState.RUNNING
    again = run_group(command, 600, env=command_env())
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Trial 0 was abandoned by its process: failed, run again." in again.stdout
    trials = trials_of()
    assert trials[0].state == TrialState.FAIL
    (retry,) = [trial for trial in trials if trial.user_attrs.get("retry_of") == 0]
    assert retry.state == TrialState.COMPLETE and retry.params == abandoned.params
    assert sum(trial.state == TrialState.COMPLETE for trial in trials) == 2


def test_cv_shares_the_folds_among_one_process_per_gpu_and_sums_them_up(in_project_copy, tiny_shapes):
    command = [*MODULE, "cv", "--folds=2", "--gpus-per-trial=1", *ON_CPU, *on_data(tiny_shapes), *SHORT]
    done = run_group(command, 600, env=command_env(CUDA_VISIBLE_DEVICES="0,1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "cv: 2 processes, one on each GPU (0, 1)" in done.stdout
    folder = Path("cv/folds2")
    accuracies = []
    for fold in (0, 1):
        (config,) = (folder / f"fold{fold}").glob("**/config.yaml")
        assert {"num_folds": 2, "fold": fold}.items() <= yaml.safe_load(config.read_text())["data"].items()
        accuracies.append(json.loads((folder / f"fold{fold}" / "metrics.json").read_text())["val/acc"])
    expected = f"{statistics.fmean(accuracies):.4f} ± {statistics.stdev(accuracies):.4f}"
    assert expected in (folder / "summary.md").read_text()
