import json
import statistics
from pathlib import Path

import pytest
from helpers import read_json, snapshot

from bertbench import cli as bertbench_cli
from bertbench.bench import cli as bench_cli
from bertbench.bench import report as report_command
from bertbench.bench.output import BenchOutput, markdown_table

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results" / "cpu-2core"


def write_result(directory, bench, figures, gpu=None, settings=None):
    """DIR/BENCH.json as a bench writes it (BenchOutput: machine, versions, settings, the figures), on `gpu`."""
    output = BenchOutput(str(directory), bench, ["--model", "base"])
    output.write(settings or {"model": "base"}, figures, "table")
    report = read_json(directory / f"{bench}.json")
    report["machine"]["gpu"] = gpu
    (directory / f"{bench}.json").write_text(json.dumps(report))


def write_throughput(directory, gpu, seq_per_s, model="base", precision="bf16", batch=32, cv=None):
    """A throughput result: baseline (and full, given a second rate) at `batch`, an out-of-memory batch 4096; with
    `cv`, each rate is a median with its spread (min 0.9x, max 1.1x)."""
    rows = [
        {
            "model": model,
            "kind": "pretraining",
            "seq": 128,
            "precision": precision,
            "variant": variant,
            "batch": batch,
            "seq_per_s": rate,
            "mfu": rate / 10000,
            "out_of_memory": False,
            **({"seq_per_s_min": 0.9 * rate, "seq_per_s_max": 1.1 * rate, "seq_per_s_cv": cv} if cv else {}),
        }
        for variant, rate in zip(("baseline", "full"), seq_per_s)
    ]
    rows.append(
        {
            "model": model,
            "kind": "pretraining",
            "seq": 128,
            "precision": precision,
            "variant": "baseline",
            "batch": 4096,
            "out_of_memory": True,
        }
    )
    write_result(directory, "throughput", {"rows": rows}, gpu)


def test_runs_line_up_by_setting_with_the_last_over_the_first(tmp_path, capsys):
    write_throughput(tmp_path / "cpu", None, (10.0, 8.0))
    write_throughput(tmp_path / "h100", "NVIDIA H100 80GB HBM3", (2000.0, 1500.0))
    assert (
        bertbench_cli.main(
            [
                "report",
                str(tmp_path / "cpu"),
                str(tmp_path / "h100" / "throughput.json"),
                "--output_dir",
                str(tmp_path / "report"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    cpu, gpu = report["comparisons"]["throughput"]["runs"]
    assert gpu == "h100 (NVIDIA H100 80GB HBM3)" and cpu.startswith("cpu (")
    rows = {row["variant"]: row for row in report["comparisons"]["throughput"]["rows"]}
    assert set(rows) == {"baseline", "full"}  # the out-of-memory setting has no figures
    assert rows["full"][f"seq_per_s@{gpu}"] == 1500.0 and rows["full"]["seq_per_s:ratio"] == pytest.approx(187.5)
    assert rows["baseline"]["mfu:ratio"] == pytest.approx(200.0)
    markdown = (tmp_path / "report" / "report.md").read_text()
    # rows written before --lengths existed line up as full-length ones
    assert "| base | pretraining | 128 | full | bf16 | full | 32 | 8.00 | 1,500.00 | 187.50 |" in markdown
    assert report["bench"] == "report" and report["command"].startswith("bertbench report ")
    assert (tmp_path / "report" / "report-throughput-pretraining-seq128-bf16.png").exists()
    assert "## throughput" in capsys.readouterr().out
    # an H100 against this CPU is the point of the comparison, and the report says the ratio includes it
    (warning,) = report["comparisons"]["throughput"]["warnings"]
    assert warning == (
        f"the compared runs are not alike: they differ in GPU ({cpu}: none, {gpu}: NVIDIA H100 80GB "
        "HBM3), so the ratios between them measure that difference too"
    )
    assert f"**Warning:** {warning}" in markdown


def write_scaling(directory, efficiencies, cv=None, threads=2):
    rows = [
        {
            "processes": processes,
            "nodes": 1,
            "seq_per_s": 10.0 * processes * efficiency,
            "seq_per_s_min": 9.0 * processes * efficiency,
            "seq_per_s_max": 11.0 * processes * efficiency,
            "seq_per_s_cv": cv,
            "efficiency": efficiency,
        }
        for processes, efficiency in zip((1, 2, 4), efficiencies)
    ]
    write_result(directory, "scaling", {"models": [{"model": "tiny", "rows": rows}]})
    report = read_json(directory / "scaling.json")
    report["machine"]["threads"] = threads
    (directory / "scaling.json").write_text(json.dumps(report))


def test_superlinear_efficiency_noise_and_other_threads_are_flagged(tmp_path):
    write_scaling(tmp_path / "a", (1.0, 0.9, 0.8), cv=0.05)
    write_scaling(tmp_path / "b", (1.0, 2.537, 0.9), cv=0.3, threads=1)
    assert (
        report_command.main([str(tmp_path / "a"), str(tmp_path / "b"), "--output_dir", str(tmp_path / "report")]) == 0
    )
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "| 253.7% (!) |" in markdown and "| 90.0% |" in markdown
    assert "| 50.74 (45.67–55.81, CV 30%) |" in markdown  # seq/s with its spread
    warnings = json.loads((tmp_path / "report" / "report.json").read_text())["comparisons"]["scaling"]["warnings"]
    assert len(warnings) == 3
    assert warnings[0].startswith("the compared runs are not alike: they differ in CPU threads (a (")
    assert warnings[1].startswith("efficiency above 100% (253.7% at b (")
    assert warnings[2].startswith("noisy seq_per_s of b (")


def test_same_directory_names_stay_apart(tmp_path):
    write_throughput(tmp_path / "a" / "run", None, (1.0, 1.0))
    write_throughput(tmp_path / "b" / "run", None, (2.0, 2.0))
    assert (
        report_command.main(
            [str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run"), "--output_dir", str(tmp_path / "report")]
        )
        == 0
    )
    runs = json.loads((tmp_path / "report" / "report.json").read_text())["comparisons"]["throughput"]["runs"]
    assert len(set(runs)) == 2


def test_bad_inputs_fail_in_one_line(tmp_path, error_line):
    (tmp_path / "empty").mkdir()
    assert report_command.main([str(tmp_path / "empty"), "--output_dir", str(tmp_path / "out")]) == 2
    assert error_line() == (
        f"bertbench report: error: {tmp_path / 'empty'}: no bench results (a KIND.json written "
        "by `bertbench bench KIND`) and no training run (bertbench_run.json)"
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "throughput.json").write_text('{"bench": "throughput",\n "rows": [}')
    assert report_command.main([str(broken), "--output_dir", str(tmp_path / "out")]) == 2
    assert (
        error_line() == f"bertbench report: error: {broken / 'throughput.json'}: not valid JSON (line 2: "
        "Expecting value)"
    )
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


def test_markdown_table_marks_missing_values():
    table = markdown_table([{"a": 1.234, "b": None}, {"a": 2.0}], [("A", "a", ".1f"), ("B", "b", "d")])
    assert table.splitlines() == ["| A | B |", "|---|---|", "| 1.2 | – |", "| 2.0 | – |"]


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
    section = report["comparisons"]["training"]
    rows = {row["run"]: row for row in section["rows"]}
    first = rows[baseline.name]
    # the first logged window (start-up) is left out of the spread
    assert (
        first["windows"],
        first["window_seq_per_s"],
        first["window_seq_per_s_min"],
        first["window_seq_per_s_max"],
    ) == (5, 44.0, 40.0, 48.0)
    assert first["window_seq_per_s_cv"] == pytest.approx(0.0718, abs=1e-4)
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


def test_the_report_reads_every_bench():
    assert set(report_command.KINDS) == set(bench_cli.BENCHES)


def test_every_published_result_is_read(tmp_path):
    """docs/results/: each bench's own output as it wrote it (some before later fields existed), every bench's kind
    among them, a suite's directory with its parts, and the suite's suite.json on its own."""
    directories = sorted({path.parent for path in RESULTS.glob("*/*.json") if path.stem in bench_cli.BENCHES})
    arguments = [*map(str, directories), str(RESULTS / "suite" / "suite.json"), "--output_dir", str(tmp_path / "r")]
    assert report_command.main(arguments) == 0
    comparisons = read_json(tmp_path / "r" / "report.json")["comparisons"]
    assert {title.split(":")[0] for title in comparisons} == set(bench_cli.BENCHES)


def suite_part(name, bench, status=0, error=None):
    return {
        "name": name,
        "bench": bench,
        "command": f"bertbench bench {bench} --output_dir suite/{name}",
        "exit_status": status,
        "report": f"{name}/{bench}.json",
        **({"error": error} if error else {}),
    }


def write_suite(directory, gpu, rates):
    """A suite's directory as `bertbench bench suite` leaves it: each part's own result in DIR/PART/KIND.json and
    suite.json listing the parts (largest-batch failed) with the headline figures read from them."""
    write_throughput(directory / "phase1", gpu, rates, cv=0.05)
    optimizer_rows = [{"optimizer": "adamw:fused", "step_ms": 100 / rates[0], "ratio_to_floor": 2.0}]
    write_result(directory / "optimizer", "optimizer", {"rows": optimizer_rows}, gpu, {"model": "base"})
    parts = [
        suite_part("phase1", "throughput"),
        suite_part("largest-batch", "memory", 1, "out of memory at batch 8"),
        suite_part("optimizer", "optimizer"),
    ]
    pretraining = [{"part": "phase1", "seq": 128, "batch": 32, "seq_per_s": rates[0], "vs_hf": rates[0] / 5}]
    summary = {"pretraining": pretraining, "optimizer": optimizer_rows}
    write_result(directory, "suite", {"size": "standard", "parts": parts, "summary": summary}, gpu)


def test_a_suite_directory_is_its_parts_and_its_suite_json_its_headline_figures(tmp_path):
    write_suite(tmp_path / "h100", "NVIDIA H100 80GB HBM3", (2000.0, 1500.0))
    write_suite(tmp_path / "h200", "NVIDIA H200", (3000.0, 2000.0))
    assert (
        report_command.main([str(tmp_path / "h100"), str(tmp_path / "h200"), "--output_dir", str(tmp_path / "r")]) == 0
    )
    report = read_json(tmp_path / "r" / "report.json")
    assert sorted(report["comparisons"]) == ["optimizer", "throughput"]
    h100, h200 = report["comparisons"]["throughput"]["runs"]
    assert (h100, h200) == ("h100/phase1 (NVIDIA H100 80GB HBM3)", "h200/phase1 (NVIDIA H200)")
    rows = {row["variant"]: row for row in report["comparisons"]["throughput"]["rows"]}
    assert rows["full"]["seq_per_s:ratio"] == pytest.approx(2000 / 1500)
    (optimizer,) = report["comparisons"]["optimizer"]["rows"]
    assert optimizer["step_ms:ratio"] == pytest.approx(2000 / 3000)
    assert report["not_compared"] == [
        f"{name}/largest-batch failed in the suite (exit 1: out of memory at batch 8)" for name in ("h100", "h200")
    ]
    markdown = (tmp_path / "r" / "report.md").read_text()
    assert "- not compared: h100/largest-batch failed in the suite (exit 1: out of memory at batch 8)" in markdown
    # a figure with its spread keeps it
    assert "| 2,000.00 (1,800.00–2,200.00, CV 5.0%) | 3,000.00 (2,700.00–3,300.00, CV 5.0%) | 1.50 |" in markdown

    suites = [str(tmp_path / name / "suite.json") for name in ("h100", "h200")]
    assert report_command.main([*suites, "--output_dir", str(tmp_path / "headline")]) == 0
    comparisons = read_json(tmp_path / "headline" / "report.json")["comparisons"]
    assert sorted(comparisons) == ["suite: optimizer", "suite: pre-training"]
    (row,) = comparisons["suite: pre-training"]["rows"]
    assert (row["size"], row["part"], row["vs_hf:ratio"]) == ("standard", "phase1", pytest.approx(1.5))


def test_optimizer_results_line_up_by_model_and_rule(tmp_path):
    """Two real runs of `bertbench bench optimizer` on the tiny model."""
    runs = [tmp_path / "first", tmp_path / "second"]
    for run in runs:
        flags = ["--model", "tiny", "--optimizers", "adamw,lamb:eager", "--warmup", "0", "--steps", "2"]
        assert bench_cli.main(["optimizer", *flags, "--device", "cpu", "--output_dir", str(run)]) == 0
    assert report_command.main([*map(str, runs), "--output_dir", str(tmp_path / "r")]) == 0
    section = read_json(tmp_path / "r" / "report.json")["comparisons"]["optimizer"]
    first, second = section["runs"]
    rows = {row["optimizer"]: row for row in section["rows"]}
    assert sorted(rows) == ["adamw:eager", "adamw:fused", "lamb:eager"]
    for name, row in rows.items():
        measured = [read_json(run / "optimizer.json")["rows"] for run in runs]
        step_ms = [next(line["step_ms"] for line in lines if line["optimizer"] == name) for lines in measured]
        assert (row["model"], row["measured_by"]) == ("tiny", [first, second])
        assert (row[f"step_ms@{first}"], row[f"step_ms@{second}"]) == tuple(step_ms)
        assert row["step_ms:ratio"] == pytest.approx(step_ms[1] / step_ms[0])
    assert "| tiny | lamb:eager | " in (tmp_path / "r" / "report.md").read_text()


def test_runs_that_share_no_setting_are_shown_each_on_its_own_with_what_differs(tmp_path):
    write_throughput(tmp_path / "cpu", None, (10.0, 8.0), model="mini", precision="fp32", cv=0.05)
    write_throughput(tmp_path / "h100", "NVIDIA H100 80GB HBM3", (2000.0,), model="large")
    assert (
        report_command.main([str(tmp_path / "cpu"), str(tmp_path / "h100"), "--output_dir", str(tmp_path / "r")]) == 0
    )
    section = read_json(tmp_path / "r" / "report.json")["comparisons"]["throughput"]
    cpu, gpu = section["runs"]
    assert section["warnings"][0] == (
        f"the runs share no setting: they differ in model ({cpu}: mini; {gpu}: large); precision ({cpu}: fp32; "
        f"{gpu}: bf16), so each run's figures are shown on their own"
    )
    assert [row["measured_by"] for row in section["rows"]] == [[cpu], [cpu], [gpu]]
    markdown = (tmp_path / "r" / "report.md").read_text()
    tables = markdown.split("## throughput")[1]
    assert f"### measured only by {cpu}" in tables and f"### measured only by {gpu}" in tables
    assert "| model | kind | seq | lengths | precision | variant | batch | seq/s | MFU |" in tables
    assert "| mini | pretraining | 128 | full | fp32 | full | 32 | 8.00 (7.20–8.80, CV 5.0%) | 0.1% |" in tables
    assert "| large | pretraining | 128 | full | bf16 | baseline | 32 | 2,000.00 | 20.0% |" in tables
    assert "| – |" not in tables and len(section["warnings"]) == 1  # no cell without a figure, no ratio to qualify


def test_settings_one_run_measured_are_its_own_table(tmp_path):
    write_throughput(tmp_path / "old", None, (10.0, 8.0))
    write_throughput(tmp_path / "new", None, (20.0,))
    write_throughput(tmp_path / "other", None, (5.0,), model="large")
    arguments = [str(tmp_path / name) for name in ("old", "new", "other")]
    assert report_command.main([*arguments, "--output_dir", str(tmp_path / "r")]) == 0
    section = read_json(tmp_path / "r" / "report.json")["comparisons"]["throughput"]
    old, new, other = section["runs"]
    assert {row["variant"]: row["measured_by"] for row in section["rows"] if row["model"] == "base"} == {
        "baseline": [old, new],
        "full": [old],
    }
    assert section["warnings"][0] == (
        f"{other} shares no setting with the other runs: it measured model large (the others: base), so its "
        "figures are shown on their own"
    )
    tables = (tmp_path / "r" / "report.md").read_text().split("## throughput")[1]
    assert tables.index(f"### measured by {old} and {new}") < tables.index(f"### measured only by {old}")
    assert "| base | pretraining | 128 | full | bf16 | baseline | 32 | 10.00 | 20.00 | 2.00 |" in tables
    assert "| base | pretraining | 128 | full | bf16 | full | 32 | 8.00 | 0.1% |" in tables
    assert "| – |" not in tables


def test_fine_tuning_rounds_keep_their_spread_in_either_form(tmp_path):
    """finetuning.json's figures are medians over rounds, with KEY_min, KEY_max, KEY_cv beside them; results
    written before those fields held {median, min, max}, and the rounds."""
    rounds = [{"steady_seq_per_s": rate, "dev_acc": 0.5} for rate in (300.0, 330.0, 360.0)]
    cv = statistics.stdev([300.0, 330.0, 360.0]) / 330.0
    spread = {"steady_seq_per_s": 330.0, "steady_seq_per_s_min": 300.0, "steady_seq_per_s_max": 360.0}
    flat = {"variant": "baseline", "runs": rounds, **spread, "steady_seq_per_s_cv": cv, "dev_acc": 0.5}
    old = {"variant": "baseline", "runs": rounds, "steady_seq_per_s": {"median": 330.0, "min": 300.0, "max": 360.0}}
    for name, row in (("now", flat), ("before", old)):
        write_result(tmp_path / name, "finetuning", {"task": "glue", "rows": [row]}, settings={"model": "tiny"})
    arguments = [str(tmp_path / "before"), str(tmp_path / "now"), "--output_dir", str(tmp_path / "r")]
    assert report_command.main(arguments) == 0
    (row,) = read_json(tmp_path / "r" / "report.json")["comparisons"]["finetuning"]["rows"]
    assert (row["task"], row["model"], row["variant"], row["steady_seq_per_s:ratio"]) == ("glue", "tiny", "baseline", 1)
    assert (
        "| 330.0 (300.0–360.0, CV 9.1%) | 330.0 (300.0–360.0, CV 9.1%) | 1.00 |"
        in (tmp_path / "r" / "report.md").read_text()
    )


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("throughput.json", [], 'not a bench result (no "bench" field, as a KIND.json of `bertbench bench KIND` has)'),
        ("memory.json", {"bench": "report"}, "\"bench\": 'report' is no bench the report reads (suite, throughput, "),
        ("optimizer.json", {"bench": "optimizer", "rows": 5}, "not a result of `bertbench bench optimizer` as this"),
        (
            "throughput.json",
            {"bench": "throughput", "rows": [{"model": "base", "seq_per_s": "fast"}]},
            "not a result of `bertbench bench throughput` as this version writes it (seq_per_s is 'fast')",
        ),
        (
            "plan.json",
            {"bench": "plan", "settings": {"model": ["base"]}, "rows": [{"nodes": 1}]},
            "not a result of `bertbench bench plan` as this version writes it (model is ['base'])",
        ),
    ],
)
def test_a_file_that_is_no_result_the_report_reads_is_one_line(tmp_path, error_line, name, content, message):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / name).write_text(json.dumps(content))
    for given in (tmp_path / "run", tmp_path / "run" / name):
        assert report_command.main([str(given), "--output_dir", str(tmp_path / "r")]) == 2
        assert error_line().startswith(f"bertbench report: error: {tmp_path / 'run' / name}: {message}")
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
