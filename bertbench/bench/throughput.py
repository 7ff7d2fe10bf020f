"""`bertbench bench throughput`: training-step speed over batch sizes, sequence lengths, variants and precisions.

For each step kind, sequence length and precision, every variant's step is timed at each batch size, the variants
interleaved (A B C, C B A, ...) so that the machine's drift hits them alike; warm-up steps are left out. Each row
(results.Row, measured "seq_per_s") gives sequences/s with its spread, and tokens/s, the model TFLOP/s achieved
(FLOPs per sequence from the config, see bertbench.model.flops) and MFU against the device's peak: the data sheet's on
a known GPU, the measured matmul FLOP/s on a CPU. Memory is measured on one extra step per variant, alone: the CUDA
allocator's peak on a GPU; on the CPU, the bytes the forward saves for backward (exact, by autograd's hooks) and the
process's peak resident set.

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

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from bertbench.bench import measure, workload
from bertbench.bench.output import BenchOutput
from bertbench.bench.plots import line_plot
from bertbench.bench.results import Column, Ratio, Row, Spread, noisy_ratios_note, noisy_rows, table
from bertbench.bench.settings import MeasuredSettings, main_for, model_setting, precisions_setting
from bertbench.common.flags import setting
from bertbench.common.noise import LoadWatch
from bertbench.model import flops
from bertbench.model.config import BertConfig
from bertbench.model.precision import PRECISIONS, precision_dtype
from bertbench.model.saved_activations import saved_activation_bytes
from bertbench.tasks import synthetic
from bertbench.training import devices, optim
from bertbench.training.batches import ShuffledBatches
from bertbench.training.config import RunConfig
from bertbench.training.distributed import Distributed
from bertbench.training.loop import Estimator


@dataclasses.dataclass(frozen=True)
class ThroughputSettings(MeasuredSettings):
    """The sweep and the training step (the training defaults unless changed)."""

    bench: ClassVar[str] = "throughput"

    model: str = model_setting()
    kinds: tuple[str, ...] = setting(
        "Step kinds: pretraining (MLM on 15%% of positions + NSP) and finetuning (classification).",
        workload.STEP_KINDS,
    )
    variants: tuple[str, ...] = setting(
        "baseline, full, selective, every-K, on the unpadded path as runs train (batches with padding run on their "
        "real tokens only), or with /padded on the padded path (baseline/padded: every sequence computed at the "
        "sequence length, as Google's code), or with /KERNEL on the unpadded path with that attention kernel "
        "(baseline/masked); hf and hf-dynamic: HF transformers' BERT, same weights and step (needs transformers), "
        "fed each batch padded to the sequence length (run_glue.py's default) or cut to its longest sequence (the "
        "Trainer's dynamic padding). A bertbench variant with +compile (baseline+compile) is its step under "
        "torch.compile, timed interleaved with the eager ones; its row gives the seconds compiling added to the "
        "first step.",
        workload.ALL_VARIANTS,
    )
    precisions: tuple[str, ...] = precisions_setting()
    batch_sizes: tuple[int, ...] = setting("Sequences per step.", (1, 2, 4, 8), positive=True)
    seq_lengths: tuple[int, ...] = setting("Tokens per sequence (padding included).", (128,), positive=True)
    lengths: str = setting(
        "The real lengths of the sequences ([CLS] and [SEP] counted): full (every sequence at the sequence length, "
        "no padding); real-text (built in: 489 sentence pairs of English prose, WordPiece-tokenized, mean 64.2, an "
        "eighth of them cut at 128); or a file of lengths, integers of 2 or more separated by spaces or newlines, "
        "# starting a comment. A length above a setting's sequence length is cut to it, as Google's truncation "
        "keeps a pair within max_seq_length. Each setting's timed steps go round a seeded cycle of batches drawn "
        "from it: every variant trains the same examples.",
        "full",
    )
    no_memory: bool = setting("Skip the memory step of each setting.", False)
    optimizer: str = setting("Optimizer of the step.", "adamw", choices=optim.OPTIMIZERS)
    gradient_accumulation_steps: int = setting(
        "Micro-batches (each of the batch size) per optimizer step.", 1, positive=True
    )
    max_grad_norm: float = setting("Global-norm clipping; 0 turns it off.", 1.0, at_least=0)
    compile: bool = setting("torch.compile the step's forward and backward.", False)
    cuda_graphs: bool = setting(
        "On a GPU, replay each micro-batch's forward and backward from CUDA graphs where the step can, as runs "
        "train (--cuda_graphs false: every kernel launched from the host).",
        True,
    )
    with_trainer: bool = setting(
        "Also train each setting through the Estimator (the loop users run: data stream, logging, save checks) for "
        "--trainer_rounds rounds interleaved with the bench's rounds, and report its steady seq/s beside the "
        "bench's, with the spread of both and their ratio.",
        False,
    )
    trainer_rounds: int = setting("Rounds of the --with_trainer comparison.", 3, positive=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        for kind in self.kinds:
            if kind not in workload.STEP_KINDS:
                raise ValueError(f"kinds: unknown kind {kind!r}: use {' or '.join(workload.STEP_KINDS)}")
        for precision in self.precisions:
            if precision not in PRECISIONS:
                raise ValueError(f"precisions: unknown precision {precision!r}: use {', '.join(PRECISIONS)}")


SETTINGS = ThroughputSettings
MEASURED, UNIT, OUT_OF_MEMORY = "seq_per_s", "seq/s", "out of memory"
# The --with_trainer comparison's rows: the trainer's steady seq/s, the bench's beside it and their ratio.
TRAINER_MEASURED = "trainer_seq_per_s"


def check_settings(settings: ThroughputSettings) -> tuple[list[workload.Variant], workload.Lengths]:
    """The variants and the lengths the settings name (a BenchError naming the bad one), and a bad --model, before
    anything runs."""
    variants = [workload.Variant.parse(name, hf=True, compiled=True) for name in settings.variants]
    if settings.with_trainer and any(variant.cut_to_longest for variant in variants):
        raise workload.BenchError(
            "--with_trainer does not take hf-dynamic: the trainer's loop feeds every batch at the sequence length"
        )
    lengths = workload.Lengths.parse(settings.lengths)
    workload.bert_config(settings.model, max(settings.seq_lengths))
    return variants, lengths


def recipe(settings: ThroughputSettings, variant: workload.Variant | None = None) -> dict:
    """The TrainConfig fields the settings (and a "+compile" variant) change: the step the bench times is the
    training step with these."""
    return {
        "optimizer": settings.optimizer,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        "max_grad_norm": settings.max_grad_norm or None,
        "compile": compiled(settings, variant),
        "cuda_graphs": settings.cuda_graphs,
    }


def compiled(settings: ThroughputSettings, variant: workload.Variant | None) -> bool:
    return settings.compile or (variant is not None and variant.compiled)


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
    settings: ThroughputSettings,
    variants: Sequence[workload.Variant],
    lengths: workload.Lengths,
    device: torch.device,
    peaks: dict[str, tuple[float, str]],
) -> list[Row]:
    rows = []
    for kind in settings.kinds:
        for seq in settings.seq_lengths:
            config = workload.bert_config(settings.model, seq)
            models = {
                variant.name: workload.build(config, kind, variant, device, seed=settings.seed) for variant in variants
            }
            for precision in settings.precisions:
                out_of_memory: set[str] = set()
                for batch in settings.batch_sizes:
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
                            steps=settings.steps,
                            seed=settings.seed,
                            **recipe(settings, variant),
                        )
                        for variant in live
                    }
                    host_times: dict[str, list[float]] = {}
                    first_call: dict[str, float] = {}
                    try:
                        if settings.warmup:
                            first_call = first_calls(steps, device)
                        for step in steps.values():
                            step.capture_graphs()
                        times = measure.time_steps(
                            steps, max(0, settings.warmup - 1), settings.steps, device, host_times
                        )
                    except torch.cuda.OutOfMemoryError:
                        times = time_each_alone(steps, settings, device, out_of_memory)
                    # the ratios' reference: the first variant listed that fit (its step time over each one's)
                    first = next((variant.name for variant in live if variant.name not in out_of_memory), None)
                    setting = dict(
                        model=settings.model, kind=kind, seq=seq, precision=precision, lengths=lengths.name, batch=batch
                    )
                    for variant in live:
                        if variant.name in out_of_memory:
                            rows.append(
                                Row(MEASURED, UNIT, dict(setting, variant=variant.name), None, {}, OUT_OF_MEMORY)
                            )
                            continue
                        row = variant_row(
                            settings,
                            config,
                            dict(setting, variant=variant.name),
                            variant,
                            steps[variant.name],
                            times,
                            first,
                            host_times.get(variant.name),
                            first_call.get(variant.name),
                            peaks[precision][0],
                        )
                        rows.append(row)
                        print(
                            f"  {kind} seq {seq} {precision} {variant.name:<16} batch {batch:>4}: "
                            f"{row.value.text('.2f')} seq/s  {row.median('real_tokens_per_s'):,.0f} real tokens/s  "
                            f"MFU {row.median('mfu'):.1%}",
                            flush=True,
                        )
                    for step in steps.values():
                        step.optimizer.state.clear()  # two fp32 copies of the weights, not needed any more
                    del steps
            del models
    return rows


def variant_row(
    settings: ThroughputSettings,
    config: BertConfig,
    setting: dict[str, Any],
    variant: workload.Variant,
    step: workload.BenchStep,
    times: dict[str, list[float]],
    first: str,
    host_seconds: list[float] | None,
    first_call_seconds: float | None,
    peak: float,
) -> Row:
    """The row of one variant at one setting, from the step times of every variant (`first`'s is the ratios'
    reference), its host times on a GPU, its first call's seconds, and its memory step unless --no_memory."""
    kind, seq, precision = setting["kind"], setting["seq"], setting["precision"]
    columns = figures(times[variant.name], step, config, kind, seq, peak)
    columns["speed_vs_first_variant"] = Ratio.of(Spread.of(times[first]), columns["step_seconds"])
    if host_seconds:
        columns["host_seconds"] = Spread.of(host_seconds)
        columns["host_share"] = Ratio.of(columns["host_seconds"], columns["step_seconds"])
    columns.update(step.step.execution())
    if first_call_seconds is not None:
        columns["first_step_seconds"] = first_call_seconds
        if compiled(settings, variant):  # what compiling added to the first step
            columns["compile_seconds"] = max(0.0, first_call_seconds - columns["step_seconds"].median)
    if not settings.no_memory:
        columns.update(measure_memory(step))
    columns["path"], columns["path_reason"] = variant.path(
        step.model, step.device, precision, compiled(settings, variant)
    )
    return Row(MEASURED, UNIT, setting, columns.pop(MEASURED), columns)


def bench_vs_trainer(
    settings: ThroughputSettings,
    kind: str,
    variant: workload.Variant,
    precision: str,
    batch: int,
    seq: int,
    lengths: workload.Lengths,
    device: torch.device,
) -> Row:
    """The bench's seq/s and the Estimator's steady seq/s on one setting, in alternating rounds (bench, trainer,
    trainer, bench, ...), each round on a freshly built model: the bench times --steps steps after --warmup; the
    trainer trains --warmup + --steps steps on a shuffled stream of synthetic examples of the same shape and lengths
    (drawn from the same distribution) and reports its steady figure (the first --warmup steps and the checkpoint
    save left out). Each round's figure is sequences over the summed step time, so both are rates over the same
    steps."""
    config = workload.bert_config(settings.model, seq)
    train = recipe(settings, variant)
    features = synthetic.synthetic_batch(
        config, kind, batch * 8, seq, seed=settings.seed + 1, lengths=lengths.draw(batch * 8, seq, settings.seed)
    )

    def bench_round() -> float:
        step = workload.train_step(
            config,
            kind,
            variant,
            precision,
            batch,
            seq,
            device,
            lengths=lengths,
            steps=settings.steps,
            seed=settings.seed,
            **train,
        )
        seconds = measure.time_steps({"step": step}, settings.warmup, settings.steps, device)["step"]
        return step.sequences * len(seconds) / sum(seconds)

    def trainer_round() -> float:
        model = workload.build(config, kind, variant, device, seed=settings.seed)
        train_config = dataclasses.replace(
            workload.train_config(precision, **train),
            num_train_steps=settings.warmup + settings.steps,
            excluded_steps=settings.warmup,
        )
        with tempfile.TemporaryDirectory() as model_dir:
            estimator = Estimator(
                model,
                RunConfig(model_dir=model_dir, save_checkpoints_secs=None, log_step_count_steps=10**9),
                train_config,
                Distributed(device=device),
                log=lambda line: None,
            )
            result = estimator.train(ShuffledBatches(features, batch, seed=settings.seed))
        return result.steady_sentences_per_second

    rates: dict[str, list[float]] = {"bench": [], "trainer": []}
    for round_index in range(settings.trainer_rounds):
        order = (("bench", bench_round), ("trainer", trainer_round))
        for name, measure_round in order if round_index % 2 == 0 else reversed(order):
            rates[name].append(measure_round())
    bench, trainer = Spread.of(rates["bench"]), Spread.of(rates["trainer"])
    row = Row(
        TRAINER_MEASURED,
        UNIT,
        dict(
            model=settings.model,
            kind=kind,
            seq=seq,
            precision=precision,
            lengths=lengths.name,
            batch=batch,
            variant=variant.name,
        ),
        trainer,
        {
            "bench_seq_per_s": bench,
            "trainer_over_bench": Ratio.of(trainer, bench),
            "bench_rounds": rates["bench"],
            "trainer_rounds": rates["trainer"],
        },
    )
    print(
        f"  trainer vs bench, {describe(row)}: {trainer.median:.2f} vs {bench.median:.2f} seq/s "
        f"({row.get('trainer_over_bench').text('.3f')})",
        flush=True,
    )
    return row


def time_each_alone(steps: dict, settings: ThroughputSettings, device: torch.device, out_of_memory: set[str]) -> dict:
    """After a GPU ran out of memory with the variants interleaved: time each variant on its own, marking those
    that do not fit at this batch (larger batches of them are skipped)."""
    times = {}
    for name, step in steps.items():
        step.optimizer.state.clear()
        torch.cuda.empty_cache()
        try:
            times.update(measure.time_steps({name: step}, settings.warmup, settings.steps, device))
        except torch.cuda.OutOfMemoryError:
            out_of_memory.add(name)
            step.optimizer.state.clear()
            torch.cuda.empty_cache()
    return times


def figures(seconds: list[float], step: workload.BenchStep, config, kind: str, seq: int, peak: float) -> dict[str, Any]:
    """Figures of one setting from its step times: each measured one a Spread over the timed steps; the amounts per
    step are the means over the step's cycle of batches, which the timed steps go round whole. Model FLOPs count
    each sequence at its real length (flops.train_flops): what the step has to do, whatever its path computes on the
    padding."""
    sequences = step.sequences
    real_tokens = step.per_step(lambda length: length)
    flops_per_step = step.per_step(
        lambda length: flops.train_flops(
            config, kind, length, synthetic.masked_positions(length) if kind == "pretraining" else 0
        )
    )
    return {
        "step_seconds": Spread.of(seconds),
        "timed_steps": len(seconds),
        "sequences_per_step": sequences,
        MEASURED: Spread.of_rate(sequences, seconds),
        "tokens_per_s": Spread.of_rate(sequences * seq, seconds),
        "real_tokens_per_step": real_tokens,
        "real_tokens_per_s": Spread.of_rate(real_tokens, seconds),
        "padding_share": 1 - real_tokens / (sequences * seq),
        "model_flops_per_step": flops_per_step,
        "tflops": Spread.of_rate(flops_per_step / 1e12, seconds),
        "mfu": Spread.of_rate(flops_per_step / peak, seconds),
    }


def device_peaks(precisions: Sequence[str], device: torch.device) -> dict[str, tuple[float, str]]:
    """Each precision's peak FLOP/s and its source; the matmul is measured only where no data sheet applies."""
    peaks = {}
    for precision in precisions:
        try:
            peaks[precision] = devices.peak_flops(device, precision)
        except ValueError:
            dtype = precision_dtype(precision)
            size = 4096 if device.type == "cuda" else 2048
            measured = measure.matmul_flops_per_second(size, dtype, str(device))
            peaks[precision] = devices.peak_flops(device, precision, measured)
    return peaks


def describe(row: Row) -> str:
    return (
        f"{row.get('kind')} seq {row.get('seq')} {row.get('precision')} {row.get('variant')} batch {row.get('batch')}"
    )


def warnings(rows: Sequence[Row], compared: Sequence[Row]) -> list[str | None]:
    """What makes the figures doubtful: noisy settings, and an MFU above 100% (a peak measured under load)."""
    impossible = [row.median("mfu") for row in rows if row.value is not None and row.median("mfu") > 1]
    return [
        noisy_rows(rows, "step_seconds", describe, "step times"),
        noisy_rows(compared, "bench_seq_per_s", describe, "bench rounds"),
        noisy_rows(compared, TRAINER_MEASURED, describe, "trainer rounds"),
        f"MFU above 100% in {len(impossible)} row(s) (up to {max(impossible):.0%}): the peak was measured at the "
        "start while the machine was busier than during the steps (another job, frequency scaling), so MFU here is "
        "not a share of what the device can do. Run again on an idle machine."
        if impossible
        else None,
    ]


def median_column(title: str, key: str, spec: str) -> Column:
    """A column of a figure's median alone (its spread is in the JSON), where the table has no room for it."""
    return Column(title, key, lambda row: "–" if row.median(key) is None else format(row.median(key), spec))


def mib_column(title: str, key: str, spec: str) -> Column:
    return Column(title, key, lambda row: "–" if row.get(key) is None else format(row.get(key) / 2**20, spec))


def graphs_text(row: Row) -> str:
    """The CUDA graphs a row's step replayed, with the share of bucket filler in its packed rows, or why none."""
    graphs = row.get("cuda_graphs")
    if not graphs:
        return "off"
    filler = f", {graphs['bucket_filler_share']:.1%} filler" if graphs["bucket_rows"] else ""
    return f"{graphs['graphs']}{filler}"


def host_share_text(row: Row) -> str:
    share = row.get("host_share")
    return "–" if share is None else share.text(".0%", suffix="")


def columns(padded: bool, gpu: bool, compiled: bool = False) -> list[Column]:
    """The table's columns; on batches with padding, the path each variant ran, and the real tokens/s and the
    padding share in place of tokens/s (which count the padding); on a GPU, the host's share of the step time and
    the CUDA graphs' bucket filler; with compiled variants, the seconds compiling added to the first step."""
    tokens = (
        [median_column("real tokens/s", "real_tokens_per_s", ",.0f"), Column("padding", "padding_share", ".1%")]
        if padded
        else [median_column("tokens/s", "tokens_per_s", ",.0f")]
    )
    return [
        Column("kind", "kind"),
        Column("seq", "seq", "d"),
        Column("precision", "precision"),
        Column("variant", "variant"),
        *([Column("path", "path")] if padded else []),
        Column("batch", "batch", "d"),
        Column("seq/s: median (min–max, CV)", MEASURED, ".2f"),
        median_column("step (s)", "step_seconds", ".4f"),
        Column("vs first variant", "speed_vs_first_variant", ".3f"),
        *tokens,
        median_column("TFLOP/s", "tflops", ".3f"),
        median_column("MFU", "mfu", ".1%"),
        *(
            [Column("host / step", "host_share", host_share_text), Column("graphs", "cuda_graphs", graphs_text)]
            if gpu
            else []
        ),
        *([Column("compile (s)", "compile_seconds", ".1f")] if compiled else []),
        mib_column("saved for backward (MiB)", "saved_bytes", ",.1f"),
        mib_column("step memory (MiB)", "step_memory_bytes", ",.0f"),
    ]


TRAINER_COLUMNS = [
    Column("kind", "kind"),
    Column("seq", "seq", "d"),
    Column("precision", "precision"),
    Column("variant", "variant"),
    Column("batch", "batch", "d"),
    Column("bench seq/s", "bench_seq_per_s", ".2f"),
    Column("trainer seq/s", TRAINER_MEASURED, ".2f"),
    Column("trainer / bench", "trainer_over_bench", ".3f"),
]


def markdown(
    rows: Sequence[Row],
    peaks: dict[str, tuple[float, str]],
    model: str,
    device: torch.device,
    compared: Sequence[Row],
    lengths: workload.Lengths,
) -> str:
    any_compiled = any(row.get("compile_seconds") is not None for row in rows)
    lines = [f"# Throughput: {model} on {device}", ""]
    lines += [
        f"- peak {precision}: {peak / 1e12:.3f} TFLOP/s ({source})" for precision, (peak, source) in peaks.items()
    ]
    lines += [
        "",
        lengths_line(lengths, sorted({row.get("seq") for row in rows})),
        "",
        table(rows, columns(not lengths.full, device.type == "cuda", any_compiled)),
        "",
        "seq/s: median of the timed steps (min–max, CV = stdev / mean); the other figures are of the median step "
        "(the JSON has the spread of each). vs first variant: the setting's first variant's median step time over "
        "this one's. step memory: what one step adds, at its peak, to the memory resident before it (CUDA "
        "allocator on a GPU, process RSS on the CPU): activations, gradients, temporaries"
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
    if any_compiled:
        lines += [
            "",
            "compile (s): the first step's wall time less the median step's, what torch.compile added to "
            "the run's start (with `+compile`, or --compile). Inductor keeps what it compiled in its "
            "cache (TORCHINDUCTOR_CACHE_DIR, default under /tmp), so a later run on the same node "
            "compiles faster: point it at shared storage on a cluster.",
        ]
    reasons = {(row.get("variant"), row.get("path")): row.get("path_reason") for row in rows if row.get("path_reason")}
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
            table(compared, TRAINER_COLUMNS),
        ]
    note = noisy_ratios_note([*rows, *compared])
    return "\n".join(lines + (["", note] if note else []))


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


def plots(rows: Sequence[Row]) -> dict:
    """Per kind, sequence length and precision: seq/s vs batch (min-max as error bars) and memory vs batch, a line
    per variant."""
    result = {}
    measured = [row for row in rows if row.value is not None]
    groups = sorted({(row.get("kind"), row.get("seq"), row.get("precision")) for row in measured})
    for kind, seq, precision in groups:
        group = [
            row for row in measured if (row.get("kind"), row.get("seq"), row.get("precision")) == (kind, seq, precision)
        ]
        title = f"{group[0].get('model')}, {kind}, seq {seq}, {precision}"
        speed = {}
        for variant in dict.fromkeys(row.get("variant") for row in group):
            spreads = [(row.get("batch"), row.value) for row in group if row.get("variant") == variant]
            speed[variant] = tuple(
                list(values)
                for values in zip(*((batch, value.median, value.min, value.max) for batch, value in spreads))
            )
        result[f"{kind}-seq{seq}-{precision}"] = line_plot(speed, "batch size", "sequences / s", title, log_x=True)
        with_memory = [row for row in group if row.get("saved_bytes") is not None]
        if with_memory:
            key, label = (
                ("step_memory_bytes", "CUDA memory a step adds (GiB)")
                if with_memory[0].get("memory_kind") == "CUDA allocated"
                else ("saved_bytes", "saved for backward (GiB)")
            )
            memory = {
                variant: (
                    [row.get("batch") for row in with_memory if row.get("variant") == variant],
                    [row.get(key) / 2**30 for row in with_memory if row.get("variant") == variant],
                )
                for variant in dict.fromkeys(row.get("variant") for row in with_memory)
            }
            result[f"{kind}-seq{seq}-{precision}-memory"] = line_plot(memory, "batch size", label, title, log_x=True)
    return result


def run(settings: ThroughputSettings, argv: list[str]) -> None:
    variants, lengths = check_settings(settings)
    output = BenchOutput(settings.directory, ThroughputSettings.bench, argv, settings.overwrite)
    device = settings.torch_device()
    any_compiled = settings.compile or any(variant.compiled for variant in variants)
    for precision in settings.precisions:  # before the peaks are measured (a CPU's fp16 matmul takes minutes)
        workload.check_runnable(workload.train_config(precision, compile=any_compiled), device)
    load = LoadWatch()
    peaks = device_peaks(settings.precisions, device)
    rows = sweep(settings, variants, lengths, device, peaks)
    compared = (
        [
            bench_vs_trainer(settings, kind, variant, precision, batch, seq, lengths, device)
            for kind in settings.kinds
            for seq in settings.seq_lengths
            for precision in settings.precisions
            for variant in variants
            for batch in settings.batch_sizes
        ]
        if settings.with_trainer
        else []
    )
    for message in [load.busy(), *workload.slow_precisions(settings.precisions, device), *warnings(rows, compared)]:
        output.warn(message)
    text = markdown(rows, peaks, settings.model, device, compared, lengths)
    context = {
        "device": str(device),
        "peaks": {precision: {"flops_per_s": peak, "source": source} for precision, (peak, source) in peaks.items()},
        "training_step": recipe(settings),
        "lengths": lengths.summary(),
    }
    output.write_result(settings, [*rows, *compared], context, text, plots(rows))
    print(text)
    print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")


main = main_for(ThroughputSettings, __doc__.splitlines()[0], run)
