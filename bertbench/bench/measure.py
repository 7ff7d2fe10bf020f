"""Timing and counting primitives: what a benchmark needs to turn a training step into seq/s, FLOP/s and bytes."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from bertbench.training.devices import synchronize


def matmul_flops_per_second(
    size: int = 4096, dtype: torch.dtype = torch.float32, device: str = "cpu", repeats: int = 5
) -> float:
    """Best-of-`repeats` FLOP/s of a square matmul: the peak that model FLOP/s are compared against."""
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    torch.mm(a, b)  # first call pays for thread-pool and kernel selection
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        started = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def time_steps(
    steps: dict[str, Callable],
    warmup: int,
    repeats: int,
    device: str = "cpu",
    host_seconds: dict[str, list[float]] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each step, after `warmup` untimed calls. The steps are interleaved and the order flips
    every round (A B, B A, A B ...), so that drift of the machine and the cost of following another model's memory
    churn hit every contender alike. On a GPU, `host_seconds` (when given) gets each call's host time too."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_index in range(repeats):
        order = list(steps.items()) if round_index % 2 == 0 else list(reversed(steps.items()))
        for name, step in order:
            host = None if host_seconds is None else host_seconds.setdefault(name, [])
            times[name].append(time_call(step, device, host))
    return times


def time_call(
    call: Callable[[], object], device: torch.device | str = "cpu", host_seconds: list[float] | None = None
) -> float:
    """Seconds of one call: CUDA events around it on a GPU (the GPU's own clock, after the queue drains), the wall
    clock between synchronisations on the CPU. On a GPU, `host_seconds` gets the time the host took to issue the
    call's work (from an empty queue): under the call's GPU time, the GPU and not the host set the pace."""
    device = torch.device(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        stream = torch.cuda.current_stream(device)  # `device`'s, whichever GPU is the current one
        torch.cuda.synchronize(device)
        start.record(stream)
        issued = time.perf_counter()
        call()
        issued = time.perf_counter() - issued
        end.record(stream)
        torch.cuda.synchronize(device)
        if host_seconds is not None:
            host_seconds.append(issued)
        return start.elapsed_time(end) / 1e3
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def count_flops(run: Callable[[], None]) -> int:
    """FLOPs of the matmul-like ops (mm, bmm, attention) that `run` executes, counted by PyTorch."""
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()
