import atexit
import contextlib
import gc
import io
import os
import sys
import threading

from .cli import main

# What a file open for writing is, in its buffered or text form: flushed at the end, closed or not.
WRITTEN_FILES = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)


def exit_without_teardown(status: int) -> None:
    """End the process as Python's exit does, less its last step: freeing every module object by object,
    which takes about a second once torch and Lightning are imported. What comes before it runs as
    Python runs it: the wait for running threads, the exit hooks (W&B's, the loggers', the data
    workers'); then every file still open for writing is flushed, as freeing it would have done."""
    with contextlib.suppress(BaseException):  # a Ctrl-C while waiting for the threads: Python's exit goes on too
        threading._shutdown()
    atexit._run_exitfuncs()
    for written in [each for each in gc.get_objects() if type(each) in WRITTEN_FILES]:
        with contextlib.suppress(OSError, ValueError):  # a closed pipe, a full disk: as Python ignores them
            written.flush()
    os._exit(status)


if __name__ == "__main__":
    status = 0
    try:
        main()
    except SystemExit as done:
        if done.code is not None and not isinstance(done.code, int):
            print(done.code, file=sys.stderr)  # sys.exit("error: ..."), as Python prints it
        status = done.code if isinstance(done.code, int) else int(done.code is not None)
    exit_without_teardown(status)
