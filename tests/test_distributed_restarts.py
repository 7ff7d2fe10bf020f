"""The most involved data-parallel setting on 2 processes under torchrun (`bertbench launch`, gloo on the CPU) gives
the loss curve, weights and scores of 1 process with the same global batch; its workers killed with SIGKILL are
restarted and resume, SIGTERM saves and the run goes on later, ending as if uninterrupted. The uninterrupted run is
the reference of both, so they share this module (and its worker), and one torchrun job (torchrun_phases.py) runs it
and then the preempted run, so that the job's processes start once for both; test_distributed.py's one job holds the
rest."""

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
HERE = os.path.dirname(os.path.abspath(__file__))

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
# The preempted run: TWO_PROCESSES with a checkpoint every 4 steps, as often as it logs: 76 steps after the first
# checkpoint for the first hit to land in (the job reacts to that checkpoint), more after the restart for the second.
CHECKPOINT_EVERY_4 = [*TWO_PROCESSES, "--save_checkpoints_steps=4"]


def preempted_run(data, out):
    """The preempted run's command on its own: the job that preempted it ends it."""
    return launch_command(2, "-m", "bertbench.runners.classifier", *flags(data, out, *CHECKPOINT_EVERY_4), restarts=1)


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


def newest_checkpoint_after(process, out, step: int) -> int:
    """Waits, while `process` runs, for a checkpoint newer than `step` in `out`; returns the newest one's step. A look
    every 20 ms: a checkpoint comes every 4 steps of tens of ms, and the run has dozens left when the test acts (a
    look every 5 ms cost the test process 2 CPU-seconds)."""
    deadline = time.monotonic() + 120
    while not list_checkpoints(out) or list_checkpoints(out)[-1][0] <= step:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    return list_checkpoints(out)[-1][0]


def phase_logs(job, name: str) -> list[str]:
    """Each rank's log of the job's phase `name` (a restart's lines after the killed attempt's)."""
    return [(job["root"] / f"{name}.rank{rank}.log").read_text() for rank in range(2)]


@pytest.fixture(scope="module")
def job(data, tmp_path_factory):
    """One torchrun job of 2 processes, a restart allowed, its phases one after the other: TWO_PROCESSES
    uninterrupted (uninterrupted/), then CHECKPOINT_EVERY_4 (preempted/), hit twice: SIGKILL to the worker of rank 0
    (the one that writes the checkpoints) after the run's first checkpoint, after which torchrun restarts both workers
    and they go on from the phase that was interrupted, resuming from the newest checkpoint (in a process group of
    their own: the store keeps the dead group's keys); then, once the restart has written a checkpoint, SIGTERM to
    the launcher (what scancel, qdel and a job's time limit do), which passes it to the workers: they save and it
    exits 143. Its output, the step of the newest checkpoint when the worker was killed, and the directories."""
    root = tmp_path_factory.mktemp("job")
    uninterrupted, preempted = root / "uninterrupted", root / "preempted"
    plan = [
        {
            "name": "uninterrupted",
            "call": "bertbench.runners.classifier:main",
            "argv": flags(data, uninterrupted, *TWO_PROCESSES),
        },
        {
            "name": "preempted",
            "call": "bertbench.runners.classifier:main",
            "argv": flags(data, preempted, *CHECKPOINT_EVERY_4),
        },
    ]
    (root / "plan.json").write_text(json.dumps(plan))
    command = launch_command(2, os.path.join(HERE, "torchrun_phases.py"), str(root / "plan.json"), restarts=1)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        killed_after = newest_checkpoint_after(process, preempted, -1)
        os.kill(worker_with_rank(0, str(root / "plan.json")), signal.SIGKILL)
        newest_checkpoint_after(process, preempted, killed_after)  # the restart trains
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=120)[0]
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return {
        "root": root,
        "returncode": process.returncode,
        "output": output,
        "killed_after": killed_after,
        "uninterrupted": uninterrupted,
        "preempted": preempted,
    }


def test_two_processes_match_one_with_the_same_global_batch(job, one_process):
    """The most involved setting against the plainest: the baseline on 1 process with batches of 16."""
    out = job["uninterrupted"]
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
    assert [(job["root"] / f"uninterrupted.rank{rank}.status").read_text() for rank in range(2)] == ["0", "0"]
    assert [
        (log.count("***** Eval results"), log.count("***** Training summary"))
        for log in phase_logs(job, "uninterrupted")
    ] == [(1, 1), (0, 0)]
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


def test_killed_workers_restart_and_resume_a_sigterm_saves_and_the_run_ends_as_if_uninterrupted(data, job):
    """The job's preempted run (see job): its workers restarted after SIGKILL resume from the newest checkpoint, and
    SIGTERM saves and stops the job with 143. The same command then ends the run with the uninterrupted run's
    weights, scores and log."""
    out, uninterrupted, killed_after, output = (
        job["preempted"],
        job["uninterrupted"],
        job["killed_after"],
        job["output"],
    )
    assert job["returncode"] == 128 + signal.SIGTERM, output[-3000:]
    assert "bertbench launch: stopped by SIGTERM" in output
    logs = "".join(phase_logs(job, "preempted"))
    resumed = [int(step) for step in re.findall(r"resumed from \S+ckpt-0*(\d+)\.pt \(step \d+", logs)]
    # the restart went on from the newest checkpoint there was when its worker was killed, or a newer one
    assert len(resumed) == 1 and resumed[0] >= killed_after, logs[-3000:]
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
