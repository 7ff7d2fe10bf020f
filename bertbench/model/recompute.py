"""Recompute BERT (the original suite's modeling_v2): activation checkpointing (Chen et al. 2016) on the baseline.

Nothing of the model is copied: a baseline model is built, then chosen transformer blocks are changed in place, by
replacing the forward of a module instance. The module tree is untouched, so parameters, state-dict names and
checkpoints are the baseline's. Policies:

- ``full``: every block keeps only its input; its whole forward is recomputed in backward.
- ``every-k``: blocks 0, k, 2k, ... are checkpointed as in ``full``, the others keep all activations.
- ``selective``: every block keeps what the baseline keeps except the feed-forward activation's output (GELU's, 4H
  per token), which the output dense layer would keep for its weight gradient: backward recomputes it from GELU's
  input, which GELU's own backward keeps anyway. One elementwise kernel per block is recomputed, no matmul and no
  attention.

Why not more, as Korthikanti et al. (2022) recompute the attention core: on a GPU the attention is flash or
memory-efficient SDPA (or flash's variable-length kernel through bertbench::varlen_attention), which never keeps the
score matrix, so recomputing the core frees nothing but its output and costs a whole attention forward. Per token a
block keeps, in bytes per hidden unit under bf16 autocast on a GPU: the block input's bf16 copy 2, Q, K, V 6, the
attention output 2, two dropout masks 1 each, two LayerNorm inputs in fp32 4 each, the second LayerNorm's output
copy 2, the intermediate dense output 8 and GELU's output 8: about 38, of which GELU's output is the largest thing
that is cheap to recompute. What is left is matmul and attention outputs (recomputed only at a matmul's cost), the
fp32 LayerNorm inputs and the masks (a few bytes each).

How, with little host work: the GPU step is bound by the host, so no TorchDispatchMode (torch's selective
checkpointing runs Python for every op of the forward and again in the recompute). Instead a saved-tensor hook is
active only while the output dense layer runs: when that layer saves GELU's output for backward, the hook keeps a
recipe (GELU's input and the view's layout) in its place, and backward's unpack runs GELU on it: two Python calls
per block in the forward, one in backward. The gradients are autograd's own formulas on a bit-identical GELU output,
so they are the baseline's bit for bit, dropout included. torch.compile does not trace saved-tensor hooks; a
compiled block instead runs under torch's selective checkpointing with the same choice (GELU recomputed, every other
op saved), which costs nothing at run time once traced.

Dropout masks are reproduced exactly: checkpoint restores the RNG state before recomputing.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from bertbench.model import modeling

POLICIES = ("full", "every-k", "selective")

# Feed-forward activations whose backward keeps their input, from which their output is recomputed; the aten op
# each dispatches to, for the compiled path's policy. (ReLU and tanh keep their output: nothing to trade.)
_RECOMPUTED_ACTIVATIONS = {nn.GELU: torch.ops.aten.gelu.default, nn.SiLU: torch.ops.aten.silu.default}
_RECOMPUTED_OPS = frozenset(_RECOMPUTED_ACTIVATIONS.values())

# Who is told of each tensor the selective policy keeps for backward while its own saved-tensor hook is active, which
# hides them from any outer hook. A counter of saved bytes (bertbench.model.saved_activations) listens here; the model
# itself keeps no tally.
_kept_listener: contextvars.ContextVar[Callable[[torch.Tensor], None] | None] = contextvars.ContextVar(
    "recompute_kept_listener", default=None
)


@contextlib.contextmanager
def listen_to_kept_tensors(listener: Callable[[torch.Tensor], None]) -> Iterator[None]:
    """While active, `listener(tensor)` is called for each tensor the selective policy keeps for backward under its
    own saved-tensor hook (which outer saved_tensors_hooks do not see)."""
    token = _kept_listener.set(listener)
    try:
        yield
    finally:
        _kept_listener.reset(token)


class _ActivationRecompute:
    """The selective policy on one block: the output dense layer's saved input (the activation's output) is replaced
    by a recipe, the activation's input, and recomputed in backward."""

    def __init__(self, layer: modeling.BertLayer):
        self.activation = layer.intermediate.activation
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None  # (output, input) of the activation's last call
        self.activation_forward = self.activation.forward
        self.dense_forward = layer.output.dense.forward
        self.activation.forward, layer.output.dense.forward = self.remember, self.dense

    def remember(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.activation_forward(hidden)
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():
            self.pending = (out, hidden)
        return out

    def dense(self, hidden: torch.Tensor) -> torch.Tensor:
        pending, self.pending = self.pending, None  # drop the reference: the activation's output must be freeable
        if pending is None or pending[0] is not hidden:
            return self.dense_forward(hidden)
        activation_input, storage = pending[1], hidden.untyped_storage()._cdata
        listener = _kept_listener.get()

        def pack(tensor):
            if tensor.untyped_storage()._cdata == storage:
                return activation_input, tensor.dtype, tensor.shape, tensor.stride(), tensor.storage_offset()
            if listener is not None:
                listener(tensor)
            return tensor

        with saved_tensors_hooks(pack, self.unpack):
            return self.dense_forward(hidden)

    def unpack(self, packed):
        if isinstance(packed, torch.Tensor):
            return packed
        activation_input, dtype, size, stride, offset = packed
        with torch.no_grad():
            out = self.activation_forward(activation_input)
        assert out.dtype == dtype, (out.dtype, dtype)
        return out.as_strided(size, stride, offset)


def _recompute_activation(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_RECOMPUTE if op in _RECOMPUTED_OPS else CheckpointPolicy.PREFER_SAVE


def _compiled_selective_context():
    return create_selective_checkpoint_contexts(_recompute_activation)


def _selective(layer: modeling.BertLayer) -> None:
    if type(layer.intermediate.activation) not in _RECOMPUTED_ACTIVATIONS:
        return  # its backward keeps the output itself: nothing to recompute
    _ActivationRecompute(layer)
    forward = layer.forward

    @functools.wraps(forward)
    def selective_forward(*args, **kwargs):
        if torch.compiler.is_compiling() and torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, context_fn=_compiled_selective_context, **kwargs)
        return forward(*args, **kwargs)

    layer.forward = selective_forward


def _checkpoint_forward(module: nn.Module) -> None:
    # Overriding the instance's forward (rather than wrapping the module) keeps the state-dict names unchanged.
    forward = module.forward

    @functools.wraps(forward)
    def checkpointed_forward(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation saves nothing, so there is nothing to trade
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = checkpointed_forward


def checkpointed_layers(policy: str, num_layers: int, every_k: int = 2) -> list[int]:
    """Indices of the blocks a policy checkpoints (selective: the blocks whose activation it recomputes)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown recompute policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if policy == "every-k":
        if every_k < 1:
            raise ValueError(f"every-k needs k >= 1, got {every_k}")
        return list(range(0, num_layers, every_k))
    return list(range(num_layers))


def apply_recompute(model: nn.Module, policy: str = "full", every_k: int = 2) -> nn.Module:
    """Apply a recompute policy to the transformer blocks of a built baseline model in place; returns the model."""
    layers = [module for module in model.modules() if isinstance(module, modeling.BertLayer)]
    if not layers:
        raise ValueError(f"{type(model).__name__} has no BertLayer blocks to checkpoint")
    if getattr(model, "recompute_policy", None):
        raise ValueError(f"recompute already applied to this model ({model.recompute_policy})")
    for index in checkpointed_layers(policy, len(layers), every_k):
        (_selective if policy == "selective" else _checkpoint_forward)(layers[index])
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


# The same public classes as bertbench.model.modeling, so either module can be imported as `modeling`.
BertModel = _recompute_variant(modeling.BertModel)
BertForPreTraining = _recompute_variant(modeling.BertForPreTraining)
BertForSequenceClassification = _recompute_variant(modeling.BertForSequenceClassification)
BertForQuestionAnswering = _recompute_variant(modeling.BertForQuestionAnswering)
