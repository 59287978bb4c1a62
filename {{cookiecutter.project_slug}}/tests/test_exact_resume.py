"""Exact resume: a run stopped by SIGTERM mid-epoch and resumed ends with the weights and optimizer
state, bit for bit, of the same run uninterrupted (on the CPU, with trainer.deterministic), in the
settings users get by default (data workers, augmentation) and with the recipe's random parts
(Mixup/CutMix, EMA, dropout){{ ", for both data formats" if cookiecutter.streaming == "yes" }}; and a preempted run that goes on at
the next unseen image, which sees every image once an epoch across the two runs."""

import contextlib
import csv
import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from conftest import ON_CPU, command_env, on_data, run_group
from lightning.pytorch.utilities.exceptions import SIGTERMException
from test_warnings import warnings_in

from {{ cookiecutter.package_name }}.cli import build
from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.datasets.images import read_rgb

EMA = json.dumps({"class_path": "{{ cookiecutter.package_name }}.training.ema.ModelEMA", "init_args": {"decay": 0.9}})
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
# The options that read each of the tiny dataset's fixtures (image folders are the default format).
FORMAT_OF = {"tiny_shapes": []
{%- if cookiecutter.streaming == "yes" %}, "shards": ["--data.format=streaming"]
{%- endif %}}


def logged_to(folder: str) -> list[str]:
    return ["--trainer.logger={{ cookiecutter.package_name }}.training.csv_logging.ResumableCSVLogger",
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


def test_a_run_stopped_inside_an_accumulation_window_saves_at_its_end_and_ends_as_the_uninterrupted_one(
    in_project_copy, tiny_shapes
):
    # Saved after the window's first batch, whose gradients no checkpoint holds: the resumed run went on without them.
    data = [*on_data(tiny_shapes), "--data.num_workers=0", "--trainer.accumulate_grad_batches=2"]
    fit(*data, *logged_to("whole"))
    # Sent after batch 4, taken at the next batch's end: the 5th, the first of a window.
    sigterm = json.dumps({"class_path": "helper_callbacks.SigtermAfterBatches", "init_args": {"batches": 4}})
    fit(*data, *logged_to("parts"), f"--trainer.callbacks+={sigterm}")
    (interrupted,) = Path("parts").glob("run/*/checkpoints/last.ckpt")
    assert torch.load(interrupted, weights_only=True)["global_step"] == 3  # after batch 6, the window's last
    fit(*data, *logged_to("parts"), ckpt_path=str(interrupted))
    whole = last_checkpoint(Path("whole"))
    assert whole["global_step"] == 10  # 9 batches an epoch, in windows of 2 and a last of 1
    assert_same_training(whole, last_checkpoint(Path("parts")))


@pytest.mark.parametrize(
    ("dataset", "workers", "recipe", "step"),
    [
        ("tiny_shapes", 0, "default", 5),
        ("tiny_shapes", 2, "strong", 5),
        ("tiny_shapes", 2, "default", 14),
{%- if cookiecutter.streaming == "yes" %}
        ("shards", 2, "default", 14),
        ("shards", 0, "strong", 5),
{%- endif %}
    ],
)
def test_a_resumed_run_ends_as_the_uninterrupted_one(in_project_copy, request, dataset, workers, recipe, step):
    data = [*on_data(request.getfixturevalue(dataset)), *FORMAT_OF[dataset], f"--data.num_workers={workers}",
            *RECIPES[recipe]]  # fmt: skip
    fit(*data, *logged_to("whole"))
    sigterm = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": step}})
    fit(*data, *logged_to("parts"), f"--trainer.callbacks+={sigterm}")
    (interrupted,) = Path("parts").glob("run/*/checkpoints/last.ckpt")
    # Mid-epoch (9 steps an epoch): in the first epoch, or in the second, whose order its seed sets anew.
    assert torch.load(interrupted, weights_only=True)["global_step"] == step + 1
    fit(*data, *logged_to("parts"), ckpt_path=str(interrupted))
    whole = last_checkpoint(Path("whole"))
    assert whole["global_step"] == 18
    assert_same_training(whole, last_checkpoint(Path("parts")))
    # The interrupted epoch's numbers are over all of it, not over the part after the resume.
    assert len(logged(Path("whole"), "train")) == 2
    assert logged(Path("parts"), "train") == logged(Path("whole"), "train")


@pytest.mark.parametrize(
    ("dataset", "val_check_interval", "crash", "saved"),
    [
        ("tiny_shapes", 1.0, 13, 9),
        ("tiny_shapes", 0.5, 6, 4),
{%- if cookiecutter.streaming == "yes" %}
        ("shards", 1.0, 13, 9),
{%- endif %}
    ],
    ids=["epochs-end", "mid-epoch"{{ ', "shards-epochs-end"' if cookiecutter.streaming == "yes" }}],
)
def test_a_run_resumed_from_its_last_validation_ends_as_the_uninterrupted_one(
    in_project_copy, request, dataset, val_check_interval, crash, saved
):
    # Killed after a validation, it goes on from the last.ckpt saved there, with the default workers.
    data = [*on_data(request.getfixturevalue(dataset)), *FORMAT_OF[dataset], "--data.num_workers=2",
            f"--trainer.val_check_interval={val_check_interval}"]  # fmt: skip
    fit(*data, *logged_to("whole"))
    crash_at = json.dumps({"class_path": "helper_callbacks.CrashAt", "init_args": {"step": crash}})
    with pytest.raises(SystemError, match=f"crashed at step {crash}"):
        fit(*data, *logged_to("parts"), f"--trainer.callbacks+={crash_at}")
    (interrupted,) = Path("parts").glob("run/*/checkpoints/last.ckpt")
    assert torch.load(interrupted, weights_only=True)["global_step"] == saved, "the last validation's step"
    fit(*data, *logged_to("parts"), ckpt_path=str(interrupted))
    assert_same_training(last_checkpoint(Path("whole")), last_checkpoint(Path("parts")))


def logged(folder: Path, stage: str) -> dict[tuple[str, str], dict[str, str]]:
    """The numbers of a stage's epochs (val/, or train/ without the steps' own) that a run logged
    to its CSV files, by epoch and step."""
    logged = {}
    for path in folder.glob("*/*/metrics.csv"):
        for row in csv.DictReader(path.open()):
            numbers = {name: value for name, value in row.items()
                       if name.startswith(f"{stage}/") and not name.endswith("_step") and value}  # fmt: skip
            if numbers:
                assert (row["epoch"], row["step"]) not in logged, f"a {stage} epoch logged twice"
                logged[row["epoch"], row["step"]] = numbers
    return logged


@pytest.mark.parametrize(
    ("dataset", "val_check_interval", "recipe"),
    [
        ("tiny_shapes", 1.0, "default"),
        ("tiny_shapes", 0.5, "strong"),
{%- if cookiecutter.streaming == "yes" %}
        # LitData's loader counts its epochs itself: the resumed run took its next one for the stopped one.
        ("shards", 1.0, "default"),
{%- endif %}
    ],
    ids=["epochs-end", "mid-epoch"{{ ', "shards-epochs-end"' if cookiecutter.streaming == "yes" }}],
)
def test_a_run_stopped_during_validation_saves_at_once_and_validates_again_on_resume(
    capsys, in_project_copy, request, dataset, val_check_interval, recipe
):
    # A long validation would outlast a preemption's grace period: the stop does not wait for its end.
    data = [*on_data(request.getfixturevalue(dataset)), *FORMAT_OF[dataset], "--data.num_workers=2",
            f"--trainer.val_check_interval={val_check_interval}", *RECIPES[recipe]]  # fmt: skip
    fit(*data, *logged_to("whole"))
    uninterrupted = epoch_line(capsys.readouterr().out, 0)
    sigterm = json.dumps({"class_path": "helper_callbacks.SigtermInValidation", "init_args": {"epoch": 0}})
    fit(*data, *logged_to("parts"), f"--trainer.callbacks+={sigterm}")
    (interrupted,) = Path("parts").glob("run/*/checkpoints/last.ckpt")
    assert torch.load(interrupted, weights_only=True)["global_step"] == int(9 * val_check_interval)
    assert logged(Path("parts"), "val") == {}, "nothing of the validation stopped is logged"
    capsys.readouterr()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        fit(*data, *logged_to("parts"), ckpt_path=str(interrupted))
    resumed = capsys.readouterr().out
    assert " 0 img/s" not in resumed, "a rate where no training image was seen"
    # The epoch's line gave the restored optimizer's rate, the next step's, as the epoch's, and left out
    # the train/ numbers where the resumed run took no step of the epoch.
    shown = epoch_line(resumed, 0)
    trained = val_check_interval < 1  # steps of the epoch follow the stop
    assert shown == {name: value for name, value in uninterrupted.items() if trained or name != "lr"}
    assert not [str(warning.message) for warning in warned if "before the ``update``" in str(warning.message)]
    whole, parts = last_checkpoint(Path("whole")), last_checkpoint(Path("parts"))
    assert_same_training(whole, parts)
    assert len(logged(Path("whole"), "val")) == 2 / val_check_interval
    assert logged(Path("parts"), "val") == logged(Path("whole"), "val")
    assert logged(Path("parts"), "train") == logged(Path("whole"), "train")
    best = [{name: state.get("best_model_score") for name, state in checkpoint["callbacks"].items()
             if name.startswith("ModelCheckpoint")} for checkpoint in (whole, parts)]  # fmt: skip
    assert best[0] and best[0] == best[1]


def epoch_line(printed: str, epoch: int) -> dict[str, str]:
    """The numbers of an epoch's line, as printed (not its rate of images nor its time)."""
    (line,) = [line for line in printed.splitlines() if line.startswith(f"Epoch {epoch}/") and "  done  " in line]
    return dict(re.findall(r"((?:train|val)/\S+|lr) (\S+)", line))


def start_fit(groups, project: Path, *options: str) -> subprocess.Popen:
    """A fit with the project's own configuration: its default logger, augmentation and 2 workers."""
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *ON_CPU, *TWO_EPOCHS,
               "--data.num_workers=2", *options]  # fmt: skip
    return groups(command, cwd=project, env=command_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stop_to_the_process_group_saves_within_seconds_and_resumes_exactly(
    in_project_copy, tiny_shapes, groups, stop
):
    # scancel, `timeout` and a terminal's signals (Ctrl-C) reach the whole process group: data workers too.
    # Fewer steps an epoch than the default log interval, which Lightning warns of: log every step.
    data = [f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.batch_size=8",
            "--trainer.log_every_n_steps=1"]  # fmt: skip
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
    os.killpg(process.pid, stop)
    assert process.wait(timeout=60) == 128 + stop, process.stderr.read().decode()[-3000:]
    assert time.monotonic() - signalled < 15, "a preempted run must stop well within a scheduler's grace period"
    assert last_checkpoint(in_project_copy / "runs")["global_step"] == 6

    resumed = start_fit(groups, in_project_copy, *data, "--ckpt_path=auto")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()[-3000:]
    # No warning off the allow-list: Lightning's that a mid-epoch resume cannot resume the data (the
    # data module does) and that the run's checkpoint folder holds files (its own) included.
    assert warnings_in(resumed.stderr.read().decode()) == [], "a warning not on test_warnings.py's allow-list"
    assert_same_training(last_checkpoint(in_project_copy / "whole"), last_checkpoint(in_project_copy / "runs"))


def plain_images() -> list[str]:
    """A training transform that changes no pixel, so a trained image can be matched to its file."""
    return ["--data.augment=none", "--data.hflip=false", "--data.image_size=32"]


def record(folder: Path) -> str:
    callback = {"class_path": "helper_callbacks.RecordTrainedImages", "init_args": {"folder": str(folder)}}
    return f"--trainer.callbacks+={json.dumps(callback)}"


def seen_images(record_file: Path, epoch: int = 0) -> list[str]:
    lines = [json.loads(line) for line in record_file.read_text().splitlines()]
    return [line["image"] for line in lines if line["epoch"] == epoch]


def fit_command(project: Path, *args: str, status: int = 0, env: dict | None = None):
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *args, "--trainer.accelerator=cpu",
               "--trainer.precision=32-true", *logged_to("runs")]  # fmt: skip
    result = run_group(command, 300, cwd=project, env=env or command_env())
    assert result.returncode == status, result.stderr[-4000:]
    return result


def fingerprint(source: str | bytes) -> str:
    """What helper_callbacks.RecordTrainedImages writes for an image: the SHA-1 of its decoded pixels."""
    return hashlib.sha1(read_rgb(source).numpy().tobytes()).hexdigest()


@pytest.mark.parametrize(
    ("dataset", "workers"),
    [("tiny_shapes", 2)
{%- if cookiecutter.streaming == "yes" %}, ("shards", 0), ("shards", 2)
{%- endif %}],
)
def test_a_preempted_run_resumes_at_the_next_unseen_image(in_project_copy, request, tiny_shapes, dataset, workers):
    trained = in_project_copy / "trained"
    # 9 steps an epoch, fewer than the default log interval, which Lightning warns of: log every step.
    two_processes = ["--config=configs/trainer/ddp.yaml", "--trainer.devices=2", "--trainer.max_epochs=2",
                     "--trainer.log_every_n_steps=1"]  # fmt: skip
    data = [*on_data(request.getfixturevalue(dataset), batch_size=4), f"--data.num_workers={workers}"]
    options = [*two_processes, *data, *FORMAT_OF[dataset], *plain_images(), record(trained)]
    sigterm = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 4}})
    fit_command(in_project_copy, *options, f"--trainer.callbacks+={sigterm}", status=128 + signal.SIGTERM)
    (last,) = in_project_copy.glob("runs/run/*/checkpoints/last.ckpt")
    assert 4 <= torch.load(last, map_location="cpu", weights_only=True)["global_step"] < 9  # mid-epoch: 9 per epoch

    resumed = fit_command(in_project_copy, *options, "--ckpt_path=auto")
    assert warnings_in(resumed.stdout + resumed.stderr) == [], "a warning not on test_warnings.py's allow-list"
    files = {fingerprint(str(path)): path for path in (tiny_shapes / "train").glob("*/*.png")}
    assert len(files) == 72, "two training images are alike: the fingerprints cannot tell them apart"
    for epoch in (0, 1):
        seen = [image for rank in (0, 1) for image in seen_images(trained / f"trained{rank}.jsonl", epoch)]
        assert sorted(seen) == sorted(files), f"epoch {epoch}: not every training image exactly once"


def test_a_resume_with_other_settings_starts_the_epoch_again_with_a_warning(tiny_shapes):
    data = ImageDataModule(tiny_shapes, num_workers=0, batch_size=4)

    def resumed(position: dict, loader_first: bool, reloaded: bool) -> int:
        """The images left in the epoch of a loader made before the checkpoint is read (FSDP and DeepSpeed
        read it after their setup, by when the schedule has asked for the loader) or after (the others),
        or of the loader trainer.reload_dataloaders_every_n_epochs makes as the resumed epoch starts."""
        data.setup("fit")
        loader = data.train_dataloader() if loader_first else None
        data.load_state_dict({"class_names": data.class_names, "epoch_position": position})
        loader = loader or data.train_dataloader()
        return len(list((data.train_dataloader() if reloaded else loader).sampler))

    position = {"format": "folder", "epoch": 0, "batches": 3, "processes": 2, "batch_size": 4}
    for loader_first, reloaded in itertools.product((False, True), repeat=2):
        with pytest.warns(UserWarning, match=r"processes 2 -> 1\): it starts again"):
            assert resumed(position, loader_first, reloaded) == 72
        # The images of 3 batches were trained on.
        assert resumed(position | {"processes": 1}, loader_first, reloaded) == 72 - 3 * 4
        assert resumed(position | {"processes": 1, "training_images": 72}, loader_first, reloaded) == 72 - 3 * 4
        # Images added or removed since: the epoch's order is another, its batches done are no guide.
        with pytest.warns(UserWarning, match=r"\(training_images 70 -> 72\): it starts again"):
            assert resumed(position | {"processes": 1, "training_images": 70}, loader_first, reloaded) == 72
    # The next fit of the same data module (a notebook's) starts its epoch afresh.
    data.setup("fit")
    assert len(list(data.train_dataloader().sampler)) == 72
