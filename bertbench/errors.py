"""The exit-code policy of every bertbench command, and the one path from an error to its exit status.

- 0: done (a run stopped by its time budget or its target is done too).
- 2: usage or input error: a bad flag or value, a missing or malformed input file, a run directory that does not fit
  the command. Nothing was trained or overwritten; the one line on stderr names the flag or the file.
- 1: runtime failure: training diverged, the disk filled up, a device ran out of memory, a worker died.
- 128 + N: stopped by signal N (SIGINT 130, SIGTERM 143). In training, after saving what resumes the run; in any
  other phase (start-up, evaluation, prediction) at once. Either way every file written is whole: results and
  checkpoints are written to a temporary name and renamed, so a stop leaves the old file or the new one.

Commands report every error they expect in one line, `program: error: message`, never as a traceback; a signal is
one line too, `program: stopped by SIGTERM ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Callable

INPUT_ERROR = 2
RUNTIME_FAILURE = 1


class UsageError(ValueError):
    """Flags that cannot work together, a value out of range, or a run directory that does not fit the command."""


# Input a user gave that cannot be read: the file is named in the message.
INPUT_ERRORS = (UsageError, FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError,
                PermissionError, UnicodeDecodeError)


class Stopped(BaseException):
    """SIGTERM outside the training loop (which saves first, estimator.StopSignals): it unwinds the command as
    KeyboardInterrupt does for SIGINT, so locks are released and temporary files removed on the way out."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


def _raise_stopped(signum: int, frame) -> None:
    raise Stopped(signal.Signals(signum).name)


@contextlib.contextmanager
def stop_on_sigterm():
    """While active, SIGTERM raises Stopped (Python's default would end the process without a word)."""
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def signal_status(name: str) -> int:
    """The shell's exit status of a process stopped by the signal `name` ("SIGTERM" -> 143)."""
    return 128 + int(getattr(signal, name))


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def run_command(program: str, body: Callable[[], int | None], input_errors: tuple[type[BaseException], ...] = (),
                runtime_errors: tuple[type[BaseException], ...] = ()) -> int:
    """Run a command's body and map what it raises onto the exit-code policy, each error in one line. Input errors
    are INPUT_ERRORS plus the command's own (`input_errors`, e.g. a task's data error); runtime failures are
    `runtime_errors` and any other OSError (a full disk, a lost mount)."""
    try:
        with stop_on_sigterm():
            return body() or 0
    except SystemExit as stop:  # argparse: --help (0), or a bad flag already reported in one line (2)
        return stop.code or 0
    except INPUT_ERRORS + input_errors as error:
        print(f"{program}: error: {one_line(error)}", file=sys.stderr)
        return INPUT_ERROR
    except runtime_errors + (OSError, MemoryError) as error:
        print(f"{program}: error: {one_line(error)}", file=sys.stderr)
        return RUNTIME_FAILURE
    except (KeyboardInterrupt, Stopped) as stop:
        name = stop.signal_name if isinstance(stop, Stopped) else "SIGINT"
        print(f"{program}: stopped by {name}; every file already written is whole, none half-written",
              file=sys.stderr)
        return signal_status(name)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (no usage block above it), with exit status 2. A flag
    must be spelled out: argparse would take `--learning_rat` for `--learning_rate`, absl refuses it, and a typo
    that silently picks some flag is worse than an error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(INPUT_ERROR, f"{self.prog}: error: {message}\n")
