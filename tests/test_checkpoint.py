"""Atomic checkpoint files, rotation, and the time/step save trigger."""

import os
import zipfile

import pytest
import torch
from helpers import flip_byte

from bertbench.common.durable import WriteError
from bertbench.training import checkpoint
from bertbench.training.checkpoint import CheckpointError, SaveTrigger


def state(value: float) -> dict:
    return {"model": {"weight": torch.full((3,), value)}, "rng": torch.get_rng_state()}


def test_save_load_round_trip_and_latest(tmp_path):
    path = checkpoint.save_checkpoint(tmp_path, 7, state(1.5), keep_max=3)
    assert os.path.basename(path) == "ckpt-000000007.pt"
    loaded = checkpoint.load_checkpoint(path)
    assert loaded["step"] == 7 and torch.equal(loaded["model"]["weight"], torch.full((3,), 1.5))
    assert torch.equal(loaded["rng"], torch.get_rng_state())
    checkpoint.save_checkpoint(tmp_path, 12, state(2.0), keep_max=3)
    assert checkpoint.latest_checkpoint(tmp_path).endswith("ckpt-000000012.pt")
    assert checkpoint.latest_checkpoint(tmp_path / "absent") is None


def test_keep_max_removes_only_the_oldest(tmp_path):
    for step in (10, 20, 30, 40):
        checkpoint.save_checkpoint(tmp_path, step, state(step), keep_max=2)
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [30, 40]
    checkpoint.save_checkpoint(tmp_path, 50, state(50), keep_max=1)
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [50]
    with pytest.raises(ValueError, match="keep_max"):
        checkpoint.save_checkpoint(tmp_path, 60, state(60), keep_max=0)


def test_workers_defer_pruning_and_a_run_with_worker_checkpoints_holds_state(tmp_path):
    assert not checkpoint.holds_training_state(tmp_path / "absent")
    assert not checkpoint.holds_training_state(tmp_path)
    worker = checkpoint.worker_dir(tmp_path, 1)
    assert worker == str(tmp_path / "worker-00001")
    for step in (10, 20, 30):
        checkpoint.save_checkpoint(worker, step, state(step), keep_max=None)  # the other workers are still writing
    assert [step for step, _ in checkpoint.list_checkpoints(worker)] == [10, 20, 30]
    assert checkpoint.holds_training_state(tmp_path)  # through its worker
    checkpoint.prune_checkpoints(worker, 1, 30)
    assert [step for step, _ in checkpoint.list_checkpoints(worker)] == [30]


def test_crash_while_writing_leaves_old_checkpoints_and_no_partial_file(tmp_path, monkeypatch):
    checkpoint.save_checkpoint(tmp_path, 1, state(1.0), keep_max=1)
    before = sorted(os.listdir(tmp_path))

    def crash(obj, handle):
        handle.write(b"half a checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        checkpoint.save_checkpoint(tmp_path, 2, state(2.0), keep_max=1)
    assert sorted(os.listdir(tmp_path)) == before  # no temp file, and step 1 was not rotated away
    assert checkpoint.load_checkpoint(checkpoint.latest_checkpoint(tmp_path))["step"] == 1


def test_temporary_files_are_never_taken_for_checkpoints(tmp_path):
    (tmp_path / ".ckpt-abc.tmp").write_bytes(b"partial")
    (tmp_path / "ckpt-000000003.pt.tmp").write_bytes(b"partial")
    assert checkpoint.latest_checkpoint(tmp_path) is None


def test_damaged_or_foreign_files_name_the_file(tmp_path):
    path = checkpoint.save_checkpoint(tmp_path, 5, state(1.0))
    data = open(path, "rb").read()
    with open(path, "wb") as handle:
        handle.write(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="ckpt-000000005.pt: damaged checkpoint"):
        checkpoint.load_checkpoint(path)
    with pytest.raises(CheckpointError, match="ckpt-000000005.pt: unreadable checkpoint"):
        checkpoint.load_checkpoint(path, verify=False)  # torch's own reader fails too, in one line
    foreign = tmp_path / "other.pt"
    torch.save({"weight": torch.ones(1)}, foreign)
    with pytest.raises(CheckpointError, match="not a bertbench training checkpoint"):
        checkpoint.load_checkpoint(foreign)
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        checkpoint.load_checkpoint(tmp_path / "missing.pt")


def test_a_flipped_byte_anywhere_in_the_content_is_caught(tmp_path):
    """torch.load reads a checkpoint with a flipped weight byte without a word; verification does not."""
    path = checkpoint.save_checkpoint(tmp_path, 5, state(1.0))
    data = open(path, "rb").read()
    weight = torch.full((3,), 1.0).numpy().tobytes()
    offsets = [data.index(weight), data.index(b"bertbench-checkpoint-1"), 40]  # a weight, the pickle, a header
    for offset in offsets:
        flip_byte(path, offset)
        with pytest.raises(CheckpointError, match=r"ckpt-000000005\.pt: damaged checkpoint"):
            checkpoint.load_checkpoint(path)
        flip_byte(path, offset)  # back as it was
        checkpoint.load_checkpoint(path)
    flip_byte(path, offsets[0])
    assert torch.load(path, weights_only=True)["model"]["weight"][0] != 1.0  # what the check exists for


def test_the_newest_intact_checkpoint_is_chosen_and_the_damaged_one_kept(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save_checkpoint(tmp_path, step, state(step), keep_max=3)
    newest = checkpoint.checkpoint_path(tmp_path, 30)
    flip_byte(newest, os.path.getsize(newest) // 2)
    warnings = []
    assert checkpoint.newest_intact_checkpoint(tmp_path, warnings.append) == checkpoint.checkpoint_path(tmp_path, 20)
    assert len(warnings) == 1 and "ckpt-000000030.pt: damaged checkpoint" in warnings[0]
    assert os.path.exists(newest)
    for step in (10, 20):
        path = checkpoint.checkpoint_path(tmp_path, step)
        flip_byte(path, os.path.getsize(path) // 2)
    with pytest.raises(CheckpointError, match="every checkpoint is damaged.*nothing was deleted"):
        checkpoint.newest_intact_checkpoint(tmp_path)
    assert len(checkpoint.list_checkpoints(tmp_path)) == 3
    assert checkpoint.newest_intact_checkpoint(tmp_path / "absent") is None


def test_stray_files_named_like_checkpoints_are_named_once_and_never_counted_nor_deleted(tmp_path):
    (tmp_path / "ckpt-999999999.pt").write_bytes(b"not a checkpoint\n")
    (tmp_path / "ckpt-999999998.pt").write_bytes(b"")
    torch.save({"weight": torch.ones(1)}, tmp_path / "ckpt-999999997.pt")  # another program's torch file
    with zipfile.ZipFile(tmp_path / "ckpt-999999996.pt", "w") as archive:
        archive.writestr("notes.txt", "a zip of something else")
    strays = {os.path.basename(path): why for path, why in checkpoint.stray_files(tmp_path)}
    assert strays == {
        "ckpt-999999999.pt": "not a zip archive as torch.save writes",
        "ckpt-999999998.pt": "an empty file",
        "ckpt-999999997.pt": "a torch file, but not a bertbench training checkpoint",
        "ckpt-999999996.pt": "a zip archive without torch.save's data.pkl",
    }
    for step in (10, 20, 30):  # written and rotated as if the strays were not there
        checkpoint.save_checkpoint(tmp_path, step, state(step), keep_max=2)
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [20, 30]
    assert checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_path(tmp_path, 30)
    damaged = checkpoint.checkpoint_path(tmp_path, 30)  # one of ours, cut short: damaged, not a stray
    with open(damaged, "r+b") as handle:
        handle.truncate(os.path.getsize(damaged) // 2)
    warnings = []
    assert checkpoint.newest_intact_checkpoint(tmp_path, warnings.append) == checkpoint.checkpoint_path(tmp_path, 20)
    assert len(warnings) == 5 and all(line.startswith("warning: ") and "\n" not in line for line in warnings)
    assert f"{tmp_path}/ckpt-999999999.pt is not a checkpoint (not a zip archive as torch.save writes)" in warnings[3]
    assert "never counts as the newest and is never deleted by rotation" in warnings[3]
    assert "ckpt-000000030.pt: damaged checkpoint" in warnings[4]
    # The run resumed at 20 saves 24: rotation keeps it and 20, and leaves the damaged 30 and every stray alone.
    checkpoint.save_checkpoint(tmp_path, 24, state(24), keep_max=2)
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [20, 24, 30]
    assert len(checkpoint.stray_files(tmp_path)) == 4


def test_entries_that_are_not_regular_files_are_strays_never_resumed_counted_replaced_nor_deleted(tmp_path):
    """A directory, a symbolic link (even to a checkpoint of ours) and a pipe named like checkpoints: save_checkpoint
    writes none of them. Listing them never opens the pipe (an open would block)."""
    for step in (10, 20):
        checkpoint.save_checkpoint(tmp_path, step, state(step), keep_max=2)
    (tmp_path / "ckpt-000000030.pt").mkdir()
    (tmp_path / "ckpt-000000040.pt").symlink_to(tmp_path / "ckpt-000000020.pt")
    os.mkfifo(tmp_path / "ckpt-000000050.pt")
    strays = {os.path.basename(path): why for path, why in checkpoint.stray_files(tmp_path)}
    assert strays == {
        "ckpt-000000030.pt": "a directory",
        "ckpt-000000040.pt": "a symbolic link",
        "ckpt-000000050.pt": "not a regular file",
    }
    warnings = []
    assert checkpoint.newest_intact_checkpoint(tmp_path, warnings.append) == checkpoint.checkpoint_path(tmp_path, 20)
    assert len(warnings) == 3 and all("damaged" not in line for line in warnings)
    assert checkpoint.latest_checkpoint(tmp_path) == checkpoint.checkpoint_path(tmp_path, 20)
    checkpoint.save_checkpoint(tmp_path, 60, state(60), keep_max=1)  # past every stray: only 10 and 20 go
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [60]
    assert {os.path.basename(path) for path, _ in checkpoint.stray_files(tmp_path)} == set(strays)
    for step, why in ((30, "a directory"), (40, "a symbolic link"), (50, "not a regular file")):
        path = checkpoint.checkpoint_path(tmp_path, step)
        with pytest.raises(WriteError) as failure:  # a save of a stray's step does not replace it
            checkpoint.save_checkpoint(tmp_path, step, state(step), keep_max=1)
        assert str(failure.value) == (
            f"{path}: could not be written (it exists and is not a checkpoint ({why}): move it out of the run "
            f"directory); the newest complete checkpoint is {checkpoint.checkpoint_path(tmp_path, 60)}"
        )
    assert os.path.islink(tmp_path / "ckpt-000000040.pt") and not os.listdir(tmp_path / "ckpt-000000030.pt")
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [60] and len(os.listdir(tmp_path)) == 4


def test_rotation_deletes_nothing_until_the_newest_checkpoint_is_in_place(tmp_path):
    for step in (10, 20):
        checkpoint.save_checkpoint(tmp_path, step, state(step), keep_max=2)
    checkpoint.prune_checkpoints(tmp_path, 1, 30)  # 30 is not on disk (its save failed): 10 and 20 stay
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [10, 20]
    damaged = checkpoint.checkpoint_path(tmp_path, 40)  # one of ours, newer, damaged: never counted as the newest
    with open(damaged, "wb") as handle:
        handle.write(open(checkpoint.checkpoint_path(tmp_path, 20), "rb").read()[:100])
    checkpoint.prune_checkpoints(tmp_path, 1, 20)
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [20, 40]


def test_temporary_files_of_killed_saves_are_removed_and_nothing_else(tmp_path):
    keep = ["ckpt-000000010.pt", "notes.tmp", "train_results.json", "metrics.jsonl"]
    leftovers = [".ckpt-x1y2.tmp", ".train_results.json.5e6f7a8b.tmp", ".eval_results.txt.9c0d1e2f.tmp"]
    for name in keep + leftovers:
        (tmp_path / name).write_text("x")
    assert checkpoint.remove_temporary_files(tmp_path) == sorted(leftovers)
    assert sorted(os.listdir(tmp_path)) == sorted(keep)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_trigger_by_wall_clock_time():
    clock = FakeClock()
    trigger = SaveTrigger(save_secs=1200, save_steps=None, clock=clock)
    trigger.start(0)
    clock.now += 1199
    assert not trigger.should_save(50)
    clock.now += 1
    assert trigger.should_save(51)
    trigger.saved(51)
    clock.now += 600
    assert not trigger.should_save(80)  # the clock restarts at each save
    clock.now += 600
    assert trigger.should_save(90)


def test_trigger_by_steps_or_both():
    clock = FakeClock()
    trigger = SaveTrigger(save_secs=None, save_steps=100, clock=clock)
    trigger.start(0)
    assert [step for step in range(1, 301) if trigger.should_save(step)] == [100, 200, 300]
    both = SaveTrigger(save_secs=60, save_steps=100, clock=clock)
    both.start(0)
    clock.now += 61
    assert both.should_save(7)  # time fires before the step count
    both.saved(7)
    assert both.should_save(100) and not both.should_save(7)  # never twice for one step
    resumed = SaveTrigger(save_secs=None, save_steps=100, clock=clock)
    resumed.start(200)
    assert not resumed.should_save(200) and resumed.should_save(300)


def test_trigger_rejects_bad_settings():
    with pytest.raises(ValueError, match="save_checkpoints_secs"):
        SaveTrigger(save_secs=0, save_steps=None)
    with pytest.raises(ValueError, match="save_checkpoints_steps"):
        SaveTrigger(save_secs=None, save_steps=0)
    assert not SaveTrigger(None, None).should_save(10)
