"""The unpadded path on a CUDA GPU (skipped without one): flash attention's variable-length kernel through
bertbench::varlen_attention against the padded path computed in float64, for every head, modeling module and
recompute policy, in fp32 (the masked fallback), bf16 and fp16; its dropout replayed exactly by recompute and by
the CUDA graphs; a training step that makes no host sync; compiled against eager."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    HEAD_KWARGS,
    POLICIES,
    assert_close_to_fp64,
    forward_backward,
    lengths_mask,
    tiny_config,
    varied_batch,
)

from bertbench.model import attention
from bertbench.model.factory import TASKS, build_model
from bertbench.model.packing import Packer
from bertbench.model.precision import precision_dtype
from bertbench.tasks.synthetic import synthetic_batch
from bertbench.training.config import TrainConfig
from bertbench.training.distributed import Distributed
from bertbench.training.step import TrainStep

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")
GPU = Distributed(device=DEVICE)
# head_dim 16: flash attention takes it; dropout off where paths are compared, Google's 0.1 where masks must replay
NO_DROPOUT = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
DROPOUT = tiny_config(num_hidden_layers=4)
LENGTHS = (12, 1, 7, 4)


def to_device(batch):
    return tuple(tensor.to(DEVICE) for tensor in batch)


def autocast(precision):
    if precision == "fp32":
        return torch.autocast("cuda", enabled=False)
    return torch.autocast("cuda", dtype=precision_dtype(precision))


@pytest.mark.parametrize("dtype, bound", [(torch.bfloat16, 2e-2), (torch.float16, 4e-3)])
def test_the_op_is_each_sequences_attention_with_its_gradients(dtype, bound):
    """Flash varlen on packed rows against per-sequence attention in float64, fresh random inputs, zero-length
    and one-token sequences included; the output is poisoned first, so an unwritten row fails."""
    torch.manual_seed(0)
    lengths = [37, 1, 0, 128, 64, 5]
    cu_seqlens = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).int().to(DEVICE)
    rows, heads, head_dim = sum(lengths), 4, 64
    inputs = [torch.randn(rows, heads, head_dim, device=DEVICE, dtype=dtype, requires_grad=True) for _ in range(3)]
    out = torch.ops.bertbench.varlen_attention(*inputs, cu_seqlens, max(lengths), 0.0)[0]
    grad = torch.randn_like(out)
    out.backward(grad)
    reference = [x.detach().double().requires_grad_() for x in inputs]
    pieces, start = [], 0
    for length in lengths:
        q, k, v = (x[start : start + length].transpose(0, 1) for x in reference)
        pieces.append(F.scaled_dot_product_attention(q, k, v).transpose(0, 1))
        start += length
    expected = torch.cat(pieces)
    expected.backward(grad.double())
    for got, want in [(out, expected), *zip((x.grad for x in inputs), (x.grad for x in reference))]:
        error = (got.double() - want).norm() / want.norm()
        assert torch.isfinite(got).all() and error < bound, error


def test_the_ops_dropout_replays_from_its_rng_state():
    """The same RNG state gives the same masks (forward and backward), another one others; dropout 0.1 keeps about
    90% of the mass."""
    torch.manual_seed(0)
    lengths = [100, 28, 128]
    cu_seqlens = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).int().to(DEVICE)
    inputs = [
        torch.randn(sum(lengths), 4, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    ]

    def run(seed):
        torch.cuda.manual_seed(seed)
        out = torch.ops.bertbench.varlen_attention(*inputs, cu_seqlens, 128, 0.1)[0]
        grads = torch.autograd.grad(out.float().square().sum(), inputs)
        return out, grads

    (first, first_grads), (again, again_grads), (other, _) = run(1), run(1), run(2)
    assert torch.equal(first, again)
    for got, expected in zip(again_grads, first_grads):
        torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-3)  # the same masks, atomics' order aside
    assert not torch.equal(first, other)
    plain = torch.ops.bertbench.varlen_attention(*inputs, cu_seqlens, 128, 0.0)[0]
    assert 0.02 < (first.float() - plain.float()).abs().mean() / plain.float().abs().mean() < 0.5


def assert_gpu_paths_agree(task, precision, modeling_name="baseline", policy="full"):
    """The default unpadded path (varlen in bf16/fp16, the masked fallback in fp32) against the padded path in the
    same precision and in float64, same weights, dropout off."""
    batch = to_device(varied_batch(NO_DROPOUT, lengths_mask(LENGTHS)))

    def model(unpad):  # built anew, not copied: a copy's checkpointed forward would call the original's blocks
        torch.manual_seed(0)
        return build_model(task, NO_DROPOUT, modeling_name, policy, unpad=unpad, **HEAD_KWARGS.get(task, {})).to(DEVICE)

    ours, padded, fp64 = model(True), model(False), model(False).double()
    bert = ours if task == "encoder" else ours.bert
    with torch.no_grad(), autocast(precision):
        expected_kernel = "masked" if precision == "fp32" else "varlen"
        assert bert(*batch).packing.kernel == expected_kernel
    with autocast(precision):
        got, expected = forward_backward(ours, task, batch), forward_backward(padded, task, batch)
    reference = forward_backward(fp64, task, batch)
    for name in got:
        assert_close_to_fp64(got[name], expected[name], reference[name], name)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("task", list(TASKS))
def test_every_head_matches_the_padded_path_in_float64(task, precision):
    assert_gpu_paths_agree(task, precision)


@pytest.mark.parametrize("policy, every_k", POLICIES)
def test_every_recompute_policy_matches_the_padded_path_in_float64(policy, every_k):
    assert_gpu_paths_agree("pretraining", "bf16", "recompute", policy)


def dropout_step(model, seed=7):
    """One forward+backward in bf16 with dropout on, on packed rows: the loss and every gradient."""
    input_ids, token_type_ids, mask = to_device(varied_batch(DROPOUT, lengths_mask((64, 9, 33, 50), seq=64)))
    model.to(DEVICE).train()
    torch.manual_seed(seed)
    with autocast("bf16"):
        out = model(input_ids, token_type_ids, mask, labels=torch.tensor([0, 1, 1, 0], device=DEVICE))
    out.loss.backward()
    return out.loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("policy, every_k", POLICIES)
def test_recompute_replays_the_flash_dropout_masks(policy, every_k):
    """A checkpointed block restores the CUDA RNG state, so its recomputed attention draws the masks the forward
    drew: the same loss, bit for bit, and the same gradients (up to the order of the kernels' atomic adds); another
    seed gives another loss."""

    def make(name):
        torch.manual_seed(0)
        return build_model("classification", DROPOUT, name, policy, every_k, num_labels=2)

    base_loss, base_grads = dropout_step(make("baseline"))
    loss, grads = dropout_step(make("recompute"))
    other_loss, other_grads = dropout_step(make("baseline"), seed=8)
    assert torch.equal(loss, base_loss) and not torch.equal(other_loss, base_loss)
    for name in grads:
        error = (grads[name] - base_grads[name]).norm() / base_grads[name].norm()
        other = (other_grads[name] - base_grads[name]).norm() / base_grads[name].norm()
        assert error < 1e-2 and other > 10 * error, (name, error, other)


def training_batches(seed, count, batch=16, seq=64):
    """`count` CPU batches of varied lengths, as a data set gives them."""
    generator = torch.Generator().manual_seed(seed)
    for index in range(count):
        lengths = torch.randint(8, seq + 1, (batch,), generator=generator).tolist()
        yield synthetic_batch(DROPOUT, "finetuning", batch, seq, seed=seed * count + index, lengths=lengths)


def trained(cuda_graphs, steps=4, accumulation=2, compile=False):
    torch.manual_seed(0)
    model = build_model("classification", DROPOUT, num_labels=2)
    step = TrainStep(
        model,
        TrainConfig(
            num_train_steps=100,
            precision="bf16",
            cuda_graphs=cuda_graphs,
            gradient_accumulation_steps=accumulation,
            compile=compile,
        ),
        GPU,
    )
    if not cuda_graphs:  # the eager step on the graphed one's bucketed rows: the same kernels, the same masks
        step.packer = dataclasses.replace(step.packer, bucketed=True)
    torch.manual_seed(1)
    batches = training_batches(2, steps * accumulation)
    losses = [step(batches).loss.item() for _ in range(steps)]
    return step, losses, [parameter.detach().clone() for parameter in model.parameters()]


def test_a_graphed_step_trains_as_the_eager_one():
    """With dropout on, gradient accumulation and batches of varied lengths (several buckets): the graphs replay the
    masks the eager step draws, so the losses are the eager ones bit for bit and the weights agree after 4 steps;
    every micro-batch was replayed from a graph, and the bucket filler is under 1/8 of the rows."""
    graphed, graphed_losses, graphed_weights = trained(True)
    eager, eager_losses, eager_weights = trained(False)
    assert eager.graphs is None and graphed.graphs is not None
    assert graphed_losses[0] == eager_losses[0]  # later steps follow weights that the atomics' order touched
    torch.testing.assert_close(torch.tensor(graphed_losses), torch.tensor(eager_losses), rtol=1e-3, atol=1e-4)
    for got, expected in zip(graphed_weights, eager_weights):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-5)
    summary = graphed.execution()["cuda_graphs"]
    assert summary["replays"] == 8 and summary["eager_calls"] == 0
    assert summary["graphs"] == len(summary["bucket_rows"]) and 0 <= summary["bucket_filler_share"] < 1 / 8


def test_the_training_step_makes_no_host_sync():
    """The packing comes from the host with the batch: a graphed step, and an eager one, run with CUDA's sync
    debugging set to fail on any synchronisation."""
    for cuda_graphs in (True, False):
        torch.manual_seed(0)
        step = TrainStep(
            build_model("classification", DROPOUT, num_labels=2),
            TrainConfig(num_train_steps=100, precision="bf16", cuda_graphs=cuda_graphs),
            GPU,
        )
        batches = training_batches(3, 3)
        step(batches)  # the captures (warm-up, allocation) happen here
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            step(batches)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_the_compiled_step_traces_the_op_and_trains_as_the_eager_one():
    """torch.compile traces bertbench::varlen_attention as one op (no graph break in the model), the packing a
    plain input; compiled and eager steps agree to bf16's rounding."""
    torch._dynamo.reset()
    _, compiled_losses, compiled_weights = trained(True, steps=3, compile=True)
    _, eager_losses, eager_weights = trained(True, steps=3)
    torch.testing.assert_close(torch.tensor(compiled_losses), torch.tensor(eager_losses), rtol=2e-2, atol=2e-2)
    for got, expected in zip(compiled_weights, eager_weights):
        torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-3)


def test_fp32_falls_back_to_the_masked_kernel_and_says_why():
    rule = attention.path_rule(DEVICE, 64, torch.float32)
    assert rule.kernel == "masked" and "fp16 or bf16" in rule.reason
    assert Packer(rule)(torch.tensor([[1, 1, 0], [1, 0, 0]])).kernel == "masked"
    step = TrainStep(build_model("classification", DROPOUT, num_labels=2), TrainConfig(num_train_steps=1), GPU)
    assert step.graphs is None and "masked kernel's sizes" in step.execution()["cuda_graphs_off"]
