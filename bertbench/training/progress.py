"""What a run shows while it runs: its log lines on stdout (`log`, through the `logging` logger "bertbench", whose
level `bertbench --quiet` / `--verbose` set) and a progress bar on a terminal (tqdm). The JSONL metrics log a
training run writes is training.metrics'."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

from tqdm import tqdm

from bertbench.common.errors import silence_stdout

# The run's own log, not the modules' loggers (bertbench.weights.hf ...), which propagate to the root logger as a
# library's should: only this one writes to stdout.
LOGGER = logging.getLogger("bertbench.run")
# `bertbench --quiet`: warnings only, no progress bars; `--verbose`: debug lines too, and an error's traceback above
# its one line (errors.run_command). Set in the environment as well, so that the processes torchrun starts inherit it.
LEVELS = {"quiet": logging.WARNING, "normal": logging.INFO, "verbose": logging.DEBUG}
VERBOSITY_VARIABLE = "BERTBENCH_VERBOSITY"


# tqdm makes its lock at the first line written through it; made here, at start-up, a signal that stops a command
# cannot come in the middle of making it (where tqdm's clean-up then fails on the lock it never made).
tqdm.get_lock()


def _stop_behind(error: BaseException) -> BaseException | None:
    """The stop (SIGTERM's Stopped, SIGINT's KeyboardInterrupt: exceptions that are not Exceptions) that `error` was
    raised while handling, if any."""
    cause = error.__context__
    while cause is not None and isinstance(cause, Exception):
        cause = cause.__context__
    return cause


class _StdoutHandler(logging.Handler):
    """Each line to the stdout of the moment (a test's capture, run_values' redirect), flushed, above any progress
    bar. When stdout's reader has gone (`| head`) the lines go to /dev/null from then on: the run goes on. A stop
    raised while a line is written (a signal) stops the command, even where tqdm's clean-up then raised an error of
    its own, which logging would report as "--- Logging error ---" and swallow."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            with tqdm.external_write_mode(sys.stdout):
                sys.stdout.write(self.format(record) + "\n")
                sys.stdout.flush()
        except BrokenPipeError:
            silence_stdout()
        except Exception as error:
            stop = _stop_behind(error)
            if stop is not None:
                raise stop from None
            self.handleError(record)


LOGGER.addHandler(_StdoutHandler())
LOGGER.propagate = False  # the command's own output, not a library's log for an application to route
LOGGER.setLevel(LEVELS.get(os.environ.get(VERBOSITY_VARIABLE, "normal"), logging.INFO))


def log(line: str) -> None:
    """A line of the run's log: a warning ("warning: ...") even under --quiet, any other line unless --quiet."""
    LOGGER.log(logging.WARNING if line.startswith("warning") else logging.INFO, line)


@contextlib.contextmanager
def verbosity(name: str) -> Iterator[None]:
    """The log's level (a key of LEVELS) for this process and those it starts, while active."""
    level, variable = LOGGER.level, os.environ.get(VERBOSITY_VARIABLE)
    LOGGER.setLevel(LEVELS[name])
    os.environ[VERBOSITY_VARIABLE] = name
    try:
        yield
    finally:
        LOGGER.setLevel(level)
        if variable is None:
            os.environ.pop(VERBOSITY_VARIABLE, None)
        else:
            os.environ[VERBOSITY_VARIABLE] = variable


def progress_bar(total: float, stream: IO[str] | None = None, enabled: bool | None = None, **options: Any) -> tqdm:
    """A tqdm bar on stderr, shown only while that is a terminal and the log is not --quiet (a batch job's output
    file or a pipe gets the log lines alone, which say the same); removed when closed, leaving the log lines."""
    stream = stream if stream is not None else sys.stderr
    if enabled is None:
        enabled = stream.isatty() and LOGGER.isEnabledFor(logging.INFO)
    return tqdm(total=total, file=stream, disable=not enabled, leave=False, dynamic_ncols=True, **options)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ProgressDisplay:
    """A training run's progress bar (progress_bar), redrawn at most every `refresh_secs`: the loop asks `due()`
    before it reads the figures, which costs a device synchronisation."""

    def __init__(
        self,
        total_steps: int,
        start_step: int = 0,
        stream: IO[str] | None = None,
        refresh_secs: float = 0.25,
        enabled: bool | None = None,
    ):
        # Time left is the loop's own figure (it knows the time budget), not tqdm's.
        self.bar = progress_bar(
            total_steps,
            stream,
            enabled,
            initial=start_step,
            unit="step",
            bar_format="step {n}/{total} |{bar}| {elapsed}{postfix}",
        )
        self.enabled, self.refresh_secs = not self.bar.disable, refresh_secs
        self._last_draw = -math.inf

    def due(self) -> bool:
        return self.enabled and time.monotonic() - self._last_draw >= self.refresh_secs

    def draw(self, step: int, loss: float, seq_per_s: float, eta_s: float) -> None:
        self.bar.n = step
        self.bar.set_postfix_str(f"eta {format_duration(eta_s)}, loss {loss:.4f}, {seq_per_s:.1f} seq/s", refresh=False)
        self.bar.refresh()
        self._last_draw = time.monotonic()

    def close(self) -> None:
        self.bar.close()
