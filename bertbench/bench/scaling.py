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

(--runs takes the directories comma-separated or, as a shell's wildcard gives them, one argument each.)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertbench.bench import measure, workload
from bertbench.bench import settings as bench_settings
from bertbench.bench.errors import BenchRunFailed
from bertbench.bench.output import BenchOutput, mismatch_warning, superlinear_warning, with_warnings
from bertbench.bench.plan import efficiency_column, fit_alpha_beta
from bertbench.bench.plots import line_plot
from bertbench.bench.results import Column, Ratio, Row, Spread, noisy_ratios_note, table
from bertbench.bench.settings import MeasuredSettings, device_setting, model_setting
from bertbench.common import run_files
from bertbench.common.durable import read_json
from bertbench.common.flags import description, setting
from bertbench.common.noise import LoadWatch, available_cores, noisy_warning
from bertbench.tasks import synthetic
from bertbench.training.batches import ShuffledBatches
from bertbench.training.config import RunConfig, TrainConfig, global_batch
from bertbench.training.distributed import check_processes, job_from_environment
from bertbench.training.loop import Estimator
from bertbench.training.metrics import read_metrics

# All-reduce sizes timed alone, besides the whole gradient: latency-bound to bandwidth-bound (16 MiB even for a
# tiny model, so that the fit has a size where bandwidth shows).
ALLREDUCE_SIZES = (2**12, 2**16, 2**20, 2**24)
# What must be alike for runs to be compared (row key -> what it is); processes are what scaling varies.
ALIKE = {"threads": "threads per process", "device_type": "device"}
WORKER = "--worker"  # the first argument of a torchrun job's command: the findings file follows, then the settings


@dataclasses.dataclass(frozen=True)
class ScalingSettings(MeasuredSettings):
    """Local mode (torchrun jobs on this machine), or runs mode (results of the job templates)."""

    bench = "scaling"

    device: str | None = device_setting(
        "cpu or cuda: one GPU per process, NCCL (default: CUDA when available); cuda:N for jobs of one process."
    )
    threads: int | None = setting(
        "CPU threads of each process (OMP_NUM_THREADS).", 1, positive=True, aliases=("threads_per_process",)
    )
    warmup: int = setting("Steps at the start of each job left out of the timing.", 2, aliases=("excluded_steps",))
    steps: int = setting("Timed steps per job.", 8)
    model: str = model_setting()
    processes: tuple[int, ...] = setting(
        "Process counts to run; the first is the reference of speedup and efficiency.", (1, 2), positive=True
    )
    seq_length: int = setting("Tokens per sequence.", 128, positive=True)
    batch_per_process: int = setting("Sequences per process per step.", 8, positive=True)
    allreduce_rounds: int = setting("Interleaved pairs of DDP steps with and without the all-reduce.", 6, positive=True)
    allreduce_repeats: int = setting("Timed all-reduces per size.", 10, positive=True)
    runs: tuple[str, ...] | None = setting(
        "Runs mode: the run directories holding train_results.json, instead of local jobs.", None
    )


SETTINGS = ScalingSettings


# ---- inside the torchrun job --------------------------------------------------------------------------------------


def slowest_rank(values: list[float]) -> list[float]:
    """Each value's maximum over the ranks: a step or a collective is done when its slowest rank is."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device_of_backend())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor.tolist()


def device_of_backend() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def time_allreduce(numel: int, repeats: int) -> list[float]:
    """Seconds of each of `repeats` all-reduces of `numel` fp32 values across the job, on its slowest rank."""
    device = device_of_backend()
    buffer = torch.ones(numel, device=device)
    dist.all_reduce(buffer)  # the first sets up the connections
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        seconds.append(measure.time_call(lambda: dist.all_reduce(buffer), device))
    return slowest_rank(seconds)


def time_allreduce_in_steps(settings: ScalingSettings, config, model: nn.Module, job) -> dict[str, list[float]]:
    """Seconds of each training step with DDP's all-reduce and of the same step without it (as independent workers
    train), interleaved, each on the slowest rank."""
    steps = {
        name: workload.train_step(
            config,
            "finetuning",
            workload.Variant.parse("baseline"),
            "fp32",
            settings.batch_per_process,
            settings.seq_length,
            job.device,
            model,
            dist=job,
            sync_gradients=sync,
        )
        for name, sync in (("with", True), ("without", False))
    }
    times = measure.time_steps(steps, warmup=1, repeats=settings.allreduce_rounds, device=job.device)
    return {name: slowest_rank(seconds) for name, seconds in times.items()}


def steady_step_seconds(model_dir: str, excluded_steps: int, batch: int) -> list[float]:
    """Seconds of each step after the excluded ones, from the Estimator's log of one-step windows (metrics.jsonl:
    each window's seq/s counts every rank's sequences, `batch` a step, over rank 0's clock)."""
    return [batch / record["seq_per_s"] for record in read_metrics(model_dir) if record["step"] > excluded_steps]


def train_and_time(settings: ScalingSettings, job) -> dict[str, Any]:
    """This process's part of the job: train through the Estimator; on several processes, then time the
    all-reduce inside steps and alone. The raw seconds: the driver makes the figures."""
    config = workload.bert_config(settings.model, settings.seq_length)
    model = workload.build(config, "finetuning", workload.Variant.parse("baseline"), job.device)
    examples = max(settings.batch_per_process * job.world_size * 4, 256)
    features = synthetic.synthetic_batch(config, "finetuning", examples, settings.seq_length, seed=settings.seed)
    batch = global_batch(settings.batch_per_process, 1, job.world_size)
    with tempfile.TemporaryDirectory() as model_dir:
        # A log window per step (metrics.jsonl, written by rank 0): the steps' spread, and their median, which an
        # outlier step does not move as it moves the Estimator's steady figure (a rate over all the steps, kept as
        # steady_seq_per_s). Logging costs each step a scalar all-reduce of the loss and a line of JSON.
        estimator = Estimator(
            model,
            RunConfig(model_dir=model_dir, save_checkpoints_secs=None, log_step_count_steps=1),
            TrainConfig(num_train_steps=settings.warmup + settings.steps, excluded_steps=settings.warmup),
            job,
            log=lambda line: None,
        )
        result = estimator.train(
            ShuffledBatches(
                features, settings.batch_per_process, seed=settings.seed, rank=job.rank, world_size=job.world_size
            )
        )
        # rank 0 logs the windows, and writes the findings
        seconds = steady_step_seconds(model_dir, settings.warmup, batch) if job.is_main else []
    parameters = sum(parameter.numel() for parameter in model.parameters())
    findings = {
        "nodes": job.nodes,
        "processes": job.world_size,
        "global_batch": batch,
        "step_seconds": seconds,
        "steady_seq_per_s": result.steady_sentences_per_second,
        "timed_steps": result.steady_steps,
        "parameters": parameters,
        "backend": dist.get_backend() if job.enabled else None,
        "threads": torch.get_num_threads(),
        "device_type": job.device.type,
    }
    if job.enabled:
        findings["allreduce_in_steps"] = time_allreduce_in_steps(settings, config, model, job)
        sizes = sorted(set(ALLREDUCE_SIZES) | {parameters * 4})
        findings["allreduce"] = {size: time_allreduce(size // 4, settings.allreduce_repeats) for size in sizes}
    return findings


def worker(settings: ScalingSettings, findings_path: str) -> None:
    torch.set_num_threads(settings.threads)
    with job_from_environment(settings.device) as job:
        findings = train_and_time(settings, job)
        if job.is_main:
            with open(findings_path, "w") as handle:
                json.dump(findings, handle)


# ---- the driver: local mode ---------------------------------------------------------------------------------------


def run_job(settings: ScalingSettings, processes: int) -> dict[str, Any]:
    """The findings of one torchrun job of `processes` (train_and_time's), run with the same settings."""
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
            WORKER,
            out,
            *bench_settings.as_argv(settings),
        ]
        env = dict(os.environ, OMP_NUM_THREADS=str(settings.threads))
        started = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise BenchRunFailed(f"the {processes}-process job failed (exit {done.returncode}): {tail}")
        findings = read_json(out)
        rate = Spread.of_rate(findings["global_batch"], findings["step_seconds"])
        print(
            f"  {processes} process(es): {rate.text('.2f')} seq/s ({time.perf_counter() - started:.0f} s with start-up)",
            flush=True,
        )
        return findings


def with_speedup(rows: list[Row]) -> list[Row]:
    """The rows with speedup (seq/s over the first row's) and efficiency (speedup / process ratio): Ratios carrying
    the larger CV of the two rows' seq/s."""
    reference = rows[0]
    with_ratios = []
    for row in rows:
        # the reference over itself is exactly 1, however noisy it was
        speedup = Ratio(1.0, None) if row is reference else Ratio.of(row.value, reference.value)
        scale = row.setting["processes"] / reference.setting["processes"]
        efficiency = dataclasses.replace(speedup, value=speedup.value / scale)
        with_ratios.append(
            dataclasses.replace(row, columns={**row.columns, "speedup": speedup, "efficiency": efficiency})
        )
    return with_ratios


def job_row(settings: ScalingSettings, found: dict[str, Any]) -> Row:
    """A job's figures: the seq/s of its median step, with the spread over its timed steps."""
    return Row(
        "seq_per_s",
        "seq/s",
        {
            "model": settings.model,
            "seq": settings.seq_length,
            "batch_per_process": settings.batch_per_process,
            "nodes": found["nodes"],
            "processes": found["processes"],
        },
        Spread.of_rate(found["global_batch"], found["step_seconds"]),
        {
            "global_batch": found["global_batch"],
            "step_seconds": Spread.of(found["step_seconds"]),
            "steady_seq_per_s": found["steady_seq_per_s"],
            "timed_steps": found["timed_steps"],
            "threads": found["threads"],
            "backend": found["backend"],
            "device_type": found["device_type"],
        },
    )


def allreduce_rows(settings: ScalingSettings, found: dict[str, Any]) -> list[Row]:
    """The all-reduce measured on a job of several processes: exposed inside DDP steps (with minus without, pair by
    pair), then alone at each size with its bus bandwidth."""
    processes = found["processes"]
    on = {"model": settings.model, "processes": processes}
    with_it, without = found["allreduce_in_steps"]["with"], found["allreduce_in_steps"]["without"]
    rows = [
        Row(
            "exposed_allreduce_seconds",
            "s",
            on,
            Spread.of([a - b for a, b in zip(with_it, without)]),
            {"step_with_allreduce_seconds": Spread.of(with_it), "step_without_allreduce_seconds": Spread.of(without)},
        )
    ]
    for size, seconds in found["allreduce"].items():
        timed = Spread.of(seconds)
        bus = int(size) * 2 * (processes - 1) / processes / timed.median
        rows.append(Row("allreduce_seconds", "s", {**on, "size_bytes": int(size)}, timed, {"bus_gb_per_s": bus / 1e9}))
    return rows


COLUMNS = [
    Column("nodes", "nodes", "d"),
    Column("processes", "processes", "d"),
    Column("global batch", "global_batch", "d"),
    Column("time per step (s): median (min–max, CV)", "step_seconds", ".4f"),
    Column("seq/s", "seq_per_s", lambda row: f"{row.median():,.2f}"),
    Column("speedup", "speedup", ".2f"),
    efficiency_column("efficiency", "efficiency"),
]
ALLREDUCE_COLUMNS = [
    Column("size (MiB)", "size_bytes", lambda row: f"{row.get('size_bytes') / 2**20:,.3f}"),
    Column("time (ms): median (min–max, CV)", "allreduce_seconds", lambda row: row.value.scaled(1e3).text(",.3f")),
    Column("bus bandwidth (GB/s)", "bus_gb_per_s", ".3f"),
]


def local_mode(settings: ScalingSettings) -> tuple[list[Row], dict[str, Any], str, list[str | None]]:
    workload.bert_config(settings.model, settings.seq_length)
    check_processes(settings.device, max(settings.processes))
    load = LoadWatch()
    findings = [run_job(settings, processes) for processes in settings.processes]
    rows = with_speedup([job_row(settings, found) for found in findings])
    context = {
        "model": settings.model,
        "seq": settings.seq_length,
        "batch_per_process": settings.batch_per_process,
        "parameters": findings[0]["parameters"],
        "gradient_bytes": findings[0]["parameters"] * 4,
    }
    lines = [
        f"# Scaling: {settings.model}, seq {settings.seq_length}, {settings.batch_per_process} sequences per "
        f"process, {settings.threads} thread(s) per process",
        "",
        table(rows, COLUMNS),
        "",
        f"time per step: median of the {settings.steps} steps after the first {settings.warmup} of each job "
        "(min–max, CV = stdev / mean), on rank 0's clock; seq/s, speedup and efficiency are of the median "
        "step (the Estimator's steady seq/s over the same steps is steady_seq_per_s in the JSON).",
    ]
    largest = max(findings, key=lambda found: found["processes"])
    if "allreduce" in largest:
        exposed, *sizes = allreduce_rows(settings, largest)
        rows += [exposed, *sizes]
        processes = largest["processes"]
        latency, bandwidth = fit_alpha_beta(
            [row.get("size_bytes") for row in sizes], [row.value.median for row in sizes], processes
        )
        context.update(
            latency_seconds=latency,
            bus_bandwidth_bytes_per_s=bandwidth,
            fitted_on_processes=processes,
            backend=largest["backend"],
        )
        with_it, without = (exposed.get(f"step_{part}_allreduce_seconds") for part in ("with", "without"))
        lines += [
            "",
            f"All-reduce on {processes} processes ({largest['backend']}): {exposed.value.median * 1e3:.1f} ms "
            f"exposed per DDP step (median of {settings.allreduce_rounds} interleaved pairs: "
            f"{with_it.median * 1e3:.1f} ms with, {without.median * 1e3:.1f} ms without; exposed per pair "
            f"{exposed.value.min * 1e3:.1f} to {exposed.value.max * 1e3:.1f} ms).",
            "",
            table(sizes, ALLREDUCE_COLUMNS),
            "",
            f"Ring model fitted to the medians (t = 2(P-1) latency + 2(P-1)/P x bytes / bandwidth): "
            f"latency {latency * 1e6:.1f} us, bus bandwidth {bandwidth / 1e9:.3f} GB/s.",
        ]
    measured = rows_of(rows)
    warnings = [load.busy(), *comparability(measured, "processes")]
    if measured[0].get("device_type") == "cpu":
        crowded = [
            row.get("processes") for row in measured if row.get("processes") * row.get("threads") > available_cores()
        ]
        if crowded:
            warnings.append(
                f"the {', '.join(map(str, crowded))}-process job(s) ran more threads (processes x "
                f"{settings.threads} per process) than the {available_cores()} core(s) available: "
                "the processes took turns on the cores, which is not the scaling of a machine with a "
                "core per thread"
            )
    return rows, context, "\n".join(lines), warnings


def rows_of(rows: Sequence[Row]) -> list[Row]:
    """The rows of each process count (or run): seq/s with speedup and efficiency."""
    return [row for row in rows if row.measured == "seq_per_s"]


def comparability(rows: list[Row], name: str) -> list[str | None]:
    """Warnings that the rows (runs) are noisy or not alike, or that efficiency went above 100%; the key `name`
    names a run."""
    flat = [
        {
            **row.setting,
            **{key: row.get(key) for key in ALIKE},
            "step_seconds_cv": row.get("step_seconds").cv,
            "efficiency": row.median("efficiency"),
        }
        for row in rows
    ]

    def describe(row: dict) -> str:
        return f"{row['processes']} processes" + ("" if name == "processes" else f", {row[name]}")

    return [
        noisy_warning([(describe(line), row.get("step_seconds")) for line, row in zip(flat, rows)], "step times"),
        mismatch_warning(flat, ALIKE, name),
        superlinear_warning(flat, "efficiency", describe),
    ]


# ---- the driver: runs mode ----------------------------------------------------------------------------------------


def nodes_of(path: str, results: dict) -> int:
    if "nodes" in results:
        return int(results["nodes"])
    match = re.search(r"_nodes(\d+)", os.path.basename(os.path.normpath(path)))
    return int(match.group(1)) if match else 1


RUNS_COLUMNS = [
    Column("run", "run", ""),
    *COLUMNS[:3],
    Column("time per step (s)", "step_seconds", ".4f"),
    *COLUMNS[4:],
    Column("device", "device", ""),
    Column("threads", "threads", "d"),
]
TRAIN_RESULTS_KEYS = (
    "world_size",
    "train_batch_size",
    "num_accumulation_steps",
    "max_seq_length",
    "steady_sentences_per_second",
)


def runs_mode(settings: ScalingSettings) -> tuple[list[Row], dict[str, Any], str, list[str | None]]:
    rows, shapes = [], set()
    for directory in settings.runs:
        path = os.path.join(directory, run_files.TRAIN_RESULTS)
        if not os.path.exists(path):
            raise workload.BenchError(f"{path}: no such file (not a finished run directory)")
        results = read_json(path)
        for key in TRAIN_RESULTS_KEYS:
            if results.get(key) is None:
                raise workload.BenchError(f"{path}: missing key {key!r} (no steady throughput: too few steps?)")
        per_process = global_batch(results["train_batch_size"], results["num_accumulation_steps"], 1)
        shapes.add((per_process, results["max_seq_length"], results.get("modeling"), results.get("precision")))
        batch = global_batch(results["train_batch_size"], results["num_accumulation_steps"], results["world_size"])
        rate, device = results["steady_sentences_per_second"], results.get("device")
        rows.append(
            Row(
                "seq_per_s",
                "seq/s",
                {
                    "model": "runs",
                    "seq": results["max_seq_length"],
                    "batch_per_process": per_process,
                    "run": directory,
                    "nodes": nodes_of(directory, results),
                    "processes": results["world_size"],
                },
                Spread.exact(rate),
                {
                    "global_batch": batch,
                    "step_seconds": Spread.exact(batch / rate),
                    "device": device,
                    "device_type": device.split(":")[0] if device else None,
                    # CPU threads of each process, where the run recorded them
                    "threads": results.get("threads"),
                },
            )
        )
    if len(shapes) > 1:
        raise workload.BenchError(
            "the runs differ in batch per process, sequence length, modeling or precision: "
            + "; ".join(map(str, sorted(shapes, key=str)))
        )
    rows = with_speedup(sorted(rows, key=lambda row: (row.setting["processes"], row.setting["nodes"])))
    batch_per_process, seq, _, _ = shapes.pop()
    text = "\n".join(
        [
            f"# Scaling: runs of the job templates, seq {seq}, {batch_per_process} sequences per process",
            "",
            table(rows, RUNS_COLUMNS),
            "",
            "Each run's steady seq/s from its train_results.json: one figure per run, no spread; threads: "
            "as the run recorded them (– where it did not).",
        ]
    )
    context = {"model": "runs", "seq": seq, "batch_per_process": batch_per_process}
    return rows, context, text, comparability(rows, "run")


def plots(rows: Sequence[Row], context: dict[str, Any]) -> dict:
    rows = rows_of(rows)
    setting = f"{context['model']}, seq {context['seq']}, {context['batch_per_process']} sequences per process"
    processes = [row.get("processes") for row in rows]
    ideal = [rows[0].median() * count / processes[0] for count in processes]
    rates = [row.value for row in rows]
    throughput = (
        processes,
        [rate.median for rate in rates],
        [rate.min for rate in rates],
        [rate.max for rate in rates],
    )
    return {
        "efficiency": line_plot(
            {"measured": (processes, [row.median("efficiency") for row in rows])},
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


def run(settings: ScalingSettings, argv: list[str]) -> None:
    output = BenchOutput(settings.directory, "scaling", argv, settings.overwrite)
    rows, context, text, warnings = runs_mode(settings) if settings.runs else local_mode(settings)
    for message in warnings:
        output.warn(message)
    markdown = "\n\n".join(filter(None, (text, noisy_ratios_note(rows))))
    output.write_result(settings, rows, context, markdown, plots(rows, context))
    print(with_warnings(markdown, output.warnings))
    print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")


def with_runs_joined(argv: Sequence[str]) -> list[str]:
    """`argv` with `--runs A B C` (a shell wildcard's expansion, as the job templates' docs use) as --runs=A,B,C:
    the directories given, until the next flag."""
    argv, joined = list(argv), []
    while argv:
        arg = argv.pop(0)
        if arg == "--runs" and argv:
            directories = []
            while argv and not argv[0].startswith("--"):
                directories.append(argv.pop(0))
            arg = f"--runs={','.join(directories)}" if directories else arg
        joined.append(arg)
    return joined


_main = bench_settings.main_for(ScalingSettings, description(__doc__), run)


def main(argv: Sequence[str] | None = None) -> int:
    return _main(with_runs_joined(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if arguments[:1] == [WORKER]:  # one process of a torchrun job (run_job)
        worker(bench_settings.parse(ScalingSettings, arguments[2:], description(__doc__)), arguments[1])
        sys.exit(0)
    sys.exit(main(arguments))
