"""`bertbench bench profile`: a torch.profiler trace of a few training steps and where their time goes.

The suite's answer to an nvprof / Nsight flow: warm-up steps run unprofiled, then `--steps` steps run under
torch.profiler. It writes the Chrome trace (profile-trace.json: chrome://tracing or https://ui.perfetto.dev), the
top operators by self time (CPU time on the CPU, kernel time on a GPU), and the share of the operators' self time in
matmul, attention, dropout, LayerNorm/activations, the optimizer and the rest.

Self time is summed so that nested ops are not counted twice, and an op is credited to the outermost op it runs
inside: the bmm and softmax of SDPA's math path count as attention, the bernoulli_ of a dropout as dropout, the
bias gradient's sum and the operand copies of a Linear as matmul. Backward ops are credited to the forward op that
created their autograd node (linked by sequence number), so the attention's backward is attention even when it runs
as plain bmm kernels; ops that a recompute variant re-runs in the backward are classified by their own forward.

    bertbench bench profile --model base --batch_size 8 --steps 3
    bertbench bench profile --model tiny --batch_size 2 --max_seq_length 32 --device cpu    # a quick look
    bertbench bench profile --model mini --kind finetuning --batch_size 16 --lengths real-text --steps 10
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity

from bertbench.bench import settings, workload
from bertbench.bench.output import BenchOutput
from bertbench.bench.results import Column, Row, Spread, table
from bertbench.common.durable import atomic_output
from bertbench.common.errors import UsageError
from bertbench.common.flags import description, setting
from bertbench.common.noise import LoadWatch, noisy_warning
from bertbench.model import flops
from bertbench.model.config import BertConfig
from bertbench.tasks import synthetic
from bertbench.training import devices

CATEGORIES = ("matmul", "attention", "dropout", "norm_activation", "optimizer", "other")

# Dense matmuls and what nn.Linear / torch.matmul dispatch to (their backward is made of the same ops).
MATMUL_OPS = frozenset(
    f"aten::{name}"
    for name in (
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "addbmm",
        "matmul",
        "linear",
        "_addmm_activation",
        "mv",
        "addmv",
        "dot",
        "einsum",
        "_scaled_mm",
        "_int_mm",
        "mkldnn_linear",
        "linear_backward",
        "mkldnn_linear_backward",
        "mkldnn_linear_backward_input",
        "mkldnn_linear_backward_weights",
    )
)
NORM_ACTIVATION_PARTS = ("layer_norm", "gelu", "tanh")


@dataclasses.dataclass(frozen=True)
class ProfileSettings(settings.MeasuredSettings):
    """Step."""

    bench = "profile"

    model: str = settings.model_setting()
    kind: str = setting(
        "pretraining (MLM + NSP heads) or finetuning (2-way classifier).", "pretraining", choices=workload.STEP_KINDS
    )
    variant: str = setting("baseline, full, selective or every-K (recompute policies).", "baseline")
    precision: str = settings.precision_setting()
    batch_size: int = setting("Sequences per step.", 8, positive=True)
    max_seq_length: int = setting("Tokens per sequence (padding included).", 128, positive=True)
    lengths: str = setting(
        "The real lengths of the sequences, as bench throughput's --lengths: full (no padding), real-text (the "
        "built-in distribution of real text's, mean 64.2) or a file of lengths; the profiled steps go round a "
        "seeded cycle of --steps batches drawn from it, each once. Padding takes the unpadded path unless the "
        "variant says otherwise.",
        "full",
    )
    warmup: int = setting("Unprofiled steps first (start-up, allocator, kernel selection).", 2)
    steps: int = setting("Profiled steps.", 3)
    seed: int = setting("Seed of the model's weights, the synthetic batches and their --lengths.", 0)
    top: int = setting("Operators in the table.", 15, positive=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            workload.Variant.parse(self.variant)  # an unknown variant is refused with the other settings
        except workload.BenchError as error:
            raise UsageError(f"--variant: {error}") from None
        try:
            workload.Lengths.parse(self.lengths)
        except workload.BenchError as error:  # its message names --lengths or the file
            raise UsageError(str(error)) from None

    @property
    def step_lengths(self) -> workload.Lengths:
        return workload.Lengths.parse(self.lengths)

    @property
    def step_variant(self) -> workload.Variant:
        return workload.Variant.parse(self.variant)

    @property
    def row_setting(self) -> dict[str, Any]:
        """What tells this profile from another's: every row's setting."""
        return {
            "model": self.model,
            "kind": self.kind,
            "variant": self.variant,
            "precision": self.precision,
            "batch_size": self.batch_size,
            "max_seq_length": self.max_seq_length,
            "lengths": self.lengths,
        }


SETTINGS = ProfileSettings


def op_category(name: str) -> str | None:
    """The category an op's (or a profiler range's) own name implies; None when the name alone says nothing, as
    for aten::softmax, which is attention's inside SDPA and not elsewhere."""
    if name.startswith("Optimizer."):  # the range torch.optim opens around step() and zero_grad()
        return "optimizer"
    if name.startswith("bertbench::") and "attention" in name:  # the varlen kernel's custom op, and its backward
        return "attention"
    if not name.startswith("aten::"):
        return None
    if name in MATMUL_OPS:
        return "matmul"
    if "attention" in name:  # scaled_dot_product_attention and its flash / efficient / cudnn / math kernels
        return "attention"
    if "dropout" in name:
        return "dropout"
    if any(part in name for part in NORM_ACTIVATION_PARTS):
        return "norm_activation"
    if "foreach" in name or name.startswith(("aten::_fused_adam", "aten::_fused_sgd", "aten::_amp_")):
        return "optimizer"  # fused / multi-tensor optimizers, and the fp16 loss scaler's unscale and update
    return None


def _is_forward_op(event: FunctionEvent) -> bool:
    """An op that autograd recorded while grad mode was on: it has a sequence number, and no forward thread (the
    backward's ranges have one)."""
    return event.sequence_nr >= 0 and event.fwd_thread == 0


def _is_autograd_node(event: FunctionEvent) -> bool:
    """A backward node's range ("MmBackward0"): it carries the sequence number and thread of the forward op that
    created it. The engine's range around it ("autograd::engine::evaluate_function: MmBackward0") carries them too
    but is left out: what runs there outside the node, such as adding up the gradients of a tensor used twice, is
    not the forward op's work."""
    return (
        event.fwd_thread > 0
        and event.sequence_nr >= 0
        and not event.name.startswith("autograd::engine::evaluate_function")
    )


def event_category(event: FunctionEvent, forward_ops: Mapping[tuple[int, int], FunctionEvent]) -> str:
    """The category of the outermost classified range around `event`, looking through a backward node into the
    forward op that created it. A forward op seen before reaching a backward node means the op is being recomputed
    there (activation checkpointing): it keeps its own forward's category, not the node's."""
    category, inside_forward_op = None, False
    node: FunctionEvent | None = event
    while node is not None:
        if _is_autograd_node(node):
            forward = forward_ops.get((node.fwd_thread, node.sequence_nr))
            if inside_forward_op or forward is None:
                break
            node = forward
            continue
        inside_forward_op |= _is_forward_op(node)
        category = op_category(node.name) or category
        node = node.cpu_parent
    return category or "other"


def self_seconds(event: Any, device_time: bool) -> float:
    """An op's own time, without its children's: kernel time on a GPU, CPU time otherwise (profiler: us)."""
    return (event.self_device_time_total if device_time else event.self_cpu_time_total) / 1e6


def categorized_ops(events: Sequence[FunctionEvent]) -> Iterator[tuple[FunctionEvent, str]]:
    """Each aten op among the profiler's `events`, with its category."""
    # Ops inside a forward op share its sequence number; the last one started is the innermost, the op whose
    # autograd node carries the number.
    forward_ops = {(event.thread, event.sequence_nr): event for event in events if _is_forward_op(event)}
    for event in events:
        if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("aten::"):
            yield event, event_category(event, forward_ops)


def category_seconds(events: Sequence[FunctionEvent], device_time: bool) -> dict[str, float]:
    """Self time of the aten ops in `events`, summed per category."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    for event, category in categorized_ops(events):
        seconds[category] += self_seconds(event, device_time)
    return seconds


def top_operators(
    averages: Sequence[Any], device_time: bool, steps: int, profiled_seconds: float, top: int
) -> list[dict[str, Any]]:
    """The `top` aten ops by total self time, from the profiler's key_averages()."""
    rows = [
        {"name": average.key, "calls": average.count, "self_seconds": self_seconds(average, device_time)}
        for average in averages
        if average.key.startswith("aten::")
    ]
    rows.sort(key=lambda row: row["self_seconds"], reverse=True)
    return [
        dict(row, seconds_per_step=row["self_seconds"] / steps, step_share=row["self_seconds"] / profiled_seconds)
        for row in rows[:top]
    ]


def profile_steps(
    step: workload.BenchStep, warmup: int, steps: int, trace_path: str
) -> tuple[list[float], torch.profiler.profile]:
    """Seconds of each profiled step (wall clock, synchronised) and the profiler; the trace goes to `trace_path`,
    written under a temporary name and renamed, so a killed run leaves no half-written trace."""
    for _ in range(warmup):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if step.device.type == "cuda" else [])
    seconds = []
    with torch.profiler.profile(activities=activities, record_shapes=False) as profiler:
        for _ in range(steps):
            devices.synchronize(step.device)
            started = time.perf_counter()
            step()
            devices.synchronize(step.device)
            seconds.append(time.perf_counter() - started)
            profiler.step()
    os.makedirs(os.path.dirname(trace_path) or ".", exist_ok=True)
    with atomic_output(trace_path) as temporary:
        profiler.export_chrome_trace(temporary)
    return seconds, profiler


def category_plot(shares: Mapping[str, float], title: str) -> Figure:
    """Horizontal bars of each category's share of the operators' self time, first category on top."""
    figure = Figure(figsize=(6.4, 3.2))
    axes = figure.add_subplot()
    names = list(shares)[::-1]
    bars = axes.barh(names, [shares[name] for name in names], color="tab:blue")
    axes.bar_label(bars, labels=[f"{shares[name]:.1%}" for name in names], padding=3, fontsize=8)
    axes.set_xlim(0, min(1.0, max(shares.values()) * 1.2 + 0.05))
    axes.xaxis.set_major_formatter(PercentFormatter(1.0))
    axes.set_xlabel("share of operator self time")
    axes.set_title(title, fontsize=10)
    axes.grid(True, axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


def ms_per_step(row: Row) -> str:
    return f"{row.median() * 1e3:.2f}"


CATEGORY_COLUMNS = [
    Column("category", "category"),
    Column("ms per step", "seconds_per_step", ms_per_step),
    Column("share", "share", ".1%"),
]
OPERATOR_COLUMNS = [
    Column("operator", "operator"),
    Column("calls", "calls", "d"),
    Column("self ms", "self_seconds", lambda row: f"{row.get('self_seconds') * 1e3:.2f}"),
    Column("share of step", "step_share", ".1%"),
    Column("ms per step", "seconds_per_step", ms_per_step),
]


def markdown(title: str, rows: Sequence[Row], context: Mapping[str, Any]) -> str:
    step = rows[0]
    time_kind = context["time"]
    rest = "GPU idle time" if time_kind == "self CUDA" else "Python, the autograd engine and the profiler"
    categories = [row for row in rows if row.measured == "category_seconds_per_step"]
    operators = [row for row in rows if row.measured == "operator_seconds_per_step"]

    def tflops(key: str) -> str:
        value = step.get(key)
        return "–" if value is None else f"{value:.3g} TFLOP/s"

    spread_of_steps = "" if step.value.cv is None else f"; the steps: {step.value.scaled(1e3).text('.1f')} ms"
    lines = [
        f"# Profile: {title}",
        "",
        f"- step: {step.get('mean_step_seconds') * 1e3:.1f} ms ({context['step_timing']}{spread_of_steps})",
        f"- aten operators' {time_kind} time: {step.get('operator_share_of_step'):.1%} of the step (the rest: {rest})",
        f"- model FLOPs per step: {step.get('model_flops_per_step'):.4g}, of which attention scores and mix "
        f"{step.get('attention_flops_per_step'):.4g}",
        f"- achieved: matmul {tflops('matmul_tflops_per_s')} (the dense layers' model FLOPs / "
        f"{time_kind} time of the matmul category), attention {tflops('attention_tflops_per_s')} "
        "(scores and mix FLOPs / attention time)",
        f"- trace: {context['trace']} (chrome://tracing or https://ui.perfetto.dev)",
        "",
        f"## Time by category ({time_kind}, per step)",
        "",
        table(categories, CATEGORY_COLUMNS),
        "",
        f"## Top {len(operators)} operators by {time_kind} time ({context['profiled_steps']} steps)",
        "",
        table(operators, OPERATOR_COLUMNS),
    ]
    return "\n".join(lines)


def rows_of(
    settings: ProfileSettings,
    config: BertConfig,
    step: workload.BenchStep,
    step_seconds: Sequence[float],
    profiler: torch.profiler.profile,
) -> list[Row]:
    """The rows of a profiled run: the step (its time with the FLOPs, matmul TFLOP/s and each category's share as
    columns), then a row per category and one per top operator, each its self time per step. FLOPs count each
    sequence at its real length, whatever the path computes on the padding (bench throughput's rule)."""
    device = step.device
    device_time = device.type == "cuda"  # the profiler records kernel times only for CUDA here
    profiled_seconds = sum(step_seconds)
    seconds = category_seconds(profiler.events(), device_time)
    operator_seconds = sum(seconds.values())
    pretraining = settings.kind == "pretraining"
    model_flops = step.per_step(
        lambda length: flops.train_flops(
            config, settings.kind, length, synthetic.masked_positions(length) if pretraining else 0
        )
    )
    attention_flops = step.per_step(lambda length: 3 * flops.attention_forward_flops(config, length))

    def tflops_per_s(category_flops: int, category: str) -> float | None:
        return category_flops * settings.steps / seconds[category] / 1e12 if seconds[category] > 0 else None

    shares = {name: value / operator_seconds for name, value in seconds.items()}
    step_row = Row(
        "step_seconds",
        "s",
        settings.row_setting,
        Spread.of(step_seconds),
        {
            # The categories' times are per-step means of the same steps: their shares are of the mean step.
            "mean_step_seconds": statistics.fmean(step_seconds),
            "operator_share_of_step": operator_seconds / profiled_seconds,
            **{f"{name}_share": share for name, share in shares.items()},
            "model_flops_per_step": model_flops,
            "attention_flops_per_step": attention_flops,
            "matmul_tflops_per_s": tflops_per_s(model_flops - attention_flops, "matmul"),
            "attention_tflops_per_s": tflops_per_s(attention_flops, "attention"),
        },
    )
    categories = [
        Row(
            "category_seconds_per_step",
            "s",
            {**settings.row_setting, "category": name},
            Spread.exact(value / settings.steps),
            {"share": shares[name]},
        )
        for name, value in seconds.items()
    ]
    averages = profiler.key_averages()
    operators = [
        Row(
            "operator_seconds_per_step",
            "s",
            {**settings.row_setting, "operator": operator["name"]},
            Spread.exact(operator["seconds_per_step"]),
            {key: operator[key] for key in ("calls", "self_seconds", "step_share")},
        )
        for operator in top_operators(averages, device_time, settings.steps, profiled_seconds, settings.top)
    ]
    return [step_row, *categories, *operators]


def run(settings: ProfileSettings, argv: Sequence[str]) -> None:
    config = workload.bert_config(settings.model, settings.max_seq_length)
    device = settings.torch_device()
    output = BenchOutput(
        settings.directory, settings.bench, argv, settings.overwrite, other_files=["profile-trace.json"]
    )
    trace_path = output.path("-trace.json")
    lengths = settings.step_lengths  # a file of lengths, when one is given, read once
    # No CUDA graphs: a replayed graph's kernels belong to no operator, and the profile is of the operators.
    step = workload.train_step(
        config,
        settings.kind,
        settings.step_variant,
        settings.precision,
        settings.batch_size,
        settings.max_seq_length,
        device,
        lengths=lengths,
        steps=settings.steps,
        seed=settings.seed,
        cuda_graphs=False,
    )
    load = LoadWatch()
    step_seconds, profiler = profile_steps(step, settings.warmup, settings.steps, trace_path)
    rows = rows_of(settings, config, step, step_seconds, profiler)
    output.warn(load.busy("the profiled steps"))
    output.warn(noisy_warning([("the profiled steps", rows[0].value)], "step times"))
    device_time = device.type == "cuda"
    context = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "time": "self CUDA" if device_time else "self CPU",
        "step_timing": f"mean wall clock of the {settings.steps} profiled steps, synchronised; includes the "
        "profiler's overhead" + ("; kernels launched op by op, without CUDA graphs" if device_time else ""),
        "profiled_steps": settings.steps,
        "trace": os.path.basename(trace_path),
    }
    real_lengths = "" if lengths.full else f", {settings.lengths} lengths"
    title = (
        f"{settings.model} {settings.kind}, {settings.variant}, {settings.precision}, batch {settings.batch_size} x "
        f"seq {settings.max_seq_length}{real_lengths} on {device}"
    )
    text = markdown(title, rows, context)
    shares = {row.get("category"): row.get("share") for row in rows if row.measured == "category_seconds_per_step"}
    output.write_result(settings, rows, context, text, {"categories": category_plot(shares, title)})
    print(text)
    print(f"\nwrote {output.path('.json')}, {output.path('.md')}, {trace_path} and {output.path('-categories.png')}")


main = settings.main_for(ProfileSettings, description(__doc__), run)
