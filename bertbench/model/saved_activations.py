"""How many bytes a forward pass keeps alive for its backward: the figure recompute policies trade time for."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from bertbench.model.recompute import listen_to_kept_tensors

T = TypeVar("T")


def saved_activation_bytes(forward: Callable[[], T], model: nn.Module) -> tuple[T, int]:
    """Run `forward` and return its result and the bytes autograd saved for backward, excluding the model's own
    parameters. Each storage counts once however many views of it were saved; the tensors that the selective
    recompute policy keeps under its own saved-tensor hook, which hides them from this one, are counted too."""
    # Storages are told apart by their C++ object (_cdata), not their data pointer: tensors on the meta device,
    # which count bytes without allocating them, all have data pointer 0.
    parameter_storages = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in parameter_storages:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    with saved_tensors_hooks(pack, lambda tensor: tensor), listen_to_kept_tensors(pack):
        result = forward()
    return result, sum(saved.values())
