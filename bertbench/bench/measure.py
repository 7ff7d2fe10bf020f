"""Timing and counting primitives: what a benchmark needs to turn a training step into seq/s, FLOP/s and bytes."""

from __future__ import annotations

import ctypes
import resource
import time
from typing import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

from bertbench.memory import saved_activation_bytes


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def matmul_flops_per_second(size: int = 4096, dtype: torch.dtype = torch.float32, device: str = "cpu",
                            repeats: int = 5) -> float:
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


def make_train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    batch: dict) -> Callable[[], torch.Tensor]:
    """One forward, backward and optimizer step on a fixed batch."""

    def step() -> torch.Tensor:
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def time_steps(steps: dict[str, Callable], warmup: int, repeats: int, device: str = "cpu") -> dict[str, list[float]]:
    """Seconds per call of each step, after `warmup` untimed calls. The steps are interleaved and the order flips
    every round (A B, B A, A B ...), so that drift of the machine and the cost of following another model's memory
    churn hit every contender alike."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_index in range(repeats):
        order = list(steps.items()) if round_index % 2 == 0 else list(reversed(steps.items()))
        for name, step in order:
            times[name].append(time_call(step, device))
    return times


def time_call(call: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Seconds of one call: CUDA events around it on a GPU (the GPU's own clock, after the queue drains), the wall
    clock between synchronisations on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1e3
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def reset_peak_memory(device: torch.device | str) -> None:
    """Start a new peak: the CUDA allocator's on a GPU; the process's resident-set high-water mark on Linux (by
    writing 5 to /proc/self/clear_refs), so that each setting of a sweep gets its own peak."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    release_free_heap()
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
    except OSError:
        pass  # not Linux, or not allowed: peak_memory_bytes then reports the process's lifetime peak


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim), so that the resident set counts what
    is in use, not what an earlier, larger step freed and the allocator kept."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the resident set may include freed memory


def current_memory_bytes(device: torch.device | str) -> int:
    """Bytes held now: CUDA memory allocated by tensors on a GPU, resident set size of the process on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def peak_memory_bytes(device: torch.device | str) -> int | None:
    """Peak bytes since reset_peak_memory: CUDA memory allocated by tensors on a GPU, resident set size of the
    process on the CPU (VmHWM on Linux; ru_maxrss elsewhere)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    peak = proc_kilobytes("/proc/self/status", "VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def proc_kilobytes(path: str, field: str) -> int | None:
    """Bytes of a "<field>: <n> kB" line of a Linux /proc file; None where there is no such file or line."""
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def count_flops(run: Callable[[], None]) -> int:
    """FLOPs of the matmul-like ops (mm, bmm, attention) that `run` executes, counted by PyTorch."""
    with FlopCounterMode(display=False) as counter:
        run()
    return counter.get_total_flops()


def forward_backward_saved_bytes(model: torch.nn.Module, batch: dict) -> int:
    """Bytes the forward keeps for backward (see bertbench.memory); runs the backward too, to free them."""
    loss, saved = saved_activation_bytes(lambda: model(**batch).loss, model)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return saved
