"""Exact resume: a run stopped by SIGTERM mid-epoch and resumed ends with the weights and optimizer
state, bit for bit, of the same run uninterrupted (on the CPU, with trainer.deterministic), in the
settings users get by default (data workers, augmentation) and with the recipe's random parts
(Mixup/CutMix, EMA, dropout), for both data formats."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ON_CPU, command_env, on_data
from lightning.pytorch.utilities.exceptions import SIGTERMException
from test_streaming import shards  # noqa: F401 (a fixture)

from {{ cookiecutter.package_name }}.cli import build

EMA = json.dumps({"class_path": "{{ cookiecutter.package_name }}.ema.ModelEMA", "init_args": {"decay": 0.9}})
SIGTERM_AT_STEP_5 = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 5}})
TWO_EPOCHS = ["--trainer.max_epochs=2", "--trainer.limit_val_batches=2", "--trainer.deterministic=true",
              "--data.image_size=32"]  # fmt: skip
# mobilenet_v3_small has dropout, which draws from the training process's random state.
RECIPES = {
    "default": [],
    "strong": [
        "--data.augment=trivialaugment",
        "--model.mixup_alpha=0.4",
        "--model.cutmix_alpha=1.0",
        f"--trainer.callbacks+={EMA}",
        "--model.backbone=mobilenet_v3_small",
    ],
}


def logged_to(folder: str) -> list[str]:
    return ["--trainer.logger={{ cookiecutter.package_name }}.csv_logging.ResumableCSVLogger",
            f"--trainer.logger.save_dir={folder}", "--trainer.logger.name=run"]  # fmt: skip


def fit(*options: str, ckpt_path: str | None = None) -> None:
    cli = build([*ON_CPU, *TWO_EPOCHS, *options])
    with contextlib.suppress(SIGTERMException):  # the interrupted half: main() would exit with 143
        cli.trainer.fit(cli.model, cli.datamodule, ckpt_path=ckpt_path)


def last_checkpoint(folder: Path) -> dict:
    """The last.ckpt of the run under `folder` that trained furthest."""
    saved = [torch.load(path, weights_only=True) for path in folder.glob("*/*/checkpoints/last.ckpt")]
    return max(saved, key=lambda checkpoint: checkpoint["global_step"])


def assert_same_training(one: dict, other: dict) -> None:
    assert one["global_step"] == other["global_step"]
    for key in ("state_dict", "current_model_state", "averaging_state"):  # the last two with EMA
        assert one.get(key, {}).keys() == other.get(key, {}).keys()
        assert [name for name in one.get(key, {}) if not torch.equal(one[key][name], other[key][name])] == [], key
    (optimizer,), (resumed,) = one["optimizer_states"], other["optimizer_states"]
    for index, state in optimizer["state"].items():
        for name, value in state.items():
            assert torch.equal(value, resumed["state"][index][name]), f"optimizer state {index}.{name}"


@pytest.mark.parametrize(
    ("data_format", "workers", "recipe"),
    [("folder", 0, "default"), ("folder", 2, "strong"), ("streaming", 2, "default"), ("streaming", 0, "strong")],
)
def test_a_resumed_run_ends_as_the_uninterrupted_one(
    in_project_copy,
    tiny_shapes,
    shards,  # noqa: F811 (the fixture imported above)
    data_format,
    workers,
    recipe,
):
    data = [*on_data(shards if data_format == "streaming" else tiny_shapes), f"--data.format={data_format}",
            f"--data.num_workers={workers}", *RECIPES[recipe]]  # fmt: skip
    fit(*data, *logged_to("whole"))
    fit(*data, *logged_to("parts"), f"--trainer.callbacks+={SIGTERM_AT_STEP_5}")
    (interrupted,) = Path("parts").glob("run/*/checkpoints/last.ckpt")
    assert torch.load(interrupted, weights_only=True)["global_step"] == 6, "mid-epoch: 9 steps an epoch"
    fit(*data, *logged_to("parts"), ckpt_path=str(interrupted))
    whole = last_checkpoint(Path("whole"))
    assert whole["global_step"] == 18
    assert_same_training(whole, last_checkpoint(Path("parts")))


def start_fit(groups, project: Path, *options: str) -> subprocess.Popen:
    """A fit with the project's own configuration: its default logger, augmentation and 2 workers."""
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *ON_CPU, *TWO_EPOCHS,
               "--data.num_workers=2", *options]  # fmt: skip
    return groups(command, cwd=project, env=command_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_sigterm_to_the_process_group_saves_within_seconds_and_resumes_exactly(in_project_copy, tiny_shapes, groups):
    # scancel, `timeout` and a terminal's signals reach the whole process group: data workers too.
    data = [f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.batch_size=8"]
    whole = start_fit(groups, in_project_copy, *data, "--trainer.logger.save_dir=whole")
    assert whole.wait(timeout=600) == 0, whole.stderr.read().decode()[-3000:]
    marker = in_project_copy / "paused"
    pause = json.dumps({"class_path": "helper_callbacks.PauseAt", "init_args": {"step": 5, "marker": str(marker)}})
    process = start_fit(groups, in_project_copy, *data, f"--trainer.callbacks+={pause}")
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the run never reached the pause"
        time.sleep(0.05)
    signalled = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)
    assert process.wait(timeout=60) == 128 + signal.SIGTERM, process.stderr.read().decode()[-3000:]
    assert time.monotonic() - signalled < 15, "a preempted run must stop well within a scheduler's grace period"
    assert last_checkpoint(in_project_copy / "runs")["global_step"] == 6

    resumed = start_fit(groups, in_project_copy, *data, "--ckpt_path=auto")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()[-3000:]
    assert_same_training(last_checkpoint(in_project_copy / "whole"), last_checkpoint(in_project_copy / "runs"))
