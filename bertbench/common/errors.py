"""The exit-code policy of every bertbench command, and the one path from an error to its exit status.

- 0: done (a run stopped by its time budget or its target is done too).
- 2: usage or input error: a bad flag or value, a missing or malformed input file, a run directory that does not fit
  the command. Nothing was trained or overwritten; the one line on stderr names the flag or the file.
- 1: runtime failure: training diverged, the disk filled up, a device ran out of memory, a worker died.
- 128 + N: stopped by signal N (SIGINT 130, SIGTERM 143). In training, after saving what resumes the run; in any
  other phase (start-up, evaluation, prediction) at once. Either way every file written is whole: results and
  checkpoints are written to a temporary name and renamed, so a stop leaves the old file or the new one.
- 141 (128 + SIGPIPE): stdout was closed before the command was done printing (`bertbench ... | head`), without a
  word. A training run is not stopped by it: its log lines go to /dev/null from then on, and it trains and saves.

Commands report every error they expect in one line, `program: error: message`, never as a traceback; a signal is
one line too, `program: stopped by SIGTERM ...`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import select
import signal
import sys
import threading
import traceback
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


# What a signal does depends on the phase (see _on_signal): how many run_command bodies are under way, and whether
# one has ended (its work done).
_commands_running = 0
_command_done = False
STOPPED_LINE = "stopped by {}; every file already written is whole, none half-written"


def _on_signal(signum: int, frame) -> None:
    name = signal.Signals(signum).name
    if _commands_running:  # a command's body: unwind it (run_command prints the line, 128 + N)
        raise KeyboardInterrupt if signum == signal.SIGINT else Stopped(name)
    if _command_done:  # its work is done and its status stands: exit with it
        return
    # Start-up, before any command ran (handle_signals_in_process): nothing is written yet, so stop at once.
    program = os.path.basename(sys.argv[0] if sys.argv else "").removesuffix(".py")
    program = "bertbench" if program in ("", "-m", "-c", "__main__") else program
    os.write(2, f"{program}: {STOPPED_LINE.format(name)}\n".encode())
    os._exit(signal_status(name))


def handle_signals_in_process() -> None:
    """Make SIGTERM and SIGINT this process's to handle, from now until it exits: bertbench/__init__.py calls it
    first thing in a bertbench command, before torch is imported (seconds). Until a command runs (run_command), a
    signal stops the process at once with the one line; while it runs, it unwinds the command (Stopped,
    KeyboardInterrupt; the training loop saves first, estimator.StopSignals); once its work is done, it is ignored,
    also while Python shuts down (its finalization would put back the default handlers, which kill the process, but
    leaves an ignored signal ignored), so the command's status stands."""
    if threading.current_thread() is threading.main_thread():  # handlers can only be set there
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _on_signal)
            # Registered first, so run last, after the other exit handlers (which may take a while: torch's,
            # joining worker processes); until then _on_signal ignores a signal after the command.
            atexit.register(signal.signal, signum, signal.SIG_IGN)


@contextlib.contextmanager
def stop_on_sigterm():
    """While active, SIGTERM raises Stopped (Python's default would end the process without a word). Afterwards the
    handler before it is back (in a bertbench command, handle_signals_in_process's, which ignores a SIGTERM once the
    command's work is done)."""
    global _commands_running, _command_done
    main = threading.current_thread() is threading.main_thread()  # handlers can only be set there
    _commands_running += 1
    previous = signal.signal(signal.SIGTERM, _on_signal) if main else None
    try:
        yield
    finally:
        if _commands_running == 1:
            _command_done = True  # before the count drops: no moment in between looks like start-up
        _commands_running -= 1
        if main:
            signal.signal(signal.SIGTERM, previous)


def signal_status(name: str) -> int:
    """The shell's exit status of a process stopped by the signal `name` ("SIGTERM" -> 143)."""
    return 128 + int(getattr(signal, name))


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


def run_command(program: str, body: Callable[[], int | None], input_errors: tuple[type[BaseException], ...] = (),
                runtime_errors: tuple[type[BaseException], ...] = ()) -> int:
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


def help_with_default(help: str, default) -> str:
    """An option's --help text with its default once: added after the text unless the text gives it already (a
    default said in words) or there is none (None). A list reads as typed, 1,2,4. Escaped for argparse's %-format."""
    if default is None or default is argparse.SUPPRESS or "(default" in help or "%(default)" in help:
        return help
    shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
    return f"{help} (default: {shown.replace('%', '%%')})"


def description(doc: str) -> str:
    """A command's --help description: its module docstring's first paragraph (a first line alone may stop
    mid-sentence)."""
    return " ".join(doc.split("\n\n")[0].split())


class HelpFormatter(argparse.HelpFormatter):
    """Every bertbench --help: each default shown once (help_with_default), none for an on/off switch."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        return help if action.nargs == 0 else help_with_default(help, action.default)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (no usage block above it), with exit status 2, and whose
    --help shows each default once (HelpFormatter). A flag must be spelled out: argparse would take
    `--learning_rat` for `--learning_rate`, absl refuses it, and a typo that silently picks some flag is worse than
    an error."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(INPUT_ERROR, f"{self.prog}: error: {message}\n")
