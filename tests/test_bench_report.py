import json

import pytest

from bertbench import cli as bertbench_cli
from bertbench.bench import report as report_command
from bertbench.bench.output import BenchOutput, markdown_table


def write_throughput(directory, gpu, seq_per_s):
    rows = [
        {
            "model": "base",
            "kind": "pretraining",
            "seq": 128,
            "precision": "bf16",
            "variant": variant,
            "batch": 32,
            "seq_per_s": rate,
            "mfu": rate / 10000,
            "out_of_memory": False,
        }
        for variant, rate in zip(("baseline", "full"), seq_per_s)
    ]
    rows.append(
        {
            "model": "base",
            "kind": "pretraining",
            "seq": 128,
            "precision": "bf16",
            "variant": "baseline",
            "batch": 4096,
            "out_of_memory": True,
        }
    )
    output = BenchOutput(str(directory), "throughput", ["--model", "base"])
    output.write({"model": "base"}, {"rows": rows}, "table")
    report = json.loads((directory / "throughput.json").read_text())
    report["machine"]["gpu"] = gpu
    (directory / "throughput.json").write_text(json.dumps(report))


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
    output = BenchOutput(str(directory), "scaling", ["--model", "tiny"])
    output.write({"model": "tiny"}, {"models": [{"model": "tiny", "rows": rows}]}, "table")
    report = json.loads((directory / "scaling.json").read_text())
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
