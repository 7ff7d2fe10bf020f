"""Run under torchrun by test_distributed.py (a phase of its job, torchrun_phases.py, calls main): what the Estimator
and Distributed do across real processes (gloo).

Writes rank 0's findings as JSON to argv[0]:
- allreduce_calls: per modeling module / policy, the backward passes whose gradients DDP all-reduced during 3
  optimizer steps of 4 accumulated micro-batches each (counted by a comm hook), and its bucket all-reduces;
- evaluate / predict over an odd number of examples split across the ranks, against the same model run by this
  process alone over all of them;
- Distributed.mean, broadcast_module and shard;
- a checkpoint that rank 0 wrote training alone, resumed on both ranks (weights, data position, RNG restart);
- a time budget, measured on rank 0's clock though rank 1's loop started first.

argv[1], when given, is the directory where the training runs are kept (each in <modeling>-<policy>/), for the test
to resume one of them in a single process.
"""

import json
import os
import sys
import tempfile
import time

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from helpers import tiny_batch, tiny_config  # noqa: E402

from bertbench.model.factory import build_model  # noqa: E402
from bertbench.training import loop  # noqa: E402
from bertbench.training.batches import ShuffledBatches  # noqa: E402
from bertbench.training.checkpoint import latest_checkpoint, load_checkpoint  # noqa: E402
from bertbench.training.config import RunConfig, TrainConfig  # noqa: E402
from bertbench.training.distributed import job_from_environment  # noqa: E402
from bertbench.training.loop import Estimator  # noqa: E402
from bertbench.training.state import seed_everything  # noqa: E402
from bertbench.training.stats import LoopStats  # noqa: E402

ALLREDUCES: list[bool] = []  # per bucket all-reduce: whether it was the backward pass's last bucket


class CountingDDP(nn.parallel.DistributedDataParallel):
    """DDP whose every bucket all-reduce is recorded; the estimator builds it in place of the real class. Small
    buckets, so that the tiny model's gradients travel in several."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, bucket_cap_mb=0.05, **kwargs)
        self.register_comm_hook(None, self._count)

    @staticmethod
    def _count(state, bucket):
        ALLREDUCES.append(bucket.is_last())
        return allreduce_hook(state, bucket)


def features(config, count: int, seed: int) -> dict[str, torch.Tensor]:
    input_ids, token_type_ids, attention_mask = tiny_batch(config, batch=count, seq=16, seed=seed)
    labels = torch.arange(count) % 2
    return {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "labels": labels,
    }


class FirstBatchProbe(ShuffledBatches):
    """Batches that note, as the first one is drawn (after a resume's restore, before any update), its input ids,
    the model's weights and torch's generator state."""

    def __init__(self, *args, model: nn.Module, **kwargs):
        super().__init__(*args, **kwargs)
        self.model, self.first = model, None

    def __next__(self) -> dict[str, torch.Tensor]:
        batch = super().__next__()
        if self.first is None:
            self.first = {
                "input_ids": batch["input_ids"],
                "rng": torch.get_rng_state(),
                "weights": {name: tensor.clone() for name, tensor in self.model.state_dict().items()},
            }
        return batch


def same_weights(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(torch.equal(first[name], second[name]) for name in first)


def resume_a_one_process_run_on_two(config, dist_info, scratch: str) -> dict:
    """Rank 0 alone trains 2 steps of batch 4 and saves; both ranks then resume that checkpoint with 2 each (the same
    global batch), from initial weights of their own, for one more step."""
    model_dir = dist_info.all_gather_object(os.path.join(scratch, "one-then-two"))[0]  # rank 0's, for both
    data = features(config, 64, seed=1)
    if dist_info.is_main:
        seed_everything(0)
        Estimator(
            build_model("classification", config, num_labels=2),
            RunConfig(model_dir=model_dir, save_checkpoints_secs=None),
            TrainConfig(num_train_steps=2, excluded_steps=0),
            log=lambda line: None,
        ).train(ShuffledBatches(data, 4, seed=0))
    dist_info.barrier()
    checkpoint = latest_checkpoint(model_dir)
    saved = load_checkpoint(checkpoint)
    seed_everything(100 + dist_info.rank)
    model = build_model("classification", config, num_labels=2)
    fresh_weights_differ = not same_weights(model.state_dict(), saved["model"])
    logs: list[str] = []
    batches = FirstBatchProbe(data, 2, seed=0, rank=dist_info.rank, world_size=2, model=model)
    result = Estimator(
        model,
        RunConfig(model_dir=model_dir, save_checkpoints_secs=None),
        TrainConfig(num_train_steps=3, excluded_steps=0),
        dist_info,
        log=logs.append,
    ).train(batches)
    reference = ShuffledBatches(data, 4, seed=0)  # the one-process order: its third batch, split over the ranks
    expected_ids = [next(reference)["input_ids"] for _ in range(3)][2][2 * dist_info.rank : 2 * dist_info.rank + 2]
    own = {
        "first_batch_is_the_next_one": torch.equal(batches.first["input_ids"], expected_ids),
        "fresh_weights_differ": fresh_weights_differ,
        "weights_were_the_checkpoints": same_weights(batches.first["weights"], saved["model"]),
        "rng": batches.first["rng"].tolist(),
        "saved_rng": saved["rng"][0]["torch"].tolist(),
        "consumed": batches.consumed,
    }
    return {
        "ranks": dist_info.all_gather_object(own),
        "logs": logs,
        "checkpoint": checkpoint,
        "resumed_from": result.resumed_from,
        "global_step": result.global_step,
    }


def budget_on_rank_zeros_clock(config, dist_info, scratch: str) -> dict:
    """A time budget of 0.5 s, with rank 0's loop clock started 0.5 s after rank 1's (rank 0 does the loop's
    set-up alone, making the directory and opening the log, though in milliseconds; here it also sleeps). Rank 1's
    clock then runs while it waits for rank 0 in the first step's all-reduce; the budget is rank 0's clock's, the
    one that times the run's figures."""

    class LateOnRankZero(LoopStats):
        def __init__(self, **kwargs):
            if dist_info.is_main:
                time.sleep(0.5)
            super().__init__(**kwargs)

    seed_everything(0)
    estimator = Estimator(
        build_model("classification", config, num_labels=2),
        RunConfig(model_dir=os.path.join(scratch, "budget"), save_checkpoints_secs=None),
        TrainConfig(num_train_steps=100_000, excluded_steps=0, max_train_seconds=0.5),
        dist_info,
        log=lambda line: None,
    )
    batches = ShuffledBatches(features(config, 64, seed=1), 2, seed=0, rank=dist_info.rank, world_size=2)
    loop.LoopStats = LateOnRankZero
    try:
        result = estimator.train(batches)
    finally:
        loop.LoopStats = LoopStats
    return {
        "seconds": result.seconds,
        "budget_exhausted": result.budget_exhausted,
        "steps": dist_info.all_gather_object(result.global_step),
    }


def count_allreduces(config, dist_info, modeling: str, policy: str, model_dir: str) -> dict[str, int]:
    seed_everything(0)
    model = build_model("classification", config, modeling, policy, num_labels=2)
    steps, accumulation = 3, 4
    estimator = Estimator(
        model,
        RunConfig(model_dir=model_dir, save_checkpoints_secs=None),
        TrainConfig(num_train_steps=steps, gradient_accumulation_steps=accumulation, excluded_steps=0),
        dist_info,
        log=lambda line: None,
    )
    ALLREDUCES.clear()
    estimator.train(
        ShuffledBatches(features(config, 64, seed=1), 2, seed=0, rank=dist_info.rank, world_size=dist_info.world_size)
    )
    return {
        "synchronized_backwards": sum(ALLREDUCES),
        "bucket_allreduces": len(ALLREDUCES),
        "steps": steps,
        "micro_batches": steps * accumulation,
    }


def check(dist_info, runs: str | None) -> dict:
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    report: dict = {"world_size": dist_info.world_size, "allreduce_calls": {}}
    with tempfile.TemporaryDirectory() as scratch:
        runs = runs or scratch
        for modeling, policy in (
            ("baseline", "full"),
            ("recompute", "full"),
            ("recompute", "selective"),
            ("recompute", "every-k"),
        ):
            model_dir = os.path.join(runs, f"{modeling}-{policy}")
            report["allreduce_calls"][f"{modeling}/{policy}"] = count_allreduces(
                config, dist_info, modeling, policy, model_dir
            )

        seed_everything(1)
        model = build_model("classification", config, num_labels=2)
        estimator = Estimator(
            model, RunConfig(model_dir=os.path.join(scratch, "eval")), None, dist_info, log=lambda line: None
        )
        data = features(config, 37, seed=2)  # 37: the two shards differ in size
        predicted = estimator.predict(data, batch_size=5)["logits"]
        scores = estimator.evaluate(data, batch_size=5)
        with torch.no_grad():
            model.eval()
            reference = model(**data)
        report["predict_rows"] = len(predicted)
        report["predict_max_difference"] = (predicted - reference.logits).abs().max().item()
        report["eval_loss"], report["reference_loss"] = scores["loss"], reference.loss.item()
        report["shard"] = dist_info.all_gather_object(list(dist_info.shard(37)))
        report["one_process_run_resumed_on_two"] = resume_a_one_process_run_on_two(config, dist_info, scratch)
        report["budget"] = budget_on_rank_zeros_clock(config, dist_info, scratch)

    report["mean_of_ranks"] = dist_info.mean(float(dist_info.rank))
    layer = nn.Linear(3, 3)
    with torch.no_grad():
        layer.weight.fill_(dist_info.rank)
    dist_info.broadcast_module(layer, source=dist_info.world_size - 1)
    report["broadcast_weights"] = dist_info.all_gather_object(layer.weight.unique().tolist())
    return report


def main(argv: list[str]) -> int:
    """The checks, with DDP counting its all-reduces while they run (the phases after them train with the real one)."""
    real_ddp, nn.parallel.DistributedDataParallel = nn.parallel.DistributedDataParallel, CountingDDP
    try:
        with job_from_environment("cpu") as dist_info:
            report = check(dist_info, argv[1] if len(argv) > 1 else None)
            if dist_info.is_main:
                with open(argv[0], "w") as handle:
                    json.dump(report, handle)
    finally:
        nn.parallel.DistributedDataParallel = real_ddp
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
