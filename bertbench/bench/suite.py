"""`bertbench bench suite`: a machine's standard figures in one command, one report.

What a user runs first on a new cluster node. Each part is one of the benches, built as that bench's settings
object and run as its own process (`python -m bertbench bench KIND` with the settings' command line, so that a
memory cap, an out-of-memory error or a failed CUDA graph capture stays inside it) into DIR/PART/, where its own
JSON, markdown, plots and output.log stay; the suite then reads their results (results.BenchResult) and writes
suite.json (a result of the same schema: a row per headline figure), suite.md and suite-*.png with the headline
figures, each beside the figure it is compared with (measured interleaved in the same part) and, at the standard
size on a GPU, the target this project holds itself to. What it prints is a summary of a screen: the headlines,
each warning once, and where suite.md is.

    standard (the default on a GPU; about 10 minutes on one H100/H200), bf16:
      phase1         BERT-large pre-training, seq 128, LAMB, batch 64 and 256: bertbench vs HF, MFU
      phase2         BERT-large pre-training, seq 512, batch 32: bertbench vs HF, and each recompute policy's step
                     time and bytes saved for backward
      compile        phase 1 at batch 256, eager vs torch.compile, and the seconds compiling took
      finetuning     BERT-base fine-tuning on real text's lengths (seq 128, batch 32 and 128): the default path vs
                     the padded path, HF padded to the sequence length and HF with dynamic padding
      largest-batch  each recompute policy's largest batch under a memory cap (seq 512) and its seq/s there
      optimizer      each optimizer's step (clipping included) against its memory-bandwidth floor
    small (the default on a CPU; 2.5 minutes on 2 cores), fp32 on a CPU (fine-tuning in bf16 too where the CPU has
    a bf16 matmul unit: AMX or AVX-512 BF16): the same parts on mini and tiny models, but compile: inductor takes minutes to compile the step on a CPU, so it runs only when named
    (--parts compile).

    bertbench bench suite                       # on a GPU node
    bertbench bench suite --parts finetuning,optimizer --output_dir suite-1
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from bertbench.bench import settings as bench_settings
from bertbench.bench.budget import last_error_line
from bertbench.bench.errors import BenchRunFailed
from bertbench.bench.memory import MemorySettings
from bertbench.bench.optimizer import OptimizerSettings
from bertbench.bench.output import BenchOutput
from bertbench.bench.plots import bar_plot
from bertbench.bench.results import BenchResult, Column, Ratio, Row, Spread, noisy_ratios_note, table
from bertbench.bench.settings import BenchSettings, device_setting
from bertbench.bench.throughput import ThroughputSettings
from bertbench.common.errors import UsageError
from bertbench.common.flags import setting
from bertbench.common.noise import cv_text
from bertbench.training import devices
from bertbench.training.distributed import resolve_device
from bertbench.training.step import compile_unavailable

SIZES = ("standard", "small")
PART_NAMES = ("phase1", "phase2", "compile", "finetuning", "largest-batch", "optimizer")
RECOMPUTE_VARIANTS = ("baseline", "full", "selective", "every-2")
MIN_REPEATS = 3  # a timed figure from fewer repeats says nothing of its spread: no headline
MAX_PRINTED_LINES = 24  # the summary the suite prints, under its "running" line: a screen of 25


@dataclasses.dataclass(frozen=True)
class SuiteSettings(BenchSettings):
    """The parts and their size."""

    bench: ClassVar[str] = "suite"

    size: str | None = setting(
        "standard: BERT-large pre-training and BERT-base fine-tuning in bf16 (the GPU figures); small: the same parts "
        "on mini and tiny models (default: standard on a GPU, small on a CPU).",
        None,
        choices=SIZES,
    )
    parts: tuple[str, ...] | None = setting(
        f"The parts to run, comma-separated (default: all; on a CPU at the small size all but compile): "
        f"{', '.join(PART_NAMES)}.",
        None,
    )
    device: str | None = device_setting()
    threads: int | None = setting("CPU threads of each part.", None, positive=True)
    steps: int | None = setting("Timed steps per setting (default: 10 standard, 3 small).", None, positive=True)
    warmup: int | None = setting("Untimed steps per setting (default: 3 standard, 1 small).", None, at_least=0)
    cap_gib: float | None = setting(
        "largest-batch's cap in GiB: of CUDA memory on a GPU (default 40, at most the device's), of the bytes saved "
        "for backward on a CPU (default 0.25).",
        None,
        positive=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = [name for name in self.parts or () if name not in PART_NAMES]
        if unknown:
            raise ValueError(f"parts: unknown part {unknown[0]!r}: use {', '.join(PART_NAMES)}")


SETTINGS = SuiteSettings


@dataclasses.dataclass(frozen=True)
class Scale:
    """The models, batches and precision of a suite size."""

    large: str  # the pre-training model
    base: str  # the fine-tuning model
    phase1_batches: tuple[int, ...]
    phase2_batch: int
    finetuning_batches: tuple[int, ...]
    precision: str
    steps: int
    warmup: int
    cap_gib: float  # the largest-batch search's cap: CUDA memory on a GPU, bytes saved for backward on a CPU


SCALES = {
    "standard": Scale("large", "base", (64, 256), 32, (32, 128), "bf16", steps=10, warmup=3, cap_gib=40),
    # Within 3 minutes on 2 cores: mini's largest batches at seq 512 under 0.25 GiB saved for backward are 2
    # (baseline) to 19 (full); phase 1 at batch 16, not 32, halves its longest steps
    "small": Scale("mini", "tiny", (8, 16), 4, (8, 32), "fp32", steps=3, warmup=1, cap_gib=0.25),
}

# What this project holds itself to on a GPU at the standard size (issues 28 and 29): (figure, its target, whether
# higher is better), by the headline row's measured figure and column.
TARGETS = {
    "mfu": (0.50, True),
    "vs_hf_dynamic": (1.6, True),
    "vs_padded": (1.5, True),
    "slowdown:selective": (1.10, False),
    "slowdown:full": (1.30, False),
    "at_max_vs_baseline": (1.0, True),
    "ratio_to_floor": (1.5, False),
}


@dataclasses.dataclass(frozen=True)
class Part:
    """One bench run of the suite: its name (the directory it writes), what it measures, and the bench's settings."""

    name: str
    what: str
    settings: BenchSettings

    @property
    def bench(self) -> str:
        return self.settings.bench

    def command(self) -> list[str]:
        return [sys.executable, "-m", "bertbench", "bench", self.bench, *bench_settings.as_argv(self.settings)]


def parts(
    scale: Scale,
    device: torch.device,
    with_hf: bool,
    directory: str,
    threads: int | None = None,
    overwrite: bool = False,
) -> list[Part]:
    """Every part of a suite at `scale` on `device` into DIR/PART: on a GPU in the scale's precision; on a CPU in
    fp32, and fine-tuning in bf16 beside it where the CPU has a bf16 matmul unit (AMX or AVX-512 BF16)."""
    precision = scale.precision if device.type == "cuda" else "fp32"
    finetuning_precisions = (
        (precision,) if device.type == "cuda" or devices.cpu_bf16_unavailable() else ("fp32", "bf16")
    )
    hf = ("hf",) if with_hf else ()

    def common(name: str) -> dict[str, Any]:
        return dict(output_dir=os.path.join(directory, name), overwrite=overwrite, device=str(device), threads=threads)

    def pretraining(name: str, seq: int, batches: tuple[int, ...], variants: tuple[str, ...], **more) -> dict:
        return dict(
            **common(name),
            model=scale.large,
            kinds=("pretraining",),
            precisions=(precision,),
            optimizer="lamb",
            seq_lengths=(seq,),
            batch_sizes=batches,
            variants=variants,
            warmup=scale.warmup,
            steps=scale.steps,
            **more,
        )

    large, base = scale.large, scale.base
    return [
        Part(
            "phase1",
            f"BERT-{large} pre-training, seq 128, LAMB, {precision}",
            # no memory step: the suite's pre-training headlines are speed and MFU (phase2 has the bytes saved)
            ThroughputSettings(**pretraining("phase1", 128, scale.phase1_batches, ("baseline", *hf), no_memory=True)),
        ),
        Part(
            "phase2",
            f"BERT-{large} pre-training, seq 512, recompute policies, {precision}",
            ThroughputSettings(**pretraining("phase2", 512, (scale.phase2_batch,), (*RECOMPUTE_VARIANTS, *hf))),
        ),
        Part(
            "compile",
            f"BERT-{large} pre-training, seq 128, eager vs torch.compile",
            ThroughputSettings(
                **pretraining(
                    "compile", 128, scale.phase1_batches[-1:], ("baseline", "baseline+compile"), no_memory=True
                )
            ),
        ),
        Part(
            "finetuning",
            f"BERT-{base} fine-tuning on real text's lengths, {' and '.join(finetuning_precisions)}",
            ThroughputSettings(
                **common("finetuning"),
                model=base,
                kinds=("finetuning",),
                lengths="real-text",
                seq_lengths=(128,),
                batch_sizes=scale.finetuning_batches,
                precisions=finetuning_precisions,
                variants=("baseline", "baseline/padded", *(("hf", "hf-dynamic") if with_hf else ())),
                no_memory=True,
                warmup=scale.warmup,
                steps=scale.steps,
            ),
        ),
        Part(
            "largest-batch",
            f"BERT-{large} pre-training, seq 512: largest batch per policy",
            MemorySettings(
                **common("largest-batch"),
                model=large,
                kind="pretraining",
                precision=precision,
                seq_lengths=(512,),
                variants=RECOMPUTE_VARIANTS,
                cap_gib=scale.cap_gib,
                time_batch=0,
                time_at_max_batch=True,
                warmup=1,
                steps=max(MIN_REPEATS, min(scale.steps, 5)),
            ),
        ),
        Part(
            "optimizer",
            f"BERT-{large}'s optimizer step vs its memory floor",
            OptimizerSettings(**common("optimizer"), model=large, warmup=scale.warmup, steps=scale.steps),
        ),
    ]


def plan(settings: SuiteSettings, device: torch.device) -> tuple[str, list[Part], list[str]]:
    """The size, the parts to run and the notes on what was left out, before anything runs."""
    size = settings.size or ("standard" if device.type == "cuda" else "small")
    given = {"steps": settings.steps, "warmup": settings.warmup, "cap_gib": settings.cap_gib}
    scale = dataclasses.replace(SCALES[size], **{name: value for name, value in given.items() if value is not None})
    notes = []
    with_hf = importlib.util.find_spec("transformers") is not None
    if not with_hf:
        notes.append(
            "HF transformers is not installed: the comparisons with HF were left out (pip install transformers)"
        )
    every = parts(scale, device, with_hf, settings.directory, settings.threads, settings.overwrite)
    chosen = [part for part in every if settings.parts is None or part.name in settings.parts]
    left_out = None
    reason = compile_unavailable(device)
    if reason:
        left_out = f"part compile left out: torch.compile cannot run here ({reason})"
    elif settings.parts is None and size == "small" and device.type == "cpu":
        # Its first compile takes minutes on a CPU (101 s of a 162 s part on 2 cores), more than the other parts
        # together; timed with a warm inductor cache it would report the cache, not compiling.
        left_out = (
            "part compile left out: on a CPU, compiling the step takes minutes, longer than the other parts together; "
            "run it with --parts compile"
        )
    if left_out and any(part.name == "compile" for part in chosen):
        chosen = [part for part in chosen if part.name != "compile"]
        notes.append(left_out)
    no_bf16 = devices.cpu_bf16_unavailable() if device.type == "cpu" else None
    if no_bf16 and any(part.name == "finetuning" for part in chosen):
        notes.append(f"fine-tuning in fp32 only: {no_bf16}, so bf16 is not timed beside it")
    return size, chosen, notes


def check_output(chosen: Sequence[Part], overwrite: bool) -> None:
    """Refuse, before anything runs, a directory holding a part's results (unless --overwrite): a part finding
    them would stop after the others ran."""
    if overwrite:
        return
    for part in chosen:
        path = os.path.join(part.settings.directory, f"{part.bench}.json")
        if os.path.exists(path):
            raise UsageError(f"{path} exists: choose another --output_dir or pass --overwrite")


def run_part(part: Part) -> dict:
    """Run one part to its end, its output kept in DIR/PART/output.log (not printed); what it did."""
    directory = part.settings.directory
    os.makedirs(directory, exist_ok=True)
    log_path = os.path.join(directory, "output.log")
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        status = subprocess.run(part.command(), stdout=log, stderr=subprocess.STDOUT).returncode
    ran = {
        "name": part.name,
        "bench": part.bench,
        "what": part.what,
        "command": " ".join(["bertbench", *part.command()[3:]]),
        "wall_seconds": time.perf_counter() - started,
        "exit_status": status,
        "report": os.path.join(part.name, f"{part.bench}.json"),
    }
    if status:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            ran["error"] = last_error_line(log.read())
    return ran


# ---- the headline figures, read from the parts' results ---------------------------------------------------------


def repeated(value: Any) -> Spread | None:
    """A timed figure with enough repeats to be a headline (MIN_REPEATS), else None."""
    return value if isinstance(value, Spread) and value.n >= MIN_REPEATS else None


def share_of_peak(value: Any) -> Spread | None:
    """An MFU with enough repeats to be a headline and at most 100%: above, the peak it is drawn from was measured
    low (the part warns), and a figure that cannot be right is no headline."""
    value = repeated(value)
    return value if value is not None and value.median <= 1 else None


def versus(numerator: Any, denominator: Any) -> Ratio | None:
    """The ratio of two timed figures when both have enough repeats, marked noisy by their CVs."""
    numerator, denominator = repeated(numerator), repeated(denominator)
    if numerator is None or denominator is None or not denominator.median:
        return None
    return Ratio.of(numerator, denominator)


def by_variant(result: BenchResult | None, **setting: Any) -> dict[str, Row]:
    """The measured rows of one setting (matching every key in `setting`), by variant."""
    rows = result.rows if result else ()
    return {
        row.setting["variant"]: row
        for row in rows
        if row.value is not None and all(row.setting.get(key) == value for key, value in setting.items())
    }


def settings_of(result: BenchResult | None, *keys: str) -> list[tuple]:
    """The distinct values of `keys` among the result's rows, in order."""
    return list(dict.fromkeys(tuple(row.setting.get(key) for key in keys) for row in result.rows)) if result else []


def headline(
    measured: str, unit: str, part: str, setting: Mapping[str, Any], value: Any, columns: Mapping[str, Any]
) -> Row | None:
    """A headline row, or None when its figure has too few repeats (a searched count, such as a largest batch,
    is no repeat: it stands)."""
    if measured != "max_batch" and repeated(value) is None:
        return None
    kept = {key: item for key, item in columns.items() if item is not None}
    return Row(measured, unit, {"part": part, **setting}, value, kept)


def pretraining_rows(results: Mapping[str, BenchResult]) -> list[Row]:
    """bertbench's pre-training step vs HF's, per sequence length and batch (phase 1 and 2)."""
    rows = []
    for name in ("phase1", "phase2"):
        for seq, batch in settings_of(results.get(name), "seq", "batch"):
            variants = by_variant(results.get(name), seq=seq, batch=batch)
            ours, hf = variants.get("baseline"), variants.get("hf")
            if ours:
                setting = {"kind": "pretraining", "seq": seq, "batch": batch, "variant": "baseline"}
                columns = {
                    "mfu": share_of_peak(ours.get("mfu")),
                    "hf_seq_per_s": hf and hf.value,
                    "hf_mfu": share_of_peak(hf and hf.get("mfu")),
                    "vs_hf": versus(ours.value, hf and hf.value),
                }
                rows.append(headline("seq_per_s", "seq/s", name, setting, ours.value, columns))
    return rows


def recompute_rows(results: Mapping[str, BenchResult]) -> list[Row]:
    """Each policy's step time and saved bytes against the baseline's (phase 2, equal batch), and its largest batch
    under the cap with its seq/s there against the baseline's at the baseline's largest batch."""
    rows = []
    for seq, batch in settings_of(results.get("phase2"), "seq", "batch"):
        timed = by_variant(results.get("phase2"), seq=seq, batch=batch)
        baseline = timed.get("baseline")
        for variant in RECOMPUTE_VARIANTS:
            row = timed.get(variant)
            if row and baseline:
                saved, saved_baseline = row.get("saved_bytes"), baseline.get("saved_bytes")
                compared = row is not baseline  # the baseline's ratios to itself say nothing
                columns = {
                    "slowdown": versus(row.get("step_seconds"), baseline.get("step_seconds")) if compared else None,
                    "saved_bytes": saved,
                    "saved_vs_baseline": Ratio.of(saved, saved_baseline)
                    if compared and saved and saved_baseline
                    else None,
                }
                setting = {"kind": "pretraining", "seq": seq, "batch": batch, "variant": variant}
                rows.append(headline("step_seconds", "s", "phase2", setting, row.get("step_seconds"), columns))
    for (seq,) in settings_of(results.get("largest-batch"), "seq"):
        searched = by_variant(results.get("largest-batch"), seq=seq)
        baseline = searched.get("baseline")
        for variant in RECOMPUTE_VARIANTS:
            row = searched.get(variant)
            if row:
                at_max = repeated(row.get("seq_per_s_at_max_batch"))
                reference = baseline.get("seq_per_s_at_max_batch") if baseline and row is not baseline else None
                columns = {"seq_per_s_at_max_batch": at_max, "at_max_vs_baseline": versus(at_max, reference)}
                setting = {"kind": "pretraining", "seq": seq, "variant": variant}
                rows.append(headline("max_batch", "sequences", "largest-batch", setting, row.value, columns))
    return rows


def compile_rows(results: Mapping[str, BenchResult]) -> list[Row]:
    rows = []
    for seq, batch in settings_of(results.get("compile"), "seq", "batch"):
        variants = by_variant(results.get("compile"), seq=seq, batch=batch)
        eager, compiled = variants.get("baseline"), variants.get("baseline+compile")
        if eager and compiled:
            setting = {"kind": "pretraining", "seq": seq, "batch": batch, "variant": "baseline+compile"}
            columns = {
                "eager_seq_per_s": eager.value,
                "vs_eager": versus(compiled.value, eager.value),
                "mfu": share_of_peak(compiled.get("mfu")),
                "compile_seconds": compiled.get("compile_seconds"),
            }
            rows.append(headline("seq_per_s", "seq/s", "compile", setting, compiled.value, columns))
    return rows


FINETUNING_CONTENDERS = (("padded", "baseline/padded"), ("hf", "hf"), ("hf_dynamic", "hf-dynamic"))


def finetuning_rows(results: Mapping[str, BenchResult]) -> list[Row]:
    """The default path's real tokens/s against the padded path's and HF's, per batch and precision; where fp32 and
    bf16 both ran (a CPU with a bf16 unit), bf16's against fp32's too."""
    rows = []
    result = results.get("finetuning")
    for seq, batch, precision in settings_of(result, "seq", "batch", "precision"):
        variants = by_variant(result, seq=seq, batch=batch, precision=precision)
        default = variants.get("baseline")
        if default:
            ours = default.get("real_tokens_per_s")
            columns: dict[str, Any] = {"path": default.get("path"), "host_share": default.get("host_share")}
            for name, variant in FINETUNING_CONTENDERS:
                theirs = variants[variant].get("real_tokens_per_s") if variant in variants else None
                columns[f"{name}_real_tokens_per_s"] = theirs
                columns[f"vs_{name}"] = versus(ours, theirs)
            if precision != "fp32":
                fp32 = by_variant(result, seq=seq, batch=batch, precision="fp32").get("baseline")
                columns["vs_fp32"] = versus(ours, fp32.get("real_tokens_per_s")) if fp32 else None
            setting = {"kind": "finetuning", "seq": seq, "batch": batch, "precision": precision, "variant": "baseline"}
            rows.append(headline("real_tokens_per_s", "tokens/s", "finetuning", setting, ours, columns))
    return rows


def optimizer_rows(results: Mapping[str, BenchResult]) -> list[Row]:
    """Each optimizer's step against its floors (a step faster than a floor has no ratio to it: the bench warns)."""
    result = results.get("optimizer")
    keys = ("floor_ms", "ratio_to_floor", "rule_floor_ms", "ratio_to_rule_floor")
    return [
        headline("step_ms", "ms", "optimizer", row.setting, row.value, {key: row.get(key) for key in keys})
        for row in (result.rows if result else ())
        if row.measured == "step_ms"
    ]


SECTIONS: tuple[tuple[str, Callable[[Mapping[str, BenchResult]], list[Row]]], ...] = (
    ("pretraining", pretraining_rows),
    ("recompute", recompute_rows),
    ("compile", compile_rows),
    ("finetuning", finetuning_rows),
    ("optimizer", optimizer_rows),
)


def headlines(results: Mapping[str, BenchResult], with_targets: bool) -> list[Row]:
    """Every headline row of the parts' results (by part name), each with its targets (`with_targets`: the
    standard size on a GPU) as target_<key> columns."""
    rows = [row for _, section in SECTIONS for row in section(results) if row is not None]
    return [with_target(row) for row in rows] if with_targets else rows


def target_key(row: Row, key: str) -> str:
    return f"{key}:{row.setting.get('variant')}" if key == "slowdown" else key


def with_target(row: Row) -> Row:
    """The row with a target_<key> column beside each figure a target applies to: MFU at the batches the targets
    name (seq 128 batch 256, seq 512 batch 32), the ratios, the optimizers' fused form (a GPU's)."""
    targets = {}
    for key in ("mfu", "vs_hf_dynamic", "vs_padded", "slowdown", "at_max_vs_baseline", "ratio_to_floor"):
        found = TARGETS.get(target_key(row, key))
        if found is None or row.get(key) is None:
            continue
        if key == "mfu" and (row.setting.get("seq"), row.setting.get("batch")) not in ((128, 256), (512, 32)):
            continue
        if key == "ratio_to_floor" and row.setting.get("form") != "fused":
            continue
        targets[f"target_{key}"] = found[0]
    return dataclasses.replace(row, columns={**row.columns, **targets}) if targets else row


def target_text(row: Row, key: str) -> str:
    """ " (target >= 0.50: met)" beside a figure with a target, else ""."""
    target = row.get(f"target_{key}")
    if target is None:
        return ""
    higher = TARGETS[target_key(row, key)][1]
    value = row.median(key)
    met = value >= target if higher else value <= target
    return f" (target {'>=' if higher else '<='} {target:g}: {'met' if met else 'NOT met'})"


# ---- what the suite writes and prints ---------------------------------------------------------------------------


def format_value(row: Row, spec: str, key: str | None = None) -> str:
    """One figure of a row as a cell shows it: a Spread with its spread, a Ratio with its mark, "–" if none."""
    value = row.get(key or row.measured)
    if value is None:
        return "–"
    if isinstance(value, (Spread, Ratio)):
        return value.text(spec)
    return format(value, spec)


def cell_of(key: str, spec: str) -> Callable[[Row], str]:
    return lambda row: format_value(row, spec, key) + target_text(row, key)


TABLES = {
    "pretraining": (
        "Pre-training: bertbench vs HF",
        [
            Column("part", "part"),
            Column("seq", "seq", "d"),
            Column("batch", "batch", "d"),
            Column("bertbench seq/s", "seq_per_s", ",.1f"),
            Column("MFU", "mfu", cell_of("mfu", ".1%")),
            Column("HF seq/s", "hf_seq_per_s", ",.1f"),
            Column("bertbench / HF", "vs_hf", ".2f"),
        ],
        "MFU counts the model's FLOPs (the MLM head on the masked positions only) against the device's peak.",
    ),
    "recompute": (
        "Recompute: time and memory per policy",
        [
            Column("policy", "variant"),
            Column("batch", "batch", "d"),
            Column("step (s)", "step_seconds", ".4f"),
            Column("step vs baseline", "slowdown", cell_of("slowdown", ".2f")),
            Column("saved for backward vs baseline", "saved_vs_baseline", ".2f"),
            Column("largest batch", "max_batch", ",.0f"),
            Column("seq/s at largest batch", "seq_per_s_at_max_batch", ",.1f"),
            Column("vs baseline at its largest", "at_max_vs_baseline", cell_of("at_max_vs_baseline", ".2f")),
        ],
        "phase2 rows: step time and bytes saved for backward at equal batch; largest-batch rows: the largest batch "
        "under the cap, and the seq/s each policy reaches there against the baseline at its own.",
    ),
    "compile": (
        "Compile",
        [
            Column("seq", "seq", "d"),
            Column("batch", "batch", "d"),
            Column("eager seq/s", "eager_seq_per_s", ",.1f"),
            Column("compiled seq/s", "seq_per_s", ",.1f"),
            Column("compiled / eager", "vs_eager", ".2f"),
            Column("compile (s)", "compile_seconds", ".1f"),
        ],
        "compile (s): what compiling added to the first step.",
    ),
    "finetuning": (
        "Fine-tuning on real text's lengths",
        [
            Column("batch", "batch", "d"),
            Column("precision", "precision"),
            Column("default path", "path"),
            Column("default real tokens/s", "real_tokens_per_s", ",.0f"),
            Column("vs padded", "vs_padded", cell_of("vs_padded", ".2f")),
            Column("vs HF", "vs_hf", ".2f"),
            Column("vs HF dynamic", "vs_hf_dynamic", cell_of("vs_hf_dynamic", ".2f")),
            Column("vs fp32", "vs_fp32", cell_of("vs_fp32", ".2f")),
        ],
        "real tokens/s leaves the padding out; vs: the default path's over the other's (vs fp32: bf16's over fp32's, "
        "on a CPU with a bf16 matmul unit).",
    ),
    "optimizer": (
        "Optimizer step (clipping included)",
        [
            Column("optimizer", "optimizer"),
            Column("step (ms)", "step_ms", ".2f"),
            Column("floor (ms)", "floor_ms", ".2f"),
            Column("step / floor", "ratio_to_floor", cell_of("ratio_to_floor", ".2f")),
            Column("step / rule's floor", "ratio_to_rule_floor", ".2f"),
        ],
        "floor: 28 bytes a parameter over the bandwidth the optimizer part measured (STREAM); a step faster than its "
        "floor has no ratio (its part's report says why).",
    ),
}


def section_of(row: Row) -> str:
    part = row.setting["part"]
    return (
        "recompute"
        if part == "largest-batch" or (part == "phase2" and row.measured == "step_seconds")
        else ("pretraining" if part in ("phase1", "phase2") else part)
    )


def markdown(size: str, device: str, ran: Sequence[dict], rows: Sequence[Row], notes: Sequence[str]) -> str:
    wall = sum(part["wall_seconds"] for part in ran)
    lines = [
        f"# Suite: {size} on {device}",
        "",
        f"{len(ran)} part(s) in {wall / 60:.1f} minutes. Each part is one bench, its figures measured interleaved "
        "with what they are compared with; its own report (linked) has every row and its plots. A figure is its "
        f"median (min–max, CV); one timed fewer than {MIN_REPEATS} times is no headline (its part's report has it).",
    ]
    lines += [""] + [f"- {note}" for note in notes] if notes else []
    for key, (title, columns, note) in TABLES.items():
        shown = [row for row in rows if section_of(row) == key]
        if shown:
            lines += ["", f"## {title}", "", table(shown, columns), "", note]
    noisy = noisy_ratios_note(rows)  # once, under the tables
    lines += ["", noisy] if noisy else []
    part_rows = [
        Row(
            "wall_seconds",
            "s",
            {"part": part["name"]},
            Spread.exact(part["wall_seconds"]),
            {
                "what": part["what"],
                "status": "done"
                if part["exit_status"] == 0
                else f"FAILED ({part['exit_status']}): {part.get('error', '')}".replace("|", "/"),
                "link": f"[{part['bench']}.md]({part['name']}/{part['bench']}.md)",
            },
        )
        for part in ran
    ]
    columns = [
        Column("part", "part"),
        Column("what", "what"),
        Column("seconds", "wall_seconds", ",.0f"),
        Column("status", "status"),
        Column("report", "link"),
    ]
    lines += [
        "",
        "## Parts",
        "",
        table(part_rows, columns),
        "",
        "Rerun a part alone with its `command` in suite.json's context (`parts`).",
    ]
    return "\n".join(lines)


def summary_line(row: Row) -> str:
    """One headline as printed: what, the figure with its CV (suite.md has its min and max), the ratios with their
    marks and targets."""
    where = ", ".join(f"{key} {row.setting[key]}" for key in ("seq", "batch") if key in row.setting)
    where += f", {row.setting['precision']}" if "precision" in row.setting else ""
    variant = row.setting.get("variant") or row.setting.get("optimizer")
    ratios = [
        f"{label} {row.get(key).text('.2f')}{target_text(row, key)}"
        for key, label in (
            ("vs_hf", "vs HF"),
            ("slowdown", "step vs baseline"),
            ("at_max_vs_baseline", "seq/s vs baseline's"),
            ("vs_eager", "vs eager"),
            ("vs_padded", "vs padded"),
            ("vs_hf_dynamic", "vs HF dynamic"),
            ("vs_fp32", "vs fp32"),
            ("ratio_to_floor", "vs floor"),
        )
        if isinstance(row.get(key), Ratio)
    ]
    mfu = f", MFU {row.median('mfu'):.1%}{target_text(row, 'mfu')}" if isinstance(row.get("mfu"), Spread) else ""
    spec = ".3f" if row.unit == "s" else ",.0f" if row.measured == "max_batch" or row.value.median >= 1000 else ",.1f"
    spread = f" (CV {cv_text(row.value.cv)})" if row.value.cv is not None else ""
    figure_text = f"{row.value.median:{spec}} {row.unit}{spread}{mfu}"
    return (
        f"  {row.setting['part']} {variant}"
        + (f" ({where})" if where else "")
        + f": {figure_text}"
        + ("; " + ", ".join(ratios) if ratios else "")
    )


def printed_summary(
    size: str,
    device: str,
    ran: Sequence[dict],
    rows: Sequence[Row],
    warnings: Sequence[str],
    notes: Sequence[str],
    report: str,
) -> list[str]:
    """What the suite prints: a screen (MAX_PRINTED_LINES) of the headlines, the notes and each warning once; the
    rest is in `report` (suite.md). The headlines that would not fit are counted, not printed."""
    wall = sum(part["wall_seconds"] for part in ran)
    failed = [part["name"] for part in ran if part["exit_status"]]
    head = [
        f"suite: {size} on {device}, {len(ran)} part(s) in {wall:.0f} s"
        + (f", FAILED: {', '.join(failed)}" if failed else "")
    ]
    messages = [f"note: {note}" for note in notes] + [f"warning: {warning}" for warning in warnings_by_kind(warnings)]
    return (
        head
        + fitted([summary_line(row) for row in rows], MAX_PRINTED_LINES - 2 - len(messages), report)
        + (fitted(messages, MAX_PRINTED_LINES - 2, report) + [f"report: {report}"])
    )


def fitted(lines: list[str], room: int, report: str) -> list[str]:
    """`lines`, or as many as fit in `room` lines with a last one counting the others, which `report` has."""
    if len(lines) <= room:
        return lines
    kept = max(0, room - 1)
    return lines[:kept] + [f"  ... {len(lines) - kept} more in {report}"] if room > 0 else []


def part_warnings(results: Mapping[str, BenchResult]) -> list[str]:
    """The parts' warnings, each once, naming the parts that gave it ("phase1, phase2: ..."): what suite.json and
    suite.md hold."""
    given: dict[str, list[str]] = {}
    for name, result in results.items():
        for warning in result.warnings:
            given.setdefault(warning, []).append(name)
    return [f"{', '.join(names)}: {warning}" for warning, names in given.items()]


def warnings_by_kind(warnings: Sequence[str]) -> list[str]:
    """The warnings as printed: one line per kind (what a warning says before its first colon, such as "the machine
    was busy"; each part's words after it differ in their figures), naming the parts; suite.md has each in full."""
    kinds: dict[str, list[str]] = {}
    for warning in warnings:
        parts, _, message = warning.partition(": ")
        kind = message.split(":")[0]
        kinds.setdefault(kind, []).extend(part for part in parts.split(", ") if part not in kinds.get(kind, []))
    return [f"{kind} ({', '.join(parts)}; in full in suite.md)" for kind, parts in kinds.items()]


def plots(rows: Sequence[Row]) -> dict:
    """bertbench's speed over each contender's, per setting; each recompute policy's time and memory."""
    result = {}
    speed: dict[str, dict[str, float]] = {}
    for row in rows:
        where = f"{row.setting['part']} {row.setting.get('seq')}/{row.setting.get('batch')}"
        for key, label in (
            ("vs_hf", "vs HF"),
            ("vs_eager", "compiled vs eager"),
            ("vs_padded", "vs padded"),
            ("vs_hf_dynamic", "vs HF dynamic"),
        ):
            if isinstance(row.get(key), Ratio):
                speed.setdefault(label, {})[where] = row.get(key)
    if speed:
        result["speed"] = bar_plot(
            speed, "speed ratio (median over median)", "bertbench's speed over each contender's", (1.0, "1 = equal")
        )
    policies: dict[str, dict[str, float]] = {}
    for row in rows:
        for key, label in (
            ("slowdown", "step time"),
            ("saved_vs_baseline", "bytes saved for backward"),
            ("at_max_vs_baseline", "seq/s at its largest batch"),
        ):
            if isinstance(row.get(key), Ratio):
                policies.setdefault(label, {})[row.setting["variant"]] = row.get(key)
    if policies:
        result["recompute"] = bar_plot(
            policies, "ratio to the baseline's", "recompute policies against the baseline", (1.0, "baseline = 1")
        )
    return result


def read_parts(directory: str, ran: Sequence[dict]) -> dict[str, BenchResult]:
    """The results of the parts that finished, by part name (results.BenchResult.read)."""
    return {
        part["name"]: BenchResult.read(os.path.join(directory, part["report"]))
        for part in ran
        if part["exit_status"] == 0
    }


def run(settings: SuiteSettings, argv: list[str]) -> None:
    device = resolve_device(settings.device)
    size, chosen, notes = plan(settings, device)
    output = BenchOutput(settings.directory, "suite", argv, settings.overwrite)
    check_output(chosen, settings.overwrite)
    print("running", end="", flush=True)  # one line, growing as the parts end: the output is one screen
    ran = []
    for part in chosen:
        print(f" {part.name}", end="", flush=True)
        ran.append(run_part(part))
        print(f" ({ran[-1]['wall_seconds']:.0f} s{', FAILED' if ran[-1]['exit_status'] else ''})", end="", flush=True)
    print(flush=True)
    results = read_parts(settings.directory, ran)
    rows = headlines(results, with_targets=size == "standard" and device.type == "cuda")
    warnings = part_warnings(results)
    output.warnings.extend(warnings)  # written with the figures; printed once, in the summary
    context = {"device": str(device), "size": size, "notes": notes, "parts": ran}
    output.write_result(settings, rows, context, markdown(size, str(device), ran, rows, notes), plots(rows))
    print("\n".join(printed_summary(size, str(device), ran, rows, warnings, notes, output.path(".md"))), flush=True)
    failed = [part for part in ran if part["exit_status"]]
    if failed:
        raise BenchRunFailed(
            f"{len(failed)} part(s) failed: "
            + "; ".join(
                f"{part['name']}: {part.get('error', '')} (whole output: "
                f"{os.path.join(settings.directory, part['name'], 'output.log')})"
                for part in failed
            )
        )


main = bench_settings.main_for(SuiteSettings, __doc__.splitlines()[0], run)
