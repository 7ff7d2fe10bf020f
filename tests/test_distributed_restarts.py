"""The most involved data-parallel setting on 2 processes under torchrun (`bertbench launch`, gloo on the CPU) gives
the loss curve, weights and scores of 1 process with the same global batch; its workers killed with SIGKILL are
restarted and resume, SIGTERM saves and the run goes on later, ending as if uninterrupted. The uninterrupted run is
the reference of both, so they share this module (and its worker); test_distributed.py's one job holds the rest."""

import json
import os
import re
import signal
import subprocess
import time

import pytest
import torch
from helpers import classifier_flags, launch_command, read_json, write_bert_dir

from bertbench.common.run_files import ALL_RESULTS, EVENT_FILE_NAME, LOCK, checkpoint_name
from bertbench.runners.classifier import main as classify
from bertbench.tasks.synthetic import write_glue_task
from bertbench.training.checkpoint import list_checkpoints, load_checkpoint

pytestmark = pytest.mark.slow

# Dropout off: 1 process and 2 processes then compute the same function, so their runs can be compared.
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """glue/MRPC (256 training examples, 61 dev: an odd number, so the ranks' shards differ) and bert/."""
    root = tmp_path_factory.mktemp("distributed")
    write_glue_task(root / "glue", "MRPC", train=256, dev=61, test=16)
    write_bert_dir(root / "bert", **NO_DROPOUT)
    return root


def flags(data, out, *extra):
    return classifier_flags(data, out, "--do_train", "--do_eval", *extra, batch=None, learning_rate="2e-3", log_every=4)


def run(command, timeout=300):
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def classify_on(processes: int, data, out, *extra):
    return run(launch_command(processes, "-m", "bertbench.runners.classifier", *flags(data, out, *extra)))


def losses(out):
    return [(record["step"], record["loss"]) for record in map(json.loads, open(out / "metrics.jsonl"))]


def final_weights(directory):
    return load_checkpoint(list_checkpoints(directory)[-1][1])["model"]


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    assert classify(flags(data, out, "--train_batch_size=16", "--num_train_epochs=5")) == 0
    return out


# The most involved setting: recompute (selective), 2 accumulated micro-batches of 4 on each of 2 processes (a global
# batch of 16: 80 steps in 5 epochs, which give the killed-workers test room to hit the run twice in the middle).
# Each setting costs a torchrun job: the other policies' DDP steps are ddp_worker's (test_distributed.py), the plain
# DDP step the job templates' and scripts' tests'.
TWO_PROCESSES = [
    "--train_batch_size=4",
    "--num_accumulation_steps=2",
    "--modeling=recompute",
    "--recompute-policy=selective",
    "--num_train_epochs=5",
]
TWO_PROCESS_STEPS = 80


@pytest.fixture(scope="module")
def two_processes(data, tmp_path_factory):
    """The run of TWO_PROCESSES, uninterrupted, and its output."""
    out = tmp_path_factory.mktemp("two") / "run"
    return out, classify_on(2, data, out, *TWO_PROCESSES)


def test_two_processes_match_one_with_the_same_global_batch(two_processes, one_process):
    """The most involved setting against the plainest: the baseline on 1 process with batches of 16."""
    out, done = two_processes
    steps, curve = zip(*losses(out))
    reference_steps, reference_curve = zip(*losses(one_process))
    assert steps == reference_steps == tuple(range(4, TWO_PROCESS_STEPS + 1, 4))
    assert curve == pytest.approx(reference_curve, rel=1e-5)  # the logged loss is the mean over both ranks
    weights, reference = final_weights(out), final_weights(one_process)
    assert weights.keys() == reference.keys()
    for name in weights:
        torch.testing.assert_close(weights[name], reference[name], rtol=1e-4, atol=1e-5)

    train, reference_train = read_json(out / "train_results.json"), read_json(one_process / "train_results.json")
    assert (train["world_size"], train["global_step"]) == (2, TWO_PROCESS_STEPS)
    assert train["sentences"] == reference_train["sentences"]
    assert (train["nodes"], reference_train["nodes"]) == (1, 1)
    results, reference_results = read_json(out / "eval_results.json"), read_json(one_process / "eval_results.json")
    assert results["dev_examples"] == 61  # every dev example scored once, across both ranks
    assert results["dev_acc"] == reference_results["dev_acc"]
    assert results["dev_loss"] == pytest.approx(reference_results["dev_loss"], rel=1e-4)
    # rank 0 alone reports and writes: one summary, one checkpoint, no per-rank files
    assert done.stdout.count("***** Eval results") == 1 and done.stdout.count("***** Training summary") == 1
    assert [step for step, _ in list_checkpoints(out)] == [TWO_PROCESS_STEPS]
    names = sorted(os.listdir(out))
    assert [name for name in names if not EVENT_FILE_NAME.match(name)] == [
        LOCK,
        ALL_RESULTS,
        "bertbench_run.json",
        checkpoint_name(TWO_PROCESS_STEPS),
        "eval",
        "eval_results.json",
        "eval_results.txt",
        "metrics.jsonl",
        "train_results.json",
    ]
    assert len([name for name in names if EVENT_FILE_NAME.match(name)]) == len(os.listdir(out / "eval")) == 1


def worker_with_rank(rank: int, marker: str) -> int:
    """The pid of the torchrun worker with RANK=rank whose command line holds `marker`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                cmdline = handle.read().decode(errors="replace")
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if marker in cmdline and f"RANK={rank}" in environ and "bertbench.runners.launch" not in cmdline:
            return int(pid)
    raise AssertionError(f"no worker with RANK={rank} running {marker}")


def preempted_run(data, out):
    """TWO_PROCESSES (two_processes is its uninterrupted run) with a checkpoint every 4 steps, as often as it logs,
    and a restart of the workers allowed: 76 steps after the first checkpoint for the first hit to land in (the
    test reacts to that checkpoint), more after the restart for the second."""
    return launch_command(
        2,
        "-m",
        "bertbench.runners.classifier",
        *flags(data, out, *TWO_PROCESSES, "--save_checkpoints_steps=4"),
        restarts=1,
    )


def newest_checkpoint_after(process, out, step: int) -> int:
    """Waits, while `process` runs, for a checkpoint newer than `step` in `out`; returns the newest one's step. A look
    every 20 ms: a checkpoint comes every 4 steps of tens of ms, and the run has dozens left when the test acts (a
    look every 5 ms cost the test process 2 CPU-seconds)."""
    deadline = time.monotonic() + 120
    while not list_checkpoints(out) or list_checkpoints(out)[-1][0] <= step:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    return list_checkpoints(out)[-1][0]


def test_killed_workers_restart_and_resume_a_sigterm_saves_and_the_run_ends_as_if_uninterrupted(
    data, tmp_path, two_processes
):
    """One job, hit twice: SIGKILL to the worker of rank 0 (the one that writes the checkpoints), after which
    torchrun restarts both workers and they resume from the newest checkpoint (in a process group of their own: the
    store keeps the dead group's keys); then SIGTERM to the launcher (what scancel, qdel and a job's time limit do),
    which passes it to the workers: they save and it exits 143. The same command then ends the run with the
    uninterrupted run's weights, scores and log."""
    out = tmp_path / "preempted"
    uninterrupted = two_processes[0]
    process = subprocess.Popen(preempted_run(data, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_after = newest_checkpoint_after(process, out, -1)
    os.kill(worker_with_rank(0, str(out)), signal.SIGKILL)
    newest_checkpoint_after(process, out, killed_after)  # the restart trains
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "bertbench launch: stopped by SIGTERM" in output
    resumed = [int(step) for step in re.findall(r"resumed from \S+ckpt-0*(\d+)\.pt \(step \d+", output)]
    # the restart went on from the newest checkpoint there was when its worker was killed, or a newer one
    assert len(resumed) == 1 and resumed[0] >= killed_after, output[-3000:]
    train = read_json(out / "train_results.json")
    assert train["interrupted_by"] == "SIGTERM"
    assert killed_after < train["global_step"] == list_checkpoints(out)[-1][0] < TWO_PROCESS_STEPS
    assert not (out / "eval_results.json").exists()

    run(preempted_run(data, out))
    assert all(torch.equal(a, b) for a, b in zip(final_weights(out).values(), final_weights(uninterrupted).values()))
    assert read_json(out / "eval_results.json") == read_json(uninterrupted / "eval_results.json")
    # Each step logged once (those logged after the last checkpoint and lost, once), with the uninterrupted run's
    # losses: the line SIGTERM's stop wrote closed its window early, and the resumed run logged the whole window.
    assert losses(out) == losses(uninterrupted)
    assert [step for step, _ in losses(out)] == list(range(4, TWO_PROCESS_STEPS + 1, 4))


def test_a_recorded_run_keeps_its_lr_scaling(one_process, error_line):
    assert classify(["--output_dir", str(one_process), "--do_eval", "--lr_scaling=linear"]) == 2
    assert "this run was made with --lr_scaling=none, the command gives linear" in error_line()
