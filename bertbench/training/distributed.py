"""torch.distributed from the launcher's environment: one process per device, as `torchrun` starts them.

`torchrun` (`bertbench launch`, or `srun`/`mpirun` with the same variables) sets RANK, WORLD_SIZE and LOCAL_RANK;
without them this is a single process and nothing is initialised. Backends: NCCL on GPUs, gloo on CPUs. Only rank 0
logs and writes. The collectives here are the few the training loop needs besides DDP's gradient all-reduce.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bertbench.common.cpus import format_cpus, this_process_cpus
from bertbench.common.errors import UsageError


@dataclass(frozen=True)
class Placement:
    """Where a process of the job runs: its host, the CPUs it may run on (its affinity: what `bertbench launch
    --cpu-processes`, taskset or the batch system gave it) and torch's threads."""

    rank: int
    host: str
    cpus: str
    threads: int

    @classmethod
    def here(cls, rank: int) -> Placement:
        return cls(rank, socket.gethostname(), format_cpus(this_process_cpus()), torch.get_num_threads())


def describe_placement(placement: Sequence[Placement]) -> str:
    """One line: each process's host, CPUs and threads."""
    return f"{len(placement)} processes: " + "; ".join(
        f"rank {place.rank} on {place.host}: CPU{'s' if ',' in place.cpus or '-' in place.cpus else ''} {place.cpus}, "
        f"{place.threads} thread{'s' if place.threads > 1 else ''}"
        for place in placement
    )


@dataclass(frozen=True)
class Distributed:
    """Where this process sits in the job, the device it computes on, and where every process runs (`placement`,
    in rank order; filled in by init_from_environment)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    placement: tuple[Placement, ...] = ()

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def nodes(self) -> int:
        """Nodes of the job: torchrun's LOCAL_WORLD_SIZE processes run on each (one node without torchrun)."""
        return self.world_size // int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_gather_object(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order (just [value] in a single process)."""
        if not self.enabled:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def mean(self, value: float) -> float:
        """The mean of `value` over all ranks (a loss each rank measured on its own share of the batch)."""
        if not self.enabled:
            return value
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(total)
        return total.item() / self.world_size

    def broadcast_module(self, module: torch.nn.Module, source: int) -> None:
        """Copy rank `source`'s parameters and buffers into every rank's `module`."""
        if not self.enabled:
            return
        with torch.no_grad():
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=source)

    def shard(self, count: int) -> range:
        """This rank's contiguous share of `count` items: every item on exactly one rank, in rank order."""
        per_rank = -(-count // self.world_size)
        return range(min(count, self.rank * per_rank), min(count, (self.rank + 1) * per_rank))

    def any(self, *flags: bool) -> tuple[bool, ...]:
        """Each flag OR-ed over all ranks: ranks must agree on when to stop or save, though each sees its own
        signals and clock."""
        if not self.enabled or not flags:
            return tuple(flags)
        values = torch.tensor([float(flag) for flag in flags], device=self.device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return tuple(bool(value) for value in values.tolist())


def parse_device(name: str | None, local_rank: int | None = None) -> torch.device:
    """--device (`name`; None: CUDA when available, else the CPU) as the device this process computes on, with its
    index: "cuda" is the current GPU; under torchrun (`local_rank` given) a GPU is LOCAL_RANK's, one per process. A
    name that is no device, CUDA where there is none, a GPU the machine lacks, or an index under torchrun (which
    picks the GPUs) is a UsageError naming --device. Nothing is set: see resolve_device."""
    try:
        device = torch.device(name) if name else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {name!r} is not a device: use cpu, cuda or cuda:N")
    if device.type == "cpu":
        return device
    if not torch.cuda.is_available():
        raise UsageError(f"--device {name!r} requested but CUDA is not available")
    count = torch.cuda.device_count()
    if local_rank is None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index >= count:
            raise UsageError(f"--device {name!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
        return torch.device("cuda", index)
    if device.index is not None:
        raise UsageError(
            f"--device {name!r}: under torchrun each process takes the GPU of its LOCAL_RANK; use --device cuda"
        )
    if local_rank >= count:
        raise UsageError(
            f"--device {name or 'cuda'!r}: {local_rank + 1} processes on a node need a GPU each, and "
            f"this machine has {count}: start at most {count} per node (or use --device cpu)"
        )
    return torch.device("cuda", local_rank)


def resolve_device(name: str | None, local_rank: int | None = None) -> torch.device:
    """parse_device's device, made the current CUDA device when it is a GPU: autocast, streams, CUDA graphs, events,
    memory statistics and NCCL use the current device, which would otherwise stay cuda:0 under work on cuda:N."""
    device = parse_device(name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def check_processes(name: str | None, processes: int) -> None:
    """Refuse, before a torchrun job of `processes` processes per node is started, a --device that its processes
    would refuse (parse_device): more processes than GPUs, an indexed GPU for several processes."""
    parse_device(name, processes - 1 if processes > 1 else None)


def init_from_environment(device: str | None = None) -> Distributed:
    """Join the process group the launcher describes (if any), pick this process's device, and gather where every
    process runs."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return Distributed(device=resolve_device(device), placement=(Placement.here(0),))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    chosen = resolve_device(device, local_rank)
    if not dist.is_initialized():
        backend = "nccl" if chosen.type == "cuda" else "gloo"
        dist.init_process_group(
            backend=backend, device_id=chosen if chosen.type == "cuda" else None, **restart_safe_store(rank, world_size)
        )
    job = Distributed(rank=rank, world_size=world_size, local_rank=local_rank, device=chosen)
    return dataclasses.replace(job, placement=tuple(job.all_gather_object(Placement.here(rank))))


def restart_safe_store(rank: int, world_size: int) -> dict[str, Any]:
    """init_process_group's store arguments when torchrun restarted the workers, {} otherwise.

    torchrun (>= 2.4) keeps one key-value store for the whole job and lets the workers of every restart use it; the
    workers of a restart then find their predecessors' connection keys and try the dead processes' addresses, so
    the new process group hangs or fails ("Gloo connectFullMesh failed ... Connection refused"; pytorch#167288; 8 of
    12 restarts failed here). The keys of each restart go under a prefix of their own.
    """
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True) or restart == "0":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False)
    return {"store": dist.PrefixStore(f"bertbench/restart-{restart}", store), "rank": rank, "world_size": world_size}


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def job_from_environment(device: str | None = None) -> Iterator[Distributed]:
    """init_from_environment for the block, and the process group torn down after it. A block of several processes
    that ends normally (return included) first frees what still holds the process group and waits for every rank; a
    DDP wrapper left in a reference cycle would otherwise be destroyed at exit, after the group, and a rank that
    leaves while another still finishes the last collective can abort both (gloo: "terminate called without an
    active exception"). One that raises does not wait, for the other ranks may never arrive. A single process has no
    group to outlive, and skips the full collection (a second in a process holding much, such as a test's)."""
    job = init_from_environment(device)
    try:
        yield job
        if job.enabled:
            gc.collect()
            job.barrier()
    finally:
        shutdown()
