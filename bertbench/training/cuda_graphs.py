"""CUDA graphs of the training step's forward and backward: each micro-batch's hundreds of kernel launches replayed
by one, so that the host no longer sets the pace of a GPU step (NVIDIA's MLPerf BERT graphs its step the same way).

A graph is captured once per batch signature (tensor shapes and the packing's sizes: unpadded batches are bucketed
to a few row counts, bertbench.model.packing) and replayed for every batch of that signature: the batch is copied into
the graph's static inputs, the graph runs the forward, the loss scaling and the backward, and the gradients
accumulate into the parameters' own .grad tensors, which stay the same tensors for the whole run (the step zeroes
them rather than dropping them). Dropout draws from the default generator at replay, as an eager step would: the
warm-up and capture run under a forked RNG state, so a run with graphs draws the same masks wherever it resumes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from bertbench.model.packing import Packing

# Graphs kept per step: beyond it a batch of a new signature runs eagerly (counted). Bucketed batches of one size
# visit a handful of signatures; this bounds the memory of the graphs' shared pool and the capture time.
MAX_GRAPHS = 32
WARMUP_CALLS = 2  # eager calls on a side stream before a capture (cuBLAS workspaces, torch.compile's first call)


def batch_signature(batch: Mapping[str, Any]) -> tuple:
    """What a graph is specific to: every tensor's shape and dtype, and the packing's sizes and path."""
    signature = []
    for name in sorted(batch):
        value = batch[name]
        if isinstance(value, Packing) and value.kernel is None:  # the padded path: its mask, or none
            signature.append((name, None, value.padding_share == 0))
        elif isinstance(value, Packing):
            signature.append(
                (
                    name,
                    value.kernel,
                    value.rows,
                    value.max_seqlen,
                    len(value.cu_seqlens),
                    value.width if value.kernel == "masked" else None,
                )
            )
        elif isinstance(value, torch.Tensor):
            signature.append((name, tuple(value.shape), value.dtype))
    return tuple(signature)


def _static_copy(batch: Mapping[str, Any]) -> dict[str, Any]:
    static = {}
    for name, value in batch.items():
        if isinstance(value, Packing):
            static[name] = dataclasses.replace(
                value, **{key: tensor.clone() for key, tensor in value.tensors().items()}
            )
        else:
            static[name] = value.clone() if isinstance(value, torch.Tensor) else value
    return static


def _load(static: Mapping[str, Any], batch: Mapping[str, Any]) -> None:
    for name, value in batch.items():
        if isinstance(value, Packing):
            for key, tensor in value.tensors().items():
                getattr(static[name], key).copy_(tensor, non_blocking=True)
        elif isinstance(value, torch.Tensor):
            static[name].copy_(value, non_blocking=True)


Recorder = Callable[
    [Callable[[Mapping[str, Any]], torch.Tensor], Mapping[str, Any], Any], tuple[Callable[[], None], torch.Tensor]
]


def record_cuda_graph(
    run: Callable[[Mapping[str, Any]], torch.Tensor], inputs: Mapping[str, Any], pool: Any
) -> tuple[Callable[[], None], torch.Tensor]:
    """Capture `run(inputs)` as a CUDA graph in `pool`, after WARMUP_CALLS eager calls on the side stream the capture
    then runs on (autograd's gradient accumulators remember the stream they were made on: the capture's own); returns
    the graph's replay and the loss tensor each replay writes. Python's garbage collector is held off meanwhile: an
    unreachable CUDA graph or pinned buffer it freed would free memory mid-capture, which a capture forbids."""
    stream = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            run(inputs)
    graph = torch.cuda.CUDAGraph()
    collecting = gc.isenabled()
    gc.disable()
    try:
        with torch.cuda.graph(graph, pool=pool, stream=side):
            loss = run(inputs)
    finally:
        if collecting:
            gc.enable()
    stream.wait_stream(side)
    return graph.replay, loss


@dataclasses.dataclass
class _Captured:
    replay: Callable[[], None]
    inputs: dict[str, Any]
    loss: torch.Tensor


class GraphedMicroBatches:
    """`run(batch)` -- one micro-batch's forward and backward, returning its loss -- replayed from CUDA graphs, one per
    batch signature, for `model`'s parameters' gradients. Call it with batches already on the device. (`run` comes
    with each call, not kept: a step holding these graphs and these holding its method would be a cycle, freed only
    by the garbage collector, at a moment of its choosing.)"""

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        max_graphs: int = MAX_GRAPHS,
        recorder: Recorder = record_cuda_graph,
    ):
        self.device, self.max_graphs, self.recorder = device, max_graphs, recorder
        self.parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        self.grads: list[torch.Tensor | None] | None = None  # the tensors the graphs accumulate into
        # One memory pool for every graph: one runs at a time.
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[tuple, _Captured] = {}
        self.counts: Counter[str] = Counter()  # replays, eager calls, real and filler rows

    def __call__(self, batch: Mapping[str, Any], run: Callable[[Mapping[str, Any]], torch.Tensor]) -> torch.Tensor:
        packing = next((value for value in batch.values() if isinstance(value, Packing)), None)
        if packing is not None and packing.kernel is not None:
            self.counts["rows"] += packing.rows
            self.counts["filler_rows"] += packing.rows - packing.tokens
        self._keep_grads()
        key = batch_signature(batch)
        captured = self.graphs.get(key)
        if captured is None and len(self.graphs) >= self.max_graphs:
            self.counts["eager_calls"] += 1
            return run(batch)
        if captured is None:
            captured = self.graphs[key] = self._capture(batch, run)
        _load(captured.inputs, batch)
        captured.replay()
        self.counts["replays"] += 1
        return captured.loss.clone()

    def _capture(self, batch: Mapping[str, Any], run: Callable[[Mapping[str, Any]], torch.Tensor]) -> _Captured:
        inputs = _static_copy(batch)
        saved = [None if parameter.grad is None else parameter.grad.clone() for parameter in self.parameters]
        # Neither the warm-up nor the capture may draw the run's random numbers: a resumed run captures at another
        # step, and must draw the masks the uninterrupted one drew.
        with (
            torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []),
            torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext(),
        ):
            replay, loss = self.recorder(run, inputs, self.pool)
        self.grads = [
            parameter.grad if kept is None else kept
            for parameter, kept in zip(self.parameters, self.grads or [None] * len(self.parameters))
        ]
        for parameter, grad in zip(self.parameters, saved):  # the warm-up's and capture's gradients undone
            if parameter.grad is None:
                continue
            if grad is None:
                parameter.grad.zero_()
            else:
                parameter.grad.copy_(grad)
        self.counts["captures"] += 1
        return _Captured(replay, inputs, loss)

    def _keep_grads(self) -> None:
        """The graphs add into the gradient tensors they were captured with: any the optimizer or a user set to None
        or replaced is put back (zeroed, or holding the replacement's values)."""
        if self.grads is None:
            return
        for parameter, grad in zip(self.parameters, self.grads):
            if grad is None or parameter.grad is grad:
                continue
            if parameter.grad is None:
                grad.zero_()
            else:
                grad.copy_(parameter.grad)
            parameter.grad = grad

    def summary(self) -> dict[str, Any]:
        """What the graphs did: captures, replays, eager calls (beyond MAX_GRAPHS), the bucketed row counts, and the
        share of the unpadded path's rows that were bucket filler."""
        rows = self.counts["rows"]
        return {
            "graphs": len(self.graphs),
            "captures": self.counts["captures"],
            "replays": self.counts["replays"],
            "eager_calls": self.counts["eager_calls"],
            "bucket_rows": sorted(
                {
                    value.rows
                    for captured in self.graphs.values()
                    for value in captured.inputs.values()
                    if isinstance(value, Packing) and value.kernel is not None
                }
            ),
            "bucket_filler_share": self.counts["filler_rows"] / rows if rows else 0.0,
        }
