"""`bertbench bench scaling`: data parallel speedup and efficiency over 1..N processes, or over runs of the job
templates on several nodes.

Local mode trains a classifier through the Estimator under torchrun (`bertbench launch --standalone`; gloo on the
CPU, NCCL on GPUs, DDP) once per process count, with the same batch per process (weak scaling: the global batch
grows with the processes), and reports the table of the BERT-at-a-University paper: nodes, processes (GPUs), global
batch, time per step, throughput, speedup and efficiency ("expansion": throughput on N / (N x throughput on 1)).
On the largest process count it also times the gradient all-reduce: inside DDP steps (steps with it and under
`no_sync`, interleaved, each timed on its slowest rank: the exposed cost) and alone at several sizes, from which
the latency and bus bandwidth of the ring model are fitted (what `bertbench bench plan --validate` uses).

Runs mode (`--runs DIR...`) builds the same table from the train_results.json of runs the job templates made on
1, 2, 4 ... nodes (run_glue.sh names them `..._nodes<N>`), relative to the run with the fewest processes.

    bertbench bench scaling --model base --processes 1,2
    bertbench bench scaling --runs results/mrpc_*_nodes1 results/mrpc_*_nodes2 results/mrpc_*_nodes4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from bertbench.bench import cli, measure, workload
from bertbench.bench.output import (
    BenchOutput,
    efficiency_column,
    markdown_table,
    mismatch_warning,
    spread_column,
    superlinear_warning,
)
from bertbench.bench.plan import fit_alpha_beta
from bertbench.bench.plots import line_plot
from bertbench.common import run_files
from bertbench.common.flags import description
from bertbench.common.noise import (
    LoadWatch,
    available_cores,
    noisy_warning,
    rate_spread,
    spread,
    spread_fields,
    spread_text,
)
from bertbench.tasks import synthetic
from bertbench.training.batches import ShuffledBatches
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.training.distributed import check_processes, job_from_environment
from bertbench.training.loop import Estimator
from bertbench.training.metrics import read_metrics

# All-reduce sizes timed alone, besides the whole gradient: latency-bound to bandwidth-bound (16 MiB even for a
# tiny model, so that the fit has a size where bandwidth shows).
ALLREDUCE_SIZES = (2**12, 2**16, 2**20, 2**24)
COLUMNS = [
    ("nodes", "nodes", "d"),
    ("processes", "processes", "d"),
    ("global batch", "global_batch", "d"),
    spread_column("time per step (s): median (min–max, CV)", "step_seconds", ".4f"),
    ("seq/s", "seq_per_s", ",.2f"),
    ("speedup", "speedup", ".2f"),
    efficiency_column("efficiency", "efficiency"),
]
# What must be alike for runs to be compared (row key -> what it is); processes are what scaling varies.
ALIKE = {"threads": "threads per process", "device_type": "device"}


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser_for("scaling", description(__doc__))
    local = parser.add_argument_group("local mode: torchrun jobs on this machine")
    cli.add_model_flag(local)
    local.add_argument(
        "--processes",
        type=cli.comma_list(cli.positive_int),
        default=[1, 2],
        help="Process counts to run; the first is the reference of speedup and efficiency.",
    )
    local.add_argument("--seq_length", type=cli.positive_int, default=128, help="Tokens per sequence.")
    local.add_argument("--batch_per_process", type=cli.positive_int, default=8, help="Sequences per process per step.")
    local.add_argument("--steps", type=cli.positive_int, default=8, help="Timed steps per job.")
    local.add_argument("--excluded_steps", type=int, default=2, help="Steps at the start left out of the timing.")
    local.add_argument(
        "--allreduce_rounds",
        type=cli.positive_int,
        default=6,
        help="Interleaved pairs of DDP steps with and without the all-reduce.",
    )
    local.add_argument("--allreduce_repeats", type=cli.positive_int, default=10, help="Timed all-reduces per size.")
    local.add_argument(
        "--threads_per_process", type=cli.positive_int, default=1, help="CPU threads of each process (OMP_NUM_THREADS)."
    )
    local.add_argument(
        "--device",
        default=None,
        help="cpu or cuda: one GPU per process, NCCL (default: CUDA when available); cuda:N for jobs of one process.",
    )
    runs = parser.add_argument_group("runs mode: results of the job templates")
    runs.add_argument("--runs", nargs="+", metavar="DIR", help="Run directories holding train_results.json.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # inside a torchrun job: write findings here
    return parser


# ---- inside the torchrun job --------------------------------------------------------------------------------------


def slowest_rank(values: list[float]) -> list[float]:
    """Each value's maximum over the ranks: a step or a collective is done when its slowest rank is."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device_of_backend())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def device_of_backend() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def time_allreduce(numel: int, repeats: int) -> dict:
    """The spread of the seconds of one all-reduce of `numel` fp32 values across the job, on its slowest rank."""
    device = device_of_backend()
    buffer = torch.ones(numel, device=device)
    dist.all_reduce(buffer)  # the first sets up the connections
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        seconds.append(measure.time_call(lambda: dist.all_reduce(buffer), device))
    return spread(slowest_rank(seconds))


def time_allreduce_in_steps(config, model: nn.Module, batch_size: int, seq: int, rounds: int, job) -> dict[str, float]:
    """Seconds (median and spread) of the training step with DDP's all-reduce and of the same step without it (as
    independent workers train), interleaved, and of their difference round by round."""
    steps = {
        name: workload.train_step(
            config,
            "finetuning",
            workload.Variant.parse("baseline"),
            "fp32",
            batch_size,
            seq,
            job.device,
            model,
            dist=job,
            sync_gradients=sync,
        )
        for name, sync in (("with", True), ("without", False))
    }
    times = measure.time_steps(steps, warmup=1, repeats=rounds, device=job.device)
    with_all_reduce, without = slowest_rank(times["with"]), slowest_rank(times["without"])
    return {
        **spread_fields("step_with_allreduce_seconds", spread(with_all_reduce)),
        **spread_fields("step_without_allreduce_seconds", spread(without)),
        **spread_fields("exposed_allreduce_seconds", spread([a - b for a, b in zip(with_all_reduce, without)])),
    }


def steady_step_seconds(model_dir: str, excluded_steps: int, global_batch: int) -> list[float]:
    """Seconds of each step after the excluded ones, from the Estimator's log of one-step windows (metrics.jsonl:
    each window's seq/s counts every rank's sequences over rank 0's clock)."""
    return [global_batch / record["seq_per_s"] for record in read_metrics(model_dir) if record["step"] > excluded_steps]


def train_and_time(args: argparse.Namespace, job) -> dict:
    """This process's part of the job: train through the Estimator; on several processes, then time the
    all-reduce inside steps and alone."""
    config = workload.bert_config(args.model, args.seq_length)
    model = workload.build(config, "finetuning", workload.Variant.parse("baseline"), job.device)
    examples = max(args.batch_per_process * job.world_size * 4, 256)
    features = synthetic.synthetic_batch(config, "finetuning", examples, args.seq_length, seed=1)
    global_batch = args.batch_per_process * job.world_size
    with tempfile.TemporaryDirectory() as model_dir:
        # A log window per step (metrics.jsonl, written by rank 0): the steps' spread, and their median, which an
        # outlier step does not move as it moves the Estimator's steady figure (a rate over all the steps, kept as
        # steady_seq_per_s). Logging costs each step a scalar all-reduce of the loss and a line of JSON.
        estimator = Estimator(
            model,
            RunConfig(model_dir=model_dir, save_checkpoints_secs=None, log_step_count_steps=1),
            TrainConfig(num_train_steps=args.excluded_steps + args.steps, excluded_steps=args.excluded_steps),
            job,
            log=lambda line: None,
        )
        result = estimator.train(
            ShuffledBatches(features, args.batch_per_process, seed=0, rank=job.rank, world_size=job.world_size)
        )
        timing = {}
        if job.is_main:  # the rank that logs the windows, and writes the findings
            seconds = steady_step_seconds(model_dir, args.excluded_steps, global_batch)
            timing = {
                **spread_fields("seq_per_s", rate_spread(global_batch, seconds)),
                **spread_fields("step_seconds", spread(seconds)),
            }
    parameters = sum(parameter.numel() for parameter in model.parameters())
    findings = {
        "nodes": job.nodes,
        "processes": job.world_size,
        "batch_per_process": args.batch_per_process,
        "global_batch": global_batch,
        **timing,
        "steady_seq_per_s": result.steady_sentences_per_second,
        "timed_steps": result.steady_steps,
        "parameters": parameters,
        "backend": dist.get_backend() if job.enabled else None,
        "threads": torch.get_num_threads(),
        "device_type": job.device.type,
    }
    if job.enabled:
        findings.update(
            time_allreduce_in_steps(config, model, args.batch_per_process, args.seq_length, args.allreduce_rounds, job),
            allreduce_rounds=args.allreduce_rounds,
        )
        sizes = sorted(set(ALLREDUCE_SIZES) | {parameters * 4})
        timed = [time_allreduce(size // 4, args.allreduce_repeats) for size in sizes]
        findings["allreduce"] = {
            "processes": job.world_size,
            "sizes_bytes": sizes,
            **{
                f"seconds{suffix}": [measured[part] for measured in timed]
                for suffix, part in (("", "median"), ("_min", "min"), ("_max", "max"), ("_cv", "cv"))
            },
        }
    return findings


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads_per_process)
    with job_from_environment(args.device) as job:
        findings = train_and_time(args, job)
        if job.is_main:
            with open(args.worker, "w") as handle:
                json.dump(findings, handle)


# ---- the driver ---------------------------------------------------------------------------------------------------


def run_job(args: argparse.Namespace, processes: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "findings.json")
        command = [
            sys.executable,
            "-m",
            "bertbench.runners.launch",
            "--standalone",
            f"--nproc-per-node={processes}",
            "-m",
            "bertbench.bench.scaling",
            "--worker",
            out,
            "--model",
            args.model,
            "--seq_length",
            str(args.seq_length),
            "--batch_per_process",
            str(args.batch_per_process),
            "--steps",
            str(args.steps),
            "--excluded_steps",
            str(args.excluded_steps),
            "--allreduce_rounds",
            str(args.allreduce_rounds),
            "--allreduce_repeats",
            str(args.allreduce_repeats),
            "--threads_per_process",
            str(args.threads_per_process),
        ]
        if args.device:
            command += ["--device", args.device]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads_per_process))
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise workload.BenchRunFailed(f"the {processes}-process job failed (exit {done.returncode}): {tail}")
        with open(out) as handle:
            findings = json.load(handle)
        print(
            f"  {processes} process(es): {spread_text(findings, 'seq_per_s', '.2f')} seq/s "
            f"({time.perf_counter() - started:.0f} s with start-up)",
            flush=True,
        )
        return findings


def with_speedup(rows: list[dict]) -> list[dict]:
    """Speedup and efficiency of each row relative to the first (throughput ratio / process ratio)."""
    reference = rows[0]
    for row in rows:
        row["speedup"] = row["seq_per_s"] / reference["seq_per_s"]
        row["efficiency"] = row["speedup"] / (row["processes"] / reference["processes"])
    return rows


def local_mode(args: argparse.Namespace) -> tuple[dict, str, list[str | None]]:
    workload.bert_config(args.model, args.seq_length)
    check_processes(args.device, max(args.processes))
    if args.excluded_steps < 0:
        raise workload.BenchError(f"--excluded_steps must be 0 or more, got {args.excluded_steps}")
    load = LoadWatch()
    findings = [run_job(args, processes) for processes in args.processes]
    rows = with_speedup(
        [
            {key: value for key, value in found.items() if key != "allreduce" and "allreduce" not in key}
            for found in findings
        ]
    )
    figures = {
        "model": args.model,
        "seq": args.seq_length,
        "batch_per_process": args.batch_per_process,
        "parameters": findings[0]["parameters"],
        "gradient_bytes": findings[0]["parameters"] * 4,
        "rows": rows,
    }
    largest = max(findings, key=lambda found: found["processes"])
    lines = [
        f"# Scaling: {args.model}, seq {args.seq_length}, {args.batch_per_process} sequences per process, "
        f"{args.threads_per_process} thread(s) per process",
        "",
        markdown_table(rows, COLUMNS),
        "",
        f"time per step: median of the {args.steps} steps after the first {args.excluded_steps} of each job "
        "(min–max, CV = stdev / mean), on rank 0's clock; seq/s, speedup and efficiency are of the median "
        "step (the Estimator's steady seq/s over the same steps is steady_seq_per_s in the JSON).",
    ]
    if "allreduce" in largest:
        measured = largest["allreduce"]
        latency, bandwidth = fit_alpha_beta(measured["sizes_bytes"], measured["seconds"], measured["processes"])
        measured.update(latency_seconds=latency, bus_bandwidth_bytes_per_s=bandwidth)
        figures["allreduce"] = measured
        in_steps = {key: value for key, value in largest.items() if "allreduce" in key and key != "allreduce"}
        figures["allreduce_in_steps"] = in_steps
        sizes = [
            {
                "size_mib": size / 2**20,
                **{f"ms{suffix}": measured[f"seconds{suffix}"][index] * 1e3 for suffix in ("", "_min", "_max")},
                "ms_cv": measured["seconds_cv"][index],
                "bus": size * 2 * (measured["processes"] - 1) / measured["processes"] / seconds / 1e9,
            }
            for index, (size, seconds) in enumerate(zip(measured["sizes_bytes"], measured["seconds"]))
        ]
        lines += [
            "",
            f"All-reduce on {measured['processes']} processes ({largest['backend']}): "
            f"{in_steps['exposed_allreduce_seconds'] * 1e3:.1f} ms exposed per DDP "
            f"step (median of {args.allreduce_rounds} interleaved pairs: "
            f"{in_steps['step_with_allreduce_seconds'] * 1e3:.1f} ms with, "
            f"{in_steps['step_without_allreduce_seconds'] * 1e3:.1f} ms without; exposed per pair "
            f"{in_steps['exposed_allreduce_seconds_min'] * 1e3:.1f} to "
            f"{in_steps['exposed_allreduce_seconds_max'] * 1e3:.1f} ms).",
            "",
            markdown_table(
                sizes,
                [
                    ("size (MiB)", "size_mib", ",.3f"),
                    spread_column("time (ms): median (min–max, CV)", "ms", ",.3f"),
                    ("bus bandwidth (GB/s)", "bus", ".3f"),
                ],
            ),
            "",
            f"Ring model fitted to the medians (t = 2(P-1) latency + 2(P-1)/P x bytes / bandwidth): "
            f"latency {latency * 1e6:.1f} us, bus bandwidth {bandwidth / 1e9:.3f} GB/s.",
        ]
    warnings = [load.busy(), *comparability(rows, "processes")]
    if figures["rows"][0]["device_type"] == "cpu":
        crowded = [row["processes"] for row in rows if row["processes"] * row["threads"] > available_cores()]
        if crowded:
            warnings.append(
                f"the {', '.join(map(str, crowded))}-process job(s) ran more threads (processes x "
                f"{args.threads_per_process} per process) than the {available_cores()} core(s) available: "
                "the processes took turns on the cores, which is not the scaling of a machine with a "
                "core per thread"
            )
    return figures, "\n".join(lines), warnings


def comparability(rows: list[dict], name: str) -> list[str | None]:
    """Warnings that the rows (runs) are noisy or not alike, or that efficiency went above 100%; the key `name`
    names a run."""

    def describe(row: dict) -> str:
        return f"{row['processes']} processes" + ("" if name == "processes" else f", {row[name]}")

    return [
        noisy_warning(rows, "step_seconds", describe, "step times"),
        mismatch_warning(rows, ALIKE, name),
        superlinear_warning(rows, "efficiency", describe),
    ]


def nodes_of(path: str, results: dict) -> int:
    if "nodes" in results:
        return int(results["nodes"])
    match = re.search(r"_nodes(\d+)", os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else 1


RUNS_COLUMNS = [
    ("run", "run", ""),
    *COLUMNS[:3],
    ("time per step (s)", "step_seconds", ".4f"),
    *COLUMNS[4:],
    ("device", "device", ""),
    ("threads", "threads", "d"),
]


def runs_mode(args: argparse.Namespace) -> tuple[dict, str, list[str | None]]:
    rows, shapes = [], set()
    for directory in args.runs:
        path = os.path.join(directory, run_files.TRAIN_RESULTS)
        try:
            with open(path) as handle:
                results = json.load(handle)
        except FileNotFoundError:
            raise workload.BenchError(f"{path}: no such file (not a finished run directory)") from None
        except json.JSONDecodeError as error:
            raise workload.BenchError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None
        for key in (
            "world_size",
            "train_batch_size",
            "num_accumulation_steps",
            "max_seq_length",
            "steady_sentences_per_second",
        ):
            if results.get(key) is None:
                raise workload.BenchError(f"{path}: missing key {key!r} (no steady throughput: too few steps?)")
        shapes.add(
            (
                results["train_batch_size"] * results["num_accumulation_steps"],
                results["max_seq_length"],
                results.get("modeling"),
                results.get("precision"),
            )
        )
        global_batch = results["train_batch_size"] * results["num_accumulation_steps"] * results["world_size"]
        device = results.get("device")
        rows.append(
            {
                "run": directory,
                "nodes": nodes_of(directory, results),
                "processes": results["world_size"],
                "global_batch": global_batch,
                "seq_per_s": results["steady_sentences_per_second"],
                "step_seconds": global_batch / results["steady_sentences_per_second"],
                "device": device,
                "device_type": device.split(":")[0] if device else None,
                # CPU threads of each process, where the run recorded them
                "threads": results.get("threads"),
            }
        )
    if len(shapes) > 1:
        raise workload.BenchError(
            "the runs differ in batch per process, sequence length, modeling or precision: "
            + "; ".join(map(str, sorted(shapes, key=str)))
        )
    rows = with_speedup(sorted(rows, key=lambda row: (row["processes"], row["nodes"])))
    batch_per_process, seq, _, _ = shapes.pop()
    text = "\n".join(
        [
            f"# Scaling: runs of the job templates, seq {seq}, {batch_per_process} sequences per process",
            "",
            markdown_table(rows, RUNS_COLUMNS),
            "",
            "Each run's steady seq/s from its train_results.json: one figure per run, no spread; threads: "
            "as the run recorded them (– where it did not).",
        ]
    )
    return (
        {"model": "runs", "seq": seq, "batch_per_process": batch_per_process, "rows": rows},
        text,
        comparability(rows, "run"),
    )


def plots(figures: dict) -> dict:
    rows = figures["rows"]
    setting = f"{figures['model']}, seq {figures['seq']}, {figures['batch_per_process']} sequences per process"
    processes = [row["processes"] for row in rows]
    ideal = [rows[0]["seq_per_s"] * count / rows[0]["processes"] for count in processes]
    throughput = tuple(
        [row.get(key) for row in rows] for key in ("processes", "seq_per_s", "seq_per_s_min", "seq_per_s_max")
    )
    return {
        "efficiency": line_plot(
            {"measured": (processes, [row["efficiency"] for row in rows])},
            "processes",
            "efficiency",
            f"scaling efficiency: {setting}",
            log_x=True,
            reference=(processes, [1.0] * len(processes), "ideal"),
            y_from_zero=True,
        ),
        "throughput": line_plot(
            {"measured": throughput},
            "processes",
            "sequences / s",
            f"throughput: {setting}",
            log_x=True,
            reference=(processes, ideal, "linear"),
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    def body() -> None:
        output = BenchOutput(cli.output_dir(args, "scaling"), "scaling", argv, args.overwrite)
        figures, text, warnings = runs_mode(args) if args.runs else local_mode(args)
        for message in warnings:
            output.warn(message)
        print(output.write(vars(args), {"models": [figures]}, text, plots(figures)))
        print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")

    return cli.run("bertbench bench scaling", body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
