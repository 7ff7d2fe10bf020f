"""The exit-code policy of every bertbench command, and the one path from an error to its exit status.

- 0: done (a run stopped by its time budget or its target is done too).
- 2: usage or input error: a bad flag or value, a missing or malformed input file, a run directory that does not fit
  the command. Nothing was trained or overwritten; the one line on stderr names the flag or the file.
- 1: runtime failure: training diverged, the disk filled up, a device ran out of memory, a worker died.
- 128 + N: stopped by signal N (SIGINT 130, SIGTERM 143). In training, after saving what resumes the run; in any
  other phase (start-up, evaluation, prediction) at once. Either way every file written is whole: results and
  checkpoints are written to a temporary name and renamed, so a stop leaves the old file or the new one
  (common/signals.py: what a signal does in each phase).
- 141 (128 + SIGPIPE): stdout was closed before the command was done printing (`bertbench ... | head`), without a
  word. A training run is not stopped by it: its log lines go to /dev/null from then on, and it trains and saves.

Commands report every error they expect in one line, `program: error: message`, never as a traceback; a signal is
one line too, `program: stopped by SIGTERM ...`.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import traceback
from collections.abc import Callable

from bertbench.common.signals import (
    STOPPED_LINE,
    Stopped,
    signal_status,
    stop_on_sigterm,
)

INPUT_ERROR = 2
RUNTIME_FAILURE = 1


class UsageError(ValueError):
    """Flags that cannot work together, a value out of range, or a run directory that does not fit the command."""


# Input a user gave that cannot be read: the file is named in the message.
INPUT_ERRORS = (
    UsageError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    UnicodeDecodeError,
)


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def stdout_closed() -> bool:
    """Whether the reader of stdout has gone (`bertbench ... | head` after head's last line)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test's StringIO), or no poll
        return False


def silence_stdout() -> None:
    """Point stdout at /dev/null, as Python's documentation advises after a BrokenPipeError (signal.SIGPIPE's
    note): a later line, and the flush at exit, then write nowhere instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


def run_command(
    program: str,
    body: Callable[[], int | None],
    input_errors: tuple[type[BaseException], ...] = (),
    runtime_errors: tuple[type[BaseException], ...] = (),
) -> int:
    """Run a command's body and map what it raises onto the exit-code policy, each error in one line (with
    `bertbench --verbose`, its traceback above it). Input errors are INPUT_ERRORS plus the command's own
    (`input_errors`, e.g. a task's data error); runtime failures are `runtime_errors` and any other OSError (a full
    disk, a lost mount). A closed stdout ends the command quietly with 141."""
    try:
        with stop_on_sigterm():
            try:
                status = body() or 0
            except SystemExit as stop:  # argparse: --help (0), or a bad flag already reported in one line (2)
                status = stop.code or 0
            sys.stdout.flush()  # here, where a closed pipe is caught, rather than at exit
            return status
    except BrokenPipeError as error:
        if not stdout_closed():  # another pipe than stdout (a worker's, a socket's): a runtime failure
            return _failed(program, error, RUNTIME_FAILURE)
        silence_stdout()
        return signal_status("SIGPIPE")
    except INPUT_ERRORS + input_errors as error:
        return _failed(program, error, INPUT_ERROR)
    except runtime_errors + (OSError, MemoryError) as error:
        return _failed(program, error, RUNTIME_FAILURE)
    except (KeyboardInterrupt, Stopped) as stop:
        name = stop.signal_name if isinstance(stop, Stopped) else "SIGINT"
        print(f"{program}: {STOPPED_LINE.format(name)}", file=sys.stderr)
        return signal_status(name)


def _failed(program: str, error: BaseException, status: int) -> int:
    if logging.getLogger("bertbench.run").isEnabledFor(logging.DEBUG):  # `bertbench --verbose` (progress.LOGGER)
        traceback.print_exception(error, file=sys.stderr)
    print(f"{program}: error: {one_line(error)}", file=sys.stderr)
    return status
