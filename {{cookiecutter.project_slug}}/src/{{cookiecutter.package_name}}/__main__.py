import atexit
import os
import sys
import threading

from .cli import main


def exit_without_teardown(status: int) -> None:
    """End the process as Python's exit does, less its last step: freeing every module object by object,
    which takes about a second once torch and Lightning are imported, with nothing left to write by then.
    What comes before it runs as Python runs it: the wait for running threads, the exit hooks (W&B's,
    the loggers', the data workers'), the flush of the output."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is not None and not stream.closed:
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            exit_without_teardown(done.code or 0)
        print(done.code, file=sys.stderr)  # sys.exit("error: ..."), as Python prints it
        exit_without_teardown(1)
    exit_without_teardown(0)
