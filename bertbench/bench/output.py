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
from collections.abc import Mapping, Sequence
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


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A GitHub markdown table; columns are (title, key in each row, format spec such as ".2f"). A missing or None
    value prints as "–"."""
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        cells = ["–" if row.get(key) is None else format(row[key], spec) for _, key, spec in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


class BenchOutput:
    """The files one bench run writes into `directory`: <bench>.json, <bench>.md and <bench>-<name>.png, and the
    `other_files` it writes itself (such as a trace)."""

    def __init__(self, directory: str, bench: str, argv: Sequence[str], overwrite: bool = False,
                 program: str | None = None, other_files: Sequence[str] = ()):
        self.directory, self.bench = directory, bench
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

    def write(self, settings: Mapping[str, Any], figures: Mapping[str, Any], markdown: str,
              plots: Mapping[str, Any] = ()) -> dict[str, Any]:
        """Write the JSON (machine, versions, settings, figures), the markdown and each matplotlib figure in
        `plots` (name -> Figure); returns the JSON's content."""
        report = {"bench": self.bench, "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                  "command": self.command,
                  "machine": machine(), "versions": versions(), "settings": dict(settings), **figures}
        os.makedirs(self.directory, exist_ok=True)
        for name, figure in dict(plots).items():
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
            write_bytes_atomically(self.path(f"-{name}.png"), buffer.getvalue())
        write_text_atomically(self.path(".md"), markdown.rstrip("\n") + "\n")
        write_text_atomically(self.path(".json"), json.dumps(report, indent=2) + "\n")
        return report


def write_bytes_atomically(path: str, data: bytes) -> None:
    temporary = f"{path}.tmp"
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
