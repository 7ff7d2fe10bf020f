"""A CPU node's sockets, NUMA nodes and cores, and their split into processes (`bertbench launch --cpu-processes`).

The topology is lscpu's parsable listing (`lscpu --parse=CPU,Core,Socket,Node`, what torch's own CPU launcher,
torch.backends.xeon.run_cpu, reads), narrowed to the CPUs this process may run on: its affinity, which Slurm's
--cpus-per-task, a cgroup's cpuset or taskset narrow. A physical core is a (socket, core) pair of that listing, its
CPUs the SMT siblings. A process of a split gets whole physical cores and runs on one CPU of each (the first it may
use), as Intel's recipes place it (run_cpu without --use-logical-core): one OpenMP thread per physical core, never two
on one core's siblings. Every process gets as many cores (DDP waits for the slowest), and lies within one NUMA node or
on whole nodes. Imports no torch: the workers pin themselves before torch starts its threads (runners/pin.py).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Iterable

from bertbench.common.errors import UsageError

FLAG = "--cpu-processes"
SPLITS = ("socket", "numa", "core")  # or a count of processes
# The launcher gives its workers their CPUs in this variable (runners/pin.py reads it): each local rank's CPUs,
# ';'-separated, in local rank order.
CPUS_VARIABLE = "BERTBENCH_CPUS"


def format_cpus(cpus: Iterable[int]) -> str:
    """CPUs as Linux lists them (cpulist, taskset -c): `0-27,56-83`."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


def parse_cpus(text: str) -> list[int]:
    """The CPUs of a Linux CPU list (`0-3,8`)."""
    cpus = []
    for item in filter(None, text.split(",")):
        low, _, high = item.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return cpus


def this_process_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@dataclasses.dataclass(frozen=True)
class Core:
    """A physical core: its socket, its NUMA node (None when lscpu names none), and its CPUs the launcher may run on."""

    socket: int
    node: int | None
    cpus: tuple[int, ...]

    @property
    def domain(self) -> tuple[str, int]:
        """Its memory domain: its NUMA node, or its socket where lscpu names no node."""
        return ("NUMA node", self.node) if self.node is not None else ("socket", self.socket)


@dataclasses.dataclass(frozen=True)
class Topology:
    """The physical cores the launcher may run on, ordered by socket, NUMA node and CPU."""

    cores: tuple[Core, ...]

    @property
    def sockets(self) -> list[int]:
        return sorted({core.socket for core in self.cores})

    @property
    def nodes(self) -> list[int]:
        return sorted({core.node for core in self.cores if core.node is not None})

    @property
    def cpus(self) -> list[int]:
        return sorted(cpu for core in self.cores for cpu in core.cpus)

    def describe(self) -> str:
        counts = [(len(self.sockets), "socket"), (len(self.nodes), "NUMA node"), (len(self.cores), "core")]
        counts.append((len(self.cpus), "CPU"))
        return ", ".join(f"{count} {name}{'' if count == 1 else 's'}" for count, name in counts)


def parse_lscpu(text: str, allowed: Iterable[int] | None = None) -> Topology:
    """The topology from `lscpu --parse=CPU,Core,Socket,Node`'s output, restricted to the `allowed` CPUs."""
    allowed_cpus = None if allowed is None else set(allowed)
    cores: dict[tuple[int, int], Core] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        cpu, core, socket, node = (line.split(",") + ["", "", "", ""])[:4]
        if allowed_cpus is not None and int(cpu) not in allowed_cpus:
            continue
        key = (int(socket or 0), int(core))
        known = cores.get(key)
        cpus = (int(cpu),) if known is None else (*known.cpus, int(cpu))
        cores[key] = Core(key[0], int(node) if node else None, tuple(sorted(cpus)))
    if not cores:
        raise UsageError(f"{FLAG}: lscpu lists none of the CPUs the launcher may run on ({format_cpus(allowed_cpus)})")
    ordered = sorted(cores.values(), key=lambda core: (core.socket, -1 if core.node is None else core.node, core.cpus))
    return Topology(tuple(ordered))


def read_topology() -> Topology:
    """This machine's topology, restricted to this process's affinity."""
    try:
        listing = subprocess.run(
            ["lscpu", "--parse=CPU,Core,Socket,Node"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise UsageError(
            f"{FLAG} reads the node's sockets and cores with lscpu (util-linux), which failed: {error}"
        ) from None
    return parse_lscpu(listing, this_process_cpus())


@dataclasses.dataclass(frozen=True)
class Split:
    """A node split into processes: each one's cores, in local rank order."""

    how: str  # the --cpu-processes value
    topology: Topology
    processes: tuple[tuple[Core, ...], ...]

    @property
    def cores_per_process(self) -> int:
        return len(self.processes[0])

    def cpus(self, local_rank: int) -> list[int]:
        """The CPUs local rank `local_rank` runs on: the first of each of its cores."""
        return [core.cpus[0] for core in self.processes[local_rank]]

    def environment(self) -> dict[str, str]:
        """What the workers need: their CPUs (runners/pin.py) and as many OpenMP threads as cores."""
        return {
            CPUS_VARIABLE: ";".join(format_cpus(self.cpus(rank)) for rank in range(len(self.processes))),
            "OMP_NUM_THREADS": str(self.cores_per_process),
        }

    def describe(self) -> str:
        """One line: the node, the split, and each local rank's CPUs (and where they are)."""
        siblings = any(len(core.cpus) > 1 for core in self.topology.cores)
        count, cores = len(self.processes), self.cores_per_process
        ranks = []
        for rank, group in enumerate(self.processes):
            where = [f"socket {format_cpus(core.socket for core in group)}"]
            if self.topology.nodes:
                where.append(f"NUMA node {format_cpus(core.node for core in group if core.node is not None)}")
            cpus = self.cpus(rank)
            ranks.append(
                f"local rank {rank} on CPU{'s' if len(cpus) > 1 else ''} {format_cpus(cpus)} ({', '.join(where)})"
            )
        return (
            f"this node ({self.topology.describe()}) split by {FLAG}={self.how} into {count} process"
            f"{'es' if count > 1 else ''} of {cores} core{'s' if cores > 1 else ''}, "
            f"{'one CPU of each (its SMT siblings idle), ' if siblings else ''}{cores} OpenMP thread"
            f"{'s' if cores > 1 else ''} each: " + "; ".join(ranks)
        )


def parse_split(value: str) -> str | int:
    """A --cpu-processes value: socket, numa, core, or a positive count."""
    if value in SPLITS:
        return value
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise UsageError(f"{FLAG}={value}: give socket, numa, core, or a number of processes")


def split(topology: Topology, value: str) -> Split:
    """The node split as --cpu-processes=`value` asks, or a UsageError saying why it cannot be."""
    how = parse_split(value)
    cores = topology.cores
    if how == "socket":
        groups = [tuple(core for core in cores if core.socket == socket) for socket in topology.sockets]
    elif how == "numa":
        if not topology.nodes:
            raise UsageError(f"{FLAG}=numa: lscpu names no NUMA node on this machine; use {FLAG}=socket")
        groups = [tuple(core for core in cores if core.node == node) for node in topology.nodes]
    elif how == "core":
        groups = [(core,) for core in cores]
    else:
        groups = count_split(topology, how)
    sizes = sorted({len(group) for group in groups})
    if len(sizes) > 1:
        unit = "socket" if how == "socket" else "NUMA node"
        counts = ", ".join(
            f"{len(group)} on {unit} {group[0].socket if how == 'socket' else group[0].node}" for group in groups
        )
        raise UsageError(
            f"{FLAG}={how}: the {unit}s have unequal numbers of the cores the launcher may run on ({counts}; its "
            f"CPUs: {format_cpus(topology.cpus)}), and every process must get as many (DDP waits for the slowest): "
            f"give a count of processes ({FLAG}=N) instead"
        )
    return Split(str(how), topology, tuple(groups))


def count_split(topology: Topology, count: int) -> list[tuple[Core, ...]]:
    """`count` processes of consecutive cores, each within one memory domain (Core.domain) or on whole ones."""
    cores = topology.cores
    total = len(cores)
    where = f"the {total} core{'s' if total > 1 else ''} the launcher may run on (CPUs {format_cpus(topology.cpus)})"
    if count > total:
        raise UsageError(f"{FLAG}={count}: more processes than {where}")
    valid = [n for n in range(1, total + 1) if total % n == 0 and not spanning(topology, n)]
    if total % count:
        raise UsageError(
            f"{FLAG}={count}: {count} processes cannot share {where} equally (DDP waits for the slowest); "
            f"counts that can: {', '.join(map(str, valid))}"
        )
    size = total // count
    if spanning(topology, count):
        kind = cores[0].domain[0]
        sizes = ", ".join(map(str, domain_sizes(cores).values()))
        raise UsageError(
            f"{FLAG}={count}: a process of {size} cores would take part of one {kind} and part of another "
            f"({kind}s of {sizes} cores); counts that keep each process within a {kind} or on whole ones: "
            f"{', '.join(map(str, valid))}"
        )
    return [cores[start : start + size] for start in range(0, total, size)]


def domain_sizes(cores: Iterable[Core]) -> dict[tuple[str, int], int]:
    """The number of cores in each memory domain."""
    sizes: dict[tuple[str, int], int] = {}
    for core in cores:
        sizes[core.domain] = sizes.get(core.domain, 0) + 1
    return sizes


def spanning(topology: Topology, count: int) -> bool:
    """Whether some process of `count` equal runs of consecutive cores would hold part of a memory domain and some
    other domain's cores (a process within one domain, or on whole domains, is fine)."""
    cores, size = topology.cores, len(topology.cores) // count
    whole = domain_sizes(cores)
    for start in range(0, len(cores), size):
        held = domain_sizes(cores[start : start + size])
        if len(held) > 1 and any(held[domain] < whole[domain] for domain in held):
            return True
    return False
