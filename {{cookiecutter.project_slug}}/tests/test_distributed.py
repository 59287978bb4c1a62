"""Data-parallel and sharded training as separate processes on this machine's CPU (gloo on 127.0.0.1),
started the ways a cluster starts them: Lightning's launcher, torchrun, and SLURM's srun."""

import contextlib
import csv
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import PROJECT_ROOT, command_env, free_port, run_group

from {{ cookiecutter.package_name }}.data import ImageDataModule
from {{ cookiecutter.package_name }}.model import ImageClassifier

ON_CPU = ["--trainer.accelerator=cpu", "--trainer.precision=32-true"]
CSV_LOGGER = ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.save_dir=runs",
              "--trainer.logger.name=dist"]  # fmt: skip
SHORT = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1"]
# Every process of these tests ends well within this; a hang fails the test instead of CI.
TIMEOUT = 300


def data(folder: Path, batch_size: int = 4) -> list[str]:
    return [f"--data.data_dir={folder}", "--data.synthetic=false", "--data.num_workers=0",
            f"--data.batch_size={batch_size}"]  # fmt: skip


def record(folder: Path) -> str:
    callback = {"class_path": "helper_callbacks.RecordProcess", "init_args": {"folder": str(folder)}}
    return f"--trainer.callbacks+={json.dumps(callback)}"


def fit(project: Path, *args: str, command: str = "fit") -> subprocess.CompletedProcess:
    cli = [sys.executable, "-m", "{{ cookiecutter.package_name }}", command, *args]
    result = run_group(cli, TIMEOUT, cwd=project, env=command_env())
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def seen(folder: Path) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("rank*.json"))]


@pytest.fixture
def uneven_shapes(tiny_shapes, tmp_path) -> Path:
    """The tiny dataset with 23 validation images: two processes get shards of 12 and 11."""
    copy = tmp_path / "uneven"
    shutil.copytree(tiny_shapes, copy)
    next((copy / "val").glob("*/*.png")).unlink()
    return copy


def test_ddp_splits_the_data_into_one_run(in_project_copy, uneven_shapes):
    ranks = in_project_copy / "ranks"
    ema = "--trainer.callbacks+={{ cookiecutter.package_name }}.training.ema.ModelEMA"
    fit(in_project_copy, "--config=configs/trainer/ddp.yaml", *ON_CPU, "--trainer.devices=2", *CSV_LOGGER,
        "--trainer.max_epochs=1", *data(uneven_shapes, batch_size=11), record(ranks), ema)  # fmt: skip
    rank0, rank1 = seen(ranks)
    assert (rank0["world_size"], rank0["global_rank"], rank1["global_rank"]) == (2, 0, 1)
    # The DistributedSampler gives each process a disjoint half of the 72 training images.
    first, second = set(rank0["train_indices"]), set(rank1["train_indices"])
    assert len(first) == len(second) == 36 and not first & second and first | second == set(range(72))
    # Every process logs the same numbers: those over all the images.
    assert rank0["val"] == rank1["val"]

    runs = [path for path in (in_project_copy / "runs" / "dist").iterdir()]
    assert len(runs) == 1, f"one run folder expected, found {runs}"
    assert len(list(in_project_copy.rglob("config.yaml"))) == 1
    names, best, finished, last = sorted(path.name for path in (runs[0] / "checkpoints").iterdir())
    assert (names, finished, last) == ("class_names.json", "finished.json", "last.ckpt")
    assert best.startswith("epoch000-acc")
    # The EMA of the weights, updated at each of the 3 steps (36 images per process, batches of 11).
    saved = torch.load(runs[0] / "checkpoints" / last, weights_only=True)
    assert saved["global_step"] == 3 and saved["averaging_state"]["n_averaged"] == 3
    averaged, trained = saved["state_dict"], saved["current_model_state"]
    assert any(not torch.equal(averaged[name], trained[name]) for name in averaged), "an average, not a copy"

    # Evaluating a checkpoint on both processes logs its step and epoch once, with no warning.
    checkpoint = f"--ckpt_path={runs[0] / 'checkpoints' / last}"
    evaluated = fit(in_project_copy, "--config=configs/trainer/ddp.yaml", *ON_CPU, "--trainer.devices=2", *CSV_LOGGER,
                    *data(uneven_shapes, batch_size=11), checkpoint, command="validate")  # fmt: skip
    assert "sync_dist" not in evaluated.stdout + evaluated.stderr

    # predict on both processes: one CSV from rank 0 with every test image once.
    fit(in_project_copy, "--config=configs/trainer/ddp.yaml", *ON_CPU, "--trainer.devices=2", *CSV_LOGGER,
        *data(uneven_shapes, batch_size=5), checkpoint, command="predict")  # fmt: skip
    (predictions,) = in_project_copy.glob("runs/dist/*/reports/predictions_test.csv")
    with predictions.open(newline="") as file:
        paths = [row["path"] for row in csv.DictReader(file)]
    assert sorted(paths) == sorted(str(path) for path in (uneven_shapes / "test").glob("*/*.png"))


@pytest.mark.parametrize("launcher", ["lightning", "slurm"])
def test_every_process_resumes_the_run_its_first_one_chose_passing_over_another_jobs(
    in_project_copy, tiny_shapes, launcher
):
    # Two jobs in one project: this one's run stopped, another job trains a newer one. Each process of
    # the resume must take the run the first one chose, not choose again (the runs' locks have changed
    # by then): those Lightning's launcher starts from it, and a SLURM job's other tasks.
    one_epoch = ["--trainer.max_epochs=1", "--trainer.limit_val_batches=1", *data(tiny_shapes)]
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *ON_CPU, *CSV_LOGGER, *one_epoch]
    for step in (3, 6):  # ours stopped after step 4, theirs, newer, after step 7
        sigterm = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": step}})
        stopped = run_group([*command, "--trainer.devices=1", f"--trainer.callbacks+={sigterm}"], TIMEOUT,
                            cwd=in_project_copy, env=command_env())  # fmt: skip
        assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-4000:]
    ours, theirs = sorted((in_project_copy / "runs" / "dist").iterdir())
    script = "import sys, pathlib; from {{ cookiecutter.package_name }}.training.run_folders import hold_run; "
    script += f"hold_run(pathlib.Path({str(theirs)!r}), 'fit'); print('held', flush=True); sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", script], env=command_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    ranks = in_project_copy / "ranks"
    try:
        assert holder.stdout.readline() == "held\n"
        if launcher == "lightning":
            fit(in_project_copy, "--config=configs/trainer/ddp.yaml", *ON_CPU, *CSV_LOGGER, *one_epoch,
                "--trainer.devices=2", record(ranks), "--ckpt_path=auto")  # fmt: skip
        else:
            job = fake_slurm(in_project_copy, tasks=2, job_id="778")
            result = sbatch(in_project_copy, job, *one_epoch, record(ranks), "--ckpt_path=auto")
            assert result.returncode == 0, result.stderr[-4000:]
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert [process["start_step"] for process in seen(ranks)] == [4, 4]
    assert sorted((in_project_copy / "runs" / "dist").iterdir()) == [ours, theirs]
    assert torch.load(theirs / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 7, "not trained"


@pytest.mark.parametrize(
    ("removed", "stop", "options", "saved"),
    [
        # 21 validation images: shards of 11 and 10, 3 and 2 batches of 5. The processes agree over the
        # batches both run; an agreement over the third, which one process does not run, would hang.
        # The validation comes after 3 of the epoch's 7 steps.
        (3, {"SigtermInValidation": {"epoch": 0, "rank": 1}}, ["--trainer.val_check_interval=0.5"], 3),
        # 11 images: 2 and 1 batches. A stop agreed at the epoch's last step reaches the validation,
        # whose first batch is one process's last: Lightning would stop the other after it.
        (13, {"SigtermAt": {"step": 6, "rank": 1}}, [], 7),
    ],
    ids=["within-it", "agreed-before-it"],
)
def test_a_sigterm_to_one_process_stops_all_in_a_validation_on_uneven_shards(
    in_project_copy, tiny_shapes, removed, stop, options, saved
):
    uneven = in_project_copy / "uneven"
    shutil.copytree(tiny_shapes, uneven)
    by_class = [sorted(folder.glob("*.png")) for folder in sorted((uneven / "val").iterdir())]
    for path in [path for paths in zip(*by_class, strict=True) for path in paths][:removed]:  # every class keeps some
        path.unlink()
    # The resumed run ends the epoch as the uninterrupted one.
    run = ["--config=configs/trainer/ddp.yaml", *ON_CPU, "--trainer.devices=2", *CSV_LOGGER, "--trainer.max_epochs=1",
           *options, *data(uneven, batch_size=5)]  # fmt: skip
    fit(in_project_copy, *run)
    ((name, init_args),) = stop.items()
    sigterm = json.dumps({"class_path": f"helper_callbacks.{name}", "init_args": init_args})
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *run, f"--trainer.callbacks+={sigterm}"]
    stopped = run_group(command, TIMEOUT, cwd=in_project_copy, env=command_env())
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-4000:]
    assert "during validation, which the resumed run does again" in stopped.stdout + stopped.stderr
    assert "Traceback" not in stopped.stderr, stopped.stderr[-4000:]
    whole, parts = sorted((in_project_copy / "runs" / "dist").iterdir())
    assert torch.load(parts / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == saved

    fit(in_project_copy, *run, "--ckpt_path=auto")
    logged = [epoch_numbers(run / "metrics.csv") for run in (whole, parts)]
    assert logged[0].keys() == {"train/acc", "train/f1", "train/top5", "train/loss_epoch", "val/acc", "val/f1",
                                "val/top5", "val/loss"}  # fmt: skip
    assert logged[1] == pytest.approx(logged[0], rel=1e-6)  # sums in another order


def test_a_stopped_run_ends_with_the_stop_status_however_long_its_first_process_takes(in_project_copy, tiny_shapes):
    # Lightning's launcher SIGKILLs the first process when one it started ends with a failure status,
    # as each does after a stop (143), unless the first one has ended by its next look, 5 s later.
    stop = [{"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 2}},
            {"class_path": "helper_callbacks.SlowToEnd", "init_args": {"seconds": 7}}]  # fmt: skip
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", "--config=configs/trainer/ddp.yaml",
               *ON_CPU, "--trainer.devices=2", *CSV_LOGGER, *data(tiny_shapes),
               *[f"--trainer.callbacks+={json.dumps(callback)}" for callback in stop]]  # fmt: skip
    stopped = run_group(command, TIMEOUT, cwd=in_project_copy, env=command_env())
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-4000:]
    assert stopped.stderr.splitlines()[-1].startswith("Resume this run with: "), stopped.stderr[-4000:]


def epoch_numbers(metrics_csv: Path) -> dict[str, float]:
    """The numbers of a run's last training epoch and validation, from its CSV file."""
    numbers = {}
    with metrics_csv.open(newline="") as file:
        for row in csv.DictReader(file):
            numbers |= {
                name: float(value) for name, value in row.items() if value and name.startswith(("train/", "val/"))
            }
    return {name: value for name, value in numbers.items() if not name.endswith("_step")}


def by_hand(logits: torch.Tensor, labels: torch.Tensor, stage: str) -> dict[str, float]:
    """The logged metrics of `stage` over these images, written out from their definitions."""
    losses = torch.logsumexp(logits, 1) - logits.gather(1, labels[:, None])[:, 0]
    predicted = logits.argmax(1)
    top5 = (logits.topk(5, 1).indices == labels[:, None]).any(1)
    # Macro F1 over the classes present or predicted, as scikit-learn's f1_score(average="macro").
    scores = []
    for label in set(labels.tolist()) | set(predicted.tolist()):
        hits = ((predicted == label) & (labels == label)).sum().item()
        scores.append(2 * hits / ((predicted == label).sum().item() + (labels == label).sum().item()))
    loss = f"{stage}/loss_epoch" if stage == "train" else f"{stage}/loss"
    return {
        loss: losses.mean().item(),
        f"{stage}/acc": (predicted == labels).double().mean().item(),
        f"{stage}/f1": sum(scores) / len(scores),
        f"{stage}/top5": top5.double().mean().item(),
    }


@pytest.mark.parametrize("batch_size", [4, 11])
@pytest.mark.parametrize("processes", [1, 2])
def test_every_logged_metric_is_over_every_image_once(in_project_copy, uneven_shapes, processes, batch_size):
    outputs = in_project_copy / "outputs"
    callback = {"class_path": "helper_callbacks.RecordOutputs", "init_args": {"folder": str(outputs)}}
    hardware = ["--config=configs/trainer/ddp.yaml"] if processes > 1 else ["--trainer.strategy=auto"]
    fit(in_project_copy, *hardware, *ON_CPU, f"--trainer.devices={processes}", *CSV_LOGGER, "--trainer.max_epochs=1",
        *data(uneven_shapes, batch_size), f"--trainer.callbacks+={json.dumps(callback)}")  # fmt: skip
    (metrics,) = (in_project_copy / "runs" / "dist").glob("*/metrics.csv")
    logged = {}  # each epoch-level number of the one epoch, as the logger wrote it
    for row in csv.DictReader(metrics.open()):
        logged |= {name: float(value) for name, value in row.items() if value and name.startswith(("train/", "val/"))}
    logged.pop("train/loss_step", None)  # per batch, when a batch falls on log_every_n_steps

    # Training: what the model computed at each step, gathered from every process. Lightning's
    # DistributedSampler gives each process 36 of the 72 images; a last batch shorter than half a
    # batch is dropped (36 in batches of 11 leave 3), a longer one kept (72 in batches of 11 leave 6).
    recorded = [torch.load(path, weights_only=True)["train"] for path in sorted(outputs.glob("outputs*.pt"))]
    assert len(recorded) == processes
    logits = torch.cat([batch for process in recorded for batch in process["logits"]])
    labels = torch.cat([batch for process in recorded for batch in process["labels"]])
    assert len(labels) == {(1, 4): 72, (1, 11): 72, (2, 4): 72, (2, 11): 66}[processes, batch_size]
    expected = by_hand(logits, labels, "train")

    # Validation: the trained weights over the 23 images, once each, in one batch of one process.
    model = ImageClassifier.load_from_checkpoint(next(in_project_copy.glob("runs/dist/*/checkpoints/last.ckpt")))
    datamodule = ImageDataModule(uneven_shapes, num_workers=0, batch_size=23)
    datamodule.setup("validate")
    images, labels = datamodule.on_after_batch_transfer(next(iter(datamodule.val_dataloader())), 0)
    with torch.no_grad():
        expected |= by_hand(model.eval()(images).double(), labels, "val")

    assert set(logged) == set(expected)
    for name, value in expected.items():
        assert logged[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


@pytest.mark.parametrize("preset", ["ddp", "fsdp"])
def test_a_process_whose_validation_batch_is_all_unreadable_validates_with_the_others(in_project_copy, tiny_shapes,
                                                                                        tmp_path, preset):  # fmt: skip
    # The validation images are dealt to the two processes in turn: the first and third go to the first
    # process, whose first batch of two was then all unreadable, and the run stopped with the training's
    # error (one process alone skips them and goes on). Under FSDP that process's forward must still run.
    copy = tmp_path / "data"
    shutil.copytree(tiny_shapes, copy)
    split = ImageDataModule(copy, num_workers=0)
    split.setup("validate")
    for path, _ in split.val_set.samples[0:3:2]:
        Path(path).write_bytes(b"not an image at all")
    fit(in_project_copy, f"--config=configs/trainer/{preset}.yaml", *ON_CPU, "--trainer.devices=2", *CSV_LOGGER,
        "--trainer.max_epochs=1", "--trainer.limit_train_batches=2", *data(copy, 2))  # fmt: skip
    (metrics,) = (in_project_copy / "runs" / "dist").glob("*/metrics.csv")
    logged = {name: float(value) for row in csv.DictReader(metrics.open()) for name, value in row.items()
              if value and name.startswith("val/")}  # fmt: skip
    (last,) = in_project_copy.glob("runs/dist/*/checkpoints/last.ckpt")
    if last.is_dir():  # FSDP's shards
        fit(in_project_copy, str(last), str(in_project_copy / "model.ckpt"), command="consolidate")
        last = in_project_copy / "model.ckpt"
    model = ImageClassifier.load_from_checkpoint(last, map_location="cpu")
    readable = ImageDataModule(copy, num_workers=0, batch_size=len(split.val_set))
    readable.setup("validate")
    with pytest.warns(UserWarning, match="Skipping the unreadable image"):
        images, labels = readable.on_after_batch_transfer(next(iter(readable.val_dataloader())), 0)
    assert len(labels) == len(split.val_set) - 2
    with torch.no_grad():
        expected = by_hand(model.eval()(images).double(), labels, "val")
    assert logged == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("workers", [0, 2])
def test_augmentations_differ_between_processes(in_project_copy, tiny_shapes, tmp_path, workers):
    # Every training image is the same picture, so the batches differ only by their augmentation.
    same = tmp_path / "same"
    picture = next((tiny_shapes / "train").glob("*/*.png"))
    for split in ("train", "val"):
        for class_dir in (tiny_shapes / split).iterdir():
            (same / split / class_dir.name).mkdir(parents=True)
            for image in class_dir.iterdir():
                shutil.copy(picture, same / split / class_dir.name / image.name)
    ranks = in_project_copy / "ranks"
    fit(in_project_copy, "--config=configs/trainer/ddp.yaml", *ON_CPU, "--trainer.devices=2", *CSV_LOGGER,
        *SHORT, *data(same), f"--data.num_workers={workers}", record(ranks))  # fmt: skip
    rank0, rank1 = seen(ranks)
    assert rank0["first_batch"] != rank1["first_batch"]
    # Within a process, each image of the batch is cropped and flipped anew.
    assert len(set(rank0["first_batch"])) == len(rank0["first_batch"])


def hold(rank: int, marker: Path) -> str:
    """The option that holds process `rank` at step 1 for two minutes."""
    options = {"rank": rank, "step": 1, "marker": str(marker)}
    return f"--trainer.callbacks+={json.dumps({'class_path': 'helper_callbacks.HoldOnRank', 'init_args': options})}"


def running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    if stat.is_file():  # Linux: a zombie, dead but not yet reaped, is not running
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def group_runs(group: int) -> bool:
    """Whether a process of the process group `group` runs (zombies, dead but not yet reaped, do not)."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            state, _, group_id = stat.read_text().rsplit(")", 1)[1].split()[:3]  # after the name: state, ppid, pgrp
            if int(group_id) == group and state != "Z":
                return True
    return False


def test_a_process_whose_launcher_is_killed_stops_at_once(in_project_copy, tiny_shapes, groups):
    # Local rank 1 is held at a step, as one busy computing or waiting in an NCCL collective is: it
    # would not notice that local rank 0, which launched it, is gone until much later.
    marker = in_project_copy / "held"
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", "--config=configs/trainer/ddp.yaml",
               *ON_CPU, "--trainer.devices=2", *SHORT, *CSV_LOGGER, *data(tiny_shapes), hold(1, marker)]  # fmt: skip
    launcher = groups(command, cwd=in_project_copy, env=command_env(), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists():
        assert launcher.poll() is None, launcher.stderr.read()[-4000:]
        assert time.monotonic() < deadline, "local rank 1 never reached the step"
        time.sleep(0.1)
    rank1 = int(marker.read_text())
    launcher.kill()  # as the OOM killer would
    launcher.wait()
    killed = time.monotonic()
    while running(rank1) and time.monotonic() < killed + 15:
        time.sleep(0.2)
    assert not running(rank1), "local rank 1 outlived its launcher by 15 s"
    assert "local rank 0, which started this process, (pid" in launcher.stderr.read()


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_run_whose_other_processes_never_start_ends_on_sigterm_or_ctrl_c(in_project_copy, tiny_shapes, groups, stop):
    # Two nodes asked for, one started: torch's rendezvous waits half an hour for the other, in code
    # that does not return to Python's handlers. SIGTERM as `kill` sends it, Ctrl-C as a terminal does.
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *ON_CPU, "--trainer.devices=2",
               "--trainer.num_nodes=2", "--trainer.strategy=ddp", *SHORT, *CSV_LOGGER, *data(tiny_shapes)]  # fmt: skip
    env = command_env(MASTER_PORT=str(free_port()))
    launcher = groups(command, cwd=in_project_copy, env=env, stderr=subprocess.PIPE, text=True)
    said: list[str] = []
    reader = threading.Thread(target=lambda: said.extend(launcher.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + TIMEOUT
    while sum("Initializing distributed" in line for line in said) < 2:  # both local processes wait
        assert launcher.poll() is None and time.monotonic() < deadline, "".join(said)[-4000:]
        time.sleep(0.2)
    time.sleep(2)  # into the wait
    if stop == signal.SIGTERM:
        os.kill(launcher.pid, stop)
    else:
        os.killpg(launcher.pid, stop)
    assert launcher.wait(timeout=60) == 128 + stop
    reader.join(timeout=30)
    said_how = "SIGTERM" if stop == signal.SIGTERM else "Ctrl-C"
    expected = f"Stopped by {said_how} while waiting for all 4 processes of the run to start: nothing to save."
    assert said[-1].rstrip() == expected and "Traceback" not in "".join(said), "".join(said)[-4000:]
    stopped = time.monotonic()
    while group_runs(launcher.pid) and time.monotonic() < stopped + 10:
        time.sleep(0.2)
    assert not group_runs(launcher.pid), "local rank 1 outlived its launcher's stop by 10 s"


@pytest.mark.parametrize("failing", [0, 1])
def test_a_process_that_fails_is_told_once_and_the_others_say_why_they_stopped(in_project_copy, tiny_shapes, failing):
    # The other process learns of it in its next collective, from gloo's closed connection.
    unreadable = json.dumps({"class_path": "helper_callbacks.UnreadableAt", "init_args": {"step": 2, "rank": failing}})
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", "--config=configs/trainer/ddp.yaml",
               *ON_CPU, "--trainer.devices=2", "--trainer.max_epochs=1", *CSV_LOGGER, *data(tiny_shapes),
               f"--trainer.callbacks+={unreadable}"]  # fmt: skip
    result = run_group(command, TIMEOUT, cwd=in_project_copy, env=command_env())
    assert result.returncode != 0, result.stderr[-4000:]  # 1, or Lightning's launcher's SIGKILL to rank 0
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors[0] == f"error: Cannot read the image broken.png in process {failing}", errors
    stopped = (f"error: process {1 - failing} of 2 stopped: another process of this run ended first (its error is "
               "above; a process that printed none was killed, by a signal or for lack of memory)")  # fmt: skip
    # Lightning's launcher may end the other first, when rank 1 fails: that one then says nothing.
    assert errors[1:] in ([], [stopped]), errors


def test_a_hung_process_ends_the_run_after_the_collective_timeout(in_project_copy, tiny_shapes):
    # Rank 0 hangs at a step; rank 1 waits for it at its next gradient all-reduce for the preset's
    # timeout (here 15 s), fails, and Lightning's launcher then ends rank 0.
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", "--config=configs/trainer/ddp.yaml",
               *ON_CPU, "--trainer.devices=2", "--trainer.strategy.init_args.timeout=0:00:15", *SHORT, *CSV_LOGGER,
               *data(tiny_shapes), hold(0, in_project_copy / "held")]  # fmt: skip
    started = time.monotonic()
    result = run_group(command, TIMEOUT, cwd=in_project_copy, env=command_env())
    assert result.returncode != 0
    assert time.monotonic() - started < 100, "the run outlived the hung process's 120 s hold"
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    # Named by Lightning's launcher, or by rank 1 when a busy machine lets rank 0 go first.
    assert re.search(r"\[rank: 1\] Child process with PID \d+ terminated|local rank 1 stops too", result.stderr)
    assert re.search(r"process 1 of 2 stopped: another process .* within the timeout|local rank 1 stops", result.stderr)


def test_fsdp2_fits_on_two_processes_and_its_checkpoint_serves_one(in_project_copy, uneven_shapes):
    ranks = in_project_copy / "ranks"
    fit(in_project_copy, "--config=configs/trainer/fsdp.yaml", *ON_CPU, "--trainer.devices=2", *CSV_LOGGER,
        "--trainer.max_epochs=1", "--trainer.limit_train_batches=3", *data(uneven_shapes, batch_size=11),
        record(ranks))  # fmt: skip
    rank0, rank1 = seen(ranks)
    assert rank0["val"] == rank1["val"]
    (sharded,) = (in_project_copy / "runs" / "dist").glob("*/checkpoints/last.ckpt")
    assert sharded.is_dir(), "FSDP2 writes one shard per process into a checkpoint folder"
    # Evaluated without its preset, it ended in a traceback from each process.
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "test", *ON_CPU, "--trainer.devices=2",
               *CSV_LOGGER, *data(uneven_shapes)]  # fmt: skip
    refused = run_group(command, TIMEOUT, cwd=in_project_copy, env=command_env())
    last = refused.stderr.strip().splitlines()[-1]
    consolidate = f"consolidate {sharded.relative_to(in_project_copy)} model.ckpt` and pass that."
    assert refused.returncode == 1 and last.startswith("error: ") and last.endswith(consolidate), refused.stderr
    assert "is a sharded checkpoint, which loads under the strategy that wrote it: pass the preset" in last

    single_file = in_project_copy / "model.ckpt"
    fit(in_project_copy, str(sharded), str(single_file), command="consolidate")
    model = ImageClassifier.load_from_checkpoint(single_file, map_location="cpu").eval()
    datamodule = ImageDataModule(uneven_shapes, num_workers=0, batch_size=23)
    datamodule.setup("validate")
    images, labels = datamodule.on_after_batch_transfer(next(iter(datamodule.val_dataloader())), 0)
    with torch.no_grad():
        probabilities = model(images).softmax(-1)
    assert probabilities.shape == (23, 6) and torch.allclose(probabilities.sum(-1), torch.ones(23))
    # Every forward of a sharded model needs both processes, so the 23 images were padded to 24 with
    # the first one again: each process ran the same number of batches (12 images: 11 and 1).
    correct = (probabilities.argmax(-1) == labels).float()
    accuracy = (correct.sum() + correct[0]).item() / 24
    assert accuracy == pytest.approx(rank0["val"]["val/acc"], abs=1e-6)


def test_a_checkpoint_of_one_device_tests_alike_under_fsdp2(in_project_copy, tiny_shapes):
    # Its channels-last weights reached the second process's shards in another order: test/acc 0.57, not 0.81.
    fit(in_project_copy, *ON_CPU, "--trainer.devices=1", *CSV_LOGGER, *SHORT, *data(tiny_shapes))
    (checkpoint,) = (in_project_copy / "runs" / "dist").glob("*/checkpoints/last.ckpt")
    sharded = ["--config=configs/trainer/fsdp.yaml", "--trainer.devices=2"]
    for name, hardware in (("one", ["--trainer.devices=1"]), ("fsdp", sharded)):
        fit(in_project_copy, *hardware, *ON_CPU, *CSV_LOGGER, *data(tiny_shapes), f"--ckpt_path={checkpoint}",
            record(in_project_copy / name), command="test")  # fmt: skip
    one, *sharded = [rank["test"] for name in ("one", "fsdp") for rank in seen(in_project_copy / name)]
    assert len(sharded) == 2 and all(metrics == pytest.approx(one, abs=1e-5) for metrics in sharded), (one, sharded)


def test_an_fsdp2_run_resumed_mid_epoch_ends_as_the_uninterrupted_one(in_project_copy, tiny_shapes):
    # FSDP and DeepSpeed read a checkpoint after their setup, by when the learning-rate schedule had
    # asked for the training loader: the resumed epoch started over, training again on what it had seen.
    fsdp2 = ["--config=configs/trainer/fsdp.yaml", *ON_CPU, "--trainer.devices=2", *data(tiny_shapes),
             "--trainer.logger={{ cookiecutter.package_name }}.training.csv_logging.ResumableCSVLogger",
             "--trainer.logger.name=dist", "--trainer.max_epochs=2", "--trainer.limit_val_batches=1",
             "--trainer.deterministic=true"]  # fmt: skip
    fit(in_project_copy, *fsdp2, "--trainer.logger.save_dir=whole")
    sigterm = {"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 12}}  # epoch 1 of 9 steps each
    stopped = run_group([sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *fsdp2,
                         "--trainer.logger.save_dir=parts", f"--trainer.callbacks+={json.dumps(sigterm)}"],
                        TIMEOUT, cwd=in_project_copy, env=command_env())  # fmt: skip
    assert stopped.returncode == 143, stopped.stderr[-4000:]
    fit(in_project_copy, *fsdp2, "--trainer.logger.save_dir=parts", "--ckpt_path=auto")
    runs = {}
    for name in ("whole", "parts"):
        (sharded,) = (in_project_copy / name / "dist").glob("*/checkpoints/last.ckpt")
        fit(in_project_copy, str(sharded), f"{name}.ckpt", command="consolidate")
        runs[name] = torch.load(in_project_copy / f"{name}.ckpt", map_location="cpu", weights_only=True)
    whole, parts = runs["whole"], runs["parts"]
    assert whole["global_step"] == parts["global_step"] == 18
    changed = [name for name, value in whole["state_dict"].items() if not torch.equal(value, parts["state_dict"][name])]
    assert changed == []
    # The interrupted epoch's numbers are over all of it, as the uninterrupted run logged them (a loss's
    # float32 sums, rank 0's holding the part before the stop, add up in another order).
    assert logged_epochs(in_project_copy / "parts") == pytest.approx(logged_epochs(in_project_copy / "whole"), rel=1e-6)


def logged_epochs(folder: Path) -> dict[str, float]:
    """The epochs' train/ and val/ numbers in a run's metrics.csv (not the steps' own), by name and epoch."""
    (path,) = folder.glob("dist/*/metrics.csv")
    return {f"{name} in epoch {row['epoch']}": float(value)
            for row in csv.DictReader(path.open()) for name, value in row.items()
            if value and name.startswith(("train/", "val/")) and not name.endswith("_step")}  # fmt: skip


def test_a_sharded_last_checkpoint_killed_while_saving_stays_the_previous_one(in_project_copy, tiny_shapes):
    fsdp2 = ["--config=configs/trainer/fsdp.yaml", *ON_CPU, "--trainer.devices=2", *CSV_LOGGER, *SHORT,
             *data(tiny_shapes)]  # fmt: skip
    fit(in_project_copy, *fsdp2)
    (last,) = (in_project_copy / "runs" / "dist").glob("*/checkpoints/last.ckpt")
    saved = digests(last)
    killer = {"class_path": "helper_callbacks.KillWhileSavingLast"}
    going_on = [*fsdp2, "--trainer.max_epochs=2", "--ckpt_path=last"]
    killed = run_group([sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *going_on,
                        f"--trainer.callbacks+={json.dumps(killer)}"], TIMEOUT, cwd=in_project_copy,
                       env=command_env())  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    assert digests(last) == saved, "last.ckpt is still the first run's, whole"

    ranks = in_project_copy / "ranks"
    fit(in_project_copy, *going_on, record(ranks))
    assert [process["start_step"] for process in seen(ranks)] == [2, 2]
    assert sorted(path.name for path in last.parent.iterdir() if path.name.startswith(".")) == []


def digests(folder: Path) -> dict[str, str]:
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.rglob("*")}


def test_two_nodes_through_torchrun(in_project_copy, tiny_shapes, groups):
    shutil.copytree(PROJECT_ROOT / "scripts", in_project_copy / "scripts")
    ranks = in_project_copy / "ranks"
    env = command_env(NNODES="2", NPROC_PER_NODE="1", RDZV_ENDPOINT=f"127.0.0.1:{free_port()}", PYTHON=sys.executable,
                      JOIN_TIMEOUT="120")  # fmt: skip
    args = [*ON_CPU, *CSV_LOGGER, *SHORT,
            *data(tiny_shapes), record(ranks)]  # fmt: skip
    launch = ["bash", "scripts/torchrun.sh", *args]
    nodes = [groups(launch, cwd=in_project_copy, env=env, stderr=subprocess.PIPE, text=True) for _ in "01"]
    for node in nodes:
        assert node.wait(timeout=TIMEOUT) == 0, node.stderr.read()[-4000:]
    processes = seen(ranks)
    assert [(p["world_size"], p["global_rank"], p["local_rank"]) for p in processes] == [(2, 0, 0), (2, 1, 0)]
    assert sorted(p["node_rank"] for p in processes) == [0, 1]
    assert {p["environment"] for p in processes} == {"TorchElasticEnvironment"}


def test_two_runs_through_torchrun_on_one_machine_stay_apart(in_project_copy, tiny_shapes, groups):
    # Both took the rendezvous 127.0.0.1:29400 under the project's name: the second joined the first's,
    # trained nothing while it ran, and ended in a traceback.
    shutil.copytree(PROJECT_ROOT / "scripts", in_project_copy / "scripts")
    env = command_env(NPROC_PER_NODE="1", PYTHON=sys.executable)
    runs = []
    for run in "12":
        args = [*ON_CPU, *CSV_LOGGER, f"--trainer.logger.name=dist{run}", *SHORT, *data(tiny_shapes),
                record(in_project_copy / f"ranks{run}")]  # fmt: skip
        launch = ["bash", "scripts/torchrun.sh", *args]
        runs.append(groups(launch, cwd=in_project_copy, env=env, stderr=subprocess.PIPE, text=True))
    for run in runs:
        assert run.wait(timeout=TIMEOUT) == 0, run.stderr.read()[-4000:]
    for run in "12":
        (process,) = seen(in_project_copy / f"ranks{run}")
        assert (process["world_size"], process["global_rank"]) == (1, 0)


def test_torchrun_without_a_gpu_says_how_to_run_on_cpus(in_project_copy):
    # torchrun's default of one process per GPU failed with its traceback, "ValueError: Cuda is not available."
    shutil.copytree(PROJECT_ROOT / "scripts", in_project_copy / "scripts")
    env = command_env(CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)
    done = subprocess.run(["bash", "scripts/torchrun.sh"], cwd=in_project_copy, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: no GPU is visible") and "NPROC_PER_NODE=2" in done.stderr


def fake_slurm(project: Path, tasks: int, job_id: str) -> dict[str, str]:
    """The variables sbatch sets for a job of `tasks` single-task nodes, and stand-ins for srun
    (start the tasks with their own variables, as srun does) and scontrol (note its arguments)."""
    bin_dir = project / "fake-slurm"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env bash\n"
        'while [[ "$1" == --* ]]; do shift; done  # srun\'s own options\n'
        "pids=()\n"
        "for ((i = 0; i < SLURM_NTASKS; i++)); do\n"
        '  SLURM_PROCID=$i SLURM_NODEID=$i SLURM_LOCALID=0 "$@" & pids+=($!)\n'
        "done\n"
        'status=0; for pid in "${pids[@]}"; do wait "$pid" || status=$?; done; exit "$status"\n'
    )
    (bin_dir / "scontrol").write_text(f'#!/usr/bin/env bash\necho "$@" >> {bin_dir / "scontrol.log"}\n')
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    return command_env(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHON=sys.executable,
        SLURM_JOB_ID=job_id,
        SLURM_JOB_NAME="train",
        SLURM_NTASKS=str(tasks),
        SLURM_NTASKS_PER_NODE="1",
        SLURM_JOB_NUM_NODES=str(tasks),
        SLURM_NNODES=str(tasks),
        SLURM_NODELIST="127.0.0.1",
        SLURM_SUBMIT_DIR=str(project),
        MASTER_PORT=str(free_port()),
    )


def sbatch(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    command = ["bash", str(PROJECT_ROOT / "scripts" / "slurm.sbatch"), *ON_CPU, *CSV_LOGGER, *args]
    return run_group(command, TIMEOUT, cwd=project, env=env)


@pytest.mark.parametrize("given", [["--ckpt_path", "last"], ["--ckpt_path=a.ckpt"], []])
def test_a_slurm_job_passes_its_arguments_as_given_on_its_first_start_and_its_requeue(in_project_copy, given):
    # It added --ckpt_path auto, which took another job's unfinished run; fit finds a requeued job's own.
    env = fake_slurm(in_project_copy, tasks=1, job_id="31")
    (in_project_copy / "fake-slurm" / "srun").write_text('#!/usr/bin/env bash\necho "$@"\n')  # the command only
    for restarts in ("0", "1"):
        started = run_group(["bash", str(PROJECT_ROOT / "scripts" / "slurm.sbatch"), *given], TIMEOUT,
                            cwd=in_project_copy, env=env | {"SLURM_RESTART_COUNT": restarts})  # fmt: skip
        assert started.returncode == 0, started.stderr
        args = started.stdout.split()
        ckpt_path = [arg for i, arg in enumerate(args) if arg.startswith("--ckpt_path") or args[i - 1] == "--ckpt_path"]
        assert ckpt_path == given, args


def test_slurm_job_runs_in_lightnings_slurm_environment(in_project_copy, tiny_shapes):
    ranks = in_project_copy / "ranks"
    env = fake_slurm(in_project_copy, tasks=2, job_id="4242")
    result = sbatch(in_project_copy, env, *SHORT,
                    *data(tiny_shapes), record(ranks))  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    processes = seen(ranks)
    assert [(p["world_size"], p["global_rank"], p["node_rank"]) for p in processes] == [(2, 0, 0), (2, 1, 1)]
    assert {p["environment"] for p in processes} == {"SLURMEnvironment"}


def test_slurm_time_limit_saves_requeues_and_resumes(in_project_copy, tiny_shapes):
    env = fake_slurm(in_project_copy, tasks=1, job_id="777")
    sigterm = json.dumps({"class_path": "helper_callbacks.SigtermAt", "init_args": {"step": 3}})
    two_epochs = ["--trainer.max_epochs=2", "--trainer.limit_val_batches=1", *data(tiny_shapes)]
    stopped = sbatch(in_project_copy, env, *two_epochs, f"--trainer.callbacks+={sigterm}")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-4000:]
    assert (in_project_copy / "fake-slurm" / "scontrol.log").read_text().split() == ["requeue", "777"]
    (last,) = (in_project_copy / "runs" / "dist").glob("*/checkpoints/last.ckpt")
    # Sent after CheckpointOnStop looked at step 3, the SIGTERM stops the run after the next step.
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 4

    requeued = sbatch(in_project_copy, env | {"SLURM_RESTART_COUNT": "1"}, *two_epochs)  # the same script again
    assert requeued.returncode == 0, requeued.stderr[-4000:]
    assert list((in_project_copy / "runs" / "dist").glob("*/checkpoints/last.ckpt")) == [last]
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 2 * 18
