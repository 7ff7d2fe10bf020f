"""torchrun, with one-line errors for what goes wrong between nodes (also `bertbench launch`).

    python -m bertbench.runners.launch --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \\
        --rdzv-endpoint=$MASTER_ADDR:29500 --rdzv-id=$JOB_ID --max-restarts=3 -m bertbench.runners.classifier ...

The arguments, the processes it starts and their environment are torchrun's own (`torch.distributed.run`): this
module calls it, it launches nothing itself. What it adds is the report when a job fails. torchrun answers a node
that never joins with a bare `RendezvousTimeoutError` traceback after `join_timeout` (600 s unless
`--rdzv-conf=join_timeout=S`), and failed workers with a traceback around its failure table; here the first is one
line that says what did not happen and what to check, the second the table alone. Exit status 1 on either.

One flag of its own, `--cpu-processes=socket|numa|core|N`, uses a CPU node as Intel's recipes do: a process per
socket (NUMA node, physical core, or N equal parts), each pinned to its cores with as many OpenMP threads, gloo
between them (common/cpus.py splits the node, runners/pin.py pins each worker before its command starts). It is not a
value of `--nproc-per-node`, whose values keep torchrun's meaning (unpinned processes): the split is a placement, and
it sets the process count itself. A split that cannot be (a GPU node, more processes than cores, a count that does
not divide them, one that would cut NUMA nodes) is refused in one line, exit status 2, before anything starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import torch
from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousError, RendezvousTimeoutError

from bertbench.common import cpus
from bertbench.common.errors import INPUT_ERROR, UsageError

PROGRAM = "bertbench launch"
DEFAULT_JOIN_TIMEOUT = 600  # torchrun's c10d default, in seconds


def rendezvous_option(rdzv_conf: str, key: str, default: float) -> float:
    """A value of torchrun's --rdzv-conf (`key1=value1,key2=value2`)."""
    for item in filter(None, rdzv_conf.split(",")):
        name, _, value = item.partition("=")
        if name.strip() == key:
            return float(value)
    return default


def describe_rendezvous_failure(args, error: RendezvousError) -> str:
    endpoint = args.rdzv_endpoint or f"{args.master_addr}:{args.master_port}"
    where = f"rendezvous '{args.rdzv_id}' at {endpoint} ({args.rdzv_backend})"
    if isinstance(error, RendezvousTimeoutError):
        seconds = rendezvous_option(args.rdzv_conf, "join_timeout", DEFAULT_JOIN_TIMEOUT)
        return (
            f"{where} timed out after {seconds:g} s waiting for {args.nnodes} node(s) to join: a node did not "
            "start its launcher, or cannot reach the endpoint; start every node with the same --rdzv-endpoint "
            "and --rdzv-id (or wait longer: --rdzv-conf=join_timeout=SECONDS)"
        )
    if isinstance(error, RendezvousConnectionError):
        return (
            f"{where} cannot be reached ({error or type(error).__name__}): check that the endpoint's host runs "
            "the first node's launcher and that its port is open to every node"
        )
    return f"{where} failed: {type(error).__name__}: {error}"


def parser_with(nproc_default: bool = True):
    """torchrun's parser with --cpu-processes (without torchrun's default of --nproc-per-node when told)."""
    parser = torchrun.get_args_parser()
    parser.prog = PROGRAM  # torchrun's parser names itself after sys.argv[0]: `bertbench`, or `__main__.py`
    parser.add_argument(
        cpus.FLAG,
        "--cpu_processes",
        default=None,
        help="Split this CPU node into processes, each pinned to its own cores with as many OpenMP threads: one per "
        "socket, per NUMA node, per physical core, or N equal parts (sets --nproc-per-node; docs/clusters.md).",
    )
    if not nproc_default:
        parser.set_defaults(nproc_per_node=None)
    return parser


def split_node(args, argv: list[str]) -> cpus.Split:
    """The node split as --cpu-processes asks, every flag checked against it; the workers' command wrapped in
    runners/pin.py. Nothing has started yet: a UsageError here is the command's one line."""
    flag = f"{cpus.FLAG}={args.cpu_processes}"
    gpus = torch.cuda.device_count()
    if gpus:
        raise UsageError(
            f"{flag} splits a CPU-only node, and this one has {gpus} GPU(s): use --nproc-per-node=gpu (torchrun's "
            "--numa-binding pins each process near its GPU), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on "
            "the CPUs alone"
        )
    for given, why in (
        (args.numa_binding, "--numa-binding binds processes near their GPUs"),
        (args.run_path, "--run-path runs the script in torchrun's own process, which cannot be pinned per rank"),
        (args.virtual_local_rank, "--virtual-local-rank gives every worker local rank 0 (for GPUs)"),
    ):
        if given:
            raise UsageError(f"{flag}: {why}; leave it out")
    if not hasattr(os, "sched_setaffinity"):
        raise UsageError(f"{flag} pins processes with sched_setaffinity, which this system lacks (Linux has it)")
    split = cpus.split(cpus.read_topology(), args.cpu_processes)
    count = len(split.processes)
    asked = parser_with(nproc_default=False).parse_args(argv).nproc_per_node
    name = "--nproc-per-node"
    if asked is None and os.environ.get("PET_NPROC_PER_NODE"):
        asked, name = os.environ["PET_NPROC_PER_NODE"], "PET_NPROC_PER_NODE"
    if asked is not None and asked != str(count):
        raise UsageError(f"{name}={asked} and {flag} disagree: the split makes {count} process(es); leave {name} out")
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads is not None and threads != str(split.cores_per_process):
        raise UsageError(
            f"OMP_NUM_THREADS={threads}, and {flag} gives each process {split.cores_per_process} core(s), one "
            "thread each: unset OMP_NUM_THREADS (the split sets it)"
        )
    if os.environ.get("GOMP_CPU_AFFINITY"):
        raise UsageError(
            f"GOMP_CPU_AFFINITY names the same CPUs to every process of {flag}, not each its own: unset it "
            "(each process is pinned to its own CPUs)"
        )
    if args.no_python and args.module:
        raise UsageError("--no-python and -m cannot be used together")
    # the command torchrun would run (torch.distributed.run.config_from_args), which pin.py execs
    if args.no_python:
        command = [args.training_script]
    else:
        command = [
            os.getenv("PYTHON_EXEC", sys.executable),
            "-u",
            *(["-m"] if args.module else []),
            args.training_script,
        ]
    args.nproc_per_node = str(count)
    args.no_python, args.module, args.training_script = False, True, "bertbench.runners.pin"
    args.training_script_args = [*command, *args.training_script_args]
    return split


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser_with().parse_args(argv)
    if args.cpu_processes is not None:
        try:
            split = split_node(args, argv)
        except UsageError as error:
            print(f"{PROGRAM}: error: {error}", file=sys.stderr, flush=True)
            return INPUT_ERROR
        os.environ.update(split.environment())  # the workers inherit it
        print(f"{PROGRAM}: {split.describe()}", flush=True)
    try:
        torchrun.run(args)
    except RendezvousError as error:
        print(f"{PROGRAM}: error: {describe_rendezvous_failure(args, error)}", file=sys.stderr, flush=True)
        return 1
    except ChildFailedError as error:
        print(error.format_msg(), file=sys.stderr, flush=True)  # torchrun's table: host, rank, exit code, cause
        return 1
    except SignalException as error:  # the launcher itself was stopped (scancel, qdel); workers were told first
        print(f"{PROGRAM}: stopped by {error.sigval.name}", file=sys.stderr, flush=True)
        return 128 + int(error.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
