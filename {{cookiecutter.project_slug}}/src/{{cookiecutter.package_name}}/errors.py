"""Mistakes in the options, the data or the files, which the command line tells in one line.

`python -m {{ cookiecutter.package_name }}` prints any of these as `error: <message>`, with no traceback: the message
names the problem and its fix. Set {{ cookiecutter.package_name | upper }}_TRACEBACK=1 to see the traceback anyway.
Each class is also the built-in error it stands for, for code that catches that.
"""

import argparse
import difflib
import errno
import os
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

# The import name, which every command line starts with (python -m PACKAGE ...), from any module.
PACKAGE = __spec__.parent
TRACEBACK_VARIABLE = "{{ cookiecutter.package_name | upper }}_TRACEBACK"
# The first line of what a collective raises in a process whose peer has ended (gloo's closed or reset
# connection, NCCL's aborted communicator or remote error), or has not come within the strategy's timeout.
GLOO = r"gloo/\S+\] "  # the source file's path that begins gloo's messages
PEER_GONE = re.compile(rf"{GLOO}.*(by peer|Broken pipe)|NCCL communicator was aborted|remote process exited")
PEER_LATE = re.compile(rf"{GLOO}.*Timed out waiting \d+ms|^Application timeout caused pair closure|Watchdog caught")
# The file system's refusals, each with its fix: whatever the command was writing (a checkpoint, a CSV).
REFUSED_WRITES = {
    errno.ENOSPC: "free some space, or write elsewhere",
    errno.EDQUOT: "free some of your quota, or write elsewhere",
    errno.EFBIG: "raise the file-size limit (ulimit -f), or write elsewhere",
    errno.EROFS: "write to a folder outside it",
    errno.EACCES: "use a path this user may write and read",
    errno.EPERM: "use a path this user may write and read",
}


class UserError(Exception):
    """A problem the user can fix, told by the message."""


class ConfigError(UserError, ValueError):
    """Options that cannot work, alone or together."""


class DataError(UserError, ValueError):
    """Data whose folders, classes or images cannot be used as they are."""


class MissingError(UserError, FileNotFoundError):
    """A file or folder that is not where the options say."""


class CommandParser(argparse.ArgumentParser):
    """The parser of a command outside LightningCLI (doctor, report, ...), whose mistakes end as the
    CLI's do: in one line, `error: <message>`, rather than argparse's usage and then the message."""

    def __init__(self, prog: str, **kwargs) -> None:
        # The usage line runs as it is; an abbreviation would be taken for an option, as fit takes none.
        super().__init__(prog=f"python -m {prog}", allow_abbrev=False, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} ({self.prog} --help lists the arguments)")

{%- if cookiecutter.inference == "yes" or cookiecutter.tuning == "yes" or cookiecutter.experiments == "yes" %}

    def check_at_least(self, options: argparse.Namespace, least: dict[str, int]) -> None:
        """Refuse a count below its least, such as --steps 0, which would time or search nothing."""
        for name, minimum in least.items():
            if (value := getattr(options, name.lstrip("-").replace("-", "_"))) < minimum:
                self.error(f"{name} must be {minimum} or more, got {value}")
{%- endif %}

    def parse_known_args(self, args=None, namespace=None):
        """This command's options, and the rest, for `fit` (of the commands that train runs); a misspelling
        of one of this command's own is refused here, where fit's parser would offer the closest of its own."""
        known, rest = super().parse_known_args(args, namespace)
        own = [name for action in self._actions for name in action.option_strings if name.startswith("--")]
        for arg in rest:
            name = arg.partition("=")[0]
            if name.startswith("--") and "." not in name and (meant := difflib.get_close_matches(name, own, 1, 0.8)):
                self.error(f"unrecognized argument {name}: did you mean {meant[0]}?")
        return known, rest


def check_output_file(path: Path, option: str, what: str) -> None:
    """Refuse, before any work, a file to write that cannot be one: a folder, or a path under a file or
    a broken link."""
    if path.is_dir():
        raise ConfigError(f"{option} {path} is a folder: name the {what} to write.")
    if not (above := next(parent for parent in path.parents if os.path.lexists(parent))).is_dir():
        raise ConfigError(f"{option} {path} is under {above}, which is not a folder: name a path in a folder.")


def check_choices(function: Callable, given: dict, group: str) -> None:
    """Refuse a text option outside the choices its type names (a Literal), as the CLI refuses it, where
    Python code gives it: `augment="foo"` would otherwise run as another choice."""
    for name, hint in typing.get_type_hints(function).items():
        choices = literal_choices(hint)
        value = given.get(name)
        if choices and isinstance(value, str) and value not in choices:
            meant = likely_meant(value, [str(choice) for choice in choices], n=1)
            raise ConfigError(
                f"{group}.{name} must be one of {', '.join(map(str, choices))}, got {value!r}"
                + (f" (did you mean {meant}?)" if meant else "")
            )


def literal_choices(hint) -> list:
    """Every value of the Literals in a type hint, in unions too (`Literal["a"] | None`; Lightning's
    precision, ints and texts)."""
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    return [value for part in typing.get_args(hint) for value in literal_choices(part)]


def changed_settings(before: dict, now: dict) -> str:
    """The settings that differ, as `name before -> now` (the first three), or "" where none does. One
    that only one side has (an option the code gained or lost since) is left out."""
    changed = [f"{name} {was!r} -> {now[name]!r}" for name, was in before.items() if name in now and was != now[name]]
    return ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")


def closest(name: str, known: list[str], count: int = 5) -> list[str]:
    """The `count` names in `known` most like `name`, most alike first, for a "did you mean"."""
    return difflib.get_close_matches(name, known, n=count, cutoff=0.0)


def likely_meant(word: str, names: list[str], n: int = 3) -> str:
    """The names `word` is likely a misspelling of, best first ("a or b"); empty where none is close."""
    return " or ".join(difflib.get_close_matches(word, names, n=n, cutoff=0.6))


def wants_traceback() -> bool:
    return os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")


def other_process_gone(error: BaseException) -> str | None:
    """The line for a collective's error in a process of a run whose other process ended first (whose
    own error is the one to read) or never came; None for any other error. Without it, one process's
    `error:` line would be followed by a hundred lines of the other's traceback."""
    dist = sys.modules.get("torch.distributed")  # never imported just to find no run
    if not (isinstance(error, RuntimeError) and dist and dist.is_available() and dist.is_initialized()):
        return None
    if dist.get_world_size() < 2:
        return None
    this, said = f"process {dist.get_rank()} of {dist.get_world_size()} stopped", str(error).partition("\n")[0]
    if PEER_GONE.search(said):
        return (
            f"{this}: another process of this run ended first (its error is above; a process that printed none "
            "was killed, by a signal or for lack of memory)"
        )
    if PEER_LATE.search(said):
        return (
            f"{this}: another process of this run did not reach the same step within the timeout "
            "(trainer.strategy.init_args.timeout): it is stuck, or far slower at something only it does"
        )
    return None


def refused_by_file_system(error: BaseException) -> str | None:
    """The line for a file system's refusal (a full disk, a read-only folder, a missing permission) of
    any command's writing or reading; None for any other error."""
    if not isinstance(error, OSError) or (fix := REFUSED_WRITES.get(error.errno)) is None:
        return None
    return f"{error.strerror}{f': {error.filename}' if error.filename else ''} ({fix})"


def one_line(error: BaseException) -> str:
    """The message of `error`, without the traceback that torch adds when it re-raises an error of a
    data-loading worker ("Caught ... in DataLoader worker process 0. Original Traceback ...")."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    if len(lines) > 1 and "Original Traceback" in lines[1]:
        return lines[-1].split(": ", 1)[-1]
    return " ".join(line.strip() for line in lines)
