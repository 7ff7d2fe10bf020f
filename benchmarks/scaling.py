"""Data parallel scaling on this machine (a benchmark that prints numbers, not a test).

For the demo's model (hidden 64, 2 layers, seq 32) and a BERT-base-sized one (12 x 768, seq 128), trains through the
Estimator under torchrun (`bertbench launch`, gloo on the CPU, DDP) on 1 and on N processes of one thread each,
with the same batch per process (weak scaling: the global batch grows with the processes), and reports:

1. time per step, sequences/s, speedup and efficiency (throughput on N / (N x throughput on 1)): the table of the
   BERT-at-a-University paper, for the processes this machine has;
2. what the gradient all-reduce costs a step on N processes: DDP steps that all-reduce and the same steps under
   `no_sync` (no all-reduce), interleaved in one job so that the machine's drift hits both alike, each timed on its
   slowest rank; and one all-reduce of the whole gradient (every parameter, fp32) alone, with its bus bandwidth
   (bytes x 2(N-1)/N per second, NCCL's definition). DDP overlaps its all-reduces with the backward pass, so the
   first figure (exposed) can be smaller than the second.

    python benchmarks/scaling.py                                 # about 5 minutes on 2 cores
    python benchmarks/scaling.py --models demo --processes 4 --output figures.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from bertbench.bench.measure import time_steps
from bertbench.bench.report import machine, markdown_table, write_report
from bertbench.config import BertConfig
from bertbench.demo.data import vocabulary
from bertbench.distributed import job_from_environment
from bertbench.estimator import Estimator, RunConfig, ShuffledBatches, TrainConfig
from bertbench.models import build_model

# name -> (model config, sequence length, batch per process, steps left out of the timing, timed steps, rounds of
# the all-reduce / no_sync pair)
MODELS = {
    "demo": (dict(vocab_size=len(vocabulary()), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=256, max_position_embeddings=32), 32, 32, 20, 200, 100),
    "base": (dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                  intermediate_size=3072), 128, 8, 2, 8, 6),
}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,base", help="Comma-separated: demo, base.")
    parser.add_argument("--processes", type=int, default=2, help="The largest process count (compared with 1).")
    parser.add_argument("--threads", type=int, default=1, help="Threads of each process.")
    parser.add_argument("--allreduce-repeats", type=int, default=20, help="Timed all-reduces of the whole gradient.")
    parser.add_argument("--output", help="Also write the figures as JSON here.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a process of a torchrun job: write findings here
    parser.add_argument("--model", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ---- inside the torchrun job --------------------------------------------------------------------------------------

def slowest_rank(values: list[float]) -> list[float]:
    """Each value's maximum over the ranks: a step or a collective is done when its slowest rank is."""
    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def time_allreduce(numel: int, repeats: int) -> float:
    """Median seconds of one all-reduce of `numel` fp32 values across the job."""
    buffer = torch.ones(numel)
    dist.all_reduce(buffer)  # the first sets up the connections
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(buffer)
        seconds.append(time.perf_counter() - started)
    return statistics.median(slowest_rank(seconds))


def time_allreduce_in_steps(model: nn.Module, batch: dict, rounds: int) -> dict[str, float]:
    """Median seconds of a DDP training step with its all-reduce and without (no_sync), interleaved."""
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step(all_reduce: bool) -> None:
        with nullcontext() if all_reduce else ddp.no_sync():
            ddp(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = time_steps({"with": lambda: step(True), "without": lambda: step(False)}, warmup=1, repeats=rounds)
    with_all_reduce, without = slowest_rank(times["with"]), slowest_rank(times["without"])
    return {"step_with_allreduce_seconds": statistics.median(with_all_reduce),
            "step_without_allreduce_seconds": statistics.median(without),
            "exposed_allreduce_seconds": statistics.median(a - b for a, b in zip(with_all_reduce, without))}


def train_and_time(args, job) -> dict:
    """This process's part of the job: train through the Estimator; on several processes, then time the
    all-reduce inside steps and alone."""
    config_values, seq, batch, excluded, timed, rounds = MODELS[args.model]
    config = BertConfig(**config_values, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    model = build_model("classification", config, num_labels=2)
    examples = max(batch * job.world_size * 4, 256)
    generator = torch.Generator().manual_seed(1)
    features = {"input_ids": torch.randint(1, config.vocab_size, (examples, seq), generator=generator),
                "token_type_ids": torch.zeros(examples, seq, dtype=torch.long),
                "attention_mask": torch.ones(examples, seq, dtype=torch.long),
                "labels": torch.randint(0, 2, (examples,), generator=generator)}
    with tempfile.TemporaryDirectory() as model_dir:
        estimator = Estimator(model, RunConfig(model_dir=model_dir, save_checkpoints_secs=None,
                                               log_step_count_steps=10**9),
                              TrainConfig(num_train_steps=excluded + timed, excluded_steps=excluded), job,
                              log=lambda line: None)
        result = estimator.train(ShuffledBatches(features, batch, seed=0, rank=job.rank, world_size=job.world_size))
    parameters = sum(parameter.numel() for parameter in model.parameters())
    findings = {"processes": job.world_size, "global_batch": batch * job.world_size,
                "seq_per_s": result.steady_sentences_per_second, "timed_steps": result.steady_steps,
                "parameters": parameters}
    findings["step_seconds"] = findings["global_batch"] / findings["seq_per_s"]
    if job.enabled:
        one_batch = {name: tensor[:batch] for name, tensor in features.items()}
        findings.update(time_allreduce_in_steps(model, one_batch, rounds), allreduce_rounds=rounds)
        findings["allreduce_seconds"] = time_allreduce(parameters, args.allreduce_repeats)
    return findings


def worker(args) -> None:
    torch.set_num_threads(args.threads)
    with job_from_environment("cpu") as job:
        findings = train_and_time(args, job)
        if job.is_main:
            with open(args.worker, "w") as handle:
                json.dump(findings, handle)


# ---- the driver ---------------------------------------------------------------------------------------------------

def run_job(args, model: str, processes: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "findings.json")
        command = [sys.executable, "-m", "bertbench.launch", "--standalone", f"--nproc-per-node={processes}",
                   os.path.abspath(__file__), "--worker", out, "--model", model, "--threads", str(args.threads),
                   "--allreduce-repeats", str(args.allreduce_repeats)]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"scaling.py: the {processes}-process {model} job failed:\n{done.stderr[-3000:]}")
        with open(out) as handle:
            return json.load(handle)


def measure(args, model: str) -> dict:
    single, many = run_job(args, model, 1), run_job(args, model, args.processes)
    rows = []
    for figures in (single, many):
        speedup = figures["seq_per_s"] / single["seq_per_s"]
        rows.append({**figures, "speedup": speedup, "efficiency": speedup / figures["processes"]})
    nbytes = many["parameters"] * 4
    bus_bytes = nbytes * 2 * (args.processes - 1) / args.processes
    allreduce = {name: value for name, value in many.items() if "allreduce" in name}
    return {"model": model, "config": MODELS[model][0], "seq": MODELS[model][1], "rows": rows, **allreduce,
            "gradient_bytes": nbytes, "allreduce_bus_gb_per_s": bus_bytes / many["allreduce_seconds"] / 1e9}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.processes < 2:
        sys.exit("scaling.py: --processes must be at least 2")
    report = {"machine": machine(), "threads_per_process": args.threads, "models": []}
    for model in args.models.split(","):
        if model not in MODELS:
            sys.exit(f"scaling.py: unknown model {model!r}; choose from {', '.join(MODELS)}")
        figures = measure(args, model)
        report["models"].append(figures)
        print(f"\n{model} ({figures['rows'][0]['parameters'] / 1e6:.1f} M parameters, seq {figures['seq']}, "
              f"{args.threads} thread(s) per process, DDP over gloo)")
        print(markdown_table(figures["rows"], [("processes", "processes", "d"), ("global batch", "global_batch", "d"),
                                               ("time per step (s)", "step_seconds", ".3f"),
                                               ("seq/s", "seq_per_s", ".1f"), ("speedup", "speedup", ".2f"),
                                               ("efficiency", "efficiency", ".1%")]))
        print(f"all-reduce on {args.processes} processes: {figures['exposed_allreduce_seconds'] * 1e3:.1f} ms "
              f"exposed per step (median of {figures['allreduce_rounds']} interleaved pairs: "
              f"{figures['step_with_allreduce_seconds'] * 1e3:.1f} ms with, "
              f"{figures['step_without_allreduce_seconds'] * 1e3:.1f} ms without); the "
              f"{figures['gradient_bytes'] / 2**20:.1f} MiB gradient alone: {figures['allreduce_seconds'] * 1e3:.1f}"
              f" ms ({figures['allreduce_bus_gb_per_s']:.2f} GB/s bus bandwidth)")
    write_report(args.output, report)


if __name__ == "__main__":
    main()
