"""What each worker of `bertbench launch --cpu-processes` runs first: pin itself to its CPUs, then become the command.

    python -u -m bertbench.runners.pin python -u -m bertbench.runners.classifier ...

torchrun starts this module in every worker with the same arguments; the worker finds its CPUs by its LOCAL_RANK in
the launcher's BERTBENCH_CPUS (common/cpus.py), sets its affinity there, and execs the command torchrun would have
run: same process id (torchrun's signals and exit status reach it as before), same environment (OMP_NUM_THREADS is
the launcher's: as many threads as cores). Being before the command's first import, this comes before torch starts
its OpenMP threads, which inherit the affinity, and before the first page is touched, so memory is allocated on the
node of those CPUs by Linux's first-touch policy (what `numactl -m` would ask for). Imports no torch.
"""

from __future__ import annotations

import os
import sys

from bertbench.common.cpus import CPUS_VARIABLE, parse_cpus


def main(command: list[str]) -> None:
    lists = os.environ[CPUS_VARIABLE].split(";")
    os.sched_setaffinity(0, parse_cpus(lists[int(os.environ["LOCAL_RANK"])]))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
