"""`bertbench report DIR...`: merge the results of several bench runs, or training runs, into one comparison.

Each DIR (or JSON file) holds what `bertbench bench KIND` wrote, of any bench; a suite's directory is its parts (each
part's own KIND.json, named SUITE/PART), its suite.json given alone the suite's headline figures. Results of one
kind are lined up by their setting (for throughput: model, step kind, sequence length, lengths, precision, variant,
batch), one column per run, and the last column gives the last run relative to the first: an H100 against this
CPU, bf16 against fp32, recompute against baseline runs, a new release against an old one. Settings that only some
runs measured get a table of those runs; those that one run measured, a table of that run's own figures; and runs
that share no setting with any other are named with what differs (model, sequence length, precision, ...). Writes
report.md, report.json and report-*.png to --output_dir.

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
    """How one table of a bench's results lines up across runs: the rows it reads from the bench's JSON (each with
    the fields that name its setting and the figures compared), those fields, and the figures."""

    bench: str
    title: str
    rows: Callable[[dict], list[dict]]
    setting: tuple[str, ...]
    figures: tuple[tuple[str, str, str], ...]  # (title, key, format)


def top_rows(report: dict) -> list[dict]:
    return list(report.get("rows", []))


def with_settings(*keys: str) -> Callable[[dict], list[dict]]:
    """The rows, each with the run's `keys` from the bench's settings (those its rows do not repeat, such as the
    model a bench timed)."""

    def rows(report: dict) -> list[dict]:
        settings = report.get("settings", {})
        return [dict(row, **{key: settings.get(key) for key in keys}) for row in top_rows(report)]

    return rows


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


def finetuning_rows(report: dict) -> list[dict]:
    """Each variant's row with the task and model. Results written before the spread fields existed held a figure
    as {median, min, max}: its spread is taken again from the rounds (`runs`), as the bench takes it."""
    rows = []
    for row in with_settings("model")(report):
        line = dict(row, task=report.get("task"))
        for key, value in row.items():
            if isinstance(value, dict) and "median" in value:
                line.update(spread_fields(key, spread([run[key] for run in row["runs"]])))
        rows.append(line)
    return rows


def suite_rows(section: str) -> Callable[[dict], list[dict]]:
    """One table of the suite's headline figures (suite.json's summary), each row with the suite's size."""

    def rows(report: dict) -> list[dict]:
        return [dict(row, size=report.get("size")) for row in report["summary"].get(section, [])]

    return rows


SEQ_PER_S = ("seq/s", "seq_per_s", ",.2f")
# Every bench's results, in the order of `bertbench bench --help`; a bench whose figures fall in several tables (the
# suite's summary) has a Comparison per table.
COMPARISONS = (
    Comparison(
        "suite",
        "suite: pre-training",
        suite_rows("pretraining"),
        ("size", "part", "seq", "batch"),
        (SEQ_PER_S, ("MFU", "mfu", ".1%"), ("vs HF", "vs_hf", ".2f")),
    ),
    Comparison(
        "suite",
        "suite: recompute",
        suite_rows("recompute"),
        ("size", "variant", "batch"),
        (
            ("step (s)", "step_seconds", ".4f"),
            ("step vs baseline", "slowdown", ".2f"),
            ("largest batch", "max_batch", ",d"),
            ("seq/s at largest batch", "seq_per_s_at_max_batch", ",.2f"),
        ),
    ),
    Comparison(
        "suite",
        "suite: compile",
        suite_rows("compile"),
        ("size", "seq", "batch"),
        (
            ("compiled seq/s", "seq_per_s", ",.2f"),
            ("vs eager", "vs_eager", ".2f"),
            ("compile (s)", "compile_seconds", ".1f"),
        ),
    ),
    Comparison(
        "suite",
        "suite: fine-tuning",
        suite_rows("finetuning"),
        ("size", "batch", "path"),
        (
            ("real tokens/s", "real_tokens_per_s", ",.0f"),
            ("vs padded", "vs_padded", ".2f"),
            ("vs HF dynamic", "vs_hf_dynamic", ".2f"),
        ),
    ),
    Comparison(
        "suite",
        "suite: optimizer",
        suite_rows("optimizer"),
        ("size", "optimizer"),
        (("step (ms)", "step_ms", ".2f"), ("step / floor", "ratio_to_floor", ".2f")),
    ),
    Comparison(
        "throughput",
        "throughput",
        throughput_rows,
        ("model", "kind", "seq", "lengths", "precision", "variant", "batch"),
        (SEQ_PER_S, ("real tokens/s", "real_tokens_per_s", ",.0f"), ("MFU", "mfu", ".1%")),
    ),
    Comparison(
        "memory",
        "memory",
        top_rows,
        ("model", "kind", "precision", "seq", "variant"),
        (("largest batch", "max_batch", ",d"), ("slowdown", "slowdown", ".2f"), SEQ_PER_S),
    ),
    Comparison(
        "optimizer",
        "optimizer",
        with_settings("model"),
        ("model", "optimizer"),
        (("step (ms)", "step_ms", ".2f"), ("step / floor", "ratio_to_floor", ".2f")),
    ),
    Comparison(
        "scaling",
        "scaling",
        model_rows,
        ("model", "nodes", "processes"),
        (SEQ_PER_S, ("efficiency", "efficiency", ".1%")),
    ),
    Comparison(
        "budget",
        "budget",
        with_settings("minutes"),
        ("minutes", "metric", "contender"),
        (("sentences", "sentences", ",d"), ("dev metric", "metric_value", ".4f")),
    ),
    Comparison(
        "finetuning",
        "finetuning",
        finetuning_rows,
        ("task", "model", "variant"),
        (
            ("steady seq/s", "steady_seq_per_s", ",.1f"),
            ("dev acc", "dev_acc", ".4f"),
            ("F1", "f1", ".2f"),
            ("exact", "exact", ".2f"),
            ("s per save", "seconds_per_save", ".3f"),
        ),
    ),
    Comparison(
        "profile",
        "profile",
        category_rows,
        ("model", "kind", "variant", "precision", "batch_size", "max_seq_length"),
        (
            ("step (s)", "step_seconds", ".4f"),
            ("matmul share", "matmul_share", ".1%"),
            ("attention share", "attention_share", ".1%"),
        ),
    ),
    Comparison(
        "plan",
        "plan",
        with_settings("model", "kind", "seq", "batch_per_device"),
        ("model", "kind", "seq", "batch_per_device", "nodes", "gpus"),
        (("efficiency", "efficiency", ".1%"), ("time to train (h)", "time_to_train_hours", ",.1f")),
    ),
    Comparison(
        "squad-data",
        "squad-data",
        with_settings("max_seq_length", "doc_stride", "max_query_length"),
        ("set", "max_seq_length", "doc_stride", "max_query_length"),
        (("per second", "per_s", ",.0f"),),
    ),
    Comparison(
        "pretraining-data",
        "pretraining-data",
        data_creation_rows,
        ("max_seq_length", "bins", "workers"),
        (
            ("MB/s", "mb_per_s", ",.2f"),
            ("peak RSS main (MiB)", "peak_rss_main_mib", ",.0f"),
            ("peak RSS worker (MiB)", "peak_rss_worker_mib", ",.0f"),
        ),
    ),
)
KINDS = tuple(dict.fromkeys(spec.bench for spec in COMPARISONS))
SPREAD_SUFFIXES = ("_min", "_max", "_cv")  # a figure measured several times: KEY with KEY_min, KEY_max, KEY_cv


# ---- training runs: run directories side by side ------------------------------------------------------------------

TRAINING = "training"
# Dev-metric keys of eval_results.json that rank a model, best first: GLUE's main metrics, then SQuAD's.
RANKING_METRICS = ("acc", "acc_and_f1", "mcc", "corr", "f1", "exact")
NOT_METRICS = ("loss", "examples")
MIN_WINDOWS_FOR_SPREAD = 3  # fewer logged windows (--log_step_count_steps) say nothing about the spread


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


# ---- reading: every file a bench writes, checked before anything is written -----------------------------------------


@dataclass(frozen=True)
class Run:
    """One run the report compares: the name of its directory (a suite's part: SUITE/PART), what its bench wrote
    (a training run: training_run's report), and the rows of each of its comparisons (by title), read and checked."""

    label: str
    report: dict
    rows: dict[str, list[dict]]


def load_json(path: str):
    """A JSON file's value; invalid JSON is a BenchError naming the file and line."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        raise BenchError(f"{path}: not valid JSON (line {error.lineno}: {error.msg})") from None


def problem(error: Exception) -> str:
    return f"no {error.args[0]!r}" if isinstance(error, KeyError) else str(error)


def checked_rows(spec: Comparison, report: dict, path: str) -> list[dict]:
    """The comparison's rows of one result (out-of-memory settings have no figures), each setting field a value and
    each figure a number its format prints; anything else is a BenchError naming the file."""
    try:
        rows = [row for row in spec.rows(report) if not row.get("out_of_memory")]
        for row in rows:
            for key in spec.setting:
                if isinstance(row.get(key), (dict, list)):
                    raise ValueError(f"{key} is {row[key]!r}")
            for _, key, fmt in spec.figures:
                for name in (key, *(f"{key}{suffix}" for suffix in SPREAD_SUFFIXES)):
                    value = row.get(name)
                    if value is not None and not printable(value, ".1%" if name.endswith("_cv") else fmt):
                        raise ValueError(f"{name} is {value!r}")
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        raise BenchError(
            f"{path}: not a result of `bertbench bench {spec.bench}` as this version writes it ({problem(error)})"
        ) from None
    return rows


def printable(value, fmt: str) -> bool:
    try:
        format(value, fmt)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, (bool, str))


def read_result(path: str, label: str) -> Run:
    """A bench's JSON file: one that is not a bench result, or is of a bench the report does not read, is a
    BenchError naming it."""
    report = load_json(path)
    bench = report.get("bench") if isinstance(report, dict) else None
    if not isinstance(bench, str):
        raise BenchError(f'{path}: not a bench result (no "bench" field, as a KIND.json of `bertbench bench KIND` has)')
    if bench not in KINDS:
        raise BenchError(f'{path}: "bench": {bench!r} is no bench the report reads ({", ".join(KINDS)})')
    return Run(
        label, report, {spec.title: checked_rows(spec, report, path) for spec in COMPARISONS if spec.bench == bench}
    )


def suite_parts(suite: Run, path: str) -> tuple[list[Run], list[str]]:
    """A suite's directory as its parts, each part's own result (DIR/PART/KIND.json) named SUITE/PART, and a note
    for each part that failed in the suite."""
    runs, notes = [], []
    try:
        for part in suite.report["parts"]:
            name = f"{suite.label}/{part['name']}"
            if part["exit_status"]:
                notes.append(f"{name} failed in the suite (exit {part['exit_status']}: {part.get('error', '?')})")
                continue
            part_path = os.path.join(os.path.dirname(path), part["report"])
            if not os.path.isfile(part_path):
                raise BenchError(
                    f"{part_path}: missing, though {path} lists it as done (pass {path} alone to compare the "
                    "suite's headline figures)"
                )
            runs.append(read_result(part_path, name))
    except (KeyError, TypeError) as error:
        raise BenchError(
            f"{path}: not a result of `bertbench bench suite` as this version writes it ({problem(error)})"
        ) from None
    return runs, notes


def read_runs(paths: Sequence[str]) -> tuple[list[Run], list[str]]:
    """Every run in the given directories or files, and notes on what they hold that cannot be compared. A directory
    is a training run, or the KIND.json files a bench wrote there (a suite's: its parts); a file is that result (a
    suite.json alone: the suite's headline figures)."""
    found, notes = [], []
    for path in paths:
        if not os.path.exists(path):
            raise BenchError(f"{path}: no such file or directory")
        label = os.path.basename(os.path.normpath(path if os.path.isdir(path) else os.path.dirname(path)))
        if os.path.isfile(os.path.join(path, run_files.RUN_RECORD)):
            report = training_run(path)
            found.append(Run(label, report, {TRAINING: report["rows"]}))
            continue
        if os.path.isfile(path):
            found.append(read_result(path, label))
            continue
        runs = []
        for kind in KINDS:
            file = os.path.join(path, f"{kind}.json")
            if os.path.isfile(file):
                result = read_result(file, label)
                if result.report["bench"] == "suite":
                    parts, failed = suite_parts(result, file)
                    runs += parts
                    notes += failed
                else:
                    runs.append(result)
        if not runs:
            raise BenchError(
                f"{path}: no bench results (a KIND.json written by `bertbench bench KIND`) and no "
                f"training run ({run_files.RUN_RECORD})"
            )
        found += runs
    return found, notes


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


# ---- comparing: the runs of a bench side by side, by setting ---------------------------------------------------------


def compare(spec: Comparison, runs: list[tuple[str, list[dict]]]) -> tuple[list[dict], str]:
    """One row per setting with the figures of each run that measured it (`measured_by`), and the markdown: a table
    for each group of runs that measured the same settings, their figures side by side with the last over the first,
    and a table of its own for the settings only one run measured."""
    merged: dict[tuple, dict] = {}
    for name, rows in runs:
        for row in rows:
            setting = tuple(row.get(key) for key in spec.setting)
            line = merged.setdefault(setting, {**dict(zip(spec.setting, setting)), "measured_by": []})
            if name not in line["measured_by"]:
                line["measured_by"].append(name)
            for _, key, _ in spec.figures:
                line[f"{key}@{name}"] = row.get(key)
                for bound in SPREAD_SUFFIXES:  # a figure measured several times keeps its spread
                    line[f"{key}@{name}{bound}"] = row.get(f"{key}{bound}")
    for line in merged.values():
        names = line["measured_by"]
        for _, key, _ in spec.figures if len(names) > 1 else ():
            first, last = line.get(f"{key}@{names[0]}"), line.get(f"{key}@{names[-1]}")
            line[f"{key}:ratio"] = last / first if first and last is not None else None
    rows = [
        {key: ("–" if value is None and key in spec.setting else value) for key, value in line.items()}
        for line in merged.values()
    ]
    groups: dict[tuple[str, ...], list[dict]] = {}
    for row in rows:
        groups.setdefault(tuple(row["measured_by"]), []).append(row)
    ordered = sorted(groups.items(), key=lambda group: len(group[0]) == 1)  # the comparisons first
    if len(ordered) == 1 and len(ordered[0][0]) == len(runs):
        return rows, group_table(spec, *ordered[0])
    texts = []
    for names, group in ordered:
        heading = f"measured by {join_names(names)}" if len(names) > 1 else f"measured only by {names[0]}"
        texts.append(f"### {heading}\n\n{group_table(spec, names, group)}")
    return rows, "\n\n".join(texts)


def group_table(spec: Comparison, names: Sequence[str], rows: list[dict]) -> str:
    """The markdown table of settings the runs `names` all measured: a column per run and figure (but for figures
    none of them has), and the last run's over the first's."""
    columns = [(key, key, "") for key in spec.setting]
    for title, key, fmt in spec.figures:
        if all(row.get(f"{key}@{name}") is None for row in rows for name in names):
            continue
        if len(names) == 1:
            columns.append((title, f"{key}@{names[0]}", cell(f"{key}@{names[0]}", fmt)))
            continue
        columns += [(f"{title}: {name}", f"{key}@{name}", cell(f"{key}@{name}", fmt)) for name in names]
        columns.append((f"{title}: last / first", f"{key}:ratio", ".2f"))
    return markdown_table(rows, columns)


def join_names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def cell(key: str, fmt: str):
    """How a compared figure prints: with its spread when it has one, an efficiency above 100% flagged."""
    if key.startswith("efficiency@"):
        return efficiency_column(key, key)[2]
    return spread_column(key, key, fmt)[2]


def unshared_warnings(spec: Comparison, runs: list[tuple[str, list[dict]]]) -> list[str]:
    """A warning for the runs that share no setting with any other, saying what differs: the setting fields on which
    such a run measured no value another run measured (model, sequence length, precision, ...)."""
    settings = {name: {tuple(row.get(key) for key in spec.setting) for row in rows} for name, rows in runs}

    def values(names: Sequence[str], index: int) -> set:
        return {setting[index] for name in names for setting in settings[name]}

    def others(name: str) -> list[str]:
        return [other for other in settings if other != name]

    alone = [name for name in settings if all(settings[name].isdisjoint(settings[other]) for other in others(name))]
    if len(settings) < 2 or not alone:
        return []
    if len(alone) == len(settings):
        differing = []
        for index, key in enumerate(spec.setting):
            if any(values([name], index).isdisjoint(values(others(name), index)) for name in alone):
                by_values: dict[str, list[str]] = {}
                for name in settings:
                    by_values.setdefault(value_list(values([name], index)), []).append(name)
                differing.append(
                    f"{key} (" + "; ".join(f"{', '.join(n)}: {text}" for text, n in by_values.items()) + ")"
                )
        what = "; ".join(differing) or f"the combination of {', '.join(spec.setting)} each measured"
        return [f"the runs share no setting: they differ in {what}, so each run's figures are shown on their own"]
    warnings = []
    for name in alone:
        differing = [
            f"{key} {value_list(values([name], index))} (the others: {value_list(values(others(name), index))})"
            for index, key in enumerate(spec.setting)
            if values([name], index).isdisjoint(values(others(name), index))
        ]
        what = " and ".join(differing) or f"a combination of {', '.join(spec.setting)} no other run measured"
        warnings.append(
            f"{name} shares no setting with the other runs: it measured {what}, so its figures are shown on their own"
        )
    return warnings


def value_list(values: set) -> str:
    return ", ".join(sorted("–" if value is None else str(value) for value in values))


def comparison_warnings(spec: Comparison, runs: list[tuple[str, Run]], rows: list[dict]) -> list[str]:
    """What makes the runs of one comparison hard to compare: runs that share no setting with any other, different
    devices or CPU threads among those side by side (the ratios then measure those too), efficiencies above 100%,
    and spreads that show a busy machine."""
    side_by_side = {name for row in rows if len(row["measured_by"]) > 1 for name in row["measured_by"]}
    machines = [{"run": name, **run.report.get("machine", {})} for name, run in runs if name in side_by_side]
    for machine in machines:
        machine["gpu"] = machine.get("gpu") or "none"
    warnings = [
        *unshared_warnings(spec, [(name, run.rows[spec.title]) for name, run in runs]),
        mismatch_warning(
            machines,
            {"gpu": "GPU", "threads": "CPU threads", "cpu_count": "cores"},
            "run",
            "so the ratios between them measure that difference too",
        ),
    ]
    for name, _ in runs:
        if spec.bench in ("scaling", "plan"):
            warnings.append(
                superlinear_warning(
                    rows,
                    f"efficiency@{name}",
                    lambda row: f"{name}, " + ", ".join(str(row[key]) for key in spec.setting),
                )
            )
        # one warning a run: its figures of a setting come from the same repeats (seq/s, tokens/s, MFU)
        noisy = (
            noisy_warning(rows, f"{key}@{name}", lambda row: name, what=f"{key} of {name}")
            for _, key, _ in spec.figures
        )
        warnings.append(next((warning for warning in noisy if warning), None))
    return [warning for warning in warnings if warning]


def plots(spec: Comparison, runs: list[tuple[str, list[dict]]]) -> dict:
    """Throughput: seq/s vs batch of each run and variant, per step kind, length and precision; scaling:
    efficiency vs processes of each run."""
    result = {}
    if spec.title == "throughput":
        plotted = [
            (name, row) for name, rows in runs for row in rows if None not in (row.get("batch"), row.get("seq_per_s"))
        ]
        for group in sorted({(row.get("kind"), row.get("seq"), row.get("precision")) for _, row in plotted}, key=str):
            series = {}
            for name, row in plotted:
                if (row.get("kind"), row.get("seq"), row.get("precision")) == group:
                    xs, ys, lows, highs = series.setdefault(f"{name}: {row.get('variant')}", ([], [], [], []))
                    xs.append(row["batch"])
                    ys.append(row["seq_per_s"])
                    lows.append(row.get("seq_per_s_min"))
                    highs.append(row.get("seq_per_s_max"))
            step_kind, seq, precision = group
            result[f"throughput-{step_kind}-seq{seq}-{precision}"] = line_plot(
                series, "batch size", "sequences / s", f"{step_kind}, seq {seq}, {precision}", log_x=True
            )
    elif spec.title == "scaling":
        series = {
            name: ([row["processes"] for row in rows], [row["efficiency"] for row in rows])
            for name, rows in runs
            if all(None not in (row.get("processes"), row.get("efficiency")) for row in rows)
        }
        result["scaling-efficiency"] = line_plot(series, "processes", "efficiency", "scaling efficiency", log_x=True)
    return result


def section(title: str, table: str, warnings: Sequence[str]) -> str:
    """A comparison's markdown: its title, its warnings under it (as a bench's file has them), its tables."""
    return with_warnings(f"## {title}\n\n{table}", warnings) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        runs, notes = read_runs(args.runs)
        output = BenchOutput(cli.output_dir(args, "report"), "report", argv, args.overwrite, "bertbench report")
        labels: list[str] = []
        named = []
        for run in runs:
            labels.append(run_label(run.label, run.report, labels))
            named.append((labels[-1], run))
        sections, merged, figures = [], {}, {}
        trained = [(name, run.report) for name, run in named if run.report["bench"] == TRAINING]
        if trained:
            rows, table, warnings = training_section(trained)
            merged[TRAINING] = {"runs": [name for name, _ in trained], "rows": rows, "warnings": warnings}
            sections.append(section("training runs", table, warnings))
            figures.update(training_plots(trained))
        for spec in COMPARISONS:
            of_kind = [(name, run) for name, run in named if run.rows.get(spec.title)]
            if not of_kind:
                continue
            measured = [(name, run.rows[spec.title]) for name, run in of_kind]
            rows, table = compare(spec, measured)
            warnings = comparison_warnings(spec, of_kind, rows)
            merged[spec.title] = {"runs": [name for name, _ in of_kind], "rows": rows, "warnings": warnings}
            sections.append(section(spec.title, table, warnings))
            figures.update(plots(spec, measured))
        header = (
            ["# Comparison", ""]
            + [
                f"- {name}: {run.report['bench']}, {run.report.get('created') or '?'}, "
                f"`{run.report.get('command', '?')}`"
                for name, run in named
            ]
            + [f"- not compared: {note}" for note in notes]
            + [""]
        )
        text = "\n".join(header + sections)
        output.write(
            {"runs": args.runs},
            {
                "comparisons": merged,
                "not_compared": notes,
                "sources": [
                    {
                        "name": name,
                        "bench": run.report["bench"],
                        "machine": run.report.get("machine"),
                        "versions": run.report.get("versions"),
                    }
                    for name, run in named
                ],
            },
            text,
            figures,
        )
        print(text)
        print(f"wrote {output.path('.json')}, {output.path('.md')}" + (" and plots" if figures else ""))

    return cli.run("bertbench report", body)
