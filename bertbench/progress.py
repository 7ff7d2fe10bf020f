"""What a training run shows while it runs: a live progress bar on a terminal, log lines elsewhere, and a JSONL
metrics log (one JSON object per logged step, so `pandas.read_json(path, lines=True)` reads it)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import IO, Any

from bertbench.durable import write_failure, write_text_atomically


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
    """A one-line bar redrawn in place (at most every `refresh_secs`) when `stream` is a terminal; otherwise
    nothing, since the plain log lines say the same thing in a form that reads well in a batch job's output file."""

    def __init__(self, total_steps: int, stream: IO[str] | None = None, refresh_secs: float = 0.25,
                 enabled: bool | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.total_steps, self.refresh_secs = total_steps, refresh_secs
        self._last_draw = -math.inf
        self._drawn = False

    def due(self) -> bool:
        return self.enabled and time.monotonic() - self._last_draw >= self.refresh_secs

    def draw(self, step: int, loss: float, seq_per_s: float, eta_s: float) -> None:
        width = 24
        filled = int(width * step / max(1, self.total_steps))
        bar = "#" * filled + "." * (width - filled)
        self.stream.write(f"\rstep {step}/{self.total_steps} [{bar}] loss {loss:.4f}  {seq_per_s:.1f} seq/s  "
                          f"eta {format_duration(eta_s)}  ")
        self.stream.flush()
        self._last_draw, self._drawn = time.monotonic(), True

    def clear(self) -> None:
        """End the bar's line so that the next log line starts on its own."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
