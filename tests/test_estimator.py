"""The Estimator on a tiny classifier: data order, checkpoints with every state, exact resume after a signal, timed
saves, precision, accumulation, logs."""

import functools
import io
import json
import os
import random
import signal
import time

import numpy as np
import pytest
import torch
from helpers import Killed, KilledAt, Overflowing, SignalAfter, tiny_config

from bertbench.model.factory import build_model
from bertbench.training.batches import ShuffledBatches
from bertbench.training.checkpoint import CheckpointError, list_checkpoints, load_checkpoint, save_checkpoint
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.training.loop import Estimator, PeriodicEvaluation, TrainingDivergedError
from bertbench.training.metrics import MEASURED_FIELDS, MetricsLog, read_metrics
from bertbench.training.progress import ProgressDisplay
from bertbench.training.state import rng_state, set_rng_state


def features(count=48, seq=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 100, (count, seq), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[::3, seq - 4 :] = 0
    labels = (input_ids[:, 1] > 50).long()  # learnable from the first token
    return {
        "input_ids": input_ids,
        "token_type_ids": torch.zeros_like(input_ids),
        "attention_mask": attention_mask,
        "labels": labels,
    }


def make_estimator(model_dir, steps=12, model=None, run=None, **train):
    torch.manual_seed(0)
    model = model or build_model("classification", tiny_config(hidden_size=32, intermediate_size=64), num_labels=2)
    run_config = RunConfig(str(model_dir), **{"save_checkpoints_secs": None, "log_step_count_steps": 4, **(run or {})})
    train_config = TrainConfig(**{"num_train_steps": steps, "learning_rate": 1e-3, **train})
    return Estimator(model, run_config, train_config, log=lambda line: None)


def weights(model):
    return {name: tensor.clone() for name, tensor in model.state_dict().items()}


def assert_same_weights(first, second):
    assert first.keys() == second.keys()
    different = [name for name in first if not torch.equal(first[name], second[name])]
    assert not different, f"weights differ: {different[:5]}"


# ---- configs -----------------------------------------------------------------------------------------------------


def test_run_config_defaults_are_the_originals():
    config = RunConfig("dir")
    assert (config.save_checkpoints_secs, config.save_checkpoints_steps, config.keep_checkpoint_max) == (1200, None, 1)


@pytest.mark.parametrize(
    "bad",
    [
        {"save_checkpoints_secs": 0},
        {"save_checkpoints_steps": 0},
        {"keep_checkpoint_max": 0},
        {"log_step_count_steps": 0},
    ],
)
def test_run_config_rejects(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        RunConfig("dir", **bad)


@pytest.mark.parametrize(
    "bad",
    [
        {"num_train_steps": 0},
        {"precision": "fp8"},
        {"gradient_accumulation_steps": 0},
        {"optimizer": "sgd"},
        {"decay": "cosine"},
        {"max_grad_norm": 0.0},
        {"max_train_seconds": 0},
    ],
)
def test_train_config_rejects(bad):
    with pytest.raises(ValueError):
        TrainConfig(**{"num_train_steps": 10, **bad})


# ---- data order --------------------------------------------------------------------------------------------------


def test_batches_cover_each_epoch_once_and_cross_epochs():
    data = {"x": torch.arange(10)}
    stream = ShuffledBatches(data, batch_size=4, seed=3)
    seen = torch.cat([next(stream)["x"] for _ in range(5)])  # 20 examples: two whole epochs
    assert sorted(seen[:10].tolist()) == list(range(10)) and sorted(seen[10:].tolist()) == list(range(10))
    assert not torch.equal(seen[:10], seen[10:])  # a new permutation each epoch
    assert stream.epoch == 2.0


def test_batches_resume_at_the_next_batch():
    data = {"x": torch.arange(30)}
    whole = ShuffledBatches(data, 4, seed=1)
    expected = [next(whole)["x"] for _ in range(12)]
    first = ShuffledBatches(data, 4, seed=1)
    for _ in range(5):
        next(first)
    resumed = ShuffledBatches(data, 4, seed=1)
    resumed.load_state_dict(first.state_dict())
    assert all(torch.equal(next(resumed)["x"], batch) for batch in expected[5:])


def test_ranks_split_each_global_batch():
    data = {"x": torch.arange(16)}
    single = ShuffledBatches(data, 4, seed=0)
    ranks = [ShuffledBatches(data, 2, seed=0, rank=rank, world_size=2) for rank in range(2)]
    for _ in range(6):
        assert torch.equal(next(single)["x"], torch.cat([next(stream)["x"] for stream in ranks]))


def test_batches_refuse_another_dataset():
    state = ShuffledBatches({"x": torch.arange(10)}, 2, seed=0).state_dict()
    with pytest.raises(ValueError, match="num_examples 10"):
        ShuffledBatches({"x": torch.arange(12)}, 2, seed=0).load_state_dict(state)


# ---- training and checkpoints ------------------------------------------------------------------------------------


def test_train_learns_and_saves_the_whole_state(tmp_path):
    estimator = make_estimator(tmp_path, steps=60, run={"log_step_count_steps": 20})
    result = estimator.train(ShuffledBatches(features(), 8, seed=0))
    assert result.global_step == 60 and result.steps == 60 and result.sentences == 480
    assert result.interrupted_by is None and result.resumed_from is None
    assert result.steady_sentences_per_second > 0 and result.steady_steps == 50
    state = load_checkpoint(result.last_checkpoint)
    assert {"model", "optimizer", "schedule", "scaler", "data", "epoch", "rng", "step"} <= set(state)
    assert state["step"] == 60 and state["data"] == [{"consumed": 480, "num_examples": 48, "seed": 0}]
    assert state["epoch"] == 10.0 and state["schedule_start_step"] == 0
    assert state["schedule"]["last_epoch"] == 60
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [record["step"] for record in records] == [20, 40, 60]
    assert records[-1]["loss"] < records[0]["loss"]
    assert {"lr", "seq_per_s", "tokens_per_s", "memory_bytes", "grad_norm", "epoch"} <= set(records[0])
    assert records[0]["tokens_per_s"] > records[0]["real_tokens_per_s"]  # padding is counted apart
    accuracy = estimator.evaluate(
        features(seed=0),
        16,
        lambda out: {"acc": (out["logits"].argmax(-1) == features(seed=0)["labels"]).float().mean().item()},
    )
    assert accuracy["acc"] > 0.8 and accuracy["global_step"] == 60


@pytest.mark.parametrize("steps, logged", [(7, [7]), (50, [20, 40, 50])])
def test_the_last_step_is_logged_even_off_the_logging_interval(tmp_path, steps, logged):
    estimator = make_estimator(tmp_path, steps=steps, run={"log_step_count_steps": 20})
    estimator.train(ShuffledBatches(features(), 8, seed=0))
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [record["step"] for record in records] == logged
    assert all(record["seq_per_s"] > 0 for record in records)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_at_the_step_boundary_and_resume_is_exact(tmp_path, signum):
    data = features()
    uninterrupted = make_estimator(tmp_path / "whole", steps=20, run={"save_checkpoints_steps": 5})
    uninterrupted.train(ShuffledBatches(data, 8, seed=0))

    interrupted = make_estimator(tmp_path / "part", steps=20, run={"save_checkpoints_steps": 5})
    interrupted.model = SignalAfter(interrupted.model, call=8, signum=signum)
    handler_before = signal.getsignal(signum)
    result = interrupted.train(ShuffledBatches(data, 8, seed=0))
    assert result.interrupted_by == signal.Signals(signum).name and result.global_step == 8
    assert [step for step, _ in list_checkpoints(tmp_path / "part")] == [8]
    assert signal.getsignal(signum) is handler_before  # training put the previous handler back

    resumed = make_estimator(tmp_path / "part", steps=20, run={"save_checkpoints_steps": 5})
    result = resumed.train(ShuffledBatches(data, 8, seed=0))
    assert result.resumed_from.endswith("ckpt-000000008.pt") and result.steps == 12
    assert_same_weights(weights(uninterrupted.model), weights(resumed.model))
    steps = [json.loads(line)["step"] for line in open(tmp_path / "part" / "metrics.jsonl")]
    assert steps == [4, 8, 12, 16, 20]


def logged(model_dir):
    """metrics.jsonl's records but for what differs between any two runs, and the newest checkpoint's step, which a
    stop's own save changes."""
    return [
        {key: value for key, value in record.items() if key not in MEASURED_FIELDS | {"checkpoint_step"}}
        for record in read_metrics(model_dir)
    ]


@pytest.mark.parametrize("stop", ["SIGTERM at step 7", "killed at step 14"])
def test_a_resumed_run_logs_what_the_uninterrupted_run_logs(tmp_path, stop):
    """Log every 4 steps, save every 5: the resume starts inside a log window (at 7 from the stop's own save, at 10
    after the kill), and the window's first record after it must still average the same 4 steps."""
    data, run = features(), {"save_checkpoints_steps": 5, "keep_checkpoint_max": 3}
    make_estimator(tmp_path / "whole", steps=20, run=run).train(ShuffledBatches(data, 8, seed=0))
    interrupted = make_estimator(tmp_path / "part", steps=20, run=run)
    if stop.startswith("SIGTERM"):
        interrupted.model = SignalAfter(interrupted.model, call=7)
        assert interrupted.train(ShuffledBatches(data, 8, seed=0)).global_step == 7
        assert [record["step"] for record in logged(tmp_path / "part")] == [4, 7]  # the stopped run's last line
    else:
        interrupted.model = KilledAt(interrupted.model, call=14)
        with pytest.raises(Killed):
            interrupted.train(ShuffledBatches(data, 8, seed=0))
    resumed = make_estimator(tmp_path / "part", steps=20, run=run)
    assert resumed.train(ShuffledBatches(data, 8, seed=0)).resumed_from.endswith("7.pt" if "7" in stop else "10.pt")
    whole, part = logged(tmp_path / "whole"), logged(tmp_path / "part")
    assert [record["step"] for record in whole] == [4, 8, 12, 16, 20]
    assert part == whole  # loss, grad_norm, lr, epoch, skipped_steps, loss_scale: every field, exactly


def test_resume_drops_metrics_logged_after_the_checkpoint(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    for step in (10, 20, 30):
        log.write({"step": step, "loss": float("nan") if step == 30 else 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as handle:
        handle.write('{"step": 40, "lo')  # the line a SIGKILL cut
    MetricsLog(tmp_path / "metrics.jsonl", resume_step=20)
    assert [json.loads(line) for line in open(tmp_path / "metrics.jsonl")] == [
        {"step": 10, "loss": 1.0},
        {"step": 20, "loss": 1.0},
    ]


class Slow(torch.nn.Module):
    """Wraps a model and makes each forward take at least 20 ms, so that steps take a known minimum time."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **batch):
        time.sleep(0.02)
        return self.model(**batch)

    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self.model.load_state_dict(*args, **kwargs)


def test_timed_checkpoints_rotate_and_keep_max(tmp_path):
    estimator = make_estimator(tmp_path, steps=16, run={"save_checkpoints_secs": 0.05, "keep_checkpoint_max": 2})
    estimator.model = Slow(estimator.model)
    result = estimator.train(ShuffledBatches(features(), 8, seed=0))
    assert result.checkpoint_saves >= 4  # ~0.3 s of steps at one save per 0.05 s, plus the final one
    kept = list_checkpoints(tmp_path)
    assert len(kept) == 2 and kept[-1][0] == 16
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]


def test_time_budget_saves_and_stops_early_and_the_run_resumes_exactly(tmp_path):
    data = features()
    uninterrupted = make_estimator(tmp_path / "whole", steps=40)
    uninterrupted.train(ShuffledBatches(data, 8, seed=0))

    # 40 steps of at least 20 ms cannot fit in 0.2 s, however fast or slow the machine.
    budgeted = make_estimator(tmp_path / "part", steps=40, max_train_seconds=0.2)
    budgeted.model = Slow(budgeted.model)
    result = budgeted.train(ShuffledBatches(data, 8, seed=0))
    assert result.budget_exhausted and result.interrupted_by is None
    assert 0 < result.global_step < 40 and result.seconds >= 0.2
    assert [step for step, _ in list_checkpoints(tmp_path / "part")] == [result.global_step]
    assert load_checkpoint(result.last_checkpoint)["schedule"]["last_epoch"] == result.global_step

    # The budget only cut the run short: the schedule is that of 40 steps, so going on ends with the same weights.
    resumed = make_estimator(tmp_path / "part", steps=40, max_train_seconds=600)
    finished = resumed.train(ShuffledBatches(data, 8, seed=0))
    assert not finished.budget_exhausted and finished.interrupted_by is None
    assert finished.resumed_from == result.last_checkpoint and finished.global_step == 40
    assert_same_weights(weights(uninterrupted.model), weights(resumed.model))


def test_corrupt_checkpoint_is_reported_and_left_alone(tmp_path):
    make_estimator(tmp_path, steps=4).train(ShuffledBatches(features(), 8, seed=0))
    path = list_checkpoints(tmp_path)[-1][1]
    with open(path, "r+b") as handle:
        handle.truncate(1000)
    before = open(path, "rb").read()
    with pytest.raises(CheckpointError, match=os.path.basename(path)):
        make_estimator(tmp_path, steps=8).train(ShuffledBatches(features(), 8, seed=0))
    assert open(path, "rb").read() == before and len(list_checkpoints(tmp_path)) == 1


def test_checkpoint_of_another_model_is_refused(tmp_path):
    make_estimator(tmp_path, steps=4).train(ShuffledBatches(features(), 8, seed=0))
    other = build_model("classification", tiny_config(hidden_size=32, intermediate_size=64), num_labels=3)
    with pytest.raises(CheckpointError, match="do not fit this model"):
        make_estimator(tmp_path, steps=8, model=other).train(ShuffledBatches(features(), 8, seed=0))


def test_resume_keeps_the_update_rule_and_older_checkpoints_were_bias_corrected(tmp_path):
    make_estimator(tmp_path, steps=4).train(ShuffledBatches(features(), 8, seed=0))
    with pytest.raises(
        CheckpointError,
        match="trained with adamw without bias correction .*; resuming it with adamw with bias correction",
    ):
        make_estimator(tmp_path, steps=8, adam_bias_correction=True).train(ShuffledBatches(features(), 8, seed=0))
    # A checkpoint written before adam_bias_correction existed was trained with torch's AdamW.
    step, path = list_checkpoints(tmp_path)[-1]
    state = load_checkpoint(path)
    del state["train_config"]["adam_bias_correction"]
    save_checkpoint(str(tmp_path), step, state, keep_max=1)
    with pytest.raises(CheckpointError, match="trained with adamw with bias correction"):
        make_estimator(tmp_path, steps=8).train(ShuffledBatches(features(), 8, seed=0))
    resumed = make_estimator(tmp_path, steps=8, adam_bias_correction=True).train(ShuffledBatches(features(), 8, seed=0))
    assert (resumed.resumed_from, resumed.global_step) == (path, 8)


def test_gradient_accumulation_matches_the_big_batch(tmp_path):
    config = tiny_config(
        hidden_size=32, intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    models = []
    for name, batch, accumulation in (("big", 8, 1), ("accumulated", 4, 2)):
        torch.manual_seed(0)
        model = build_model("classification", config, num_labels=2)
        estimator = make_estimator(tmp_path / name, steps=6, model=model, gradient_accumulation_steps=accumulation)
        result = estimator.train(ShuffledBatches(features(), batch, seed=0))
        assert result.sentences == 48
        models.append(weights(model))
    for name in models[0]:
        torch.testing.assert_close(models[0][name], models[1][name], rtol=1e-4, atol=1e-5)


def test_fp16_skips_overflowing_steps_and_counts_them(tmp_path):
    estimator = make_estimator(tmp_path, steps=6, precision="fp16")
    estimator.model = Overflowing(estimator.model, at_call=2)
    result = estimator.train(ShuffledBatches(features(), 8, seed=0))
    assert result.skipped_steps == 1 and result.global_step == 6
    assert result.sentences == 7 * 8  # the skipped step's batch was computed, then dropped
    state = load_checkpoint(result.last_checkpoint)
    assert state["skipped_steps"] == 1 and state["schedule"]["last_epoch"] == 6
    assert state["scaler"]["scale"] < 65536.0


def test_fp32_divergence_stops_without_saving_over_the_last_checkpoint(tmp_path):
    estimator = make_estimator(tmp_path, steps=6, run={"save_checkpoints_steps": 1, "log_step_count_steps": 100})
    estimator.model = Overflowing(estimator.model, at_call=2)
    with pytest.raises(TrainingDivergedError, match="ckpt-000000001.pt"):
        estimator.train(ShuffledBatches(features(), 8, seed=0))
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains(tmp_path, precision):
    estimator = make_estimator(tmp_path, steps=30, precision=precision)
    result = estimator.train(ShuffledBatches(features(), 8, seed=0))
    assert result.global_step == 30 and result.final_loss < 0.69


def test_lamb_and_poly_decay_train(tmp_path):
    # LAMB's step is relative to each weight's norm, so it takes a larger learning rate than AdamW.
    estimator = make_estimator(tmp_path, steps=30, optimizer="lamb", decay="poly", decay_power=0.5, learning_rate=2e-2)
    assert estimator.train(ShuffledBatches(features(), 8, seed=0)).final_loss < 0.69


def test_predict_keeps_the_order(tmp_path):
    estimator = make_estimator(tmp_path)
    data = features(count=20)
    del data["labels"]
    logits = estimator.predict(data, batch_size=6)["logits"]
    assert estimator.model.training  # inference leaves the model in the mode it found it in
    estimator.model.eval()
    with torch.no_grad():
        expected = estimator.model(**data).logits
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)


def test_restore_loads_the_newest_weights(tmp_path):
    trained = make_estimator(tmp_path, steps=5)
    trained.train(ShuffledBatches(features(), 8, seed=0))
    fresh = make_estimator(tmp_path, steps=5)
    assert fresh.restore().endswith("ckpt-000000005.pt") and fresh.global_step == 5
    assert_same_weights(weights(trained.model), weights(fresh.model))
    assert make_estimator(tmp_path / "empty").restore() is None


def test_rng_state_round_trips():
    state = rng_state()

    def draws():
        return torch.rand(3).tolist(), random.random(), np.random.rand()

    first = draws()
    set_rng_state(state)
    assert draws() == first


def test_progress_bar_draws_on_a_terminal():
    stream = io.StringIO()
    display = ProgressDisplay(100, stream=stream, enabled=True, refresh_secs=0)
    assert display.due()
    display.draw(25, 0.5, 123.4, 90)
    display.close()
    drawn = stream.getvalue().split("\r")
    assert any(line.startswith("step 25/100 |##") and "eta 1:30, loss 0.5000, 123.4 seq/s" in line for line in drawn)
    assert not drawn[-1].strip()  # closed: the bar's line is blank again for the log lines
    assert not ProgressDisplay(100, stream=io.StringIO()).enabled  # not a terminal: log lines only


@pytest.mark.slow
def test_compiled_recompute_trains_like_the_eager_baseline(tmp_path, monkeypatch):
    """The step's torch.compile through inductor's decompositions and partitioner, which decides what a checkpointed
    block's backward saves and recomputes: everything but inductor's C++ code generation (test_optim's compiled LAMB
    runs that on this machine): inductor's 33 kernels of this model took this test to 58 CPU-seconds on a first run
    (an empty inductor cache), from 10."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager_decomp_partition"))
    torch._dynamo.reset()  # no earlier test's traces of the model's code, nor their count against the recompile limit
    # One block: what inductor makes of a block's code shows in the first, and the traced graph grows with the blocks.
    config = tiny_config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    results = []
    for name, modeling, compile in (("eager", "baseline", False), ("compiled", "recompute", True)):
        torch.manual_seed(0)
        model = build_model("classification", config, modeling, "selective", num_labels=2)
        estimator = make_estimator(tmp_path / name, steps=4, model=model, compile=compile)
        estimator.train(ShuffledBatches(features(), 8, seed=0))
        results.append(weights(model))
        assert load_checkpoint(list_checkpoints(tmp_path / name)[-1][1])["model"].keys() == results[0].keys()
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], rtol=1e-3, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_training_resumes_exactly(tmp_path, precision):
    from bertbench.training.distributed import Distributed

    finals = []
    for name, stop_at in (("whole", None), ("part", 4), ("part", None)):
        torch.manual_seed(0)
        model = build_model("classification", tiny_config(hidden_size=32, intermediate_size=64), num_labels=2)
        estimator = Estimator(
            model,
            RunConfig(str(tmp_path / name), save_checkpoints_secs=None),
            TrainConfig(num_train_steps=8, learning_rate=1e-3, precision=precision),
            Distributed(device=torch.device("cuda")),
            log=lambda line: None,
        )
        if stop_at:
            estimator.model = SignalAfter(estimator.model, call=stop_at)
        result = estimator.train(ShuffledBatches(features(), 8, seed=0))
        assert result.interrupted_by == ("SIGTERM" if stop_at else None) and next(model.parameters()).is_cuda
        finals.append(weights(model))
    # The resumed run restored the CUDA RNG state, so its dropout masks are the uninterrupted run's; other dropout
    # masks would move weights by ~1e-3, GPU atomics in attention backward by far less than the tolerance.
    for name, tensor in finals[0].items():
        torch.testing.assert_close(finals[2][name], tensor, rtol=0, atol=1e-5)


# ---- evaluation during training, continuing an earlier phase -------------------------------------------------------


def test_periodic_evaluation_runs_when_due_and_its_stop_saves_and_ends_the_run(tmp_path):
    estimator = make_estimator(tmp_path, steps=40, run={"log_step_count_steps": 100})
    seen = []

    def evaluate(step):
        logits = estimator.predict(features(count=8), 4)["logits"]  # inference mid-run, then training goes on
        seen.append((step, logits.shape, estimator.model.training))
        return step >= 15

    result = estimator.train(
        ShuffledBatches(features(), 8, seed=0),
        evaluation=PeriodicEvaluation(every_steps=5, run=evaluate, first_step=10),
    )
    assert seen == [(10, (8, 2), True), (15, (8, 2), True)]  # at steps 10 and 15, then stopped
    assert result.target_reached and result.global_step == 15 and not result.budget_exhausted
    assert result.last_checkpoint.endswith("ckpt-000000015.pt") and result.evaluation_seconds > 0
    assert PeriodicEvaluation(every_steps=5, run=evaluate).due(40, finished=True)
    assert not PeriodicEvaluation(every_steps=5, run=evaluate).due(4, finished=False)


def test_continuing_an_earlier_phase_takes_weights_moments_and_step_with_a_new_schedule(tmp_path):
    first = make_estimator(tmp_path / "one", steps=10)
    first.train(ShuffledBatches(features(), 8, seed=0))
    second = make_estimator(tmp_path / "two", steps=16, learning_rate=5e-4, warmup_proportion=0.5)
    start = second.decide_start(init_checkpoint=str(tmp_path / "one"), continue_phase=True)
    assert (start.kind, start.step) == ("continue", 10)
    result = second.train(ShuffledBatches(features(), 8, seed=1), start)
    assert result.global_step == 16 and result.steps == 6 and result.resumed_from is None
    state = load_checkpoint(result.last_checkpoint)
    assert state["schedule_start_step"] == 10 and state["schedule"]["last_epoch"] == 6
    assert state["optimizer"]["param_groups"][0]["lr"] < 5e-4  # this run's peak, decayed; not phase one's 1e-3
    assert state["optimizer"]["state"][0]["step"] == 16  # AdamW's moments (and step count) went on
    with pytest.raises(CheckpointError, match="ended at step 10; this one must go past it"):
        third = make_estimator(tmp_path / "three", steps=10)
        third.train(
            ShuffledBatches(features(), 8, seed=0),
            third.decide_start(init_checkpoint=str(tmp_path / "one"), continue_phase=True),
        )


def test_predict_collects_what_a_function_extracts(tmp_path):
    estimator = make_estimator(tmp_path)
    data = features(count=10)
    got = estimator.predict(
        data, 4, outputs=lambda output, batch: {"right": (output.logits.argmax(-1) == batch["labels"]).long()}
    )
    assert got["right"].shape == (10,) and got["right"].dtype == torch.int64


def test_restore_seconds_count_reading_and_restoring_the_checkpoint_not_building_the_step(tmp_path, monkeypatch):
    make_estimator(tmp_path, steps=4).train(ShuffledBatches(features(), 8, seed=0))
    from bertbench.training import step as train_step

    built = train_step.TrainStep.__init__
    # The clock jumps 1000 s while the step is built (the optimizer and the scaler: set-up, not the restore), so the
    # figure tells the two apart however busy the machine is.
    perf_counter, skipped = time.perf_counter, []
    monkeypatch.setattr(time, "perf_counter", lambda: perf_counter() + 1000 * len(skipped))

    def slow_build(self, *args, **kwargs):
        skipped.append(1000)
        built(self, *args, **kwargs)

    monkeypatch.setattr(train_step.TrainStep, "__init__", slow_build)
    result = make_estimator(tmp_path, steps=8).train(ShuffledBatches(features(), 8, seed=0))
    assert skipped and result.resumed_from is not None and 0 < result.restore_seconds < 1000
