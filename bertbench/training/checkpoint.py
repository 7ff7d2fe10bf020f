"""Training checkpoints on disk: atomic writes, keep-the-newest-N rotation, and the time/step save trigger.

A checkpoint is one regular file `ckpt-<step>.pt` in the model directory, written to a temporary name, fsynced and
renamed, so a crash at any point leaves either the complete new file or none; older files beyond `keep_max` are
deleted only after the new one is in place, and never anything that save_checkpoint cannot have written (a stray: a
directory, a link, another program's file named like a checkpoint). The trigger mirrors tf.estimator's RunConfig:
every `save_secs` of wall-clock time and/or every `save_steps` steps. Independent workers (training without gradient
all-reduce) each keep their own checkpoints in `worker-<rank>/` under the model directory.
"""

from __future__ import annotations

import os
import stat
import time
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import torch

from bertbench.common import run_files
from bertbench.common.durable import atomic_output, is_temporary_name, write_failure

TRAINING_CHECKPOINT_FORMAT = "bertbench-checkpoint-1"


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or not a bertbench checkpoint; the message names the file."""


def checkpoint_path(model_dir: str | os.PathLike, step: int) -> str:
    return os.path.join(os.fspath(model_dir), run_files.checkpoint_name(step))


def list_checkpoints(model_dir: str | os.PathLike) -> list[tuple[int, str]]:
    """(step, path) of the complete checkpoints in model_dir, oldest first; temporary files and stray files (see
    stray_files) are not listed, so they never count as the newest and rotation never deletes them."""
    return _scan(model_dir)[0]


def stray_files(model_dir: str | os.PathLike) -> list[tuple[str, str]]:
    """(path, why) of the entries in model_dir named like a checkpoint that save_checkpoint cannot have written: not
    a regular file (a directory, a symbolic link, a pipe), not a zip archive as torch.save writes, or one that does
    not hold a bertbench training checkpoint. A checkpoint of ours that is damaged still begins as one and is listed
    by list_checkpoints (verification then passes over it), and so is one this process cannot read."""
    return _scan(model_dir)[1]


def _scan(model_dir: str | os.PathLike) -> tuple[list[tuple[int, str]], list[tuple[str, str]]]:
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        return [], []
    found, strays = [], []
    for name in os.listdir(model_dir):
        match = run_files.CHECKPOINT_NAME.match(name)
        if not match:
            continue
        path = os.path.join(model_dir, name)
        try:
            why = _not_ours(path)
        except FileNotFoundError:  # pruned (or renamed over) since listdir
            continue
        if why is None:
            found.append((int(match.group(1)), path))
        else:
            strays.append((path, why))
    return sorted(found), sorted(strays)


_ZIP_START = b"PK\x03\x04"  # every torch.save archive's first bytes, whatever damage comes later in the file


def _not_ours(path: str) -> str | None:
    """Why the entry at `path` is no checkpoint save_checkpoint wrote; None when it may be one (intact, damaged or
    unreadable here). Reads the zip directory and the pickle (a small part of a checkpoint), not the tensors; never
    opens what is not a regular file (a pipe would block the open)."""
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        return (
            "a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
        )
    try:
        with open(path, "rb") as handle:
            start = handle.read(len(_ZIP_START))
            if start != _ZIP_START:
                return "an empty file" if not start else "not a zip archive as torch.save writes"
            try:
                with zipfile.ZipFile(handle) as archive:
                    pickles = [name for name in archive.namelist() if name.endswith("/data.pkl")]
                    if not pickles:
                        return "a zip archive without torch.save's data.pkl"
                    content = archive.read(pickles[0])
            except (zipfile.BadZipFile, zlib.error, EOFError, ValueError):
                return None  # an archive of ours cut short or damaged: evidence, which verification names
    except FileNotFoundError:
        raise
    except OSError:
        return None  # unreadable here: verification reports why
    if TRAINING_CHECKPOINT_FORMAT.encode() not in content:
        return "a torch file, but not a bertbench training checkpoint"
    return None


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The step in a checkpoint's file name (ckpt-<step>.pt), None for another name."""
    match = run_files.CHECKPOINT_NAME.match(os.path.basename(os.fspath(path)))
    return int(match.group(1)) if match else None


def latest_checkpoint(model_dir: str | os.PathLike) -> str | None:
    checkpoints = list_checkpoints(model_dir)
    return checkpoints[-1][1] if checkpoints else None


def worker_dir(model_dir: str | os.PathLike, rank: int) -> str:
    """Where independent worker `rank` keeps its checkpoints."""
    return os.path.join(os.fspath(model_dir), run_files.worker_dir_name(rank))


def holds_training_state(model_dir: str | os.PathLike) -> bool:
    """Whether a run in model_dir has saved anything to resume from: its own or its workers' checkpoints."""
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        return False
    return bool(list_checkpoints(model_dir)) or any(
        list_checkpoints(os.path.join(model_dir, name))
        for name in os.listdir(model_dir)
        if name.startswith(run_files.WORKER_DIR_PREFIX)
    )


def prune_checkpoints(model_dir: str | os.PathLike, keep_max: int, newest_step: int) -> None:
    """Delete all but the newest `keep_max` checkpoints of model_dir up to `newest_step`, that of the checkpoint just
    written (or just verified), and nothing while that checkpoint is not in place: rotation never deletes one before
    a newer one is safely on disk. A checkpoint after newest_step is a damaged file the run resumed past (evidence,
    which its own save of that step replaces), and counting it would delete the good ones; strays are never
    listed, so never counted nor deleted."""
    checkpoints = [(step, path) for step, path in list_checkpoints(model_dir) if step <= newest_step]
    if not checkpoints or checkpoints[-1][0] != newest_step:
        return
    for _, old in checkpoints[:-keep_max]:
        os.remove(old)


def save_checkpoint(model_dir: str | os.PathLike, step: int, state: dict[str, Any], keep_max: int | None = 1) -> str:
    """Write `state` as the checkpoint of `step` atomically, then delete all but the newest `keep_max` (None: delete
    nothing, for callers that prune once other processes have written theirs)."""
    if keep_max is not None and keep_max < 1:
        raise ValueError(f"keep_max must be at least 1, got {keep_max}")
    model_dir = os.fspath(model_dir)
    os.makedirs(model_dir, exist_ok=True)
    path = checkpoint_path(model_dir, step)
    in_the_way = os.path.lexists(path) and _not_ours(path)
    if in_the_way:  # renaming the new file over a stray would delete it
        newest = latest_checkpoint(model_dir)
        raise write_failure(
            path,
            FileExistsError(f"it exists and is not a checkpoint ({in_the_way}): move it out of the run directory"),
            f"the newest complete checkpoint is {newest}" if newest else "no checkpoint was kept",
        )
    handle = None
    try:
        # A signal too leaves the old checkpoints and removes the partial file; the rename is fsynced before
        # rotation deletes older files.
        with atomic_output(path) as temporary, open(temporary, "wb") as file:
            handle = _WriteRecorder(file)
            torch.save({"format": TRAINING_CHECKPOINT_FORMAT, "step": step, **state}, handle)
    except (OSError, RuntimeError) as error:  # torch.save reports a failed write as a RuntimeError of its own
        newest = latest_checkpoint(model_dir)
        raise write_failure(
            path,
            (handle and handle.error) or error,
            f"the newest complete checkpoint is {newest}" if newest else "no checkpoint was kept",
        ) from None
    if keep_max is not None:
        prune_checkpoints(model_dir, keep_max, step)
    return path


class _WriteRecorder:
    """The file torch.save writes through, keeping the OSError of a failed write (a full disk), whose errno torch's
    zip writer replaces with "unexpected pos ..."."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.file.flush()


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Check every record of a checkpoint against the CRC-32 that torch.save wrote beside it in the file's zip
    directory (torch.load does not read them): a flipped or lost byte in the weights, the optimizer state or the
    pickle is a CheckpointError naming the file. Costs one read of the file."""
    path = os.fspath(path)
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no such checkpoint file") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError) as error:
        raise CheckpointError(f"{path}: damaged checkpoint ({type(error).__name__}: {error})") from None
    if damaged is not None:
        raise CheckpointError(f"{path}: damaged checkpoint (the checksum of {damaged} does not match its content)")


def newest_intact_checkpoint(
    model_dir: str | os.PathLike,
    log: Callable[[str], None] = lambda line: None,
    candidates: list[tuple[int, str]] | None = None,
) -> str | None:
    """The newest checkpoint of model_dir (or of `candidates`) that verifies; a damaged one is named in a warning
    and passed over (and kept: it is evidence), and so is each stray file of model_dir (see stray_files). None when
    there is none; every one damaged is a CheckpointError."""
    checkpoints, strays = _scan(model_dir)
    for path, why in strays:
        log(
            f"warning: {path} is not a checkpoint ({why}): not this run's, so it is never resumed, never counts as "
            "the newest and is never deleted by rotation; move it out of the run directory"
        )
    if candidates is not None:
        checkpoints = candidates
    damage = []
    for _, path in reversed(checkpoints):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as error:
            damage.append(str(error))
            log(f"warning: {error}; passing over it to an older checkpoint")
    if damage:
        raise CheckpointError(
            f"{os.fspath(model_dir)}: every checkpoint is damaged ({'; '.join(damage)}); nothing was deleted"
        )
    return None


def remove_temporary_files(model_dir: str | os.PathLike) -> list[str]:
    """Delete the temporary files of saves that a killed process left in model_dir (durable.is_temporary_name:
    `.ckpt-000000010.pt.1a2b3c4d.tmp`, `.train_results.json.5e6f7a8b.tmp`, ...: never read as results); returns
    their names. Call it only while holding the run
    directory's lock (run_lock.RunLock): another run's save in progress would lose its file."""
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        return []
    removed = sorted(name for name in os.listdir(model_dir) if is_temporary_name(name))
    for name in removed:
        os.remove(os.path.join(model_dir, name))
    return removed


def load_checkpoint(
    path: str | os.PathLike, map_location: str | torch.device = "cpu", verify: bool = True
) -> dict[str, Any]:
    """Read a checkpoint written by save_checkpoint; a missing, damaged (see verify_checkpoint; `verify=False` for a
    file just verified), truncated or foreign file is a CheckpointError."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such checkpoint file")
    if verify:
        verify_checkpoint(path)
    try:
        # RNG states and optimizer state are plain tensors and containers, so the safe loader reads them.
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises several types for a damaged zip or pickle
        raise CheckpointError(
            f"{path}: unreadable checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'no detail'})"
        ) from None
    if not isinstance(state, dict) or state.get("format") != TRAINING_CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not a bertbench training checkpoint")
    return state


class SaveTrigger:
    """Decides when to save: every `save_secs` seconds of wall-clock time since the last save and/or every
    `save_steps` steps (either may be None; both None never triggers). tf.estimator's save_checkpoints_secs/steps."""

    def __init__(self, save_secs: float | None, save_steps: int | None, clock: Callable[[], float] = time.monotonic):
        if save_secs is not None and save_secs <= 0:
            raise ValueError(f"save_checkpoints_secs must be positive, got {save_secs}")
        if save_steps is not None and save_steps < 1:
            raise ValueError(f"save_checkpoints_steps must be at least 1, got {save_steps}")
        self.save_secs, self.save_steps, self._clock = save_secs, save_steps, clock
        self._last_time, self._last_step = clock(), None

    def start(self, step: int) -> None:
        """Count from `step` (the step training starts or resumes at) and from now."""
        self._last_time, self._last_step = self._clock(), step

    def should_save(self, step: int) -> bool:
        if self._last_step is not None and step <= self._last_step:
            return False
        if self.save_steps is not None and step % self.save_steps == 0:
            return True
        return self.save_secs is not None and self._clock() - self._last_time >= self.save_secs

    def saved(self, step: int) -> None:
        self._last_time, self._last_step = self._clock(), step
