"""The unpadded path's attention: each sequence's scaled dot-product attention over its own packed rows, by one of
ATTENTION_KERNELS, and the rule that picks the path and kernel a batch runs on each device (`path_rule`).

`varlen` is one call per layer over [rows, heads, head_dim] with the cumulative sequence lengths: on a CUDA GPU
flash attention's variable-length kernel with its dropout (the kernel nested tensors call underneath, without their
Python dispatch), wrapped once as the custom op `bertbench::varlen_attention` with a registered backward, so that
torch.compile traces it as one op; on a CPU the op runs its reference implementation, the same function computed
per sequence with dropout masks drawn from a seed. Where flash attention cannot run (fp32, a GPU before sm80, a head
size it does not take), the path rule runs `masked` instead and says so.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.profiler import record_function
from torch.utils.flop_counter import register_flop_formula

from bertbench.model.packing import PER_SEQUENCE_MIN_LENGTH, Packing, PathRule

# ---- the custom op ---------------------------------------------------------------------------------------------


def flash_unavailable(device: torch.device | str, dtype: torch.dtype, head_dim: int) -> str | None:
    """Why flash attention's variable-length kernel cannot run here, None when it can."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"flash attention needs a CUDA GPU (this is {device.type})"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash attention needs fp16 or bf16 ({str(dtype).removeprefix('torch.')} runs here)"
    if not torch.backends.cuda.is_flash_attention_available():
        return "this torch build has no flash attention"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"flash attention needs an sm80 GPU or newer (this is sm{major}{minor})"
    if head_dim % 8 or head_dim > 256:
        return f"flash attention takes head sizes that are multiples of 8 up to 256, not {head_dim}"
    return None


def _reference_forward(query, key, value, cu_seqlens, dropout_p, seed, keep_probabilities=False):
    """Each sequence's softmax attention, computed in fp32 at least, with dropout masks drawn from `seed`: the op's
    CPU implementation. Returns the output [rows, heads, head_dim], the logsumexp [heads, rows] and, when asked,
    each sequence's (probabilities, dropout scale) for the backward."""
    scale = 1 / math.sqrt(query.shape[-1])
    compute = torch.promote_types(query.dtype, torch.float32)
    generator = torch.Generator(device=query.device).manual_seed(seed) if dropout_p else None
    bounds = cu_seqlens.tolist()
    outputs, logsumexps, saved = [], [], []
    for start, end in zip(bounds, bounds[1:]):
        q, k, v = (x[start:end].transpose(0, 1).to(compute) for x in (query, key, value))  # [heads, length, dim]
        scores = q @ k.transpose(-1, -2) * scale
        logsumexp = scores.logsumexp(-1, keepdim=True)
        probabilities = (scores - logsumexp).exp()
        kept = probabilities
        dropout_scale = None
        if dropout_p:
            keep = torch.rand(probabilities.shape, generator=generator, device=query.device) >= dropout_p
            dropout_scale = keep.to(compute) / (1 - dropout_p)
            kept = probabilities * dropout_scale
        outputs.append((kept @ v).transpose(0, 1))
        logsumexps.append(logsumexp.squeeze(-1))
        saved.append((probabilities, dropout_scale))
    out = torch.cat(outputs).to(query.dtype) if outputs else torch.empty_like(query)
    logsumexp = torch.cat(logsumexps, -1) if logsumexps else query.new_empty(query.shape[1], 0, dtype=compute)
    return (out, logsumexp.float(), saved) if keep_probabilities else (out, logsumexp.float())


@torch.library.custom_op("bertbench::varlen_attention", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of each sequence over its own rows, with dropout: [rows, heads, head_dim] x 3 and int32
    cu_seqlens [sequences + 1] -> (output [rows, heads, head_dim], logsumexp [heads, rows], the dropout's RNG
    state). Tagged nondeterministic_seeded, so torch.compile's partitioner saves its outputs rather than recompute
    it with another mask."""
    if query.is_cuda:
        out, logsumexp, rng_state, _, _ = torch.ops.aten._flash_attention_forward(
            query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False, False
        )
        return out, logsumexp, rng_state
    # A seed from the default generator: a checkpointed block that restores it draws the same masks again.
    seed = int(torch.randint(2**62, (), dtype=torch.int64)) if dropout_p else 0
    out, logsumexp = _reference_forward(query, key, value, cu_seqlens, dropout_p, seed)
    return out, logsumexp, torch.tensor([seed, 0], dtype=torch.int64)


@varlen_attention.register_fake
def _varlen_attention_fake(query, key, value, cu_seqlens, max_seqlen, dropout_p):
    if query.is_cuda:  # the aten op's own shapes
        out, logsumexp, rng_state, _, _ = torch.ops.aten._flash_attention_forward(
            query, key, value, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, False, False
        )
        return out, logsumexp, rng_state
    return (
        torch.empty_like(query),
        query.new_empty(query.shape[1], query.shape[0], dtype=torch.float32),
        query.new_empty(2, dtype=torch.int64),
    )


@torch.library.custom_op("bertbench::varlen_attention_backward", mutates_args=())
def varlen_attention_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    rng_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    dropout_p: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of varlen_attention's inputs, the same dropout masks replayed from its RNG state."""
    grad_out = grad_out.contiguous()
    if query.is_cuda:
        unused = torch.empty(0, device=query.device)
        return torch.ops.aten._flash_attention_backward(
            grad_out,
            query,
            key,
            value,
            out,
            logsumexp,
            cu_seqlens,
            cu_seqlens,
            max_seqlen,
            max_seqlen,
            dropout_p,
            False,
            rng_state,
            unused,
        )
    return _reference_backward(grad_out, query, key, value, cu_seqlens, dropout_p, int(rng_state[0]))


def _reference_backward(grad_out, query, key, value, cu_seqlens, dropout_p, seed):
    """The gradients of _reference_forward's output with respect to its inputs, the probabilities and dropout masks
    recomputed from `seed`: out = kept v, kept = probabilities x dropout scale, probabilities = softmax(q k^T s)."""
    _, _, saved = _reference_forward(query, key, value, cu_seqlens, dropout_p, seed, keep_probabilities=True)
    scale = 1 / math.sqrt(query.shape[-1])
    grads = [torch.empty_like(x) for x in (query, key, value)]
    bounds = cu_seqlens.tolist()
    for (start, end), (probabilities, dropout_scale) in zip(zip(bounds, bounds[1:]), saved):
        q, k, v, g = (x[start:end].transpose(0, 1).to(probabilities.dtype) for x in (query, key, value, grad_out))
        grad_q, grad_k, grad_v = _sequence_gradients(q * scale, k, v, g, probabilities, dropout_scale)
        for grad, piece in zip(grads, (grad_q * scale, grad_k, grad_v)):
            grad[start:end] = piece.transpose(0, 1).to(grad.dtype)
    return tuple(grads)


def _sequence_gradients(q, k, v, g, probabilities, dropout_scale):
    """One sequence's attention gradients, [heads, length, head_dim] each, of out = (probabilities x dropout_scale) v
    with probabilities = softmax(q k^T) and q already scaled: those of the scaled q, of k and of v. The one backward
    of both CPU kernels that compute each sequence on its own (the varlen op's reference and the per-sequence one)."""
    # bmm, not @: matmul's own dispatch would add an operator call per product, a cost this path exists to avoid
    kept = probabilities if dropout_scale is None else probabilities * dropout_scale
    grad_probabilities = torch.bmm(g, v.transpose(1, 2))
    if dropout_scale is not None:
        grad_probabilities.mul_(dropout_scale)
    grad_scores = torch._softmax_backward_data(grad_probabilities, probabilities, -1, probabilities.dtype)
    return torch.bmm(grad_scores, k), torch.bmm(grad_scores.transpose(1, 2), q), torch.bmm(kept.transpose(1, 2), g)


@varlen_attention_backward.register_fake
def _varlen_attention_backward_fake(
    grad_out, query, key, value, out, logsumexp, rng_state, cu_seqlens, max_seqlen, dropout_p
):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _setup_context(ctx, inputs, output) -> None:
    query, key, value, cu_seqlens, max_seqlen, dropout_p = inputs
    out, logsumexp, rng_state = output
    ctx.save_for_backward(query, key, value, out, logsumexp, rng_state, cu_seqlens)
    ctx.max_seqlen, ctx.dropout_p = max_seqlen, dropout_p


def _backward(ctx, grad_out, _grad_logsumexp, _grad_rng_state):
    query, key, value, out, logsumexp, rng_state, cu_seqlens = ctx.saved_tensors
    grads = torch.ops.bertbench.varlen_attention_backward(
        grad_out, query, key, value, out, logsumexp, rng_state, cu_seqlens, ctx.max_seqlen, ctx.dropout_p
    )
    return *grads, None, None, None


varlen_attention.register_autograd(_backward, setup_context=_setup_context)


def _sequence_lengths(cu_seqlens: torch.Tensor) -> list[int]:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()


# FLOPs as torch counts SDPA's: the scores and the weighted sum, 2 x 2 x length^2 x head_dim per head and sequence
# forward, twice that backward (dV, dP, dQ, dK).
@register_flop_formula(torch.ops.bertbench.varlen_attention, get_raw=True)
def _varlen_attention_flops(query, key, value, cu_seqlens, *args, out_val=None, **kwargs) -> int:
    heads, head_dim = query.shape[1:]
    return sum(4 * length * length * head_dim * heads for length in _sequence_lengths(cu_seqlens))


@register_flop_formula(torch.ops.bertbench.varlen_attention_backward, get_raw=True)
def _varlen_attention_backward_flops(
    grad_out, query, key, value, out, logsumexp, rng_state, cu_seqlens, *args, out_val=None, **kwargs
) -> int:
    heads, head_dim = query.shape[1:]
    return sum(8 * length * length * head_dim * heads for length in _sequence_lengths(cu_seqlens))


# ---- the kernels -----------------------------------------------------------------------------------------------


def _heads(rows: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[..., tokens, hidden] -> [..., heads, tokens, head_dim]"""
    return rows.unflatten(-1, (num_heads, -1)).transpose(-3, -2)


def _merge_heads(context: torch.Tensor) -> torch.Tensor:
    return context.transpose(-3, -2).flatten(-2)


def _varlen(packing: Packing, query, key, value, num_heads: int, dropout_p: float) -> torch.Tensor:
    """One bertbench::varlen_attention call over the packed rows."""
    out = torch.ops.bertbench.varlen_attention(
        *(x.unflatten(-1, (num_heads, -1)) for x in (query, key, value)),
        packing.cu_seqlens,
        packing.max_seqlen,
        dropout_p,
    )[0]
    return out.flatten(-2)


class _PerSequenceAttention(torch.autograd.Function):
    """Each sequence's softmax attention over its own rows, with dropout, in a few operators per sequence: two bmm
    and a softmax forward, four bmm and softmax's backward formula backward, the scale folded into the queries and
    the dropout masks of all the sequences drawn at once (a score kept where its uniform draw is at least dropout_p,
    and scaled by 1 / (1 - dropout_p): Google's dropout). SDPA's math path, the only one that takes dropout on a CPU,
    makes about 150 operator calls per sequence forward and backward, views included, which for a 2 x 128 model cost
    more than the attention's arithmetic. Computed in fp32 at least, as SDPA's math path computes. Its profiler
    ranges name it attention for bertbench bench profile, whose categories would otherwise count its bmm as matmuls."""

    @staticmethod
    def forward(ctx, query, key, value, lengths, num_heads, dropout_p):
        with record_function("bertbench::per_sequence_attention"), torch.autocast(query.device.type, enabled=False):
            hidden = query.shape[-1]
            dtype, compute = query.dtype, torch.promote_types(query.dtype, torch.float32)

            def heads(x):  # [rows, hidden] -> [heads, rows, head_dim]: a sequence's rows are a batch of matrices
                return _heads(x.to(compute), num_heads).contiguous()

            scale = 1 / math.sqrt(hidden // num_heads)
            query, key, value = heads(query * scale), heads(key), heads(value)
            sizes = [num_heads * length * length for length in lengths]
            keep = None  # each score's dropout factor, 0 or 1 / (1 - dropout_p)
            if dropout_p:
                draws = torch.rand(sum(sizes), dtype=compute, device=query.device)
                keep = draws.ge_(dropout_p).mul_(1 / (1 - dropout_p))
            keeps = keep.split(sizes) if keep is not None else [None] * len(lengths)
            outputs, probabilities = [], []
            for q, k_t, v, kept in zip(
                query.split(lengths, 1), key.transpose(1, 2).split(lengths, 2), value.split(lengths, 1), keeps
            ):
                probs = torch.bmm(q, k_t).softmax(-1)
                probabilities.append(probs)
                outputs.append(torch.bmm(probs if kept is None else probs * kept.view(probs.shape), v))
            ctx.save_for_backward(query, key, value, keep, *probabilities)
            ctx.lengths, ctx.scale, ctx.dtype = lengths, scale, dtype
            return _PerSequenceAttention.rows_of(outputs, dtype)

    @staticmethod
    def rows_of(pieces: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """The sequences' [heads, length, head_dim] pieces -> [rows, hidden] in `dtype`."""
        return _merge_heads(torch.cat(pieces, 1)).to(dtype)

    @staticmethod
    def backward(ctx, grad_out):
        with (
            record_function("bertbench::per_sequence_attention_backward"),
            torch.autocast(grad_out.device.type, enabled=False),
        ):
            query, key, value, keep, *probabilities = ctx.saved_tensors  # the queries scaled
            grad_out = _heads(grad_out.to(query.dtype), query.shape[0]).contiguous()
            sizes = [probs.numel() for probs in probabilities]
            keeps = keep.split(sizes) if keep is not None else [None] * len(sizes)
            grads = ([], [], [])  # of the scaled queries, the keys and the values, per sequence
            pieces = (x.split(ctx.lengths, 1) for x in (query, key, value, grad_out))
            for q, k, v, g, probs, kept in zip(*pieces, probabilities, keeps):
                factor = None if kept is None else kept.view(probs.shape)
                for found, grad in zip(grads, _sequence_gradients(q, k, v, g, probs, factor)):
                    found.append(grad)
            grad_query, grad_key, grad_value = (_PerSequenceAttention.rows_of(found, ctx.dtype) for found in grads)
            return grad_query.mul_(ctx.scale), grad_key, grad_value, None, None, None


def _per_sequence(packing: Packing, query, key, value, num_heads: int, dropout_p: float) -> torch.Tensor:
    """Each sequence's attention over its own rows, a few operators per sequence (_PerSequenceAttention): the fastest
    on a CPU for batches whose longest sequence has 64 tokens or more."""
    return _PerSequenceAttention.apply(query, key, value, packing.lengths, num_heads, dropout_p)


def _nested(packing: Packing, query, key, value, num_heads: int, dropout_p: float) -> torch.Tensor:
    """SDPA on jagged nested tensors: one call, which CUDA runs with flash attention's variable-length kernel (the
    one `varlen` calls directly), at the cost of the nested tensors' Python dispatch on the host."""
    offsets = packing.cu_seqlens.long()

    def nested(rows):
        return torch.nested.nested_tensor_from_jagged(
            rows.unflatten(-1, (num_heads, -1)), offsets, max_seqlen=packing.max_seqlen
        ).transpose(1, 2)

    context = F.scaled_dot_product_attention(nested(query), nested(key), nested(value), dropout_p=dropout_p)
    return context.transpose(1, 2).values().flatten(1)


def _masked(packing: Packing, query, key, value, num_heads: int, dropout_p: float) -> torch.Tensor:
    """Rows scattered back to [batch, longest sequence], SDPA with the padding mask, packed again (MosaicBERT's path
    without flash attention)."""
    rows = packing.batch * packing.width
    narrow_indices = packing.narrow_indices()

    def padded(x):
        flat = x.new_zeros(rows, x.shape[-1]).index_copy(0, narrow_indices, x)
        return _heads(flat.view(packing.batch, packing.width, -1), num_heads)

    narrow_mask = packing.mask[:, : packing.width]
    context = F.scaled_dot_product_attention(
        padded(query), padded(key), padded(value), attn_mask=narrow_mask[:, None, None, :], dropout_p=dropout_p
    )
    return _merge_heads(context).flatten(0, 1).index_select(0, narrow_indices)


def _block_diagonal(packing: Packing, query, key, value, num_heads: int, dropout_p: float) -> torch.Tensor:
    """All packed rows as one sequence under a block-diagonal mask: each token attends to its own sequence only."""
    sequence = packing.sequence_ids()
    mask = sequence[:, None] == sequence[None, :]
    return _merge_heads(
        F.scaled_dot_product_attention(
            *(_heads(x, num_heads) for x in (query, key, value)), attn_mask=mask, dropout_p=dropout_p
        )
    )


_KERNELS = {
    "varlen": _varlen,
    "per-sequence": _per_sequence,
    "nested": _nested,
    "masked": _masked,
    "block-diagonal": _block_diagonal,
}
ATTENTION_KERNELS = ("auto", *_KERNELS)


def attention(
    packing: Packing, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_heads: int, dropout_p: float
) -> torch.Tensor:
    """Each sequence's scaled dot-product attention over its own rows: [rows, hidden] x 3 -> [rows, hidden], by
    the packing's kernel."""
    return _KERNELS[packing.kernel](packing, query, key, value, num_heads, dropout_p)


# ---- which path and kernel a batch runs ------------------------------------------------------------------------


def path_rule(
    device: torch.device | str, head_dim: int, dtype: torch.dtype, requested: str | None = None, compiled: bool = False
) -> PathRule:
    """The path and kernel that measured fastest on this device in this compute dtype, for BERT-tiny to -large alike
    (docs/models.md's grid), or the `requested` kernel where it can run (flash attention takes only some head sizes)."""
    device = torch.device(device)
    if requested not in (None, "auto"):
        if requested == "varlen" and device.type == "cuda":
            reason = flash_unavailable(device, dtype, head_dim)
            if reason is not None:
                return PathRule(
                    "masked",
                    MIN_PADDING_SHARE["cuda"],
                    f"--attention_kernel=varlen: {reason}, so the masked kernel runs",
                )
        return PathRule(requested, MIN_PADDING_SHARE.get(device.type, MIN_PADDING_SHARE["cpu"]), "--attention_kernel")
    if device.type == "cuda":
        reason = flash_unavailable(device, dtype, head_dim)
        if reason is None:
            return PathRule(
                "varlen",
                MIN_PADDING_SHARE["cuda"],
                "the fastest measured on a GPU: flash attention's "
                "variable-length kernel on the packed rows, any "
                "padding",
            )
        return PathRule(
            "masked", MIN_PADDING_SHARE["cuda"], f"the fastest measured on a GPU without flash attention ({reason})"
        )
    if compiled:
        return PathRule(
            "masked", MIN_PADDING_SHARE["cpu"], "under torch.compile on a CPU: no host-side sizes in the graph"
        )
    return PathRule(
        "auto",
        MIN_PADDING_SHARE["cpu"],
        "the fastest measured on a CPU: per-sequence attention for "
        f"batches of {PER_SEQUENCE_MIN_LENGTH} tokens or more, masked "
        "below",
    )


# Below this share of padding a batch runs padded, by device type: on a CPU packing and per-sequence attention cost
# more than the padding they skip below 10% (docs/results/cpu-2core/unpadded); on a GPU any padding is worth packing.
MIN_PADDING_SHARE = {"cpu": 0.1, "cuda": 0.0}
