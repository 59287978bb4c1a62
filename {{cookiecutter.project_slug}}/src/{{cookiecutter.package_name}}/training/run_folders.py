"""The runs under a folder: the one home of "the newest run", which resuming, the smoke test,
{{ "report, classify and serve" if cookiecutter.serving == "yes" else "report and classify" }} all look up, of whether a run has finished, and of a run's
best checkpoint, which {{ "classify and serve use" if cookiecutter.serving == "yes" else "classify uses" }} by default.

A run is a folder <root>/<name>/<version> whose checkpoints/ holds last.ckpt (a file, or a folder of
shards); the newest is the one whose last.ckpt was written last. A run that ends (its epochs done,
early stopping) leaves checkpoints/finished.json; an interrupted one (SIGTERM, a crash) does not.
"""

import contextlib
import errno
import json
import os
import socket
import time
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_warn

from ..errors import PACKAGE, ConfigError, MissingError
from .checkpoint_io import complete_replace, write_whole

FINISHED = "finished.json"
IN_USE = ".in_use"  # locked by the process writing into the run; names it

if os.name == "nt":
    import msvcrt

    # Windows' locks keep readers out of the bytes they lock: one byte past the holder's name.
    def _try_lock(fd: int) -> None:
        os.lseek(fd, 2**20, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)

    def _unlock(fd: int) -> None:
        os.lseek(fd, 2**20, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _try_lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


_held: dict[Path, int] = {}
# What locking raises where another process holds the lock; anything else is a file system without locks.
HELD_ELSEWHERE = {errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES, errno.EDEADLK}
# The launch of the process holding a run, for the processes Lightning's launcher starts from it.
LAUNCH = f"{PACKAGE.upper()}_LAUNCH"


def last_checkpoints(root: Path) -> list[Path]:
    """The last.ckpt of every run under `root` (a file, or a folder of shards), oldest first."""
    lasts = [checkpoints / "last.ckpt" for checkpoints in root.glob("**/checkpoints")]
    for last in lasts:
        with contextlib.suppress(OSError):  # a read-only folder stays as it is
            complete_replace(last)  # a save killed between its two renames
    return sorted((last for last in lasts if last.exists()), key=os.path.getmtime)


def finished(last: Path) -> bool:
    """Whether the run of a last.ckpt has ended (rather than been interrupted)."""
    return (last.parent / FINISHED).is_file()


def newest_run(root: Path) -> Path:
    """The folder of the newest run under `root`."""
    lasts = last_checkpoints(root)
    if not lasts:
        raise MissingError(f"No run under {root} has a checkpoints/last.ckpt: train a model first.")
    return lasts[-1].parent.parent


def check_writable(folder: Path, option: str) -> None:
    """Fail in one line, before training, where the runs cannot be written (a read-only mount, a
    file in the way), rather than at the first log line or checkpoint. Nothing is created."""
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    reason = (
        "is not a folder" if not existing.is_dir() else "" if os.access(existing, os.W_OK | os.X_OK) else "is read-only"
    )
    if reason:
        raise ConfigError(
            f"Cannot write the runs into {folder} ({existing} {reason}): point {option} at a folder you can write."
        )


def hold_run(run: Path, command: str) -> None:
    """Hold `run` for this process, or refuse in one line if another process holds it. Two writing into
    one run (a `test` beside its fit, two resumes) would mix metrics.csv's rows under different columns
    and W&B's steps. The OS lock goes with the process however it ends (on NFS, after a node's crash,
    with the server's lease). One process writes one run at a time (cv and sweep train theirs in turn),
    so holding one lets go of the one before."""
    run = run.resolve()
    if run in _held:
        return
    run.mkdir(parents=True, exist_ok=True)
    fd = os.open(run / IN_USE, os.O_RDWR | os.O_CREAT, 0o644)
    for attempt in range(10):  # another launch's check (held_elsewhere) holds the lock for a moment
        try:
            _try_lock(fd)
            break
        except OSError as error:
            if error.errno in HELD_ELSEWHERE and attempt < 9:
                time.sleep(0.1)
                continue
            holder, _ = named_in(fd)
            os.close(fd)
            if error.errno not in HELD_ELSEWHERE:
                rank_zero_warn(f"{run} cannot be locked ({error.strerror}): nothing keeps a second command out of it.")
                return
            raise ConfigError(
                f"{run} is in use by {holder or 'another process'}: wait until it ends. To evaluate one of its "
                "checkpoints meanwhile, copy the file out of the runs folder and pass --ckpt_path <copy>: "
                "it is logged as a run of its own."
            ) from None
    release_run()
    os.environ[LAUNCH] = launch = launch_id()  # Lightning's launcher starts the other processes with it
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"process {os.getpid()} ({command}, since {time.strftime('%H:%M:%S')})\n{launch}".encode())
    _held[run] = fd


def named_in(fd: int) -> tuple[str, str]:
    """The process that an .in_use file names and its launch (empty once let go)."""
    os.lseek(fd, 0, os.SEEK_SET)
    holder, _, launch = os.read(fd, 400).decode(errors="replace").partition("\n")
    return holder.strip(), launch


def launch_id() -> str:
    """What the processes of one launch share and no other launch does: the SLURM job, torchrun's
    rendezvous, or the first process, which Lightning's launcher names to the others (LAUNCH)."""
    env = os.environ
    if "SLURM_JOB_ID" in env:
        return f"slurm job {env['SLURM_JOB_ID']}"
    if "TORCHELASTIC_RUN_ID" in env:
        return f"torchrun {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
    return env.get(LAUNCH) or f"process {os.getpid()} on {socket.gethostname()}"


def held_elsewhere(run: Path) -> str | None:
    """The process holding `run` when it is another launch's (a second job in the project), else None.
    Every process of a launch answers alike: the one holding the run is this launch's first."""
    run = run.resolve()
    if run in _held:
        return None
    try:
        fd = os.open(run / IN_USE, os.O_RDWR)
    except OSError:
        return None  # never held, or not ours to lock: hold_run will say
    try:
        holder, launch = named_in(fd)
        if not holder or launch == launch_id():
            return None
        try:
            _try_lock(fd)
        except OSError as error:
            return holder if error.errno in HELD_ELSEWHERE else None
        _unlock(fd)
        return None
    finally:
        os.close(fd)


def release_run() -> None:
    """Let go of the run this process holds: the command that wrote into it has ended."""
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # names no process once none holds it
        os.close(fd)
    _held.clear()
    os.environ.pop(LAUNCH, None)


def mark_finished(checkpoints: Path, epoch: int, step: int) -> None:
    write_whole(checkpoints / FINISHED, json.dumps({"epoch": epoch, "step": step}) + "\n")


def mark_unfinished(checkpoints: Path) -> None:
    """A finished run trained further (--ckpt_path last) is unfinished until it ends again."""
    (checkpoints / FINISHED).unlink(missing_ok=True)


def best_checkpoint(runs: Path, option: str) -> Path:
    """The best checkpoint of the newest run, as its ModelCheckpoint recorded it in last.ckpt
    (whatever the metric it monitors or its file names), else that last.ckpt. `option` names another."""
    lasts = last_checkpoints(runs)
    if not lasts:
        raise MissingError(f"No checkpoint under {runs}: train a model first, or pass {option}.")
    last = lasts[-1]  # newest_run's
    if last.is_dir():  # shards (FSDP, DeepSpeed), whose callbacks' states only the strategy reads
        return last
    states = torch.load(last, map_location="cpu", weights_only=True, mmap=True).get("callbacks", {})
    for key, state in states.items():
        # The callback that monitors a metric: the one that writes last.ckpt monitors none.
        best = state.get("best_model_path") if key.startswith("ModelCheckpoint") and state.get("monitor") else None
        if best:
            # Recorded as the path the run saw, maybe relative to another folder: look beside last.ckpt.
            found = next((path for path in (Path(best), last.parent / Path(best).name) if path.exists()), None)
            if found is not None:
                return found
    return last
