"""Failures a user meets end in one line and lose nothing: a disk that fills up (a file-size limit, a full tmpfs) while
a checkpoint, results or the metrics log is written, and a signal in every phase of a command (start-up, training,
evaluation, prediction, a second signal)."""

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import classifier_flags, flip_byte, snapshot, write_bert_dir
from tqdm import tqdm

from bertbench.common.durable import WriteError, write_atomically
from bertbench.common.signals import Stopped
from bertbench.model.factory import ModelSettings
from bertbench.runners.classifier import main
from bertbench.tasks.synthetic import write_glue_task
from bertbench.training.checkpoint import list_checkpoints, load_checkpoint, save_checkpoint, verify_checkpoint
from bertbench.training.metrics import MetricsLog
from bertbench.training.progress import log


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("failures")
    write_glue_task(root / "glue", "MRPC", train=64, dev=32, test=16)
    write_bert_dir(root / "bert")
    return root


def flags(data, out, *extra):
    return classifier_flags(data, out, *extra, learning_rate="2e-3", save_every=4, log_every=4)


def temporary_files(directory):
    return [name for name in os.listdir(directory) if name.endswith(".tmp")]


@pytest.fixture(scope="module")
def finished_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(flags(data, out, "--do_train", "--do_eval", "--do_predict")) == 0
    return out


def copy_of(run, tmp_path):
    shutil.copytree(run, tmp_path / "run")
    return tmp_path / "run"


# ---- a full disk -------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def file_size_limit(size):
    """Writes past `size` bytes fail with EFBIG in this process (SIGXFSZ ignored), as on a full disk."""
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)


def test_a_results_file_that_cannot_be_written_is_named_and_the_old_one_kept(tmp_path):
    path = tmp_path / "train_results.json"
    write_atomically(path, '{"steps": 320}\n')
    with file_size_limit(1024), pytest.raises(WriteError) as failure:
        write_atomically(path, "x" * 4096)
    assert str(failure.value) == f"{path}: could not be written (File too large); the previous file is kept"
    assert path.read_text() == '{"steps": 320}\n' and os.listdir(tmp_path) == ["train_results.json"]
    with file_size_limit(1024), pytest.raises(WriteError, match="could not be written .*; nothing was written"):
        write_atomically(tmp_path / "new.json", "x" * 4096)
    assert os.listdir(tmp_path) == ["train_results.json"]


def test_a_checkpoint_that_cannot_be_written_is_named_and_the_newest_whole_one_kept(tmp_path):
    state = {"model": {"weight": torch.zeros(64, 64)}}
    kept = save_checkpoint(tmp_path, 4, state)
    with file_size_limit(4096), pytest.raises(WriteError) as failure:
        save_checkpoint(tmp_path, 8, {"model": {"weight": torch.ones(256, 256)}})
    assert str(failure.value).startswith(f"{tmp_path}/ckpt-000000008.pt: could not be written (")
    assert str(failure.value).endswith(f"); the newest complete checkpoint is {kept}")
    assert list_checkpoints(tmp_path) == [(4, kept)] and not temporary_files(tmp_path)
    verify_checkpoint(kept)


def test_a_metrics_line_that_cannot_be_written_names_the_log(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 4, "loss": 0.5})
    with file_size_limit(os.path.getsize(tmp_path / "metrics.jsonl") + 8), pytest.raises(WriteError) as failure:
        log.write({"step": 8, "loss": 0.25})
    assert str(failure.value) == (
        f"{tmp_path}/metrics.jsonl: could not be written (File too large); the lines before this step are kept"
    )


def test_a_metrics_log_line_that_is_not_utf8_json_is_dropped_with_a_warning_on_resume(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 4}\n\xff\xfe not text\n{"step": 8}\n{"step": 12}\n{"step": 16, "lo')
    warnings = []
    MetricsLog(path, resume_step=12, log=warnings.append)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [4, 8, 12]
    assert warnings == [f"warning: {path}: line(s) 2 are not JSON in UTF-8; dropped from the log"]  # not line 5: cut


@pytest.mark.slow
def test_a_run_whose_disk_fills_up_stops_in_one_line_and_resumes_once_there_is_room(data, tmp_path):
    """A real process under a file-size limit as small as a full disk leaves it: the first checkpoint cannot be
    written. Exit status 1, one line naming the file; no temporary file left; the same command later trains."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "bertbench", "classify", *flags(data, out, "--do_train")]

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))

    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=limited, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"bertbench classify: error: {out}/ckpt-000000004.pt: could not be written "
        "(File too large); no checkpoint was kept"
    ]
    assert not temporary_files(out) and not list_checkpoints(out)
    assert main(flags(data, out, "--do_train")) == 0
    assert json.loads((out / "train_results.json").read_text())["global_step"] == 12


@pytest.fixture
def small_tmpfs(tmp_path):
    """A tmpfs of 600 KiB: room for one tiny checkpoint, not for the next beside it (root only)."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_tmpfs_keeps_the_newest_checkpoint_and_the_run_resumes_from_it(
    data, finished_run, small_tmpfs, error_line
):
    out = small_tmpfs / "run"
    assert main(flags(data, out, "--do_train")) == 1
    assert error_line() == (
        f"run_classifier: error: {out}/ckpt-000000008.pt: could not be written (No space left on "
        f"device); the newest complete checkpoint is {out}/ckpt-000000004.pt"
    )
    assert [step for step, _ in list_checkpoints(out)] == [4] and not temporary_files(out)
    verify_checkpoint(out / "ckpt-000000004.pt")
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_tmpfs)], check=True)
    assert main(flags(data, out, "--do_train")) == 0
    results = json.loads((out / "train_results.json").read_text())
    assert results["global_step"] == 12 and results["steps"] == 12  # the segment cut at step 4 still counts
    resumed, whole = (load_checkpoint(list_checkpoints(run)[-1][1])["model"] for run in (out, finished_run))
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)


# ---- things named like a checkpoint --------------------------------------------------------------------------------


def test_a_directory_named_like_a_newer_checkpoint_is_left_alone_and_the_run_resumes_past_it(
    data, finished_run, tmp_path, monkeypatch, capsys
):
    """A SIGTERM in step 6 leaves the checkpoint of step 6; a directory ckpt-000000010.pt/ appears beside it. The
    resumed run names it once, resumes step 6 (not the directory), saves steps 8 and 12 past it, rotation deleting
    only real checkpoints older than the one just written, and ends with the uninterrupted run's weights."""
    out = tmp_path / "run"
    signal_at_forward(monkeypatch, [signal.SIGTERM], training=True, from_call=6)
    assert main(flags(data, out, "--do_train")) == 128 + signal.SIGTERM
    monkeypatch.undo()
    assert [step for step, _ in list_checkpoints(out)] == [6]
    stray = out / "ckpt-000000010.pt"
    stray.mkdir()
    (stray / "notes.txt").write_text("not a checkpoint")
    capsys.readouterr()
    assert main(flags(data, out, "--do_train")) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "warning" in line]
    assert len(warnings) == 1 and f"{stray} is not a checkpoint (a directory)" in warnings[0]
    results = json.loads((out / "train_results.json").read_text())
    assert results["resumed_from"] == str(out / "ckpt-000000006.pt") and results["global_step"] == 12
    assert [step for step, _ in list_checkpoints(out)] == [12]
    assert (stray / "notes.txt").read_text() == "not a checkpoint"
    resumed, whole = (load_checkpoint(list_checkpoints(run)[-1][1])["model"] for run in (out, finished_run))
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)


def test_a_directory_named_like_a_checkpoint_the_run_saves_stops_it_in_one_line_keeping_the_last_one(
    data, tmp_path, error_line
):
    out = tmp_path / "run"
    (out / "ckpt-000000008.pt").mkdir(parents=True)
    assert main(flags(data, out, "--do_train")) == 1
    assert error_line() == (
        f"run_classifier: error: {out}/ckpt-000000008.pt: could not be written (it exists and is not a checkpoint "
        f"(a directory): move it out of the run directory); the newest complete checkpoint is {out}/ckpt-000000004.pt"
    )
    assert [step for step, _ in list_checkpoints(out)] == [4] and not temporary_files(out)
    (out / "ckpt-000000008.pt").rmdir()
    assert main(flags(data, out, "--do_train")) == 0
    assert json.loads((out / "train_results.json").read_text())["resumed_from"] == str(out / "ckpt-000000004.pt")


def test_a_finished_run_run_again_keeps_its_checkpoint_beside_a_newer_damaged_one(finished_run, data, tmp_path):
    """The re-run resumes its last step and prunes as its last save did: up to the checkpoint it resumed, not up to
    a newer file that fails verification (counted, it would leave the damaged file alone)."""
    run = copy_of(finished_run, tmp_path)
    damaged = run / "ckpt-000000016.pt"
    shutil.copy(run / "ckpt-000000012.pt", damaged)
    flip_byte(damaged, os.path.getsize(damaged) // 2)
    assert main(flags(data, run, "--do_train")) == 0
    assert [step for step, _ in list_checkpoints(run)] == [12, 16]
    verify_checkpoint(run / "ckpt-000000012.pt")


# ---- a closed stdout ---------------------------------------------------------------------------------------------


def with_stdout_closed(argv, lines_read=0):
    """Run `bertbench ARGV` whose reader closes stdout after `lines_read` lines, as `| head -N` does (buffered or
    not: PYTHONUNBUFFERED, which some environments set, makes the first write after the close fail at once).
    Returns the exit status and stderr."""
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    process = subprocess.Popen(
        [sys.executable, "-m", "bertbench", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
    )
    for _ in range(lines_read):
        process.stdout.readline()
    process.stdout.close()
    error = process.stderr.read()
    return process.wait(timeout=120), error


@pytest.mark.parametrize("argv", [["--help"], ["evaluate-squad", "--help"]])
def test_help_into_a_closed_pipe_is_quiet(argv):
    status, error = with_stdout_closed(argv)
    assert status in (0, 141) and error == ""  # 141: 128 + SIGPIPE, as a shell reports a process it killed


@pytest.mark.slow
def test_a_run_whose_stdout_closes_trains_evaluates_and_saves_without_a_word(data, tmp_path):
    out = tmp_path / "run"
    assert with_stdout_closed(["classify", *flags(data, out, "--do_train", "--do_eval")], lines_read=1) == (0, "")
    assert json.loads((out / "train_results.json").read_text())["global_step"] == 12
    assert (out / "eval_results.json").exists() and list_checkpoints(out)


# ---- signals in every phase ----------------------------------------------------------------------------------------


def signal_at_forward(monkeypatch, signums, *, training, from_call=1):
    """The model built by the runner sends itself `signums`, one per forward call, from its `from_call`-th forward
    in training (or in evaluation/prediction) mode on."""
    pending, calls = list(signums), []
    build = ModelSettings.build

    def hook(module, args, kwargs):
        if module.training == training:
            calls.append(1)
            if len(calls) >= from_call and pending:
                signal.raise_signal(pending.pop(0))

    def build_hooked(settings, *args, **kwargs):
        model = build(settings, *args, **kwargs)
        model.register_forward_pre_hook(hook, with_kwargs=True)
        return model

    monkeypatch.setattr(ModelSettings, "build", build_hooked)


def stderr_lines(capsys):
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.strip()]


@pytest.fixture
def sigint_interrupts():
    """SIGINT as a `bertbench` process has it while a command runs (KeyboardInterrupt), whatever this process
    inherited: pytest started in the background by a non-interactive shell (`pytest &` in a script) ignores SIGINT,
    and a command run in-process leaves SIGINT to its host (only the training loop and the `bertbench` start-up set
    a handler for it)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize(
    "signum, phase", [(signal.SIGTERM, "do_eval"), (signal.SIGINT, "do_eval"), (signal.SIGTERM, "do_predict")]
)
def test_a_signal_during_evaluation_or_prediction_stops_at_once_and_changes_nothing(
    finished_run, tmp_path, monkeypatch, capsys, sigint_interrupts, signum, phase
):
    run = copy_of(finished_run, tmp_path)
    before = snapshot(run)
    signal_at_forward(monkeypatch, [signum], training=False)
    assert main([f"--output_dir={run}", f"--{phase}"]) == 128 + signum  # the rest comes from the run's record
    name = signal.Signals(signum).name
    assert stderr_lines(capsys) == [
        f"run_classifier: stopped by {name}; every file already written is whole, none half-written"
    ]
    assert snapshot(run) == before and not temporary_files(run)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the command put Python's handler back


def test_a_stop_while_a_line_is_logged_is_not_taken_for_a_logging_error(monkeypatch, capsys):
    """A SIGTERM in tqdm's code as a line is logged. The SIGTERM sweep met one in the lock tqdm made at a command's
    first line, whose clean-up then raised an AttributeError: logging printed "--- Logging error ---" for it, and
    the run went on and exited 0."""

    @contextlib.contextmanager
    def interrupted_then_broken(file=None):
        try:
            raise Stopped("SIGTERM")
        finally:
            raise AttributeError("type object 'tqdm' has no attribute '_lock'")
        yield

    monkeypatch.setattr(tqdm, "external_write_mode", interrupted_then_broken)
    with pytest.raises(Stopped):
        log("***** Training MRPC")
    assert capsys.readouterr().err == ""


def test_a_second_sigint_stops_training_at_once_and_keeps_the_last_whole_checkpoint(
    data, tmp_path, monkeypatch, capsys
):
    """Two micro-batches a step: the first SIGINT (forward 11, in step 6) asks for a save at the step's end, the
    second (forward 12) stops at once. The checkpoint of step 4 stays whole, and the run resumes exactly."""
    run = ["--do_train", "--train_batch_size=8", "--num_accumulation_steps=2"]  # 12 steps, saved every 4
    signal_at_forward(monkeypatch, [signal.SIGINT, signal.SIGINT], training=True, from_call=11)
    assert main(flags(data, tmp_path / "run", *run)) == 130
    err = stderr_lines(capsys)
    assert err[-1] == "run_classifier: stopped by SIGINT; every file already written is whole, none half-written"
    assert [step for step, _ in list_checkpoints(tmp_path / "run")] == [4] and not temporary_files(tmp_path / "run")
    verify_checkpoint(tmp_path / "run" / "ckpt-000000004.pt")
    monkeypatch.undo()
    assert main(flags(data, tmp_path / "run", *run)) == 0
    assert main(flags(data, tmp_path / "whole", *run)) == 0
    resumed, whole = (load_checkpoint(list_checkpoints(tmp_path / name)[-1][1])["model"] for name in ("run", "whole"))
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)


def test_a_signal_while_a_checkpoint_is_written_leaves_no_partial_file(tmp_path, monkeypatch):
    kept = save_checkpoint(tmp_path, 4, {"model": {"weight": torch.zeros(8)}})

    def interrupted_save(obj, handle):
        handle.write(b"PK\x03\x04 part of a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 8, {"model": {"weight": torch.ones(8)}})
    assert list_checkpoints(tmp_path) == [(4, kept)] and not temporary_files(tmp_path)


def catches_sigterm(pid):
    """Whether the process has its SIGTERM handler (its SigCgt mask in /proc): it is inside bertbench's run_command."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            mask = next(int(line.split()[1], 16) for line in handle if line.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_at_start_up_is_one_line_and_leaves_no_directory(data, tmp_path, signum):
    """As soon as the command handles signals, while it is still importing torch (or reading its inputs)."""
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "bertbench", "classify", *flags(data, out, "--do_train")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not catches_sigterm(process.pid) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=60)
    name = signal.Signals(signum).name
    assert process.returncode == 128 + signum, stderr
    (line,) = stderr.splitlines()
    assert re.fullmatch(
        f"(bertbench|run_classifier): stopped by {name}; every file already written is whole, none half-written", line
    )
    assert not out.exists()
