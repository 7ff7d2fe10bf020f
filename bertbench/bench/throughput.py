"""`bertbench bench throughput`: training-step speed over batch sizes, sequence lengths, variants and precisions.

For each step kind, sequence length and precision, every variant's step is timed at each batch size, the variants
interleaved (A B C, C B A, ...) so that the machine's drift hits them alike; warm-up steps are left out. Each row
reports sequences/s, tokens/s, the model TFLOP/s achieved (FLOPs per sequence from the config, see
bertbench.model.flops) and MFU against the device's peak: the data sheet's on a known GPU, the measured matmul
FLOP/s on a CPU. Memory is measured on one extra step per variant, alone: the CUDA allocator's peak on a GPU; on the
CPU, the bytes the forward saves for backward (exact, by autograd's hooks) and the process's peak resident set.

With --lengths real-text (or a file of lengths) the batches have real text's lengths, padded to the sequence length
as a data set's are: each setting's timed steps go round a seeded cycle of batches drawn from the distribution, the
same examples for every variant. The bertbench variants run them on the unpadded path, as runs do, or with /padded on
the padded path ("baseline/padded", Google's: every sequence computed at the sequence length); each row adds the real
tokens/s (padding left out) and the padding share, and its model FLOPs count each sequence at its real length, so
that no path is credited with work on padding.

The variants `hf` and `hf-dynamic` are HF transformers' BERT with the baseline's weights, trained by the same step
(optimizer, clipping, precision): the reference bertbench's speed is compared against, interleaved with it, on the
same examples. `hf` is fed each batch padded to the sequence length (run_glue.py's default, pad_to_max_length),
`hf-dynamic` each batch cut to its longest sequence (the Trainer's DataCollatorWithPadding). Their MFU counts the same
model FLOPs as the others (the work the step has to do), so what HF spends beyond them (padding, its MLM logits at
every position in pre-training) shows as a lower MFU.

    bertbench bench throughput --model base --seq_lengths 128,512 --batch_sizes 1,2,4,8
    bertbench bench throughput --model tiny --batch_sizes 8,32 --steps 3        # a quick look
    bertbench bench throughput --kinds finetuning --batch_sizes 8 --variants baseline,hf   # bertbench vs HF
    bertbench bench throughput --model base --kinds finetuning --batch_sizes 8 --lengths real-text \
        --variants baseline,baseline/padded,hf,hf-dynamic      # unpadded vs padded vs HF's two paddings, real lengths
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import torch

from bertbench.bench import cli, measure, workload
from bertbench.bench.output import BenchOutput, markdown_table, spread_column
from bertbench.bench.plots import line_plot
from bertbench.common.flags import parse_bool
from bertbench.common.noise import LoadWatch, noisy_warning, rate_spread, spread, spread_fields, spread_text
from bertbench.model import flops
from bertbench.model.precision import PRECISION_DTYPES
from bertbench.model.saved_activations import saved_activation_bytes
from bertbench.tasks import synthetic
from bertbench.training import devices, optim
from bertbench.training.batches import ShuffledBatches
from bertbench.training.config import RunConfig
from bertbench.training.distributed import Distributed
from bertbench.training.loop import Estimator


def columns(padded: bool, gpu: bool, compiled: bool = False) -> list[tuple]:
    """The table's columns; on batches with padding, the path each variant ran, and the real tokens/s and the
    padding share in place of tokens/s (which count the padding); on a GPU, the host's share of the step time and
    the CUDA graphs' bucket filler; with compiled variants, the seconds compiling added to the first step."""
    path = [("path", "path", "")] if padded else []
    tokens = (
        [("real tokens/s", "real_tokens_per_s", ",.0f"), ("padding", "padding_share", ".1%")]
        if padded
        else [("tokens/s", "tokens_per_s", ",.0f")]
    )
    host = [("host / step", "host_share", ".0%"), ("graphs", "graphs_text", "")] if gpu else []
    return [
        ("kind", "kind", ""),
        ("seq", "seq", "d"),
        ("precision", "precision", ""),
        ("variant", "variant", ""),
        *path,
        ("batch", "batch", "d"),
        spread_column("step (s): median (min–max, CV)", "step_seconds", ".4f"),
        ("seq/s", "seq_per_s", ".2f"),
        ("vs first variant", "speed_vs_first_variant", ".3f"),
        *tokens,
        ("TFLOP/s", "model_tflops_per_s", ".3f"),
        ("MFU", "mfu", ".1%"),
        *host,
        *([("compile (s)", "compile_seconds", ".1f")] if compiled else []),
        ("saved for backward (MiB)", "saved_mib", ",.1f"),
        ("step memory (MiB)", "step_memory_mib", ",.0f"),
    ]


def graphs_text(row: dict) -> str:
    """The CUDA graphs a row's step replayed, with the share of bucket filler in its packed rows, or why none."""
    graphs = row.get("cuda_graphs")
    if not graphs:
        return "off"
    filler = f", {graphs['bucket_filler_share']:.1%} filler" if graphs["bucket_rows"] else ""
    return f"{graphs['graphs']}{filler}"


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser_for("throughput", __doc__.splitlines()[0])
    sweep = parser.add_argument_group("sweep")
    cli.add_model_flag(sweep)
    sweep.add_argument(
        "--kinds",
        type=cli.comma_list(str),
        default=["pretraining", "finetuning"],
        help="Step kinds: pretraining (MLM on 15%% of positions + NSP) and finetuning (classification).",
    )
    sweep.add_argument(
        "--variants",
        type=cli.comma_list(str),
        default=list(workload.ALL_VARIANTS),
        help="baseline, full, selective, every-K, on the unpadded path as runs train (batches with "
        "padding run on their real tokens only), or with /padded on the padded path "
        "(baseline/padded: every sequence computed at the sequence length, as Google's code), or "
        "with /KERNEL on the unpadded path with that attention kernel (baseline/masked); "
        "hf and hf-dynamic: HF transformers' BERT, same weights and step (needs transformers), "
        "fed each batch padded to the sequence length (run_glue.py's default) or cut to its "
        "longest sequence (the Trainer's dynamic padding). A bertbench variant with +compile "
        "(baseline+compile) is its step under torch.compile, timed interleaved with the eager "
        "ones; its row gives the seconds compiling added to the first step.",
    )
    sweep.add_argument(
        "--precisions",
        type=cli.comma_list(str),
        default=["fp32"],
        help="fp32, bf16 (autocast), fp16 (autocast + loss scaling).",
    )
    sweep.add_argument(
        "--batch_sizes", type=cli.comma_list(cli.positive_int), default=[1, 2, 4, 8], help="Sequences per step."
    )
    sweep.add_argument(
        "--seq_lengths",
        type=cli.comma_list(cli.positive_int),
        default=[128],
        help="Tokens per sequence (padding included).",
    )
    sweep.add_argument(
        "--lengths",
        default="full",
        help="The real lengths of the sequences ([CLS] and [SEP] counted): full (every sequence at "
        "the sequence length, no padding); real-text (built in: 489 sentence pairs of English "
        "prose, WordPiece-tokenized, mean 64.2, an eighth of them cut at 128); or a file of "
        "lengths, integers of 2 or more separated by spaces or newlines, # starting a comment. "
        "A length above a setting's sequence length is cut to it, as Google's truncation keeps a "
        "pair within max_seq_length. Each setting's timed steps go round a seeded cycle of "
        "batches drawn from it: every variant trains the same examples.",
    )
    timing = parser.add_argument_group("timing")
    timing.add_argument("--warmup", type=int, default=2, help="Untimed steps per setting (start-up, allocator).")
    timing.add_argument(
        "--steps",
        type=cli.positive_int,
        default=5,
        help="Timed steps per setting; the median is reported, with min and max.",
    )
    timing.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: CUDA when available).")
    timing.add_argument(
        "--threads", type=cli.positive_int, default=None, help="CPU threads (torch default: all cores)."
    )
    timing.add_argument("--no_memory", action="store_true", help="Skip the memory step of each setting.")
    recipe = parser.add_argument_group("the training step (the training defaults unless changed)")
    recipe.add_argument("--optimizer", default="adamw", choices=optim.OPTIMIZERS, help="Optimizer of the step.")
    recipe.add_argument(
        "--gradient_accumulation_steps",
        type=cli.positive_int,
        default=1,
        help="Micro-batches (each of the batch size) per optimizer step.",
    )
    recipe.add_argument("--max_grad_norm", type=float, default=1.0, help="Global-norm clipping; 0 turns it off.")
    recipe.add_argument("--compile", action="store_true", help="torch.compile the step's forward and backward.")
    recipe.add_argument(
        "--cuda_graphs",
        type=parse_bool,
        default=True,
        metavar="BOOL",
        help="On a GPU, replay each micro-batch's forward and backward from CUDA graphs where the "
        "step can, as runs train (--cuda_graphs false: every kernel launched from the host).",
    )
    recipe.add_argument(
        "--with_trainer",
        action="store_true",
        help="Also train each setting through the Estimator (the loop users run: data stream, "
        "logging, save checks) for --trainer_rounds rounds interleaved with the bench's "
        "rounds, and report its steady seq/s beside the bench's, with the spread of both.",
    )
    recipe.add_argument(
        "--trainer_rounds", type=cli.positive_int, default=3, help="Rounds of the --with_trainer comparison."
    )
    return parser


def recipe(args: argparse.Namespace, variant: workload.Variant | None = None) -> dict:
    """The TrainConfig fields the flags (and a "+compile" variant) change: the step the bench times is the training
    step with these."""
    return {
        "optimizer": args.optimizer,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "max_grad_norm": args.max_grad_norm or None,
        "compile": compiled(args, variant),
        "cuda_graphs": args.cuda_graphs,
    }


def compiled(args: argparse.Namespace, variant: workload.Variant | None) -> bool:
    return args.compile or (variant is not None and variant.compiled)


def first_calls(steps: dict[str, workload.BenchStep], device: torch.device) -> dict[str, float]:
    """Each step's first call, timed on the wall clock: it pays once what a run pays at its start (torch.compile's
    compilation, the first CUDA graph capture, the allocator's first requests). It counts as a warm-up step."""
    seconds = {}
    for name, step in steps.items():
        devices.synchronize(device)
        started = time.perf_counter()
        step()
        devices.synchronize(device)
        seconds[name] = time.perf_counter() - started
    return seconds


def check_settings(args: argparse.Namespace) -> tuple[list[workload.Variant], workload.Lengths]:
    for kind in args.kinds:
        if kind not in workload.STEP_KINDS:
            raise workload.BenchError(f"unknown kind {kind!r}: use {' or '.join(workload.STEP_KINDS)}")
    for precision in args.precisions:
        if precision not in workload.PRECISIONS:
            raise workload.BenchError(f"unknown precision {precision!r}: use {', '.join(workload.PRECISIONS)}")
    if args.warmup < 0:
        raise workload.BenchError(f"--warmup must be 0 or more, got {args.warmup}")
    variants = [workload.Variant.parse(name, hf=True, compiled=True) for name in args.variants]
    if args.with_trainer and any(variant.cut_to_longest for variant in variants):
        raise workload.BenchError(
            "--with_trainer does not take hf-dynamic: the trainer's loop feeds every batch at the sequence length"
        )
    return variants, workload.Lengths.parse(args.lengths)


def measure_memory(step: workload.BenchStep) -> dict:
    """Saved-for-backward bytes, and the memory one step run alone adds at its peak to what was resident before it
    (weights, optimizer state, and the other variants' models, which the sweep keeps): activations, gradients,
    temporaries. Not for a step that replays CUDA graphs: their memory pool was taken at the capture, and a step
    adds nothing to it (--cuda_graphs false measures the same step's memory, launched from the host)."""
    device = step.device
    if step.step.graphs is not None:
        return {"memory_kind": "not measured: CUDA graphs (their pool was allocated at capture)"}
    step.position = 0  # every variant's memory step on the same examples, the cycle's first
    saved = saved_activation_bytes(step.forward, step.model)[1]  # the graph goes before the step runs
    devices.synchronize(device)
    devices.reset_peak_memory(device)
    before = devices.current_memory_bytes(device)
    step()
    devices.synchronize(device)
    peak = devices.peak_memory_bytes(device)
    return {
        "saved_bytes": saved,
        "peak_memory_bytes": peak,
        "step_memory_bytes": peak - before,
        "memory_kind": "CUDA allocated" if device.type == "cuda" else "process RSS",
    }


def sweep(
    args: argparse.Namespace,
    variants: Sequence[workload.Variant],
    lengths: workload.Lengths,
    device: torch.device,
    peaks: dict[str, tuple[float, str]],
) -> list[dict]:
    rows = []
    for kind in args.kinds:
        for seq in args.seq_lengths:
            config = workload.bert_config(args.model, seq)
            models = {variant.name: workload.build(config, kind, variant, device) for variant in variants}
            for precision in args.precisions:
                out_of_memory: set[str] = set()
                for batch in args.batch_sizes:
                    live = [variant for variant in variants if variant.name not in out_of_memory]
                    steps = {
                        variant.name: workload.train_step(
                            config,
                            kind,
                            variant,
                            precision,
                            batch,
                            seq,
                            device,
                            models[variant.name],
                            lengths=lengths,
                            steps=args.steps,
                            **recipe(args, variant),
                        )
                        for variant in live
                    }
                    host_times: dict[str, list[float]] = {}
                    first_call: dict[str, float] = {}
                    try:
                        if args.warmup:
                            first_call = first_calls(steps, device)
                        for step in steps.values():
                            step.capture_graphs()
                        times = measure.time_steps(steps, max(0, args.warmup - 1), args.steps, device, host_times)
                    except torch.cuda.OutOfMemoryError:
                        times = time_each_alone(steps, args, device, out_of_memory)
                    # the ratios' reference: the first variant listed that fit (seq/s over its seq/s)
                    first = next((variant.name for variant in live if variant.name not in out_of_memory), None)
                    setting = dict(
                        model=args.model, kind=kind, seq=seq, precision=precision, lengths=lengths.name, batch=batch
                    )
                    for variant in live:
                        if variant.name in out_of_memory:
                            rows.append(dict(setting, variant=variant.name, out_of_memory=True))
                            continue
                        step = steps[variant.name]
                        row = figures(times[variant.name], step, config, kind, seq, peaks[precision][0])
                        row["speed_vs_first_variant"] = statistics.median(times[first]) / row["step_seconds"]
                        if host_times.get(variant.name):
                            row["host_seconds"] = statistics.median(host_times[variant.name])
                            row["host_share"] = row["host_seconds"] / row["step_seconds"]
                        row.update(step.step.execution())
                        if variant.name in first_call:
                            row["first_step_seconds"] = first_call[variant.name]
                            if compiled(args, variant):  # what compiling added to the first step
                                row["compile_seconds"] = max(0.0, first_call[variant.name] - row["step_seconds"])
                        if not args.no_memory:
                            row.update(measure_memory(step))
                        path, reason = variant.path(step.model, device, precision, compiled(args, variant))
                        rows.append(
                            dict(
                                setting, variant=variant.name, path=path, path_reason=reason, out_of_memory=False, **row
                            )
                        )
                        print(
                            f"  {kind} seq {seq} {precision} {variant.name:<16} batch {batch:>4}: "
                            f"{spread_text(row, 'seq_per_s', '.2f')} seq/s  "
                            f"{row['real_tokens_per_s']:,.0f} real tokens/s  MFU {row['mfu']:.1%}",
                            flush=True,
                        )
                    for step in steps.values():
                        step.optimizer.state.clear()  # two fp32 copies of the weights, not needed any more
                    del steps
            del models
    return rows


TRAINER_COLUMNS = [
    ("kind", "kind", ""),
    ("seq", "seq", "d"),
    ("precision", "precision", ""),
    ("variant", "variant", ""),
    ("batch", "batch", "d"),
    spread_column("bench seq/s", "bench_seq_per_s", ".2f"),
    spread_column("trainer seq/s", "trainer_seq_per_s", ".2f"),
    ("trainer / bench", "trainer_over_bench", ".3f"),
]


def bench_vs_trainer(
    args: argparse.Namespace,
    config,
    kind: str,
    variant: workload.Variant,
    precision: str,
    batch: int,
    seq: int,
    lengths: workload.Lengths,
    device: torch.device,
) -> dict:
    """The bench's seq/s and the Estimator's steady seq/s on one setting, in alternating rounds (bench, trainer,
    trainer, bench, ...), each round on a freshly built model: the bench times --steps steps after --warmup; the
    trainer trains --warmup + --steps steps on a shuffled stream of synthetic examples of the same shape and lengths
    (drawn from the same distribution) and reports its steady figure (the first --warmup steps and the checkpoint
    save left out). Each round's figure is sequences over the summed step time, so both are rates over the same
    steps."""
    train = recipe(args, variant)
    features = synthetic.synthetic_batch(config, kind, batch * 8, seq, seed=1, lengths=lengths.draw(batch * 8, seq))

    def bench_round() -> float:
        step = workload.train_step(
            config, kind, variant, precision, batch, seq, device, lengths=lengths, steps=args.steps, **train
        )
        seconds = measure.time_steps({"step": step}, args.warmup, args.steps, device)["step"]
        return step.sequences * len(seconds) / sum(seconds)

    def trainer_round() -> float:
        model = workload.build(config, kind, variant, device)
        train_config = dataclasses.replace(
            workload.train_config(precision, **train),
            num_train_steps=args.warmup + args.steps,
            excluded_steps=args.warmup,
        )
        with tempfile.TemporaryDirectory() as model_dir:
            estimator = Estimator(
                model,
                RunConfig(model_dir=model_dir, save_checkpoints_secs=None, log_step_count_steps=10**9),
                train_config,
                Distributed(device=device),
                log=lambda line: None,
            )
            result = estimator.train(ShuffledBatches(features, batch, seed=0))
        return result.steady_sentences_per_second

    rates: dict[str, list[float]] = {"bench": [], "trainer": []}
    for round_index in range(args.trainer_rounds):
        order = (("bench", bench_round), ("trainer", trainer_round))
        for name, measure_round in order if round_index % 2 == 0 else reversed(order):
            rates[name].append(measure_round())
    row = {"kind": kind, "seq": seq, "precision": precision, "variant": variant.name, "batch": batch}
    for name, values in rates.items():
        row.update(
            {
                **spread_fields(f"{name}_seq_per_s", spread(values)),
                f"{name}_rounds": values,
                f"{name}_range": f"{min(values):.2f}-{max(values):.2f}",
            }
        )
    row["trainer_over_bench"] = row["trainer_seq_per_s"] / row["bench_seq_per_s"]
    print(
        f"  trainer vs bench, {kind} seq {seq} {precision} {variant.name} batch {batch}: "
        f"{row['trainer_seq_per_s']:.2f} vs {row['bench_seq_per_s']:.2f} seq/s",
        flush=True,
    )
    return row


def time_each_alone(steps: dict, args: argparse.Namespace, device: torch.device, out_of_memory: set[str]) -> dict:
    """After a GPU ran out of memory with the variants interleaved: time each variant on its own, marking those
    that do not fit at this batch (larger batches of them are skipped)."""
    times = {}
    for name, step in steps.items():
        step.optimizer.state.clear()
        torch.cuda.empty_cache()
        try:
            times.update(measure.time_steps({name: step}, args.warmup, args.steps, device))
        except torch.cuda.OutOfMemoryError:
            out_of_memory.add(name)
            step.optimizer.state.clear()
            torch.cuda.empty_cache()
    return times


def figures(seconds: list[float], step: workload.BenchStep, config, kind: str, seq: int, peak: float) -> dict:
    """Figures of one setting from its step times. Each is the median with its spread over the timed steps
    (noise.spread_fields); the amounts per step are the means over the step's cycle of batches, which the timed
    steps go round whole. Model FLOPs count each sequence at its real length (flops.train_flops): what the step has
    to do, whatever its path computes on the padding."""
    sequences = step.sequences
    real_tokens = step.per_step(lambda length: length)
    flops_per_step = step.per_step(
        lambda length: flops.train_flops(
            config, kind, length, synthetic.masked_positions(length) if kind == "pretraining" else 0
        )
    )
    return {
        **spread_fields("step_seconds", spread(seconds)),
        "timed_steps": len(seconds),
        "sequences_per_step": sequences,
        **spread_fields("seq_per_s", rate_spread(sequences, seconds)),
        **spread_fields("tokens_per_s", rate_spread(sequences * seq, seconds)),
        "real_tokens_per_step": real_tokens,
        **spread_fields("real_tokens_per_s", rate_spread(real_tokens, seconds)),
        "padding_share": 1 - real_tokens / (sequences * seq),
        "model_flops_per_step": flops_per_step,
        **spread_fields("model_tflops_per_s", rate_spread(flops_per_step / 1e12, seconds)),
        **spread_fields("mfu", rate_spread(flops_per_step / peak, seconds)),
    }


def device_peaks(precisions: Sequence[str], device: torch.device) -> dict[str, tuple[float, str]]:
    """Each precision's peak FLOP/s and its source; the matmul is measured only where no data sheet applies."""
    peaks = {}
    for precision in precisions:
        try:
            peaks[precision] = devices.peak_flops(device, precision)
        except ValueError:
            dtype = PRECISION_DTYPES[precision]
            size = 4096 if device.type == "cuda" else 2048
            measured = measure.matmul_flops_per_second(size, dtype, str(device))
            peaks[precision] = devices.peak_flops(device, precision, measured)
    return peaks


def describe(row: dict) -> str:
    return f"{row['kind']} seq {row['seq']} {row['precision']} {row['variant']} batch {row['batch']}"


def warnings(rows: list[dict], compared: list[dict]) -> list[str | None]:
    """What makes the figures doubtful: noisy settings, and an MFU above 100% (a peak measured under load)."""
    done = [row for row in rows if not row["out_of_memory"]]
    impossible = [row for row in done if row["mfu"] > 1]
    return [
        noisy_warning(done, "step_seconds", describe, "step times"),
        noisy_warning(compared, "bench_seq_per_s", describe, "bench rounds"),
        noisy_warning(compared, "trainer_seq_per_s", describe, "trainer rounds"),
        f"MFU above 100% in {len(impossible)} row(s) (up to {max(row['mfu'] for row in impossible):.0%}): the "
        "peak was measured at the start while the machine was busier than during the steps (another job, "
        "frequency scaling), so MFU here is not a share of what the device can do. Run again on an idle "
        "machine."
        if impossible
        else None,
    ]


def markdown(
    rows: list[dict], peaks: dict, model: str, device: torch.device, compared: list[dict], lengths: workload.Lengths
) -> str:
    done = [
        dict(
            row,
            saved_mib=row.get("saved_bytes", 0) / 2**20 if "saved_bytes" in row else None,
            step_memory_mib=row["step_memory_bytes"] / 2**20 if "step_memory_bytes" in row else None,
            graphs_text=graphs_text(row),
        )
        for row in rows
        if not row["out_of_memory"]
    ]
    lines = [f"# Throughput: {model} on {device}", ""]
    lines += [
        f"- peak {precision}: {peak / 1e12:.3f} TFLOP/s ({source})" for precision, (peak, source) in peaks.items()
    ]
    lines += [
        "",
        lengths_line(lengths, sorted({row["seq"] for row in rows})),
        "",
        markdown_table(
            done, columns(not lengths.full, device.type == "cuda", any("compile_seconds" in row for row in done))
        ),
        "",
        "step: median of the timed steps (min–max, CV = stdev / mean); the other figures are of the median "
        "step (the JSON has the spread of each). step memory: what one step adds, at its peak, to the memory "
        "resident before it (CUDA allocator on a GPU, process RSS on the CPU): activations, gradients, "
        "temporaries"
        + (
            "."
            if lengths.full
            else ", on the cycle's first batch. path: what the variant "
            "runs batches with padding on (the unpadded path runs one with little padding "
            "padded, where that is faster). real tokens/s leaves the padding out; padding: its "
            "share of the batches' sequence-length slots, what the padded path computes in vain "
            "(hf-dynamic only up to each batch's longest sequence). TFLOP/s and MFU count each "
            "sequence's model FLOPs at its real length, for every path."
        ),
    ]
    if device.type == "cuda":
        lines += [
            "",
            "host / step: the time the host took to issue a step, over the step's time on the GPU's clock "
            "(under 100%, the GPU sets the pace). graphs: the CUDA graphs the step replayed its micro-"
            "batches from, and the share of the packed rows that were bucket filler (off: no graphs; the "
            "JSON says why).",
        ]
    if any("compile_seconds" in row for row in done):
        lines += [
            "",
            "compile (s): the first step's wall time less the median step's, what torch.compile added to "
            "the run's start (with `+compile`, or --compile). Inductor keeps what it compiled in its "
            "cache (TORCHINDUCTOR_CACHE_DIR, default under /tmp), so a later run on the same node "
            "compiles faster: point it at shared storage on a cluster.",
        ]
    reasons = {(row["variant"], row["path"]): row["path_reason"] for row in done if row.get("path_reason")}
    if not lengths.full and reasons:
        lines += [
            "",
            "Why each path: "
            + "; ".join(f"{variant} ({path}): {reason}" for (variant, path), reason in reasons.items()),
        ]
    if compared:
        lines += [
            "",
            "## The bench's step and the trainer's loop",
            "",
            "Seq/s of the bench's step and the Estimator's steady seq/s on the same setting, in alternating "
            "rounds (median, range and CV over the rounds).",
            "",
            markdown_table(compared, TRAINER_COLUMNS),
        ]
    skipped = [row for row in rows if row["out_of_memory"]]
    if skipped:
        lines += [
            "",
            "Out of memory: "
            + ", ".join(
                f"{row['variant']} {row['kind']} seq {row['seq']} {row['precision']} batch {row['batch']}"
                for row in skipped
            ),
        ]
    return "\n".join(lines)


def lengths_line(lengths: workload.Lengths, seq_lengths: Sequence[int]) -> str:
    """The distribution that ran, for the markdown."""
    if lengths.full:
        return "- sequence lengths: full (every sequence at the sequence length, no padding)"
    summary = lengths.summary()
    origin = "built in, sentence pairs of English prose" if lengths.name == "real-text" else "file"
    cut = [
        f"{sum(length > seq for length in lengths.values) / summary['count']:.1%} cut to seq {seq}"
        for seq in seq_lengths
        if seq < summary["longest"]
    ]
    return (
        f"- sequence lengths: {lengths.name} ({origin}): {summary['count']} lengths, mean "
        f"{summary['mean']:.1f}, median {summary['median']:g}, {summary['share_at_longest']:.1%} at the longest "
        f"({summary['longest']})" + "".join(f"; {text}" for text in cut)
    )


def plots(rows: list[dict]) -> dict:
    """Per kind, sequence length and precision: seq/s vs batch and memory vs batch, a line per variant."""
    result = {}
    groups = sorted({(row["kind"], row["seq"], row["precision"]) for row in rows})
    for kind, seq, precision in groups:
        group = [
            row
            for row in rows
            if (row["kind"], row["seq"], row["precision"]) == (kind, seq, precision) and not row["out_of_memory"]
        ]
        variants = list(dict.fromkeys(row["variant"] for row in group))
        title = f"{rows[0]['model']}, {kind}, seq {seq}, {precision}"
        speed = {
            variant: tuple(
                [row[key] for row in group if row["variant"] == variant]
                for key in ("batch", "seq_per_s", "seq_per_s_min", "seq_per_s_max")
            )
            for variant in variants
        }
        result[f"{kind}-seq{seq}-{precision}"] = line_plot(speed, "batch size", "sequences / s", title, log_x=True)
        measured = [row for row in group if "saved_bytes" in row]
        if measured:
            key, label = (
                ("step_memory_bytes", "CUDA memory a step adds (GiB)")
                if measured[0]["memory_kind"] == "CUDA allocated"
                else ("saved_bytes", "saved for backward (GiB)")
            )
            memory = {
                variant: (
                    [row["batch"] for row in measured if row["variant"] == variant],
                    [row[key] / 2**30 for row in measured if row["variant"] == variant],
                )
                for variant in dict.fromkeys(row["variant"] for row in measured)
            }
            result[f"{kind}-seq{seq}-{precision}-memory"] = line_plot(memory, "batch size", label, title, log_x=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        variants, lengths = check_settings(args)
        workload.bert_config(args.model, max(args.seq_lengths))  # a bad --model fails before anything runs
        output = BenchOutput(cli.output_dir(args, "throughput"), "throughput", argv, args.overwrite)
        if args.threads:
            torch.set_num_threads(args.threads)
        device = cli.device(args.device)
        any_compiled = args.compile or any(variant.compiled for variant in variants)
        for precision in args.precisions:  # before the peaks are measured (a CPU's fp16 matmul takes minutes)
            workload.check_runnable(workload.train_config(precision, compile=any_compiled), device)
        load = LoadWatch()
        peaks = device_peaks(args.precisions, device)
        rows = sweep(args, variants, lengths, device, peaks)
        compared = (
            [
                bench_vs_trainer(
                    args, workload.bert_config(args.model, seq), kind, variant, precision, batch, seq, lengths, device
                )
                for kind in args.kinds
                for seq in args.seq_lengths
                for precision in args.precisions
                for variant in variants
                for batch in args.batch_sizes
            ]
            if args.with_trainer
            else []
        )
        for message in [load.busy(), *warnings(rows, compared)]:
            output.warn(message)
        text = markdown(rows, peaks, args.model, device, compared, lengths)
        print(
            output.write(
                vars(args),
                {
                    "device": str(device),
                    "peaks": {
                        precision: {"flops_per_s": peak, "source": source}
                        for precision, (peak, source) in peaks.items()
                    },
                    "training_step": recipe(args),
                    "lengths": lengths.summary(),
                    "rows": rows,
                    "trainer_comparison": compared,
                },
                text,
                plots(rows),
            )
        )
        print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")

    return cli.run("bertbench bench throughput", body)
