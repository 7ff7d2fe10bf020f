"""The device's clock, memory and peak speed: synchronisation, peak/current memory readers for CUDA and the CPU
process, and the data-sheet peak FLOP/s of the GPUs BERT is trained on (what MFU divides by).

Core code (the training loop's logs, create_pretraining_data's statistics) and the benches read these, so a figure
means the same wherever it is printed. torch is imported only on a CUDA device's paths: the CPU's
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


# Dense (no 2:4 sparsity) peak TFLOP/s of the data-center GPUs BERT is trained on, from the vendors' data sheets.
# fp32 is the plain CUDA-core figure: PyTorch does not use TF32 for fp32 matmuls unless told to.
# Longest name first: "H100 PCIe" before "H100", "A100" before "A10", "L40S" before "L4".
GPU_PEAK_TFLOPS = {
    "H100 PCIe": {"fp32": 51.2, "bf16": 756.0, "fp16": 756.0},
    "H100": {"fp32": 66.9, "bf16": 989.4, "fp16": 989.4},  # SXM and NVL
    "H200": {"fp32": 66.9, "bf16": 989.4, "fp16": 989.4},
    "GH200": {"fp32": 66.9, "bf16": 989.4, "fp16": 989.4},
    "B200": {"fp32": 80.0, "bf16": 2250.0, "fp16": 2250.0},
    "A100": {"fp32": 19.5, "bf16": 312.0, "fp16": 312.0},
    "L40S": {"fp32": 91.6, "bf16": 362.1, "fp16": 362.1},
    "A10": {"fp32": 31.2, "bf16": 125.0, "fp16": 125.0},
    "L4": {"fp32": 30.3, "bf16": 121.0, "fp16": 121.0},
    "V100": {"fp32": 15.7, "bf16": None, "fp16": 125.0},
}


def gpu_peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of a GPU by the name torch reports ("NVIDIA H100 80GB HBM3"), None when not in the table."""
    for key in sorted(GPU_PEAK_TFLOPS, key=len, reverse=True):
        if key in device_name:
            peak = GPU_PEAK_TFLOPS[key][precision]
            return None if peak is None else peak * 1e12
    return None


def data_sheet_peak_flops(device: torch.device | str, precision: str) -> tuple[float, str] | None:
    """(peak FLOP/s, where it comes from) of a CUDA device in the table; None for a CPU or another GPU, whose peak a
    run cannot know without measuring it."""
    if not is_cuda(device):
        return None
    import torch

    name = torch.cuda.get_device_name(device)
    peak = gpu_peak_flops(name, precision)
    return None if peak is None else (peak, f"{name} data sheet, {precision} dense")


def peak_flops(device: torch.device | str, precision: str, measured_matmul: float | None = None) -> tuple[float, str]:
    """(peak FLOP/s, where it comes from): a GPU's data-sheet figure, else the measured matmul FLOP/s."""
    known = data_sheet_peak_flops(device, precision)
    if known is not None:
        return known
    if measured_matmul is None:
        raise ValueError("no data-sheet peak for this device: pass the measured matmul FLOP/s")
    return measured_matmul, f"measured {precision} matmul on {str(device).split(':')[0]}"


# The CPU units that compute bf16 matmuls natively (oneDNN's bf16 kernels): without one, bf16 matmuls are emulated
# with fp32 instructions and conversions. On this project's AMD EPYC (AVX2) a BERT-mini fine-tuning step ran 12x
# slower in bf16 than in fp32 (docs/performance.md).
CPU_BF16_UNITS = ("amx_bf16", "avx512_bf16")


def cpu_features() -> tuple[str, set[str]]:
    """(the CPU's name, its feature flags): torch's own reading where it offers one, else Linux's /proc/cpuinfo."""
    import torch

    reader = getattr(getattr(torch._C, "_cpu", None), "_get_cpu_capability", None)
    if reader is not None:
        capability = reader()
        return str(capability.get("cpu_name", "this CPU")), {
            name for name, value in capability.items() if value is True
        }
    name, flags = "this CPU", set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return name, flags


def cpu_bf16_unavailable() -> str | None:
    """Why this CPU computes bf16 matmuls emulated, many times slower than fp32; None where it has a bf16 unit (or
    its features cannot be read: nothing is claimed then)."""
    name, flags = cpu_features()
    if not flags or flags & set(CPU_BF16_UNITS):
        return None
    vector = next((isa for isa in ("avx512_f", "avx512f", "avx2", "avx") if isa in flags), None)
    has = f" ({name}: {vector.replace('_', '').upper()})" if vector else f" ({name})"
    return f"this CPU{has} has no bf16 matmul unit (AMX or AVX-512 BF16), so bf16 matmuls run emulated"
