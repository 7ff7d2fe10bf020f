"""torch.distributed from the launcher's environment: one process per device, as `torchrun` starts them.

`torchrun` (`bertbench launch`, or `srun`/`mpirun` with the same variables) sets RANK, WORLD_SIZE and LOCAL_RANK;
without them this is a single process and nothing is initialised. Backends: NCCL on GPUs, gloo on CPUs. Only rank 0
logs and writes. The collectives here are the few the training loop needs besides DDP's gradient all-reduce.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from bertbench.errors import UsageError


@dataclass(frozen=True)
class Distributed:
    """Where this process sits in the job, and the device it computes on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

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


def resolve_device(name: str | None) -> torch.device:
    """`name` as a device, or CUDA when it is available, else the CPU. A name that is no device, or CUDA where there
    is none, is a UsageError."""
    if name:
        try:
            device = torch.device(name)
        except RuntimeError as error:
            raise UsageError(f"device {name!r} is not a device ({error})") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UsageError(f"device {name!r} requested but CUDA is not available")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def init_from_environment(device: str | None = None) -> Distributed:
    """Join the process group the launcher describes (if any) and pick this process's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    chosen = resolve_device(device)
    if world_size <= 1:
        return Distributed(device=chosen)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if chosen.type == "cuda":
        chosen = torch.device("cuda", local_rank)
        torch.cuda.set_device(chosen)
    if not dist.is_initialized():
        backend = "nccl" if chosen.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=chosen if chosen.type == "cuda" else None,
                                **restart_safe_store(rank, world_size))
    return Distributed(rank=rank, world_size=world_size, local_rank=local_rank, device=chosen)


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
    """init_from_environment for the block, and the process group torn down after it. A block that ends normally
    (return included) first frees what still holds the process group and waits for every rank; a DDP wrapper left
    in a reference cycle would otherwise be destroyed at exit, after the group, and a rank that leaves while another
    still finishes the last collective can abort both (gloo: "terminate called without an active exception"). One
    that raises does not wait, for the other ranks may never arrive."""
    job = init_from_environment(device)
    try:
        yield job
        gc.collect()
        job.barrier()
    finally:
        shutdown()
