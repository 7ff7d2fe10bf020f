"""bertbench::varlen_attention on the CPU, where its reference implementation runs: each sequence's attention over
its own rows (zero-length and one-token sequences included) against SDPA in float64, gradients by finite
differences with and without dropout, dropout masks replayed from the state the op returns, the checks
torch.library.opcheck makes of a custom op (schema, fake tensors for torch.compile, autograd registration), and
the FLOPs FlopCounterMode counts for it. tests/test_gpu_unpadded.py runs the flash attention kernel it calls on a
GPU."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from bertbench.model import attention  # noqa: F401  (registers the op)

LENGTHS = (5, 1, 0, 7, 3)
HEADS, HEAD_DIM = 3, 8


def inputs(dtype=torch.float64, seed=0, lengths=LENGTHS, heads=HEADS, head_dim=HEAD_DIM):
    generator = torch.Generator().manual_seed(seed)
    rows = sum(lengths)
    qkv = [torch.randn(rows, heads, head_dim, generator=generator, dtype=dtype).requires_grad_() for _ in range(3)]
    cu_seqlens = F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).int()
    return qkv, cu_seqlens, max(lengths)


def varlen(qkv, cu_seqlens, longest, dropout_p=0.0):
    return torch.ops.bertbench.varlen_attention(*qkv, cu_seqlens, longest, dropout_p)


def test_each_sequence_attends_to_its_own_rows():
    qkv, cu_seqlens, longest = inputs()
    out, logsumexp, _ = varlen(qkv, cu_seqlens, longest)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds, bounds[1:]):
        q, k, v = (x[start:end].transpose(0, 1) for x in qkv)
        expected = F.scaled_dot_product_attention(q, k, v).transpose(0, 1)
        torch.testing.assert_close(out[start:end], expected, rtol=1e-12, atol=1e-12)
        scores = q @ k.transpose(-1, -2) / HEAD_DIM**0.5
        torch.testing.assert_close(logsumexp[:, start:end], scores.logsumexp(-1).float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_gradients_match_finite_differences(dropout_p):
    """With dropout, each call reseeds the default generator: the op draws its masks from it, so every evaluation of
    the function sees the same masks, and its backward replays them."""
    qkv, cu_seqlens, longest = inputs(lengths=(5, 1, 0, 3), heads=2, head_dim=4)  # every element perturbed twice

    def function(*tensors):
        torch.manual_seed(11)
        return varlen(tensors, cu_seqlens, longest, dropout_p)[0]

    assert torch.autograd.gradcheck(function, tuple(qkv))


def test_dropout_masks_replay_from_the_generator_and_keep_the_expected_mass():
    qkv, cu_seqlens, longest = inputs(torch.float32, lengths=(64, 40, 64))
    torch.manual_seed(5)
    first = varlen(qkv, cu_seqlens, longest, 0.1)
    torch.manual_seed(5)
    again = varlen(qkv, cu_seqlens, longest, 0.1)
    other = varlen(qkv, cu_seqlens, longest, 0.1)
    plain = varlen(qkv, cu_seqlens, longest)[0]
    assert torch.equal(first[0], again[0]) and torch.equal(first[2], again[2])
    assert not torch.equal(first[0], other[0])
    assert 0.02 < ((first[0] - plain).abs().mean() / plain.abs().mean()).item() < 0.5


def test_the_custom_op_passes_torchs_checks():
    qkv, cu_seqlens, longest = inputs(torch.float32)
    torch.library.opcheck(torch.ops.bertbench.varlen_attention, (*qkv, cu_seqlens, longest, 0.0))


def test_flops_are_counted_per_sequence():
    qkv, cu_seqlens, longest = inputs(torch.float32)
    with FlopCounterMode(display=False) as counter:
        varlen(qkv, cu_seqlens, longest)[0].sum().backward()
    counts = {str(op): count for op, count in counter.get_flop_counts()["Global"].items()}
    forward = sum(4 * length * length * HEAD_DIM * HEADS for length in LENGTHS)
    assert counts["bertbench.varlen_attention"] == forward
    assert counts["bertbench.varlen_attention_backward"] == 2 * forward


@pytest.mark.parametrize("dropout_p", [0.0, 0.3])
def test_the_per_sequence_kernels_own_backward_matches_finite_differences(dropout_p):
    """The CPU's per-sequence kernel (attention._PerSequenceAttention, a backward of its own): each evaluation reseeds
    the default generator, from which it draws its masks, so that every evaluation sees the same ones."""
    from bertbench.model.packing import Packing

    packing = Packing.of_mask(torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]]), "per-sequence")
    generator = torch.Generator().manual_seed(3)
    qkv = [torch.randn(packing.rows, 8, generator=generator, dtype=torch.float64).requires_grad_() for _ in range(3)]

    def function(*tensors):
        torch.manual_seed(11)
        return attention.attention(packing, *tensors, 2, dropout_p)

    assert torch.autograd.gradcheck(function, tuple(qkv))
    if not dropout_p:  # each sequence's own SDPA, heads apart
        out, start = function(*qkv), 0
        for length in packing.lengths:
            q, k, v = (x[start : start + length].view(length, 2, 4).transpose(0, 1) for x in qkv)
            expected = F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(length, 8)
            torch.testing.assert_close(out[start : start + length], expected, rtol=1e-12, atol=1e-12)
            start += length
    else:  # about dropout_p of the probabilities dropped: the output moves, by a share in keeping with that
        plain = attention.attention(packing, *qkv, 2, 0.0)
        moved = ((function(*qkv) - plain).abs().mean() / plain.abs().mean()).item()
        assert 0.05 < moved < 1.0
