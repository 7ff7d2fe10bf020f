"""Run under torchrun by test_distributed.py: several commands in one job, one after the other, so that the job's
processes start once (each imports torch, and DDP's torch._dynamo: seconds of CPU) instead of once per command.

    bertbench launch --standalone --nproc-per-node=2 tests/torchrun_phases.py PLAN.json

PLAN.json is a list of phases, each {"name": ..., "call": "module:function", "argv": [...]}, with optionally "copy":
[source, destination] and "remove": [paths], which rank 0 does before the phase starts (a snapshot of a run for the
test to read, the checkpoints a killed worker would have lost). The ranks start each phase together (a file per rank
beside PLAN.json says it is ready). Each rank calls function(argv) with its stdout and stderr going to
<name>.rank<R>.log beside PLAN.json (appended to: a restart's lines follow the killed attempt's), and writes what it
returned (an exit status) to <name>.rank<R>.status, followed by " after restart N" where the phase ran in torchrun's
N-th restart (a phase that a crash made run again is not a first run's success). A phase's process group keeps its
keys in torchrun's store apart from the earlier phases', as a restart's do
(bertbench.training.distributed.restart_safe_store): a new group in the same process would otherwise find the last
one's keys and try its closed connections. Workers that torchrun restarted (--max-restarts) skip the phases every rank
finished and go on from the one that was interrupted.
"""

import contextlib
import importlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the phases may call the tests' modules


def start_together(directory: Path, name: str, rank: int, world_size: int) -> None:
    (directory / f"{name}.rank{rank}.ready").touch()
    deadline = time.monotonic() + 300
    while not all((directory / f"{name}.rank{other}.ready").exists() for other in range(world_size)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"phase {name}: not every rank became ready")
        time.sleep(0.01)


def main(plan_path: str) -> None:
    directory = Path(plan_path).parent
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    for phase in json.loads(Path(plan_path).read_text()):
        name = phase["name"]
        if all((directory / f"{name}.rank{other}.status").exists() for other in range(world_size)):
            continue  # finished before torchrun restarted the workers
        if rank == 0:
            if "copy" in phase:
                shutil.copytree(*phase["copy"])
            for path in phase.get("remove", []):
                os.remove(path)
        start_together(directory, name, rank, world_size)
        os.environ["TORCHELASTIC_RESTART_COUNT"] = f"{restart}-{name}"
        module, function = phase["call"].split(":")
        with open(directory / f"{name}.rank{rank}.log", "a") as log:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                status = getattr(importlib.import_module(module), function)(phase["argv"])
        (directory / f"{name}.rank{rank}.status").write_text(
            f"{status} after restart {restart}" if restart != "0" else str(status)
        )


if __name__ == "__main__":
    main(sys.argv[1])
