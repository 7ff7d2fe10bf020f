import json

import pytest
import torch
from helpers import TINY_BERT
from matplotlib.figure import Figure

from bertbench.bench import cli, plan, workload
from bertbench.bench.results import BenchResult, Ratio, Row, Spread

NETWORK = plan.Network(intra_bandwidth=100e9, intra_latency=5e-6, inter_bandwidth=25e9, inter_latency=10e-6)


def test_flat_ring_by_hand():
    # 2(P-1) alpha + 2(P-1)/P B / bw with P = 4, B = 100 MB, alpha = 10 us, bw = 10 GB/s; a bucket pays alpha again.
    assert plan.ring_seconds(1e8, 4, 1e-5, 1e10) == pytest.approx(6e-5 + 0.015)
    assert plan.ring_seconds(1e8, 4, 1e-5, 1e10, buckets=3) == pytest.approx(3 * 6e-5 + 0.015)
    assert plan.ring_seconds(1e8, 1, 1e-5, 1e10) == 0.0


def test_hierarchical_allreduce_by_hand():
    # 2 nodes x 4 GPUs, 1 GB: a ring over the node's 4 GPUs, then 2(M-1)/M x B through each node's NIC.
    intra, inter = plan.allreduce_seconds(1e9, 2, 4, NETWORK)
    assert intra == pytest.approx(2 * 3 * 5e-6 + 2 * 3 / 4 * 1e9 / 100e9)
    assert inter == pytest.approx(2 * 1 * 10e-6 + 2 * 1 / 2 * 1e9 / 25e9)
    assert plan.allreduce_seconds(1e9, 1, 8, NETWORK)[1] == 0.0  # one node: no inter-node term
    assert plan.allreduce_seconds(1e9, 4, 1, NETWORK)[0] == 0.0  # one GPU per node: no intra-node term
    assert plan.allreduce_seconds(1e9, 1, 1, NETWORK) == (0.0, 0.0)


def test_bucket_count_follows_ddp_bucket_cap_in_mib():
    assert plan.bucket_count(100 * 2**20, 25) == 4
    assert plan.bucket_count(100 * 2**20 + 1, 25) == 5
    assert plan.bucket_count(100 * 2**20, 0) == 1


def predictions(overlap, nodes=(1, 2, 4, 8, 16, 32, 64, 128)):
    return [plan.predict(0.25, 32, 440e6, n, 8, NETWORK, overlap, 17, 1e9) for n in nodes]


def test_efficiency_falls_with_every_node_and_overlap_one_is_compute_bound():
    rows = predictions(0.0)
    efficiencies = [row["efficiency"] for row in rows]
    assert all(a > b for a, b in zip(efficiencies, efficiencies[1:]))
    assert 0 < efficiencies[-1] < 1
    assert all(row["efficiency"] == pytest.approx(1.0) for row in predictions(1.0))
    half = predictions(0.5)
    assert all(a["efficiency"] < b["efficiency"] < 1 for a, b in zip(rows[1:], half[1:]))


def test_prediction_row_by_hand():
    # 2 nodes x 4 GPUs, batch 32 each, a 0.5 s compute step, 1 GB of gradients in 3 buckets, a quarter overlapped:
    # latency 3 x (2 x 3 x 5 us + 2 x 1 x 10 us) = 150 us; bandwidth 1.5 x 1 GB / 100 GB/s + 1 x 1 GB / 25 GB/s
    # = 55 ms; all-reduce 55.15 ms, of which 0.75 exposed: a step of 541.3625 ms.
    row = plan.predict(0.5, 32, 1e9, 2, 4, NETWORK, 0.25, 3, 1e6)
    assert row["global_batch"] == 256 and row["gpus"] == 8
    assert row["allreduce_latency_seconds"] == pytest.approx(150e-6)
    assert row["allreduce_seconds"] == pytest.approx(0.05515)
    assert row["step_seconds"] == pytest.approx(0.5413625)
    assert row["seq_per_s"] == pytest.approx(472.8809254)  # 256 / 0.5413625
    assert row["speedup"] == pytest.approx(7.3887645)  # 8 GPUs x 0.5 / 0.5413625
    assert row["efficiency"] == pytest.approx(0.9235956)  # 0.5 / 0.5413625
    assert row["time_to_train_hours"] == pytest.approx(0.5874159)  # 1e6 sequences at 472.88 seq/s


@pytest.mark.parametrize("model", ["tiny", "base", "config_path"])
@pytest.mark.parametrize("kind", workload.STEP_KINDS)
def test_parameter_count_matches_a_built_model(model, kind, tmp_path):
    if model == "config_path":  # 64 positions, a 48-token vocab: the config's own sizes count
        model = str(tmp_path / "bert_config.json")
        (tmp_path / "bert_config.json").write_text(json.dumps(TINY_BERT))
    config = workload.bert_config(model, 32)
    with torch.device("meta"):  # shapes without memory or initialisation: BERT-base in well under a second
        built = workload.build(config, kind, workload.Variant.parse("baseline"), "meta")
    assert plan.parameter_count(config, kind) == sum(p.numel() for p in built.parameters())  # tied weight: once


def test_fit_alpha_beta_recovers_synthetic_values():
    sizes = [2**k for k in range(10, 28, 2)]
    alpha, bandwidth, processes = 50e-6, 2e9, 4
    seconds = [plan.ring_seconds(size, processes, alpha, bandwidth) for size in sizes]
    assert plan.fit_alpha_beta(sizes, seconds, processes) == (pytest.approx(alpha), pytest.approx(bandwidth))
    noisy = [t + 5e-6 * (-1) ** i for i, t in enumerate(seconds)]  # +-5 us of timer noise
    fitted_alpha, fitted_bandwidth = plan.fit_alpha_beta(sizes, noisy, processes)
    assert fitted_alpha == pytest.approx(alpha, rel=0.05) and fitted_bandwidth == pytest.approx(bandwidth, rel=0.01)
    # No latency plus noise would fit a negative alpha: it is held at 0.
    no_latency = [plan.ring_seconds(size, 2, 0.0, 1e9) + (-1e-6 if i == 0 else 0) for i, size in enumerate(sizes)]
    assert plan.fit_alpha_beta(sizes, no_latency, 2)[0] == 0.0
    with pytest.raises(workload.BenchError):
        plan.fit_alpha_beta(sizes, seconds, 1)
    with pytest.raises(workload.BenchError, match="do not grow with the size"):
        plan.fit_alpha_beta([4096, 65536], [2e-3, 2e-4], 2)  # latency-bound sizes and an outlier


def run_plan(argv):
    return plan.main([str(arg) for arg in argv])


def test_layouts_write_rows_files_and_refuse_a_second_run(tmp_path, capsys, error_line):
    out = tmp_path / "out"
    argv = ["--step_seconds", 0.3, "--batch_per_device", 32, "--layouts", "2x4,128x8", "--output_dir", out]
    assert cli.main(["plan", *map(str, argv)]) == 0
    assert "| 128 | 1024 |" in capsys.readouterr().out
    result = BenchResult.read(str(out / "plan.json"))
    assert result.settings["layouts"] == ["2x4", "128x8"]
    rows = result.rows_measuring("seq_per_s")
    assert [(row.get("nodes"), row.get("gpus_per_node"), row.get("gpus")) for row in rows] == [
        (2, 4, 8),
        (128, 8, 1024),
    ]
    assert {(row.get("model"), row.get("kind"), row.get("batch_per_device"), row.status) for row in rows} == {
        ("base", "pretraining", 32, "predicted")
    }
    # a step given as a number has no spread: the predicted ratios carry none, and are never marked noisy
    assert rows[0].get("efficiency") == Ratio(pytest.approx(0.3 / rows[0].get("step_seconds")), None)
    assert result.context["parameters"] == plan.parameter_count(workload.bert_config("base", 512), "pretraining")
    assert result.context["step_seconds"] == Spread.exact(0.3)
    for name in ("plan.md", "plan-efficiency.png", "plan-throughput.png"):
        assert (out / name).stat().st_size > 0
    before = (out / "plan.json").read_text()
    assert run_plan(argv) == 2
    assert str(out) in error_line() and (out / "plan.json").read_text() == before


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--overlap", "1.5"], "--overlap must be in [0, 1], got 1.5"),
        (["--inter_bandwidth", "-1"], "--inter_bandwidth must be positive, got -1"),
        (["--intra_bandwidth", "0"], "--intra_bandwidth must be positive, got 0"),
        (["--intra_bandwidth", "inf"], "--intra_bandwidth must be a finite number, got inf"),
        (["--layouts", "2y4"], "--layouts: '2y4' is not NODESxGPUS"),
        (["--layouts", "0x8"], "--layouts: '0x8' is not NODESxGPUS"),
        (["--nodes", "0"], "--nodes must be positive, got 0"),
        (["--variant", "full"], "--variant select a --from_throughput row"),
    ],
)
def test_bad_values_exit_2_and_write_nothing(tmp_path, error_line, flags, message):
    assert run_plan(["--step_seconds", 0.3, "--batch_per_device", 32, "--output_dir", tmp_path / "out", *flags]) == 2
    assert message in error_line() and not (tmp_path / "out").exists()


def throughput_row(step=None, **setting):
    """A measured row of `bertbench bench throughput` as it writes them."""
    values = {
        "model": "tiny",
        "kind": "pretraining",
        "seq": 128,
        "precision": "fp32",
        "lengths": "full",
        "batch": 8,
        "variant": "baseline",
    }
    values.update(setting)
    step = step or Spread.exact(0.1)
    return Row("seq_per_s", "seq/s", values, Spread.exact(values["batch"] / step.median), {"step_seconds": step})


def throughput_file(tmp_path, rows, bench="throughput"):
    path = tmp_path / f"{bench}.json"
    path.write_text(json.dumps(BenchResult.new(bench, {}, rows, {}, [], "bertbench bench throughput").to_json()))
    return path


def test_from_throughput_selects_the_row(tmp_path, capsys, error_line):
    path = throughput_file(
        tmp_path,
        [
            throughput_row(),
            throughput_row(Spread.exact(0.16), batch=16),
            throughput_row(Spread.exact(0.12), batch=16, precision="bf16"),
            Row("seq_per_s", "seq/s", {"batch": 512}, None, status="out of memory"),  # not measured: never chosen
        ],
    )
    out = tmp_path / "out"
    argv = ["--from_throughput", path, "--batch_per_device", 16, "--precision", "bf16", "--nodes", "1,2"]
    assert run_plan([*argv, "--gpus_per_node", 1, "--output_dir", out]) == 0
    result = BenchResult.read(str(out / "plan.json"))
    first = result.rows[0]
    assert (first.get("model"), first.get("batch_per_device"), result.context["step_seconds"].median) == (
        "tiny",
        16,
        0.12,
    )
    # BERT-tiny (vocab 1024, hidden 64, 2 layers, 512 positions) with its pre-training heads, counted by hand:
    # embeddings 98,560 + 2 layers x 49,984 + pooler 4,160 + MLM head 5,312 (its decoder tied) + NSP 130
    assert result.context["parameters"] == 208_130
    assert first.get("gpus") == 1 and first.median() == pytest.approx(16 / 0.12)
    assert first.median("efficiency") == 1.0
    capsys.readouterr()

    assert run_plan(["--from_throughput", path, "--batch_per_device", 16, "--output_dir", tmp_path / "two"]) == 2
    line = error_line()
    assert str(path) in line and "2 rows match" in line and "precision bf16" in line
    assert run_plan(["--from_throughput", path, "--batch_per_device", 64, "--output_dir", tmp_path / "none"]) == 2
    assert "no measured row has batch 64" in error_line()
    broken = throughput_file(tmp_path, [Row("seq_per_s", "seq/s", {"model": "tiny"}, Spread.exact(80.0))])
    assert run_plan(["--from_throughput", broken, "--output_dir", tmp_path / "broken"]) == 2
    assert f"{broken}: missing key rows[0].setting.kind" in error_line()
    other = throughput_file(tmp_path, [throughput_row()], bench="memory")
    assert run_plan(["--from_throughput", other, "--output_dir", tmp_path / "other"]) == 2
    assert "a `bertbench bench memory` result, not a `bertbench bench throughput` one" in error_line()
    assert run_plan(["--from_throughput", tmp_path / "absent.json", "--output_dir", tmp_path / "absent"]) == 2
    assert "absent.json" in error_line()
    assert not any((tmp_path / name).exists() for name in ("two", "none", "broken", "other", "absent"))


def scaling_file(tmp_path, alpha=1e-4, bandwidth=1e9, gradient_bytes=4e6, compute=0.05, efficiencies=None):
    """A scaling.json whose steps follow the flat-ring model exactly at overlap 0 (one bucket), in the rows
    `bertbench bench scaling` writes."""
    rows = []
    for processes in (1, 2, 4):
        # a ring all-reduce of P processes: 2(P-1) messages, each paying the latency and a P-th of the bytes
        step = compute + 2 * (processes - 1) * (alpha + gradient_bytes / processes / bandwidth)
        efficiency = (efficiencies or {}).get(processes, compute / step)
        rows.append(
            Row(
                "seq_per_s",
                "seq/s",
                {"model": "demo", "seq": 32, "batch_per_process": 8, "nodes": 1, "processes": processes},
                Spread.exact(8 * processes / step),
                {
                    "global_batch": 8 * processes,
                    "step_seconds": Spread.exact(step),
                    "speedup": Ratio(processes * efficiency, None),
                    "efficiency": Ratio(efficiency, None),
                },
            )
        )
    context = {"gradient_bytes": int(gradient_bytes), "latency_seconds": alpha, "bus_bandwidth_bytes_per_s": bandwidth}
    result = BenchResult.new("scaling", {}, rows, context, ["the machine was busy"] if efficiencies else [], "")
    path = tmp_path / "scaling.json"
    path.write_text(json.dumps(result.to_json()))
    return path, result.to_json()


def test_validate_predicts_a_scaling_run(tmp_path, capsys):
    path, _ = scaling_file(tmp_path)
    out = tmp_path / "out"
    argv = ["--validate", path, "--overlap", 0.5, "--bucket_mb", 0, "--step_seconds", 0.2, "--batch_per_device", 8]
    assert run_plan([*argv, "--nodes", "1,2", "--output_dir", out]) == 0
    markdown = capsys.readouterr().out
    assert "Validation against" in markdown and markdown.count("| processes |") == 1
    result = BenchResult.read(str(out / "plan.json"))
    assert len(result.rows_measuring("seq_per_s")) == 2
    validation = result.rows_measuring("step_seconds")
    assert [row.get("processes") for row in validation] == [1, 2, 4]
    for row in validation:
        assert row.get("error_pp_no_overlap") == pytest.approx(0.0, abs=1e-9)
        assert row.get("predicted_efficiency") >= row.median("measured_efficiency")
    assert validation[-1].get("error_pp") > 0.1
    assert result.context["validation"]["latency_seconds"] == 1e-4


def test_validate_alone_and_its_errors(tmp_path, error_line):
    path, report = scaling_file(tmp_path)
    assert run_plan(["--validate", path, "--output_dir", tmp_path / "out"]) == 0
    written = BenchResult.read(str(tmp_path / "out" / "plan.json"))
    assert not written.rows_measuring("seq_per_s") and len(written.rows_measuring("step_seconds")) == 3
    assert not list((tmp_path / "out").glob("*.png"))

    del report["context"]["latency_seconds"]
    path.write_text(json.dumps(report))
    assert run_plan(["--validate", path, "--output_dir", tmp_path / "missing"]) == 2
    assert f"{path}: missing key context.latency_seconds" in error_line()
    path.write_text("{not json")
    assert run_plan(["--validate", path, "--output_dir", tmp_path / "bad"]) == 2
    assert str(path) in error_line()
    assert not (tmp_path / "missing").exists() and not (tmp_path / "bad").exists()


def test_the_step_must_be_given(error_line):
    assert run_plan(["--batch_per_device", 8]) == 2
    assert "give the measured step: --step_seconds and --batch_per_device, or --from_throughput" in error_line()


def test_plots_mark_predictions_as_points_from_zero(tmp_path, monkeypatch):
    drawn = {}
    monkeypatch.setattr(
        plan,
        "line_plot",
        lambda series, xlabel, ylabel, title, **options: drawn.update({ylabel: (series, options)}) or Figure(),
    )
    assert (
        run_plan(["--step_seconds", 0.3, "--batch_per_device", 32, "--layouts", "2x4,128x8", "--output_dir", tmp_path])
        == 0
    )
    series, options = drawn["scaling efficiency"]
    # 99.x% efficiency on an axis from 0, not a 0.991-1.000 axis that makes it look like a collapse
    assert options["y_from_zero"] and not options["joined"]
    series, options = drawn["sequences/s"]
    assert not options["joined"] and options["log_y"]
    xs, ys, _ = options["reference"]  # linear scaling drawn at many GPU counts between the layouts
    assert len(xs) == 200 and (xs[0], xs[-1]) == pytest.approx((8, 1024))
    assert ys == pytest.approx(xs * 32 / 0.3)


def test_a_noisy_measured_step_and_a_superlinear_validation_are_flagged(tmp_path):
    path = throughput_file(tmp_path, [throughput_row(Spread(0.1, 0.05, 0.3, 0.6, 5))])
    assert run_plan(["--from_throughput", path, "--nodes", "1,2", "--output_dir", tmp_path / "noisy"]) == 0
    result = BenchResult.read(str(tmp_path / "noisy" / "plan.json"))
    (warning,) = result.warnings
    assert warning.startswith(
        "noisy measured step: the repeats of 1 of 1 setting(s) vary by more than CV 20% (up "
        f"to 60%, {path}: baseline fp32)"
    )
    assert result.context["step_seconds"].cv == 0.6
    # the predicted ratios carry the measured step's CV, and say so where they are printed
    assert all(row.get("efficiency").noisy and row.get("speedup").noisy for row in result.rows)
    markdown = (tmp_path / "noisy" / "plan.md").read_text()
    assert "0.1 (0.05–0.3, CV 60%) s per single-device step" in markdown
    assert "| 99.9% (noisy: inputs' CV 60%) |" in markdown and "A ratio marked noisy" in markdown

    scaling, _ = scaling_file(tmp_path, efficiencies={2: 2.537})  # a reference run slowed by another job
    assert run_plan(["--validate", scaling, "--output_dir", tmp_path / "validated"]) == 0
    carried, superlinear = BenchResult.read(str(tmp_path / "validated" / "plan.json")).warnings
    assert carried == f"{scaling} says: the machine was busy"
    assert superlinear.startswith("efficiency above 100% (253.7% at 2 processes of demo, marked (!))")
    assert "| 253.7% (!) |" in (tmp_path / "validated" / "plan.md").read_text()
