"""What every benchmark reports with its figures: the machine and versions, a JSON file, markdown tables, plots.

A bench writes `<bench>.json` (machine, versions, settings, every figure), `<bench>.md` (the tables) and
`<bench>-<plot>.png` into its output directory. It refuses to start when those files exist (unless --overwrite), so
a run never replaces earlier results by accident, and it writes each file atomically, so a killed run leaves the old
file or the whole new one.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import platform
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from bertbench.durable import write_text_atomically


def versions() -> dict[str, Any]:
    import numpy

    from bertbench import __version__
    return {"bertbench": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None}


def machine() -> dict[str, Any]:
    """The platform, processor, cores, memory, torch version, CPU threads and GPU the figures were measured on."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    return {"platform": platform.platform(), "processor": platform.processor(), "hostname": platform.node(),
            "cpu_count": os.cpu_count(), "memory_bytes": memory, "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0}


def write_report(path: str | None, report: Mapping[str, Any]) -> None:
    """Write the figures as JSON to path (atomically), when a path is given."""
    if path:
        write_text_atomically(path, json.dumps(report, indent=2) + "\n")


Cell = str | Callable[[Mapping[str, Any]], str]


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, Cell]]) -> str:
    """A GitHub markdown table; columns are (title, key in each row, format spec such as ".2f", or a function of
    the row that writes the cell, such as spread_column's). A missing or None value prints as "–"."""
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        cells = ["–" if row.get(key) is None else spec(row) if callable(spec) else format(row[key], spec)
                 for _, key, spec in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- the spread of repeated measurements ----------------------------------------------------------------------------
#
# A figure measured several times is reported in a JSON row as KEY (the median, as a single figure always was) with
# KEY_min, KEY_max and KEY_cv (the coefficient of variation, sample stdev / mean; null for one measurement) beside
# it, and in markdown as "0.130 (0.021–0.209, CV 41%)".

def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max, coefficient of variation (None for a single value) and count of repeated measurements."""
    values = list(values)
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean if len(values) > 1 and mean else None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "cv": cv,
            "n": len(values)}


def rate_spread(amount: float, seconds: Sequence[float]) -> dict[str, Any]:
    """The spread of a rate (`amount` per repeat over each repeat's seconds). Its median is amount / the median
    time, so that a row's rate and time agree for an even number of repeats too; min, max and CV are the rates'."""
    return {**spread([amount / value for value in seconds]), "median": amount / statistics.median(seconds)}


def spread_fields(key: str, measured: Mapping[str, Any]) -> dict[str, Any]:
    """A spread as a JSON row holds it: KEY, KEY_min, KEY_max, KEY_cv."""
    return {key: measured["median"], f"{key}_min": measured["min"], f"{key}_max": measured["max"],
            f"{key}_cv": measured["cv"]}


def cv_text(cv: float) -> str:
    return f"{cv:.1%}" if cv < 0.1 else f"{cv:.0%}"


def spread_text(row: Mapping[str, Any], key: str, spec: str) -> str:
    """KEY of a row with its range and CV, "0.130 (0.021–0.209, CV 41%)"; KEY alone without a spread."""
    low, high, cv = row.get(f"{key}_min"), row.get(f"{key}_max"), row.get(f"{key}_cv")
    if low is None or high is None or cv is None:
        return format(row[key], spec)
    return f"{row[key]:{spec}} ({low:{spec}}–{high:{spec}}, CV {cv_text(cv)})"


def spread_column(title: str, key: str, spec: str) -> tuple[str, str, Cell]:
    """A markdown_table column showing a figure with its spread."""
    return title, key, lambda row: spread_text(row, key, spec)


# ---- warnings: a busy machine, runs that are not comparable, superlinear efficiency -------------------------------

# A timed setting whose CV is above this was disturbed. Measured on this project's shared 2-core CPU (2026-11) with
# measure.time_steps as `throughput` runs it (2 warm-up + 5 timed steps; pre-training, batch 8, seq 128, 2 threads):
#   BERT-tiny (a 35 ms step), quiet machine (load average under 1, nothing else running): 27 settings, CV 3.2%-12.5%
#   (median 5.8%); with one competing `python -c 'while True: pass'`: 30 settings, CV median 57%, 25 of 30 above 20%;
#   under the other sessions' usual load (load average 3.7-8): 292 settings, CV median 29%, 54% above 20%.
#   BERT-mini (a 340 ms step), quiet: 16 settings, CV 1.7%-12.3% (median 6.3%); with the competing process: 16
#   settings, steps 2.7x slower but CV 6.7%-35% (median 13%), 3 of 16 above 20%.
# 20% is above every quiet setting, with a margin, and below most disturbed short steps. A steady competitor slows
# every long step alike, which a CV cannot see: the load average does (it reached 2.35 on the 2 cores within those
# 25 s), and it alone lags a minute behind (it stayed under 2 during the seconds-long BERT-tiny bursts): hence both.
BUSY_CV = 0.2


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, which a batch system or taskset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average: the runnable (and uninterruptible) tasks, averaged."""
    return os.getloadavg()[0]


class LoadWatch:
    """The machine's load around a measurement: sampled when made and again by `busy()`. A 1-minute load average
    above the cores available means something besides the measurement wanted the cores (the measurement's own threads
    count too, at most one per core)."""

    def __init__(self) -> None:
        self.cores = available_cores()
        self.loads = [load_average()]

    def busy(self, what: str = "the measurement") -> str | None:
        """A warning when the load before or after `what` was above the cores; None otherwise."""
        self.loads.append(load_average())
        if max(self.loads) <= self.cores:
            return None
        return (f"the machine was busy: the 1-minute load average was {self.loads[0]:.2f} before {what} and "
                f"{self.loads[-1]:.2f} after it, above the {self.cores} core(s) available to this process, so other "
                "work competed for the cores and the timings are slower and noisier than on an idle machine: run "
                "again when it is idle")


def noisy_warning(rows: Sequence[Mapping[str, Any]], key: str, describe: Callable[[Mapping[str, Any]], str],
                  what: str = "timings") -> str | None:
    """A warning when KEY_cv of any row is above BUSY_CV: repeats of one setting that differ that much were
    disturbed (see BUSY_CV)."""
    noisy = [row for row in rows if (row.get(f"{key}_cv") or 0) > BUSY_CV]
    if not noisy:
        return None
    worst = max(noisy, key=lambda row: row[f"{key}_cv"])
    return (f"noisy {what}: the repeats of {len(noisy)} of {len(rows)} setting(s) vary by more than CV "
            f"{BUSY_CV:.0%} (up to {cv_text(worst[f'{key}_cv'])}, {describe(worst)}), which a quiet machine does not "
            "show: the machine was busy or its clock changed; compare medians with care and run again when it is "
            "idle")


def mismatch_warning(rows: Sequence[Mapping[str, Any]], fields: Mapping[str, str], name: str,
                     consequence: str = "so speedup and efficiency between them mix that difference into the scaling"
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


def efficiency_column(title: str, key: str) -> tuple[str, str, Cell]:
    """An efficiency cell, "71.6%", flagged "253.7% (!)" above 100% (see superlinear_warning)."""
    return title, key, lambda row: f"{row[key]:.1%}" + (" (!)" if superlinear(row[key]) else "")


def superlinear_warning(rows: Sequence[Mapping[str, Any]], key: str, describe: Callable[[Mapping[str, Any]], str]
                        ) -> str | None:
    """A warning for efficiencies above 100%: N processes doing more than N times one process's work."""
    above = [row for row in rows if superlinear(row.get(key))]
    if not above:
        return None
    worst = max(above, key=lambda row: row[key])
    return (f"efficiency above 100% ({worst[key]:.1%} at {describe(worst)}, marked (!)): superlinear figures "
            "usually mean the runs are not comparable (different threads per process, another device, or a "
            "reference run slowed by a busy machine), not that data parallelism gained more than the processes "
            "added")


class BenchOutput:
    """The files one bench run writes into `directory`: <bench>.json, <bench>.md and <bench>-<name>.png, and the
    `other_files` it writes itself (such as a trace); and the warnings of the run, printed as they arise and
    written with the figures."""

    def __init__(self, directory: str, bench: str, argv: Sequence[str], overwrite: bool = False,
                 program: str | None = None, other_files: Sequence[str] = ()):
        self.directory, self.bench = directory, bench
        self.warnings: list[str] = []
        self.command = " ".join([program or f"bertbench bench {bench}", *argv])
        if not overwrite and os.path.isdir(directory):
            plots = sorted(name for name in os.listdir(directory)
                           if name.startswith(f"{bench}-") and name.endswith(".png"))
            for name in [f"{bench}.json", f"{bench}.md", *plots, *other_files]:
                if os.path.exists(os.path.join(directory, name)):
                    raise FileExistsError(f"{os.path.join(directory, name)} exists: choose another --output_dir "
                                          "or pass --overwrite")

    def path(self, suffix: str) -> str:
        return os.path.join(self.directory, f"{self.bench}{suffix}")

    def warn(self, message: str | None) -> None:
        """Record a warning (None: nothing to warn of) and print it now, so a long run shows it as it arises."""
        if message and message not in self.warnings:
            self.warnings.append(message)
            print(f"warning: {message}", flush=True)

    def write(self, settings: Mapping[str, Any], figures: Mapping[str, Any], markdown: str,
              plots: Mapping[str, Any] = ()) -> str:
        """Write the JSON (machine, versions, settings, figures, warnings), the markdown with a "**Warning:**" line
        per warning after its title, and each matplotlib figure in `plots` (name -> Figure); returns the markdown
        as written, to print."""
        report = {"bench": self.bench, "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  "command": self.command,
                  "machine": machine(), "versions": versions(), "settings": dict(settings), **figures,
                  "warnings": [*figures.get("warnings", []), *self.warnings]}
        os.makedirs(self.directory, exist_ok=True)
        for name, figure in dict(plots).items():
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
            write_bytes_atomically(self.path(f"-{name}.png"), buffer.getvalue())
        markdown = with_warnings(markdown, self.warnings)
        write_text_atomically(self.path(".md"), markdown.rstrip("\n") + "\n")
        write_text_atomically(self.path(".json"), json.dumps(report, indent=2) + "\n")
        return markdown


def with_warnings(markdown: str, warnings: Sequence[str]) -> str:
    """The markdown with a "**Warning:** ..." paragraph per warning after its first line (the title), where a
    reader sees them before the figures they qualify."""
    if not warnings:
        return markdown
    title, _, rest = markdown.partition("\n")
    return "\n\n".join([title, *(f"**Warning:** {message}" for message in warnings), rest.lstrip("\n")])


def write_bytes_atomically(path: str, data: bytes) -> None:
    temporary = f"{path}.tmp"
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
