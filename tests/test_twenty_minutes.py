"""The original suite's headline experiment as users run it (job_templates/pbs/twenty_minutes.sh): on a PBS login
node, submit the 1-GPU baseline and the 2-node recompute run for the same wall-clock budget and a job that scores
them with eval.sh and reports them side by side. Here qsub and pbs_tmrsh are stand-ins (tests/fixtures) that run
each job at once on this machine as PBS would (a fresh environment, the node file, the argument vector of
tm_spawn); the model is the tiny TF1 fixture, the budget seconds. The optimized job's run is also the test of
optimized_2x4gpu.pbs across two hosts inside a container (test_job_templates runs the other templates)."""

import os
import re
import shlex
import subprocess
import sys

import pytest
from helpers import free_port, read_json

from bertbench.tasks.synthetic import write_glue_task

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


@pytest.fixture
def login_node(tmp_path):
    """The login node's environment: qsub and pbs_tmrsh on PATH, BERT_DIR, GLUE_DIR (MNLI), the CPU's settings."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("qsub", "pbs_tmrsh"):
        (bin_dir / tool).symlink_to(os.path.join(HERE, "fixtures", tool))
    write_glue_task(tmp_path / "glue", "MNLI", train=400, dev=32, test=8)
    return dict(
        os.environ,
        PATH=f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        QSUB_SPOOL=str(tmp_path / "spool"),
        STARTER_LOG=str(tmp_path / "starter.log"),
        BERT_DIR=os.path.join(HERE, "fixtures", "tf1_tiny"),
        GLUE_DIR=str(tmp_path / "glue"),
        RESULTS_DIR=str(tmp_path / "results"),
        PYTHON=sys.executable,
        MASTER_PORT=str(free_port()),
        # epochs enough that the budget ends both runs however fast the machine is; a quarter of a second is some
        # steps of the tiny model (rank 0 logs the first), and each of the three training processes spends it
        MAX_TRAIN_SECONDS="0.25",
        EPOCHS="100",
        BATCH_SIZE="8",
        LEARNING_RATE="1e-3",
        SEQ_LENGTH="32",
        USE_XLA="false",
        GPUS_PER_NODE="1",
        # a thread per process (the jobs' default is 5): the tiny runs' OpenMP threads would spin against each other
        CORES_PER_GPU="1",
        RDZV_TIMEOUT="120",
    )


def recipe(env, cwd=ROOT):
    return subprocess.run(
        [os.path.join(ROOT, "job_templates", "pbs", "twenty_minutes.sh")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


# What the singularity stand-in records of the knobs the jobs pass through the environment (scripts/common.sh).
KNOBS_SEEN = " ".join(
    f"{name}=${{{name}:-}}"
    for name in ("MODELING", "RECOMPUTE_POLICY", "MAX_TRAIN_SECONDS", "LR_SCALING", "EXTRA_FLAGS", "CORES_PER_GPU")
)


@pytest.mark.slow
def test_the_twenty_minute_comparison_trains_both_for_the_budget_and_reports_them(login_node, tmp_path):
    """Submitted from a directory whose path has a space (the repository's job_templates/ and scripts/), with IMAGE
    set: every job's commands run in `singularity exec --nv IMAGE` (a stand-in that records the job, the node, the
    knobs it sees and its arguments, and runs the command). PYTHON is the interpreter with LOGLEVEL=INFO, so that
    torchrun's agents say what they did, on one thread where the job sets none (compare.pbs: its evaluations and
    report would take a thread per core, spinning against each other). The optimized job reaches its second host through the default starter,
    pbs_tmrsh (its stand-in runs the argument vector as tm_spawn does, with the job's PBS environment only)."""
    bin_dir = tmp_path / "bin"
    sif_log = tmp_path / "sif"
    (bin_dir / "singularity").write_text(
        f'#!/usr/bin/env bash\necho "$PBS_JOBID${{NODE_RANK:+ node $NODE_RANK}}: {KNOBS_SEEN} $*" >> '
        f'{shlex.quote(str(sif_log))}\n[ "$1" = exec ] || exit 64\nshift\nwhile [[ "$1" == --* ]]; do shift; done\n'
        'shift\nexec "$@"\n'
    )
    python = bin_dir / "python"
    python.write_text(
        f'#!/bin/sh\nLOGLEVEL=INFO OMP_NUM_THREADS=${{OMP_NUM_THREADS:-1}} exec {shlex.quote(sys.executable)} "$@"\n'
    )
    for tool in (bin_dir / "singularity", python):
        tool.chmod(0o755)
    workdir = tmp_path / "qsub dir"
    workdir.mkdir()
    for name in ("job_templates", "scripts"):
        (workdir / name).symlink_to(os.path.join(ROOT, name))
    env = dict(login_node, IMAGE="/images/bertbench.sif", EXTRA_FLAGS="--log_step_count_steps=1", PYTHON=str(python))
    done = recipe(env, cwd=workdir)
    spool = tmp_path / "spool"
    outputs = "\n".join(path.read_text()[-3000:] for path in sorted(spool.glob("*.o*")))
    assert done.returncode == 0, done.stderr + outputs
    assert done.stdout.splitlines() == [
        "baseline (1 GPU): 1.pbs-server",
        "optimized (2 x 4 GPUs): 2.pbs-server",
        f"compare (after both): 3.pbs-server -> {tmp_path}/results/report/report.md",
    ]
    assert [(spool / f"{job}.pbs-server.status").read_text() for job in (1, 2, 3)] == ["0\n"] * 3, outputs
    submitted = (spool / "qsub.log").read_text().splitlines()
    assert submitted[2].startswith("-W depend=afterany:1.pbs-server:2.pbs-server ")
    assert "GPUS_PER_NODE" not in submitted[0] and "GPUS_PER_NODE" in submitted[1]  # the optimized job's only

    results = tmp_path / "results"
    baseline = results / "MNLI_fp16_bs8_lr1e-3_seq32_baseline_gpu1"
    optimized = results / "MNLI_fp16_bs8_lr1e-3_seq32_recompute-full_gpu1_nodes2"
    assert sorted(path.name for path in results.iterdir()) == sorted([baseline.name, optimized.name, "report"])
    for run, processes, nodes, modeling, scaling in (
        (baseline, 1, 1, "baseline", "none"),
        (optimized, 2, 2, "recompute", "linear"),
    ):
        train = read_json(run / "train_results.json")
        assert (train["world_size"], train["nodes"], train["modeling"], train["lr_scaling"]) == (
            processes,
            nodes,
            modeling,
            scaling,
        )
        assert train["budget_exhausted"] is True
        assert train["learning_rate"] == pytest.approx(1e-3 * processes)  # linear scaling on the optimized run

    # every job's commands ran in the container; the optimized job's on both nodes, with the same knobs
    calls = {}
    for line in sif_log.read_text().splitlines():
        where, call = line.split(": ", 1)
        calls.setdefault(where, []).append(call.split(" exec --nv /images/bertbench.sif ", 1))
    assert sorted(calls) == ["1.pbs-server node 0", "2.pbs-server node 0", "2.pbs-server node 1", "3.pbs-server"]
    assert (
        calls["2.pbs-server node 0"]
        == calls["2.pbs-server node 1"]
        == [
            [
                "MODELING=recompute RECOMPUTE_POLICY= MAX_TRAIN_SECONDS=0.25 LR_SCALING=linear "
                "EXTRA_FLAGS=--log_step_count_steps=1 CORES_PER_GPU=1",
                "scripts/run_glue.sh MNLI 8 1e-3 fp16 false 1 32 64 100 0.1 ",
            ]
        ]
    )
    assert calls["1.pbs-server node 0"][0][1].startswith("scripts/run_glue.sh MNLI 8 1e-3 fp16 false 1 32 64 100 ")
    assert [call[1].split(" -m ")[0] for call in calls["3.pbs-server"]] == [f"scripts/eval.sh {results}", str(python)]
    starts = (tmp_path / "starter.log").read_text().splitlines()
    assert len(starts) == 1 and starts[0].startswith("pbs_tmrsh node-1 /bin/bash -c ")  # the first host: here

    assert sorted(path.name for path in optimized.glob("*.log")) == [
        "command.log",
        "train.node0.log",
        "train.node1.log",
    ]
    assert "--rdzv-backend=c10d --rdzv-endpoint=localhost:" in (optimized / "command.log").read_text()
    logs = [(optimized / f"train.node{node}.log").read_text() for node in (0, 1)]
    # Each node's agent joined the 2-node group, as one of its two ranks (c10d hands them out in the order the agents
    # arrive, not by NODE_RANK); rank 0 reports, on whichever node it is
    ranks = [re.findall(r"\bgroup_rank=(\d+)", log) for log in logs]
    assert sorted(found[0] for found in ranks if found) == ["0", "1"], logs[1][-3000:]
    assert all("group_world_size=2" in log for log in logs)
    rank0_log = logs[[found[:1] for found in ranks].index(["0"])]
    assert "***** Training MNLI: 400 examples, 2500 steps, batch 8 x 1 x 2 processes" in rank0_log
    assert re.search(r"^step 1/2500  loss ", rank0_log, re.M)  # EXTRA_FLAGS reached the runner
    assert sum("***** Training MNLI" in log for log in logs) == 1
    assert "".join(logs).count("***** Eval results") == 1  # one set of results, from rank 0

    # eval.sh scored both again, then the report put them side by side
    assert (spool / "bertbench-compare.o3").read_text().count("***** Eval results (MNLI") == 2
    report = read_json(results / "report" / "report.json")
    rows = {row["run"]: row for row in report["context"]["training"]["rows"]}
    assert set(rows) == {baseline.name, optimized.name}
    for run in (baseline, optimized):
        row, train = rows[run.name], read_json(run / "train_results.json")
        scores = read_json(run / "eval_results.json")
        assert (row["sentences"], row["seq_per_s"]) == (train["sentences"], train["sentences_per_second"])
        assert row["dev:dev_matched_acc"] == scores["dev_matched_acc"] and row["ended"] == "time budget"
    markdown = (results / "report" / "report.md").read_text()
    assert "| sentences seen | sentences/s |" in markdown and f"| {optimized.name} | recompute (full) | 2 |" in markdown
    for plot in ("training-progress", "training-accuracy"):
        assert (results / "report" / f"report-{plot}.png").stat().st_size > 0


def test_the_recipe_refuses_before_submitting_anything(login_node, tmp_path):
    done = recipe(dict(login_node, MAX_TRAIN_SECONDS="twenty minutes"))
    assert done.returncode == 2
    assert (
        done.stderr == "twenty_minutes.sh: error: MAX_TRAIN_SECONDS must be a number of seconds, got 'twenty minutes'\n"
    )
    no_bert = {name: value for name, value in login_node.items() if name != "BERT_DIR"}
    done = recipe(no_bert)
    assert done.returncode == 2 and "twenty_minutes.sh: error: BERT_DIR is not set" in done.stderr
    assert not (tmp_path / "spool").exists()  # nothing was submitted


@pytest.fixture
def recording_qsub(login_node, tmp_path):
    """A qsub that records its arguments and each job's -v list, and runs nothing."""
    bin_dir = tmp_path / "recording-bin"
    bin_dir.mkdir()
    (bin_dir / "qsub").write_text(
        f'#!/bin/sh\necho "$@" >> {tmp_path}/qsub.log\necho "$(wc -l < {tmp_path}/qsub.log).pbs-server"\n'
    )
    (bin_dir / "qsub").chmod(0o755)
    return dict(login_node, PATH=f"{bin_dir}:{login_node['PATH']}")


def job_variables(tmp_path):
    """{job template: its -v list as a dict (NAME alone: the caller's value)} of the last recipe run."""
    jobs = {}
    for line in (tmp_path / "qsub.log").read_text().splitlines():
        words = line.split()
        items = words[words.index("-v") + 1].split(",")
        jobs[os.path.basename(words[-1])] = dict(item.partition("=")[::2] for item in items)
    (tmp_path / "qsub.log").unlink()
    return jobs


def test_each_job_takes_its_own_batch_and_batch_size_still_sets_both(recording_qsub, tmp_path):
    env = {name: value for name, value in recording_qsub.items() if name != "BATCH_SIZE"}
    assert recipe(dict(env, BASELINE_BATCH_SIZE="32", OPTIMIZED_BATCH_SIZE="64")).returncode == 0
    jobs = job_variables(tmp_path)
    assert (jobs["baseline_1gpu.pbs"]["BATCH_SIZE"], jobs["optimized_2x4gpu.pbs"]["BATCH_SIZE"]) == ("32", "64")
    assert recipe(dict(env, BATCH_SIZE="16", OPTIMIZED_BATCH_SIZE="48")).returncode == 0
    jobs = job_variables(tmp_path)
    assert (jobs["baseline_1gpu.pbs"]["BATCH_SIZE"], jobs["optimized_2x4gpu.pbs"]["BATCH_SIZE"]) == ("16", "48")
    assert recipe(dict(env, BATCH_SIZE="16")).returncode == 0  # today's invocation: one batch for both
    jobs = job_variables(tmp_path)
    assert (jobs["baseline_1gpu.pbs"]["BATCH_SIZE"], jobs["optimized_2x4gpu.pbs"]["BATCH_SIZE"]) == ("16", "16")
    assert recipe(env).returncode == 0  # none: each job's own default
    assert all("BATCH_SIZE" not in variables for variables in job_variables(tmp_path).values())
    done = recipe(dict(env, OPTIMIZED_BATCH_SIZE="big"))
    assert (
        done.returncode == 2
        and done.stderr == "twenty_minutes.sh: error: OPTIMIZED_BATCH_SIZE must be a positive integer, got 'big'\n"
    )


def test_without_qsub_it_says_so_in_one_line(login_node, tmp_path):
    done = recipe(dict(login_node, PATH=f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("twenty_minutes.sh: error: qsub not found: run it on a PBS login node")
    assert len(done.stderr.splitlines()) == 1
