"""What every benchmark reports with its figures: the machine, a JSON file, markdown tables."""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from bertbench.durable import write_text_atomically


def machine() -> dict[str, Any]:
    """The platform, processor, torch version, CPU threads and GPU the figures were measured on."""
    return {"platform": platform.platform(), "processor": platform.processor(), "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def write_report(path: str | None, report: Mapping[str, Any]) -> None:
    """Write the figures as JSON to path (atomically), when a path is given."""
    if path:
        write_text_atomically(path, json.dumps(report, indent=2) + "\n")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[tuple[str, str, str]]) -> str:
    """A GitHub markdown table; columns are (title, key in each row, format spec such as ".2f")."""
    lines = ["| " + " | ".join(title for title, _, _ in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(format(row[key], spec) for _, key, spec in columns) + " |")
    return "\n".join(lines)
