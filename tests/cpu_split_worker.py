"""A worker of test_cpu_split's launch: joins the job as the runners do and writes, on rank 0, every process's
placement (host, CPUs, torch's threads) and its own OMP_NUM_THREADS, as the job gathered them."""

import dataclasses
import json
import os
import sys

from bertbench.training.distributed import describe_placement, job_from_environment

if __name__ == "__main__":
    with job_from_environment("cpu") as job:
        omp = job.all_gather_object(os.environ.get("OMP_NUM_THREADS"))
        if job.is_main:
            with open(sys.argv[1], "w") as handle:
                json.dump(
                    {
                        "placement": [dataclasses.asdict(place) for place in job.placement],
                        "line": describe_placement(job.placement),
                        "omp_num_threads": omp,
                    },
                    handle,
                )
