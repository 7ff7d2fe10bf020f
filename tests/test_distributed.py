"""Data parallel training across real processes (torchrun through `bertbench launch`, gloo on the CPU): accumulation
skips the all-reduce; evaluation gathers every example once; the time budget is rank 0's clock; a checkpoint resumes
on another process count; independent workers keep the best (classifier and SQuAD); pre-training's ranks read
shards of their own and resume; the most involved setting on 2 processes gives the loss curve, weights and scores of
1 process with the same global batch, its workers killed with SIGKILL are restarted and resume, and SIGTERM saves,
the run ending as if uninterrupted; a node that never joins fails in one line. The runs of several processes are the
phases of one torchrun job (torchrun_phases.py), so that its processes start once (each imports torch, and DDP's
torch._dynamo: about 4 CPU-seconds a process)."""

import json
import math
import os
import re
import shutil
import signal
import subprocess
import time
from types import SimpleNamespace

import pytest
import torch
from ddp_worker import FirstBatchProbe, features, same_weights
from helpers import (
    classifier_flags,
    free_port,
    launch_command,
    read_json,
    tiny_config,
    write_bert_dir,
    write_nvidia_shard,
)

from bertbench.common.run_files import ALL_RESULTS, EVENT_FILE_NAME, LOCK, checkpoint_name
from bertbench.model.factory import build_model
from bertbench.runners import classifier as run_classifier
from bertbench.runners import launch
from bertbench.runners.classifier import main as classify
from bertbench.runners.config import config_from_values
from bertbench.runners.squad import main as squad
from bertbench.tasks.synthetic import write_glue_task, write_squad
from bertbench.training.batches import ShuffledBatches
from bertbench.training.checkpoint import list_checkpoints, load_checkpoint, worker_dir
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.training.distributed import restart_safe_store
from bertbench.training.loop import Estimator

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
# Dropout off: the runs' figures are then the same function's, whatever the process count.
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """glue/MRPC (256 training examples, 61 dev), squad/ (v2.0), shards/ (4 of 48 sequences of up to 32 tokens) and
    eval/ (one MLPerf variable-length shard) in NVIDIA's layout, and bert/ (the tiny model, no dropout)."""
    root = tmp_path_factory.mktemp("distributed")
    write_glue_task(root / "glue", "MRPC", train=256, dev=61, test=16)
    write_squad(root / "squad", "2.0", train=12, dev=6)
    (root / "shards").mkdir()
    for index in range(4):
        write_nvidia_shard(root / "shards" / f"part_{index:05d}.hdf5", count=48, seed=index)
    (root / "eval").mkdir()
    write_nvidia_shard(root / "eval" / "eval.hdf5", count=40, seed=99, varlength=True)
    write_bert_dir(root / "bert", **NO_DROPOUT)
    return root


def flags(data, out, *extra):
    return classifier_flags(data, out, "--do_train", "--do_eval", *extra, batch=None, learning_rate="2e-3", log_every=4)


def independent_flags(data, out):
    return flags(
        data,
        out,
        "--train_batch_size=8",
        "--no_sync_gradients",
        "--lr_scaling=sqrt",
        "--save_checkpoints_steps=16",
        "--keep_checkpoint_max=2",
    )


def squad_flags(data, out):
    return [
        "--do_train",
        "--do_predict",
        f"--train_file={data / 'squad' / 'train-v2.0.json'}",
        f"--predict_file={data / 'squad' / 'dev-v2.0.json'}",
        "--version_2_with_negative",
        f"--vocab_file={data / 'bert' / 'vocab.txt'}",
        f"--bert_config_file={data / 'bert' / 'bert_config.json'}",
        "--max_seq_length=48",
        "--doc_stride=16",
        "--max_query_length=16",
        "--train_batch_size=4",
        "--learning_rate=1e-3",
        "--no_sync_gradients",
        f"--output_dir={out}",
    ]


def pretraining_flags(data, out):
    return [
        f"--input_dir={data / 'shards'}",
        f"--eval_dir={data / 'eval'}",
        f"--bert_config_file={data / 'bert' / 'bert_config.json'}",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--train_batch_size=8",
        "--learning_rate=2e-3",
        "--log_step_count_steps=5",
        "--save_checkpoints_secs=0",
        f"--output_dir={out}",
        "--do_train",
        "--do_eval",
        "--num_train_steps=8",
        "--save_checkpoints_steps=4",
        "--keep_checkpoint_max=2",
    ]


def run(command, timeout=300):
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def losses(out):
    return [(record["step"], record["loss"]) for record in map(json.loads, open(out / "metrics.jsonl"))]


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "run"
    assert classify(flags(data, out, "--train_batch_size=16", "--num_train_epochs=5")) == 0
    return out


# The most involved setting: recompute (selective), 2 accumulated micro-batches of 4 on each of 2 processes (a global
# batch of 16: 80 steps in 5 epochs, which give the killed-workers test room to hit the run twice in the middle).
# Each setting costs the job a phase: the other policies' DDP steps are ddp_worker's, the plain DDP step the job
# templates' and scripts' tests'.
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


def worker_with_rank(launcher: int, rank: int) -> int:
    """The pid of the torchrun worker with RANK=rank that the launcher (torchrun's agent, pid `launcher`) started."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read().decode(errors="replace").split("\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher and f"RANK={rank}" in environ:
            return int(pid)
    raise AssertionError(f"no worker with RANK={rank} under the launcher {launcher}")


def kill_and_wait(pid: int) -> None:
    """SIGKILL to `pid`, then wait until it has died (a zombie, or reaped), so that it writes nothing more."""
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError:
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} still runs 30 s after SIGKILL")


def newest_checkpoint_after(process, out, step: int) -> int:
    """Waits, while `process` runs, for a checkpoint newer than `step` in `out`; returns the newest one's step. A look
    every 20 ms: a checkpoint comes every 4 steps of tens of ms, and the run has dozens left when the test acts (a
    look every 5 ms cost the test process 2 CPU-seconds)."""
    deadline = time.monotonic() + 300
    while not list_checkpoints(out) or list_checkpoints(out)[-1][0] <= step:
        assert process.poll() is None, f"the job ended ({process.returncode}) before a checkpoint after step {step}"
        assert time.monotonic() < deadline, f"no checkpoint after step {step} in {out} within 300 s"
        time.sleep(0.02)
    return list_checkpoints(out)[-1][0]


@pytest.fixture(scope="module")
def job(data, tmp_path_factory):
    """One torchrun job of 2 processes, a restart allowed, its phases one after the other: ddp_worker.py's checks
    (runs/ keeps their training runs); the classifier's independent workers (independent/), then, with the newest
    checkpoint of the run and of worker 1 lost (as a kill while writing them loses them), the same command again (its
    first run's copy: independent-first/); SQuAD's independent workers (squad/); pre-training (pretraining/), then,
    with its last checkpoint lost, the same command again (pretraining-first/); TWO_PROCESSES uninterrupted
    (uninterrupted/); last, CHECKPOINT_EVERY_4 (preempted/), hit twice: SIGKILL to the worker of rank 0 (the one that
    writes the checkpoints) after the run's first checkpoint, after which torchrun restarts both workers and they go
    on from the phase that was interrupted, resuming from the newest checkpoint (in a process group of their own: the
    store keeps the dead group's keys); then, once the restart has written a checkpoint, SIGTERM to the launcher (what
    scancel, qdel and a job's time limit do), which passes it to the workers: they save and it exits 143. Each
    phase's log and exit status per rank are beside plan.json; the job's output, exit status, and the step of the
    newest checkpoint when the worker was killed are the fixture's."""
    root = tmp_path_factory.mktemp("job")
    independent, pretraining = root / "independent", root / "pretraining"
    uninterrupted, preempted = root / "uninterrupted", root / "preempted"
    phases = [
        ("ddp_worker", "ddp_worker:main", [str(root / "report.json"), str(root / "runs")], {}),
        ("independent", "bertbench.runners.classifier:main", independent_flags(data, independent), {}),
        (
            "independent-resumed",
            "bertbench.runners.classifier:main",
            independent_flags(data, independent),
            {
                "copy": [str(independent), str(root / "independent-first")],
                "remove": [
                    str(independent / checkpoint_name(48)),
                    os.path.join(worker_dir(independent, 1), checkpoint_name(48)),
                ],
            },
        ),
        ("squad", "bertbench.runners.squad:main", squad_flags(data, root / "squad"), {}),
        ("pretraining", "bertbench.runners.pretraining:main", pretraining_flags(data, pretraining), {}),
        (
            "pretraining-resumed",
            "bertbench.runners.pretraining:main",
            pretraining_flags(data, pretraining),
            {
                "copy": [str(pretraining), str(root / "pretraining-first")],
                "remove": [str(pretraining / checkpoint_name(8))],
            },
        ),
        ("uninterrupted", "bertbench.runners.classifier:main", flags(data, uninterrupted, *TWO_PROCESSES), {}),
        ("preempted", "bertbench.runners.classifier:main", flags(data, preempted, *CHECKPOINT_EVERY_4), {}),
    ]
    plan = [{"name": name, "call": call, "argv": argv, **before} for name, call, argv, before in phases]
    (root / "plan.json").write_text(json.dumps(plan))
    command = launch_command(2, os.path.join(HERE, "torchrun_phases.py"), str(root / "plan.json"), restarts=1)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        newest_checkpoint_after(process, preempted, -1)
        kill_and_wait(worker_with_rank(process.pid, 0))
        # The killed attempt's last checkpoint (its rank 0 wrote them; it may have written another between the look
        # above and the kill): the restart resumes from it and has trained once it writes a newer one.
        killed_after = list_checkpoints(preempted)[-1][0]
        newest_checkpoint_after(process, preempted, killed_after)
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=120)[0]
    except BaseException:
        process.kill()
        print(process.communicate()[0][-5000:])  # the job's last lines, shown with the failure
        raise
    return SimpleNamespace(root=root, returncode=process.returncode, output=output, killed_after=killed_after)


def phase(job, name: str) -> list[str]:
    """The phase's log of each rank, once its every rank has returned 0 (the runners' exit status) in the job's
    first attempt (torchrun_phases.py notes a phase that a restart ran)."""
    assert [(job.root / f"{name}.rank{rank}.status").read_text() for rank in range(2)] == ["0", "0"]
    return phase_logs(job, name)


def phase_logs(job, name: str) -> list[str]:
    """Each rank's log of the job's phase `name` (a restart's lines after the killed attempt's)."""
    return [(job.root / f"{name}.rank{rank}.log").read_text() for rank in range(2)]


def final_weights(directory):
    return load_checkpoint(list_checkpoints(directory)[-1][1])["model"]


@pytest.fixture(scope="module")
def ddp_worker_run(job):
    """ddp_worker.py's findings on 2 processes, and the directory of its training runs."""
    phase(job, "ddp_worker")
    return read_json(job.root / "report.json"), job.root / "runs"


def test_accumulation_all_reduces_once_per_step_and_inference_gathers_every_example(ddp_worker_run):
    report, _ = ddp_worker_run
    assert report["world_size"] == 2
    for variant, counts in report["allreduce_calls"].items():
        # 12 micro-batches in 3 optimizer steps: DDP synchronised 3 backward passes, each in several buckets
        assert counts["synchronized_backwards"] == counts["steps"] == 3, variant
        assert counts["bucket_allreduces"] > counts["steps"], variant
    assert report["predict_rows"] == 37 and report["predict_max_difference"] < 1e-6
    assert report["eval_loss"] == pytest.approx(report["reference_loss"], rel=1e-6)
    first, second = report["shard"]
    assert first + second == list(range(37)) and len(first) == 19
    assert report["mean_of_ranks"] == 0.5
    assert report["broadcast_weights"] == [[1.0], [1.0]]


def test_the_time_budget_is_rank_zeros_whose_clock_times_the_run(ddp_worker_run):
    """Rank 0's loop clock started 0.5 s after rank 1's, which ran while rank 1 waited for rank 0: the budget
    (0.5 s) stops both ranks at the same step once rank 0's clock has spent it, not rank 1's after one step, so a run
    the budget ended never reports fewer train seconds than the budget (bench budget's train_seconds)."""
    budget = ddp_worker_run[0]["budget"]
    assert budget["budget_exhausted"] and budget["seconds"] >= 0.5
    first, second = budget["steps"]
    assert first == second


def generator_seeded(seed: int) -> list[int]:
    """The state of torch's CPU generator seeded with `seed`. A resume on another process count reseeds each rank
    with the run's seed (RunConfig's 42) + its rank + the step resumed, so no two ranks or resumes draw alike."""
    return torch.Generator().manual_seed(seed).get_state().tolist()


def test_a_checkpoint_of_one_process_resumes_on_two(ddp_worker_run):
    """Weights and data position resume exactly; dropout's streams cannot (one was saved, two are needed), so they
    restart from the seed, a different one on each rank, with a warning."""
    resumed = ddp_worker_run[0]["one_process_run_resumed_on_two"]
    checkpoint = resumed["checkpoint"]
    assert resumed["global_step"] == 3 and resumed["resumed_from"] == checkpoint
    assert checkpoint.endswith("ckpt-000000002.pt")
    assert [line for line in resumed["logs"] if "warning" in line] == [
        f"warning: {checkpoint} was written by 1 processes, this run has 2: dropout random streams restart from the "
        "seed"
    ]
    for rank, found in enumerate(resumed["ranks"]):
        assert found["fresh_weights_differ"] and found["weights_were_the_checkpoints"], rank
        assert found["first_batch_is_the_next_one"] and found["consumed"] == 2 * 4 + 4, rank
        assert found["rng"] == generator_seeded(42 + rank + 2) != found["saved_rng"], rank


def test_a_checkpoint_of_two_processes_resumes_in_one(ddp_worker_run, tmp_path):
    """ddp_worker's baseline run (2 processes x batch 2 x 4 micro-batches, 3 steps) goes on in one process with the
    same global batch: its weights, optimizer and the next batch of the one-process order, dropout's stream
    restarted from the seed with a warning."""
    shutil.copytree(ddp_worker_run[1] / "baseline-full", tmp_path / "run")
    saved_path = list_checkpoints(tmp_path / "run")[-1][1]
    saved = load_checkpoint(saved_path)
    assert saved["step"] == 3 and len(saved["rng"]) == 2
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(100)
    model = build_model("classification", config, num_labels=2)
    assert not same_weights(model.state_dict(), saved["model"])
    data, logs = features(config, 64, seed=1), []
    batches = FirstBatchProbe(data, 4, seed=0, model=model)
    result = Estimator(
        model,
        RunConfig(str(tmp_path / "run"), save_checkpoints_secs=None),
        TrainConfig(num_train_steps=4, gradient_accumulation_steps=4, excluded_steps=0),
        log=logs.append,
    ).train(batches)
    assert result.resumed_from == saved_path and result.global_step == 4 and result.steps == 1
    assert (
        f"warning: {saved_path} was written by 2 processes, this run has 1: dropout random streams restart "
        "from the seed" in logs
    )
    assert same_weights(batches.first["weights"], saved["model"])
    reference = ShuffledBatches(data, 4, seed=0)
    for _ in range(3 * 4):  # what the 2 processes took: 3 steps of 4 micro-batches of 2 x 2
        next(reference)
    assert torch.equal(batches.first["input_ids"], next(reference)["input_ids"])
    assert batches.consumed == 64 and result.epoch == 1.0
    assert batches.first["rng"].tolist() == generator_seeded(42 + 3) != saved["rng"][0]["torch"].tolist()
    assert load_checkpoint(result.last_checkpoint)["optimizer"]["state"][0]["step"] == 4  # AdamW's moments went on


def test_independent_workers_train_apart_keep_the_best_and_resume_from_a_common_step(job):
    first, resumed = job.root / "independent-first", job.root / "independent"
    log = phase(job, "independent")[0]
    train = read_json(first / "train_results.json")
    assert train["sync_gradients"] is False and train["lr_scaling"] == "sqrt"
    assert train["learning_rate"] == pytest.approx(2e-3 * math.sqrt(2))
    scores, best = train["worker_scores"], train["selected_worker"]
    assert train["selection_metric"] == "dev_acc_and_f1" and len(scores) == 2
    assert best == max(range(2), key=lambda rank: (scores[rank], -rank))
    assert f"keeping worker {best}" in log

    workers = [final_weights(worker_dir(first, rank)) for rank in range(2)]
    assert [[step for step, _ in list_checkpoints(worker_dir(first, rank))] for rank in range(2)] == [[32, 48]] * 2
    assert any(not torch.equal(workers[0][name], workers[1][name]) for name in workers[0])  # they trained apart
    assert [step for step, _ in list_checkpoints(first)] == [48]
    kept = load_checkpoint(list_checkpoints(first)[-1][1])
    assert kept["selected_worker"] == best and kept["worker_scores"] == scores
    assert all(torch.equal(kept["model"][name], workers[best][name]) for name in workers[best])
    results = read_json(first / "eval_results.json")
    assert results["dev_acc_and_f1"] == pytest.approx(scores[best])  # scored again, now split across the ranks

    # Worker 1 lost its newest checkpoint (killed while writing it): both resume from step 32, the last they share,
    # and end exactly where the uninterrupted run did.
    log = phase(job, "independent-resumed")[0]
    assert f"resumed from {worker_dir(resumed, 0)}/ckpt-000000032.pt (step 32" in log
    again = load_checkpoint(list_checkpoints(resumed)[-1][1])
    assert again["selected_worker"] == best and again["worker_scores"] == scores
    assert all(torch.equal(again["model"][name], kept["model"][name]) for name in kept["model"])

    # Evaluation alone, in one process, reads the kept worker's weights.
    assert classify(["--output_dir", str(resumed), "--do_eval", "--nodo_train"]) == 0
    assert read_json(resumed / "eval_results.json")["dev_acc_and_f1"] == pytest.approx(scores[best])


def test_squad_independent_workers_keep_the_best_f1(job):
    out = job.root / "squad"
    logs = phase(job, "squad")
    train = read_json(out / "train_results.json")
    assert train["selection_metric"] == "f1" and len(train["worker_scores"]) == 2
    assert read_json(out / "eval_results.json")["f1"] == pytest.approx(train["worker_scores"][train["selected_worker"]])
    assert len(read_json(out / "predictions.json")) == 18
    assert [log.count("***** Eval results") for log in logs] == [1, 0]  # rank 0 alone reports


def test_pretraining_ranks_read_their_own_shards_and_resume(job):
    first, out = job.root / "pretraining-first", job.root / "pretraining"
    phase(job, "pretraining")
    train = read_json(first / "train_results.json")
    assert train["world_size"] == 2 and train["sentences"] == 8 * 8 * 2
    assert [step for step, _ in list_checkpoints(first)] == [4, 8]
    state = load_checkpoint(list_checkpoints(first)[-1][1])
    assert [data_state["rank"] for data_state in state["data"]] == [0, 1]
    assert state["data"][0]["consumed"] == state["data"][1]["consumed"] == 128
    # its last checkpoint lost: both ranks continue from step 4 where they were
    assert f"resumed from {out}/ckpt-000000004.pt" in phase(job, "pretraining-resumed")[0]
    assert read_json(out / "train_results.json")["global_step"] == 8


def test_two_processes_match_one_with_the_same_global_batch(job, one_process):
    """The most involved setting against the plainest: the baseline on 1 process with batches of 16."""
    out = job.root / "uninterrupted"
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
    assert [(job.root / f"uninterrupted.rank{rank}.status").read_text() for rank in range(2)] == ["0", "0"]
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
        job.root / "preempted",
        job.root / "uninterrupted",
        job.killed_after,
        job.output,
    )
    assert job.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "bertbench launch: stopped by SIGTERM" in output
    logs = "".join(phase_logs(job, "preempted"))
    resumed = [int(step) for step in re.findall(r"resumed from \S+ckpt-0*(\d+)\.pt \(step \d+", logs)]
    # the restart went on from the newest checkpoint there was when its worker was killed
    assert resumed == [killed_after], logs[-3000:]
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


def test_a_node_that_never_joins_times_out_in_one_line(tmp_path, capsys):
    started = time.monotonic()
    status = launch.main(
        [
            "--nnodes=2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}",
            "--rdzv-id=lonely",
            "--rdzv-conf=join_timeout=1",
            os.path.join(HERE, "ddp_worker.py"),
            str(tmp_path / "x"),
        ]
    )
    assert status == 1 and time.monotonic() - started < 60
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("bertbench launch: error: rendezvous 'lonely' at 127.0.0.1:")
    assert "timed out after 1 s waiting for 2 node(s) to join" in error
    assert not (tmp_path / "x").exists()


def test_rendezvous_options_and_failures_are_described():
    assert launch.rendezvous_option("join_timeout=5,last_call_timeout=1", "join_timeout", 600) == 5
    assert launch.rendezvous_option("", "join_timeout", 600) == 600
    args = SimpleNamespace(
        rdzv_endpoint="",
        master_addr="node1",
        master_port=29500,
        rdzv_id="job",
        rdzv_backend="static",
        rdzv_conf="",
        nnodes="4",
    )
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

    message = launch.describe_rendezvous_failure(args, RendezvousConnectionError("refused"))
    assert message.startswith("rendezvous 'job' at node1:29500 (static) cannot be reached (refused)")


def test_restarted_workers_keep_their_keys_apart(monkeypatch):
    """torchrun's store outlives a restart: a restart's process group must not read its predecessors' keys."""
    from torch import distributed as torch_distributed

    server = torch_distributed.TCPStore("127.0.0.1", 0, 1, is_master=True)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert restart_safe_store(0, 2) == {}  # not torchrun's shared store: env:// as usual
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert restart_safe_store(0, 2) == {}  # the first attempt has the store to itself
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    arguments = restart_safe_store(1, 2)
    assert (arguments["rank"], arguments["world_size"]) == (1, 2)
    arguments["store"].set("0", "address of this restart's rank 0")
    assert server.get("bertbench/restart-2/0") == b"address of this restart's rank 0"


@pytest.mark.parametrize("scaling, expected", [("none", 1e-4), ("linear", 8e-4), ("sqrt", 1e-4 * math.sqrt(8))])
def test_learning_rate_scaling_with_the_process_count(tmp_path, scaling, expected):
    config, _ = config_from_values(
        run_classifier.SPEC,
        {
            "output_dir": str(tmp_path),
            "bert_config_file": "c",
            "vocab_file": "v",
            "task_name": "MRPC",
            "data_dir": "d",
            "do_train": True,
            "learning_rate": 1e-4,
            "lr_scaling": scaling,
        },
    )
    assert config.learning_rate(8) == pytest.approx(expected)
    assert config.train_config(8, 10, "cpu")[0].learning_rate == pytest.approx(expected)


def test_independent_workers_need_a_dev_metric_and_no_fp16(data, tmp_path, error_line):
    base = flags(data, tmp_path / "a", "--no_sync_gradients")
    assert classify([flag for flag in base if flag != "--do_eval"]) == 2
    assert error_line() == (
        "run_classifier: error: --no_sync_gradients keeps the worker with the best dev metric: it needs --do_eval"
    )
    assert classify(flags(data, tmp_path / "b", "--no_sync_gradients", "--precision=fp16")) == 2
    assert "independent workers need fp32 or bf16" in error_line()
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_squad_independent_workers_need_a_predict_file_with_answers(tmp_path, error_line):
    train, _ = write_squad(tmp_path / "squad", "1.1", train=3, dev=2)
    unanswered = read_json(train)
    for article in unanswered["data"]:
        for paragraph in article["paragraphs"]:
            for question in paragraph["qas"]:
                question["answers"] = []  # a test file: questions without their answers
    (tmp_path / "test.json").write_text(json.dumps(unanswered))
    write_bert_dir(tmp_path / "bert", **NO_DROPOUT)
    assert (
        squad(
            [
                "--do_train",
                "--do_predict",
                f"--train_file={train}",
                f"--predict_file={tmp_path / 'test.json'}",
                f"--vocab_file={tmp_path / 'bert' / 'vocab.txt'}",
                "--max_seq_length=48",
                "--doc_stride=16",
                "--max_query_length=16",
                f"--bert_config_file={tmp_path / 'bert' / 'bert_config.json'}",
                "--no_sync_gradients",
                f"--output_dir={tmp_path / 'run'}",
            ]
        )
        == 2
    )
    assert error_line() == (
        f"run_squad: error: {tmp_path / 'test.json'}: no answers to score, so "
        "--no_sync_gradients cannot choose a worker; predict a dev file"
    )
    assert not (tmp_path / "run").exists()
