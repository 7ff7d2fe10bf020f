"""What a run shows while it runs: its log lines on stdout (`log`, through the `logging` logger "bertbench", whose
level `bertbench --quiet` / `--verbose` set), a progress bar on a terminal (tqdm), and a training run's JSONL metrics
log (one JSON object per logged step, so `pandas.read_json(path, lines=True)` reads it)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

from tqdm import tqdm

from bertbench.common.durable import write_failure, write_text_atomically
from bertbench.common.errors import silence_stdout

# The run's own log, not the modules' loggers (bertbench.weights.hf ...), which propagate to the root logger as a
# library's should: only this one writes to stdout.
LOGGER = logging.getLogger("bertbench.run")
# `bertbench --quiet`: warnings only, no progress bars; `--verbose`: debug lines too, and an error's traceback above
# its one line (errors.run_command). Set in the environment as well, so that the processes torchrun starts inherit it.
LEVELS = {"quiet": logging.WARNING, "normal": logging.INFO, "verbose": logging.DEBUG}
VERBOSITY_VARIABLE = "BERTBENCH_VERBOSITY"


class _StdoutHandler(logging.Handler):
    """Each line to the stdout of the moment (a test's capture, run_values' redirect), flushed, above any progress
    bar. When stdout's reader has gone (`| head`) the lines go to /dev/null from then on: the run goes on."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            with tqdm.external_write_mode(sys.stdout):
                sys.stdout.write(self.format(record) + "\n")
                sys.stdout.flush()
        except BrokenPipeError:
            silence_stdout()
        except Exception:
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


class MetricsLog:
    """Appends records to a JSONL file. On resume it first drops the records of steps after the checkpoint, which
    the killed run logged but the resumed run will do again, so the log tells the history of the saved weights."""

    def __init__(self, path: str | os.PathLike, resume_step: int | None = None,
                 log: Callable[[str], None] = lambda line: None):
        self.path = os.fspath(path)
        if resume_step is not None and os.path.isfile(self.path):
            self._truncate_after(resume_step, log)
        elif resume_step is None and os.path.exists(self.path):
            os.remove(self.path)  # a fresh run in a directory without checkpoints starts a fresh log

    def _truncate_after(self, step: int, log: Callable[[str], None]) -> None:
        kept, unreadable = [], []
        with open(self.path, "rb") as handle:
            lines = handle.readlines()
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                if number < len(lines) or line.endswith(b"\n"):  # not merely the line a kill cut short
                    unreadable.append(number)
                continue
            if isinstance(record, dict) and record.get("step", 0) <= step:
                kept.append(json.dumps(record) + "\n")
        if unreadable:
            log(f"warning: {self.path}: line(s) {', '.join(map(str, unreadable[:5]))}"
                f"{' ...' if len(unreadable) > 5 else ''} are not JSON in UTF-8; dropped from the log")
        write_text_atomically(self.path, "".join(kept))

    def write(self, record: dict[str, Any]) -> None:
        # Non-finite floats become null: JSON has no nan, and a strict reader would reject the whole file.
        clean = {key: (None if isinstance(value, float) and not math.isfinite(value) else value)
                 for key, value in record.items()}
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(clean) + "\n")
        except OSError as error:
            raise write_failure(self.path, error, "the lines before this step are kept") from None


# The fields of a metrics record that measure the machine (times, rates, peak memory), not the training: every other
# field of a resumed run's record equals the uninterrupted run's, but checkpoint_step (a stop's own save changes it).
MEASURED_FIELDS = frozenset({"elapsed_s", "seq_per_s", "tokens_per_s", "real_tokens_per_s", "memory_bytes"})


def read_metrics(model_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl, in order (none when the run logged none); a line that is not JSON is a
    ValueError naming the file and the line."""
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}: line {number} is not JSON") from None
    return records


def window_rates(records: list[dict[str, Any]]) -> list[float]:
    """The seq/s of the logged windows after the first, whose steps hold the start-up (as the steady figure leaves
    out the first steps): the spread of a run's speed."""
    return [record["seq_per_s"] for record in records[1:] if record.get("seq_per_s")]


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ProgressDisplay:
    """A training run's progress bar (progress_bar), redrawn at most every `refresh_secs`: the loop asks `due()`
    before it reads the figures, which costs a device synchronisation."""

    def __init__(self, total_steps: int, start_step: int = 0, stream: IO[str] | None = None,
                 refresh_secs: float = 0.25, enabled: bool | None = None):
        # Time left is the loop's own figure (it knows the time budget), not tqdm's.
        self.bar = progress_bar(total_steps, stream, enabled, initial=start_step, unit="step",
                                bar_format="step {n}/{total} |{bar}| {elapsed}{postfix}")
        self.enabled, self.refresh_secs = not self.bar.disable, refresh_secs
        self._last_draw = -math.inf

    def due(self) -> bool:
        return self.enabled and time.monotonic() - self._last_draw >= self.refresh_secs

    def draw(self, step: int, loss: float, seq_per_s: float, eta_s: float) -> None:
        self.bar.n = step
        self.bar.set_postfix_str(f"eta {format_duration(eta_s)}, loss {loss:.4f}, {seq_per_s:.1f} seq/s",
                                 refresh=False)
        self.bar.refresh()
        self._last_draw = time.monotonic()

    def close(self) -> None:
        self.bar.close()
