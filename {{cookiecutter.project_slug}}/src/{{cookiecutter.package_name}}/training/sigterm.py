"""A SIGTERM sent to a whole process group (scancel, `timeout`, a terminal, `docker stop` of a shell
script) reaches a command's helper processes at the same moment as the command itself. Each helper
(a data worker, or another helper process) leaves it to the command, which stops in order and
then ends its helpers itself: a helper that died first would lose a checkpoint or a request. And
a SIGTERM or Ctrl-C ends a command that waits for its other processes in torch's code
(ends_while_blocked)."""

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from multiprocessing import forkserver, resource_tracker

from lightning.fabric.plugins.environments import SLURMEnvironment


def signal_said(signum: int) -> str:
    """A stop's signal as a user names it: Ctrl-C, or SIGTERM (Slurm, docker stop, kill)."""
    return "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"


# The signal SLURM sends a job before its time limit where the job asks for it as Lightning's docs do
# (--signal=USR1@90): taken as a SIGTERM (requeue_signal_as_sigterm), and left to the command by its helpers.
REQUEUE_SIGNALS = {signal.SIGUSR1} if hasattr(signal, "SIGUSR1") else set()


def requeue_signal_as_sigterm(trainer) -> None:
    """Under SLURM, stop on Lightning's requeue signal as on SIGTERM. Lightning's own handler saves a
    checkpoint inside the handler, where under DDP it waits for the other processes, which are in a step:
    for ever. scripts/slurm.sbatch requeues the job itself. A handler set before (the user's) stays."""
    environment = trainer._accelerator_connector.cluster_environment  # what Lightning's handlers read
    if not isinstance(environment, SLURMEnvironment) or environment.requeue_signal not in REQUEUE_SIGNALS:
        return
    on_main_thread = threading.current_thread() is threading.main_thread()  # where Python takes signals
    if on_main_thread and signal.getsignal(environment.requeue_signal) in (signal.SIG_DFL, _as_sigterm):
        environment.auto_requeue = False
        signal.signal(environment.requeue_signal, _as_sigterm)


def _as_sigterm(signum: int, frame) -> None:
    signal.raise_signal(signal.SIGTERM)


def leave_to(owner: int) -> None:
    """In a helper process: a SIGTERM from `owner` still ends it (through the handler it sets, or at
    once), and one from anyone else is left to `owner` while it lives; a helper whose owner has ended
    without ending it (killed outright) ends within a second. Linux only: elsewhere helpers start by
    spawn and keep the default."""
    # Ctrl-C, which a terminal sends the whole group, is the owner's alone: a worker it ended would
    # fail the step the owner finishes before it saves (CheckpointOnStop), an HTTP server the requests
    # it had taken. Blocked below too, as a library may set a handler of its own (uvicorn does).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for requeue in REQUEUE_SIGNALS:  # its default would end this helper: the command stops on it, then ends it
        signal.signal(requeue, signal.SIG_IGN)
    if not hasattr(signal, "sigtimedwait"):
        return
    # Threads started from here on inherit the mask; one started before would take the signal itself.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    args = (owner, os.getppid())
    threading.Thread(target=_end_on_sigterm_from, args=args, name="sigterm-watch", daemon=True).start()


def start_forkserver() -> None:
    """Start multiprocessing's fork server, unless it runs, with SIGTERM blocked. A SIGTERM to the
    whole group would otherwise end the server, and PyTorch's data workers take their parent's end
    for their command's and stop, before the command has saved its checkpoint. What it forks starts
    with the mask too, so that a worker the signal reaches before it leaves SIGTERM to the command
    (leave_to) keeps it pending; another process forked by this server (the forkserver context's,
    Python 3.14's default) needs SIGKILL. The server ends once the command and its workers have."""
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, REQUEUE_SIGNALS)  # whose default would end them too
    try:
        resource_tracker.ensure_running()  # started first, as starting it unblocks SIGTERM
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def process_alive(pid: int) -> bool:
    """Whether `pid` runs: it exists (someone else's too) and is no zombie, dead but not yet reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):  # no /proc: a zombie counts as running
        return True


def owner_gone(owner: int, parent: int) -> bool:
    """Whether `owner` has ended: a helper whose parent died has another at once."""
    return os.getppid() != parent or not process_alive(owner)


def _end_on_sigterm_from(owner: int, parent: int) -> None:
    # Another's SIGTERM is taken and dropped: the owner has the same signal, and ends this process
    # when it is ready. Unless the owner has ended without doing so (killed outright, or by that
    # SIGTERM with no handler of its own): looked at each second, as nothing else would end it.
    while not owner_gone(owner, parent):
        received = signal.sigtimedwait({signal.SIGTERM, signal.SIGINT}, 1.0)  # a Ctrl-C is dropped
        if received is not None and received.si_signo == signal.SIGTERM and received.si_pid == owner:
            break
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        os._exit(0)  # status 0: a DataLoader counts a worker killed by a signal as a crash
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # this thread's mask only
    signal.raise_signal(signal.SIGTERM)  # Python runs the handler in the main thread


@contextlib.contextmanager
def ends_while_blocked(on_stop: Callable[[int], None]) -> Iterator[None]:
    """A SIGTERM or Ctrl-C that has not ended the block a second later, as the main thread waits in
    code that does not return to Python (where the handlers run), ends the process: `on_stop(signum)`,
    then the status the signal's default would give. torch's rendezvous is such a wait: the processes
    of a run that never all start (a node that failed, num_nodes larger than the nodes launched) wait
    there for half an hour. Python's C handler tells a watcher thread of each signal through the
    wakeup fd; the handlers in place meanwhile raise, which ends the block and the watch with it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read, write = os.pipe()
    os.set_blocking(write, False)
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    left = threading.Event()

    def watch() -> None:
        while signum := os.read(read, 1)[0]:  # 0: the block has ended
            if signum in (signal.SIGTERM, signal.SIGINT) and not left.wait(1.0):
                try:
                    on_stop(signum)
                finally:  # whatever on_stop met: nothing else would end the process
                    sys.stdout.flush()
                    os._exit(128 + signum)

    watcher = threading.Thread(target=watch, name="stop-while-blocked", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        left.set()
        signal.set_wakeup_fd(previous)
        os.write(write, b"\0")
        watcher.join()
        os.close(read)
        os.close(write)
