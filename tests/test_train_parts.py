"""The training core's parts, each against an oracle of its own: the step's clipping and accumulation against a
separately computed gradient, fp16's overflow limit, the loop's throughput arithmetic under a fake clock, recompute
under fp16 loss scaling (under compile: test_estimator), and where a run starts."""

import copy

import pytest
import torch
from helpers import Overflowing, tiny_config

from bertbench.model.factory import build_model
from bertbench.training.batches import ShuffledBatches
from bertbench.training.checkpoint import CheckpointError, list_checkpoints
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.training.loop import MAX_CONSECUTIVE_SKIPPED_STEPS, Estimator, TrainingDivergedError
from bertbench.training.state import CONTINUE, FRESH, RESTORE, RESUME, WARM_START, decide_start
from bertbench.training.stats import LoopStats, run_totals
from bertbench.training.step import TrainStep


def classifier(modeling="baseline", policy="full", dropout=0.0):
    torch.manual_seed(0)
    config = tiny_config(
        hidden_size=32, intermediate_size=64, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout
    )
    return build_model("classification", config, modeling, policy, num_labels=2)


def batch(count=8, seq=12, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(5, 100, (count, seq), generator=generator)
    mask = torch.ones_like(input_ids)
    mask[::2, seq - 3 :] = 0
    return {
        "input_ids": input_ids,
        "token_type_ids": torch.zeros_like(input_ids),
        "attention_mask": mask,
        "labels": torch.randint(0, 2, (count,), generator=generator),
    }


def raw_gradient_norm(model, data):
    """The global gradient norm of one plain backward on a copy of `model`: the oracle for clipping."""
    copied = copy.deepcopy(model)
    copied(**data).loss.backward()
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in copied.parameters() if p.grad is not None]))


def norm_seen_by_the_optimizer(step: TrainStep) -> list[float]:
    """The global gradient norm at each optimizer step, as the optimizer applies the gradients: a fused step (Google's
    AdamW on the CPU too) divides them by its `grad_scale` in its own pass, an eager one receives them clipped."""
    seen = []
    step.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: seen.append(
            (
                torch.linalg.vector_norm(
                    torch.stack([p.grad.norm() for p in step.model.parameters() if p.grad is not None])
                )
                / getattr(optimizer, "grad_scale", 1.0)
            ).item()
        )
    )
    return seen


@pytest.mark.parametrize("accumulation", [1, 2])
def test_clipping_scales_the_gradients_to_the_limit_and_reports_the_raw_norm(accumulation):
    model, data = classifier(), batch()
    raw = raw_gradient_norm(model, data).item()
    limit = raw / 4
    step = TrainStep(
        model, TrainConfig(num_train_steps=10, max_grad_norm=limit, gradient_accumulation_steps=accumulation)
    )
    seen = norm_seen_by_the_optimizer(step)
    # The same batch twice with accumulation 2: each half-weighted, so the gradient is the batch's own.
    outcome = step(iter([data] * accumulation))
    assert outcome.grad_norm.item() == pytest.approx(raw, rel=1e-5)
    assert seen == [pytest.approx(limit, rel=1e-5)]


def test_a_norm_under_the_limit_and_no_clipping_leave_the_gradients_alone():
    data = batch()
    raw = raw_gradient_norm(classifier(), data).item()
    for limit in (raw * 4, None):
        step = TrainStep(classifier(), TrainConfig(num_train_steps=10, max_grad_norm=limit))
        seen = norm_seen_by_the_optimizer(step)
        outcome = step(iter([data]))
        assert seen == [pytest.approx(raw, rel=1e-5)]
        assert (outcome.grad_norm is None) == (limit is None)


def test_64_fp16_overflows_in_a_row_stop_the_run_without_a_step_or_a_save(tmp_path, monkeypatch):
    calls = []
    original = TrainStep.__call__
    monkeypatch.setattr(TrainStep, "__call__", lambda self, batches: calls.append(1) or original(self, batches))
    estimator = Estimator(
        Overflowing(classifier()),
        RunConfig(str(tmp_path), save_checkpoints_secs=None),
        TrainConfig(num_train_steps=1000, precision="fp16"),
        log=lambda line: None,
    )
    with pytest.raises(TrainingDivergedError, match=f"{MAX_CONSECUTIVE_SKIPPED_STEPS} fp16 steps in a row"):
        estimator.train(ShuffledBatches(batch(count=16), 8, seed=0))
    assert MAX_CONSECUTIVE_SKIPPED_STEPS == 64 and len(calls) == 64
    assert estimator.global_step == 0 and list_checkpoints(tmp_path) == []


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_steady_throughput_leaves_out_the_first_steps_saves_and_evaluations():
    clock = FakeClock()
    stats = LoopStats(start_step=0, num_train_steps=10, excluded_steps=2, max_train_seconds=100.0, clock=clock)
    data = batch(count=4, seq=10)  # rows 0 and 2 have 3 padding tokens: 34 real of 40
    for step in range(1, 11):
        stats.count_batch(data)
        clock.now += 1.0
        stats.after_step(torch.tensor(0.5), None, skipped=False)
        if step == 4:
            with stats.pause():  # a checkpoint save of 0.5 s
                clock.now += 0.5
        if step == 6:
            with stats.pause(save=False):  # an evaluation of 0.25 s
                clock.now += 0.25
    result = stats.result(
        global_step=10,
        epoch=1.0,
        resumed_from=None,
        restore_seconds=0.0,
        interrupted=None,
        budget_exhausted=False,
        target_reached=False,
        skipped=0,
        last_checkpoint=None,
    )
    assert result.seconds == 10.75 and result.sentences == 40
    assert result.sentences_per_second == 40 / 10.75
    # Steps 3-10: 32 sequences in 8.75 s of which 0.75 s were a save and an evaluation.
    assert result.steady_steps == 8 and result.steady_sentences_per_second == 32 / 8.0
    assert (result.checkpoint_saves, result.checkpoint_seconds, result.evaluation_seconds) == (1, 0.5, 0.25)
    assert result.padding_fraction == pytest.approx(1 - 34 / 40)
    assert result.real_tokens_per_second == 340 / 10.75 and result.steady_real_tokens_per_second == 8 * 34 / 8.0
    assert result.final_loss == pytest.approx(0.5) and result.sentences_per_20_minutes == 4.0 * 1200

    # A resumed run adds a second segment; a segment saved before real tokens were counted leaves the run without
    # real-token figures rather than with wrong ones.
    segment = stats.segment(10, ended="finished")
    second = dict(
        segment,
        tokens=100,
        real_tokens=50,
        seconds=5.0,
        steady_seconds=4.0,
        steady_sentences_per_second=2.0,
        steady_real_tokens_per_second=10.0,
        evaluation_seconds=1.0,
        final_loss=0.25,
        first_step_seconds=3.0,
    )
    totals = run_totals([segment, second])
    assert totals["real_tokens_per_second"] == (340 + 50) / (10.75 + 5.0)
    assert totals["steady_real_tokens_per_second"] == (8 * 34 + 10.0 * 4.0) / (8.0 + 4.0)
    assert totals["padding_fraction"] == 1 - 390 / 500
    # The run's final loss is its last segment's, its first step the first one's.
    assert (totals["final_loss"], totals["first_step_seconds"], totals["evaluation_seconds"]) == (0.25, 1.0, 1.25)
    older = {name: value for name, value in segment.items() if "real_tokens" not in name and name != "tokens"}
    assert run_totals([older, second])["real_tokens_per_second"] is None
    # A segment saved before bertbench kept these figures leaves the run without them, not with another's.
    kept_since = ("evaluation_seconds", "final_loss", "first_step_seconds")
    oldest = {name: value for name, value in segment.items() if name not in kept_since}
    totals = run_totals([oldest, second])
    assert (totals["final_loss"], totals["first_step_seconds"], totals["evaluation_seconds"]) == (0.25, None, None)


def test_the_first_step_is_timed_from_the_loops_start():
    clock = FakeClock()
    stats = LoopStats(start_step=0, num_train_steps=4, excluded_steps=1, max_train_seconds=None, clock=clock)
    for seconds in (7.5, 1.0, 1.0):  # a first step that compiles, then steady ones
        stats.count_batch(batch(count=2, seq=4))
        clock.now += seconds
        stats.after_step(torch.tensor(0.5), None, skipped=False)
    result = stats.result(
        global_step=3,
        epoch=1.0,
        resumed_from=None,
        restore_seconds=0.0,
        interrupted=None,
        budget_exhausted=False,
        target_reached=False,
        skipped=0,
        last_checkpoint=None,
    )
    assert result.first_step_seconds == 7.5 and result.steady_sentences_per_second == 2.0


def test_budget_and_eta_follow_the_clock():
    clock = FakeClock()
    stats = LoopStats(start_step=20, num_train_steps=120, excluded_steps=10, max_train_seconds=60.0, clock=clock)
    unlimited = LoopStats(start_step=20, num_train_steps=120, excluded_steps=10, max_train_seconds=None, clock=clock)
    clock.now = 25.0
    assert unlimited.eta(45) == 75.0  # 25 steps in 25 s, 75 to go
    assert stats.eta(45) == 35.0 and not stats.budget_spent()  # but only 35 s of the budget are left
    clock.now = 60.0
    assert stats.budget_spent() and not unlimited.budget_spent()
    short = LoopStats(start_step=0, num_train_steps=6, excluded_steps=10, max_train_seconds=None, clock=clock)
    assert short.exclude == 3  # never more than half the run's steps


def recompute_fp16_step(model):
    """One fp16 autocast step with dynamic loss scaling on the CPU; the scaled gradients, unscaled."""
    torch.manual_seed(1)
    step = TrainStep(model, TrainConfig(num_train_steps=10, precision="fp16", max_grad_norm=None))
    grads = {}
    step.optimizer.register_step_pre_hook(
        lambda optimizer, args, kwargs: grads.update(
            {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        )
    )
    outcome = step(iter([batch()]))
    assert step.scaler.is_enabled() and not outcome.skipped
    return outcome.loss, grads


@pytest.mark.parametrize("policy", ["full", "selective"])
def test_recompute_matches_the_baseline_under_fp16_loss_scaling(policy):
    base_loss, base_grads = recompute_fp16_step(classifier(dropout=0.1))
    loss, grads = recompute_fp16_step(classifier("recompute", policy, dropout=0.1))
    assert torch.equal(loss, base_loss) and grads.keys() == base_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], base_grads[name], rtol=0, atol=0, msg=name)


def test_where_a_run_starts(tmp_path):
    run_dir, phase_one = tmp_path / "run", tmp_path / "phase1"
    assert decide_start(str(run_dir), training=True).kind == FRESH
    assert decide_start(str(run_dir), training=True, init_checkpoint="bert_model.ckpt") == type(
        decide_start(str(run_dir), training=True)
    )(WARM_START, "bert_model.ckpt", 0)
    with pytest.raises(CheckpointError, match="no checkpoint to evaluate and no --init_checkpoint"):
        decide_start(str(run_dir), training=False)
    assert decide_start(str(run_dir), training=False, init_checkpoint="hf_dir").kind == WARM_START
    with pytest.raises(CheckpointError, match="no bertbench checkpoint"):
        decide_start(str(run_dir), training=True, init_checkpoint=str(phase_one), continue_phase=True)

    estimator = Estimator(
        classifier(),
        RunConfig(str(phase_one), save_checkpoints_secs=None),
        TrainConfig(num_train_steps=3),
        log=lambda line: None,
    )
    saved = estimator.train(ShuffledBatches(batch(count=16), 8, seed=0)).last_checkpoint
    continued = decide_start(str(run_dir), training=True, init_checkpoint=str(phase_one), continue_phase=True)
    assert (continued.kind, continued.checkpoint, continued.step) == (CONTINUE, saved, 3)
    # The run's own checkpoint wins over any --init_checkpoint, when training and when scoring.
    assert decide_start(str(phase_one), training=True, init_checkpoint="x", continue_phase=True).kind == RESUME
    assert decide_start(str(phase_one), training=False, init_checkpoint="x") == type(continued)(RESTORE, saved, 3)
