"""`bertbench report DIR...`: merge the results of several bench runs into one comparison.

Each DIR (or JSON file) holds what `bertbench bench KIND` wrote. Results of one kind are lined up by their setting
(for throughput: model, step kind, sequence length, precision, variant, batch), one column per run, and the last
column gives the last run relative to the first: an H100 against this CPU, bf16 against fp32, recompute against
baseline runs, a new release against an old one. Writes report.md, report.json and report-*.png to --output_dir.

    bertbench report bench_results/throughput-cpu bench_results/throughput-h100 --output_dir comparison
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bertbench.bench import cli
from bertbench.bench.plots import line_plot
from bertbench.bench.output import BenchOutput, markdown_table
from bertbench.bench.workload import BenchError
from bertbench.errors import ArgumentParser


@dataclass(frozen=True)
class Comparison:
    """How one bench kind's rows line up across runs: the fields that name a setting, the figures compared."""

    rows: Callable[[dict], list[dict]]
    setting: tuple[str, ...]
    figures: tuple[tuple[str, str, str], ...]  # (title, key, format)


def top_rows(report: dict) -> list[dict]:
    return list(report.get("rows", []))


def model_rows(report: dict) -> list[dict]:
    return [dict(row, model=entry.get("model")) for entry in report.get("models", []) for row in entry["rows"]]


def data_creation_rows(report: dict) -> list[dict]:
    return top_rows(report) + list(report.get("length_bins_rows", []))


def category_rows(report: dict) -> list[dict]:
    settings = report.get("settings", {})
    row = {key: settings.get(key) for key in ("model", "kind", "variant", "precision", "batch_size",
                                              "max_seq_length")}
    row["step_seconds"] = report.get("step_seconds")
    for name, values in report.get("categories", {}).items():
        row[f"{name}_share"] = values["share"]
    return [row]


COMPARISONS = {
    "throughput": Comparison(top_rows, ("model", "kind", "seq", "precision", "variant", "batch"),
                             (("seq/s", "seq_per_s", ",.2f"), ("MFU", "mfu", ".1%"))),
    "memory": Comparison(top_rows, ("model", "kind", "precision", "seq", "variant"),
                         (("largest batch", "max_batch", ",d"), ("slowdown", "slowdown", ".2f"))),
    "scaling": Comparison(model_rows, ("model", "nodes", "processes"),
                          (("seq/s", "seq_per_s", ",.2f"), ("efficiency", "efficiency", ".1%"))),
    "budget": Comparison(top_rows, ("contender",), (("sentences", "sentences", ",d"),
                                                    ("dev metric", "metric_value", ".4f"))),
    "profile": Comparison(category_rows, ("model", "kind", "variant", "precision", "batch_size", "max_seq_length"),
                          (("step (s)", "step_seconds", ".4f"), ("matmul share", "matmul_share", ".1%"),
                           ("attention share", "attention_share", ".1%"))),
    "plan": Comparison(top_rows, ("nodes", "gpus"), (("efficiency", "efficiency", ".1%"),
                                                    ("time to train (h)", "time_to_train_hours", ",.1f"))),
    "pretraining-data": Comparison(data_creation_rows, ("max_seq_length", "bins", "workers"),
                                   (("MB/s", "mb_per_s", ",.2f"), ("peak RSS main (MiB)", "peak_rss_main_mib", ",.0f"),
                                    ("peak RSS worker (MiB)", "peak_rss_worker_mib", ",.0f"))),
}


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="bertbench report", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="DIR", help="Output directories of bench runs (or their JSON "
                                                                "files), in the order of the columns.")
    parser.add_argument("--output_dir", "--output-dir", default=None,
                        help="Where report.md, report.json and report-*.png go (default: "
                             "bench_results/report-<date>-<time>).")
    parser.add_argument("--overwrite", action="store_true", help="Replace an earlier report in --output_dir.")
    return parser


def read_runs(paths: Sequence[str]) -> list[tuple[str, dict]]:
    """(label, report) of every bench JSON in the given directories or files; the label is the directory name."""
    found = []
    for path in paths:
        if not os.path.exists(path):
            raise BenchError(f"{path}: no such file or directory")
        files = sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
        reports = []
        for file in files:
            try:
                with open(file) as handle:
                    report = json.load(handle)
            except json.JSONDecodeError as error:
                raise BenchError(f"{file}: not valid JSON (line {error.lineno}: {error.msg})") from None
            if isinstance(report, dict) and report.get("bench") in COMPARISONS:
                reports.append(report)
        if not reports:
            raise BenchError(f"{path}: no bench results (a KIND.json written by `bertbench bench KIND`)")
        label = os.path.basename(os.path.normpath(os.path.dirname(path) if os.path.isfile(path) else path))
        found += [(label, report) for report in reports]
    return found


def run_label(label: str, report: dict, labels: list[str]) -> str:
    """The run's directory name, with the GPU or processor it ran on; made unique among `labels`."""
    machine = report.get("machine", {})
    where = machine.get("gpu") or f"{machine.get('cpu_count', '?')}-core CPU"
    name = f"{label} ({where})"
    suffix = 2
    while name in labels:
        name, suffix = f"{label} ({where}) #{suffix}", suffix + 1
    return name


def compare(kind: str, runs: list[tuple[str, dict]]) -> tuple[list[dict], str]:
    """One row per setting, the figures of each run side by side (missing where a run lacks the setting)."""
    spec = COMPARISONS[kind]
    merged: dict[tuple, dict] = {}
    for name, report in runs:
        for row in spec.rows(report):
            if row.get("out_of_memory"):
                continue
            setting = tuple(row.get(key) for key in spec.setting)
            line = merged.setdefault(setting, dict(zip(spec.setting, setting)))
            for _, key, _ in spec.figures:
                line[f"{key}@{name}"] = row.get(key)
    names = [name for name, _ in runs]
    columns = [(key, key, "") for key in spec.setting]
    for title, key, fmt in spec.figures:
        columns += [(f"{title}: {name}", f"{key}@{name}", fmt) for name in names]
        if len(names) > 1:
            for line in merged.values():
                first, last = line.get(f"{key}@{names[0]}"), line.get(f"{key}@{names[-1]}")
                line[f"{key}:ratio"] = last / first if first and last is not None else None
            columns.append((f"{title}: last / first", f"{key}:ratio", ".2f"))
    rows = [{key: ("–" if value is None and key in spec.setting else value) for key, value in line.items()}
            for line in merged.values()]
    text_columns = [(title, key, "" if key in spec.setting else fmt) for title, key, fmt in columns]
    return rows, markdown_table(rows, text_columns)


def plots(kind: str, runs: list[tuple[str, dict]]) -> dict:
    """Throughput: seq/s vs batch of each run and variant, per step kind and length; scaling: efficiency vs
    processes of each run."""
    result = {}
    if kind == "throughput":
        groups = sorted({(row["kind"], row["seq"], row["precision"]) for _, report in runs for row in report["rows"]})
        for step_kind, seq, precision in groups:
            series = {}
            for name, report in runs:
                for row in report["rows"]:
                    if (row["kind"], row["seq"], row["precision"]) == (step_kind, seq, precision) \
                            and not row.get("out_of_memory"):
                        xs, ys = series.setdefault(f"{name}: {row['variant']}", ([], []))
                        xs.append(row["batch"])
                        ys.append(row["seq_per_s"])
            result[f"throughput-{step_kind}-seq{seq}-{precision}"] = line_plot(
                series, "batch size", "sequences / s", f"{step_kind}, seq {seq}, {precision}", log_x=True)
    elif kind == "scaling":
        series = {name: ([row["processes"] for row in rows], [row["efficiency"] for row in rows])
                  for name, report in runs for rows in [model_rows(report)]}
        result["scaling-efficiency"] = line_plot(series, "processes", "efficiency", "scaling efficiency",
                                                 log_x=True)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        runs = read_runs(args.runs)
        output = BenchOutput(cli.output_dir(args, "report"), "report", argv, args.overwrite, "bertbench report")
        labels: list[str] = []
        named = []
        for label, report in runs:
            labels.append(run_label(label, report, labels))
            named.append((labels[-1], report))
        sections, merged, figures = [], {}, {}
        for kind in COMPARISONS:
            of_kind = [(name, report) for name, report in named if report["bench"] == kind]
            if not of_kind:
                continue
            rows, table = compare(kind, of_kind)
            merged[kind] = {"runs": [name for name, _ in of_kind], "rows": rows}
            sections += [f"## {kind}", "", table, ""]
            figures.update(plots(kind, of_kind))
        header = ["# Bench comparison", ""] + [f"- {name}: {report['bench']}, {report.get('created', '?')}, "
                                               f"`{report.get('command', '?')}`" for name, report in named] + [""]
        text = "\n".join(header + sections)
        output.write({"runs": args.runs}, {"comparisons": merged, "sources": [
            {"name": name, "bench": report["bench"], "machine": report.get("machine"),
             "versions": report.get("versions")} for name, report in named]}, text, figures)
        print(text)
        print(f"wrote {output.path('.json')}, {output.path('.md')}" + (" and plots" if figures else ""))

    return cli.run("bertbench report", body)
