"""`bertbench report DIR...`: merge the results of several bench runs, or training runs, into one comparison.

Each DIR (or JSON file) holds what `bertbench bench KIND` wrote. Results of one kind are lined up by their setting
(for throughput: model, step kind, sequence length, precision, variant, batch), one column per run, and the last
column gives the last run relative to the first: an H100 against this CPU, bf16 against fp32, recompute against
baseline runs, a new release against an old one. Writes report.md, report.json and report-*.png to --output_dir.

    bertbench report bench_results/throughput-cpu bench_results/throughput-h100 --output_dir comparison

A DIR may also be a run directory of run_classifier or run_squad (it holds bertbench_run.json), such as the
original suite's 20-minute comparison makes: the runs are put side by side, one row each, with how long they
trained, the sentences they saw, their sentences/s (and its spread over the logged windows of metrics.jsonl) and
their dev metrics, and two plots: sentences seen over training time, and the dev metric against sentences seen.

    bertbench report results/MNLI_fp16_bs24_lr5e-5_seq128_baseline_gpu1 \
        results/MNLI_fp16_bs24_lr5e-5_seq128_recompute-full_gpu4_nodes2 --output_dir results/report
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bertbench.bench import cli
from bertbench.bench.output import (
    BenchOutput,
    efficiency_column,
    markdown_table,
    mismatch_warning,
    spread_column,
    superlinear_warning,
    with_warnings,
)
from bertbench.bench.plots import line_plot
from bertbench.bench.workload import BenchError
from bertbench.common import run_files
from bertbench.common.flags import ArgumentParser
from bertbench.common.noise import noisy_warning, spread, spread_fields, spread_text
from bertbench.training.metrics import read_metrics, window_rates


@dataclass(frozen=True)
class Comparison:
    """How one bench kind's rows line up across runs: the fields that name a setting, the figures compared."""

    rows: Callable[[dict], list[dict]]
    setting: tuple[str, ...]
    figures: tuple[tuple[str, str, str], ...]  # (title, key, format)


def top_rows(report: dict) -> list[dict]:
    return list(report.get("rows", []))


def throughput_rows(report: dict) -> list[dict]:
    # Results written before --lengths existed timed full-length batches.
    return [dict(row, lengths=row.get("lengths", "full")) for row in top_rows(report)]


def model_rows(report: dict) -> list[dict]:
    return [dict(row, model=entry.get("model")) for entry in report.get("models", []) for row in entry["rows"]]


def data_creation_rows(report: dict) -> list[dict]:
    return top_rows(report) + list(report.get("length_bins_rows", []))


def category_rows(report: dict) -> list[dict]:
    settings = report.get("settings", {})
    row = {key: settings.get(key) for key in ("model", "kind", "variant", "precision", "batch_size", "max_seq_length")}
    row["step_seconds"] = report.get("step_seconds")
    for name, values in report.get("categories", {}).items():
        row[f"{name}_share"] = values["share"]
    return [row]


COMPARISONS = {
    "throughput": Comparison(
        throughput_rows,
        ("model", "kind", "seq", "lengths", "precision", "variant", "batch"),
        (("seq/s", "seq_per_s", ",.2f"), ("real tokens/s", "real_tokens_per_s", ",.0f"), ("MFU", "mfu", ".1%")),
    ),
    "memory": Comparison(
        top_rows,
        ("model", "kind", "precision", "seq", "variant"),
        (("largest batch", "max_batch", ",d"), ("slowdown", "slowdown", ".2f")),
    ),
    "scaling": Comparison(
        model_rows,
        ("model", "nodes", "processes"),
        (("seq/s", "seq_per_s", ",.2f"), ("efficiency", "efficiency", ".1%")),
    ),
    "budget": Comparison(
        top_rows, ("contender",), (("sentences", "sentences", ",d"), ("dev metric", "metric_value", ".4f"))
    ),
    "profile": Comparison(
        category_rows,
        ("model", "kind", "variant", "precision", "batch_size", "max_seq_length"),
        (
            ("step (s)", "step_seconds", ".4f"),
            ("matmul share", "matmul_share", ".1%"),
            ("attention share", "attention_share", ".1%"),
        ),
    ),
    "plan": Comparison(
        top_rows,
        ("nodes", "gpus"),
        (("efficiency", "efficiency", ".1%"), ("time to train (h)", "time_to_train_hours", ",.1f")),
    ),
    "pretraining-data": Comparison(
        data_creation_rows,
        ("max_seq_length", "bins", "workers"),
        (
            ("MB/s", "mb_per_s", ",.2f"),
            ("peak RSS main (MiB)", "peak_rss_main_mib", ",.0f"),
            ("peak RSS worker (MiB)", "peak_rss_worker_mib", ",.0f"),
        ),
    ),
}


# ---- training runs: run directories side by side ------------------------------------------------------------------

TRAINING = "training"
# Dev-metric keys of eval_results.json that rank a model, best first: GLUE's main metrics, then SQuAD's.
RANKING_METRICS = ("acc", "acc_and_f1", "mcc", "corr", "f1", "exact")
NOT_METRICS = ("loss", "examples")
SPREAD_SUFFIXES = ("_min", "_max", "_cv")
MIN_WINDOWS_FOR_SPREAD = 3  # fewer logged windows (--log_step_count_steps) say nothing about the spread


def load_json(path: str):
    """A JSON file's value; invalid JSON is a BenchError naming the file and line."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise BenchError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None


def read_json_file(path: str) -> dict:
    value = load_json(path)
    if not isinstance(value, dict):
        raise BenchError(f"{path}: not a JSON object")
    return value


def logged_windows(run_dir: str) -> list[dict]:
    """metrics.jsonl's records with `seconds`, the training time since the run began (each invocation's elapsed_s
    restarts at 0: the earlier ones' ends are added)."""
    records, offset, last = [], 0.0, 0.0
    try:
        for record in read_metrics(run_dir):
            elapsed = float(record["elapsed_s"])
            if elapsed < last:  # a new invocation
                offset += last
            last = elapsed
            records.append(dict(record, seconds=offset + elapsed))
    except (KeyError, TypeError):
        raise BenchError(f"{os.path.join(run_dir, run_files.METRICS)}: a record without elapsed_s") from None
    except ValueError as error:
        raise BenchError(str(error)) from None
    return records


def training_run(run_dir: str) -> dict:
    """A run directory as a report of kind "training": one row with its setting, figures and dev metrics."""
    record = read_json_file(os.path.join(run_dir, run_files.RUN_RECORD))
    train_path = os.path.join(run_dir, run_files.TRAIN_RESULTS)
    if not os.path.exists(train_path):
        raise BenchError(f"{run_dir}: has not trained (no {run_files.TRAIN_RESULTS})")
    train = read_json_file(train_path)
    eval_path = os.path.join(run_dir, run_files.EVAL_RESULTS)
    scores = read_json_file(eval_path) if os.path.exists(eval_path) else {}
    metrics = {
        key: value
        for key, value in scores.items()
        if isinstance(value, (int, float)) and key != "global_step" and not key.endswith(NOT_METRICS)
    }
    args = record.get("args", {})
    windows = logged_windows(run_dir)
    rates = window_rates(windows)
    modeling, policy = train.get("modeling", "baseline"), train.get("recompute_policy")
    row = {
        "run": os.path.basename(os.path.normpath(run_dir)),
        "task": args.get("task_name") or record.get("runner"),
        "modeling": modeling + (f" ({policy})" if policy else ""),
        "variant": policy or modeling,
        "processes": train.get("world_size"),
        "nodes": train.get("nodes"),
        "device": train.get("device"),
        "threads": train.get("threads"),
        "precision": train.get("precision"),
        "batch": train.get("train_batch_size"),
        "seconds": train.get("seconds"),
        "sentences": train.get("sentences"),
        "steps": train.get("global_step"),
        "seq_per_s": train.get("sentences_per_second"),
        "steady_seq_per_s": train.get("steady_sentences_per_second"),
        "ended": (train.get("segments") or [{}])[-1].get("ended"),
        "windows": len(rates),
        **(spread_fields("window_seq_per_s", spread(rates)) if rates else {"window_seq_per_s": None}),
        "metrics": metrics,
        "metric": ranking_metric(metrics),
    }
    created = datetime.datetime.fromtimestamp(os.path.getmtime(train_path)).astimezone().isoformat(timespec="seconds")
    return {
        "bench": TRAINING,
        "rows": [row],
        "windows": windows,
        "created": created,
        "command": f"{record.get('runner', '?')} --output_dir={run_dir}",
    }


def ranking_metric(metrics: dict) -> str | None:
    """The dev metric that ranks the run: the first dev set's main metric (MNLI: matched accuracy)."""
    for name in RANKING_METRICS:
        for key in metrics:
            if key == name or key.endswith(f"_{name}"):
                return key
    return None


def training_section(runs: list[tuple[str, dict]]) -> tuple[list[dict], str, list[str]]:
    """The runs side by side: rows, the markdown table and warnings about what makes them hard to compare."""
    rows = [report["rows"][0] for _, report in runs]
    metric_names = list(dict.fromkeys(key for row in rows for key in row["metrics"]))
    table_rows = []
    for row in rows:
        line = dict(row, **{f"dev:{key}": row["metrics"].get(key) for key in metric_names})
        if row["windows"] >= MIN_WINDOWS_FOR_SPREAD:
            line["spread"] = f"{spread_text(row, 'window_seq_per_s', ',.1f')[:-1]}, {row['windows']} windows)"
        else:
            line["spread"] = f"– ({row['windows']} window{'s' if row['windows'] != 1 else ''})"
        table_rows.append(line)
    columns = [
        ("run", "run", ""),
        ("modeling", "modeling", ""),
        ("processes", "processes", "d"),
        ("precision", "precision", ""),
        ("trained (s)", "seconds", ",.0f"),
        ("sentences seen", "sentences", ",d"),
        ("sentences/s", "seq_per_s", ",.1f"),
        ("steady sentences/s", "steady_seq_per_s", ",.1f"),
        ("per logged window: median (min–max)", "spread", ""),
        ("ended", "ended", ""),
    ]
    columns += [(key, f"dev:{key}", ".4f") for key in metric_names]
    warnings = []
    tasks = sorted({str(row["task"]) for row in rows})
    if len(tasks) > 1:
        warnings.append(f"the runs are of different tasks ({', '.join(tasks)}): their dev metrics do not compare")
    seconds = [row["seconds"] for row in rows if row.get("seconds")]
    if seconds and max(seconds) > 1.1 * min(seconds):
        warnings.append(
            f"the runs trained for different times ({min(seconds):,.0f}–{max(seconds):,.0f} s): "
            "compare sentences/s, not sentences seen or accuracy"
        )
    warnings.append(
        mismatch_warning(
            rows,
            {"device": "device", "threads": "CPU threads per process"},
            "run",
            "so their sentences/s measure that difference too",
        )
    )
    return table_rows, markdown_table(table_rows, columns), [warning for warning in warnings if warning]


def series_label(row: dict) -> str:
    """A run's label in a plot, naming its variant (baseline, or the recompute policy) so it takes the variant's
    colour, as in every bench plot."""
    return f"{row['run']} ({row['variant']})"


def training_plots(runs: list[tuple[str, dict]]) -> dict:
    """Sentences seen over training time (from metrics.jsonl), and each run's dev metric against its sentences."""
    progress = {}
    for _name, report in runs:
        row = report["rows"][0]
        per_step = row["sentences"] / row["steps"] if row.get("steps") else 0
        windows = report["windows"]
        progress[series_label(row)] = (
            [0.0] + [window["seconds"] for window in windows],
            [0.0] + [window["step"] * per_step for window in windows],
        )
    result = {
        "training-progress": line_plot(
            progress, "training seconds", "sentences seen", "sentences seen over training time"
        )
    }
    scored = [report["rows"][0] for _, report in runs if report["rows"][0]["metric"]]
    if scored:
        names = sorted({row["metric"] for row in scored})
        accuracy = {series_label(row): ([row["sentences"]], [row["metrics"][row["metric"]]]) for row in scored}
        result["training-accuracy"] = line_plot(
            accuracy, "sentences seen", " / ".join(names), "dev metric against sentences seen"
        )
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="bertbench report", description=__doc__.splitlines()[0])
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="DIR",
        help="Output directories of bench runs (or their JSON files), in the order of the columns.",
    )
    parser.add_argument(
        "--output_dir",
        default=None,
        help="Where report.md, report.json and report-*.png go (default: bench_results/report-<date>-<time>).",
    )
    parser.add_argument("--overwrite", action="store_true", help="Replace an earlier report in --output_dir.")
    return parser


def read_runs(paths: Sequence[str]) -> list[tuple[str, dict]]:
    """(label, report) of every bench JSON in the given directories or files; the label is the directory name."""
    found = []
    for path in paths:
        if not os.path.exists(path):
            raise BenchError(f"{path}: no such file or directory")
        if os.path.isfile(os.path.join(path, run_files.RUN_RECORD)):
            found.append((os.path.basename(os.path.normpath(path)), training_run(path)))
            continue
        files = sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
        reports = []
        for file in files:
            report = load_json(file)
            if isinstance(report, dict) and report.get("bench") in COMPARISONS:
                reports.append(report)
        if not reports:
            raise BenchError(
                f"{path}: no bench results (a KIND.json written by `bertbench bench KIND`) and no "
                f"training run ({run_files.RUN_RECORD})"
            )
        label = os.path.basename(os.path.normpath(os.path.dirname(path) if os.path.isfile(path) else path))
        found += [(label, report) for report in reports]
    return found


def run_label(label: str, report: dict, labels: list[str]) -> str:
    """The run's directory name, with the GPU or processor it ran on; made unique among `labels`."""
    machine = report.get("machine", {})
    if report["bench"] == TRAINING:
        row = report["rows"][0]
        where = f"{row['processes'] or '?'} x {row['device'] or '?'}"
    else:
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
                for bound in SPREAD_SUFFIXES:  # a figure measured several times keeps its spread
                    line[f"{key}@{name}{bound}"] = row.get(f"{key}{bound}")
    names = [name for name, _ in runs]
    columns = [(key, key, "") for key in spec.setting]
    for title, key, fmt in spec.figures:
        columns += [(f"{title}: {name}", f"{key}@{name}", fmt) for name in names]
        if len(names) > 1:
            for line in merged.values():
                first, last = line.get(f"{key}@{names[0]}"), line.get(f"{key}@{names[-1]}")
                line[f"{key}:ratio"] = last / first if first and last is not None else None
            columns.append((f"{title}: last / first", f"{key}:ratio", ".2f"))
    rows = [
        {key: ("–" if value is None and key in spec.setting else value) for key, value in line.items()}
        for line in merged.values()
    ]
    text_columns = [(title, key, "" if key in spec.setting else cell(key, fmt)) for title, key, fmt in columns]
    return rows, markdown_table(rows, text_columns)


def cell(key: str, fmt: str):
    """How a compared figure prints: with its spread when it has one, an efficiency above 100% flagged."""
    if key.startswith("efficiency@"):
        return efficiency_column(key, key)[2]
    if "@" in key:
        return spread_column(key, key, fmt)[2]
    return fmt


def comparison_warnings(kind: str, runs: list[tuple[str, dict]], rows: list[dict]) -> list[str]:
    """What makes the runs of one kind hard to compare: different devices or CPU threads (the ratios then measure
    those too), efficiencies above 100%, and spreads that show a busy machine."""
    machines = [{"run": name, **report.get("machine", {})} for name, report in runs]
    for machine in machines:
        machine["gpu"] = machine.get("gpu") or "none"
    warnings = [
        mismatch_warning(
            machines,
            {"gpu": "GPU", "threads": "CPU threads", "cpu_count": "cores"},
            "run",
            "so the ratios between them measure that difference too",
        )
    ]
    for name, _ in runs:
        if kind in ("scaling", "plan"):
            warnings.append(
                superlinear_warning(
                    rows,
                    f"efficiency@{name}",
                    lambda row: f"{name}, " + ", ".join(str(row[key]) for key in COMPARISONS[kind].setting),
                )
            )
        for _, key, _ in COMPARISONS[kind].figures:
            warnings.append(noisy_warning(rows, f"{key}@{name}", lambda row: name, what=f"{key} of {name}"))
    return [warning for warning in warnings if warning]


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
                    if (row["kind"], row["seq"], row["precision"]) == (step_kind, seq, precision) and not row.get(
                        "out_of_memory"
                    ):
                        xs, ys, lows, highs = series.setdefault(f"{name}: {row['variant']}", ([], [], [], []))
                        xs.append(row["batch"])
                        ys.append(row["seq_per_s"])
                        lows.append(row.get("seq_per_s_min"))
                        highs.append(row.get("seq_per_s_max"))
            result[f"throughput-{step_kind}-seq{seq}-{precision}"] = line_plot(
                series, "batch size", "sequences / s", f"{step_kind}, seq {seq}, {precision}", log_x=True
            )
    elif kind == "scaling":
        series = {
            name: ([row["processes"] for row in rows], [row["efficiency"] for row in rows])
            for name, report in runs
            for rows in [model_rows(report)]
        }
        result["scaling-efficiency"] = line_plot(series, "processes", "efficiency", "scaling efficiency", log_x=True)
    return result


def section(title: str, table: str, warnings: Sequence[str]) -> str:
    """A comparison's markdown: its title, its warnings under it (as a bench's file has them), its table."""
    return with_warnings(f"## {title}\n\n{table}", warnings) + "\n"


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
        trained = [(name, report) for name, report in named if report["bench"] == TRAINING]
        if trained:
            rows, table, warnings = training_section(trained)
            merged[TRAINING] = {"runs": [name for name, _ in trained], "rows": rows, "warnings": warnings}
            sections.append(section("training runs", table, warnings))
            figures.update(training_plots(trained))
        for kind in COMPARISONS:
            of_kind = [(name, report) for name, report in named if report["bench"] == kind]
            if not of_kind:
                continue
            rows, table = compare(kind, of_kind)
            warnings = comparison_warnings(kind, of_kind, rows)
            merged[kind] = {"runs": [name for name, _ in of_kind], "rows": rows, "warnings": warnings}
            sections.append(section(kind, table, warnings))
            figures.update(plots(kind, of_kind))
        header = (
            ["# Comparison", ""]
            + [
                f"- {name}: {report['bench']}, {report.get('created') or '?'}, `{report.get('command', '?')}`"
                for name, report in named
            ]
            + [""]
        )
        text = "\n".join(header + sections)
        output.write(
            {"runs": args.runs},
            {
                "comparisons": merged,
                "sources": [
                    {
                        "name": name,
                        "bench": report["bench"],
                        "machine": report.get("machine"),
                        "versions": report.get("versions"),
                    }
                    for name, report in named
                ],
            },
            text,
            figures,
        )
        print(text)
        print(f"wrote {output.path('.json')}, {output.path('.md')}" + (" and plots" if figures else ""))

    return cli.run("bertbench report", body)
