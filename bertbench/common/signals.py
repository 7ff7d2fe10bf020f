"""What SIGTERM and SIGINT do to a bertbench process, in each phase of a command.

- Start-up (from bertbench/__init__.py's handle_signals_in_process, before torch is imported, until a command's body
  runs): nothing is written yet, so the process stops at once with the one line, 128 + N.
- A command's body (errors.run_command, under stop_on_sigterm): SIGTERM raises Stopped, SIGINT KeyboardInterrupt, so
  the command unwinds (locks released, temporary files removed) and run_command prints the line and returns 128 + N.
- The training loop (StopSignals): a signal is recorded, the loop saves at the next step boundary and returns; a
  second SIGINT raises KeyboardInterrupt at once.
- Once a command's work is done, and while Python shuts down: ignored, so the command's exit status stands.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from typing import Any, Self

STOPPED_LINE = "stopped by {}; every file already written is whole, none half-written"


class Stopped(BaseException):
    """SIGTERM outside the training loop (which saves first, StopSignals): it unwinds the command as
    KeyboardInterrupt does for SIGINT, so locks are released and temporary files removed on the way out."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


def signal_status(name: str) -> int:
    """The shell's exit status of a process stopped by the signal `name` ("SIGTERM" -> 143)."""
    return 128 + int(getattr(signal, name))


# What a signal does depends on the phase (see _on_signal): how many run_command bodies are under way, and whether
# one has ended (its work done).
_commands_running = 0
_command_done = False


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
    KeyboardInterrupt; the training loop saves first, StopSignals); once its work is done, it is ignored, also while
    Python shuts down (its finalization would put back the default handlers, which kill the process, but leaves an
    ignored signal ignored), so the command's status stands."""
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


class StopSignals:
    """The training loop's handlers: while active, SIGTERM/SIGINT set `received` so the loop can save and stop at
    the next step boundary. A second SIGINT raises KeyboardInterrupt at once, for a user who does not want to wait."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        print(
            f"\n{self.received} received: saving a checkpoint at the end of this step, then stopping",
            file=sys.stderr,
            flush=True,
        )

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
