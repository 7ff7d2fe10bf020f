"""`bertbench bench optimizer`: the clipping and optimizer step of each rule against the device's memory floor.

An optimizer step is memory-bound: fp32 Adam reads p, g, m, v and writes p, m, v, 28 bytes a parameter, so its floor
is parameters x 28 bytes / the memory bandwidth. The bench fills every gradient of a model and times the training
step's own `optim.clip_and_step` (clipping to a global norm of 1.0, then the step) for each optimizer, interleaved
with STREAM's four kernels (bertbench.bench.bandwidth), whose fastest best rate is the bandwidth. Each row gives the
step's time with its spread, the floor at 28 bytes, the ratio to it, and the least traffic of the rule itself: the
clipping's norm reads g once more (Adam: 32 bytes), and LAMB's trust ratio needs the update's norm before p changes,
so a second pass over the update and p (44 bytes), which no implementation of the rule avoids.

A floor is the least time the bytes can take: a timed step faster than it means the bandwidth is not the machine's
best. Its ratio is then not printed, the cell is marked and one warning names the step and the floor.

    bertbench bench optimizer --model large --device cuda --step_ms 68
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
from matplotlib.figure import Figure

from bertbench.bench import bandwidth, measure, settings, workload
from bertbench.bench.output import BenchOutput
from bertbench.bench.results import Column, Ratio, Row, Spread, noisy_ratios_note, table
from bertbench.common.flags import setting
from bertbench.common.noise import LoadWatch, noisy_warning
from bertbench.training import optim

# name -> (optim name, adam_bias_correction)
RULES = {
    "adamw": ("adamw", False),
    "adamw-bias-correction": ("adamw", True),
    "lamb": ("lamb", False),
    "nvlamb": ("nvlamb", False),
}
FORMS = ("fused", "eager")
ADAM_BYTES = 28  # fp32 p, g, m, v read; p, m, v written
CLIP_NORM_BYTES = 4  # the global norm reads g once
TRUST_RATIO_BYTES = 12  # LAMB: the update written (4), then read again with p (8) to write p
MAX_GRAD_NORM = 1.0
STREAM_PREFIX = "STREAM "  # the kernels' names among the timed steps
BELOW_FLOOR = "below floor: bandwidth underestimated"


def optimizer_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """(rule, form) pairs of --optimizers; a name that is neither is a ValueError naming the flag."""
    chosen = []
    for name in names:
        rule, _, form = name.partition(":")
        if rule not in RULES or form not in ("", *FORMS):
            raise ValueError(
                f"optimizers: unknown optimizer {name!r}: use RULE or RULE:FORM, RULE one of "
                f"{', '.join(RULES)}, FORM one of {', '.join(FORMS)}"
            )
        chosen += [(rule, one) for one in ([form] if form else FORMS) if (rule, one) not in chosen]
    return chosen


@dataclasses.dataclass(frozen=True)
class OptimizerSettings(settings.MeasuredSettings):
    """Optimizers and their floors."""

    bench: ClassVar[str] = "optimizer"

    model: str = settings.model_setting()
    optimizers: tuple[str, ...] | None = setting(
        f"RULE or RULE:FORM, RULE one of {', '.join(RULES)}, FORM fused or eager (RULE alone: both). Default: every "
        "rule in both forms; on the CPU, LAMB's compiled form only when named (inductor takes minutes to compile it "
        "there).",
        None,
    )
    warmup: int = setting("Untimed steps per optimizer and bandwidth kernel (the first compiles).", 1)
    steps: int = setting(
        "Timed steps per optimizer (the median), interleaved with STREAM's kernels (the best of as many).", 5
    )
    bandwidth_gbs: float | None = setting(
        "The memory bandwidth in GB/s (10^9 bytes) to put the floors at, instead of measuring it with STREAM's "
        "kernels.",
        None,
        positive=True,
    )
    step_ms: float | None = setting(
        "A training step's time in ms (from `bench throughput`): each row's share of it.", None, positive=True
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        optimizer_pairs(self.optimizers or ())

    def chosen(self, device: torch.device) -> list[tuple[str, str]]:
        """The (rule, form) pairs to time on `device`: --optimizers, or by default every rule in both forms but
        LAMB's compiled form on the CPU."""
        if self.optimizers is not None:
            return optimizer_pairs(self.optimizers)
        lamb_compiled = device.type != "cpu"
        return [
            (rule, form)
            for rule in RULES
            for form in FORMS
            if form == "eager" or lamb_compiled or RULES[rule][0] == "adamw"
        ]


SETTINGS = OptimizerSettings


def rule_bytes(rule: str) -> int:
    """Bytes a parameter the rule with clipping moves at the least (see the module docstring)."""
    lamb = RULES[rule][0] != "adamw"
    return ADAM_BYTES + CLIP_NORM_BYTES + (TRUST_RATIO_BYTES if lamb else 0)


def contenders(model: torch.nn.Module, chosen: list[tuple[str, str]]) -> dict[str, Callable[[], object]]:
    """A call per (rule, form): the training step's clip_and_step with that optimizer over the model's gradients.
    The optimizers share the parameters and gradients (a step's cost does not depend on their values) and keep
    their own moments."""
    scaler = torch.amp.GradScaler(next(model.parameters()).device.type, enabled=False)
    calls = {}
    for rule, form in chosen:
        name, bias_correction = RULES[rule]
        optimizer = optim.build_optimizer(
            model, name, 1e-4, adam_bias_correction=bias_correction, fused=form == "fused"
        )
        calls[f"{rule}:{form}"] = lambda optimizer=optimizer: optim.clip_and_step(
            optimizer, model.parameters(), MAX_GRAD_NORM, scaler
        )
    return calls


def floor_ratio(step_ms: Spread, floor_ms: float) -> Ratio | None:
    """The step over its floor; None when a timed step was faster than the floor, which then cannot be one."""
    return None if step_ms.min < floor_ms else Ratio.of(step_ms, floor_ms)


def rows_for(times: dict[str, list[float]], parameters: int, rate: float, step_ms: float | None) -> list[Row]:
    """A row per optimizer from its step `times` (seconds), the floors at `rate` bytes per second."""
    rows = []
    for label, seconds in times.items():
        rule, form = label.split(":")
        milliseconds = Spread.of(1e3 * second for second in seconds)
        floor_ms = 1e3 * parameters * ADAM_BYTES / rate
        rule_floor_ms = 1e3 * parameters * rule_bytes(rule) / rate
        columns = {
            "parameters": parameters,
            "bytes_per_parameter": ADAM_BYTES,
            "floor_ms": floor_ms,
            "ratio_to_floor": floor_ratio(milliseconds, floor_ms),
            "rule_bytes_per_parameter": rule_bytes(rule),
            "rule_floor_ms": rule_floor_ms,
            "ratio_to_rule_floor": floor_ratio(milliseconds, rule_floor_ms),
            "share_of_step": None if step_ms is None else milliseconds.median / step_ms,
        }
        rows.append(Row("step_ms", "ms", {"optimizer": label, "rule": rule, "form": form}, milliseconds, columns))
    return rows


def below_floor_warning(rows: Sequence[Row], bandwidth_text: str) -> str | None:
    """One warning for the steps that beat a floor, naming the one furthest below its floor."""
    below = [row for row in rows if row.get("ratio_to_rule_floor") is None]
    if not below:
        return None
    worst = min(below, key=lambda row: row.value.min / row.get("rule_floor_ms"))
    floor_bytes, floor_ms = (
        (ADAM_BYTES, worst.get("floor_ms"))
        if worst.get("ratio_to_floor") is None
        else (worst.get("rule_bytes_per_parameter"), worst.get("rule_floor_ms"))
    )
    return (
        f"{len(below)} of {len(rows)} optimizer steps ran faster than a floor ({worst.get('optimizer')} took "
        f"{worst.value.min:.2f} ms, under its {floor_bytes} B/parameter floor of {floor_ms:.2f} ms): the bandwidth "
        f"the floors are drawn from, {bandwidth_text}, is below what the machine reaches, so those ratios are not "
        f'printed (marked "{BELOW_FLOOR}") and the others read low'
    )


def ratio_column(title: str, key: str) -> Column:
    return Column(title, key, lambda row: BELOW_FLOOR if row.get(key) is None else row.get(key).text())


def bandwidth_text(context: dict) -> str:
    best = context["bandwidth"].max / 1e9
    if context["bandwidth_source"] == "given":
        return f"{best:.1f} GB/s (given: --bandwidth_gbs)"
    return f"{best:.1f} GB/s (STREAM {context['stream_kernel']}, measured)"


def markdown(rows: list[Row], settings: OptimizerSettings, context: dict) -> str:
    if context["bandwidth_source"] == "given":
        source = "given (--bandwidth_gbs)."
    else:
        stream = context["stream"]
        rates = ", ".join(f"{kernel} {rate.max / 1e9:.1f}" for kernel, rate in stream.items())
        source = (
            f"measured as STREAM does: arrays of {context['stream_array_bytes'] / 2**20:,.0f} MiB each (at least "
            f"{bandwidth.CACHE_MULTIPLE}x the last-level caches), the copy, scale, add and triad kernels on "
            f"{context['threads']} thread(s), {rates} GB/s (each the best of {stream['copy'].n}, interleaved with the "
            f"optimizer steps; STREAM's bytes: 2 arrays for copy and scale, 3 for add and triad); the fastest kernel, "
            f"{context['stream_kernel']}, is the bandwidth."
        )
    columns = [
        Column("optimizer", "optimizer", "s"),
        Column("step ms", "step_ms", ".2f"),
        Column(f"floor ms ({ADAM_BYTES} B)", "floor_ms", ".2f"),
        ratio_column("x floor", "ratio_to_floor"),
        Column("rule B/param", "rule_bytes_per_parameter", "d"),
        Column("rule floor ms", "rule_floor_ms", ".2f"),
        ratio_column("x rule floor", "ratio_to_rule_floor"),
    ]
    if settings.step_ms:
        columns.append(Column("share of a step", "share_of_step", ".1%"))
    parameters = rows[0].get("parameters")
    return "\n".join(
        [
            f"# Optimizer step vs memory floor: {settings.model}, {parameters / 1e6:.1f}M parameters, "
            f"{context['device']}",
            "",
            f"Memory bandwidth {context['bandwidth'].max / 1e9:.1f} GB/s, {source} Each step is the training step's "
            f"clipping to a global norm of {MAX_GRAD_NORM} and the optimizer step (optim.clip_and_step), median of "
            f"{settings.steps} after {settings.warmup} warm-up, interleaved. The floor assumes fp32 parameters, "
            f"gradients and moments and {ADAM_BYTES} bytes a parameter (Adam: read p, g, m, v; write p, m, v); the "
            f"rule's floor adds the clipping's read of g ({CLIP_NORM_BYTES} B) and, for LAMB, the trust ratio's second "
            f"pass over the update and p ({TRUST_RATIO_BYTES} B). A step that ran faster than its floor shows "
            f'"{BELOW_FLOOR}" instead of a ratio.',
            "",
            table(rows, columns),
            "",
            *filter(None, [noisy_ratios_note(rows)]),
        ]
    )


def plot(rows: list[Row], device: str) -> Figure:
    """The steps as bars with their min-max, a colour per form; the 28-byte floor as a line, each rule's floor as a
    mark on its bar; the legend outside the axes."""
    figure = Figure(figsize=(8.4, 4.2))
    axes = figure.add_subplot()
    looks = {"fused": ("tab:blue", ""), "eager": ("tab:orange", "//")}  # told apart in grey print too
    for form, (colour, hatch) in looks.items():
        positions = [index for index, row in enumerate(rows) if row.get("form") == form]
        if not positions:
            continue
        spreads = [rows[index].value for index in positions]
        axes.bar(
            positions,
            [spread.median for spread in spreads],
            yerr=[[s.median - s.min for s in spreads], [s.max - s.median for s in spreads]],
            capsize=3,
            color=colour,
            hatch=hatch,
            label=f"{form} step (median, min-max)",
        )
    axes.axhline(rows[0].get("floor_ms"), linestyle="--", color="black", label=f"floor at {ADAM_BYTES} B/param")
    axes.scatter(
        range(len(rows)),
        [row.get("rule_floor_ms") for row in rows],
        marker="_",
        s=400,
        color="tab:red",
        zorder=3,
        label="the rule's floor",
    )
    axes.set_xticks(range(len(rows)), [row.get("optimizer") for row in rows], rotation=30, ha="right", fontsize=8)
    axes.set_ylabel("ms per clip + optimizer step")
    axes.set_title(f"optimizer step vs memory floor ({device})", fontsize=10)
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    figure.tight_layout()
    return figure


def run(settings: OptimizerSettings, argv: list[str]) -> None:
    config = workload.bert_config(settings.model, 128)
    device = settings.torch_device()
    chosen = settings.chosen(device)
    output = BenchOutput(settings.directory, "optimizer", argv, settings.overwrite)
    model = workload.build(config, "pretraining", workload.Variant.parse("baseline"), device)
    generator = torch.Generator(device=device).manual_seed(settings.seed)
    for parameter in model.parameters():
        parameter.grad = torch.randn(parameter.shape, device=device, generator=generator)
    parameters = sum(parameter.numel() for parameter in model.parameters())
    steps = contenders(model, chosen)
    stream = None
    if settings.bandwidth_gbs is None:
        stream = bandwidth.Stream(device, bandwidth.array_bytes(device))
        steps.update({STREAM_PREFIX + kernel: call for kernel, call in stream.kernels().items()})
    load = LoadWatch()
    times = measure.time_steps(steps, settings.warmup, settings.steps, device)
    context: dict = {"device": str(device), "threads": torch.get_num_threads()}
    if stream is None:
        context.update(bandwidth=Spread.exact(settings.bandwidth_gbs * 1e9), bandwidth_source="given")
    else:
        rates = stream.rates({kernel: times.pop(STREAM_PREFIX + kernel) for kernel in stream.kernels()})
        kernel = bandwidth.fastest(rates)
        context.update(
            bandwidth=rates[kernel],
            bandwidth_source="STREAM",
            stream_kernel=kernel,
            stream=rates,
            stream_array_bytes=stream.size_bytes,
        )
    context["bandwidth_bytes_per_second"] = context["bandwidth"].max  # the best rate: what the floors are drawn from
    rows = rows_for(times, parameters, context["bandwidth_bytes_per_second"], settings.step_ms)
    output.warn(load.busy())
    output.warn(below_floor_warning(rows, bandwidth_text(context)))
    output.warn(
        noisy_warning(
            [{"step_ms_cv": row.value.cv, **row.setting} for row in rows],
            "step_ms",
            lambda row: row["optimizer"],
            "step times",
        )
    )
    text = markdown(rows, settings, context)
    output.write_result(settings, rows, context, text, {"steps": plot(rows, str(device))})
    print(text)
    print(f"\nwrote {output.path('.json')}, {output.path('.md')} and {output.path('-steps.png')}")


main = settings.main_for(OptimizerSettings, __doc__.splitlines()[0], run)
