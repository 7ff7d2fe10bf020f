"""PNG plots of bench figures (matplotlib's object API: no pyplot state, no display needed).

Every series of a plot has a colour and a marker no other series of that plot has, so that each can be told apart in
colour and in grey print. A series takes the colour of the variant its label names (baseline, full, selective,
every-K, hf; "full:2" and "run A: full" are full too) where no earlier series of the plot took it, so that a variant
keeps its colour across plots; a second series of the same variant (another run) takes a colour no variant has.
A series with a spread (min and max beside each median) gets min-max error bars. The legend sits outside the axes,
on the right, where it covers no data, and names everything drawn in colour (a reference line included).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bertbench.bench.results import Ratio

VARIANT_COLOURS = {
    "baseline": "tab:blue",
    "full": "tab:orange",
    "selective": "tab:green",
    "every-2": "tab:red",
    "hf": "tab:purple",
}
EVERY_K_COLOURS = ("tab:brown", "tab:pink", "tab:olive")  # every-3, every-4, every-5; then again
# Series that name no variant ("measured", "main process"), or a variant whose colour an earlier series of the plot
# took: colours no variant has, then the variants' own.
OTHER_COLOURS = ("black", "tab:cyan", "darkgoldenrod", "slateblue", "darkgreen", "tab:gray")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*", "h", "p")
REFERENCE_COLOUR = "grey"


def variant_colour(label: str) -> str | None:
    """The colour of the variant a series label names, or None when it names none."""
    for token in re.split(r"[\s:/,()]+", label):
        if token in VARIANT_COLOURS:
            return VARIANT_COLOURS[token]
        every = re.fullmatch(r"every-(\d+)", token)
        if every:
            return EVERY_K_COLOURS[(int(every.group(1)) - 3) % len(EVERY_K_COLOURS)]
    return None


def series_styles(labels: Sequence[str], by_variant: bool = True) -> dict[str, tuple[str, str]]:
    """Each label's (colour, marker), no two labels alike in either: the variant's colour where `by_variant` and
    no earlier label took it, else the first colour no label took (a palette of 17, then again)."""
    palette = list(dict.fromkeys([*OTHER_COLOURS, *VARIANT_COLOURS.values(), *EVERY_K_COLOURS]))
    taken: list[str] = []
    styles = {}
    for index, label in enumerate(labels):
        wanted = variant_colour(label) if by_variant else None
        if wanted is None or wanted in taken:
            free = [colour for colour in palette if colour not in taken]
            wanted = free[0] if free else palette[index % len(palette)]
        taken.append(wanted)
        styles[label] = (wanted, MARKERS[index % len(MARKERS)])
    return styles


def place_legend(axes: Axes) -> None:
    """The legend outside the axes, on the right: clear of every point, bar and label drawn."""
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, frameon=False)


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
    figure = Figure(figsize=(7.6, 4.2), layout="constrained")
    axes = figure.add_subplot()
    styles = series_styles(list(series))
    ranged = [label for label, (_, _, *bounds) in series.items() if bounds]
    for label, (xs, ys, *bounds) in series.items():
        colour, marker = styles[label]
        if bounds and log_x and len(ranged) > 1:
            # side by side around the true x (a few percent apart), so that the error bars do not hide each other
            dodge = 2 ** (0.03 * (ranged.index(label) - (len(ranged) - 1) / 2))
            xs = [x * dodge for x in xs]
        style = "-" if joined else "none"
        if bounds and any(low is not None for low in bounds[0]):
            lows, highs = bounds
            below = [y - (y if low is None else low) for y, low in zip(ys, lows)]
            above = [(y if high is None else high) - y for y, high in zip(ys, highs)]
            axes.errorbar(
                xs,
                ys,
                yerr=[below, above],
                marker=marker,
                linestyle=style,
                color=colour,
                capsize=3,
                label=f"{label} (min-max)",
            )
        else:
            axes.plot(xs, ys, marker=marker, linestyle=style, color=colour, label=label)
    if reference is not None:
        xs, ys, label = reference
        axes.plot(xs, ys, linestyle="--", color=REFERENCE_COLOUR, label=label)
    for index, (label, (x, y, text)) in enumerate((marks or {}).items()):
        colour = styles[label][0] if label in styles else "black"
        axes.plot([x], [y], marker="*", markersize=14, linestyle="none", color=colour)
        # stacked, so that the labels of marks close together (similar largest batches) do not overlap
        axes.annotate(text, (x, y), textcoords="offset points", xytext=(6, 6 + 11 * index), fontsize=8, color=colour)
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
    place_legend(axes)
    return figure


def bar_plot(
    groups: Mapping[str, Mapping[str, float | Ratio]],
    ylabel: str,
    title: str,
    reference: tuple[float, str] | None = None,
) -> Figure:
    """Grouped bars: a series per group (label -> {category: value}), each its own colour and hatch, the
    categories along the x axis, each bar labelled with its value (a Ratio drawn from noisy figures labelled
    "noisy" under it, as it is marked wherever it is printed); `reference` is a dashed horizontal line with
    its legend entry ((1.0, "1 = equal") for ratios). The groups are figures, not variants: their colours come
    from the order, never from a variant a label happens to name ("vs baseline")."""
    figure = Figure(figsize=(8.4, 4.2), layout="constrained")
    axes = figure.add_subplot()
    categories = list(dict.fromkeys(category for values in groups.values() for category in values))
    width = 0.8 / max(1, len(groups))
    styles = series_styles(list(groups), by_variant=False)
    hatches = ("", "//", "..", "xx", "\\\\", "oo")
    for index, (label, values) in enumerate(groups.items()):
        positions = [
            number + (index - (len(groups) - 1) / 2) * width
            for number, category in enumerate(categories)
            if category in values
        ]
        shown = [values[category] for category in categories if category in values]
        heights = [value.value if isinstance(value, Ratio) else value for value in shown]
        bars = axes.bar(
            positions,
            heights,
            width,
            label=label,
            color=styles[label][0],
            hatch=hatches[index % len(hatches)],
            edgecolor="white",
        )
        labels = [
            f"{height:.2f}" + ("\nnoisy" if isinstance(value, Ratio) and value.noisy else "")
            for height, value in zip(heights, shown)
        ]
        axes.bar_label(bars, labels, fontsize=7)
    if reference is not None:
        value, label = reference
        axes.axhline(value, linestyle="--", color=REFERENCE_COLOUR, linewidth=1, label=label)
    axes.set_ylim(top=1.12 * axes.get_ylim()[1])  # room above the tallest bar for its label
    axes.set_xticks(range(len(categories)), categories, rotation=20, ha="right", fontsize=8)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    axes.grid(True, axis="y", alpha=0.3)
    place_legend(axes)
    return figure
