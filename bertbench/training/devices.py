"""The device's clock and memory: synchronisation, and peak/current memory readers for CUDA and the CPU process.

Core code (the training loop's logs, create_pretraining_data's statistics) and the benches read memory through these,
so a figure means the same wherever it is printed. torch is imported only on a CUDA device's paths: the CPU's
readers serve create_pretraining_data's workers, which have no other use for it.
"""

from __future__ import annotations

import ctypes
import resource
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def is_cuda(device: torch.device | str) -> bool:
    """Whether `device` (a torch.device or its name) is a CUDA device, without importing torch."""
    return str(device).startswith("cuda")


def synchronize(device: torch.device | str) -> None:
    if is_cuda(device):
        import torch

        torch.cuda.synchronize(device)


def reset_peak_memory(device: torch.device | str) -> None:
    """Start a new peak: the CUDA allocator's on a GPU; the process's resident-set high-water mark on Linux (by
    writing 5 to /proc/self/clear_refs), so that each setting of a sweep gets its own peak."""
    if is_cuda(device):
        import torch

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
    if is_cuda(device):
        import torch

        return torch.cuda.memory_allocated(device)
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def peak_memory_bytes(device: torch.device | str) -> int | None:
    """Peak bytes since reset_peak_memory: CUDA memory allocated by tensors on a GPU, resident set size of the
    process on the CPU (VmHWM on Linux; ru_maxrss elsewhere)."""
    if is_cuda(device):
        import torch

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


def physical_memory_bytes() -> int | None:
    """The machine's memory (MemTotal), None where /proc/meminfo is not there."""
    return proc_kilobytes("/proc/meminfo", "MemTotal")
