"""How many bytes a forward pass keeps alive for its backward: the figure recompute policies trade time for."""

from __future__ import annotations

from typing import Callable, TypeVar

from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from bertbench.recompute import listen_to_cached_outputs

T = TypeVar("T")


def saved_activation_bytes(forward: Callable[[], T], model: nn.Module) -> tuple[T, int]:
    """Run `forward` and return its result and the bytes autograd saved for backward, excluding the model's own
    parameters. Each storage counts once however many views of it were saved; the outputs that the selective
    recompute policy caches (outside autograd's hooks) are added."""
    # Storages are told apart by their C++ object (_cdata), not their data pointer: tensors on the meta device,
    # which count bytes without allocating them, all have data pointer 0.
    parameter_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in parameter_storages:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    cached: list[int] = []
    with saved_tensors_hooks(pack, lambda tensor: tensor), listen_to_cached_outputs(cached.append):
        result = forward()
    return result, sum(saved.values()) + sum(cached)
