"""The runs under a folder: the one home of "the newest run", which resuming, the smoke test{{ "," if cookiecutter.inference == "yes" }}
{{ "report, classify and serve" if cookiecutter.serving == "yes" else "report and classify" if cookiecutter.inference == "yes" else "and report" }} all look up, of whether a run has finished, and of a run's
best checkpoint, which {{ "classify and serve use" if cookiecutter.serving == "yes" else "classify uses" if cookiecutter.inference == "yes" else "evaluations use" }} by default.

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
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn

from ..errors import PACKAGE, ConfigError, DataError, MissingError
from .checkpoint_io import complete_replace, write_whole

FINISHED = "finished.json"
IN_USE = ".in_use"  # locked by the process writing into the run; names it
SLURM_JOB = ".slurm_job"  # the SLURM job whose fit last trained the run, which it goes on with when requeued

if os.name == "nt":
    import msvcrt

    # Windows' locks keep readers out of the bytes they lock: one byte past the holder's name.
    def _lock(fd: int, mode: int = msvcrt.LK_NBLCK) -> None:
        os.lseek(fd, 2**20, os.SEEK_SET)
        msvcrt.locking(fd, mode, 1)

    def _try_lock(fd: int) -> None:
        _lock(fd)

    def _probe(fd: int) -> None:
        _lock(fd, msvcrt.LK_NBRLCK)
        _lock(fd, msvcrt.LK_UNLCK)

    def _unlock(fd: int) -> None:
        _lock(fd, msvcrt.LK_UNLCK)
else:
    import fcntl

    def _try_lock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _probe(fd: int) -> None:  # shared: two processes probing never see each other as the holder
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)

    def _unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


_held: dict[Path, int] = {}
# What locking raises where another process holds the lock; anything else is a file system without locks.
HELD_ELSEWHERE = {errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES, errno.EDEADLK}
# The last.ckpt `fit --ckpt_path auto` resumes ("" for a new run), as the first process chose it, in
# the environment of the processes Lightning's launcher starts from it: they take it, not choose again.
CHOSEN = f"{PACKAGE.upper()}_RESUMES"
CHOICE_SECONDS = 300  # how long a SLURM job's other tasks wait for the first one's choice
HOLD_SECONDS = 1.0  # how long hold_run waits out another process's look at the lock (trained_elsewhere)
REFUSED = "refused: "  # a choice file's first words where the first task stopped instead of choosing
_told: list[Path] = []  # the choices this process wrote for the other tasks of its SLURM job


def logger_run_folder(logger: Logger, default_root_dir: str) -> Path:
    """A logger's folder for its run, where Lightning puts the run's checkpoints: save_dir/name/version
    (W&B's project and run id)."""
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return Path(logger.save_dir or default_root_dir) / str(logger.name) / version


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
    with the server's lease). One process writes one run at a time (a command that trains several, in turn),
    so holding one lets go of the one before."""
    run = run.resolve()
    if run in _held:
        return
    try:
        run.mkdir(parents=True, exist_ok=True)
        fd = os.open(run / IN_USE, os.O_RDWR | os.O_CREAT, 0o644)
    except PermissionError:  # another user's run, in a project folder they share
        raise ConfigError(f"{run} cannot be written by this user: {instead(command)}") from None
    deadline = time.monotonic() + HOLD_SECONDS
    while True:
        try:
            _try_lock(fd)
            break
        except OSError as error:
            if error.errno in HELD_ELSEWHERE and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            holder = holder_named(fd)
            os.close(fd)
            if error.errno not in HELD_ELSEWHERE:
                rank_zero_warn(f"{run} cannot be locked ({error.strerror}): nothing keeps a second command out of it.")
                return
            raise in_use(run, holder, command) from None
    let_go_held()
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    holder = f"process {os.getpid()} on {socket.gethostname()} ({command}, since {time.strftime('%H:%M:%S')})"
    os.write(fd, holder.encode())
    os.fsync(fd)  # for the other machines of a cluster, which read it through the file system
    _held[run] = fd
    if command == "fit" and "SLURM_JOB_ID" in os.environ:
        write_whole(run / SLURM_JOB, os.environ["SLURM_JOB_ID"])


def in_use(run: Path, holder: str, command: str) -> ConfigError:
    said = f"{run} is in use by {holder or 'another process'}: wait until it ends, or meanwhile {instead(command)}"
    return ConfigError(said)


def instead(command: str) -> str:
    """What `command` can do where it cannot write into a run."""
    if command == "fit":
        return "train a run of your own (--ckpt_path auto passes over a run in use)."
    return "copy the checkpoint out of the runs folder and pass --ckpt_path <copy> (a run of its own)."


def holder_named(fd: int) -> str:
    """The process that an .in_use file names (empty once let go)."""
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 400).decode(errors="replace").strip()


def trained_elsewhere(run: Path) -> str | None:
    """The process training `run` when another process's fit holds it (another job in this project),
    else None. A run an evaluation holds is not passed over: the evaluation ends soon, hold_run says so."""
    run = run.resolve()
    if run in _held:
        return None
    try:
        fd = os.open(run / IN_USE, os.O_RDONLY)
    except OSError:
        return None  # never held; one that cannot be read, hold_run will name
    try:
        _probe(fd)
        return None
    except OSError as error:
        holder = holder_named(fd) if error.errno in HELD_ELSEWHERE else ""
        return holder if " (fit, since " in holder else None
    finally:
        os.close(fd)


def is_first_process() -> bool:
    """Rank 0 of the whole run, known before the trainer is (Lightning's rank from RANK, LOCAL_RANK or
    SLURM_PROCID; a launch by hand on each node sets only NODE_RANK beside LOCAL_RANK)."""
    return rank_zero_only.rank == 0 and os.environ.get("NODE_RANK", "0") == "0"


def run_to_resume(root: Path, unfinished: list[Path]) -> Path | None:
    """The last.ckpt that `fit --ckpt_path auto` resumes, of the unfinished runs' (oldest first), the
    same on every process: the newest that no other fit is training, as the first process finds it.
    The processes that Lightning's launcher starts from the first take its choice from their
    environment, a SLURM job's other tasks from a file it writes for them. Where processes start on
    their own otherwise (torchrun, by hand on each node), none passes over a run: each finds the same."""
    env, first = os.environ, is_first_process()
    if not first and CHOSEN in env:
        return Path(env[CHOSEN]) if env[CHOSEN] else None
    tasks = int(env.get("SLURM_NTASKS", "1")) > 1 and "SLURM_PROCID" in env
    # Each start of a job's tasks has a name of its own: a requeue counts its restarts.
    start = (env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID"), env.get("SLURM_RESTART_COUNT", "0"))
    told = root / ".resumes" / ".".join(map(str, start))
    if tasks and not first:
        return wait_for_choice(told)
    apart = int(env.get("WORLD_SIZE", "1")) > 1 or "NODE_RANK" in env or "TORCHELASTIC_RUN_ID" in env
    if not first or (apart and not tasks):
        return unfinished[-1] if unfinished else None
    chosen = next((last for last in reversed(unfinished) if not passed_over(last)), None)
    env[CHOSEN] = str(chosen or "")
    if tasks:
        told.parent.mkdir(parents=True, exist_ok=True)
        write_whole(told, str(chosen or ""))
        _told.append(told)
    return chosen


def passed_over(last: Path) -> bool:
    if holder := trained_elsewhere(last.parent.parent):
        rank_zero_info(f"--ckpt_path auto: passing over {last.parent.parent}, which {holder} is training")
    return bool(holder)


def wait_for_choice(told: Path) -> Path | None:
    deadline = time.monotonic() + CHOICE_SECONDS
    while not told.is_file():
        if time.monotonic() > deadline:
            raise ConfigError(
                f"--ckpt_path auto: the job's first task did not say within {CHOICE_SECONDS} s which run it resumes "
                f"(in {told}). Every node must see the runs folder (a shared file system)."
            )
        time.sleep(0.2)
    chosen = told.read_text()
    if chosen.startswith(REFUSED):
        raise ConfigError(f"The job's first task stopped: {chosen.removeprefix(REFUSED)}")
    return Path(chosen) if chosen else None


def refuse_choice(said: str) -> None:
    """Tell the job's other tasks, which wait for the run this one chose, that it stopped instead, and
    why (`said`): without kill-on-bad-exit they would wait CHOICE_SECONDS, then blame the file system."""
    for told in _told:
        with contextlib.suppress(OSError):  # a full disk, the very error told: they wait, as before
            write_whole(told, f"{REFUSED}{said}")
    _told.clear()  # left for them to read, as leave_choice does


def release_run() -> None:
    """Let go of the run this process holds, and of the choice it told: the command has ended."""
    let_go_held()
    for told in _told:
        told.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # another start's choice is still there
            told.parent.rmdir()
    _told.clear()
    os.environ.pop(CHOSEN, None)


def leave_choice() -> None:
    """Leave the choice told to the job's other tasks where it is, for them to read: this process ends
    before they would start training with it."""
    _told.clear()


def let_go_held() -> None:
    for fd in _held.values():
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # names no process once none holds it
            _unlock(fd)  # at once: Windows lets go of a closed file's lock when it gets to it
        os.close(fd)
    _held.clear()


def mark_finished(checkpoints: Path, epoch: int, step: int) -> None:
    write_whole(checkpoints / FINISHED, json.dumps({"epoch": epoch, "step": step}) + "\n")


def trained_by_job(lasts: list[Path], job: str) -> Path | None:
    """The newest of `lasts` whose run SLURM job `job` trained last."""
    for last in reversed(lasts):
        with contextlib.suppress(OSError):
            if (last.parent.parent / SLURM_JOB).read_text().strip() == job:
                return last
    return None


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
    try:
        saved = torch.load(last, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # whatever torch.load makes of a file that is no checkpoint: damaged, cut short
        unreadable = f"The newest run's {last} cannot be read as a checkpoint"
        raise DataError(f"{unreadable}: pass {option}, or move that run's folder away.") from error
    states = saved.get("callbacks", {}) if isinstance(saved, dict) else {}
    for key, state in states.items():
        # The callback that monitors a metric: the one that writes last.ckpt monitors none.
        best = state.get("best_model_path") if key.startswith("ModelCheckpoint") and state.get("monitor") else None
        if best:
            # Recorded as the path the run saw, maybe relative to another folder: look beside last.ckpt.
            found = next((path for path in (Path(best), last.parent / Path(best).name) if path.exists()), None)
            if found is not None:
                return found
    return last
