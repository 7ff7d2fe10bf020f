"""torchrun, with one-line errors for what goes wrong between nodes (also `bertbench launch`).

    python -m bertbench.runners.launch --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d \\
        --rdzv-endpoint=$MASTER_ADDR:29500 --rdzv-id=$JOB_ID --max-restarts=3 -m bertbench.runners.classifier ...

The arguments, the processes it starts and their environment are torchrun's own (`torch.distributed.run`): this
module calls it, it launches nothing itself. What it adds is the report when a job fails. torchrun answers a node
that never joins with a bare `RendezvousTimeoutError` traceback after `join_timeout` (600 s unless
`--rdzv-conf=join_timeout=S`), and failed workers with a traceback around its failure table; here the first is one
line that says what did not happen and what to check, the second the table alone. Exit status 1 on either.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from torch.distributed import run as torchrun
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousError, RendezvousTimeoutError

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


def main(argv: Sequence[str] | None = None) -> int:
    parser = torchrun.get_args_parser()
    parser.prog = PROGRAM  # torchrun's parser names itself after sys.argv[0]: `bertbench`, or `__main__.py`
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
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
