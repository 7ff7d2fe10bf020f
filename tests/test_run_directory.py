"""A run directory keeps everything a run measured: one command at a time (the lock), figures that add up over every
invocation, checkpoints verified before a resume, and no silent restart or poisoned directory."""

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import classifier_flags, flip_byte, read_json, snapshot, write_bert_dir

from bertbench.common.run_files import LOCK
from bertbench.runners.classifier import main
from bertbench.runners.run_lock import RunDirectoryBusy, RunLock
from bertbench.tasks.synthetic import write_glue_task
from bertbench.training.checkpoint import checkpoint_path, list_checkpoints, load_checkpoint


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("run-directory")
    write_glue_task(root / "glue", "MRPC", train=128, dev=32, test=8)
    write_bert_dir(root / "bert")
    return root


def flags(data, out, *extra):
    return classifier_flags(
        data, out, "--do_train", "--do_eval", *extra, learning_rate="2e-3", log_every=4, save_every=8, keep=3
    )


# ---- the lock ----------------------------------------------------------------------------------------------------

HOLD = textwrap.dedent("""
    import sys, time
    from bertbench.runners.run_lock import RunLock
    with RunLock(sys.argv[1]):
        print("held", flush=True)
        time.sleep(60)
""")


def test_a_second_command_is_refused_naming_the_holder_and_a_killed_holder_leaves_no_lock(data, tmp_path, error_line):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert main(flags(data, out)) == 2
        message = error_line()
        assert f"{out}: another run is using this directory (pid {holder.pid} on " in message
        assert "use another --output_dir" in message
        assert sorted(os.listdir(out)) == [LOCK]  # the refused command wrote nothing
    finally:
        holder.kill()  # SIGKILL: no clean-up of its own
        holder.wait()
    assert main(flags(data, out)) == 0  # the kernel dropped the dead holder's lock
    assert read_json(out / "train_results.json")["global_step"] == 24


def test_the_lock_is_exclusive_within_a_process_too_and_a_failed_start_leaves_no_directory(tmp_path, data, error_line):
    with RunLock(tmp_path / "held"):
        with pytest.raises(RunDirectoryBusy, match="another run is using this directory"):
            RunLock(tmp_path / "held").__enter__()
    out = tmp_path / "never"
    assert main(flags(data, out, "--learning_rate=nan")) == 2
    assert "--learning_rate nan" in error_line()
    assert not out.exists()  # the lock's directory went with the failed start


# ---- figures over every invocation ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whole(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "run"
    assert main(flags(data, out)) == 0
    return out


def test_a_rerun_of_a_finished_run_keeps_its_figures_and_only_evaluates(data, whole, capsys):
    before = read_json(whole / "train_results.json")
    assert before["steps"] == before["global_step"] == 24 and before["sentences"] == 24 * 16
    assert len(before["segments"]) == 1 and before["segments"][0]["ended"] == "finished"
    metrics = (whole / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(flags(data, whole)) == 0
    assert "the run is already at its last step 24: nothing to train, its figures are kept" in capsys.readouterr().out
    after = read_json(whole / "train_results.json")
    whole_run = ("steps", "sentences", "seconds", "steady_sentences_per_second", "segments", "evaluation_seconds")
    for name in (*whole_run, "final_loss", "first_step_seconds"):
        assert after[name] == before[name], name
    assert before["final_loss"] > 0 and before["first_step_seconds"] > 0
    assert after["invocation"]["steps"] == 0 and after["invocation"]["final_loss"] is None
    assert (whole / "metrics.jsonl").read_text() == metrics
    assert read_json(whole / "eval_results.json")["global_step"] == 24


def test_a_run_killed_between_its_last_save_and_the_prune_is_pruned_when_run_again(data, whole, tmp_path):
    """The kill -9 campaign's find: killed after the last checkpoint is in place but before older ones are deleted,
    a run kept keep_checkpoint_max + 1 checkpoints for ever (at its last step it never saves again)."""
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    shutil.copyfile(out / "ckpt-000000008.pt", checkpoint_path(out, 4))  # the one the prune would have deleted
    assert main(flags(data, out)) == 0
    assert [step for step, _ in list_checkpoints(out)] == [8, 16, 24]


def test_a_run_killed_after_a_checkpoint_keeps_the_figures_it_saved(data, whole, tmp_path):
    """A run is cut after its checkpoint of step 16 (the state a SIGKILL leaves: newer checkpoints gone, no
    results written: a copy of the finished run without them); the resumed run's results hold that segment's
    figures up to step 16 and its own after."""
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    os.remove(checkpoint_path(out, 24))
    os.remove(out / "train_results.json")
    saved = load_checkpoint(checkpoint_path(out, 16))["segments"]
    assert [(segment["start_step"], segment["end_step"], segment["ended"]) for segment in saved] == [(0, 16, None)]
    assert main(flags(data, out)) == 0
    results = read_json(out / "train_results.json")
    first, second = results["segments"]
    assert (first["end_step"], first["sentences"], first["ended"]) == (16, 16 * 16, None)
    assert (second["start_step"], second["end_step"], second["ended"]) == (16, 24, "finished")
    assert results["sentences"] == 24 * 16 == first["sentences"] + second["sentences"]
    assert results["seconds"] == pytest.approx(first["seconds"] + second["seconds"])
    assert results["invocation"]["steps"] == 8
    # The run's first step is the first segment's, its final loss the last one's (this invocation's).
    assert results["first_step_seconds"] == first["first_step_seconds"]
    assert results["final_loss"] == second["final_loss"] == results["invocation"]["final_loss"]
    final = load_checkpoint(list_checkpoints(out)[-1][1])["model"]
    reference = load_checkpoint(list_checkpoints(whole)[-1][1])["model"]
    assert all(torch.equal(final[name], reference[name]) for name in reference)


# ---- verified checkpoints and no silent restart -------------------------------------------------------------------


def test_a_damaged_newest_checkpoint_is_passed_over_with_a_warning(data, whole, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(whole, out)  # the finished run, then cut after its checkpoint of step 16, which is damaged
    os.remove(out / "train_results.json")
    os.remove(checkpoint_path(out, 24))
    newest = checkpoint_path(out, 16)
    flip_byte(newest, os.path.getsize(newest) // 2)
    capsys.readouterr()
    assert main(flags(data, out)) == 0
    output = capsys.readouterr().out
    assert f"warning: {newest}: damaged checkpoint" in output and f"resumed from {checkpoint_path(out, 8)}" in output
    final = load_checkpoint(checkpoint_path(out, 24))["model"]
    reference = load_checkpoint(list_checkpoints(whole)[-1][1])["model"]
    assert all(torch.equal(final[name], reference[name]) for name in reference)


def test_every_checkpoint_damaged_or_gone_is_refused_and_nothing_is_touched(data, whole, tmp_path, error_line):
    out = tmp_path / "run"
    shutil.copytree(whole, out)
    for _, path in list_checkpoints(out):
        flip_byte(path, os.path.getsize(path) // 2)
    before = snapshot(out)
    assert main(flags(data, out)) == 2
    assert "every checkpoint is damaged" in error_line()
    assert snapshot(out) == before
    for _, path in list_checkpoints(out):
        os.remove(path)
    before = snapshot(out)
    assert main(flags(data, out)) == 2
    assert (
        "this run has saved checkpoints (train_results.json is there) but holds none now, so it cannot resume; "
        "to start it over, remove the directory" in error_line()
    )
    assert snapshot(out) == before
    os.remove(out / "train_results.json")  # as a SIGKILL leaves it: only the metrics log tells of the checkpoints
    before = snapshot(out)
    assert main(flags(data, out)) == 2
    assert f"({out}/metrics.jsonl line 3 follows the checkpoint of step 8) but holds none now" in error_line()
    assert snapshot(out) == before


def test_leftover_temporary_files_are_removed_at_start(data, whole, capsys):
    leftover = whole / ".ckpt-abcd1234.tmp"
    leftover.write_bytes(b"half a checkpoint")
    assert main(flags(data, whole)) == 0
    assert not leftover.exists() and f"removed {leftover}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--modeling=recompute", "made with --modeling=baseline"),
        ("--recompute-policy=selective", "made with --recompute_policy=full"),
        ("--precision=bf16", "trained with precision fp32, the command gives bf16"),
        ("--amp", "trained with precision fp32, the command gives fp16"),
        ("--use_xla", "trained with compile False, the command gives True"),
    ],
)
def test_a_flag_that_changes_what_the_run_measures_cannot_change_on_resume(data, whole, flag, message, error_line):
    before = snapshot(whole)
    assert main(flags(data, whole, flag)) == 2
    assert message in error_line()
    assert snapshot(whole) == before
    assert main(flags(data, whole, "--precision=fp32")) == 0  # the same setting, however spelled, continues it
