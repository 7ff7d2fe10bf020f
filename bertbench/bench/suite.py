"""`bertbench bench suite`: a machine's standard figures in one command, one report.

What a user runs first on a new cluster node. Each part is one of the benches, run as its own process (so that a
memory cap, an out-of-memory error or a failed CUDA graph capture stays inside it) into DIR/PART/, where its own
JSON, markdown, plots and output.log stay; the suite then reads their JSON and writes suite.json, suite.md and
suite-*.png with the headline figures, each beside the figure it is compared with (measured interleaved in the same
part) and, at the standard size on a GPU, the target this project holds itself to.

    standard (the default on a GPU; about 10 minutes on one H100/H200), bf16:
      phase1         BERT-large pre-training, seq 128, LAMB, batch 64 and 256: bertbench vs HF, MFU
      phase2         BERT-large pre-training, seq 512, batch 32: bertbench vs HF, and each recompute policy's step
                     time and bytes saved for backward
      compile        phase 1 at batch 256, eager vs torch.compile, and the seconds compiling took
      finetuning     BERT-base fine-tuning on real text's lengths (seq 128, batch 32 and 128): the default path vs
                     the padded path, HF padded to the sequence length and HF with dynamic padding
      largest-batch  each recompute policy's largest batch under a memory cap (seq 512) and its seq/s there
      optimizer      each optimizer's step (clipping included) against its memory-bandwidth floor
    small (the default on a CPU; a few minutes on 2 cores), fp32 on a CPU: the same parts on mini and tiny models.

    bertbench bench suite                       # on a GPU node
    bertbench bench suite --parts finetuning,optimizer --output_dir suite-1
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from bertbench.bench import cli
from bertbench.bench.budget import last_error_line
from bertbench.bench.output import BenchOutput, markdown_table, spread_column
from bertbench.bench.plots import bar_plot
from bertbench.bench.workload import BenchError, BenchRunFailed
from bertbench.training.step import compile_unavailable

SIZES = ("standard", "small")
RECOMPUTE_VARIANTS = ("baseline", "full", "selective", "every-2")


@dataclasses.dataclass(frozen=True)
class Part:
    """One bench run of the suite: its name (the directory it writes), the bench and its flags."""

    name: str
    bench: str
    what: str
    flags: tuple[str, ...]

    def command(self, directory: str, device: torch.device, common: Sequence[str]) -> list[str]:
        return [
            sys.executable,
            "-m",
            "bertbench",
            "bench",
            self.bench,
            *self.flags,
            "--device",
            str(device),
            "--output_dir",
            os.path.join(directory, self.name),
            *common,
        ]


@dataclasses.dataclass(frozen=True)
class Scale:
    """The models, batches and precision of a suite size."""

    large: str  # the pre-training model
    base: str  # the fine-tuning model
    phase1_batches: str
    phase2_batch: int
    finetuning_batches: str
    precision: str
    steps: int
    warmup: int
    cap_gib: float  # the largest-batch search's cap: CUDA memory on a GPU, bytes saved for backward on a CPU


SCALES = {
    "standard": Scale(
        large="large",
        base="base",
        phase1_batches="64,256",
        phase2_batch=32,
        finetuning_batches="32,128",
        precision="bf16",
        steps=10,
        warmup=3,
        cap_gib=40,
    ),
    "small": Scale(
        large="mini",
        base="tiny",
        phase1_batches="8,32",
        phase2_batch=4,
        finetuning_batches="8,32",
        precision="fp32",
        steps=3,
        warmup=1,
        cap_gib=0.5,
    ),
}

# What this project holds itself to on a GPU at the standard size (issues 28 and 29), shown beside the figures.
TARGETS = {
    "mfu": 0.50,
    "default_vs_hf_dynamic": 1.6,
    "default_vs_padded": 1.5,
    "selective_slowdown": 1.10,
    "full_slowdown": 1.30,
    "optimizer_vs_floor": 1.5,
}


def parts(scale: Scale, device: torch.device, with_hf: bool) -> list[Part]:
    """Every part of a suite at `scale` on `device` (bf16 only where the device computes in it: a CPU runs fp32)."""
    precision = scale.precision if device.type == "cuda" else "fp32"
    timing = ("--warmup", str(scale.warmup), "--steps", str(scale.steps))
    hf = (",hf",) if with_hf else ("",)
    pretraining = (
        "--model",
        scale.large,
        "--kinds",
        "pretraining",
        "--precisions",
        precision,
        "--optimizer",
        "lamb",
        *timing,
    )
    return [
        Part(
            "phase1",
            "throughput",
            f"BERT-{scale.large} pre-training, seq 128, LAMB, {precision}",
            (
                *pretraining,
                "--seq_lengths",
                "128",
                "--batch_sizes",
                scale.phase1_batches,
                "--variants",
                "baseline" + hf[0],
            ),
        ),
        Part(
            "phase2",
            "throughput",
            f"BERT-{scale.large} pre-training, seq 512, recompute policies, {precision}",
            (
                *pretraining,
                "--seq_lengths",
                "512",
                "--batch_sizes",
                str(scale.phase2_batch),
                "--variants",
                ",".join(RECOMPUTE_VARIANTS) + hf[0],
            ),
        ),
        Part(
            "compile",
            "throughput",
            f"BERT-{scale.large} pre-training, seq 128, eager vs torch.compile",
            (
                *pretraining,
                "--seq_lengths",
                "128",
                "--batch_sizes",
                scale.phase1_batches.split(",")[-1],
                "--variants",
                "baseline,baseline+compile",
                "--no_memory",
            ),
        ),
        Part(
            "finetuning",
            "throughput",
            f"BERT-{scale.base} fine-tuning on real text's lengths, {precision}",
            (
                "--model",
                scale.base,
                "--kinds",
                "finetuning",
                "--lengths",
                "real-text",
                "--seq_lengths",
                "128",
                "--batch_sizes",
                scale.finetuning_batches,
                "--precisions",
                precision,
                "--variants",
                "baseline,baseline/padded" + (",hf,hf-dynamic" if with_hf else ""),
                *timing,
            ),
        ),
        Part(
            "largest-batch",
            "memory",
            f"BERT-{scale.large} pre-training, seq 512: largest batch per policy",
            (
                "--model",
                scale.large,
                "--kind",
                "pretraining",
                "--precision",
                precision,
                "--seq_lengths",
                "512",
                "--variants",
                ",".join(RECOMPUTE_VARIANTS),
                "--cap_gib",
                f"{scale.cap_gib:g}",
                "--time_batch",
                "0",
                "--time_at_max_batch",
                "--warmup",
                "1",
                "--steps",
                str(min(3, scale.steps)),
            ),
        ),
        Part(
            "optimizer",
            "optimizer",
            f"BERT-{scale.large}'s optimizer step vs its memory floor",
            ("--model", scale.large, *timing),
        ),
    ]


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser_for("suite", __doc__.splitlines()[0])
    setting = parser.add_argument_group("setting")
    setting.add_argument(
        "--size",
        choices=SIZES,
        default=None,
        help="standard: BERT-large pre-training and BERT-base fine-tuning in bf16 (the GPU "
        "figures); small: the same parts on mini and tiny models (default: standard on a GPU, "
        "small on a CPU).",
    )
    setting.add_argument(
        "--parts",
        type=cli.comma_list(str),
        default=None,
        help="The parts to run, comma-separated (default: all): phase1, phase2, compile, "
        "finetuning, largest-batch, optimizer.",
    )
    setting.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: CUDA when available).")
    setting.add_argument("--threads", type=cli.positive_int, default=None, help="CPU threads of each part.")
    setting.add_argument(
        "--steps", type=cli.positive_int, default=None, help="Timed steps per setting (default: 10 standard, 3 small)."
    )
    setting.add_argument(
        "--warmup", type=int, default=None, help="Untimed steps per setting (default: 3 standard, 1 small)."
    )
    setting.add_argument(
        "--cap_gib",
        type=float,
        default=None,
        help="largest-batch's cap in GiB: of CUDA memory on a GPU (default 40, at most the "
        "device's), of the bytes saved for backward on a CPU (default 0.5).",
    )
    return parser


def check_settings(args: argparse.Namespace, device: torch.device) -> tuple[str, list[Part], list[str]]:
    """The size, the parts to run and the notes on what was left out; a bad flag is a BenchError."""
    size = args.size or ("standard" if device.type == "cuda" else "small")
    if args.warmup is not None and args.warmup < 0:
        raise BenchError(f"--warmup must be 0 or more, got {args.warmup}")
    if args.cap_gib is not None and args.cap_gib <= 0:
        raise BenchError(f"--cap_gib must be positive, got {args.cap_gib}")
    scale = dataclasses.replace(
        SCALES[size],
        **{
            name: value
            for name, value in (("steps", args.steps), ("warmup", args.warmup), ("cap_gib", args.cap_gib))
            if value is not None
        },
    )
    notes = []
    with_hf = importlib.util.find_spec("transformers") is not None
    if not with_hf:
        notes.append(
            "HF transformers is not installed: the comparisons with HF were left out (pip install transformers)"
        )
    every = parts(scale, device, with_hf)
    names = [part.name for part in every]
    unknown = [name for name in args.parts or () if name not in names]
    if unknown:
        raise BenchError(f"--parts: unknown part {unknown[0]!r}: use {', '.join(names)}")
    chosen = [part for part in every if args.parts is None or part.name in args.parts]
    reason = compile_unavailable(device)
    if reason and any(part.name == "compile" for part in chosen):
        chosen = [part for part in chosen if part.name != "compile"]
        notes.append(f"part compile left out: torch.compile cannot run here ({reason})")
    return size, chosen, notes


def check_output(directory: str, chosen: Sequence[Part], overwrite: bool) -> None:
    """Refuse, before anything runs, a directory holding a part's results (unless --overwrite): a part finding
    them would stop after the others ran."""
    if overwrite:
        return
    for part in chosen:
        if os.path.exists(os.path.join(directory, part.name, f"{part.bench}.json")):
            raise FileExistsError(
                f"{os.path.join(directory, part.name, part.bench + '.json')} exists: choose "
                "another --output_dir or pass --overwrite"
            )


def run_part(part: Part, command: Sequence[str]) -> dict:
    """Run one part to its end, its output shown with the part's name and kept in its output.log; what it did."""
    directory = command[command.index("--output_dir") + 1]
    os.makedirs(directory, exist_ok=True)
    log_path = os.path.join(directory, "output.log")
    print(f"\n== {part.name}: {part.what}\n   {' '.join(command[1:])}", flush=True)
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
        )
        for line in process.stdout:
            log.write(line)
            print(f"   {part.name}| {line}", end="", flush=True)
        status = process.wait()
    result = {
        "name": part.name,
        "bench": part.bench,
        "what": part.what,
        "command": " ".join(["bertbench", *command[3:]]),
        "wall_seconds": time.perf_counter() - started,
        "exit_status": status,
        "report": os.path.join(part.name, f"{part.bench}.json"),
    }
    if status:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            result["error"] = last_error_line(log.read())
    return result


# ---- the headline figures, read from the parts' JSON ----------------------------------------------------------------


def ratio(numerator: Mapping[str, Any] | None, denominator: Mapping[str, Any] | None, key: str) -> float | None:
    if not numerator or not denominator or numerator.get(key) is None or not denominator.get(key):
        return None
    return numerator[key] / denominator[key]


def by_variant(rows: Sequence[Mapping[str, Any]], **setting: Any) -> dict[str, Mapping[str, Any]]:
    """The rows of one setting (matching every key in `setting`) that ran, by variant."""
    return {
        row["variant"]: row
        for row in rows
        if not row.get("out_of_memory") and all(row.get(key) == value for key, value in setting.items())
    }


def pretraining_rows(reports: Mapping[str, dict]) -> list[dict]:
    """bertbench's pre-training step vs HF's, per sequence length and batch (phase 1 and 2)."""
    table = []
    for name in ("phase1", "phase2"):
        rows = reports.get(name, {}).get("rows", [])
        for seq, batch in dict.fromkeys((row["seq"], row["batch"]) for row in rows):
            variants = by_variant(rows, seq=seq, batch=batch)
            ours, hf = variants.get("baseline"), variants.get("hf")
            if ours:
                table.append(
                    {
                        "part": name,
                        "seq": seq,
                        "batch": batch,
                        **pick(ours, "seq_per_s", "mfu"),
                        "hf_seq_per_s": hf and hf["seq_per_s"],
                        "hf_mfu": hf and hf["mfu"],
                        "vs_hf": ratio(ours, hf, "seq_per_s"),
                    }
                )
    return table


def recompute_rows(reports: Mapping[str, dict]) -> list[dict]:
    """Each policy's step time and saved bytes relative to the baseline's (phase 2, equal batch), and its largest
    batch under the cap with its seq/s there relative to the baseline's at the baseline's largest batch."""
    phase2 = by_variant(reports.get("phase2", {}).get("rows", []))
    largest = {row["variant"]: row for row in reports.get("largest-batch", {}).get("rows", [])}
    table = []
    for variant in RECOMPUTE_VARIANTS:
        timed, searched = phase2.get(variant), largest.get(variant)
        if not timed and not searched:
            continue
        row = {"variant": variant}
        if timed:
            row.update(
                pick(timed, "step_seconds", "batch"),
                slowdown=ratio(timed, phase2.get("baseline"), "step_seconds"),
                saved_vs_baseline=ratio(timed, phase2.get("baseline"), "saved_bytes"),
            )
        if searched:
            row.update(
                max_batch=searched["max_batch"],
                **pick(searched, "seq_per_s_at_max_batch"),
                at_max_vs_baseline=ratio(searched, largest.get("baseline"), "seq_per_s_at_max_batch"),
            )
        table.append(row)
    return table


def compile_rows(reports: Mapping[str, dict]) -> list[dict]:
    rows = reports.get("compile", {}).get("rows", [])
    table = []
    for seq, batch in dict.fromkeys((row["seq"], row["batch"]) for row in rows):
        variants = by_variant(rows, seq=seq, batch=batch)
        eager, compiled = variants.get("baseline"), variants.get("baseline+compile")
        if eager and compiled:
            table.append(
                {
                    "seq": seq,
                    "batch": batch,
                    "eager_seq_per_s": eager["seq_per_s"],
                    **pick(compiled, "seq_per_s", "mfu", "compile_seconds"),
                    "vs_eager": ratio(compiled, eager, "seq_per_s"),
                }
            )
    return table


def finetuning_rows(reports: Mapping[str, dict]) -> list[dict]:
    """The default path's real tokens/s against the padded path's and HF's, per batch."""
    rows = reports.get("finetuning", {}).get("rows", [])
    table = []
    for batch in dict.fromkeys(row["batch"] for row in rows):
        variants = by_variant(rows, batch=batch)
        default = variants.get("baseline")
        if default:
            table.append(
                {
                    "batch": batch,
                    "path": default.get("path"),
                    **pick(default, "real_tokens_per_s", "host_share"),
                    **{
                        f"{name}_real_tokens_per_s": variants[variant]["real_tokens_per_s"]
                        for name, variant in (("padded", "baseline/padded"), ("hf", "hf"), ("hf_dynamic", "hf-dynamic"))
                        if variant in variants
                    },
                    "vs_padded": ratio(default, variants.get("baseline/padded"), "real_tokens_per_s"),
                    "vs_hf": ratio(default, variants.get("hf"), "real_tokens_per_s"),
                    "vs_hf_dynamic": ratio(default, variants.get("hf-dynamic"), "real_tokens_per_s"),
                }
            )
    return table


def optimizer_rows(reports: Mapping[str, dict]) -> list[dict]:
    return [dict(row) for row in reports.get("optimizer", {}).get("rows", [])]


def pick(row: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    """`keys` of a row with their spread (KEY_min, KEY_max, KEY_cv) where it has one."""
    return {name: row[name] for key in keys for name in (key, f"{key}_min", f"{key}_max", f"{key}_cv") if name in row}


def checks(summary: Mapping[str, list[dict]]) -> list[dict]:
    """Each target with the figure it applies to, and whether it holds."""
    found = []

    def check(what: str, value: float | None, target: float, higher_is_better: bool) -> None:
        if value is not None:
            met = value >= target if higher_is_better else value <= target
            found.append(
                {
                    "what": what,
                    "value": value,
                    "target": target,
                    "comparison": ">=" if higher_is_better else "<=",
                    "met": met,
                }
            )

    for row in summary["pretraining"]:
        if (row["seq"], row["batch"]) in ((128, 256), (512, 32)):
            check(f"MFU, pre-training seq {row['seq']} batch {row['batch']}", row.get("mfu"), TARGETS["mfu"], True)
    for row in summary["finetuning"]:
        check(
            f"fine-tuning batch {row['batch']}: default / HF dynamic (real tokens/s)",
            row.get("vs_hf_dynamic"),
            TARGETS["default_vs_hf_dynamic"],
            True,
        )
        check(
            f"fine-tuning batch {row['batch']}: default / padded (real tokens/s)",
            row.get("vs_padded"),
            TARGETS["default_vs_padded"],
            True,
        )
    for row in summary["recompute"]:
        if row["variant"] in ("selective", "full"):
            check(
                f"recompute {row['variant']}: step time / baseline's",
                row.get("slowdown"),
                TARGETS[f"{row['variant']}_slowdown"],
                False,
            )
        if row["variant"] != "baseline":
            check(
                f"recompute {row['variant']}: seq/s at its largest batch / baseline's at its own",
                row.get("at_max_vs_baseline"),
                1.0,
                True,
            )
    for row in summary["optimizer"]:
        if row.get("form") == "fused":  # the GPU's default form
            check(
                f"optimizer {row['optimizer']}: step / memory floor (28 bytes a parameter)",
                row.get("ratio_to_floor"),
                TARGETS["optimizer_vs_floor"],
                False,
            )
    return found


# ---- the report -----------------------------------------------------------------------------------------------------

PRETRAINING_COLUMNS = [
    ("part", "part", ""),
    ("seq", "seq", "d"),
    ("batch", "batch", "d"),
    spread_column("bertbench seq/s", "seq_per_s", ",.1f"),
    ("MFU", "mfu", ".1%"),
    ("HF seq/s", "hf_seq_per_s", ",.1f"),
    ("HF MFU", "hf_mfu", ".1%"),
    ("bertbench / HF", "vs_hf", ".2f"),
]
RECOMPUTE_COLUMNS = [
    ("policy", "variant", ""),
    ("batch", "batch", "d"),
    spread_column("step (s)", "step_seconds", ".4f"),
    ("step vs baseline", "slowdown", ".2f"),
    ("saved for backward vs baseline", "saved_vs_baseline", ".0%"),
    ("largest batch", "max_batch", ",d"),
    spread_column("seq/s at largest batch", "seq_per_s_at_max_batch", ",.1f"),
    ("vs baseline at its largest", "at_max_vs_baseline", ".2f"),
]
COMPILE_COLUMNS = [
    ("seq", "seq", "d"),
    ("batch", "batch", "d"),
    ("eager seq/s", "eager_seq_per_s", ",.1f"),
    spread_column("compiled seq/s", "seq_per_s", ",.1f"),
    ("compiled / eager", "vs_eager", ".2f"),
    ("MFU compiled", "mfu", ".1%"),
    ("compile (s)", "compile_seconds", ".1f"),
]
FINETUNING_COLUMNS = [
    ("batch", "batch", "d"),
    ("default path", "path", ""),
    spread_column("default real tokens/s", "real_tokens_per_s", ",.0f"),
    ("padded", "padded_real_tokens_per_s", ",.0f"),
    ("HF", "hf_real_tokens_per_s", ",.0f"),
    ("HF dynamic", "hf_dynamic_real_tokens_per_s", ",.0f"),
    ("vs padded", "vs_padded", ".2f"),
    ("vs HF", "vs_hf", ".2f"),
    ("vs HF dynamic", "vs_hf_dynamic", ".2f"),
    ("host / step", "host_share", ".0%"),
]
OPTIMIZER_COLUMNS = [
    ("optimizer", "optimizer", ""),
    spread_column("step (ms)", "step_ms", ".2f"),
    ("floor (ms)", "floor_ms", ".2f"),
    ("step / floor", "ratio_to_floor", ".2f"),
    ("rule's floor (ms)", "rule_floor_ms", ".2f"),
    ("step / rule's floor", "ratio_to_rule_floor", ".2f"),
]
PART_COLUMNS = [
    ("part", "name", ""),
    ("what", "what", ""),
    ("seconds", "wall_seconds", ",.0f"),
    ("status", "status_text", ""),
    ("report", "link", ""),
]


def markdown(
    size: str,
    device: torch.device,
    ran: Sequence[dict],
    summary: Mapping[str, list[dict]],
    found: Sequence[dict],
    notes: Sequence[str],
    wall_seconds: float,
) -> str:
    lines = [
        f"# Suite: {size} on {device}",
        "",
        f"{len(ran)} part(s) in {wall_seconds / 60:.1f} minutes. Each part is one bench, its figures measured "
        "interleaved with what they are compared with; its own report (linked) has every row, the spread of "
        "each and its plots. Ratios are of medians.",
        "",
    ]
    lines += [f"- {note}" for note in notes]
    sections = [
        (
            "Pre-training: bertbench vs HF",
            "pretraining",
            PRETRAINING_COLUMNS,
            "MFU counts the model's FLOPs (the MLM head on the masked positions only) against the device's "
            "peak; HF computes its MLM logits at every position, which shows as its lower MFU.",
        ),
        (
            "Recompute: time and memory per policy",
            "recompute",
            RECOMPUTE_COLUMNS,
            "step vs baseline and saved for backward at equal batch (phase 2); largest batch under the cap "
            "(largest-batch), and the seq/s each policy reaches there against the baseline at its own.",
        ),
        ("Compile", "compile", COMPILE_COLUMNS, "compile (s): what compiling added to the first step."),
        (
            "Fine-tuning on real text's lengths",
            "finetuning",
            FINETUNING_COLUMNS,
            "real tokens/s leaves the padding out; vs: the default path's over the other's.",
        ),
        (
            "Optimizer step (clipping included)",
            "optimizer",
            OPTIMIZER_COLUMNS,
            "floor: 28 bytes a parameter (fp32 Adam reads p, g, m, v and writes p, m, v) over the device's "
            "measured memory bandwidth; the rule's floor adds what the rule itself must move (clipping's norm "
            "reads g once more; LAMB's trust ratio needs a second pass).",
        ),
    ]
    for title, key, columns, note in sections:
        if summary[key]:
            lines += ["", f"## {title}", "", markdown_table(summary[key], columns), "", note]
    if found:
        lines += [
            "",
            "## Targets",
            "",
            markdown_table(
                [
                    dict(
                        row,
                        target_text=f"{row['comparison']} {row['target']:g}",
                        met_text="yes" if row["met"] else "NO",
                    )
                    for row in found
                ],
                [
                    ("figure", "what", ""),
                    ("value", "value", ".3f"),
                    ("target", "target_text", ""),
                    ("met", "met_text", ""),
                ],
            ),
        ]
    lines += [
        "",
        "## Parts",
        "",
        markdown_table(
            [
                dict(
                    part,
                    status_text="done"
                    if part["exit_status"] == 0
                    else f"FAILED ({part['exit_status']}): {part.get('error', '')}".replace("|", "/"),
                    link=f"[{part['bench']}.md]({part['name']}/{part['bench']}.md)",
                )
                for part in ran
            ],
            PART_COLUMNS,
        ),
    ]
    lines += ["", "Rerun a part alone with its command from suite.json (`parts[].command`)."]
    return "\n".join(lines)


def plots(summary: Mapping[str, list[dict]]) -> dict:
    """bertbench's speed over each contender's, per setting; each recompute policy's time and memory."""
    result = {}
    versus: dict[str, dict[str, float]] = {}
    for row in summary["pretraining"]:
        if row.get("vs_hf"):
            versus.setdefault("vs HF", {})[f"pre-train {row['seq']}/{row['batch']}"] = row["vs_hf"]
    for row in summary["finetuning"]:
        for key, label in (("vs_padded", "vs padded"), ("vs_hf", "vs HF"), ("vs_hf_dynamic", "vs HF dynamic")):
            if row.get(key):
                versus.setdefault(label, {})[f"fine-tune b{row['batch']}"] = row[key]
    for row in summary["compile"]:
        versus.setdefault("compiled vs eager", {})[f"pre-train {row['seq']}/{row['batch']}"] = row["vs_eager"]
    if versus:
        result["speed"] = bar_plot(
            versus,
            "speed ratio (median over median)",
            "bertbench's speed over each contender's (1 = equal)",
            reference=1.0,
        )
    policies: dict[str, dict[str, float]] = {}
    for row in summary["recompute"]:
        for key, label in (
            ("slowdown", "step time vs baseline"),
            ("saved_vs_baseline", "saved bytes vs baseline"),
            ("at_max_vs_baseline", "seq/s at largest batch vs baseline"),
        ):
            if row.get(key) is not None:
                policies.setdefault(label, {})[row["variant"]] = row[key]
    if policies:
        result["recompute"] = bar_plot(policies, "ratio to the baseline", "recompute policies", reference=1.0)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        device = cli.device(args.device)
        size, chosen, notes = check_settings(args, device)
        directory = cli.output_dir(args, "suite")
        output = BenchOutput(directory, "suite", argv, args.overwrite)
        check_output(directory, chosen, args.overwrite)
        common = [
            *(["--threads", str(args.threads)] if args.threads else []),
            *(["--overwrite"] if args.overwrite else []),
        ]
        for note in notes:
            print(f"note: {note}", flush=True)
        started = time.perf_counter()
        ran = [run_part(part, part.command(directory, device, common)) for part in chosen]
        wall_seconds = time.perf_counter() - started
        reports = {}
        for part in ran:
            path = os.path.join(directory, part["report"])
            if part["exit_status"] == 0 and os.path.exists(path):
                with open(path, encoding="utf-8") as handle:
                    reports[part["name"]] = json.load(handle)
                for message in reports[part["name"]].get("warnings", []):
                    output.warn(f"{part['name']}: {message}")
        summary = {
            "pretraining": pretraining_rows(reports),
            "recompute": recompute_rows(reports),
            "compile": compile_rows(reports),
            "finetuning": finetuning_rows(reports),
            "optimizer": optimizer_rows(reports),
        }
        found = checks(summary) if size == "standard" and device.type == "cuda" else []
        text = markdown(size, device, ran, summary, found, notes, wall_seconds)
        print(
            output.write(
                vars(args),
                {
                    "device": str(device),
                    "size": size,
                    "notes": notes,
                    "wall_seconds": wall_seconds,
                    "parts": ran,
                    "summary": summary,
                    "targets": found,
                },
                text,
                plots(summary),
            )
        )
        print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")
        failed = [part for part in ran if part["exit_status"]]
        if failed:
            raise BenchRunFailed(
                f"{len(failed)} part(s) failed: "
                + "; ".join(
                    f"{part['name']}: {part.get('error', '')} (whole output: "
                    f"{os.path.join(directory, part['name'], 'output.log')})"
                    for part in failed
                )
            )

    return cli.run("bertbench bench suite", body)
