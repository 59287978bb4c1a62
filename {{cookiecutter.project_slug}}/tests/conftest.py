import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
{%- if cookiecutter.logger == "wandb" %}
import wandb
{%- endif %}

from {{ cookiecutter.package_name }}.cli import main, resolved_config
from {{ cookiecutter.package_name }}.data import usable_cpus
from {{ cookiecutter.package_name }}.datasets.shapes import draw_shapes_dataset

PROJECT_ROOT = Path(__file__).resolve().parents[1]
LAUNCH_PLACES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")
# The tests run on CPU whatever hardware the project was generated for.
ON_CPU = ["--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto", "--trainer.precision=32-true"]

# A backbone other than the project's, for the tests of a model changed since its checkpoint.
OTHER_BACKBONE = "{{ 'resnet18' if cookiecutter.backbone == 'mobilenet_v3_small' else 'mobilenet_v3_small' }}"


def on_data(data_dir: Path, batch_size: int = 8) -> list[str]:
    """Options for a dataset on disk, read without data workers."""
    return [f"--data.data_dir={data_dir}", "--data.synthetic=false", "--data.num_workers=0",
            f"--data.batch_size={batch_size}"]  # fmt: skip


# Tests never talk to a W&B server, whatever the machine's login.
os.environ["WANDB_MODE"] = "offline"
# pytest started from a shell inside a SLURM allocation or a torchrun job inherits what they set to place
# a process among a job's; the tests and the commands they start are processes of their own.
for name in [name for name in os.environ if name.startswith(("SLURM_", "TORCHELASTIC_")) or name in LAUNCH_PLACES]:
    del os.environ[name]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One thread per worker, for its own tests and the processes they start: two workers with torch's
    # thread per core ran slower on two cores than one worker.
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.hookimpl(optionalhook=True)  # pytest without pytest-xdist runs too
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """What `pytest -n auto` starts, unless PYTEST_XDIST_AUTO_NUM_WORKERS says: a worker per CPU, at
    most 4 (each one, with the processes its tests start, holds a gigabyte or more)."""
    return int(os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or min(4, usable_cpus()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Workers side by side would share one GPU (memory, ports, DeepSpeed's op builds).
        skip = pytest.mark.skip(reason="GPU tests run one at a time: pytest -m gpu")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def nothing_written_into_the_project():
    """Tests write into scratch folders: the project folder stays as its user keeps it (no runs/, reports/)."""
    before = set(os.listdir(PROJECT_ROOT))
    yield
    added = set(os.listdir(PROJECT_ROOT)) - before - {".pytest_cache"}
    assert not added, f"the test wrote {sorted(added)} into the project folder"


{%- if cookiecutter.logger == "wandb" %}


@pytest.fixture(autouse=True)
def finish_wandb_run():
    # One process is one W&B run; tests that train twice in a process must end the first run.
    yield
    wandb.finish()
{%- endif %}


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory) -> Path:
    """A small copy of the built-in dataset: 6 classes, train/val/test, 32 px."""
    root = tmp_path_factory.mktemp("data") / "shapes"
    return draw_shapes_dataset(root, images_per_class={"train": 12, "val": 4, "test": 4}, size=32)


{%- if cookiecutter.streaming == "yes" %}


@pytest.fixture(scope="session")
def shards(tmp_path_factory, tiny_shapes) -> Path:
    """The tiny dataset sharded: 72 training, 24 validation and 24 test images in chunks."""
    output = tmp_path_factory.mktemp("shards") / "shapes"
    with pytest.MonkeyPatch.context() as monkeypatch:
        shard(monkeypatch, tiny_shapes, output)
    return output


def shard(monkeypatch, images: Path, output: str | Path) -> None:
    run_command(monkeypatch, "shard", str(images), str(output), "--workers=1")
{%- endif %}


@pytest.fixture(scope="session")
def project_config() -> dict:
    """The configuration `fit` resolves from the project's own config files, with no options."""
    here = os.getcwd()
    os.chdir(PROJECT_ROOT)
    try:
        return resolved_config([])
    finally:
        os.chdir(here)


@pytest.fixture
def in_project_copy(tmp_path, monkeypatch) -> Path:
    """Run from a scratch folder holding the project's configs, so runs/ and data/ land there."""
    shutil.copytree(PROJECT_ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def trained(monkeypatch, in_project_copy, tiny_shapes) -> Path:
    """A project copy with one short run on the tiny dataset, its checkpoints under runs/."""
    args = ["fit", "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto",
            "--trainer.precision=32-true", "--trainer.max_epochs=1", "--trainer.limit_val_batches=1",
            "--trainer.log_every_n_steps=1",
            f"--data.data_dir={tiny_shapes}", "--data.synthetic=false", "--data.num_workers=0",
            "--data.batch_size=8"]  # fmt: skip
    run_cli(monkeypatch, *args)
    return in_project_copy


def run_cli(monkeypatch, *args: str) -> None:
    """A command of the project run in this process, as `python -m` runs it (fit, validate: those that return)."""
    monkeypatch.setattr(sys, "argv", ["{{ cookiecutter.package_name }}", *args])
    main()


def run_command(monkeypatch, *args: str, status: int = 0) -> None:
    """Run one of the project's own commands (doctor, report, ...), which exit with `status`."""
    with pytest.raises(SystemExit) as done:
        run_cli(monkeypatch, *args)
    assert done.value.code == status


def refusal(monkeypatch, capsys, *args: str) -> str:
    """The one line, `error: ...`, that a command which must fail ends with, and no traceback: at
    most three lines of output in all (Lightning's seed line, for one)."""
    with pytest.raises(SystemExit) as stopped:
        run_cli(monkeypatch, *args)
    printed = capsys.readouterr()
    # A message given to sys.exit is printed by Python as the process ends; parse errors print their own.
    message = stopped.value.code if isinstance(stopped.value.code, str) else printed.err.strip()
    assert stopped.value.code != 0
    assert message.startswith("error: ") and "\n" not in message, message
    assert "Traceback" not in printed.out + printed.err
    assert len((printed.out + printed.err).strip().splitlines()) <= (2 if message is stopped.value.code else 3), printed
    return message


@contextlib.contextmanager
def disk_full_past(size: int):
    """In this process, for the block: a write that takes any file past `size` bytes fails part of
    the way, as on a full disk (OSError: File too large; Python ignores the SIGXFSZ that comes with it)."""
    import resource  # Unix only

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def command_env(**extra: str) -> dict[str, str]:
    """The environment of the project's commands in the tests: the package and tests/ (for the
    callbacks in helper_callbacks.py) importable, W&B offline, processes meeting on 127.0.0.1. The
    PYTHONPATH the tests run with stays behind ours (packages installed into a folder of their own)."""
    inherited_path = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    path = os.pathsep.join([str(PROJECT_ROOT / "src"), str(PROJECT_ROOT / "tests"), *inherited_path])
    # Not the W&B service of this test session (W&B puts its address in the environment): each
    # command starts its own, as a user's commands do, so a run id one command leaves is free for the next.
    inherited = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
    return inherited | {"PYTHONPATH": path, "WANDB_MODE": "offline", "MASTER_ADDR": "127.0.0.1"} | extra


def kill_group(process: subprocess.Popen) -> None:
    """Kill a command started by start_group and everything it started: ranks, data workers."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_group(command: list[str], **options) -> subprocess.Popen:
    """Start a command in a process group of its own, which tests kill whole when they are done with it."""
    options.setdefault("preexec_fn", as_from_a_terminal)
    return subprocess.Popen(command, start_new_session=True, **options)


def as_from_a_terminal() -> None:
    """In a command started by a test: SIGTERM and Ctrl-C as a terminal's command starts with them,
    whatever the test's process holds. pytest started as a background job (a script's `&`) has Ctrl-C
    ignored, and passed that on: a command then never heard the Ctrl-C its test sent."""
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def run_group(command: list[str], timeout: float, **options) -> subprocess.CompletedProcess:
    """subprocess.run(capture_output=True, text=True) in a process group of its own. The group is
    killed when the command ends or times out, so a multi-process command never outlives its test.
    The result's `silent_seconds`: how long the command ran on after its last line of output."""
    process = start_group(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)
    lines: dict = {process.stdout: [], process.stderr: []}
    last_line = [time.monotonic()]

    def read(stream) -> None:
        for line in stream:
            lines[stream].append(line)
            last_line[0] = time.monotonic()

    readers = [threading.Thread(target=read, args=(stream,), daemon=True) for stream in lines]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout
    try:
        process.wait(timeout=timeout)
        ended = time.monotonic()
        for reader in readers:  # what a process the command left behind still prints, until the deadline
            reader.join(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_group(process)
        for reader in readers:
            reader.join()
        stderr = "".join(lines[process.stderr])
        pytest.fail(f"{' '.join(command[:4])} ... did not end within {timeout} s:\n{stderr[-3000:]}")
    finally:
        kill_group(process)
    stdout, stderr = ("".join(lines[stream]) for stream in (process.stdout, process.stderr))
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    done.silent_seconds = ended - last_line[0]
    return done


@pytest.fixture
def groups():
    """start_group for commands a test drives itself; whatever is left of them is killed at its end."""
    started: list[subprocess.Popen] = []

    def start(command: list[str], **options) -> subprocess.Popen:
        started.append(start_group(command, **options))
        return started[-1]

    yield start
    for process in started:
        kill_group(process)
