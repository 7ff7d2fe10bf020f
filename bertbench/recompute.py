"""Recompute BERT (the original suite's modeling_v2): activation checkpointing (Chen et al. 2016) on the baseline.

Nothing of the model is copied: a baseline model is built, then the forward of chosen transformer blocks is replaced
by a checkpointed call to the same forward. The module tree is untouched, so parameters, state-dict names and
checkpoints are the baseline's. Policies:

- ``full``: every block keeps only its input; its whole forward is recomputed in backward.
- ``every-k``: blocks 0, k, 2k, ... are checkpointed as in ``full``, the others keep all activations.
- ``selective``: every block keeps its input and the outputs of its dense (matmul) layers, and recomputes the rest:
  the attention core (scores, softmax, dropout, weighted sum) and the element-wise ops (dropout, GELU, LayerNorm).
  The recomputed part is a small share of the FLOPs but most of the activation bytes, the trade Korthikanti et al.
  (2022) call selective recomputation; the original modeling_v2 likewise recomputed inside the attention and dense
  blocks.

Dropout masks are reproduced exactly: checkpoint restores the RNG state before recomputing.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from bertbench import modeling

POLICIES = ("full", "every-k", "selective")

# The ops nn.Linear dispatches to; the selective policy keeps their outputs instead of recomputing them.
_DENSE_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})


# Who is told the size of each output the selective policy caches for backward. Autograd's saved_tensors_hooks do
# not see that cache (checkpoint's dispatch mode holds it), so a counter of saved bytes (bertbench.saved_activations)
# listens here; the model itself keeps no tally.
_cache_listener: contextvars.ContextVar[Callable[[int], None] | None] = contextvars.ContextVar(
    "recompute_cache_listener", default=None)


@contextlib.contextmanager
def listen_to_cached_outputs(listener: Callable[[int], None]) -> Iterator[None]:
    """While active, `listener(nbytes)` is called for each dense-layer output the selective policy keeps."""
    token = _cache_listener.set(listener)
    try:
        yield
    finally:
        _cache_listener.reset(token)


def _keep_dense_outputs(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    if op not in _DENSE_OPS:
        return CheckpointPolicy.PREFER_RECOMPUTE
    listener = _cache_listener.get()
    if listener is not None and not ctx.is_recompute:
        left, right = args[-2], args[-1]
        listener(left.shape[0] * right.shape[1] * left.element_size())
    return CheckpointPolicy.MUST_SAVE


def _selective_context():
    return create_selective_checkpoint_contexts(_keep_dense_outputs)


def _checkpoint_forward(module: nn.Module, context_fn=None) -> None:
    # Overriding the instance's forward (rather than wrapping the module) keeps the state-dict names unchanged.
    forward = module.forward
    extra = {} if context_fn is None else {"context_fn": context_fn}

    @functools.wraps(forward)
    def checkpointed_forward(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation saves nothing, so there is nothing to trade
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    module.forward = checkpointed_forward


def checkpointed_layers(policy: str, num_layers: int, every_k: int = 2) -> list[int]:
    """Indices of the blocks a policy checkpoints."""
    if policy not in POLICIES:
        raise ValueError(f"unknown recompute policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if policy == "every-k":
        if every_k < 1:
            raise ValueError(f"every-k needs k >= 1, got {every_k}")
        return list(range(0, num_layers, every_k))
    return list(range(num_layers))


def apply_recompute(model: nn.Module, policy: str = "full", every_k: int = 2) -> nn.Module:
    """Checkpoint the transformer blocks of a built baseline model in place; returns the model."""
    layers = [module for module in model.modules() if isinstance(module, modeling.BertLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no BertLayer blocks to checkpoint")
    if getattr(model, "recompute_policy", None):
        raise ValueError(f"recompute already applied to this model ({model.recompute_policy})")
    context_fn = _selective_context if policy == "selective" else None
    for index in checkpointed_layers(policy, len(layers), every_k):
        _checkpoint_forward(layers[index], context_fn)
    model.recompute_policy = policy if policy != "every-k" else f"every-{every_k}"
    return model


def _recompute_variant(baseline: type[nn.Module]) -> type[nn.Module]:
    """The recompute counterpart of a baseline class: same constructor plus `policy` and `every_k`."""

    class Recompute(baseline):
        def __init__(self, *args, policy: str = "full", every_k: int = 2, **kwargs):
            super().__init__(*args, **kwargs)
            apply_recompute(self, policy, every_k)

    Recompute.__name__ = Recompute.__qualname__ = baseline.__name__
    Recompute.__doc__ = f"{baseline.__name__} with activation checkpointing; policy is one of {POLICIES}."
    return Recompute


# The same public classes as bertbench.modeling, so either module can be imported as `modeling`.
BertModel = _recompute_variant(modeling.BertModel)
BertForPreTraining = _recompute_variant(modeling.BertForPreTraining)
BertForSequenceClassification = _recompute_variant(modeling.BertForSequenceClassification)
BertForQuestionAnswering = _recompute_variant(modeling.BertForQuestionAnswering)
