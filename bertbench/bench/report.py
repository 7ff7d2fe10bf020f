"""`bertbench report DIR...`: merge the results of several bench runs, or training runs, into one comparison.

Each DIR holds what `bertbench bench KIND` wrote, of any bench (results.read_results: the <bench>.json files in it
and below it, so a suite's directory is suite.json and its parts, each part named SUITE/PART); a JSON file is that
result alone. Every result is read as the one result schema (results.BenchResult), and anything else is refused in
one line naming the file. The rows of one bench measuring one figure make one table, its setting keys as columns:
the rows that several runs measured side by side, one column per run with the figure's spread and the last run over
the first (an H100 against this CPU, bf16 against fp32, a new release against an old one), a Ratio marked when its
inputs are noisy; the rows one run measured, in a table of that run's own with all its columns. Runs that share no
setting with any other are named with what differs. Writes report.md, report.json (a result of the schema: every
row read, with the run that measured it and its ratio to the first run) and report-*.png to --output_dir.

    bertbench report bench_results/throughput-cpu bench_results/throughput-h100 --output_dir comparison

A DIR may also be a run directory of run_classifier or run_squad (it holds bertbench_run.json), such as the
original suite's 20-minute comparison makes: the runs are put side by side, one row each, with how long they
trained, the sentences they saw, their sentences/s (and its spread over the logged windows of metrics.jsonl) and
their dev metrics, and two plots: sentences seen over training time, and the dev metric against sentences seen.

    bertbench report results/MNLI_fp16_bs24_lr5e-5_seq128_baseline_gpu1 \\
        results/MNLI_fp16_bs24_lr5e-5_seq128_recompute-full_gpu4_nodes2 --output_dir results/report
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from bertbench.bench.errors import BenchError
from bertbench.bench.output import BenchOutput, mismatch_warning, with_warnings
from bertbench.bench.plots import line_plot
from bertbench.bench.results import BenchResult, Column, Ratio, Row, Spread, noisy_ratios_note, read_results, table
from bertbench.bench.settings import BenchSettings, main_for
from bertbench.common import run_files
from bertbench.common.durable import read_json
from bertbench.common.errors import UsageError
from bertbench.common.flags import setting
from bertbench.training.metrics import read_metrics, window_rates


@dataclasses.dataclass(frozen=True)
class ReportSettings(BenchSettings):
    """What the report merged (recorded in report.json)."""

    bench: ClassVar[str] = "report"

    runs: tuple[str, ...] = setting(
        "Output directories of bench runs (or their JSON files), in the order of the columns.", (), positional="DIR"
    )

    @classmethod
    def program(cls) -> str:
        return "bertbench report"


# ---- training runs: run directories side by side ------------------------------------------------------------------

TRAINING = "training"
# Dev-metric keys of eval_results.json that rank a model, best first: GLUE's main metrics, then SQuAD's.
RANKING_METRICS = ("acc", "acc_and_f1", "mcc", "corr", "f1", "exact")
NOT_METRICS = ("loss", "examples")
MIN_WINDOWS_FOR_SPREAD = 3  # fewer logged windows (--log_step_count_steps) say nothing about the spread


def read_json_file(path: str) -> dict:
    value = read_json(path)
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
        "window_seq_per_s": Spread.of(rates) if rates else None,
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
            line["spread"] = f"{row['window_seq_per_s'].text(',.1f')[:-1]}, {row['windows']} windows)"
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
    text = table([Row(TRAINING, "", {}, None, line) for line in table_rows], [Column(*column) for column in columns])
    return table_rows, text, [warning for warning in warnings if warning]


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


# ---- reading: every result, checked before anything is written ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    """One result the report compares: its name (the directory it came from, a suite's part SUITE/PART, with the
    GPU or processor it ran on) and the result."""

    name: str
    result: BenchResult


def read_runs(paths: Sequence[str]) -> tuple[list[tuple[str, BenchResult]], list[tuple[str, dict]], list[str]]:
    """The bench results in the given directories or files (each labelled with its directory, SUITE/PART within a
    suite), the training runs among them, and notes on what a suite lists that cannot be compared (a failed part)."""
    results, trained, notes = [], [], []
    for path in paths:
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file or directory")
        base = os.path.basename(os.path.normpath(path if os.path.isdir(path) else os.path.dirname(path) or "."))
        if os.path.isfile(os.path.join(path, run_files.RUN_RECORD)):
            trained.append((base, training_run(path)))
            continue
        for result in read_results([path]):
            inside = os.path.relpath(os.path.dirname(result.path), path) if os.path.isdir(path) else "."
            label = base if inside == "." else f"{base}/{inside}"
            if result.bench == "suite":
                notes += suite_notes(result, label, os.path.isdir(path))
            results.append((label, result))
    return results, trained, notes


def suite_notes(suite: BenchResult, label: str, with_parts: bool) -> list[str]:
    """A note for each part that failed in the suite; a part listed as done whose result is missing from the
    suite's directory (`with_parts`: read with it) is a UsageError naming it."""
    notes = []
    parts = suite.context.get("parts", [])
    if not isinstance(parts, list) or not all(isinstance(part, dict) for part in parts):
        raise UsageError(f"{suite.path}: context.parts is not a list of the suite's parts")
    for part in parts:
        if part.get("exit_status"):
            notes.append(
                f"{label}/{part.get('name')} failed in the suite (exit {part['exit_status']}: {part.get('error', '?')})"
            )
            continue
        part_path = os.path.join(os.path.dirname(suite.path), str(part.get("report")))
        if with_parts and not os.path.isfile(part_path):
            raise UsageError(
                f"{part_path}: missing, though {suite.path} lists it as done (pass {suite.path} alone to compare the "
                "suite's headline figures)"
            )
    return notes


def run_name(label: str, result: BenchResult, names: list[str]) -> str:
    """The run's directory name, with the GPU or processor it ran on; made unique among `names`."""
    machine = result.machine
    where = machine.get("gpu") or f"{machine.get('cpu_count', '?')}-core CPU"
    name = f"{label} ({where})"
    suffix = 2
    while name in names:
        name, suffix = f"{label} ({where}) #{suffix}", suffix + 1
    return name


# ---- comparing: the rows of one bench measuring one figure, side by side by setting ------------------------------


@dataclasses.dataclass
class Comparison:
    """The rows of one (bench, measured figure) across the runs: its setting keys and each setting's rows by run."""

    bench: str
    measured: str
    unit: str
    keys: list[str]
    settings: dict[tuple, dict[str, Row]]  # setting values (hashable) -> run name -> row

    @property
    def title(self) -> str:
        return f"{self.bench}: {self.measured} ({self.unit})"

    def runs(self) -> list[str]:
        return list(dict.fromkeys(name for rows in self.settings.values() for name in rows))


def hashable(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def comparisons(runs: Sequence[Run]) -> list[Comparison]:
    """A Comparison per (bench, measured figure), in the order the runs give them."""
    found: dict[tuple[str, str], Comparison] = {}
    for run in runs:
        for row in run.result.rows:
            comparison = found.setdefault(
                (run.result.bench, row.measured), Comparison(run.result.bench, row.measured, row.unit, [], {})
            )
            comparison.keys += [key for key in row.setting if key not in comparison.keys]
    for run in runs:
        for row in run.result.rows:
            comparison = found[(run.result.bench, row.measured)]
            values = tuple(hashable(row.setting.get(key)) for key in comparison.keys)
            comparison.settings.setdefault(values, {})[run.name] = row
    return list(found.values())


def ratio_to_first(rows: dict[str, Row], name: str) -> Ratio | None:
    """A run's figure over the first run's that measured the same setting (None for the first itself)."""
    first = next(iter(rows))
    value, reference = rows[name].value, rows[first].value
    if name == first or value is None or reference is None or not reference.median:
        return None
    return Ratio.of(value, reference)


def number_spec(value: Any) -> str:
    """How a figure prints when the report knows nothing of it: integers and thousands whole, others to 4
    significant digits."""
    median = value.median if isinstance(value, Spread) else value
    if isinstance(median, int) and not isinstance(median, bool):
        return ",d"
    return ",.0f" if abs(median) >= 1000 else ",.4g"  # never 1.009e+04


def figure_cell(key: str) -> Column:
    def text(row: Row) -> str:
        value = row.get(key)
        if value is None:
            return row.status if key == row.measured and row.status != "measured" else "–"
        if isinstance(value, Ratio):
            return value.text()
        if isinstance(value, Spread):
            return value.text(number_spec(value))
        if isinstance(value, (dict, list)):
            return "…"  # a nested figure: in the run's own report
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return format(value, number_spec(value))
        return str(value).replace("|", "/")

    return Column(key, key, text)


def comparison_tables(comparison: Comparison) -> str:
    """The markdown of one comparison: a table per group of runs that measured the same settings (the figure side by
    side, the last run's over the first's), and a table of its own, with every column, for settings one run
    measured."""
    groups: dict[tuple[str, ...], list[tuple[tuple, dict[str, Row]]]] = {}
    for values, rows in comparison.settings.items():
        groups.setdefault(tuple(rows), []).append((values, rows))
    ordered = sorted(groups.items(), key=lambda group: len(group[0]) == 1)  # the comparisons first
    texts = []
    for names, members in ordered:
        if len(names) > 1:
            shown = [
                Row(
                    comparison.measured,
                    comparison.unit,
                    dict(zip(comparison.keys, values)),
                    None,
                    {
                        **{name: rows[name].value or rows[name].status for name in names},
                        "last / first": ratio_to_first(
                            {names[0]: rows[names[0]], names[-1]: rows[names[-1]]}, names[-1]
                        ),
                    },
                )
                for values, rows in members
            ]
            columns = [Column(key, key) for key in comparison.keys]
            columns += [figure_cell(name) for name in names] + [figure_cell("last / first")]
        else:
            shown = [rows[names[0]] for _, rows in members]
            extra = list(dict.fromkeys(key for row in shown for key in row.columns))
            columns = [Column(key, key) for key in comparison.keys]
            columns += [figure_cell(comparison.measured)] + [figure_cell(key) for key in extra]
        heading = ""
        if len(ordered) > 1 or len(names) < len(comparison.runs()):
            heading = (
                f"### measured by {join_names(names)}\n\n" if len(names) > 1 else f"### measured only by {names[0]}\n\n"
            )
        note = noisy_ratios_note(shown)
        texts.append(heading + table(shown, columns) + (f"\n\n{note}" if note else ""))
    return "\n\n".join(texts)


def join_names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def unshared_warnings(comparison: Comparison) -> list[str]:
    """A warning for each run that shares no setting with any other, saying on which setting keys its values differ
    from all the others' (model, sequence length, precision, ...)."""
    names = comparison.runs()
    settings = {name: {values for values, rows in comparison.settings.items() if name in rows} for name in names}
    alone = [
        name for name in names if all(settings[name].isdisjoint(settings[other]) for other in names if other != name)
    ]
    if len(names) < 2 or not alone:
        return []

    def values(runs: Sequence[str], index: int) -> set:
        return {values[index] for name in runs for values in settings[name]}

    warnings = []
    for name in alone:
        others = [other for other in names if other != name]
        differing = [
            f"{key} {value_list(values([name], index))} (the others: {value_list(values(others, index))})"
            for index, key in enumerate(comparison.keys)
            if values([name], index).isdisjoint(values(others, index))
        ]
        what = " and ".join(differing) or f"a combination of {', '.join(comparison.keys)} no other run measured"
        warnings.append(
            f"{name} shares no setting with the other runs: it measured {what}, so its figures are shown on their own"
        )
    return warnings


def value_list(values: set) -> str:
    return ", ".join(sorted("–" if value is None else str(value) for value in values))


def comparison_warnings(comparison: Comparison, results: dict[str, BenchResult]) -> list[str]:
    """What makes the runs of one comparison hard to compare: runs that share no setting with any other, and
    different devices or CPU threads among those side by side (the ratios then measure those too)."""
    side_by_side = list(dict.fromkeys(name for rows in comparison.settings.values() if len(rows) > 1 for name in rows))
    machines = [{"run": name, **results[name].machine} for name in side_by_side]
    for machine in machines:
        machine["gpu"] = machine.get("gpu") or "none"
    warnings = [
        *unshared_warnings(comparison),
        mismatch_warning(
            machines,
            {"gpu": "GPU", "threads": "CPU threads", "cpu_count": "cores"},
            "run",
            "so the ratios between them measure that difference too",
        ),
    ]
    return [warning for warning in warnings if warning]


def report_rows(comparisons_: Sequence[Comparison]) -> list[Row]:
    """report.json's rows: every row read, its setting with the bench and the run, its ratio to the first run that
    measured the same setting (vs_first_run)."""
    rows = []
    for comparison in comparisons_:
        for by_run in comparison.settings.values():
            for name, row in by_run.items():
                columns = dict(row.columns)
                ratio = ratio_to_first(by_run, name)
                if ratio is not None:
                    columns["vs_first_run"] = ratio
                tagged = {"bench": comparison.bench, "run": name, **row.setting}
                rows.append(dataclasses.replace(row, setting=tagged, columns=columns))
    return rows


def plots(comparison: Comparison) -> dict:
    """Throughput: seq/s vs batch of each run and variant, per step kind, length and precision."""
    if (comparison.bench, comparison.measured) != ("throughput", "seq_per_s"):
        return {}
    result = {}
    plotted = [
        (name, row)
        for rows in comparison.settings.values()
        for name, row in rows.items()
        if row.value is not None and row.setting.get("batch") is not None
    ]
    for group in sorted(
        {(row.setting.get("kind"), row.setting.get("seq"), row.setting.get("precision")) for _, row in plotted}, key=str
    ):
        series: dict[str, tuple[list, list, list, list]] = {}
        for name, row in plotted:
            if (row.setting.get("kind"), row.setting.get("seq"), row.setting.get("precision")) == group:
                xs, ys, lows, highs = series.setdefault(f"{name}: {row.setting.get('variant')}", ([], [], [], []))
                xs.append(row.setting["batch"])
                ys.append(row.value.median)
                lows.append(row.value.min)
                highs.append(row.value.max)
        step_kind, seq, precision = group
        result[f"throughput-{step_kind}-seq{seq}-{precision}"] = line_plot(
            series, "batch size", "sequences / s", f"{step_kind}, seq {seq}, {precision}", log_x=True
        )
    return result


def section(title: str, text: str, warnings: Sequence[str]) -> str:
    """A comparison's markdown: its title, its warnings under it (as a bench's file has them), its tables."""
    return with_warnings(f"## {title}\n\n{text}", warnings) + "\n"


def run(settings: ReportSettings, argv: list[str]) -> None:
    found, trained, notes = read_runs(settings.runs)
    output = BenchOutput(settings.directory, "report", argv, settings.overwrite, settings.program())
    names: list[str] = []
    runs = []
    for label, result in found:
        names.append(run_name(label, result, names))
        runs.append(Run(names[-1], result))
    results = {run.name: run.result for run in runs}
    sections, context, figures = [], {}, {}
    if trained:
        rows, text, warnings = training_section(trained)
        context[TRAINING] = {"runs": [name for name, _ in trained], "rows": rows, "warnings": warnings}
        sections.append(section("training runs", text, warnings))
        figures.update(training_plots(trained))
    found_comparisons = comparisons(runs)
    merged = {}
    for comparison in found_comparisons:
        warnings = comparison_warnings(comparison, results)
        merged[comparison.title] = {"runs": comparison.runs(), "warnings": warnings}
        sections.append(section(comparison.title, comparison_tables(comparison), warnings))
        figures.update(plots(comparison))
    header = [
        "# Comparison",
        "",
        *(
            f"- {run.name}: {run.result.bench}, {run.result.created or '?'}, `{run.result.command or '?'}`"
            for run in runs
        ),
        *(
            f"- {name} ({report['rows'][0]['processes'] or '?'} x {report['rows'][0]['device'] or '?'}): training "
            f"run, `{report['command']}`"
            for name, report in trained
        ),
        *(f"- not compared: {note}" for note in notes),
        "",
    ]
    text = "\n".join(header + sections)
    context.update(
        comparisons=merged,
        not_compared=notes,
        sources=[
            {
                "name": run.name,
                "bench": run.result.bench,
                "machine": run.result.machine,
                "versions": run.result.versions,
            }
            for run in runs
        ],
    )
    output.write_result(settings, report_rows(found_comparisons), context, text, figures)
    print(text)
    print(f"wrote {output.path('.json')}, {output.path('.md')}" + (" and plots" if figures else ""))


main = main_for(ReportSettings, __doc__.splitlines()[0], run)
