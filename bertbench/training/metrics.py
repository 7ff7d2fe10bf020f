"""A training run's JSONL logs (metrics.jsonl, run_pretraining's evals.jsonl): one JSON object per line, so that
`pandas.read_json(path, lines=True)` reads them. MetricsLog writes them; scan_log is the one parser every reader
goes through.

The rule for lines that are not records: the last line, when it has no line end and does not parse, is an append a
kill cut short: never a record and never damage (the resumed run logs that step again). Any other line that is not
a JSON object in UTF-8 is damage: read_log raises on it, MetricsLog drops it with a warning when a run resumes, and
a reader looking for any sign of a record (runners' saved_history) passes over it. Blank lines are neither."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bertbench.common import run_files
from bertbench.common.durable import write_atomically, write_failure

# The fields of a metrics record that measure the machine (times, rates, peak memory), not the training: every other
# field of a resumed run's record equals the uninterrupted run's, but checkpoint_step (a stop's own save changes it).
MEASURED_FIELDS = frozenset(
    {
        "elapsed_s",
        "steps_per_s",
        "seq_per_s",
        "tokens_per_s",
        "real_tokens_per_s",
        "model_tflops_per_s",
        "mfu",
        "memory_bytes",
    }
)


@dataclass(frozen=True)
class LogLines:
    """A JSONL log as scan_log reads it: (line number, record) of each record in order, and the numbers of the
    damaged lines (see the module's rule)."""

    records: list[tuple[int, dict[str, Any]]]
    damaged: list[int]


def scan_log(path: str | os.PathLike) -> LogLines:
    """The records and damaged lines of the JSONL log at `path` (none of either when there is no such file)."""
    try:
        with open(path, "rb") as handle:
            lines = handle.readlines()
    except FileNotFoundError:
        return LogLines([], [])
    records, damaged = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if isinstance(record, dict):
            records.append((number, record))
        elif number < len(lines) or line.endswith(b"\n"):  # not merely the line a kill cut short
            damaged.append(number)
    return LogLines(records, damaged)


def read_log(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of the JSONL log at `path`, in order (none when there is no such file); a damaged line is a
    ValueError naming the file and the line."""
    scanned = scan_log(path)
    if scanned.damaged:
        raise ValueError(f"{os.fspath(path)}: line {scanned.damaged[0]} is not a JSON object in UTF-8")
    return [record for _, record in scanned.records]


def read_metrics(model_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl (read_log)."""
    return read_log(os.path.join(model_dir, run_files.METRICS))


def window_rates(records: list[dict[str, Any]]) -> list[float]:
    """The seq/s of the logged windows after the first, whose steps hold the start-up (as the steady figure leaves
    out the first steps): the spread of a run's speed."""
    return [record["seq_per_s"] for record in records[1:] if record.get("seq_per_s")]


class MetricsLog:
    """Appends records to a JSONL file. On resume it first drops the records of steps after the checkpoint, which
    the killed run logged but the resumed run will do again, so the log tells the history of the saved weights."""

    def __init__(
        self, path: str | os.PathLike, resume_step: int | None = None, log: Callable[[str], None] = lambda line: None
    ):
        self.path = os.fspath(path)
        if resume_step is not None and os.path.isfile(self.path):
            self._truncate_after(resume_step, log)
        elif resume_step is None and os.path.exists(self.path):
            os.remove(self.path)  # a fresh run in a directory without checkpoints starts a fresh log

    def _truncate_after(self, step: int, log: Callable[[str], None]) -> None:
        scanned = scan_log(self.path)
        if scanned.damaged:
            log(
                f"warning: {self.path}: line(s) {', '.join(map(str, scanned.damaged[:5]))}"
                f"{' ...' if len(scanned.damaged) > 5 else ''} are not JSON in UTF-8; dropped from the log"
            )
        write_atomically(
            self.path,
            "".join(json.dumps(record) + "\n" for _, record in scanned.records if record.get("step", 0) <= step),
        )

    def write(self, record: dict[str, Any]) -> None:
        # Non-finite floats become null: JSON has no nan, and a strict reader would reject the whole file.
        clean = {
            key: (None if isinstance(value, float) and not math.isfinite(value) else value)
            for key, value in record.items()
        }
        try:
            with open(self.path, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(clean) + "\n")
        except OSError as error:
            raise write_failure(self.path, error, "the lines before this step are kept") from None
