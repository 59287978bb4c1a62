"""Resume, preemption and interrupted writes: a run loses at most the work since its last checkpoint."""

import csv
import importlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from conftest import (
    ON_CPU,
    OTHER_BACKBONE,
    command_env,
    disk_full_past,
    kill_group,
    on_data,
    refusal,
    run_cli,
    run_command,
)
from jsonargparse import Namespace
from lightning.pytorch.loops.utilities import _parse_loop_limits
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import SIGTERMException

from {{ cookiecutter.package_name }} import cli
from {{ cookiecutter.package_name }}.errors import ConfigError
from {{ cookiecutter.package_name }}.hardware.sharding import FSDP2Strategy
from {{ cookiecutter.package_name }}.training import callbacks, checkpoint_io, resume
from {{ cookiecutter.package_name }}.training.callbacks import CheckpointOnStop
from {{ cookiecutter.package_name }}.training.run_folders import (
    CHOSEN,
    IN_USE,
    hold_run,
    last_checkpoints,
    release_run,
    run_to_resume,
    trained_elsewhere,
)

TRAINER = [
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
    "--trainer.strategy=auto",
    "--trainer.precision=32-true",
    "--trainer.logger={{ cookiecutter.package_name }}.training.csv_logging.ResumableCSVLogger",
    "--trainer.logger.save_dir=runs",
    "--trainer.logger.name=resume",
]
# The project's own logger, into the same folder, where it is not the tests' CSV logger.
{%- if cookiecutter.logger == "wandb" %}
PROJECT_LOGGER = ["--trainer.logger={{ cookiecutter.package_name }}.training.wandb_logging.BestModelWandbLogger",
                  "--trainer.logger.project=resume"]  # fmt: skip
{%- elif cookiecutter.logger == "tensorboard" %}
PROJECT_LOGGER = ["--trainer.logger=lightning.pytorch.loggers.TensorBoardLogger"]
{%- else %}
PROJECT_LOGGER = []
{%- endif %}
STEPS_PER_EPOCH = 18  # 72 training images in batches of 4
TWO_EPOCHS = ["--trainer.max_epochs=2", "--trainer.limit_val_batches=1"]


def data(folder: Path) -> list[str]:
    return [f"--data.data_dir={folder}", "--data.synthetic=false", "--data.num_workers=0", "--data.batch_size=4"]


def run_folders(project: Path) -> list[Path]:
    return sorted(path.parent.parent for path in (project / "runs" / "resume").glob("*/checkpoints/last.ckpt"))


def saved_step(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=True)["global_step"]


def start_fit(groups, project: Path, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *TRAINER, *args]
    return groups(command, cwd=project, env=command_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def start_paused_fit(groups, project: Path, data_dir: Path, step: int, *options: str) -> subprocess.Popen:
    """A two-epoch fit that holds at `step` (after its optimizer step) until it gets a SIGTERM."""
    marker = project / "paused"
    pause = json.dumps({"class_path": "helper_callbacks.PauseAt", "init_args": {"step": step, "marker": str(marker)}})
    process = start_fit(groups, project, *data(data_dir), *TWO_EPOCHS, f"--trainer.callbacks+={pause}", *options)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        assert time.monotonic() < deadline, "the run never reached the pause"
        time.sleep(0.05)
    return process


def finish_with_auto_resume(groups, project: Path, data_dir: Path, *options: str) -> None:
    resumed = start_fit(groups, project, *data(data_dir), *TWO_EPOCHS, *options, "--ckpt_path=auto")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()[-3000:]


def test_a_run_in_use_is_refused_to_a_second_writer_until_its_process_ends(
    monkeypatch, capsys, caplog, in_project_copy, tiny_shapes, groups
):
    # A `test` or a resume beside a running fit would write into its metrics.csv (rows under other
    # columns) and its W&B run. With the default logger, as a user runs them from a second terminal.
    marker = in_project_copy / "paused"
    pause = json.dumps({"class_path": "helper_callbacks.PauseAt", "init_args": {"step": 10, "marker": str(marker)}})
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *ON_CPU, *on_data(tiny_shapes),
               "--trainer.limit_val_batches=1", f"--trainer.callbacks+={pause}"]  # fmt: skip
    fit = groups(command, cwd=in_project_copy, env=command_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not marker.exists():  # past epoch 0, whose checkpoints are written
        assert fit.poll() is None and time.monotonic() < deadline, fit.stderr.read().decode()[-3000:]
        time.sleep(0.05)
    (run,) = (last.parent.parent for last in in_project_copy.glob("runs/*/*/checkpoints/last.ckpt"))
    capsys.readouterr()
    loggers_runs = sorted(in_project_copy.glob("runs/*/*"))
    # A limit its last.ckpt has reached is moot while the run trains on: in use is what to say.
    for second in (["test"], ["fit", "--ckpt_path=last"], ["fit", "--ckpt_path=last", "--trainer.max_epochs=1"]):
        message = refusal(monkeypatch, capsys, *second, *ON_CPU, *on_data(tiny_shapes))
        assert message.startswith(f"error: {run.resolve()} is in use by process {fit.pid} on "), message
        assert f"{socket.gethostname()} (fit, since " in message
        meanwhile = "a run of your own (--ckpt_path auto passes" if second[0] == "fit" else "pass --ckpt_path <copy>"
        assert meanwhile in message, message
    assert sorted(in_project_copy.glob("runs/*/*")) == loggers_runs, "no W&B run started"
    assert not (run / "config_test.yaml").exists()

    # `auto`, as a second job of the SLURM script gives it, passes over the run in use: a run of its own.
    saved = (run / "checkpoints" / "last.ckpt").read_bytes()
    run_cli(monkeypatch, "fit", *ON_CPU, *on_data(tiny_shapes), "--ckpt_path=auto", "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1")  # fmt: skip
    assert f"passing over {run.relative_to(in_project_copy)}, which process {fit.pid} on " in caplog.text
    (other,) = {last.parent.parent for last in in_project_copy.glob("runs/*/*/checkpoints/last.ckpt")} - {run}
    assert (other / "checkpoints" / "finished.json").is_file()
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == saved

    kill_group(fit)  # the lock goes with its process, however it ends
    run_cli(monkeypatch, "test", *ON_CPU, *on_data(tiny_shapes), f"--ckpt_path={run / 'checkpoints' / 'last.ckpt'}")
    assert (run / "config_test.yaml").is_file()


def test_a_run_let_go_names_no_process_and_a_file_system_without_locks_refuses_nothing(monkeypatch, tmp_path):
    hold_run(tmp_path / "run", "fit")
    assert f"process {os.getpid()} on {socket.gethostname()} (fit, since " in (tmp_path / "run" / IN_USE).read_text()
    release_run()
    assert (tmp_path / "run" / IN_USE).read_text() == "", "no process that has ended is named"

    def no_locks(fd: int) -> None:  # a Lustre client mounted without flock
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr("{{ cookiecutter.package_name }}.training.run_folders._try_lock", no_locks)
    with pytest.warns(UserWarning, match=r"run cannot be locked \(Function not implemented\): nothing keeps"):
        hold_run(tmp_path / "run", "test")
    release_run()


def test_another_users_run_is_refused_in_one_line_that_says_what_to_do_instead(monkeypatch, tmp_path):
    def not_this_users(path, flags, mode=0o777):  # root, which runs CI, may write anywhere
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "open", not_this_users)
    for command, instead in (("test", "pass --ckpt_path <copy>"), ("fit", "train a run of your own")):
        with pytest.raises(ConfigError, match=f"run cannot be written by this user: .*{re.escape(instead)}"):
            hold_run(tmp_path / "run", command)


def hold_in_another_process(run: Path, command: str) -> subprocess.Popen:
    """A process holding `run` for `command` until its stdin closes."""
    script = f"import sys, pathlib; from {cli.PACKAGE}.training.run_folders import hold_run; "
    script += f"hold_run(pathlib.Path({str(run)!r}), {command!r}); print('held', flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", script], env=command_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    return holder


def test_auto_passes_over_a_run_another_fit_trains_and_every_task_of_a_job_takes_the_first_ones_choice(
    monkeypatch, tmp_path
):
    lasts = []
    for name in ("older", "newer", "evaluated"):
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        lasts.append(tmp_path / name / "checkpoints" / "last.ckpt")
        lasts[-1].touch()
    older, newer, evaluated = lasts
    holders = [hold_in_another_process(newer.parent.parent, "fit"),
               hold_in_another_process(evaluated.parent.parent, "test")]  # fmt: skip
    try:
        assert trained_elsewhere(newer.parent.parent).startswith(f"process {holders[0].pid} on ")
        assert trained_elsewhere(evaluated.parent.parent) is None, "an evaluation ends soon: hold_run waits or says"
        # The first task of a SLURM job chooses, passing over the run another job trains, and tells the others.
        for name in ("SLURM_NTASKS", "SLURM_PROCID", "SLURM_JOB_ID"):
            monkeypatch.setenv(name, {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_ID": "5"}[name])
        assert run_to_resume(tmp_path, [older, newer]) == older
        assert os.environ[CHOSEN] == str(older), "for the processes Lightning's launcher starts"
        (told,) = (tmp_path / ".resumes").iterdir()
        monkeypatch.delenv(CHOSEN)
        monkeypatch.setattr(rank_zero_only, "rank", 1)  # the second task, which takes the first's choice
        monkeypatch.setenv("SLURM_PROCID", "1")
        assert run_to_resume(tmp_path, [older, newer]) == older
        monkeypatch.setenv(CHOSEN, "")  # a process Lightning's launcher started from a first that starts anew
        monkeypatch.delenv("SLURM_NTASKS")
        assert run_to_resume(tmp_path, [older, newer]) is None
        # torchrun's processes start on their own, with no way to hear the first's choice: none passes over.
        monkeypatch.delenv(CHOSEN)
        monkeypatch.setattr(rank_zero_only, "rank", 0)
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
        assert run_to_resume(tmp_path, [older, newer]) == newer
    finally:
        for holder in holders:
            holder.stdin.close()
            holder.wait(timeout=60)
    assert trained_elsewhere(newer.parent.parent) is None, "let go when its process ended"
    release_run()
    assert not told.parent.exists(), "a choice told once, to this start of the job only"


def test_a_job_task_that_waits_for_a_choice_the_first_refused_after_making_ends_at_once(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    # Without srun's kill-on-bad-exit, the first task's refusal (the run's options changed) was deleted with its
    # choice, and the second waited 300 s, then blamed the file system.
    run = interrupted_run(monkeypatch, in_project_copy, tiny_shapes)
    capsys.readouterr()  # its output
    for name, value in {"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_JOB_ID": "6"}.items():
        monkeypatch.setenv(name, value)
    refused = refusal(monkeypatch, capsys, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=2",
                      "--trainer.limit_val_batches=1", "--ckpt_path=auto")  # fmt: skip
    assert "with other options than config.yaml has: trainer.max_epochs 1 -> 2" in refused, refused
    monkeypatch.setattr(rank_zero_only, "rank", 1)  # the job's second task, as it starts
    monkeypatch.setenv("SLURM_PROCID", "1")
    started = time.monotonic()
    with pytest.raises(ConfigError) as stopped:
        run_to_resume(run.parent, [run / "checkpoints" / "last.ckpt"])
    assert str(stopped.value) == f"The job's first task stopped: {refused.removeprefix('error: ')}"
    assert time.monotonic() - started < 5


def test_auto_passes_over_a_run_another_fit_trains_in_a_process_of_its_own(tmp_path):
    older, newer = (tmp_path / name / "checkpoints" / "last.ckpt" for name in ("older", "newer"))
    for last in (older, newer):
        last.parent.mkdir(parents=True)
        last.touch()
    holder = hold_in_another_process(newer.parent.parent, "fit")
    try:
        assert run_to_resume(tmp_path, [older, newer]) == older
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
        release_run()


def test_the_tests_are_processes_of_their_own_when_started_inside_a_launchers_job(tmp_path):
    # A shell in a torchrun job (or a SLURM allocation) sets what places a process among a job's: a
    # test inheriting it would take the path of a job's processes (here: never pass over a run).
    launched = command_env(TORCHELASTIC_RUN_ID="job", WORLD_SIZE="2", NODE_RANK="0")
    test = f"{__file__}::test_auto_passes_over_a_run_another_fit_trains_in_a_process_of_its_own"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", test,
               f"--basetemp={tmp_path / 'inner'}"]  # fmt: skip
    done = subprocess.run(command, env=launched, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_resume_line_follows_a_saved_sigterm_only_and_names_the_command_run(monkeypatch, capsys, in_project_copy):
    def stopped_by_sigterm(saved: bool):
        def run(defaults: list[str], args: list[str] | None) -> None:
            stop = SIGTERMException()
            if saved:
                stop.saved = Path("runs/x/checkpoints/last.ckpt")
            raise stop

        return run

    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "-f", "kernel.json"])  # a notebook's main(args)
    monkeypatch.setattr(cli, "run_cli", stopped_by_sigterm(saved=True))
    with pytest.raises(SystemExit) as ended:
        cli.main(["fit", "--trainer.max_epochs=3"])
    assert ended.value.code == 128 + signal.SIGTERM
    resume_line = f"Resume this run with: python -m {cli.PACKAGE} fit --trainer.max_epochs=3 --ckpt_path auto"
    assert capsys.readouterr().err.strip().splitlines()[-1] == resume_line
    # Nothing saved (a test stopped, checkpoints off): no command that would resume another run.
    monkeypatch.setattr(cli, "run_cli", stopped_by_sigterm(saved=False))
    with pytest.raises(SystemExit):
        cli.main(["test"])
    assert "Resume this run" not in capsys.readouterr().err


def test_last_trains_a_finished_run_further_in_its_own_folder(monkeypatch, caplog, in_project_copy, tiny_shapes):
    one_epoch = ["--trainer.limit_val_batches=1", "--trainer.max_epochs=1"]
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *one_epoch)
    (run,) = run_folders(in_project_copy)
    first = saved_step(run / "checkpoints" / "last.ckpt")
    trained_config = (run / "config.yaml").read_text()
    assert (run / "checkpoints" / "finished.json").is_file()
    recorded = in_project_copy / "recorded"
    callback = {"class_path": "helper_callbacks.RecordProcess", "init_args": {"folder": str(recorded)}}
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.limit_val_batches=1",
            "--trainer.max_epochs=2", "--ckpt_path=last", f"--trainer.callbacks+={json.dumps(callback)}")  # fmt: skip
    assert run_folders(in_project_copy) == [run], "the resumed run must carry on in its own folder"
    assert saved_step(run / "checkpoints" / "last.ckpt") == 2 * first
    # Its learning-rate schedule is stretched to the new limit, and the resume says so.
    assert f"at this step of its schedule, which ends at step {2 * first})" in caplog.text
    assert "--ckpt_path last: trainer.max_epochs raised to 2 (the run was started with 1)" in caplog.text
    # Its first step trains at the stretched cosine's rate there: it trained at the end's 0 of the first.
    peak, total = 2e-3 * 4 / 64, 2 * first  # the default lr scaled to the batch of 4; the steps of 2 epochs
    warmup = round(0.05 * total)  # warmup_fraction's default
    expected = peak * 0.5 * (1 + math.cos(math.pi * (first - warmup) / (total - warmup)))
    first_lrs = json.loads((recorded / "rank0.json").read_text())["first_lrs"]
    assert first_lrs["head"] == pytest.approx(expected, rel=1e-6), first_lrs
    assert (run / "config.yaml").read_text() == trained_config, "the run's config stays as it was trained"
    (resumed_config,) = run.glob("config_resumed_*.yaml")
    assert "max_epochs: 2" in resumed_config.read_text()


def test_last_on_a_finished_run_says_how_to_train_longer_and_touches_nothing(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    one_epoch = ["--trainer.limit_val_batches=1", "--trainer.limit_train_batches=2", "--trainer.max_epochs=1"]
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *one_epoch)
    (run,) = run_folders(in_project_copy)
    written = sorted(in_project_copy.glob("runs/**/*"))
    capsys.readouterr()
    message = refusal(monkeypatch, capsys, "fit", *TRAINER, *data(tiny_shapes), *one_epoch, "--ckpt_path=last")
    assert "already reached max_epochs=1" in message and "--trainer.max_epochs=<more>" in message, message
    # Given by path, it would start a new run that restores the epoch and trains nothing.
    given = f"--ckpt_path={run.relative_to(in_project_copy)}/checkpoints/last.ckpt"
    message = refusal(monkeypatch, capsys, "fit", *TRAINER, *data(tiny_shapes), *one_epoch, given)
    assert message.endswith("has already trained to max_epochs=1: Lightning would restore its epoch and train nothing. "
                            f"To train it longer, raise the limit: fit {given.replace('=', ' ', 1)} "
                            "--trainer.max_epochs=<more>."), message  # fmt: skip
    assert sorted(in_project_copy.glob("runs/**/*")) == written, "no config_resumed_*.yaml, no logger's files"


def test_auto_on_a_run_that_reached_its_limit_says_so_and_ends_touching_nothing(
    monkeypatch, caplog, in_project_copy, tiny_shapes
):
    # A requeued job whose run ended before it could mark itself finished; then the limit lowered since.
    two_epochs = ["--trainer.limit_val_batches=1", "--trainer.limit_train_batches=2", "--trainer.max_epochs=2"]
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *two_epochs)
    (run,) = run_folders(in_project_copy)
    (run / "checkpoints" / "finished.json").unlink()
    written = {path: path.stat().st_mtime_ns for path in in_project_copy.glob("runs/**/*")}
    for max_epochs in (2, 1):
        caplog.clear()
        run_command(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *two_epochs[:2],
                    f"--trainer.max_epochs={max_epochs}", "--ckpt_path=auto")  # fmt: skip
        assert f"already reached max_epochs={max_epochs}, so there is nothing left to train" in caplog.text
        assert "resuming from" not in caplog.text
        assert {path: path.stat().st_mtime_ns for path in in_project_copy.glob("runs/**/*")} == written


def test_a_requeued_job_whose_run_finished_trains_no_new_run(monkeypatch, caplog, in_project_copy, tiny_shapes):
    # A SIGTERM as the run closed (W&B's last upload) ends the job with 143, which slurm.sbatch requeues.
    one_epoch = [*TRAINER, *data(tiny_shapes), "--trainer.limit_val_batches=1", "--trainer.limit_train_batches=2",
                 "--trainer.max_epochs=1"]  # fmt: skip
    monkeypatch.setenv("SLURM_JOB_ID", "4711")
    run_cli(monkeypatch, "fit", *one_epoch)
    (run,) = run_folders(in_project_copy)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    run_command(monkeypatch, "fit", *one_epoch, "--ckpt_path=auto")
    assert f"Requeued job 4711: runs/resume/{run.name} finished before the requeue: nothing left" in caplog.text
    assert run_folders(in_project_copy) == [run]
    # Another job's requeue, whose own run never started, starts it.
    monkeypatch.setenv("SLURM_JOB_ID", "4712")
    run_cli(monkeypatch, "fit", *one_epoch, "--ckpt_path=auto")
    assert len(run_folders(in_project_copy)) == 2


def test_an_early_stop_is_said_by_its_run_and_not_by_the_run_that_trains_it_further(
    monkeypatch, caplog, in_project_copy, tiny_shapes
):
    def stopping(threshold: float | None) -> str:
        options = {"monitor": "val/loss", "mode": "min", "stopping_threshold": threshold}
        return "--trainer.callbacks+=" + json.dumps({"class_path": "EarlyStopping", "init_args": options})

    three_epochs = ["--trainer.limit_val_batches=1", "--trainer.limit_train_batches=2", "--trainer.max_epochs=3"]
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *three_epochs, stopping(1e6))
    assert "Stopped early after epoch 0: Stopping threshold reached: val/loss = " in caplog.text
    (run,) = run_folders(in_project_copy)
    assert saved_step(run / "checkpoints" / "last.ckpt") == 2
    caplog.clear()
    # The same callback (its state comes back from the checkpoint) without the threshold: all 3 epochs.
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *three_epochs, stopping(None), "--ckpt_path=last")
    assert saved_step(run / "checkpoints" / "last.ckpt") == 6
    assert "Stopped early" not in caplog.text


SIGTERM_AT_STEP_2 = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 2}})


def interrupted_run(monkeypatch, project: Path, tiny_shapes: Path) -> Path:
    """A one-epoch run stopped by SIGTERM at step 3, as a preempted job is."""
    run_command(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1",
                "--trainer.limit_val_batches=1", f"--trainer.callbacks+={SIGTERM_AT_STEP_2}", status=143)  # fmt: skip
    (run,) = run_folders(project)
    assert saved_step(run / "checkpoints" / "last.ckpt") == 3
    return run


def test_lightnings_slurm_requeue_signal_stops_a_run_as_sigterm_does(monkeypatch, in_project_copy, tiny_shapes):
    # A job with Lightning's --signal=USR1@90 trained on past its signal (its handler saved a checkpoint
    # from inside itself, which under DDP waited on the other processes for ever).
    for name, value in {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "77", "SLURM_PROCID": "0",
                        "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    usr1 = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 2, "signal_name": "SIGUSR1"}})
    run_command(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1",
                "--trainer.limit_val_batches=1", f"--trainer.callbacks+={usr1}", status=143)  # fmt: skip
    (run,) = run_folders(in_project_copy)
    assert saved_step(run / "checkpoints" / "last.ckpt") == 3


def test_a_requeued_job_goes_on_with_its_own_run_whatever_its_first_start_was_given(
    monkeypatch, caplog, in_project_copy, tiny_shapes
):
    # slurm.sbatch gave a requeued job --ckpt_path auto, the newest unfinished run: jobs requeued
    # together swapped runs, or stopped at the other's options.
    def job(number: str, lr: str, *args: str, restarts: str = "0") -> None:
        monkeypatch.setenv("SLURM_JOB_ID", number)
        monkeypatch.setenv("SLURM_RESTART_COUNT", restarts)
        fit = ["fit", *ON_CPU, *on_data(tiny_shapes, 4), "--trainer.max_epochs=1", "--trainer.limit_val_batches=1",
               f"--model.lr={lr}", *args]  # fmt: skip
        if restarts == "0":
            run_command(monkeypatch, *fit, f"--trainer.callbacks+={SIGTERM_AT_STEP_2}", status=143)
        else:
            run_cli(monkeypatch, *fit)

    job("100", "0.001")
    job("300", "0.003")
    first, second = sorted(in_project_copy.glob("runs/**/checkpoints/last.ckpt"), key=os.path.getmtime)
    job("100", "0.001", restarts="1")  # as slurm.sbatch starts it again: the same arguments
    assert saved_step(first) == STEPS_PER_EPOCH and saved_step(second) == 3
    job("300", "0.003", "--ckpt_path=last", restarts="1")  # its first start's, now naming job 100's run
    assert saved_step(second) == STEPS_PER_EPOCH
    assert "Requeued job 300: going on with its own run, not its first start's --ckpt_path last" in caplog.text
    assert len(list(in_project_copy.glob("runs/**/checkpoints/last.ckpt"))) == 2


def test_a_resume_that_failed_before_it_saved_leaves_the_options_to_compare_as_they_were(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    # Its config_resumed_*.yaml named options that trained nothing: the next resume with them went unrefused.
    run = interrupted_run(monkeypatch, in_project_copy, tiny_shapes)
    crash = json.dumps({"class_path": "helper_callbacks.CrashAt", "init_args": {"step": 4}})
    other = [*TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1", "--trainer.limit_val_batches=1",
             "--model.lr=0.01", "--ckpt_path=auto"]  # fmt: skip
    with pytest.raises(SystemError, match="crashed at step 4"):
        run_cli(monkeypatch, "fit", *other, "--allow_resume_changes=true", f"--trainer.callbacks+={crash}")
    assert saved_step(run / "checkpoints" / "last.ckpt") == 3 and len(list(run.glob("config_resumed_*"))) == 1
    capsys.readouterr()
    message = refusal(monkeypatch, capsys, "fit", *other)
    assert "other options than config.yaml has: model.lr 0.002 -> 0.01" in message, message


def test_auto_continues_the_newest_unfinished_run_not_a_newer_finished_one(
    monkeypatch, caplog, in_project_copy, tiny_shapes
):
    interrupted = interrupted_run(monkeypatch, in_project_copy, tiny_shapes)
    short = ["--trainer.limit_val_batches=1", "--trainer.limit_train_batches=2", "--trainer.max_epochs=1"]
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *short)  # a later run, which finishes
    finished = [run for run in run_folders(in_project_copy) if run != interrupted]
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1",
            "--trainer.limit_val_batches=1", "--ckpt_path=auto")  # fmt: skip
    assert f"resuming from {(interrupted / 'checkpoints' / 'last.ckpt').relative_to(in_project_copy)}" in caplog.text
    assert saved_step(interrupted / "checkpoints" / "last.ckpt") == STEPS_PER_EPOCH
    assert saved_step(finished[0] / "checkpoints" / "last.ckpt") == 2, "the finished run is left alone"
    caplog.clear()
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *short, "--ckpt_path=auto")
    assert "no unfinished run with a checkpoints/last.ckpt" in caplog.text and "--ckpt_path last" in caplog.text
    assert len(run_folders(in_project_copy)) == 3, "every run had finished: a new one"


def test_auto_refuses_to_continue_a_run_with_other_data_model_or_schedule_options(
    monkeypatch, capsys, caplog, in_project_copy, tiny_shapes
):
    run = interrupted_run(monkeypatch, in_project_copy, tiny_shapes)
    capsys.readouterr()  # what the interrupted run printed
    other = [*TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1", "--trainer.limit_val_batches=1",
             "--data.batch_size=2", "--model.lr=0.01", "--data.num_workers=0", "--ckpt_path=auto"]  # fmt: skip
    caplog.clear()
    # The data folder spelled otherwise (relative, not absolute) is the same folder: no change.
    message = refusal(monkeypatch, capsys, "fit", *other, "--trainer.accumulate_grad_batches=2",
                      f"--data.data_dir={os.path.relpath(tiny_shapes)}/.")  # fmt: skip
    assert "resuming from" not in caplog.text, "said of a resume it then refused"
    assert "data_dir" not in message, message
    assert "data.batch_size 4 -> 2" in message and "model.lr 0.002 -> 0.01" in message, message
    assert "trainer.accumulate_grad_batches 1 -> 2" in message, message
    assert "num_workers" not in message and "--allow_resume_changes=true" in message
    # The trainer's defaults are another schedule than the run's options (max_epochs 1): refused too.
    message = refusal(monkeypatch, capsys, "fit", *TRAINER, *data(tiny_shapes), "--ckpt_path=auto")
    assert "trainer.max_epochs 1 -> " in message and "trainer.limit_val_batches" not in message, message
    # `last` raises a limit; lowered, the schedule would end sooner and its learning rate drop at once.
    message = refusal(monkeypatch, capsys, "fit", *other[:-1], "--ckpt_path=last", "--trainer.max_steps=10",
                      "--allow_resume_changes=false")  # fmt: skip
    assert "trainer.max_steps -1 -> 10 (last may raise it, not lower it)" in message, message
    run_cli(monkeypatch, "fit", *other, "--allow_resume_changes=true")
    assert run_folders(in_project_copy) == [run] and (run / "checkpoints" / "finished.json").is_file()
    # The learning rate goes on from the checkpoint's, which the smaller batch would have scaled for a new run.
    # 0.002 x 4 / 64 as trained; 0.01 x 2 / 64 for a new run.
    said = r"Learning rate 0.000125 at its peak \([\d.e-]+ at this step of its schedule, which ends at step \d+\), the"
    assert re.search(said + " checkpoint's, restored with its optimizer; these settings would give a new run 0.000313",
                     caplog.text)  # fmt: skip
    assert "Learning rate 0.000313 = " not in caplog.text


def test_a_run_saved_before_the_model_code_gained_or_lost_an_option(monkeypatch, capsys, caplog, in_project_copy,
                                                                    tiny_shapes):  # fmt: skip
    # An option added to ImageClassifier since, at its default, blocked the resume as a change, with a fix
    # (give it as null) that failed; one removed since was blamed on the command line, and a line added.
    run = interrupted_run(monkeypatch, in_project_copy, tiny_shapes)
    capsys.readouterr()
    config, last = run / "config.yaml", run / "checkpoints" / "last.ckpt"
    trained = yaml.safe_load(config.read_text())
    del trained["model"]["label_smoothing"]  # as if the run's code had no such option
    config.write_text(yaml.safe_dump({**trained, "model": {**trained["model"], "head_dropout": 0.2}}))
    resume = [*TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1", "--trainer.limit_val_batches=1",
              "--ckpt_path=auto"]  # fmt: skip
    message = refusal(monkeypatch, capsys, "fit", *resume)
    assert "other options than config.yaml has: model.head_dropout 0.2 (an option this code no longer has). " in message
    config.write_text(yaml.safe_dump(trained))
    message = refusal(monkeypatch, capsys, "fit", *resume, "--model.label_smoothing=0.1")
    assert "has: model.label_smoothing 0.1 (an option the run's code did not have). Resume with" in message, message
    run_cli(monkeypatch, "fit", *resume)
    said = f"Options new since {run.relative_to(in_project_copy)} was saved, at their defaults: model.label_smoothing"
    assert f"{said} 0.0" in caplog.text and (run / "checkpoints" / "finished.json").is_file()
    assert caplog.text.index("--ckpt_path auto: resuming from") < caplog.text.index(said)
    capsys.readouterr()
    saved = torch.load(last, map_location="cpu", weights_only=True)
    saved["hyper_parameters"]["head_dropout"] = 0.2
    torch.save(saved, last)
    message = refusal(monkeypatch, capsys, "validate", *TRAINER, *data(tiny_shapes), f"--ckpt_path={last}")
    assert message == (
        f"error: {last} was saved with model.head_dropout, which ImageClassifier no longer takes: its code changed "
        "since. Put the option back in model.py to use this checkpoint, or train a new run."
    )


def test_the_limit_check_does_not_read_a_sharded_checkpoint_folder(in_project_copy):
    # FSDP and DeepSpeed save last.ckpt as a folder of shards: the resume must not torch.load it.
    shards = in_project_copy / "runs" / "resume" / "version_0" / "checkpoints" / "last.ckpt"
    shards.mkdir(parents=True)
    (shards / ".metadata").write_bytes(b"")
    assert resume.limit_reached(shards, Namespace(max_epochs=1, max_steps=-1)) is None


def test_an_evaluation_logs_into_the_run_of_its_checkpoint_at_its_step(monkeypatch, in_project_copy, tiny_shapes):
    short = ["--trainer.limit_val_batches=1", "--trainer.limit_test_batches=2"]
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *short, "--trainer.max_epochs=2",
            "--trainer.limit_train_batches=3")  # fmt: skip
    (run,) = run_folders(in_project_copy)
    trained_config = (run / "config.yaml").read_text()
    best = next((run / "checkpoints").glob("epoch*.ckpt"))
    saved = torch.load(best, map_location="cpu", weights_only=True)
    run_cli(monkeypatch, "test", *TRAINER, *data(tiny_shapes), *short, f"--ckpt_path={best}")
    run_cli(monkeypatch, "validate", *TRAINER, *data(tiny_shapes), *short, "--ckpt_path=last")
    # No --ckpt_path: the best checkpoint again, not the untrained weights.
    run_cli(monkeypatch, "test", *TRAINER, *data(tiny_shapes), *short)

    assert run_folders(in_project_copy) == [run] and len(list(run.parent.iterdir())) == 1, "no new run folder"
    assert (run / "config.yaml").read_text() == trained_config, "the training config stays as it was"
    assert (run / "config_test.yaml").is_file() and (run / "config_validate.yaml").is_file()
    assert (run / "reports" / "confusion_matrix_test.png").is_file()
    with (run / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    # The test numbers sit at the evaluated checkpoint's epoch, and at the step where the fit logged
    # its validation of the same weights (the index of the last step before it).
    tested, again = [row for row in rows if row.get("test/acc")]
    assert (int(tested["step"]), int(float(tested["epoch"]))) == (saved["global_step"] - 1, saved["epoch"])
    assert again == tested
    *fit_validations, validated = [row for row in rows if row.get("val/acc")]
    same_weights = fit_validations[-1]  # the fit's validation of last.ckpt's weights, after 6 steps
    assert (validated["step"], validated["epoch"]) == (same_weights["step"], same_weights["epoch"]) == ("5", "1")
    assert validated["val/acc"] == same_weights["val/acc"]


def test_a_sigterm_in_an_evaluation_leaves_the_runs_last_checkpoint_as_it_was(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    # The stop's save wrote the evaluated model (the best epoch's) as the run's last.ckpt, at its step:
    # the run would have resumed from there, its later epochs lost.
    short = ["--trainer.limit_val_batches=2", "--trainer.limit_train_batches=3"]
    run_cli(monkeypatch, "fit", *ON_CPU, *on_data(tiny_shapes), *short, "--trainer.max_epochs=2")
    (last,) = in_project_copy.glob("runs/**/checkpoints/last.ckpt")
    before = last.read_bytes()
    stop = json.dumps({"class_path": "helper_callbacks.SigtermInValidation", "init_args": {"epoch": 0}})
    capsys.readouterr()
    run_command(monkeypatch, "validate", *ON_CPU, *on_data(tiny_shapes), *short, f"--trainer.callbacks+={stop}",
                status=128 + signal.SIGTERM)  # fmt: skip
    assert last.read_bytes() == before
    assert "Resume this run" not in capsys.readouterr().err


@pytest.mark.parametrize(("max_epochs", "max_steps"), [(None, -1), (None, 50), (3, -1), (3, 50), (-1, 50)])
def test_the_limits_a_run_stops_at_are_lightnings(max_epochs, max_steps):
    # What `last` compares, to refuse a lowered limit and name a raised one: Lightning's own reading.
    trainer = SimpleNamespace(callbacks=[])  # without a Timer, whose max_time would be a limit too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # `max_epochs` was not set. Setting it to 1000 epochs
        epochs = _parse_loop_limits(None, max_steps, None, max_epochs, trainer)[1]
    limits = resume.stop_limits({"max_epochs": max_epochs, "max_steps": max_steps})
    assert limits == {
        "max_epochs": math.inf if epochs == -1 else epochs,
        "max_steps": math.inf if max_steps == -1 else max_steps,
    }


def test_an_evaluation_is_on_the_data_and_split_its_checkpoint_was_trained_on(
    monkeypatch, caplog, in_project_copy, tiny_shapes, tmp_path
):
    # One folder of class folders, split by split_seed: the configs' data is another dataset, and
    # another seed's validation images would include training ones.
    flat = tmp_path / "flat"
    for folder in (tiny_shapes / "train").iterdir():
        shutil.copytree(folder, flat / folder.name)
    run_cli(monkeypatch, "fit", *TRAINER, *data(flat), "--data.split_seed=7", "--data.val_fraction=0.25",
            "--trainer.max_epochs=1", "--trainer.limit_train_batches=2")  # fmt: skip
    run_cli(monkeypatch, "validate", *TRAINER, "--data.num_workers=0", "--ckpt_path=last")
    trained_on = f"--data.data_dir {flat} --data.synthetic false --data.val_fraction 0.25 --data.split_seed 7"
    assert f"On the data the checkpoint was trained on: {trained_on} (options given here" in caplog.text
    (run,) = run_folders(in_project_copy)
    with (run / "metrics.csv").open(newline="") as file:
        fitted, validated = [row for row in csv.DictReader(file) if row.get("val/acc")]
    assert [validated[key] for key in ("step", "val/acc")] == [fitted[key] for key in ("step", "val/acc")]
    # The same mean loss, summed over batches of another size (the configs' 64, the fit's 4).
    assert float(validated["val/loss"]) == pytest.approx(float(fitted["val/loss"]), rel=1e-6)

    # An option given on the command line is this evaluation's: the others are still the checkpoint's.
    caplog.clear()
    run_cli(monkeypatch, "validate", *TRAINER, "--data.num_workers=0", "--ckpt_path=last", "--data.split_seed=7")
    assert f"trained on: --data.data_dir {flat} --data.synthetic false --data.val_fraction 0.25 (options" in caplog.text

    # Given and different, an option evaluates on other data: its numbers go to a new run, as they
    # would otherwise sit in the run's curves at its step as if on its own validation images.
    logged = (run / "metrics.csv").read_text()
    run_cli(monkeypatch, "validate", *TRAINER, "--data.num_workers=0", "--ckpt_path=last", "--data.split_seed=8")
    said = f"On other data than the checkpoint's (--data.split_seed): logged as a new run, not into {run.name}"
    assert said in caplog.text
    assert (run / "metrics.csv").read_text() == logged
    (new,) = [path for path in run.parent.iterdir() if path != run]
    with (new / "metrics.csv").open(newline="") as file:
        assert [row["step"] for row in csv.DictReader(file) if row.get("val/acc")] == [fitted["step"]]
    # So does a validate of other batches than the run validated: its val/acc would differ at the same step.
    one_batch = "--trainer.limit_val_batches=1"
    run_cli(monkeypatch, "validate", *TRAINER, "--data.num_workers=0", "--ckpt_path=last", one_batch)
    assert f"(trainer.limit_val_batches null -> 1): logged as a new run, not into {run.name}" in caplog.text
    assert (run / "metrics.csv").read_text() == logged and len(list(run.parent.iterdir())) == 3


def test_an_evaluation_without_a_run_says_to_train_first(monkeypatch, capsys, in_project_copy, tiny_shapes):
    for command in ("validate", "test", "predict"):
        message = refusal(monkeypatch, capsys, command, *TRAINER, *data(tiny_shapes))
        assert message.startswith("error: No checkpoint under ") and "train a model first" in message, message
    # `auto`, which would start a fit anew, would evaluate the untrained weights.
    message = refusal(monkeypatch, capsys, "test", *TRAINER, *data(tiny_shapes), "--ckpt_path=auto")
    assert message == "error: --ckpt_path auto: there is no */checkpoints/last.ckpt under runs/resume. Train one."


def test_an_evaluation_takes_the_model_of_its_checkpoint_not_a_backbone_changed_since(
    monkeypatch, capsys, trained, tiny_shapes
):
    # As with --ckpt_path given: the run's backbone is built and evaluated, where its weights would not fit.
    (trained / "next.yaml").write_text(f"model:\n  backbone: {OTHER_BACKBONE}\n")  # the next experiment's
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "validate", *ON_CPU, *on_data(tiny_shapes),
               "--config=next.yaml"]  # fmt: skip
    done = subprocess.run(command, cwd=trained, env=command_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--ckpt_path best (the default): evaluating runs/" in done.stderr
    # A new run from the checkpoint: the configs' backbone set aside, said.
    last = next(Path().glob("runs/*/*/checkpoints/last.ckpt"))
    command[3:4] = ["fit"]
    command += [f"--ckpt_path={last}", "--trainer.max_epochs=2", "--trainer.limit_train_batches=1",
                "--trainer.limit_val_batches=1"]  # fmt: skip
    done = subprocess.run(command, cwd=trained, env=command_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = f"--ckpt_path {last}: the model is built as it was trained: model.backbone "
    assert f"{said}'{{ cookiecutter.backbone }}' (the configs say '{OTHER_BACKBONE}')" in done.stderr, done.stderr[-3000:]
    # Given on the command line for this command, a model option would be dropped: it is refused instead.
    capsys.readouterr()
    (trained / "lr.yaml").write_text("lr: 0.5\n")
    commands = (["validate", '--model={"lr": 0.5}'], ["validate", "--model", "lr.yaml"],
                ["fit", f"--ckpt_path={last}", "--model.lr=0.5"])  # fmt: skip
    for command in commands:
        message = refusal(monkeypatch, capsys, *command, *ON_CPU, *on_data(tiny_shapes))
        assert message.startswith("error: --model.lr 0.5: the model of the checkpoint runs/"), message
        fix = "start a new run without --ckpt_path" if command[0] == "fit" else "evaluate another checkpoint"
        assert message.endswith(f"is built as it was trained, with its own options. Leave them out, or {fix}.")


def test_an_evaluation_of_a_run_that_is_not_there_is_refused_not_taken_for_the_newest(
    monkeypatch, capsys, trained, tiny_shapes
):
    (run,) = (last.parent.parent for last in trained.glob("runs/*/*/checkpoints/last.ckpt"))
    mistyped = run.name[:-1] + ("x" if run.name[-1] != "x" else "y")
    capsys.readouterr()
    version = f"--trainer.logger.version={mistyped}"
    message = refusal(monkeypatch, capsys, "validate", *ON_CPU, *on_data(tiny_shapes), version)
    where = run.parent.relative_to(trained)
    assert message.endswith(f"{mistyped}: no run of that name under {where}. Did you mean {run.name}?"), message


def test_a_test_on_data_without_a_test_split_is_refused_before_it_touches_the_run(
    monkeypatch, capsys, trained, tiny_shapes
):
    data = trained / "no_test"
    for split in ("train", "val"):
        shutil.copytree(tiny_shapes / split, data / split)
    capsys.readouterr()
    before = sorted(trained.glob("runs/**/*"))
    message = refusal(monkeypatch, capsys, "test", *ON_CPU, *on_data(data))
    assert message == f"error: No test split: add test/ with one folder per class at {data / 'test'}."
    # Class folders at the top, which train and val are drawn from: test/ beside them alone would not do.
    flat = trained / "flat"
    shutil.copytree(tiny_shapes / "train", flat)
    message = refusal(monkeypatch, capsys, "test", *ON_CPU, *on_data(flat))
    assert message.endswith(f"at {flat / 'test'}, and move the class folders there now into {flat / 'train'}.")
    # Neither the run's folder (config_test.yaml) nor the logger's (a new W&B run) was written.
    assert sorted(trained.glob("runs/**/*")) == before


def test_an_evaluation_without_a_logger_asks_for_its_checkpoint(monkeypatch, capsys, in_project_copy, tiny_shapes):
    message = refusal(monkeypatch, capsys, "test", *TRAINER, *data(tiny_shapes), "--trainer.logger=false")
    assert message == "error: test with no logger has no runs to look in: pass --ckpt_path <file>."


def csv_logger(save_dir: Path, version: int | str | None) -> Namespace:
    options = Namespace(save_dir=str(save_dir), name="project", version=version)
    return Namespace(class_path="lightning.pytorch.loggers.CSVLogger", init_args=options)


def test_the_run_a_loggers_version_names_is_the_one_evaluated(tmp_path):
    runs = tmp_path / "project"
    for run in ("version_0", "a1b2c3"):  # CSV's and TensorBoard's, W&B's
        (runs / run).mkdir(parents=True)
    assert resume.chosen_runs(csv_logger(tmp_path, 0)) == runs / "version_0"
    assert resume.chosen_runs(csv_logger(tmp_path, "a1b2c3")) == runs / "a1b2c3"
    assert resume.chosen_runs(csv_logger(tmp_path, None)) == resume.chosen_runs(csv_logger(tmp_path, "gone")) == runs


@pytest.mark.parametrize(
    ("class_path", "init_args"),
    [
        ("lightning.pytorch.loggers.CSVLogger", {}),
        ("lightning.pytorch.loggers.CSVLogger", {"name": None}),
        ("lightning.pytorch.loggers.CSVLogger", {"name": ""}),
        ("lightning.pytorch.loggers.TensorBoardLogger", {"name": None}),
        ("lightning.pytorch.loggers.TensorBoardLogger", {"name": "mine"}),
        ("lightning.pytorch.loggers.WandbLogger", {"project": None}),
        ("lightning.pytorch.loggers.WandbLogger", {"project": "mine"}),
    ],
)
def test_the_runs_are_looked_for_where_the_logger_puts_them(monkeypatch, tmp_path, class_path, init_args):
    monkeypatch.setenv("WANDB_PROJECT", "from-environment")  # W&B's project where none is given
    module, _, name = class_path.rpartition(".")
    logger = getattr(importlib.import_module(module), name)(save_dir=str(tmp_path), **init_args)
    # Where ModelCheckpoint puts a run's checkpoints: <save_dir>/<name>/<version>/checkpoints.
    where = Path(logger.save_dir) / str(logger.name)
    configured = Namespace(class_path=class_path, init_args=Namespace(save_dir=str(tmp_path), **init_args))
    assert resume.run_root(configured) == where


def test_a_run_whose_logger_has_no_name_is_resumed_in_its_own_folder(monkeypatch, in_project_copy, tiny_shapes):
    # A null name (as W&B's run name is carried over when the command line switches to CSV) puts the
    # runs in save_dir itself: `auto` looked in save_dir/lightning_logs and started a new run.
    logger = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=runs/flat",
              "--trainer.logger.name=null"]  # fmt: skip
    fit = ["fit", *ON_CPU, *data(tiny_shapes), "--trainer.max_epochs=1", "--trainer.limit_val_batches=1", *logger]
    run_command(monkeypatch, *fit, f"--trainer.callbacks+={SIGTERM_AT_STEP_2}", status=143)
    (last,) = in_project_copy.glob("runs/flat/*/checkpoints/last.ckpt")
    assert saved_step(last) == 3
    run_cli(monkeypatch, *fit, "--ckpt_path=auto")
    assert list(in_project_copy.glob("runs/flat/*/checkpoints/last.ckpt")) == [last]
    assert saved_step(last) == STEPS_PER_EPOCH


def test_auto_without_a_run_starts_a_new_one(monkeypatch, in_project_copy, tiny_shapes):
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.fast_dev_run=true", "--ckpt_path=auto")


def test_last_without_a_run_says_how_to_start_one(monkeypatch, capsys, in_project_copy, tiny_shapes):
    message = refusal(monkeypatch, capsys, "fit", *TRAINER, *data(tiny_shapes), "--ckpt_path=last")
    assert "--ckpt_path auto to start one when there is none" in message


def test_sigkill_mid_epoch_loses_only_the_work_since_the_last_checkpoint(in_project_copy, tiny_shapes, groups):
    process = start_paused_fit(groups, in_project_copy, tiny_shapes, step=STEPS_PER_EPOCH + 5)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    (run,) = run_folders(in_project_copy)
    assert saved_step(run / "checkpoints" / "last.ckpt") == STEPS_PER_EPOCH  # the end of epoch one

    finish_with_auto_resume(groups, in_project_copy, tiny_shapes)
    assert saved_step(run / "checkpoints" / "last.ckpt") == 2 * STEPS_PER_EPOCH
    # The steps logged after that checkpoint (step 19's, at log_every_n_steps 10) were lost with the
    # process and trained again: logged once, as by a run never killed.
    with (run / "metrics.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    counters = ("step", "epoch")  # Lightning gives each row its epoch: a step's training and validation rows too
    logged = [(row["step"], name) for row in rows for name, value in row.items() if value and name not in counters]
    assert [step for step, name in logged if name == "train/loss_step"] == ["9", "19", "29"]
    assert [step for step, name in logged if name == "val/acc"] == ["17", "35"]
    assert len(logged) == len(set(logged)), "a metric logged twice at a step"


def test_sigterm_saves_a_checkpoint_mid_epoch_and_the_run_resumes_from_it(in_project_copy, tiny_shapes, groups):
    # With the project's logger (the SIGKILL twin above resumes with the CSV one): W&B's closing lines
    # come before the resume line, and its run is resumed, not started anew.
    logger = PROJECT_LOGGER
    process = start_paused_fit(groups, in_project_copy, tiny_shapes, STEPS_PER_EPOCH + 5, *logger)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 128 + signal.SIGTERM, "a preempted run must not exit with success"
    printed = process.stderr.read().decode()
    assert "weights_only" not in printed, "Lightning's notice of a save that did not say what it keeps"
    assert "\x1b[" not in printed, "colour codes, which a log file shows as such"
    # The last line, after the logger's own (W&B's closing lines), as a scheduler's log shows it.
    told = printed.strip().splitlines()[-1]
    assert told.startswith("Resume this run with: "), printed[-2000:]
    command = told.removeprefix("Resume this run with: ")
    assert command.startswith("python -m {{ cookiecutter.package_name }} fit --trainer.accelerator=cpu"), told
    assert command.endswith(" --ckpt_path auto") and "PauseAt" in command, told
    (run,) = run_folders(in_project_copy)
    # The signal came after this step's check (CheckpointOnStop runs before PauseAt): the next one stops.
    assert saved_step(run / "checkpoints" / "last.ckpt") == STEPS_PER_EPOCH + 6

    finish_with_auto_resume(groups, in_project_copy, tiny_shapes, *logger)
    assert saved_step(run / "checkpoints" / "last.ckpt") == 2 * STEPS_PER_EPOCH


def test_ctrl_c_twice_within_a_second_is_one_press_and_a_later_one_stops_at_once(monkeypatch):
    # A terminal's Ctrl-C and the copy a tool passes on arrive together: the run must still save.
    stop, trainer = CheckpointOnStop(), SimpleNamespace(is_global_zero=False)
    clock = iter([100.0, 100.4, 101.6])
    monkeypatch.setattr(callbacks.time, "monotonic", lambda: next(clock))
    stop._note_interrupt(trainer, signal.SIGINT, None)
    stop._note_interrupt(trainer, signal.SIGINT, None)
    assert stop.stop_requested and stop.stopped_by == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        stop._note_interrupt(trainer, signal.SIGINT, None)


def test_a_sigterm_before_the_first_step_stops_the_run_after_it(monkeypatch, in_project_copy, tiny_shapes):
    # Noted by Lightning's handler during the sanity check, before CheckpointOnStop's own takes over.
    before_training = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": None}})
    run_command(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1",
                "--trainer.limit_val_batches=1", f"--trainer.callbacks+={before_training}", status=143)  # fmt: skip
    (run,) = run_folders(in_project_copy)
    assert saved_step(run / "checkpoints" / "last.ckpt") == 1


@pytest.mark.parametrize("when", ["SigtermOnCreation", "SigtermAsTheTrainingDataLoads"])
def test_a_sigterm_before_training_ends_the_command_in_one_line_and_lets_go_of_the_run(
    in_project_copy, tiny_shapes, when
):
    # Before Lightning's handlers are in place (parsing, building, the logger's start, the data workers'):
    # nothing to save. Lightning's teardown then fails on a loader it began to iterate, hiding the stop.
    now = json.dumps({"class_path": f"helper_callbacks.{when}"})
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *TRAINER, *data(tiny_shapes),
               f"--trainer.callbacks+={now}"]  # fmt: skip
    done = subprocess.run(command, cwd=in_project_copy, env=command_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1] == "Stopped by SIGTERM outside training: nothing to save."
    assert "Traceback" not in done.stderr


def test_a_ctrl_c_before_training_ends_the_command_in_one_line_with_its_status(
    monkeypatch, capsys, in_project_copy, tiny_shapes
):
    # Lightning ended a fit that a Ctrl-C stopped in its set-up with status 1 (Python: a traceback).
    def interrupted(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.ImageDataModule, "setup", interrupted)
    before = signal.getsignal(signal.SIGINT)
    run_command(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), status=128 + signal.SIGINT)
    assert capsys.readouterr().err.strip().splitlines()[-1] == "Stopped by Ctrl-C."
    # Lightning's shutdown left Ctrl-C ignored: the process's next commands, and those they start, took none.
    assert signal.getsignal(signal.SIGINT) is before


def test_a_damaged_last_checkpoint_is_refused_in_one_line(monkeypatch, capsys, in_project_copy, tiny_shapes):
    # fit read its limits, and validate its weights, with torch.load's traceback.
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1", "--trainer.limit_val_batches=1")
    (last,) = in_project_copy.glob("runs/*/*/checkpoints/last.ckpt")
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # cut short by a copy onto a full disk
    capsys.readouterr()
    for command in (["fit", "--trainer.max_epochs=2"], ["validate"]):
        said = refusal(monkeypatch, capsys, *command, *TRAINER, *data(tiny_shapes), "--ckpt_path=last")
        assert said.startswith("error: ") and "last.ckpt is not a Lightning checkpoint, or is damaged: point" in said


def test_a_write_interrupted_midway_leaves_the_previous_checkpoint_loadable(monkeypatch, in_project_copy, tiny_shapes):
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1", "--trainer.limit_val_batches=1")
    (run,) = run_folders(in_project_copy)
    last = run / "checkpoints" / "last.ckpt"
    before = saved_step(last)
    real_save = torch.save

    def crash_halfway(checkpoint, file):
        real_save(checkpoint, file)
        file.truncate(file.tell() // 2)
        raise OSError("disk vanished")

    monkeypatch.setattr(checkpoint_io.torch, "save", crash_halfway)
    with pytest.raises(OSError, match="disk vanished"):
        run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=2",
                "--trainer.limit_val_batches=1", "--ckpt_path=auto")  # fmt: skip
    assert saved_step(last) == before
    assert sorted(p.name for p in last.parent.iterdir() if p.name.startswith(".")) == [], "staging file left behind"


def test_a_full_disk_while_a_small_file_is_written_leaves_the_old_one(tmp_path):
    # As every small file that a later run or command reads back is written.
    kept = tmp_path / "class_names.json"
    kept.write_text('["cat", "dog"]\n')
    with pytest.raises(OSError, match="File too large"), disk_full_past(16):
        checkpoint_io.write_whole(kept, '["' + "long class name " * 10 + '"]\n')
    assert kept.read_text() == '["cat", "dog"]\n'
    assert [path.name for path in tmp_path.iterdir()] == ["class_names.json"], "staging file left behind"


def test_a_checkpoint_that_fills_the_disk_is_one_error_line_naming_it(monkeypatch, in_project_copy, tiny_shapes):
    # torch.save's "[enforce fail at inline_container.cc:672] . unexpected pos", after the OSError, in a traceback.
    one_epoch = ["--trainer.max_epochs=1", "--trainer.limit_val_batches=1"]
    with pytest.raises(SystemExit) as stopped, disk_full_past(100_000):  # the first checkpoint is megabytes
        run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *one_epoch)
    said = r"error: File too large: \S+/checkpoints/\S+\.ckpt \(raise the file-size limit.*\)"
    assert re.fullmatch(said, stopped.value.code), stopped.value.code
    (checkpoints,) = (in_project_copy / "runs" / "resume").glob("*/checkpoints")
    assert [path.name for path in checkpoints.iterdir()] == ["class_names.json"], "staging file left behind"


def test_a_resume_stopped_by_a_full_disk_leaves_no_half_config_for_the_next(monkeypatch, in_project_copy, tiny_shapes):
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), "--trainer.max_epochs=1", "--trainer.limit_val_batches=1")
    (run,) = run_folders(in_project_copy)
    # The resume's config (kilobytes) is the first file it writes past 1,000 bytes; told in one line.
    with pytest.raises(SystemExit, match=r"^error: File too large.* \(raise the file-size limit"), disk_full_past(1000):
        run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *TWO_EPOCHS, "--ckpt_path=last")
    assert sorted(path.name for path in run.glob("*config*")) == ["config.yaml"]
    # Before, the next resume compared its options with the half-written file and refused them.
    run_cli(monkeypatch, "fit", *TRAINER, *data(tiny_shapes), *TWO_EPOCHS, "--ckpt_path=last")
    assert saved_step(run / "checkpoints" / "last.ckpt") == 2 * STEPS_PER_EPOCH


def test_checkpoints_are_renamed_into_place_from_the_same_folder(monkeypatch, tmp_path):
    renames = []
    real_replace = os.replace

    def recording_replace(source, target):
        renames.append((source, target))
        real_replace(source, target)

    monkeypatch.setattr(checkpoint_io.os, "replace", recording_replace)
    checkpoint_io.AtomicCheckpointIO().save_checkpoint({"step": 1}, tmp_path / "runs" / "last.ckpt")
    ((source, target),) = renames
    assert Path(source).parent == Path(target).parent == tmp_path / "runs"
    assert torch.load(target, weights_only=True) == {"step": 1}


def test_the_staging_files_of_a_process_killed_while_saving_go_with_the_next_save(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for left in (".last.ckpt.4242.tmp", ".epoch=0-step=2-acc0.5000.ckpt.4242.tmp", ".last.ckpt.4343.tmp"):
        (folder / left).write_bytes(b"the first half of a checkpoint")
    (folder / ".epoch004-acc0.9123.ckpt.partial").mkdir()  # a sharded save's
    (folder / ".epoch004-acc0.9123.ckpt.partial" / "__0_0.distcp").write_bytes(b"a shard")
    (folder / ".notes.partial").write_text("the user's")
    two_hours_ago = time.time() - 7200
    for left in (".last.ckpt.4242.tmp", ".epoch=0-step=2-acc0.5000.ckpt.4242.tmp", ".epoch004-acc0.9123.ckpt.partial",
                 ".notes.partial"):  # fmt: skip
        os.utime(folder / left, (two_hours_ago, two_hours_ago))
    checkpoint_io.AtomicCheckpointIO().save_checkpoint({"step": 3}, folder / "last.ckpt")
    # The one written to a moment ago may be another run's, still saving: it stays.
    assert sorted(path.name for path in folder.iterdir()) == [".last.ckpt.4343.tmp", ".notes.partial", "last.ckpt"]


def write_checkpoint(path: Path, kind: str, text: str) -> None:
    """A checkpoint as a sharding strategy writes it: a folder of shards, or a single file when it
    gathers the weights first; or a link to one."""
    if kind == "folder":
        path.mkdir()
        (path / "__0_0.distcp").write_text(text)
    elif kind.startswith("link to a"):
        write_checkpoint(path.parent / "elsewhere.ckpt", kind.removeprefix("link to a "), text)
        path.symlink_to("elsewhere.ckpt")
    elif kind == "dangling link":
        path.symlink_to("gone.ckpt")
    else:
        path.write_text(text)


def read_checkpoint(path: Path) -> str:
    return (path / "__0_0.distcp" if path.is_dir() else path).read_text()


@pytest.mark.parametrize("new", ["file", "folder"])
@pytest.mark.parametrize("old", [None, "file", "folder", "link to a file", "link to a folder", "dangling link"])
def test_a_staged_checkpoint_takes_the_place_of_the_old_one_whatever_each_is(tmp_path, old, new):
    last, staging = tmp_path / "last.ckpt", tmp_path / ".last.ckpt.partial"
    if old:
        write_checkpoint(last, old, "old")
    write_checkpoint(staging, new, "new")
    checkpoint_io.replace(staging, last)
    assert read_checkpoint(last) == "new" and not last.is_symlink()
    assert not list(tmp_path.glob(".last.ckpt*")), "nothing left beside it"
    if old and old.startswith("link to a"):
        assert read_checkpoint(tmp_path / "elsewhere.ckpt") == "old", "what the link pointed to stays"


@pytest.mark.parametrize("old", ["folder", "dangling link"])
def test_a_save_killed_between_its_two_renames_is_completed_when_the_runs_are_listed(tmp_path, old):
    checkpoints = tmp_path / "runs" / "project" / "version_0" / "checkpoints"
    checkpoints.mkdir(parents=True)
    write_checkpoint(checkpoints / ".last.ckpt.old", old, "old")
    write_checkpoint(checkpoints / ".last.ckpt.partial", "folder", "new")  # whole: every process had written
    (last,) = last_checkpoints(tmp_path / "runs")
    assert last == checkpoints / "last.ckpt" and read_checkpoint(last) == "new"
    assert [path.name for path in checkpoints.iterdir()] == ["last.ckpt"]


def test_a_listing_of_the_runs_that_completes_a_save_in_its_rename_gap_ends_neither(monkeypatch, tmp_path):
    # Two processes complete the same save (a listing command beside the run, or every rank of a
    # resumed job): the other one moves the new checkpoint into place just before this one does.
    last, staging = tmp_path / "last.ckpt", tmp_path / ".last.ckpt.partial"
    write_checkpoint(last, "folder", "old")
    write_checkpoint(staging, "folder", "new")
    rename = os.replace

    def beaten_to_it(source, target):
        if Path(source) == staging and Path(target) == last:
            monkeypatch.setattr(os, "replace", rename)
            checkpoint_io.complete_replace(last)
        rename(source, target)

    monkeypatch.setattr(os, "replace", beaten_to_it)
    checkpoint_io.replace(staging, last)
    assert read_checkpoint(last) == "new"
    assert [path.name for path in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_sharded_save_refuses_to_take_the_place_of_a_folder_that_is_no_checkpoint(tmp_path):
    trainer = checkpoint_io.Trainer(accelerator="cpu", strategy=FSDP2Strategy(), logger=False)
    (tmp_path / "results" / "metrics.csv").parent.mkdir()
    (tmp_path / "results" / "metrics.csv").write_text("the user's")
    with pytest.raises(IsADirectoryError, match="is a folder but no checkpoint"):
        trainer.save_checkpoint(tmp_path / "results")
    assert (tmp_path / "results" / "metrics.csv").read_text() == "the user's"


def test_a_save_goes_on_when_another_runs_staging_file_vanishes_as_it_looks(monkeypatch, tmp_path):
    # Two runs sharing a folder: the other one's save renames its staging file between this one's
    # listing of the folder and its look at the file.
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    listed = Path.glob

    def listing_with_a_vanished_file(self, pattern):
        return [*listed(self, pattern), self / ".last.ckpt.4444.tmp"]

    monkeypatch.setattr(Path, "glob", listing_with_a_vanished_file)
    checkpoint_io.AtomicCheckpointIO().save_checkpoint({"step": 3}, folder / "last.ckpt")
    assert torch.load(folder / "last.ckpt", weights_only=True) == {"step": 3}
{%- if cookiecutter.logger == "csv" %}


def test_a_resumed_run_appends_to_its_metrics(monkeypatch, in_project_copy, tiny_shapes):
    # The logger as configs/default.yaml sets it up, not only as the other tests name it.
    short = [*TRAINER[:4], *data(tiny_shapes), "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
    run_cli(monkeypatch, "fit", *short, "--trainer.max_epochs=1")
    run_cli(monkeypatch, "fit", *short, "--trainer.max_epochs=2", "--ckpt_path=last")  # the finished run, further
    (metrics,) = (in_project_copy / "runs").glob("*/*/metrics.csv")
    validated = [row["epoch"] for row in csv.DictReader(metrics.open()) if row.get("val/acc")]
    assert validated == ["0", "1"], "the resumed run must keep the first epoch's metrics"
{%- endif %}
