"""The run directory's lock file: a command that fails leaves none where there was none, and removing it never lets
two commands hold one directory."""

import os

import pytest

from bertbench.common.errors import UsageError
from bertbench.runners.run_lock import LOCK_NAME, RunDirectoryBusy, RunLock


class Refused(UsageError):
    pass


def test_a_failed_command_removes_the_lock_file_it_made_and_a_finished_one_keeps_it(tmp_path):
    with pytest.raises(Refused), RunLock(tmp_path):
        raise Refused("a bad input")
    assert os.listdir(tmp_path) == []
    (tmp_path / LOCK_NAME).write_text("a note of an earlier holder\n")
    with pytest.raises(Refused), RunLock(tmp_path):
        raise Refused("a bad input")
    assert os.listdir(tmp_path) == [LOCK_NAME]  # it was there before: kept
    (tmp_path / LOCK_NAME).unlink()
    with RunLock(tmp_path):
        (tmp_path / "results.json").write_text("{}")
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME, "results.json"]
    with pytest.raises(Refused), RunLock(tmp_path / "new"):
        raise Refused("a bad input")
    assert not (tmp_path / "new").exists()  # the directory it made went too


def test_a_command_that_locks_a_lock_file_its_failed_holder_removed_locks_the_new_one(tmp_path):
    failing, waiting = RunLock(tmp_path), RunLock(tmp_path)
    failing.__enter__()
    lock = waiting._lock

    def holder_fails_then_lock(descriptor):  # `waiting` has opened the holder's file: the holder fails and goes
        if failing._descriptor is not None:
            failing.__exit__(Refused, Refused("a bad input"), None)
        lock(descriptor)

    waiting._lock = holder_fails_then_lock
    with waiting:
        assert os.listdir(tmp_path) == [LOCK_NAME]
        with pytest.raises(RunDirectoryBusy, match="another run is using this directory"):
            RunLock(tmp_path).__enter__()  # the file there now is the one `waiting` holds
