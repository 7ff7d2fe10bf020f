"""The one result schema every bench writes and everything that reads bench results reads (`bertbench report`, the
suite's summary, `bench plan`).

A bench's result, `<bench>.json`, is a `BenchResult`: which bench, when, the command, the machine and versions, the
bench's typed settings, `context` (bench-wide figures: the device, its peaks, a measured bandwidth), warnings, and
`rows`. A `Row` is one measured figure: what was measured (`measured`, `unit`), on what (`setting`: the values that
tell this row from the others, such as variant, batch and sequence length), the median with its spread (`value`, a
`Spread`: median, min, max, CV and the number of repeats; None when the setting could not be measured, `status` says
why), and the bench's own `columns` (numbers, text, or further Spreads and Ratios). A `Ratio` of two measured figures
carries its inputs' larger CV, and is marked wherever it is printed when that CV is above BUSY_CV (a busy machine's).

In JSON a Spread is {"median", "min", "max", "cv", "n"} and a Ratio {"ratio", "inputs_cv"}; `read` turns them back
into objects and refuses, in one line naming the file and the key, anything that is not a result of this schema.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import os
import platform
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from bertbench.common.durable import read_json
from bertbench.common.errors import UsageError
from bertbench.common.noise import BUSY_CV, Ratio, Spread, noisy_warning

SCHEMA = "bertbench-bench-result/2"


@dataclasses.dataclass(frozen=True)
class Row:
    """One measured figure of a bench: see the module docstring."""

    measured: str  # what the figure is, a name: "sequences_per_second", "step_ms", "largest_batch"
    unit: str  # "seq/s", "ms", "sequences"
    setting: Mapping[str, Any]  # what this row was measured on, telling it from the bench's other rows
    value: Spread | None  # None: not measured (status says why)
    columns: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # the bench's own, by name
    status: str = "measured"  # or why there is no value: "out of memory", "failed: ..."

    def get(self, key: str, default: Any = None) -> Any:
        """A value by name: a setting, a column, or `measured` (the Spread)."""
        if key in self.setting:
            return self.setting[key]
        if key in self.columns:
            return self.columns[key]
        return self.value if key == self.measured else default

    def median(self, key: str | None = None) -> float | None:
        """The figure `key` names (default: the measured one) as a number: a Spread's median, a Ratio's value."""
        value = self.get(key or self.measured)
        return value.median if isinstance(value, Spread) else value.value if isinstance(value, Ratio) else value


@dataclasses.dataclass(frozen=True)
class BenchResult:
    """A bench's whole result: what `<bench>.json` holds (module docstring)."""

    bench: str
    settings: Mapping[str, Any]
    rows: tuple[Row, ...]
    context: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    command: str = ""
    created: str = ""
    machine: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    versions: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    path: str | None = None  # the file it was read from

    @classmethod
    def new(
        cls,
        bench: str,
        settings: Mapping[str, Any],
        rows: Iterable[Row],
        context: Mapping[str, Any],
        warnings: Sequence[str],
        command: str,
    ) -> BenchResult:
        """A result measured now, on this machine."""
        return cls(
            bench,
            dict(settings),
            tuple(rows),
            dict(context),
            tuple(warnings),
            command,
            datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            machine(),
            versions(),
        )

    def rows_measuring(self, measured: str) -> list[Row]:
        return [row for row in self.rows if row.measured == measured]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "bench": self.bench,
            "created": self.created,
            "command": self.command,
            "machine": dict(self.machine),
            "versions": dict(self.versions),
            "settings": _to_json(self.settings),
            "context": _to_json(self.context),
            "warnings": list(self.warnings),
            "rows": [
                {
                    "measured": row.measured,
                    "unit": row.unit,
                    "setting": _to_json(row.setting),
                    "status": row.status,
                    "value": _to_json(row.value),
                    "columns": _to_json(row.columns),
                }
                for row in self.rows
            ],
        }

    @classmethod
    def from_json(cls, data: Any, path: str | None = None) -> BenchResult:
        """The result `data` (a JSON value) holds; anything else is a UsageError naming `path` and the key."""
        where = path or "bench result"
        if not isinstance(data, dict) or "bench" not in data:
            raise UsageError(f"{where}: not a bench result (a JSON object with 'bench', written by bertbench bench)")
        if data.get("schema") != SCHEMA:
            raise UsageError(
                f"{where}: 'schema' is {data.get('schema')!r}, not {SCHEMA!r}: written by another version of "
                "bertbench; run the bench again"
            )
        rows = data.get("rows")
        if not isinstance(rows, list):
            raise UsageError(f"{where}: 'rows' is not a list")
        parsed = []
        for index, row in enumerate(rows):
            key = f"rows[{index}]"
            if not isinstance(row, dict):
                raise UsageError(f"{where}: {key} is not an object")
            for name, kind in (("measured", str), ("unit", str), ("setting", dict), ("columns", dict)):
                if not isinstance(row.get(name), kind):
                    raise UsageError(f"{where}: {key}.{name} is missing or not a {kind.__name__}")
            value = _from_json(row.get("value"))
            if value is not None and not isinstance(value, Spread):
                raise UsageError(f"{where}: {key}.value is not a spread (median, min, max, cv, n) or null")
            parsed.append(
                Row(
                    row["measured"],
                    row["unit"],
                    _from_json(row["setting"]),
                    value,
                    _from_json(row["columns"]),
                    str(row.get("status", "measured")),
                )
            )
        for name, kind in (("settings", dict), ("context", dict), ("warnings", list)):
            if not isinstance(data.get(name, kind()), kind):
                raise UsageError(f"{where}: '{name}' is not a {kind.__name__}")
        return cls(
            str(data["bench"]),
            data.get("settings", {}),
            tuple(parsed),
            _from_json(data.get("context", {})),
            tuple(data.get("warnings", [])),
            str(data.get("command", "")),
            str(data.get("created", "")),
            data.get("machine", {}),
            data.get("versions", {}),
            path,
        )

    @classmethod
    def read(cls, path: str) -> BenchResult:
        """The result in the file `path` (a bench's <bench>.json)."""
        return cls.from_json(read_json(path), path)


SPREAD_KEYS = {"median", "min", "max", "cv", "n"}
RATIO_KEYS = {"ratio", "inputs_cv"}


def _to_json(value: Any) -> Any:
    if isinstance(value, Spread):
        return dataclasses.asdict(value)
    if isinstance(value, Ratio):
        return {"ratio": value.value, "inputs_cv": value.inputs_cv}
    if isinstance(value, Mapping):
        return {str(key): _to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(item) for item in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == SPREAD_KEYS:
            return Spread(**value)
        if set(value) == RATIO_KEYS:
            return Ratio(value["ratio"], value["inputs_cv"])
        return {key: _from_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_from_json(item) for item in value]
    return value


def read_results(paths: Sequence[str]) -> list[BenchResult]:
    """The results in `paths`: each a <bench>.json, or a directory holding them (a suite's: its parts'
    directories too), in the order given, a directory's sorted. In a directory, a JSON object naming its 'bench' is
    a result (one of another schema is refused, naming it); other JSON files are a runner's (a finetuning part's
    runs) and are passed over; a .json file that is not JSON is refused, naming it: bertbench writes whole files."""
    results = []
    for path in paths:
        if not os.path.isdir(path):
            results.append(BenchResult.read(path))
            continue
        found = sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names)
        read = [(name, read_json(name)) for name in found if name.endswith(".json")]
        kept = [BenchResult.from_json(data, name) for name, data in read if isinstance(data, dict) and "bench" in data]
        if not kept:
            raise UsageError(f"{path}: holds no bench result (a <bench>.json written by bertbench bench)")
        results += kept
    return results


# ---- markdown: one way to draw a table of rows ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Column:
    """A markdown column: its title, the row value it shows (Row.get's key) and how: a format spec (".2f"; a Spread
    shows its spread, a Ratio its mark), or a function of the row that writes the cell."""

    title: str
    key: str
    spec: str | Callable[[Row], str] = ""


def cell(row: Row, column: Column) -> str:
    if callable(column.spec):
        return column.spec(row)
    value = row.get(column.key)
    if value is None:
        return row.status if column.key == row.measured and row.status != "measured" else "–"
    if isinstance(value, Spread):
        return value.text(column.spec)
    if isinstance(value, Ratio):
        return value.text(column.spec or ".2f")
    return format(value, column.spec)


def table(rows: Sequence[Row], columns: Sequence[Column]) -> str:
    """A GitHub markdown table of `rows`; a missing value prints as "–", an unmeasured figure as its status."""
    lines = ["| " + " | ".join(column.title for column in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(row, column) for column in columns) + " |" for row in rows]
    return "\n".join(lines)


def noisy_rows(rows: Sequence[Row], key: str, describe: Callable[[Row], str], what: str = "timings") -> str | None:
    """noise.noisy_warning over the Spread `key` of each row that has one (`describe` names a row's setting)."""
    return noisy_warning([(describe(row), row.get(key)) for row in rows if isinstance(row.get(key), Spread)], what)


def noisy_ratios_note(rows: Sequence[Row]) -> str | None:
    """A line under a table with noisy ratios: what the mark means."""
    noisy = [value for row in rows for value in row.columns.values() if isinstance(value, Ratio) and value.noisy]
    if not noisy:
        return None
    return (
        f"A ratio marked noisy is drawn from figures whose repeats vary by more than CV {BUSY_CV:.0%} (a busy "
        "machine's): do not read it as a measured difference; run again when the machine is idle."
    )


# ---- the machine and versions a result was measured on -----------------------------------------------------------


# What torch says of the machine (its CUDA, threads, GPU) is recorded where a result was measured, which loaded torch;
# `bertbench report`, which reads results and runs nothing, loads none (half of its CPU time), and leaves those out.


def versions() -> dict[str, Any]:
    import numpy

    from bertbench import __version__

    found = {"bertbench": __version__, "python": platform.python_version(), "numpy": numpy.__version__}
    torch = sys.modules.get("torch")
    if torch is None:
        return {**found, "torch": importlib.metadata.version("torch")}
    return {
        **found,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None,
    }


def machine() -> dict[str, Any]:
    """The platform, processor, cores, memory, CPU threads and GPU the figures were measured on."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    found = {
        "platform": platform.platform(),
        "processor": platform.processor(),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory,
    }
    torch = sys.modules.get("torch")
    if torch is None:
        return found
    return {
        **found,
        "threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
