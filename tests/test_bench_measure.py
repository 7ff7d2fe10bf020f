import importlib.util
import json
import pathlib

import pytest
import torch

from bertbench.bench import measure

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_count_flops_counts_a_matmul_exactly():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert measure.count_flops(lambda: a @ b) == 2 * 8 * 16 * 4


def test_matmul_peak_is_positive_and_finite():
    flops = measure.matmul_flops_per_second(size=128, repeats=2)
    assert 1e6 < flops < 1e16


def test_time_steps_interleaves_flipping_the_order():
    calls = []
    times = measure.time_steps({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, warmup=1, repeats=3)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b"]
    assert {name: len(values) for name, values in times.items()} == {"a": 3, "b": 3}


def test_foundation_benchmark_runs_on_a_tiny_model(tmp_path, capsys):
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("foundation", ROOT / "benchmarks" / "foundation.py")
    foundation = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(foundation)
    output = tmp_path / "figures.json"
    assert foundation.main(["--layers", "2", "--hidden", "64", "--batch", "2", "--seq", "16", "--long-seq", "32",
                            "--warmup", "1", "--repeats", "1", "--output", str(output)]) == 0
    report = json.loads(output.read_text())
    assert len(report["vs_hf"]["rows"]) == 2 and report["vs_hf"]["flops_per_step"] > 0
    rows = {row["model"]: row for row in report["recompute"]["rows"]}
    assert rows["baseline"]["bytes_vs_baseline"] == 1.0
    assert rows["recompute/full"]["bytes_vs_baseline"] < rows["recompute/every-k"]["bytes_vs_baseline"] < 1.0
    assert "of matmul peak" in capsys.readouterr().out
