"""The original suite's headline experiment as users run it (job_templates/pbs/twenty_minutes.sh): on a PBS login
node, submit the 1-GPU baseline and the 2-node recompute run for the same wall-clock budget and a job that scores
them with eval.sh and reports them side by side. Here qsub and pbs_tmrsh are stand-ins (tests/fixtures) that run
each job at once on this machine as PBS would (a fresh environment, the node file, the argument vector of
tm_spawn); the model is the tiny TF1 fixture, the budget seconds."""

import json
import os
import subprocess
import sys

import pytest
from helpers import free_port

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
        # epochs enough that the 1-second budget ends both runs however fast the machine is
        MAX_TRAIN_SECONDS="1",
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


def recipe(env):
    return subprocess.run(
        [os.path.join(ROOT, "job_templates", "pbs", "twenty_minutes.sh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.mark.slow
def test_the_twenty_minute_comparison_trains_both_for_the_budget_and_reports_them(login_node, tmp_path):
    done = recipe(login_node)
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
    for run, processes, scaling in ((baseline, 1, "none"), (optimized, 2, "linear")):
        train = json.loads((run / "train_results.json").read_text())
        assert (train["world_size"], train["lr_scaling"], train["budget_exhausted"]) == (processes, scaling, True)
    assert "pbs_tmrsh node-1 /bin/bash -c" in (tmp_path / "starter.log").read_text()  # the second node's start
    # rank 0 reports, on whichever node c10d gave it (ranks go in the order the agents arrive)
    logs = [(optimized / f"train.node{node}.log").read_text() for node in (0, 1)]
    assert sum("***** Training MNLI" in log for log in logs) == 1

    # eval.sh scored both again, then the report put them side by side
    assert (spool / "bertbench-compare.o3").read_text().count("***** Eval results (MNLI") == 2
    report = json.loads((results / "report" / "report.json").read_text())
    rows = {row["run"]: row for row in report["context"]["training"]["rows"]}
    assert set(rows) == {baseline.name, optimized.name}
    for run in (baseline, optimized):
        row, train = rows[run.name], json.loads((run / "train_results.json").read_text())
        scores = json.loads((run / "eval_results.json").read_text())
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
