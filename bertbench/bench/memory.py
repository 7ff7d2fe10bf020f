"""`bertbench bench memory`: the largest batch each recompute policy fits under a memory cap, and what it costs.

On a GPU the cap is real: `torch.cuda.set_per_process_memory_fraction` limits the allocator, and a batch fits when
two whole training steps (forward, backward, AdamW with its state) run without running out of memory; the largest
fitting batch is found by doubling, then bisection. On the CPU, where memory is not the limit, the cap is on the
bytes the forward saves for backward, counted exactly by autograd's hooks (bertbench.model.saved_activations). Those bytes are an
affine function of the batch at a fixed sequence length: they are counted at batch 1, 2 and 4, the line through them
must hit all three to the byte, and it gives the largest batch under the cap; that batch and the next are counted
too, to confirm it. In fp32 the counting runs on the meta device (shapes, no memory), so any batch costs nothing;
bf16/fp16 count on the CPU, and only where the batch is small enough. Without an exact line, the search counts
bytes at each probe instead.

Then every variant is timed at one equal batch, interleaved, for the slowdown recompute costs.

    bertbench bench memory --model base --seq_lengths 128,512 --cap_gib 8
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

import torch

from bertbench.bench import cli, measure, workload
from bertbench.bench.output import BenchOutput, markdown_table, spread_column
from bertbench.bench.plots import line_plot
from bertbench.common.noise import LoadWatch, noisy_warning, rate_spread, spread, spread_fields
from bertbench.model.saved_activations import saved_activation_bytes
from bertbench.tasks import synthetic
from bertbench.training import devices

AFFINE_PROBES = (1, 2, 4)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser_for("memory", __doc__.splitlines()[0])
    setting = parser.add_argument_group("setting")
    cli.add_model_flag(setting)
    setting.add_argument("--kind", default="pretraining", choices=workload.STEP_KINDS, help="Step kind.")
    setting.add_argument(
        "--variants",
        type=cli.comma_list(str),
        default=list(workload.ALL_VARIANTS),
        help="baseline, full, selective, every-K.",
    )
    setting.add_argument("--precision", default="fp32", choices=workload.PRECISIONS, help="Step precision.")
    setting.add_argument(
        "--seq_lengths", type=cli.comma_list(cli.positive_int), default=[128, 512], help="Tokens per sequence."
    )
    setting.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: CUDA when available).")
    setting.add_argument("--threads", type=cli.positive_int, default=None, help="CPU threads.")
    search = parser.add_argument_group("search")
    search.add_argument(
        "--cap_gib",
        type=float,
        default=None,
        help="The cap in GiB: on a GPU, of all the process's CUDA memory (default: the whole "
        "device); on the CPU, of the bytes saved for backward (default 8).",
    )
    search.add_argument("--max_batch", type=cli.positive_int, default=65536, help="Largest batch searched.")
    search.add_argument(
        "--verify_tokens",
        type=int,
        default=16384,
        help="CPU, bf16/fp16: count the largest batch and the next one too when batch x seq is at "
        "most this and their bytes fit in half the available memory (the line through batch 1, "
        "2, 4 predicts them either way). fp32 counts every batch, on the meta device.",
    )
    timing = parser.add_argument_group("timing at equal batch")
    timing.add_argument(
        "--time_batch",
        type=int,
        default=None,
        help="Batch of the slowdown comparison (default: the smallest largest-batch, at most 8). 0 skips the timing.",
    )
    timing.add_argument(
        "--time_at_max_batch",
        action="store_true",
        help="Also time every variant at its own largest batch (the speed recompute buys on a GPU).",
    )
    timing.add_argument("--warmup", type=int, default=1, help="Untimed steps per variant.")
    timing.add_argument("--steps", type=cli.positive_int, default=3, help="Timed steps per variant (median).")
    return parser


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """The largest batch b <= limit with fits(b), assuming fitting is monotone: doubling from 1, then bisection
    between the last batch that fit and the first that did not. 0 when batch 1 does not fit."""
    if not fits(1):
        return 0
    low = 1
    while low * 2 <= limit and fits(low * 2):
        low *= 2
    high = min(low * 2, limit + 1)  # does not fit, or is past the limit
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low


class SavedBytes:
    """Bytes a variant's forward saves for backward at a batch size (counted, and remembered per batch). In fp32
    they are counted on the meta device, where tensors have shapes and no memory: the same ops save the same
    tensors (a test checks the counts equal the CPU's), so any batch is counted at once and nothing is allocated.
    Autocast does not act on meta tensors, so bf16 and fp16 are counted on the device itself."""

    def __init__(self, config, kind: str, variant: workload.Variant, precision: str, seq: int, device):
        self.config, self.kind, self.precision, self.seq = config, kind, precision, seq
        self.on_meta = precision == "fp32"
        self.device = torch.device("meta") if self.on_meta else torch.device(device)
        self.model = workload.build(config, kind, variant, self.device)
        self.counted: dict[int, int] = {}

    def __call__(self, batch: int) -> int:
        if batch not in self.counted:
            inputs = synthetic.synthetic_batch(self.config, self.kind, batch, self.seq, self.device)
            if self.on_meta:
                # No padding, so no mask is the same attention; and a mask would be read (.all()), which meta
                # tensors cannot do.
                inputs.pop("attention_mask")
            # [1]: the loss, and with it the graph holding the saved bytes, is freed before the next count
            self.counted[batch] = saved_activation_bytes(
                lambda: workload.forward_loss(self.model, inputs, self.precision, self.device), self.model
            )[1]
        return self.counted[batch]


def available_memory_bytes() -> int:
    """Memory the system can give this process now (Linux's MemAvailable; total physical memory elsewhere)."""
    available = devices.proc_kilobytes("/proc/meminfo", "MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_search(saved: SavedBytes, cap: int, args: argparse.Namespace) -> dict:
    """Largest batch whose saved-for-backward bytes stay under the cap (see the module docstring)."""
    one, two, four = (saved(batch) for batch in AFFINE_PROBES)
    per_sequence, fixed = two - one, 2 * one - two
    result = {"saved_bytes_per_sequence": per_sequence, "saved_bytes_fixed": fixed}
    if fixed + 4 * per_sequence == four and per_sequence > 0:
        largest = max(0, min(args.max_batch, (cap - fixed) // per_sequence))
        # Counting on the CPU holds the batch's saved bytes in memory (and the heap keeps them after): only small
        # batches that fit twice over. On the meta device counting costs nothing.
        affordable = (fixed + (largest + 1) * per_sequence) * 2 < available_memory_bytes()
        result.update(
            method="line through batch 1, 2, 4",
            verified=saved.on_meta or (largest * saved.seq <= args.verify_tokens and affordable),
        )
        if result["verified"]:
            fits = largest == 0 or saved(largest) <= cap
            next_does_not = largest >= args.max_batch or saved(largest + 1) > cap
            if not (fits and next_does_not):
                largest = largest_fitting(lambda batch: saved(batch) <= cap, args.max_batch)
                result["method"] = "bisection (the line missed)"
    else:
        largest = largest_fitting(lambda batch: saved(batch) <= cap, args.max_batch)
        result.update(method="bisection", verified=True)
    result["max_batch"] = largest
    result["saved_bytes_at_max_batch"] = (
        (saved.counted.get(largest) if largest in saved.counted else fixed + largest * per_sequence)
        if largest
        else None
    )
    return result


def gpu_search(
    config, kind: str, variant: workload.Variant, precision: str, seq: int, device: torch.device, limit: int
) -> dict:
    """Largest batch whose training steps run under the allocator's cap; each probe's peak memory is kept, net of
    what the process held before the search (a caller's tensors; see allocator_cap)."""
    held = torch.cuda.memory_allocated(device)
    model = workload.build(config, kind, variant, device)
    probes = []

    def fits(batch: int) -> bool:
        step = None
        try:
            step = workload.train_step(config, kind, variant, precision, batch, seq, device, model)
            devices.reset_peak_memory(device)
            step()
            step()  # the second step runs with AdamW's state allocated
            devices.synchronize(device)
            probes.append({"batch": batch, "fits": True, "peak_bytes": devices.peak_memory_bytes(device) - held})
            return True
        except torch.cuda.OutOfMemoryError:
            probes.append({"batch": batch, "fits": False, "peak_bytes": None})
            return False
        finally:
            model.zero_grad(set_to_none=True)
            del step
            torch.cuda.empty_cache()

    largest = largest_fitting(fits, limit)
    peak = next((probe["peak_bytes"] for probe in probes if probe["batch"] == largest and probe["fits"]), None)
    return {
        "max_batch": largest,
        "method": "doubling + bisection under the allocator cap",
        "verified": True,
        "peak_bytes_at_max_batch": peak,
        "probes": probes,
    }


def time_variants(
    config,
    kind: str,
    variants: Sequence[workload.Variant],
    precision: str,
    seq: int,
    batches: dict[str, int],
    device: torch.device,
    args: argparse.Namespace,
) -> dict[str, list[float]]:
    """Step seconds of each variant at its batch in `batches`, interleaved."""
    steps = {
        variant.name: workload.train_step(config, kind, variant, precision, batches[variant.name], seq, device)
        for variant in variants
        if batches[variant.name] > 0
    }
    return measure.time_steps(steps, args.warmup, args.steps, device)


def measure_sequence_length(
    args: argparse.Namespace, variants: Sequence[workload.Variant], seq: int, device: torch.device, cap: int
) -> list[dict]:
    config = workload.bert_config(args.model, seq)
    rows = []
    for variant in variants:
        if device.type == "cuda":
            found = gpu_search(config, args.kind, variant, args.precision, seq, device, args.max_batch)
            torch.cuda.empty_cache()  # the searched model is gone: give its memory back before the next one
        else:
            found = cpu_search(SavedBytes(config, args.kind, variant, args.precision, seq, device), cap, args)
        rows.append(
            {
                "model": args.model,
                "kind": args.kind,
                "precision": args.precision,
                "seq": seq,
                "variant": variant.name,
                **found,
            }
        )
        print(f"  seq {seq} {variant.name:<10} largest batch {found['max_batch']} ({found['method']})", flush=True)
    baseline = rows[0]
    for row in rows:
        row["max_batch_vs_first"] = row["max_batch"] / baseline["max_batch"] if baseline["max_batch"] else None
    time_batch = args.time_batch if args.time_batch is not None else min(8, *(row["max_batch"] for row in rows))
    if time_batch > 0:
        seconds = time_variants(
            config,
            args.kind,
            variants,
            args.precision,
            seq,
            {variant.name: time_batch for variant in variants},
            device,
            args,
        )
        for row in rows:
            row.update(
                time_batch=time_batch,
                **spread_fields("step_seconds", spread(seconds[row["variant"]])),
                **spread_fields("seq_per_s", rate_spread(time_batch, seconds[row["variant"]])),
            )
        for row in rows:  # of the medians
            row["slowdown"] = row["step_seconds"] / baseline["step_seconds"]
    if args.time_at_max_batch:
        seconds = time_variants(
            config,
            args.kind,
            variants,
            args.precision,
            seq,
            {row["variant"]: row["max_batch"] for row in rows},
            device,
            args,
        )
        for row in rows:
            if row["variant"] in seconds:
                row.update(
                    spread_fields("seq_per_s_at_max_batch", rate_spread(row["max_batch"], seconds[row["variant"]]))
                )
    return rows


def markdown(rows: list[dict], args: argparse.Namespace, device: torch.device, cap: int) -> str:
    what = "CUDA memory (allocator cap)" if device.type == "cuda" else "bytes saved for backward"
    lines = [
        f"# Memory: {args.model}, {args.kind}, {args.precision} on {device}",
        "",
        f"Cap: {cap / 2**30:.2f} GiB of {what}. Slowdown: step time at an equal batch relative to "
        f"{rows[0]['variant']}.",
        "",
    ]
    table = [
        dict(
            row,
            verified_text="yes" if row["verified"] else "line only",
            per_sequence_mib=row.get("saved_bytes_per_sequence", 0) / 2**20
            if "saved_bytes_per_sequence" in row
            else None,
        )
        for row in rows
    ]
    columns = [
        ("seq", "seq", "d"),
        ("variant", "variant", ""),
        ("largest batch", "max_batch", ",d"),
        ("vs first", "max_batch_vs_first", ".2f"),
        ("measured", "verified_text", ""),
    ]
    if device.type != "cuda":
        columns.append(("saved MiB / sequence", "per_sequence_mib", ",.2f"))
    columns += [
        ("time batch", "time_batch", "d"),
        spread_column("step (s): median (min–max, CV)", "step_seconds", ".3f"),
        ("seq/s", "seq_per_s", ".2f"),
        ("slowdown", "slowdown", ".2f"),
    ]
    if args.time_at_max_batch:
        columns.append(spread_column("seq/s at largest batch", "seq_per_s_at_max_batch", ".2f"))
    lines.append(markdown_table(table, columns))
    return "\n".join(lines)


def plots(rows: list[dict], device: torch.device, cap: int) -> dict:
    """Memory vs batch per policy, with the cap and each policy's largest batch marked: the line through the
    counted bytes on the CPU, the fitting probes' peaks on a GPU."""
    result = {}
    for seq in sorted({row["seq"] for row in rows}):
        group = [row for row in rows if row["seq"] == seq]
        series, marks = {}, {}
        for row in group:
            if device.type == "cuda":
                fitting = sorted((probe["batch"], probe["peak_bytes"]) for probe in row["probes"] if probe["fits"])
                series[row["variant"]] = ([b for b, _ in fitting], [p / 2**30 for _, p in fitting])
                at_largest = row["peak_bytes_at_max_batch"]
            else:
                top = max(2, max(row["max_batch"] for row in group))
                batches = sorted({1 << k for k in range(top.bit_length())} | {top})
                series[row["variant"]] = (
                    batches,
                    [(row["saved_bytes_fixed"] + b * row["saved_bytes_per_sequence"]) / 2**30 for b in batches],
                )
                at_largest = row["saved_bytes_at_max_batch"]
            if row["max_batch"] and at_largest is not None:
                marks[row["variant"]] = (
                    row["max_batch"],
                    at_largest / 2**30,
                    f"{row['variant']}: {row['max_batch']:,}",
                )
        xs = sorted({x for xs, _ in series.values() for x in xs}) or [1]
        label = "peak CUDA memory (GiB)" if device.type == "cuda" else "saved for backward (GiB)"
        result[f"seq{seq}"] = line_plot(
            series,
            "batch size",
            label,
            f"{group[0]['model']}, {group[0]['kind']}, seq {seq}: memory vs batch (star: largest batch under the cap)",
            log_x=True,
            reference=([xs[0], xs[-1]], [cap / 2**30] * 2, "cap"),
            marks=marks,
        )
    return result


@contextlib.contextmanager
def allocator_cap(device: torch.device, cap: int):
    """On a GPU, cap the CUDA allocator at `cap` bytes beyond what the process already holds (a caller's tensors: a
    notebook's, another bench's in the same process; none in a fresh `bertbench bench memory`), and lift the cap
    afterwards, so that a later allocation in the same process does not inherit it; nothing on the CPU."""
    if device.type != "cuda":
        yield
        return
    total, held = torch.cuda.get_device_properties(device).total_memory, torch.cuda.memory_allocated(device)
    torch.cuda.set_per_process_memory_fraction(min(1.0, (cap + held) / total), device.index)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device.index)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        variants = [workload.Variant.parse(name) for name in args.variants]
        workload.bert_config(args.model, max(args.seq_lengths))
        if args.cap_gib is not None and args.cap_gib <= 0:
            raise workload.BenchError(f"--cap_gib must be positive, got {args.cap_gib}")
        output = BenchOutput(cli.output_dir(args, "memory"), "memory", argv, args.overwrite)
        if args.threads:
            torch.set_num_threads(args.threads)
        device = cli.device(args.device)
        if device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            cap = min(total, int(args.cap_gib * 2**30)) if args.cap_gib else total
        else:
            cap = int((args.cap_gib or 8) * 2**30)
        load = LoadWatch()
        with allocator_cap(device, cap):
            rows = [
                row for seq in args.seq_lengths for row in measure_sequence_length(args, variants, seq, device, cap)
            ]
        output.warn(load.busy())
        output.warn(
            noisy_warning(
                [row for row in rows if "step_seconds" in row],
                "step_seconds",
                lambda row: f"seq {row['seq']} {row['variant']} batch {row['time_batch']}",
                "step times",
            )
        )
        text = markdown(rows, args, device, cap)
        print(
            output.write(
                vars(args), {"device": str(device), "cap_bytes": cap, "rows": rows}, text, plots(rows, device, cap)
            )
        )
        print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")

    return cli.run("bertbench bench memory", body)
