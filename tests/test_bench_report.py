"""`bertbench report`: results of the one schema (bench JSON files, suite directories, any mix) lined up by setting,
one table per bench and measured figure; training run directories side by side; anything else refused in one line."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import read_json, snapshot

from bertbench import cli as bertbench_cli
from bertbench.bench import report as report_command
from bertbench.bench.results import BenchResult, Ratio, Row, Spread, read_results

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def write_bench(directory, bench, rows, gpu=None, threads=2, context=None, warnings=()):
    """DIR/BENCH.json as a bench writes it (results.BenchResult), measured on `gpu` with `threads`."""
    result = BenchResult.new(bench, {"model": "base"}, rows, context or {}, warnings, f"bertbench bench {bench}")
    result = dataclasses.replace(result, machine={**result.machine, "gpu": gpu, "threads": threads})
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{bench}.json").write_text(json.dumps(result.to_json()))


def rate(median, cv=None):
    """A seq/s over 5 repeats (min 0.9x, max 1.1x), or a single figure without `cv`."""
    return Spread(median, 0.9 * median, 1.1 * median, cv, 5) if cv else Spread(median, median, median, None, 1)


def write_throughput(directory, gpu, seq_per_s, model="base", precision="bf16", batch=32, cv=None):
    """A throughput result: baseline (and full, given a second rate) at `batch`, and batch 4096 out of memory."""
    setting = dict(model=model, kind="pretraining", seq=128, precision=precision, lengths="full")
    rows = [
        Row("seq_per_s", "seq/s", dict(setting, batch=batch, variant=variant), rate(value, cv), {"mfu": value / 10000})
        for variant, value in zip(("baseline", "full"), seq_per_s)
    ]
    rows.append(Row("seq_per_s", "seq/s", dict(setting, batch=4096, variant="baseline"), None, {}, "out of memory"))
    write_bench(directory, "throughput", rows, gpu)


def test_runs_line_up_by_setting_with_the_last_over_the_first(tmp_path, capsys):
    write_throughput(tmp_path / "cpu", None, (10.0, 8.0))
    write_throughput(tmp_path / "h100", "NVIDIA H100 80GB HBM3", (2000.0, 1500.0))
    arguments = [str(tmp_path / "cpu"), str(tmp_path / "h100" / "throughput.json"), "--output_dir", str(tmp_path / "r")]
    assert bertbench_cli.main(["report", *arguments]) == 0
    report = BenchResult.read(str(tmp_path / "r" / "report.json"))  # itself a result of the schema
    section = report.context["comparisons"]["throughput: seq_per_s (seq/s)"]
    cpu, gpu = section["runs"]
    assert gpu == "h100 (NVIDIA H100 80GB HBM3)" and cpu.startswith("cpu (")
    rows = {(row.get("run"), row.get("variant"), row.get("batch")): row for row in report.rows}
    assert rows[(gpu, "full", 32)].get("vs_first_run").value == pytest.approx(187.5)
    assert rows[(cpu, "full", 32)].get("vs_first_run") is None  # the first run is the reference
    assert rows[(gpu, "baseline", 4096)].status == "out of memory"
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "| base | pretraining | 128 | bf16 | full | 32 | full | 8 | 1,500 | 187.50x |" in markdown
    assert (
        "| base | pretraining | 128 | bf16 | full | 4096 | baseline | out of memory | out of memory | – |" in markdown
    )
    assert report.bench == "report" and report.command.startswith("bertbench report ")
    assert (tmp_path / "r" / "report-throughput-pretraining-seq128-bf16.png").exists()
    assert "## throughput: seq_per_s (seq/s)" in capsys.readouterr().out
    # an H100 against this CPU is the point of the comparison, and the report says the ratio includes it
    (warning,) = section["warnings"]
    assert warning == (
        f"the compared runs are not alike: they differ in GPU ({cpu}: none, {gpu}: NVIDIA H100 80GB "
        "HBM3), so the ratios between them measure that difference too"
    )
    assert f"**Warning:** {warning}" in markdown


def test_a_report_runs_without_torch(tmp_path):
    """`bertbench report` reads results and runs no model, so it loads no torch (half of the CPU time it took, on a
    login node where compare.pbs runs it after its evaluations); its own result records the torch version from the
    package metadata and leaves out what only a loaded torch says (threads, CUDA, GPU)."""
    write_throughput(tmp_path / "cpu", None, (10.0, 8.0))
    write_throughput(tmp_path / "h100", "NVIDIA H100 80GB HBM3", (2000.0, 1500.0))
    code = "import sys\nfrom bertbench.cli import main\nstatus = main(sys.argv[1:])\n"
    code += "print('torch loaded:', 'torch' in sys.modules)\nsys.exit(status)\n"
    arguments = ["report", str(tmp_path / "cpu"), str(tmp_path / "h100"), "--output_dir", str(tmp_path / "r")]
    done = subprocess.run([sys.executable, "-c", code, *arguments], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "torch loaded: False"
    report = BenchResult.read(str(tmp_path / "r" / "report.json"))
    assert "throughput: seq_per_s (seq/s)" in report.context["comparisons"]
    assert report.versions["torch"] == torch.__version__
    assert "threads" not in report.machine and "cuda" not in report.versions


def test_a_ratio_of_noisy_figures_is_marked(tmp_path):
    write_throughput(tmp_path / "a", None, (10.0,), cv=0.05)
    write_throughput(tmp_path / "b", None, (12.0,), cv=0.3)
    assert report_command.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output_dir", str(tmp_path / "r")]) == 0
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "| 10 (9–11, CV 5.0%) | 12 (10.8–13.2, CV 30%) | 1.20x (noisy: inputs' CV 30%) |" in markdown
    assert "A ratio marked noisy is drawn from figures whose repeats vary by more than CV 20%" in markdown


def test_same_directory_names_stay_apart(tmp_path):
    write_throughput(tmp_path / "a" / "run", None, (1.0, 1.0))
    write_throughput(tmp_path / "b" / "run", None, (2.0, 2.0))
    arguments = [str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run"), "--output_dir", str(tmp_path / "r")]
    assert report_command.main(arguments) == 0
    runs = read_json(tmp_path / "r" / "report.json")["context"]["comparisons"]["throughput: seq_per_s (seq/s)"]["runs"]
    assert len(set(runs)) == 2


def test_bad_inputs_fail_in_one_line(tmp_path, error_line):
    (tmp_path / "empty").mkdir()
    assert report_command.main([str(tmp_path / "empty"), "--output_dir", str(tmp_path / "out")]) == 2
    assert error_line() == (
        f"bertbench report: error: {tmp_path / 'empty'}: holds no bench result (a <bench>.json written by "
        "bertbench bench)"
    )
    broken = tmp_path / "broken.json"
    broken.write_text('{"bench": "throughput",\n "rows": [}')
    assert report_command.main([str(broken), "--output_dir", str(tmp_path / "out")]) == 2
    assert error_line() == f"bertbench report: error: {broken}: not JSON (Expecting value at line 2, column 11)"
    assert report_command.main([str(tmp_path / "nowhere"), "--output_dir", str(tmp_path / "out")]) == 2
    assert "nowhere: no such file or directory" in error_line()
    assert not (tmp_path / "out").exists()


def test_a_report_is_not_overwritten(tmp_path, error_line):
    write_throughput(tmp_path / "run", None, (1.0, 1.0))
    arguments = [str(tmp_path / "run"), "--output_dir", str(tmp_path / "report")]
    assert report_command.main(arguments) == 0
    before = (tmp_path / "report" / "report.json").read_bytes()
    assert report_command.main(arguments) == 2
    assert error_line().endswith("report.json exists: choose another --output_dir or pass --overwrite")
    assert (tmp_path / "report" / "report.json").read_bytes() == before


def write_training_run(directory, world_size, seconds, rates, accuracy, modeling="baseline"):
    """A run directory as run_classifier leaves it: the record, train_results.json, eval_results.json and
    metrics.jsonl (two invocations: elapsed_s restarts at the resume)."""
    directory.mkdir(parents=True)
    (directory / "bertbench_run.json").write_text(
        json.dumps({"runner": "run_classifier", "args": {"task_name": "MNLI"}})
    )
    sentences = 16 * len(rates) * 10
    (directory / "train_results.json").write_text(
        json.dumps(
            {
                "global_step": 10 * len(rates),
                "sentences": sentences,
                "seconds": seconds,
                "sentences_per_second": sentences / seconds,
                "steady_sentences_per_second": max(rates),
                "world_size": world_size,
                "nodes": 1,
                "device": "cpu",
                "modeling": modeling,
                "recompute_policy": "full" if modeling == "recompute" else None,
                "precision": "fp32",
                "train_batch_size": 16 // world_size,
                "segments": [{"ended": "finished"}, {"ended": "time budget"}],
            }
        )
    )
    (directory / "eval_results.json").write_text(
        json.dumps(
            {
                "task": "MNLI",
                "global_step": 10 * len(rates),
                "dev_matched_loss": 0.5,
                "dev_matched_acc": accuracy,
                "dev_matched_examples": 32,
                "dev_mismatched_acc": accuracy - 0.01,
            }
        )
    )
    half = len(rates) // 2
    elapsed = [index + 1.0 for index in range(half)] + [index + 1.0 for index in range(len(rates) - half)]
    (directory / "metrics.jsonl").write_text(
        "".join(
            json.dumps({"step": 10 * (index + 1), "seq_per_s": rate, "elapsed_s": seconds_so_far}) + "\n"
            for index, (rate, seconds_so_far) in enumerate(zip(rates, elapsed))
        )
    )


def test_training_runs_are_put_side_by_side_with_their_spread_and_dev_metrics(tmp_path, capsys):
    baseline, recompute = tmp_path / "MNLI_baseline_gpu1", tmp_path / "MNLI_recompute-full_gpu4_nodes2"
    write_training_run(baseline, 1, 100.0, [50.0, 40.0, 44.0, 46.0, 42.0, 48.0], 0.70)
    write_training_run(recompute, 8, 130.0, [300.0, 310.0], 0.75, modeling="recompute")
    assert report_command.main([str(baseline), str(recompute), "--output_dir", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    section = report["context"]["training"]
    rows = {row["run"]: row for row in section["rows"]}
    first = rows[baseline.name]
    # the first logged window (start-up) is left out of the spread
    window = first["window_seq_per_s"]
    assert (first["windows"], window["median"], window["min"], window["max"], window["n"]) == (5, 44.0, 40.0, 48.0, 5)
    assert window["cv"] == pytest.approx(0.0718, abs=1e-4)
    assert (first["sentences"], first["processes"], first["ended"], first["dev:dev_matched_acc"]) == (
        960,
        1,
        "time budget",
        0.70,
    )
    assert rows[recompute.name]["modeling"] == "recompute (full)" and rows[recompute.name]["windows"] == 1
    assert section["warnings"] == [
        "the runs trained for different times (100–130 s): compare sentences/s, not sentences seen or accuracy"
    ]
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "| 44.0 (40.0–48.0, CV 7.2%, 5 windows) |" in markdown and "| – (1 window) |" in markdown
    assert "**Warning:** the runs trained for different times" in markdown
    assert "(8 x cpu)" in markdown
    for plot in ("training-progress", "training-accuracy"):
        assert (tmp_path / "report" / f"report-{plot}.png").exists()
    assert "## training runs" in capsys.readouterr().out


def test_training_progress_adds_up_over_invocations(tmp_path):
    write_training_run(tmp_path / "run", 1, 10.0, [5.0, 6.0, 7.0, 8.0], 0.5)
    # elapsed_s of the resumed invocation restarts at 0: the earlier one's end is added
    assert [window["seconds"] for window in report_command.logged_windows(str(tmp_path / "run"))] == [1, 2, 3, 4]


def test_a_run_directory_that_has_not_trained_is_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "bertbench_run.json").write_text(json.dumps({"runner": "run_classifier", "args": {}}))
    assert report_command.main([str(tmp_path / "run"), "--output_dir", str(tmp_path / "report")]) == 2
    assert (
        capsys.readouterr().err == f"bertbench report: error: {tmp_path / 'run'}: has not trained (no "
        "train_results.json)\n"
    )
    assert not (tmp_path / "report").exists()


# ---- every bench's results, side by side where they share settings --------------------------------------------------


def test_every_published_result_is_read():
    """docs/results/: each bench's own output (the older ones converted to the schema), the CPU suite's parts and
    suite.json among them; and the suite's directory read whole, as `bertbench report DIR` reads it."""
    found = [path for path in sorted(RESULTS.glob("**/*.json")) if "bench" in read_json(path)]  # beside them: runs'
    results = read_results([str(path) for path in found])  # files, kernels' timings
    assert len(results) == len(found) and all(result.rows for result in results)
    suite = read_results([str(RESULTS / "cpu-2core" / "suite")])
    assert sorted(result.bench for result in suite) == [
        "memory",
        "optimizer",
        "suite",
        "throughput",
        "throughput",
        "throughput",
    ]


def write_suite(directory, gpu, rates):
    """A suite's directory as `bertbench bench suite` leaves it: each part's own result in DIR/PART/KIND.json and
    suite.json listing the parts (largest-batch failed) with its headline rows."""
    write_throughput(directory / "phase1", gpu, rates, cv=0.05)
    step = Spread(100 / rates[0], 0.9 * 100 / rates[0], 1.1 * 100 / rates[0], 0.04, 5)
    columns = {"floor_ms": step.median / 2, "ratio_to_floor": Ratio.of(step, step.median / 2)}
    optimizer = Row("step_ms", "ms", {"optimizer": "adamw:fused", "rule": "adamw", "form": "fused"}, step, columns)
    write_bench(directory / "optimizer", "optimizer", [optimizer], gpu)
    parts = [
        {"name": "phase1", "bench": "throughput", "exit_status": 0, "report": "phase1/throughput.json"},
        {
            "name": "largest-batch",
            "bench": "memory",
            "exit_status": 1,
            "error": "out of memory at batch 8",
            "report": "largest-batch/memory.json",
        },
        {"name": "optimizer", "bench": "optimizer", "exit_status": 0, "report": "optimizer/optimizer.json"},
    ]
    setting = {"part": "phase1", "kind": "pretraining", "seq": 128, "batch": 32, "variant": "baseline"}
    headline = Row("seq_per_s", "seq/s", setting, rate(rates[0], 0.05), {"vs_hf": Ratio(rates[0] / 1000, 0.05)})
    write_bench(directory, "suite", [headline], gpu, context={"size": "standard", "parts": parts})


def test_a_suite_directory_is_its_parts_and_its_headlines(tmp_path):
    write_suite(tmp_path / "h100", "NVIDIA H100 80GB HBM3", (2000.0, 1500.0))
    write_suite(tmp_path / "h200", "NVIDIA H200", (3000.0, 2000.0))
    arguments = [str(tmp_path / "h100"), str(tmp_path / "h200"), "--output_dir", str(tmp_path / "r")]
    assert report_command.main(arguments) == 0
    report = BenchResult.read(str(tmp_path / "r" / "report.json"))
    comparisons = report.context["comparisons"]
    assert sorted(comparisons) == [
        "optimizer: step_ms (ms)",
        "suite: seq_per_s (seq/s)",
        "throughput: seq_per_s (seq/s)",
    ]
    h100, h200 = comparisons["throughput: seq_per_s (seq/s)"]["runs"]
    assert (h100, h200) == ("h100/phase1 (NVIDIA H100 80GB HBM3)", "h200/phase1 (NVIDIA H200)")
    full = next(row for row in report.rows if row.get("run") == h200 and row.get("variant") == "full")
    assert full.get("vs_first_run").value == pytest.approx(2000 / 1500)
    (optimizer,) = [row for row in report.rows if row.get("bench") == "optimizer" and row.get("run").startswith("h200")]
    assert optimizer.get("vs_first_run").value == pytest.approx(2000 / 3000)
    assert report.context["not_compared"] == [
        f"{name}/largest-batch failed in the suite (exit 1: out of memory at batch 8)" for name in ("h100", "h200")
    ]
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "- not compared: h100/largest-batch failed in the suite (exit 1: out of memory at batch 8)" in markdown
    # a figure with its spread keeps it
    assert "| 2,000 (1,800–2,200, CV 5.0%) | 3,000 (2,700–3,300, CV 5.0%) | 1.50x |" in markdown

    suites = [str(tmp_path / name / "suite.json") for name in ("h100", "h200")]
    assert report_command.main([*suites, "--output_dir", str(tmp_path / "headline")]) == 0
    report = BenchResult.read(str(tmp_path / "headline" / "report.json"))
    assert list(report.context["comparisons"]) == ["suite: seq_per_s (seq/s)"]
    second = report.rows[1]
    assert (second.get("part"), second.get("vs_first_run").value) == ("phase1", pytest.approx(1.5))


def test_runs_that_share_no_setting_are_shown_each_on_its_own_with_what_differs(tmp_path):
    write_throughput(tmp_path / "cpu", None, (10.0, 8.0), model="mini", precision="fp32", cv=0.05)
    write_throughput(tmp_path / "h100", "NVIDIA H100 80GB HBM3", (2000.0,), model="large")
    assert (
        report_command.main([str(tmp_path / "cpu"), str(tmp_path / "h100"), "--output_dir", str(tmp_path / "r")]) == 0
    )
    section = read_json(tmp_path / "r" / "report.json")["context"]["comparisons"]["throughput: seq_per_s (seq/s)"]
    cpu, gpu = section["runs"]
    assert section["warnings"] == [
        f"{name} shares no setting with the other runs: it measured model {mine} (the others: {theirs}) and "
        f"precision {precision} (the others: {other_precision}), so its figures are shown on their own"
        for name, mine, theirs, precision, other_precision in (
            (cpu, "mini", "large", "fp32", "bf16"),
            (gpu, "large", "mini", "bf16", "fp32"),
        )
    ]
    tables = (tmp_path / "r" / "report.md").read_text().split("## throughput")[1]
    assert f"### measured only by {cpu}" in tables and f"### measured only by {gpu}" in tables
    assert "| model | kind | seq | precision | lengths | batch | variant | seq_per_s | mfu |" in tables
    assert "| mini | pretraining | 128 | fp32 | full | 32 | full | 8 (7.2–8.8, CV 5.0%) | 0.0008 |" in tables
    assert "| large | pretraining | 128 | bf16 | full | 32 | baseline | 2,000 | 0.2 |" in tables


@pytest.mark.parametrize(
    "content, message",
    [
        ([], "not a bench result (a JSON object with 'bench', written by bertbench bench)"),
        ({"bench": "throughput", "rows": []}, "'schema' is None, not 'bertbench-bench-result/2': written by another"),
        (
            {"schema": "bertbench-bench-result/2", "bench": "optimizer", "rows": 5},
            "'rows' is not a list",
        ),
        (
            {"schema": "bertbench-bench-result/2", "bench": "throughput", "rows": [{"measured": "seq_per_s"}]},
            "rows[0].unit is missing or not a str",
        ),
    ],
)
def test_a_file_that_is_no_result_is_one_line(tmp_path, error_line, content, message):
    (tmp_path / "throughput.json").write_text(json.dumps(content))
    assert report_command.main([str(tmp_path / "throughput.json"), "--output_dir", str(tmp_path / "r")]) == 2
    assert error_line().startswith(f"bertbench report: error: {tmp_path / 'throughput.json'}: {message}")
    assert snapshot(tmp_path / "r") is None


def test_a_suite_part_listed_as_done_but_missing_is_one_line(tmp_path, error_line):
    write_suite(tmp_path / "suite", None, (10.0, 8.0))
    (tmp_path / "suite" / "optimizer" / "optimizer.json").unlink()
    assert report_command.main([str(tmp_path / "suite"), "--output_dir", str(tmp_path / "r")]) == 2
    suite = tmp_path / "suite" / "suite.json"
    assert error_line() == (
        f"bertbench report: error: {tmp_path / 'suite' / 'optimizer' / 'optimizer.json'}: missing, though {suite} "
        f"lists it as done (pass {suite} alone to compare the suite's headline figures)"
    )
    assert snapshot(tmp_path / "r") is None
