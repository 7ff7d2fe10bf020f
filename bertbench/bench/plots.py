"""PNG plots of bench figures (matplotlib's object API: no pyplot state, no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter


def line_plot(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str, title: str,
              log_x: bool = False, reference: tuple[Sequence[float], Sequence[float], str] | None = None) -> Figure:
    """One line with markers per series (label -> (xs, ys)); `reference` is a dashed line (xs, ys, label) such as
    ideal scaling."""
    figure = Figure(figsize=(6.4, 4.2))
    axes = figure.add_subplot()
    for label, (xs, ys) in series.items():
        axes.plot(xs, ys, marker="o", label=label)
    if reference is not None:
        xs, ys, label = reference
        axes.plot(xs, ys, linestyle="--", color="grey", label=label)
    if log_x:
        axes.set_xscale("log", base=2)
        axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))  # 1, 2, 4 rather than 2^0, 2^1, 2^2
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title, fontsize=10)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    return figure
