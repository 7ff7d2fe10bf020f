"""PNG plots of bench figures (matplotlib's object API: no pyplot state, no display needed).

Every plot colours a series by the variant its label names (baseline, full, selective, every-K, hf; "full:2" and
"run A: full" are full too), so that a variant has one colour across plots; a second series of the same variant in
one plot (another run) keeps the colour and changes its line style. A series with a spread (min and max beside each
median) gets min-max error bars.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

VARIANT_COLOURS = {
    "baseline": "tab:blue",
    "full": "tab:orange",
    "selective": "tab:green",
    "every-2": "tab:red",
    "hf": "tab:purple",
}
EVERY_K_COLOURS = ("tab:brown", "tab:pink", "tab:olive")  # every-3, every-4, every-5; then again
# Series that name no variant ("measured", "main process"): colours no variant has.
OTHER_COLOURS = ("black", "tab:cyan", "darkgoldenrod", "slateblue", "darkgreen")
LINE_STYLES = ("-", "--", ":", "-.")


def variant_colour(label: str) -> str | None:
    """The colour of the variant a series label names, or None when it names none."""
    for token in re.split(r"[\s:/,()]+", label):
        if token in VARIANT_COLOURS:
            return VARIANT_COLOURS[token]
        every = re.fullmatch(r"every-(\d+)", token)
        if every:
            return EVERY_K_COLOURS[(int(every.group(1)) - 3) % len(EVERY_K_COLOURS)]
    return None


def line_plot(
    series: Mapping[str, Sequence],
    xlabel: str,
    ylabel: str,
    title: str,
    log_x: bool = False,
    reference: tuple[Sequence[float], Sequence[float], str] | None = None,
    log_y: bool = False,
    joined: bool = True,
    y_from_zero: bool = False,
    marks: Mapping[str, tuple[float, float, str]] | None = None,
) -> Figure:
    """A line with markers per series: label -> (xs, ys), or (xs, ys, lows, highs) to draw each point's min-max
    as an error bar. `reference` is a dashed line (xs, ys, label) such as ideal scaling; `joined=False` draws
    markers only (points of a model whose curve between them is not a straight line); `y_from_zero` starts the
    y axis at 0, so that a small spread does not fill the plot as if it were a large one; `marks` puts a labelled
    star on a series (label -> (x, y, text)), such as a variant's largest batch."""
    figure = Figure(figsize=(6.4, 4.2))
    axes = figure.add_subplot()
    colours: dict[str, str] = {}
    used: dict[str, int] = {}
    others = itertools.cycle(OTHER_COLOURS)
    ranged = [label for label, (_, _, *bounds) in series.items() if bounds]
    for label, (xs, ys, *bounds) in series.items():
        colour = variant_colour(label) or next(others)
        if bounds and log_x and len(ranged) > 1:
            # side by side around the true x (a few percent apart), so that the error bars do not hide each other
            dodge = 2 ** (0.03 * (ranged.index(label) - (len(ranged) - 1) / 2))
            xs = [x * dodge for x in xs]
        style = LINE_STYLES[used.get(colour, 0) % len(LINE_STYLES)] if joined else "none"
        used[colour] = used.get(colour, 0) + 1
        colours[label] = colour
        if bounds and any(low is not None for low in bounds[0]):
            lows, highs = bounds
            below = [y - (y if low is None else low) for y, low in zip(ys, lows)]
            above = [(y if high is None else high) - y for y, high in zip(ys, highs)]
            axes.errorbar(
                xs,
                ys,
                yerr=[below, above],
                marker="o",
                linestyle=style,
                color=colour,
                capsize=3,
                label=f"{label} (min-max)",
            )
        else:
            axes.plot(xs, ys, marker="o", linestyle=style, color=colour, label=label)
    if reference is not None:
        xs, ys, label = reference
        axes.plot(xs, ys, linestyle="--", color="grey", label=label)
    for index, (label, (x, y, text)) in enumerate((marks or {}).items()):
        axes.plot([x], [y], marker="*", markersize=14, linestyle="none", color=colours.get(label, "black"))
        # stacked, so that the labels of marks close together (similar largest batches) do not overlap
        axes.annotate(
            text,
            (x, y),
            textcoords="offset points",
            xytext=(6, 6 + 11 * index),
            fontsize=8,
            color=colours.get(label, "black"),
        )
    if log_x:
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))  # 1, 2, 4 rather than 2^0, 2^1, 2^2
    if log_y:
        axes.set_yscale("log")
    elif y_from_zero:
        axes.set_ylim(bottom=0, top=1.05 * axes.get_ylim()[1])
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure


def bar_plot(
    groups: Mapping[str, Mapping[str, float]], ylabel: str, title: str, reference: float | None = None
) -> Figure:
    """Grouped bars: a colour per group (label -> {category: value}), the categories along the x axis; `reference`
    is a dashed horizontal line (1.0 for ratios)."""
    figure = Figure(figsize=(7.2, 4.2))
    axes = figure.add_subplot()
    categories = list(dict.fromkeys(category for values in groups.values() for category in values))
    width = 0.8 / max(1, len(groups))
    others = itertools.cycle(OTHER_COLOURS)
    for index, (label, values) in enumerate(groups.items()):
        positions = [
            number + (index - (len(groups) - 1) / 2) * width
            for number, category in enumerate(categories)
            if category in values
        ]
        heights = [values[category] for category in categories if category in values]
        bars = axes.bar(positions, heights, width, label=label, color=variant_colour(label) or next(others))
        axes.bar_label(bars, fmt="%.2f", fontsize=7)
    if reference is not None:
        axes.axhline(reference, linestyle="--", color="grey", linewidth=1)
    axes.set_xticks(range(len(categories)), categories, rotation=20, ha="right", fontsize=8)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure
