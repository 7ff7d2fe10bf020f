"""The benches' shared design: settings parsed once from typed dataclasses, and the one result schema."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bertbench.bench import results, settings
from bertbench.bench.report import ReportSettings
from bertbench.bench.results import BenchResult, Column, Ratio, Row, Spread
from bertbench.common.errors import UsageError
from bertbench.common.flags import setting


@dataclasses.dataclass(frozen=True)
class ExampleSettings(settings.MeasuredSettings):
    """What the example bench measures."""

    bench = "example"
    batch_sizes: tuple[int, ...] = setting("Batch sizes.", (8, 32), positive=True)
    model: str = settings.model_setting("tiny")


def test_settings_parse_once_with_every_error_in_one_line(tmp_path, capsys):
    parsed = settings.parse(ExampleSettings, ["--batch-sizes=4,16", "--output_dir", str(tmp_path)], "example")
    assert parsed.batch_sizes == (4, 16) and parsed.steps == 5 and parsed.directory == str(tmp_path)
    assert settings.parse(ExampleSettings, settings.as_argv(parsed), "example") == parsed
    assert settings.as_dict(parsed)["batch_sizes"] == [4, 16]
    assert settings.parse(ExampleSettings, [], "example").directory.startswith("bench_results/example-")
    with pytest.raises(SystemExit) as stop:
        settings.parse(ExampleSettings, ["--batch_sizes=4,x", "--stepz=3"], "example")
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "--stepz=3 (did you mean --steps?)" in error
    assert "--batch_sizes: expected comma-separated integers, got '4,x'" in error
    with pytest.raises(UsageError, match=r"--batch_sizes must be positive, got 4,0"):
        settings.parse(ExampleSettings, ["--batch_sizes=4,0"], "example")
    with pytest.raises(UsageError, match=r"--warmup must be 0 or more, got -1"):
        settings.parse(ExampleSettings, ["--warmup=-1"], "example")


def test_a_result_reads_back_as_written(tmp_path):
    rows = [
        Row(
            "sequences_per_second",
            "seq/s",
            {"variant": "baseline", "batch": 8},
            Spread.of_rate(8, [0.5, 0.4, 0.6]),
            {"step_ms": Spread.of([500, 400, 600]), "vs_hf": Ratio(1.5, 0.3), "note": "x"},
        ),
        Row("sequences_per_second", "seq/s", {"variant": "hf", "batch": 8}, None, status="out of memory"),
    ]
    result = BenchResult.new("example", {"steps": 3}, rows, {"device": "cpu"}, ["busy"], "bertbench bench example")
    path = tmp_path / "example.json"
    path.write_text(json.dumps(result.to_json()))
    read = BenchResult.read(str(path))
    assert read.rows == result.rows and read.context == {"device": "cpu"} and read.warnings == ("busy",)
    assert read.rows[0].median() == pytest.approx(16.0) and read.rows[0].median("vs_hf") == 1.5
    assert [row.bench for row in results.read_results([str(tmp_path)])] == ["example"]
    text = results.table(read.rows, [Column("variant", "variant", "s"), Column("seq/s", "sequences_per_second", ".1f")])
    assert "| baseline | 16.0 (13.3–20.0, CV 20%) |" in text and "| hf | out of memory |" in text


def test_a_noisy_ratio_is_marked():
    quiet, noisy = Spread.of([1.0, 1.01, 0.99]), Spread.of([0.71, 4.62, 1.0])
    assert Ratio.of(quiet, quiet).text() == "1.00x"
    assert Ratio.of(noisy, quiet).noisy and "noisy: inputs' CV" in Ratio.of(quiet, noisy).text()


@pytest.mark.parametrize(
    "content, message",
    [
        ("[1, 2]", "not a bench result"),
        ('{"bench": "x", "rows": []}', "'schema' is None"),
        ('{"bench": "x", "schema": "bertbench-bench-result/2", "rows": [{"measured": "a"}]}', r"rows\[0\]\.unit"),
        ("{", "not JSON"),
    ],
)
def test_anything_else_is_refused_naming_the_file(tmp_path, content, message):
    path = tmp_path / "x.json"
    path.write_text(content)
    with pytest.raises(UsageError, match=rf"{path}: .*{message}"):
        BenchResult.read(str(path))


def test_a_positional_setting_is_the_commands_arguments(tmp_path, capsys):
    parsed = settings.parse(ReportSettings, ["a", "b", "--output_dir", str(tmp_path)], "report")
    assert parsed.runs == ("a", "b") and settings.as_argv(parsed) == [f"--output_dir={tmp_path}", "a", "b"]
    assert settings.parse(ReportSettings, settings.as_argv(parsed), "report") == parsed
    with pytest.raises(SystemExit):
        settings.parse(ReportSettings, ["--output_dir", str(tmp_path)], "report")
    assert "bertbench report: error: the following arguments are required: DIR" in capsys.readouterr().err


def test_a_directory_passes_over_a_runners_files_and_refuses_a_damaged_one(tmp_path):
    result = BenchResult.new("example", {}, [Row("x", "s", {}, Spread.exact(1.0))], {}, [], "bertbench bench example")
    (tmp_path / "example.json").write_text(json.dumps(result.to_json()))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_results.json").write_text('{"global_step": 4}')  # a runner's, beside the result
    assert [read.bench for read in results.read_results([str(tmp_path)])] == ["example"]
    (tmp_path / "run" / "eval_results.json").write_text('{"acc": 0.')
    with pytest.raises(UsageError, match=r"eval_results.json: not JSON"):
        results.read_results([str(tmp_path)])
