"""Evaluation and prediction over in-memory features (Estimator.evaluate / predict): the model in eval mode, no
gradients, batches in example order. Under torchrun each rank runs a contiguous shard and the outputs are gathered,
so every example counts exactly once; after independent workers trained apart, each rank runs every example through
its own model instead.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from bertbench.model import modeling
from bertbench.model.precision import precision_dtype
from bertbench.training.distributed import Distributed
from bertbench.training.step import autocast, to_device

# What predict/evaluate collect: output field names, or a function (model output, batch) -> {name: tensor}.
Outputs = Sequence[str] | Callable[[Any, Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]


def run_inference(
    model: nn.Module,
    features: Mapping[str, torch.Tensor],
    batch_size: int,
    outputs: Outputs,
    *,
    with_loss: bool,
    dist: Distributed,
    device: torch.device,
    precision: str,
    sharded: bool,
) -> tuple[dict[str, torch.Tensor], float | None]:
    """The `outputs` of every example as float32 CPU tensors, in order, and with `with_loss` the mean loss (None
    without). `sharded`: each rank runs a contiguous shard and the shards are gathered, on every rank."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    count = len(next(iter(features.values())))
    shard = dist.shard(count) if sharded else range(count)
    extract = outputs if callable(outputs) else _output_fields(outputs)
    collected: dict[str, list[torch.Tensor]] = defaultdict(list)
    loss_sum = 0.0
    packer = modeling.packer_for(model, device, precision_dtype(precision))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(shard.start, shard.stop, batch_size):
                stop = min(start + batch_size, shard.stop)
                batch = {name: tensor[start:stop] for name, tensor in features.items()}
                if packer is not None and "attention_mask" in batch:
                    batch["packing"] = packer(batch["attention_mask"])  # on the host, from the CPU mask
                batch = to_device(batch, device)
                with autocast(precision, device):
                    output = model(**batch)
                for name, value in extract(output, batch).items():
                    collected[name].append(value.cpu())
                if with_loss:
                    loss_sum += output.loss.float().item() * (stop - start)
    finally:
        model.train(was_training)
    if sharded:  # rank order is example order: concatenating the shards restores it
        shards = dist.all_gather_object((dict(collected), loss_sum))
        names = [name for part, _ in shards for name in part]
        collected = {
            name: [chunk for part, _ in shards for chunk in part.get(name, [])] for name in dict.fromkeys(names)
        }
        loss_sum = sum(part_loss for _, part_loss in shards)
    return ({name: torch.cat(chunks) for name, chunks in collected.items()}, loss_sum / count if with_loss else None)


def _output_fields(names: Sequence[str]) -> Callable[[Any, Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]:
    def extract(output, batch):
        return {name: getattr(output, name).float() for name in names}

    return extract
