import json

import pytest

from bertbench import cli as bertbench_cli
from bertbench.bench import report as report_command
from bertbench.bench.output import BenchOutput, markdown_table


def write_throughput(directory, gpu, seq_per_s):
    rows = [{"model": "base", "kind": "pretraining", "seq": 128, "precision": "bf16", "variant": variant,
             "batch": 32, "seq_per_s": rate, "mfu": rate / 10000, "out_of_memory": False}
            for variant, rate in zip(("baseline", "full"), seq_per_s)]
    rows.append({"model": "base", "kind": "pretraining", "seq": 128, "precision": "bf16", "variant": "baseline",
                 "batch": 4096, "out_of_memory": True})
    output = BenchOutput(str(directory), "throughput", ["--model", "base"])
    output.write({"model": "base"}, {"rows": rows}, "table")
    report = json.loads((directory / "throughput.json").read_text())
    report["machine"]["gpu"] = gpu
    (directory / "throughput.json").write_text(json.dumps(report))


def test_runs_line_up_by_setting_with_the_last_over_the_first(tmp_path, capsys):
    write_throughput(tmp_path / "cpu", None, (10.0, 8.0))
    write_throughput(tmp_path / "h100", "NVIDIA H100 80GB HBM3", (2000.0, 1500.0))
    assert bertbench_cli.main(["report", str(tmp_path / "cpu"), str(tmp_path / "h100" / "throughput.json"),
                               "--output_dir", str(tmp_path / "report")]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    cpu, gpu = report["comparisons"]["throughput"]["runs"]
    assert gpu == "h100 (NVIDIA H100 80GB HBM3)" and cpu.startswith("cpu (")
    rows = {row["variant"]: row for row in report["comparisons"]["throughput"]["rows"]}
    assert set(rows) == {"baseline", "full"}  # the out-of-memory setting has no figures
    assert rows["full"][f"seq_per_s@{gpu}"] == 1500.0 and rows["full"]["seq_per_s:ratio"] == pytest.approx(187.5)
    assert rows["baseline"]["mfu:ratio"] == pytest.approx(200.0)
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "| base | pretraining | 128 | bf16 | full | 32 | 8.00 | 1,500.00 | 187.50 |" in markdown
    assert report["bench"] == "report" and report["command"].startswith("bertbench report ")
    assert (tmp_path / "report" / "report-throughput-pretraining-seq128-bf16.png").exists()
    assert "## throughput" in capsys.readouterr().out


def test_same_directory_names_stay_apart(tmp_path):
    write_throughput(tmp_path / "a" / "run", None, (1.0, 1.0))
    write_throughput(tmp_path / "b" / "run", None, (2.0, 2.0))
    assert report_command.main([str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run"), "--output_dir",
                         str(tmp_path / "report")]) == 0
    runs = json.loads((tmp_path / "report" / "report.json").read_text())["comparisons"]["throughput"]["runs"]
    assert len(set(runs)) == 2


def test_bad_inputs_fail_in_one_line(tmp_path, error_line):
    (tmp_path / "empty").mkdir()
    assert report_command.main([str(tmp_path / "empty"), "--output_dir", str(tmp_path / "out")]) == 2
    assert error_line() == (f"bertbench report: error: {tmp_path / 'empty'}: no bench results (a KIND.json written "
                            "by `bertbench bench KIND`)")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "throughput.json").write_text('{"bench": "throughput",\n "rows": [}')
    assert report_command.main([str(broken), "--output_dir", str(tmp_path / "out")]) == 2
    assert error_line() == f"bertbench report: error: {broken / 'throughput.json'}: not valid JSON (line 2: " \
                           "Expecting value)"
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
