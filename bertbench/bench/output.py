"""What every benchmark reports with its figures: the machine and versions, a JSON file, markdown tables, plots.

A bench writes `<bench>.json` (machine, versions, settings, every figure), `<bench>.md` (the tables) and
`<bench>-<plot>.png` into its output directory. It refuses to start when those files exist (unless --overwrite), so
a run never replaces earlier results by accident, and it writes each file atomically, so a killed run leaves the old
file or the whole new one.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bertbench.bench.results import BenchResult, Row
from bertbench.bench.settings import BenchSettings, as_dict
from bertbench.common.durable import write_atomically

# ---- warnings: runs that are not comparable, superlinear efficiency (a busy machine: bertbench.common.noise) ----------


def mismatch_warning(
    rows: Sequence[Mapping[str, Any]],
    fields: Mapping[str, str],
    name: str,
    consequence: str = "so speedup and efficiency between them mix that difference into the scaling",
) -> str | None:
    """A warning when runs compared with each other differ in any of `fields` (row key -> what it is), such as
    threads or device: their ratios then measure the difference too (`consequence` says what it spoils). `name` is
    the key naming a run."""
    differing = []
    for key, title in fields.items():
        values = {row.get(key) for row in rows if row.get(key) is not None}
        if len(values) > 1:
            differing.append(f"{title} (" + ", ".join(f"{row[name]}: {row.get(key)}" for row in rows) + ")")
    if not differing:
        return None
    return "the compared runs are not alike: they differ in " + "; ".join(differing) + ", " + consequence


def superlinear(value: float | None) -> bool:
    # Float noise above an exact 100% (1.0000000002) is not a superlinear figure.
    return value is not None and value > 1 + 1e-9


def superlinear_warning(
    rows: Sequence[Mapping[str, Any]], key: str, describe: Callable[[Mapping[str, Any]], str]
) -> str | None:
    """A warning for efficiencies above 100%: N processes doing more than N times one process's work."""
    above = [row for row in rows if superlinear(row.get(key))]
    if not above:
        return None
    worst = max(above, key=lambda row: row[key])
    return (
        f"efficiency above 100% ({worst[key]:.1%} at {describe(worst)}, marked (!)): superlinear figures "
        "usually mean the runs are not comparable (different threads per process, another device, or a "
        "reference run slowed by a busy machine), not that data parallelism gained more than the processes "
        "added"
    )


class BenchOutput:
    """The files one bench run writes into `directory`: <bench>.json, <bench>.md and <bench>-<name>.png, and the
    `other_files` it writes itself (such as a trace); and the warnings of the run, printed as they arise and
    written with the figures."""

    def __init__(
        self,
        directory: str,
        bench: str,
        argv: Sequence[str],
        overwrite: bool = False,
        program: str | None = None,
        other_files: Sequence[str] = (),
    ):
        self.directory, self.bench = directory, bench
        self.warnings: list[str] = []
        self.command = " ".join([program or f"bertbench bench {bench}", *argv])
        if not overwrite and os.path.isdir(directory):
            plots = sorted(
                name for name in os.listdir(directory) if name.startswith(f"{bench}-") and name.endswith(".png")
            )
            for name in [f"{bench}.json", f"{bench}.md", *plots, *other_files]:
                if os.path.exists(os.path.join(directory, name)):
                    raise FileExistsError(
                        f"{os.path.join(directory, name)} exists: choose another --output_dir or pass --overwrite"
                    )

    def path(self, suffix: str) -> str:
        return os.path.join(self.directory, f"{self.bench}{suffix}")

    def warn(self, message: str | None) -> None:
        """Record a warning (None: nothing to warn of) and print it now, so a long run shows it as it arises."""
        if message and message not in self.warnings:
            self.warnings.append(message)
            print(f"warning: {message}", flush=True)

    def write_result(
        self,
        settings: BenchSettings,
        rows: Sequence[Row],
        context: Mapping[str, Any],
        markdown: str,
        plots: Mapping[str, Any] = (),
    ) -> BenchResult:
        """Write the result (results.BenchResult: the settings, rows, context and this run's warnings), the markdown
        with a "**Warning:**" line per warning after its title, and each matplotlib figure in `plots` (name ->
        Figure, written as <bench>-<name>.png); returns the result as written."""
        result = BenchResult.new(self.bench, as_dict(settings), rows, context, self.warnings, self.command)
        os.makedirs(self.directory, exist_ok=True)
        for name, figure in dict(plots).items():
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
            write_atomically(self.path(f"-{name}.png"), buffer.getvalue())
        write_atomically(self.path(".md"), with_warnings(markdown, self.warnings).rstrip("\n") + "\n")
        write_atomically(self.path(".json"), json.dumps(result.to_json(), indent=2) + "\n")
        return result


def with_warnings(markdown: str, warnings: Sequence[str]) -> str:
    """The markdown with a "**Warning:** ..." paragraph per warning after its first line (the title), where a
    reader sees them before the figures they qualify."""
    if not warnings:
        return markdown
    title, _, rest = markdown.partition("\n")
    return "\n\n".join([title, *(f"**Warning:** {message}" for message in warnings), rest.lstrip("\n")])
