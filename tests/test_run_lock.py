"""The run directory's lock file: a command that fails leaves none where there was none, and removing it never lets
two commands hold one directory."""

import fcntl
import os

import pytest

from bertbench.common.errors import UsageError
from bertbench.common.run_files import LOCK
from bertbench.runners.run_lock import RunDirectoryBusy, RunLock


class Refused(UsageError):
    pass


def test_a_failed_command_removes_the_lock_file_it_made_and_a_finished_one_keeps_it(tmp_path):
    with pytest.raises(Refused), RunLock(tmp_path):
        raise Refused("a bad input")
    assert os.listdir(tmp_path) == []
    (tmp_path / LOCK).write_text("a note of an earlier holder\n")
    with pytest.raises(Refused), RunLock(tmp_path):
        raise Refused("a bad input")
    assert os.listdir(tmp_path) == [LOCK]  # it was there before: kept
    (tmp_path / LOCK).unlink()
    with RunLock(tmp_path):
        (tmp_path / "results.json").write_text("{}")
    assert sorted(os.listdir(tmp_path)) == [LOCK, "results.json"]
    with pytest.raises(Refused), RunLock(tmp_path / "new"):
        raise Refused("a bad input")
    assert not (tmp_path / "new").exists()  # the directory it made went too


def test_a_command_that_locks_a_lock_file_its_failed_holder_removed_locks_the_new_one(tmp_path, monkeypatch):
    failing, waiting = RunLock(tmp_path), RunLock(tmp_path)
    failing.__enter__()
    flock, failed = fcntl.flock, []

    def holder_fails_then_flock(descriptor, operation):  # `waiting` has opened the holder's file: the holder fails
        if not failed:
            failed.append(failing)
            failing.__exit__(Refused, Refused("a bad input"), None)
        flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", holder_fails_then_flock)
    with waiting:
        assert os.listdir(tmp_path) == [LOCK]
        with pytest.raises(RunDirectoryBusy, match="another run is using this directory"):
            RunLock(tmp_path).__enter__()  # the file there now is the one `waiting` holds
