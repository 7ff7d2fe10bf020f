import json

import pytest
import torch

from bertbench import cli as bertbench_cli
from bertbench.bench import throughput

TINY = ["--model", "tiny", "--seq_lengths", "32", "--batch_sizes", "2,4", "--warmup", "1", "--steps", "2"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("throughput")
    assert throughput.main(TINY + ["--kinds", "pretraining,finetuning", "--variants", "baseline,full,every-2",
                                   "--output_dir", str(out)]) == 0
    return out, json.loads((out / "throughput.json").read_text())


def test_a_row_for_every_setting_with_consistent_figures(swept):
    _, report = swept
    rows = report["rows"]
    settings = {(row["kind"], row["variant"], row["batch"]) for row in rows}
    assert len(rows) == len(settings) == 2 * 3 * 2
    peak = report["peaks"]["fp32"]["flops_per_s"]
    assert report["peaks"]["fp32"]["source"] == "measured fp32 matmul on cpu"
    for row in rows:
        assert row["seq_per_s"] == pytest.approx(row["batch"] / row["step_seconds"])
        assert row["tokens_per_s"] == pytest.approx(row["seq_per_s"] * 32)
        assert row["mfu"] == pytest.approx(row["model_tflops_per_s"] * 1e12 / peak)
        assert row["step_seconds_min"] <= row["step_seconds"] <= row["step_seconds_max"]
        assert row["timed_steps"] == 2 and row["memory_kind"] == "process RSS"


def test_recompute_saves_fewer_bytes_and_bytes_grow_with_the_batch(swept):
    _, report = swept
    saved = {(row["kind"], row["variant"], row["batch"]): row["saved_bytes"] for row in report["rows"]}
    for kind in ("pretraining", "finetuning"):
        for batch in (2, 4):
            assert saved[kind, "full", batch] < saved[kind, "every-2", batch] < saved[kind, "baseline", batch]
        assert saved[kind, "baseline", 4] > saved[kind, "baseline", 2]


def test_json_markdown_and_plots_are_written(swept):
    out, report = swept
    assert report["bench"] == "throughput" and report["machine"]["cpu_count"] >= 1
    assert report["versions"]["torch"] == torch.__version__ and report["command"].startswith("bertbench bench thr")
    markdown = (out / "throughput.md").read_text()
    assert "| pretraining | 32 | fp32 | every-2 | 4 |" in markdown
    for name in ("pretraining-seq32-fp32", "finetuning-seq32-fp32-memory"):
        assert (out / f"throughput-{name}.png").read_bytes().startswith(PNG_SIGNATURE)


def test_results_are_never_overwritten_by_accident(swept, error_line):
    out, _ = swept
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert throughput.main(TINY + ["--output_dir", str(out)]) == 1
    assert error_line() == (f"bertbench bench throughput: error: {out / 'throughput.json'} exists: choose another "
                            "--output_dir or pass --overwrite")
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def test_overwrite_replaces_the_files(tmp_path):
    args = TINY + ["--kinds", "finetuning", "--variants", "baseline", "--batch_sizes", "2", "--no_memory",
                   "--output_dir", str(tmp_path)]
    assert throughput.main(args) == 0
    assert throughput.main(args + ["--overwrite"]) == 0
    rows = json.loads((tmp_path / "throughput.json").read_text())["rows"]
    assert len(rows) == 1 and "saved_bytes" not in rows[0]


@pytest.mark.parametrize("flags, message", [
    (["--variants", "baseline,sometimes"], "unknown variant 'sometimes'"),
    (["--precisions", "fp8"], "unknown precision 'fp8'"),
    (["--kinds", "inference"], "unknown kind 'inference'"),
    (["--model", "missing/bert_config.json"], "unknown model 'missing/bert_config.json'"),
])
def test_bad_settings_fail_in_one_line_and_write_nothing(tmp_path, error_line, flags, message):
    out = tmp_path / "out"
    assert throughput.main(TINY + flags + ["--output_dir", str(out)]) == 1
    assert message in error_line()
    assert not out.exists()


def test_the_bench_command_lists_every_kind(capsys):
    assert bertbench_cli.main(["bench"]) == 0
    usage = capsys.readouterr().out
    for kind in ("throughput", "memory", "scaling", "budget", "profile", "plan"):
        assert f"  {kind}" in usage
    assert bertbench_cli.main(["bench", "speed"]) == 2


@pytest.mark.gpu
def test_gpu_sweep_uses_the_data_sheet_peak_and_the_allocator(tmp_path):
    assert throughput.main(TINY + ["--device", "cuda", "--precisions", "bf16", "--variants", "baseline,full",
                                   "--output_dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "throughput.json").read_text())
    assert all(row["memory_kind"] == "CUDA allocated" and row["step_memory_bytes"] > 0 for row in report["rows"])
    source = report["peaks"]["bf16"]["source"]
    assert source.endswith("data sheet, bf16 dense") or source == "measured bf16 matmul on cuda"
