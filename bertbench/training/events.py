"""TensorBoard's event files, written by hand (bertbench.common.tf_wire): what `tensorboard --logdir OUTPUT_DIR`
draws, in tf.estimator's layout, with neither TensorFlow nor TensorBoard nor protobuf installed.

An event file is a sequence of TFRecords, each an Event proto: the first gives the format (file_version
"brain.Event:2"), the second is a SessionLog START at the first step the file may hold, each other one a step's
scalars (a Summary of Values: tag, simple_value). Training's scalars go to
the logging directory (default: the run directory), the evaluations' to its eval/ subdirectory, as the Estimator
wrote them; TensorBoard shows them as the runs "." and "eval". Each command appends to a file of its own, named
after every earlier one (run_files.event_file_name), so that readers read the files in the order they were written.

The files tell the history of the run's saved weights, as metrics.jsonl does (training.metrics.MetricsLog):
keep_events, at the start of training, rewrites each file holding a step after the checkpoint resumed without
those steps (atomically), and removes the files of a fresh run in a directory without checkpoints; an evaluation
drops the evaluations of its step and later ones before it writes its own. A kill mid-append leaves a cut last
record, which the next rewrite drops. So whatever reads the files (TensorBoard, or tbparse, pandas and the like)
finds each step once; and a TensorBoard that read the dropped steps before (it was watching the killed run) drops
them at the new file's START, as it did for tf.estimator's restarts.
"""

from __future__ import annotations

import numbers
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from bertbench.common import run_files
from bertbench.common.durable import write_atomically, write_failure
from bertbench.common.tf_wire import WireError, decode_fields, field, frame_record, last, scan_records

# Event's fields (tensorflow/core/util/event.proto) and Summary.Value's (tensorflow/core/framework/summary.proto).
_WALL_TIME, _STEP, _FILE_VERSION, _SUMMARY, _SESSION_LOG = 1, 2, 3, 5, 7
_VALUE, _TAG, _SIMPLE_VALUE = 1, 1, 2
_STATUS, _START = 1, 1  # SessionLog.status, SessionLog.START
FILE_VERSION = b"brain.Event:2"

# A metrics.jsonl record's fields and their tags: tf.estimator's names where it wrote the figure (loss; its
# StepCounterHook's global_step/sec; TPUEstimator's examples/sec, which it wrote on CPUs and GPUs too), the record's
# own names otherwise.
TRAINING_TAGS = {
    "loss": "loss",
    "steps_per_s": "global_step/sec",
    "seq_per_s": "examples/sec",
    "lr": "lr",
    "tokens_per_s": "tokens_per_s",
    "real_tokens_per_s": "real_tokens_per_s",
    "grad_norm": "grad_norm",
    "loss_scale": "loss_scale",
    "model_tflops_per_s": "model_tflops_per_s",
    "mfu": "mfu",
}


def event_files(directory: str | os.PathLike) -> list[str]:
    """The paths of bertbench's event files in `directory`, in the order they were written (none when there is no
    such directory). Files of other writers are left alone."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return [os.path.join(directory, name) for name in sorted(names) if run_files.EVENT_FILE_NAME.match(name)]


def eval_events_dir(logging_dir: str) -> str:
    """Where a run's evaluations go: tf.estimator's <model_dir>/eval."""
    return os.path.join(logging_dir, run_files.EVAL_EVENTS_DIR)


def event(step: int, wall_time: float, scalars: Mapping[str, float]) -> bytes:
    """An Event holding `scalars` (tag -> value) at `step`."""
    values = b"".join(
        field(_VALUE, field(_TAG, tag.encode("utf-8")) + field(_SIMPLE_VALUE, float(value), fixed="<f"))
        for tag, value in scalars.items()
    )
    return field(_WALL_TIME, wall_time, fixed="<d") + field(_STEP, step) + field(_SUMMARY, values)


def file_version_event(wall_time: float) -> bytes:
    """The Event that opens every event file: its format."""
    return field(_WALL_TIME, wall_time, fixed="<d") + field(_FILE_VERSION, FILE_VERSION)


def session_start_event(step: int, wall_time: float) -> bytes:
    """A SessionLog START at `step`: a TensorBoard that holds steps from `step` on drops them."""
    return field(_WALL_TIME, wall_time, fixed="<d") + field(_STEP, step) + field(_SESSION_LOG, field(_STATUS, _START))


def keep_events(directory: str, keep_through: int | None, log: Callable[[str], None] = lambda line: None) -> None:
    """Keep the events of `directory` up to step `keep_through` (None: none, the files are removed). A file that
    holds later steps, a cut last record or damage is rewritten without them, atomically; a damaged record is
    named in a warning."""
    for path in event_files(directory):
        if keep_through is None:
            os.remove(path)
            continue
        with open(path, "rb") as handle:
            scanned = scan_records(handle.read())
        kept, damaged = [], []
        for record in scanned.records:
            try:
                fields = decode_fields(record.data) if record.intact else None
            except WireError:
                fields = None
            if fields is None:
                damaged.append(record.offset)
            elif _SUMMARY not in fields or last(fields, _STEP) <= keep_through:
                kept.append(record.data)
        if scanned.stopped_at is not None and not scanned.cut:
            damaged.append(scanned.stopped_at)
        if damaged:
            log(
                f"warning: {path}: the record(s) at byte {', '.join(map(str, damaged[:5]))}"
                f"{' ...' if len(damaged) > 5 else ''} are damaged; dropped from the events"
            )
        if len(kept) == len(scanned.records) and scanned.stopped_at is None:
            continue
        if any(_SUMMARY in decode_fields(data) for data in kept):
            write_atomically(path, b"".join(frame_record(data) for data in kept))
        else:
            os.remove(path)


class EventLog:
    """Appends scalars to an event file of its own in `directory`, made at the first write (so that keep_events may
    still run on the directory after the log is made) and named after every event file there. `first_step`: the
    first step it may write, where its SessionLog START is."""

    def __init__(self, directory: str, first_step: int):
        self.directory, self.first_step, self.path = directory, first_step, None

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        now = time.time()
        data = frame_record(event(step, now, scalars))
        try:
            if self.path is None:
                os.makedirs(self.directory, exist_ok=True)
                self.path = self._new_path(now)
                data = (
                    frame_record(file_version_event(now))
                    + frame_record(session_start_event(self.first_step, now))
                    + data
                )
            with open(self.path, "ab") as handle:
                handle.write(data)
        except OSError as error:
            raise write_failure(self.path or self.directory, error, "the events before this step are kept") from None

    def _new_path(self, now: float) -> str:
        earlier = [
            int(run_files.EVENT_FILE_NAME.match(os.path.basename(path))[1]) for path in event_files(self.directory)
        ]
        seconds = max([int(now), *(stamp + 1 for stamp in earlier)])
        return os.path.join(self.directory, run_files.event_file_name(seconds, socket.gethostname()))


def training_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record's figures by their tags (TRAINING_TAGS), those it has."""
    return {tag: record[key] for key, tag in TRAINING_TAGS.items() if record.get(key) is not None}


def eval_scalars(results: Mapping[str, Any]) -> dict[str, float]:
    """Every number of an evaluation's results but its step, by its own name (tf.estimator's eval/ summaries)."""
    return {
        key: value
        for key, value in results.items()
        if key != "global_step" and isinstance(value, numbers.Real) and not isinstance(value, bool)
    }


def write_eval_events(logging_dir: str, step: int, results: Mapping[str, Any], log: Callable[[str], None]) -> None:
    """An evaluation's figures at `step` in the eval/ directory: the evaluations of this step and later ones go
    first, so that an evaluation scored again (eval.sh run twice) replaces its point."""
    directory = eval_events_dir(logging_dir)
    keep_events(directory, step - 1, log)
    EventLog(directory, step).write(step, eval_scalars(results))
