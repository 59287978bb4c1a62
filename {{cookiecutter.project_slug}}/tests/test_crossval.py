"""`repeat`: runs that differ only in the seed, summed up as mean ± std. (`cv` over processes:
test_parallel_experiments.py; the folds it trains on: test_folds.py.)"""

import functools
import json
import math
{%- if cookiecutter.logger == "wandb" %}
import subprocess
import sys
{%- endif %}
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ON_CPU, {{ 'command_env, ' if cookiecutter.logger == 'wandb' }}disk_full_past, on_data, refusal, run_command
from helper_callbacks import SigtermAt
{%- if cookiecutter.logger == "wandb" %}
from test_wandb_logging import wandb_records
{%- endif %}

from {{ cookiecutter.package_name }}.cli import resolved_config
from {{ cookiecutter.package_name }}.commands import crossval
from {{ cookiecutter.package_name }}.commands.crossval import METRICS
from {{ cookiecutter.package_name }}.commands.experiment_runs import fit_in_folder, run_settings
from {{ cookiecutter.package_name }}.errors import ConfigError

SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.enable_progress_bar=false"]
# Long enough for a stop at step 1 to leave steps to go on with.
STOPPABLE = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=1",
             "--trainer.enable_progress_bar=false"]  # fmt: skip


def test_repeat_trains_one_run_per_seed_and_sums_them_up(monkeypatch, capsys, in_project_copy, tiny_shapes):
    options = [*ON_CPU, *on_data(tiny_shapes), *SHORT]
    run_command(monkeypatch, "repeat", "--seeds=0,1", *options)
    folder = Path("cv/seeds")
    results = {}
    for seed in (0, 1):
        (config,) = (folder / f"seed{seed}").glob("**/config.yaml")
        assert yaml.safe_load(config.read_text())["seed_everything"] == seed
        results[seed] = json.loads((folder / f"seed{seed}" / "metrics.json").read_text())
    accuracies = [results[seed]["val/acc"] for seed in (0, 1)]
    mean, std = sum(accuracies) / 2, abs(accuracies[0] - accuracies[1]) / math.sqrt(2)  # sample std of two
{%- if cookiecutter.logger == "wandb" %}
    # Each a W&B run of its own, though one process trains them one after the other.
    runs = {path.name.rsplit("-", 1)[1] for path in folder.glob("seed*/wandb/offline-run-*")}
    assert len(runs) == 2 and {path.parent.name for path in folder.glob("seed*/*/*/config.yaml")} == runs
{%- endif %}
    summary = (folder / "summary.md").read_text()
    assert f"{mean:.4f} ± {std:.4f}" in summary, summary
    steps = [results[seed]["step"] for seed in (0, 1)]  # the best checkpoint's step: a count, shown as one
    assert f"| seed0 | {results[0]['epoch']:.0f} | {steps[0]:.0f} | " in summary, summary
    assert (folder / "summary.png").stat().st_size
    # Again: both runs are kept, none trained.
    capsys.readouterr()
    run_command(monkeypatch, "repeat", "--seeds=0,1", *options)
    assert capsys.readouterr().out.count("kept from an earlier call") == 2
    # With other options, the runs kept are not the same experiment.
    message = refusal(monkeypatch, capsys, "repeat", "--seeds=0,1", *options, "--model.lr=0.01")
    assert "cv/seeds holds runs started with other options" in message and "--name" in message
    # Stopped as its best checkpoint was checked (metrics.json not written yet): checked again, not retrained.
    (last,) = (folder / "seed1").glob("*/*/checkpoints/last.ckpt")
    trained, earlier = last.read_bytes(), (folder / "seed1" / METRICS).read_text()
    (folder / "seed1" / METRICS).unlink()
    run_command(monkeypatch, "repeat", "--seeds=0,1", *options)
    assert f"Validating the best checkpoint of {last}" in capsys.readouterr().out
    assert list((folder / "seed1").glob("*/*/checkpoints/last.ckpt")) == [last] and last.read_bytes() == trained
    assert json.loads((folder / "seed1" / METRICS).read_text()) == pytest.approx(json.loads(earlier))
    # More seeds add to the runs kept (a folder named by the count of seeds trained them all again).
    capsys.readouterr()
    run_command(monkeypatch, "repeat", "--seeds=0,1,2", *options)
    assert capsys.readouterr().out.count("kept from an earlier call") == 2
    assert (folder / "seed2" / METRICS).is_file() and "| seed2 |" in (folder / "summary.md").read_text()


def stopped_at_step(monkeypatch, step: int) -> None:
    """A SIGTERM at `step` of the runs the command trains, as a preemption: not one of their options."""
    monkeypatch.setattr(crossval, "fit_in_folder", functools.partial(fit_in_folder, callbacks=[SigtermAt(step)]))


def test_a_run_a_sigterm_stopped_goes_on_from_its_checkpoint_when_the_command_runs_again(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    options = [*ON_CPU, *on_data(tiny_shapes), *STOPPABLE]
    stopped_at_step(monkeypatch, 1)
    run_command(monkeypatch, "repeat", "--seeds=0", *options, status=143)
    monkeypatch.setattr(crossval, "fit_in_folder", fit_in_folder)
    (last,) = Path("cv/seeds/seed0").glob("*/*/checkpoints/last.ckpt")
    assert torch.load(last, weights_only=True)["global_step"] == 2
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        run_command(monkeypatch, "repeat", "--seeds=0", *options)
    assert f"Resuming from {last}" in capsys.readouterr().out
    assert not [str(w.message) for w in warned if "exists and is not empty" in str(w.message)], "as fit's resume"
    assert list(Path("cv/seeds/seed0").glob("*/*/checkpoints/last.ckpt")) == [last], "the same run, not a new one"
    assert torch.load(last, weights_only=True)["global_step"] == 4
    assert (last.parent / "finished.json").is_file() and Path("cv/seeds/seed0/metrics.json").is_file()


{%- if cookiecutter.logger == "wandb" %}


def test_a_stopped_runs_wandb_run_is_marked_with_the_stop_not_as_finished(in_project_copy, tiny_shapes):
    # As a stopped fit's is; W&B showed the runs that sweep, cv and repeat stopped as finished ones.
    stop = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 1}})
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "repeat", "--seeds=0", *ON_CPU,
               *on_data(tiny_shapes), *STOPPABLE, f"--trainer.callbacks+={stop}"]  # fmt: skip
    done = subprocess.run(command, cwd=in_project_copy, env=command_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 143, done.stderr[-3000:]
    (record,) = Path("cv/seeds/seed0").glob("**/offline-run-*/run-*.wandb")
    (ended,) = [parsed.exit for parsed in wandb_records(record) if parsed.WhichOneof("record_type") == "exit"]
    assert ended.exit_code == 143
{%- endif %}


def test_a_stopped_run_goes_on_only_with_the_options_it_was_started_with(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    # Checked only once a run had finished: the run stopped went on at the new learning rate, the
    # next at it from the start, and the summary took them for one experiment.
    options = [*ON_CPU, *on_data(tiny_shapes), *STOPPABLE]
    stopped_at_step(monkeypatch, 1)
    run_command(monkeypatch, "cv", "--folds=2", *options, status=143)
    (last,) = Path("cv/folds2/fold0").glob("*/*/checkpoints/last.ckpt")
    saved = last.read_bytes()
    capsys.readouterr()
    message = refusal(monkeypatch, capsys, "cv", "--folds=2", *options, "--model.lr=0.01")
    assert message.startswith("error: cv/folds2 holds runs started with other options (") and "--name" in message
    # The same name for another split of the images: fold0 of 3 is not fold0 of 2.
    message = refusal(monkeypatch, capsys, "cv", "--folds=3", "--name=folds2", *options)
    assert message == (
        "error: cv/folds2/fold0 was started with --data.num_folds=2 --data.fold=0, and this call gives it "
        "--data.num_folds=3 --data.fold=0: pass --name for a new set"
    )
    assert last.read_bytes() == saved


@pytest.mark.parametrize("folds", ["1", "0"])
def test_fewer_than_two_folds_are_refused_in_one_line(monkeypatch, capsys, in_project_copy, folds):
    message = refusal(monkeypatch, capsys, "cv", f"--folds={folds}", *ON_CPU)
    assert message.startswith(f"error: --folds must be 2 or more, got {folds} (python -m"), message
    assert not Path("cv").exists()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["repeat", "--seeds=0,-1"], "argument --seeds: seeds are from 0 to 4294967295, got -1"),
        (["repeat", "--seeds=0", "--name=../../elsewhere"], "argument --name: a folder's name, without / or \\ and"),
        (["cv", "--folds=2", "--name=.."], "argument --name: a folder's name, without / or \\ and not . or .., got"),
    ],
)
def test_seeds_numpy_refuses_and_names_outside_cv_are_refused_in_one_line(
    monkeypatch, capsys, in_project_copy, given, expected
):
    message = refusal(monkeypatch, capsys, *given, *ON_CPU)
    assert message.startswith(f"error: {expected}"), message
    assert not Path("cv").exists() and not Path("../elsewhere").exists()


def test_a_call_that_trained_nothing_holds_its_folder_for_no_one(tmp_path):
    folder, runs = tmp_path / "seeds3", {"seed0": ["--seed_everything=0"]}
    crossval.check_same_options(folder, ["--data.augment", "trivial"], runs, {})  # refused by fit: nothing trained
    crossval.check_same_options(folder, ["--data.augment", "trivialaugment"], runs, {})
    (folder / "seed0").mkdir()
    (folder / "seed0" / "metrics.json").write_text("{}")
    with pytest.raises(ConfigError, match="holds runs started with other options .--data.augment trivialaugment"):
        crossval.check_same_options(folder, ["--data.augment", "none"], runs, {})
    crossval.check_same_options(folder, ["--data.augment=trivialaugment"], runs, {})  # spelled otherwise, the same
    # More seeds with the same options: the runs kept are the same experiment's.
    crossval.check_same_options(
        folder, ["--data.augment", "trivialaugment"], runs | {"seed1": ["--seed_everything=1"]}, {}
    )


def test_runs_kept_go_on_only_with_the_settings_the_config_files_gave_them(monkeypatch, capsys, in_project_copy):
    # configs/default.yaml edited between a stopped cv and the call that goes on: the folds to come
    # trained with another learning rate than fold0, and the summary's mean mixed the two.
    folder, runs = Path("cv/folds2"), crossval.planned_runs(2, None)
    crossval.check_same_options(folder, ON_CPU, runs, run_settings(resolved_config(ON_CPU)))
    (folder / "fold0").mkdir()
    (folder / "fold0" / METRICS).write_text("{}")
    config = in_project_copy / "configs" / "default.yaml"
    config.write_text(config.read_text() + "  num_workers: 0\n")  # how the images are read: it goes on
    crossval.check_same_options(folder, ON_CPU, runs, run_settings(resolved_config(ON_CPU)))
    config.write_text(config.read_text() + "model:\n  lr: 0.004\n")
    message = refusal(monkeypatch, capsys, "cv", "--folds=2", *ON_CPU)
    assert message.startswith("error: cv/folds2 holds runs started with other settings (model.lr "), message
    assert "-> 0.004): put the config files back as they were, or pass --name for a new set" in message
    assert not (folder / "fold1").exists()


def test_a_run_whose_metrics_a_full_disk_cut_short_is_trained_again(monkeypatch, capsys, tmp_path):
    # capsys: the run's printed line must not count against the limit (stdout may be a file).
    metrics = {f"val/metric{index}": 0.5 for index in range(20)}
    trained = []
    monkeypatch.setattr(crossval, "fit_in_folder", lambda options, folder: trained.append(folder) or metrics)
    runs = {"seed0": ["--seed_everything=0"]}
    (tmp_path / "seed0").mkdir()
    with pytest.raises(OSError, match="File too large"), disk_full_past(64):
        crossval.train_runs(runs, [], tmp_path)
    assert list((tmp_path / "seed0").iterdir()) == []
    crossval.train_runs(runs, [], tmp_path)
    assert trained == [tmp_path / "seed0"] * 2
    assert json.loads((tmp_path / "seed0" / "metrics.json").read_text()) == metrics
