"""`bertbench bench optimizer`: the clipping and optimizer step of each rule against the device's memory floor.

An optimizer step is memory-bound: fp32 Adam reads p, g, m, v and writes p, m, v, 28 bytes a parameter, so its floor
is parameters x 28 bytes / the memory bandwidth. The bench measures the bandwidth (a large tensor copied, bytes read
plus written over the time, median of a few), fills every gradient of a model, and times the training step's own
`optim.clip_and_step` (clipping to a global norm of 1.0, then the step) for each optimizer, interleaved. Each row
gives the step's time with its spread, the floor at 28 bytes, the ratio to it, and the least traffic of the rule
itself: the clipping's norm reads g once more (Adam: 32 bytes), and LAMB's trust ratio needs the update's norm
before p changes, so a second pass over the update and p (44 bytes), which no implementation of the rule avoids.

    bertbench bench optimizer --model large --device cuda --step_ms 68
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence

import torch
from matplotlib.figure import Figure

from bertbench.bench import cli, measure, workload
from bertbench.bench.output import BenchOutput, markdown_table, spread_column
from bertbench.common.noise import LoadWatch, noisy_warning, spread, spread_fields
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
BANDWIDTH_BYTES = 2**28  # the copy: 256 MiB read, 256 MiB written
MAX_GRAD_NORM = 1.0


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser_for("optimizer", __doc__.splitlines()[0])
    setting = parser.add_argument_group("setting")
    cli.add_model_flag(setting)
    setting.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: CUDA when available).")
    setting.add_argument(
        "--optimizers",
        type=cli.comma_list(str),
        default=None,
        help=f"RULE or RULE:FORM, RULE one of {', '.join(RULES)}, FORM fused or eager (RULE alone: "
        "both). Default: every rule in both forms; on the CPU, LAMB's compiled form only when "
        "named (inductor takes minutes to compile it there).",
    )
    setting.add_argument("--threads", type=cli.positive_int, default=None, help="CPU threads.")
    timing = parser.add_argument_group("timing")
    timing.add_argument("--warmup", type=int, default=1, help="Untimed steps per optimizer (the first compiles).")
    timing.add_argument("--steps", type=cli.positive_int, default=5, help="Timed steps per optimizer (median).")
    timing.add_argument(
        "--bandwidth_gbs",
        type=float,
        default=None,
        help="The memory bandwidth in GB/s (10^9 bytes) to put the floors at, instead of measuring it with a copy.",
    )
    timing.add_argument(
        "--step_ms",
        type=float,
        default=None,
        help="A training step's time in ms (from `bench throughput`): each row's share of it.",
    )
    return parser


def parse_optimizers(names: Sequence[str] | None, device: torch.device) -> list[tuple[str, str]]:
    """(rule, form) pairs of --optimizers; a name that is neither is a BenchError."""
    if names is None:
        lamb_compiled = device.type != "cpu"
        return [
            (rule, form)
            for rule in RULES
            for form in FORMS
            if form == "eager" or lamb_compiled or RULES[rule][0] == "adamw"
        ]
    chosen = []
    for name in names:
        rule, _, form = name.partition(":")
        if rule not in RULES or form not in ("", *FORMS):
            raise workload.BenchError(
                f"unknown optimizer {name!r}: use RULE or RULE:FORM, RULE one of "
                f"{', '.join(RULES)}, FORM one of {', '.join(FORMS)}"
            )
        chosen += [(rule, one) for one in ([form] if form else FORMS) if (rule, one) not in chosen]
    return chosen


def rule_bytes(rule: str) -> int:
    """Bytes a parameter the rule with clipping moves at the least (see the module docstring)."""
    lamb = RULES[rule][0] != "adamw"
    return ADAM_BYTES + CLIP_NORM_BYTES + (TRUST_RATIO_BYTES if lamb else 0)


def bandwidth(device: torch.device, repeats: int = 5) -> dict:
    """Bytes read plus written per second of a large copy on `device`: its median over `repeats`, with spread."""
    source = torch.ones(BANDWIDTH_BYTES // 4, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    seconds = [measure.time_call(lambda: target.copy_(source), device) for _ in range(repeats)]
    rates = spread([2 * BANDWIDTH_BYTES / second for second in seconds])
    return {**rates, "median": 2 * BANDWIDTH_BYTES / statistics.median(seconds)}


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


def rows_for(times: dict[str, list[float]], parameters: int, rate: float, step_ms: float | None) -> list[dict]:
    rows = []
    for label, seconds in times.items():
        rule, form = label.split(":")
        milliseconds = spread([1e3 * second for second in seconds])
        floor_ms = 1e3 * parameters * ADAM_BYTES / rate
        rule_floor_ms = 1e3 * parameters * rule_bytes(rule) / rate
        rows.append(
            {
                "optimizer": label,
                "rule": rule,
                "form": form,
                "parameters": parameters,
                **spread_fields("step_ms", milliseconds),
                "bytes_per_parameter": ADAM_BYTES,
                "floor_ms": floor_ms,
                "ratio_to_floor": milliseconds["median"] / floor_ms,
                "rule_bytes_per_parameter": rule_bytes(rule),
                "rule_floor_ms": rule_floor_ms,
                "ratio_to_rule_floor": milliseconds["median"] / rule_floor_ms,
                "share_of_step": None if step_ms is None else milliseconds["median"] / step_ms,
            }
        )
    return rows


def markdown(rows: list[dict], device: torch.device, measured: dict, args: argparse.Namespace) -> str:
    source = (
        "given (--bandwidth_gbs)"
        if args.bandwidth_gbs
        else f"measured: a {BANDWIDTH_BYTES // 2**20} MiB copy, median of {measured['n']}, "
        f"{measured['min'] / 1e9:.1f}–{measured['max'] / 1e9:.1f} GB/s"
    )
    columns = [
        ("optimizer", "optimizer", "s"),
        spread_column("step ms", "step_ms", ".2f"),
        ("floor ms (28 B)", "floor_ms", ".2f"),
        ("x floor", "ratio_to_floor", ".2f"),
        ("rule B/param", "rule_bytes_per_parameter", "d"),
        ("rule floor ms", "rule_floor_ms", ".2f"),
        ("x rule floor", "ratio_to_rule_floor", ".2f"),
    ]
    if args.step_ms:
        columns.append(("share of a step", "share_of_step", ".1%"))
    return "\n".join(
        [
            f"# Optimizer step vs memory floor: {args.model}, {rows[0]['parameters'] / 1e6:.1f}M parameters, {device}",
            "",
            f"Memory bandwidth {measured['median'] / 1e9:.1f} GB/s ({source}). Each step is the training step's "
            f"clipping to a global norm of {MAX_GRAD_NORM} and the optimizer step (optim.clip_and_step), median of "
            f"{args.steps} after {args.warmup} warm-up, interleaved. The floor assumes fp32 parameters, gradients and "
            f"moments and {ADAM_BYTES} bytes a parameter (Adam: read p, g, m, v; write p, m, v); the rule's floor adds "
            f"the clipping's read of g ({CLIP_NORM_BYTES} B) and, for LAMB, the trust ratio's second pass over the "
            f"update and p ({TRUST_RATIO_BYTES} B).",
            "",
            markdown_table(rows, columns),
            "",
        ]
    )


def plot(rows: list[dict], device: torch.device) -> Figure:
    figure = Figure(figsize=(7.2, 4.2))
    axes = figure.add_subplot()
    positions = range(len(rows))
    medians = [row["step_ms"] for row in rows]
    errors = [
        [row["step_ms"] - row["step_ms_min"] for row in rows],
        [row["step_ms_max"] - row["step_ms"] for row in rows],
    ]
    axes.bar(
        positions,
        medians,
        yerr=errors,
        capsize=3,
        color=["tab:blue" if row["form"] == "fused" else "tab:grey" for row in rows],
        label="step (min-max)",
    )
    axes.axhline(rows[0]["floor_ms"], linestyle="--", color="black", label=f"floor at {ADAM_BYTES} B/param")
    axes.scatter(
        positions,
        [row["rule_floor_ms"] for row in rows],
        marker="_",
        s=400,
        color="tab:red",
        zorder=3,
        label="the rule's floor",
    )
    axes.set_xticks(list(positions), [row["optimizer"] for row in rows], rotation=30, ha="right", fontsize=8)
    axes.set_ylabel("ms per clip + optimizer step")
    axes.set_title(f"optimizer step vs memory floor ({device})", fontsize=10)
    axes.set_ylim(bottom=0)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        config = workload.bert_config(args.model, 128)
        for flag, value in (("--bandwidth_gbs", args.bandwidth_gbs), ("--step_ms", args.step_ms)):
            if value is not None and not value > 0:
                raise workload.BenchError(f"{flag} must be positive, got {value}")
        if args.warmup < 0:
            raise workload.BenchError(f"--warmup must be 0 or more, got {args.warmup}")
        device = cli.device(args.device)
        chosen = parse_optimizers(args.optimizers, device)
        output = BenchOutput(cli.output_dir(args, "optimizer"), "optimizer", argv, args.overwrite)
        if args.threads:
            torch.set_num_threads(args.threads)
        model = workload.build(config, "pretraining", workload.Variant.parse("baseline"), device)
        generator = torch.Generator(device=device).manual_seed(0)
        for parameter in model.parameters():
            parameter.grad = torch.randn(parameter.shape, device=device, generator=generator)
        parameters = sum(parameter.numel() for parameter in model.parameters())
        load = LoadWatch()
        measured = spread([args.bandwidth_gbs * 1e9]) if args.bandwidth_gbs else bandwidth(device)
        times = measure.time_steps(contenders(model, chosen), args.warmup, args.steps, device)
        rows = rows_for(times, parameters, measured["median"], args.step_ms)
        output.warn(load.busy())
        output.warn(noisy_warning(rows, "step_ms", lambda row: row["optimizer"], "step times"))
        text = markdown(rows, device, measured, args)
        print(
            output.write(
                vars(args),
                {
                    "device": str(device),
                    "bandwidth_bytes_per_second": measured["median"],
                    "bandwidth": measured,
                    "rows": rows,
                },
                text,
                {"steps": plot(rows, device)},
            )
        )
        print(f"\nwrote {output.path('.json')}, {output.path('.md')} and {output.path('-steps.png')}")

    return cli.run("bertbench bench optimizer", body)
