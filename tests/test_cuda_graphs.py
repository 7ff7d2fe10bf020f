"""bertbench.training.cuda_graphs' bookkeeping on the CPU, with a recorder that "replays" a capture by running it again into
the captured loss tensor: static inputs reloaded for each batch, one graph per batch signature, the warm-up's and
capture's gradients undone, gradients accumulated into the tensors captured, the RNG forked around the capture,
eager calls beyond the limit, and when a step cannot use graphs and why. tests/test_gpu_unpadded.py runs the real
graphs on a GPU."""

import dataclasses

import pytest
import torch
from helpers import tiny_config

from bertbench.model.factory import build_model
from bertbench.model.packing import Packer
from bertbench.tasks.synthetic import synthetic_batch
from bertbench.training.config import TrainConfig
from bertbench.training.cuda_graphs import GraphedMicroBatches, batch_signature
from bertbench.training.distributed import Distributed
from bertbench.training.step import TrainStep, graphs_unavailable

CONFIG = tiny_config(num_hidden_layers=2)  # dropout on


def replay_by_running(run, inputs, pool):
    loss = run(inputs)
    return (lambda: loss.copy_(run(inputs))), loss


def batches(count, seed=0, batch=4, seq=24):
    generator = torch.Generator().manual_seed(seed)
    for index in range(count):
        lengths = torch.randint(3, seq + 1, (batch,), generator=generator).tolist()
        yield synthetic_batch(CONFIG, "finetuning", batch, seq, seed=index, lengths=lengths)


def training(graphed, steps=3, accumulation=2, max_graphs=32, drop_grads=False, modeling=("baseline", "full")):
    """A step on bucketed varlen packings (the op's CPU implementation), eager or through the fake graphs."""
    torch.manual_seed(0)
    model = build_model("classification", CONFIG, *modeling, attention_kernel="varlen", num_labels=2)
    step = TrainStep(model, TrainConfig(num_train_steps=100, gradient_accumulation_steps=accumulation))
    step.packer = dataclasses.replace(step.packer, bucketed=True)
    if graphed:
        step.graphs = GraphedMicroBatches(model, torch.device("cpu"), max_graphs, replay_by_running)
    stream = batches(steps * accumulation)
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        losses.append(step(stream).loss)
        if drop_grads:
            model.zero_grad(set_to_none=True)
    return step, torch.stack(losses), [parameter.detach().clone() for parameter in model.parameters()]


def assert_same_training(got, expected):
    (_, got_losses, got_weights), (_, losses, weights) = got, expected
    assert torch.equal(got_losses, losses)
    for got_weight, weight in zip(got_weights, weights):
        assert torch.equal(got_weight, weight)


def test_replayed_micro_batches_train_exactly_as_eager_ones():
    """Dropout on, two micro-batches a step, several bucket sizes: the same losses and weights bit for bit, each
    micro-batch replayed, one capture per signature."""
    graphed = training(True)
    assert_same_training(graphed, training(False))
    summary = graphed[0].execution()["cuda_graphs"]
    assert summary["replays"] == 6 and summary["eager_calls"] == 0
    assert summary["captures"] == summary["graphs"] == len(summary["bucket_rows"]) >= 2
    assert 0 < summary["bucket_filler_share"] < 1 / 8


def test_selective_recompute_is_replayed_as_the_baseline_is():
    """Selective recompute's GELU, recomputed from a saved-tensor hook, is part of what a graph captures."""
    graphed = training(True, modeling=("recompute", "selective"))
    assert_same_training(graphed, training(False, modeling=("recompute", "selective")))
    assert graphed[0].execution()["cuda_graphs"]["replays"] == 6


def test_beyond_the_limit_batches_run_eagerly_and_are_counted():
    graphed = training(True, max_graphs=1)
    assert_same_training(graphed, training(False))
    summary = graphed[0].execution()["cuda_graphs"]
    assert summary["graphs"] == 1 and summary["eager_calls"] == 6 - summary["replays"] > 0


def test_gradients_dropped_between_steps_come_back_in_the_captured_tensors():
    """A user (or an optimizer) setting the gradients to None does not lose the graphs' accumulation."""
    assert_same_training(training(True, drop_grads=True), training(False))


def batch_of(tokens, batch=4, seq=24):
    """A batch whose sequences hold `tokens` real tokens in all."""
    lengths = [tokens // batch + (row < tokens % batch) for row in range(batch)]
    return synthetic_batch(CONFIG, "finetuning", batch, seq, lengths=lengths)


def test_one_signature_per_bucket_and_path():
    """Batches of one bucket share a graph whatever their lengths; another bucket, or the padded path, has its own."""
    rule = build_model("classification", CONFIG, attention_kernel="varlen", num_labels=2).bert.path_rule(
        "cpu", torch.float32
    )
    packed = {
        tokens: dict(batch, packing=Packer(rule, bucketed=True)(batch["attention_mask"]))
        for tokens, batch in ((29, batch_of(29)), (31, batch_of(31)), (40, batch_of(40)))
    }
    assert [packed[tokens]["packing"].rows for tokens in (29, 31, 40)] == [32, 32, 40]
    assert batch_signature(packed[29]) == batch_signature(packed[31]) != batch_signature(packed[40])
    padded = dict(batch_of(29), packing=Packer(None)(batch_of(29)["attention_mask"]))
    assert batch_signature(padded) != batch_signature(packed[29])


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"cuda_graphs": False}, "--cuda_graphs=false"),
        ({"device": "cpu"}, "CUDA graphs need a CUDA GPU (this is cpu)"),
        ({"world_size": 2}, "DistributedDataParallel all-reduces"),
        ({"world_size": 2, "sync_gradients": False}, None),  # independent workers: no all-reduce
        ({"modeling": "recompute"}, "activation checkpointing saves the CUDA RNG state"),
        ({"modeling": "recompute", "policy": "every-k"}, "activation checkpointing saves the CUDA RNG state"),
        ({"modeling": "recompute", "policy": "selective"}, None),  # a saved-tensor hook, no checkpoint
        ({"modeling": "recompute", "policy": "selective", "compile": True}, "activation checkpointing saves"),
        ({"kernel": "masked"}, "the masked kernel's sizes change with every batch"),
        ({}, None),
    ],
)
def test_when_a_step_replays_no_graphs_it_says_why(change, reason):
    model = build_model(
        "classification", CONFIG, change.get("modeling", "baseline"), change.get("policy", "full"), num_labels=2
    )
    config = TrainConfig(
        num_train_steps=1,
        precision="bf16",
        cuda_graphs=change.get("cuda_graphs", True),
        sync_gradients=change.get("sync_gradients", True),
        compile=change.get("compile", False),
    )
    dist = Distributed(world_size=change.get("world_size", 1), device=torch.device(change.get("device", "cuda")))
    rule = dataclasses.replace(model.bert.path_rule("cpu", torch.float32), kernel=change.get("kernel", "varlen"))
    got = graphs_unavailable(model, config, dist, Packer(rule))
    assert got is None if reason is None else got.startswith(reason), got
