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

import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch

from bertbench.bench import measure, settings, workload
from bertbench.bench.output import BenchOutput
from bertbench.bench.plots import line_plot
from bertbench.bench.results import Column, Ratio, Row, Spread, noisy_ratios_note, table
from bertbench.common.flags import setting
from bertbench.common.noise import LoadWatch, noisy_warning
from bertbench.model.saved_activations import saved_activation_bytes
from bertbench.tasks import synthetic
from bertbench.training import devices

AFFINE_PROBES = (1, 2, 4)


@dataclasses.dataclass(frozen=True)
class MemorySettings(settings.MeasuredSettings):
    """What is searched, under which cap, and the timing at equal batch."""

    bench: ClassVar[str] = "memory"

    model: str = settings.model_setting()
    kind: str = setting("Step kind.", "pretraining", choices=workload.STEP_KINDS)
    variants: tuple[str, ...] = setting("baseline, full, selective, every-K.", workload.ALL_VARIANTS)
    precision: str = settings.precision_setting()
    seq_lengths: tuple[int, ...] = setting("Tokens per sequence.", (128, 512), positive=True)
    cap_gib: float | None = setting(
        "The cap in GiB: on a GPU, of all the process's CUDA memory (default: the whole device); on the CPU, of the "
        "bytes saved for backward (default 8).",
        None,
        positive=True,
    )
    max_batch: int = setting("Largest batch searched.", 65536, positive=True)
    verify_tokens: int = setting(
        "CPU, bf16/fp16: count the largest batch and the next one too when batch x seq is at most this and their "
        "bytes fit in half the available memory (the line through batch 1, 2, 4 predicts them either way). fp32 "
        "counts every batch, on the meta device.",
        16384,
        at_least=0,
    )
    time_batch: int | None = setting(
        "Batch of the slowdown comparison (default: the smallest largest-batch, at most 8). 0 skips the timing.",
        None,
        at_least=0,
    )
    time_at_max_batch: bool = setting(
        "Also time every variant at its own largest batch (the speed recompute buys on a GPU).", False
    )
    warmup: int = setting("Untimed steps per variant.", 1)
    steps: int = setting("Timed steps per variant, interleaved (median).", 3)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.parsed_variants()

    def parsed_variants(self) -> list[workload.Variant]:
        try:
            return [workload.Variant.parse(name) for name in self.variants]
        except workload.BenchError as error:
            raise ValueError(f"variants: {error}") from None


SETTINGS = MemorySettings


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


def cpu_search(saved: SavedBytes, cap: int, max_batch: int, verify_tokens: int) -> dict:
    """Largest batch up to `max_batch` whose saved-for-backward bytes stay under the cap (see the module docstring;
    `verify_tokens`: --verify_tokens)."""
    one, two, four = (saved(batch) for batch in AFFINE_PROBES)
    per_sequence, fixed = two - one, 2 * one - two
    result = {"saved_bytes_per_sequence": per_sequence, "saved_bytes_fixed": fixed}
    if fixed + 4 * per_sequence == four and per_sequence > 0:
        largest = max(0, min(max_batch, (cap - fixed) // per_sequence))
        # Counting on the CPU holds the batch's saved bytes in memory (and the heap keeps them after): only small
        # batches that fit twice over. On the meta device counting costs nothing.
        affordable = (fixed + (largest + 1) * per_sequence) * 2 < available_memory_bytes()
        result.update(
            method="line through batch 1, 2, 4",
            verified=saved.on_meta or (largest * saved.seq <= verify_tokens and affordable),
        )
        if result["verified"]:
            fits = largest == 0 or saved(largest) <= cap
            next_does_not = largest >= max_batch or saved(largest + 1) > cap
            if not (fits and next_does_not):
                largest = largest_fitting(lambda batch: saved(batch) <= cap, max_batch)
                result["method"] = "bisection (the line missed)"
    else:
        largest = largest_fitting(lambda batch: saved(batch) <= cap, max_batch)
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
    settings: MemorySettings,
    config,
    variants: Sequence[workload.Variant],
    seq: int,
    batches: dict[str, int],
    device: torch.device,
) -> dict[str, list[float]]:
    """Step seconds of each variant at its batch in `batches`, interleaved."""
    steps = {
        variant.name: workload.train_step(
            config, settings.kind, variant, settings.precision, batches[variant.name], seq, device
        )
        for variant in variants
        if batches[variant.name] > 0
    }
    return measure.time_steps(steps, settings.warmup, settings.steps, device)


def measure_sequence_length(settings: MemorySettings, seq: int, device: torch.device, cap: int) -> list[Row]:
    """A row per variant at sequence length `seq`: its largest batch under the cap, and its step at an equal batch."""
    config = workload.bert_config(settings.model, seq)
    variants = settings.parsed_variants()
    found = {}
    for variant in variants:
        if device.type == "cuda":
            found[variant.name] = gpu_search(
                config, settings.kind, variant, settings.precision, seq, device, settings.max_batch
            )
            torch.cuda.empty_cache()  # the searched model is gone: give its memory back before the next one
        else:
            saved = SavedBytes(config, settings.kind, variant, settings.precision, seq, device)
            found[variant.name] = cpu_search(saved, cap, settings.max_batch, settings.verify_tokens)
        print(
            f"  seq {seq} {variant.name:<10} largest batch {found[variant.name]['max_batch']} "
            f"({found[variant.name]['method']})",
            flush=True,
        )
    largest = {name: columns.pop("max_batch") for name, columns in found.items()}
    first = largest[variants[0].name]
    for name, columns in found.items():
        columns["max_batch_vs_first"] = Ratio.of(largest[name], first) if first else None
    time_batch = settings.time_batch if settings.time_batch is not None else min(8, *largest.values())
    if time_batch > 0:
        seconds = time_variants(settings, config, variants, seq, dict.fromkeys(largest, time_batch), device)
        steps = {name: Spread.of(times) for name, times in seconds.items()}
        for name, columns in found.items():
            columns.update(
                time_batch=time_batch,
                step_seconds=steps[name],
                seq_per_s=Spread.of_rate(time_batch, seconds[name]),
                slowdown=Ratio.of(steps[name], steps[variants[0].name]),
            )
    if settings.time_at_max_batch:
        seconds = time_variants(settings, config, variants, seq, largest, device)
        for name, times in seconds.items():
            found[name]["seq_per_s_at_max_batch"] = Spread.of_rate(largest[name], times)
    return [
        Row(
            "max_batch",
            "sequences",
            {
                "model": settings.model,
                "kind": settings.kind,
                "precision": settings.precision,
                "seq": seq,
                "variant": name,
            },
            Spread.exact(largest[name]) if largest[name] else None,
            columns,
            "measured" if largest[name] else "no batch fits under the cap",
        )
        for name, columns in found.items()
    ]


def max_batch(row: Row) -> int:
    """The row's largest batch; 0 when none fits."""
    return int(row.median() or 0)


def markdown(rows: list[Row], settings: MemorySettings, device: torch.device, cap: int) -> str:
    what = "CUDA memory (allocator cap)" if device.type == "cuda" else "bytes saved for backward"
    columns = [
        Column("seq", "seq", "d"),
        Column("variant", "variant", ""),
        Column("largest batch", "max_batch", ",d"),
        Column("vs first", "max_batch_vs_first", ".2f"),
        Column("measured", "verified", lambda row: "yes" if row.get("verified") else "line only"),
    ]
    if device.type != "cuda":
        columns.append(
            Column(
                "saved MiB / sequence",
                "saved_bytes_per_sequence",
                lambda row: f"{row.get('saved_bytes_per_sequence') / 2**20:,.2f}",
            )
        )
    columns += [
        Column("time batch", "time_batch", "d"),
        Column("step (s): median (min–max, CV)", "step_seconds", ".3f"),
        Column("seq/s", "seq_per_s", ".2f"),
        Column("slowdown", "slowdown", ".2f"),
    ]
    if settings.time_at_max_batch:
        columns.append(Column("seq/s at largest batch", "seq_per_s_at_max_batch", ".2f"))
    lines = [
        f"# Memory: {settings.model}, {settings.kind}, {settings.precision} on {device}",
        "",
        f"Cap: {cap / 2**30:.2f} GiB of {what}. Slowdown: step time at an equal batch relative to "
        f"{rows[0].get('variant')}.",
        "",
        table(rows, columns),
    ]
    note = noisy_ratios_note(rows)
    return "\n".join([*lines, *(["", note] if note else [])])


def plots(rows: list[Row], device: torch.device, cap: int) -> dict:
    """Memory vs batch per policy, with the cap and each policy's largest batch marked: the line through the
    counted bytes on the CPU, the fitting probes' peaks on a GPU."""
    result = {}
    for seq in sorted({row.get("seq") for row in rows}):
        group = [row for row in rows if row.get("seq") == seq]
        top = max(2, *(max_batch(row) for row in group))
        series, marks = {}, {}
        for row in group:
            variant, largest = row.get("variant"), max_batch(row)
            if device.type == "cuda":
                fitting = sorted((probe["batch"], probe["peak_bytes"]) for probe in row.get("probes") if probe["fits"])
                series[variant] = ([b for b, _ in fitting], [p / 2**30 for _, p in fitting])
                at_largest = row.get("peak_bytes_at_max_batch")
            else:
                batches = sorted({1 << k for k in range(top.bit_length())} | {top})
                fixed, per_sequence = row.get("saved_bytes_fixed"), row.get("saved_bytes_per_sequence")
                series[variant] = (batches, [(fixed + b * per_sequence) / 2**30 for b in batches])
                at_largest = row.get("saved_bytes_at_max_batch")
            if largest and at_largest is not None:
                marks[variant] = (largest, at_largest / 2**30, f"{variant}: {largest:,}")
        xs = sorted({x for xs, _ in series.values() for x in xs}) or [1]
        label = "peak CUDA memory (GiB)" if device.type == "cuda" else "saved for backward (GiB)"
        result[f"seq{seq}"] = line_plot(
            series,
            "batch size",
            label,
            f"{group[0].get('model')}, {group[0].get('kind')}, seq {seq}: memory vs batch "
            "(star: largest batch under the cap)",
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


def run(settings: MemorySettings, argv: list[str]) -> None:
    workload.bert_config(settings.model, max(settings.seq_lengths))
    output = BenchOutput(settings.directory, "memory", argv, settings.overwrite)
    device = settings.torch_device()
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        cap = min(total, int(settings.cap_gib * 2**30)) if settings.cap_gib else total
    else:
        cap = int((settings.cap_gib or 8) * 2**30)
    load = LoadWatch()
    with allocator_cap(device, cap):
        rows = [row for seq in settings.seq_lengths for row in measure_sequence_length(settings, seq, device, cap)]
    output.warn(load.busy())
    timed = [row for row in rows if row.get("step_seconds") is not None]
    output.warn(
        noisy_warning(
            [{"step_seconds_cv": row.get("step_seconds").cv, **row.setting, **row.columns} for row in timed],
            "step_seconds",
            lambda row: f"seq {row['seq']} {row['variant']} batch {row['time_batch']}",
            "step times",
        )
    )
    text = markdown(rows, settings, device, cap)
    output.write_result(settings, rows, {"device": str(device), "cap_bytes": cap}, text, plots(rows, device, cap))
    print(text)
    print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")


main = settings.main_for(MemorySettings, __doc__.splitlines()[0], run)
