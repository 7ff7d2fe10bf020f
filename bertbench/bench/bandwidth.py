"""The memory bandwidth a device reaches, measured as STREAM (McCalpin's, the HPC standard) measures it: three arrays
far larger than the caches, the four kernels over them (copy c = a, scale b = s*c, add c = a + b, triad a = b + s*c),
run on every core the process uses (torch's threads, which the bench sets), the bytes STREAM counts (copy and scale
read one array and write one, add and triad read two and write one; the hardware's write-allocate reads are not
counted) over the time, best of the repeats per kernel. A memory-bound step's floor is the least time its bytes can
take, so it is drawn from the fastest kernel's best rate.

The kernels are torch ops writing into the arrays with out=, so a timed call allocates nothing; the caller times them
interleaved with what the floor is put under (measure.time_steps), so that both see the same machine.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Mapping, Sequence

import torch

from bertbench.bench.results import Spread

# STREAM's rule: each array at least 4 times the size of all the last-level caches together, so that no kernel runs
# from a cache; never less than this, where the caches cannot be read.
CACHE_MULTIPLE = 4
MIN_ARRAY_BYTES = 64 * 2**20
SCALAR = 3.0  # STREAM's s
# Arrays each kernel reads plus those it writes, as STREAM counts them.
ARRAYS_MOVED = {"copy": 2, "scale": 2, "add": 3, "triad": 3}


def last_level_cache_bytes(device: torch.device) -> int | None:
    """All the device's last-level caches together: a GPU's L2; on Linux the CPUs' highest cache level, each cache
    counted once however many cores share it. None where it cannot be read."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).L2_cache_size or None
    caches: dict[tuple[int, str], int] = {}
    for index in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cache/index[0-9]*"):
        try:
            if _read(index, "type") == "Instruction":
                continue
            level, size = int(_read(index, "level")), _size_bytes(_read(index, "size"))
            caches[(level, _read(index, "shared_cpu_list"))] = size
        except (OSError, ValueError):
            return None
    if not caches:
        return None
    top = max(level for level, _ in caches)
    return sum(size for (level, _), size in caches.items() if level == top)


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as file:
        return file.read().strip()


def _size_bytes(text: str) -> int:
    """sysfs's cache size, "32768K"."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


def array_bytes(device: torch.device) -> int:
    """The size of each of STREAM's arrays on `device` (see CACHE_MULTIPLE)."""
    return max(MIN_ARRAY_BYTES, CACHE_MULTIPLE * (last_level_cache_bytes(device) or 0))


class Stream:
    """STREAM's three fp32 arrays of `size_bytes` each on a device, and its kernels over them."""

    def __init__(self, device: torch.device, size_bytes: int):
        elements = size_bytes // 4
        # STREAM's starting values: every array touched, so that no page is first mapped in a timed kernel
        self.a = torch.full((elements,), 1.0, device=device)
        self.b = torch.full((elements,), 2.0, device=device)
        self.c = torch.zeros(elements, device=device)

    @property
    def size_bytes(self) -> int:
        return self.a.numel() * self.a.element_size()

    def kernels(self) -> dict[str, Callable[[], object]]:
        """Each kernel as a call, by name."""
        a, b, c = self.a, self.b, self.c
        return {
            "copy": lambda: c.copy_(a),
            "scale": lambda: torch.mul(c, SCALAR, out=b),
            "add": lambda: torch.add(a, b, out=c),
            "triad": lambda: torch.add(b, c, alpha=SCALAR, out=a),
        }

    def bytes_moved(self, kernel: str) -> int:
        """The bytes STREAM counts for one call of `kernel`."""
        return ARRAYS_MOVED[kernel] * self.size_bytes

    def rates(self, seconds: Mapping[str, Sequence[float]]) -> dict[str, Spread]:
        """Bytes per second of each kernel over its timed calls' `seconds`: the spread's max is the best rate."""
        return {kernel: Spread.of_rate(self.bytes_moved(kernel), times) for kernel, times in seconds.items()}


def fastest(rates: Mapping[str, Spread]) -> str:
    """The kernel with the best rate: the device's bandwidth is its max."""
    return max(rates, key=lambda kernel: rates[kernel].max)
