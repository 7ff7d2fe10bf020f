import json

import pytest
import torch
from helpers import TINY_BERT

from bertbench.bench import measure, output, plan, plots, settings, workload
from bertbench.common import noise
from bertbench.model import flops
from bertbench.tasks import synthetic
from bertbench.training import devices


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


# ---- model FLOPs, peaks and the bench workload ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", workload.STEP_KINDS)
def test_analytic_flops_equal_what_pytorch_counts(kind):
    config = workload.bert_config("tiny", 64)
    model = workload.build(config, kind, workload.Variant.parse("baseline"))
    batch = synthetic.synthetic_batch(config, kind, 3, 48)
    masked = synthetic.masked_positions(48) if kind == "pretraining" else 0
    with torch.no_grad():
        counted_forward = measure.count_flops(lambda: model(**batch))
    counted_training = measure.count_flops(lambda: model(**batch).loss.backward())
    assert counted_forward == 3 * flops.forward_flops(config, kind, 48, masked)
    assert counted_training == 3 * flops.train_flops(config, kind, 48, masked)


@pytest.mark.parametrize("kind", workload.STEP_KINDS)
def test_a_training_batch_counts_each_sequence_at_its_real_length_as_the_benches_do(kind):
    """The training loop's count of a batch (its model TFLOP/s and MFU) is the bench's: each sequence at its length,
    pre-training's MLM head on its real predictions."""
    config = workload.bert_config("tiny", 64)
    lengths = [48, 30, 30, 12, 7]
    batch = synthetic.synthetic_batch(config, kind, len(lengths), 48, lengths=lengths)
    assert flops.batch_train_flops(config, batch) == sum(
        flops.train_flops(config, kind, length, synthetic.masked_positions(length) if kind == "pretraining" else 0)
        for length in lengths
    )


def test_full_recompute_redoes_exactly_the_encoder_forward():
    config = workload.bert_config("tiny", 32)
    batch = synthetic.synthetic_batch(config, "finetuning", 2, 32)
    counted = {}
    for name in ("baseline", "full"):
        model = workload.build(config, "finetuning", workload.Variant.parse(name))
        counted[name] = measure.count_flops(lambda: model(**batch).loss.backward())
    assert counted["full"] - counted["baseline"] == 2 * flops.encoder_forward_flops(config, 32)


@pytest.mark.parametrize(
    "name, precision, tflops",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.0),
        ("NVIDIA H200", "fp32", 66.9),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A10", "fp16", 125.0),
        ("NVIDIA L40S", "bf16", 362.1),
        ("NVIDIA L4", "fp32", 30.3),
        ("Tesla V100-SXM2-32GB", "bf16", None),
        ("Some Future GPU", "bf16", None),
    ],
)
def test_gpu_peaks_match_the_longest_name(name, precision, tflops):
    peak = devices.gpu_peak_flops(name, precision)
    assert peak == (None if tflops is None else pytest.approx(tflops * 1e12))


def test_cpu_peak_is_the_measured_matmul():
    assert devices.peak_flops(torch.device("cpu"), "fp32", 1.5e11) == (1.5e11, "measured fp32 matmul on cpu")
    with pytest.raises(ValueError):
        devices.peak_flops(torch.device("cpu"), "fp32")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("baseline", ("baseline", "full", 2)),
        ("full", ("recompute", "full", 2)),
        ("selective", ("recompute", "selective", 2)),
        ("every-3", ("recompute", "every-k", 3)),
    ],
)
def test_variant_names(text, expected):
    variant = workload.Variant.parse(text)
    assert (variant.modeling, variant.policy, variant.every_k) == expected and variant.name == text


@pytest.mark.parametrize("text", ["every-0", "every-k", "checkpoint", ""])
def test_unknown_variants_are_refused(text):
    with pytest.raises(workload.BenchError, match="unknown variant"):
        workload.Variant.parse(text)


def test_the_hf_contender_is_a_variant_only_where_a_bench_takes_it():
    assert workload.Variant.parse("hf", hf=True).modeling == "hf"
    with pytest.raises(workload.BenchError, match="variant hf is HF transformers' model"):
        workload.Variant.parse("hf")


def test_pretraining_batches_mask_as_nvidia_phase_1_and_2_data():
    assert synthetic.masked_positions(128) == 20 and synthetic.masked_positions(512) == 80
    config = workload.bert_config("tiny", 128)
    batch = synthetic.synthetic_batch(config, "pretraining", 4, 128)
    assert batch["masked_lm_positions"].shape == (4, 20)
    assert all(len(set(row.tolist())) == 20 for row in batch["masked_lm_positions"])  # distinct positions


def test_bert_config_by_name_or_file(tmp_path):
    assert workload.bert_config("base", 128).hidden_size == 768
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps({**TINY_BERT}))
    assert workload.bert_config(str(path), 64).hidden_size == TINY_BERT["hidden_size"]
    with pytest.raises(workload.BenchError, match="shorter than sequence length 128"):
        workload.bert_config(str(path), 128)
    with pytest.raises(workload.BenchError, match="unknown model 'huge'"):
        workload.bert_config("huge", 128)


def test_peak_memory_restarts_per_setting():
    devices.reset_peak_memory("cpu")
    before = devices.peak_memory_bytes("cpu")
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    during = devices.peak_memory_bytes("cpu")
    del block
    devices.reset_peak_memory("cpu")
    assert during - before >= 60 * 2**20
    assert devices.peak_memory_bytes("cpu") < during


# ---- the spread of repeats, warnings, plots ------------------------------------------------------------------------


def test_spread_of_repeats_and_of_a_rate():
    measured = noise.Spread.of([0.2, 0.1, 0.4])
    assert (measured.median, measured.min, measured.max, measured.n) == (0.2, 0.1, 0.4, 3)
    assert measured.cv == pytest.approx(0.1528 / 0.2333, abs=1e-3)  # sample stdev over the mean
    assert noise.Spread.of([0.3]).cv is None  # one measurement has no spread
    # A rate's median is of the median time, so that seq/s = batch / step holds for an even count too (the median
    # of the rates 8/2 and 8/3 would be 3.33); its range comes from the slowest and fastest time.
    rate = noise.Spread.of_rate(8, [2.0, 1.0, 4.0, 3.0])
    assert (rate.median, rate.min, rate.max) == (3.2, 2.0, 8.0)
    assert measured.flat("step") == {"step": 0.2, "step_min": 0.1, "step_max": 0.4, "step_cv": measured.cv}
    assert measured.scaled(1000) == noise.Spread(200.0, 100.0, 400.0, measured.cv, 3)


def test_a_spread_cell_gives_median_range_and_cv():
    assert noise.Spread(0.13, 0.021, 0.209, 0.41, 5).text(".3f") == "0.130 (0.021–0.209, CV 41%)"
    assert noise.Spread(0.13, 0.021, 0.209, 0.034, 5).text(".3f") == "0.130 (0.021–0.209, CV 3.4%)"
    assert noise.Spread.exact(2.5).text(".1f") == "2.5"


def test_the_load_average_against_the_cores(monkeypatch):
    monkeypatch.setattr(noise.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    for before, after, busy in ((0.5, 3.9, False), (4.2, 1.0, True), (1.0, 6.5, True)):
        loads = iter([(before, 0, 0), (after, 0, 0)])
        monkeypatch.setattr(noise.os, "getloadavg", lambda: next(loads))
        warning = noise.LoadWatch().busy("the sweep")
        assert (warning is not None) == busy
        if busy:
            assert warning.startswith(
                f"the machine was busy: the 1-minute load average was {before:.2f} before the "
                f"sweep and {after:.2f} after it, above the 4 core(s) available"
            )


def test_noisy_mismatched_and_superlinear_warnings():
    rows = [
        {"name": "a", "t": 1.0, "t_cv": 0.05, "threads": 1, "device": "cpu", "efficiency": 1.0},
        {"name": "b", "t": 1.0, "t_cv": noise.BUSY_CV + 0.01, "threads": 2, "device": "cpu", "efficiency": 2.537},
    ]
    measured = [(row["name"], noise.Spread(row["t"], 0.9, 1.1, row["t_cv"], 3)) for row in rows]
    assert noise.noisy_warning(measured[:1]) is None and noise.noisy_warning([("c", None)]) is None
    assert f"(up to {noise.BUSY_CV + 0.01:.0%}, b)" in noise.noisy_warning(measured)
    mismatch = output.mismatch_warning(rows, {"threads": "threads per process", "device": "device"}, "name")
    assert "differ in threads per process (a: 1, b: 2)" in mismatch and "device" not in mismatch.split("differ")[1]
    assert output.mismatch_warning([rows[0], {**rows[1], "threads": None}], {"threads": "threads"}, "name") is None
    texts = [plan.efficiency_text(noise.Ratio(row["efficiency"], None)) for row in rows]
    assert texts == ["100.0%", "253.7% (!)"]
    assert plan.efficiency_text(noise.Ratio(1 + 1e-12, None)) == "100.0%"  # float noise is not superlinear
    assert plan.efficiency_text(noise.Ratio(0.5, 0.3)) == "50.0% (noisy: inputs' CV 30%)"
    assert output.superlinear_warning(rows, "efficiency", lambda row: row["name"]).startswith(
        "efficiency above 100% (253.7% at b, marked (!)): superlinear figures usually mean the runs are not comparable"
    )


def test_warnings_are_printed_and_written_to_json_and_markdown(tmp_path, capsys):
    out = output.BenchOutput(str(tmp_path), "throughput", [])
    out.warn(None)
    out.warn("the machine was busy")
    out.warn("the machine was busy")  # once
    result = out.write_result(
        settings.parse(settings.MeasuredSettings, ["--output_dir", str(tmp_path)], "test"),
        [],
        {},
        "# Title\n\n| a |\n|---|",
    )
    assert capsys.readouterr().out == "warning: the machine was busy\n"
    assert json.loads((tmp_path / "throughput.json").read_text())["warnings"] == ["the machine was busy"]
    assert result.warnings == ("the machine was busy",) and result.settings["output_dir"] == str(tmp_path)
    assert (tmp_path / "throughput.md").read_text() == "# Title\n\n**Warning:** the machine was busy\n\n| a |\n|---|\n"


def test_line_plot_draws_ranges_as_error_bars_and_colours_by_variant():
    first = plots.line_plot(
        {"baseline": ([1, 2], [10.0, 19.0], [9.0, 15.0], [11.0, 20.0]), "measured": ([1, 2], [5, 6])},
        "batch",
        "seq/s",
        "t",
    )
    (bars,) = first.axes[0].containers  # the series with a range, and only it
    lower, upper = (bars.lines[1][0].get_ydata(), bars.lines[1][1].get_ydata())
    assert list(lower) == [9.0, 15.0] and list(upper) == [11.0, 20.0]
    second = plots.line_plot(
        {"run B: every-2": ([1], [1.0]), "full:2": ([1], [2.0]), "baseline": ([1], [3.0])}, "x", "y", "t"
    )
    colours = {
        line.get_label(): line.get_color()
        for axes in (first.axes[0], second.axes[0])
        for line in axes.get_lines()
        if not line.get_label().startswith("_")
    }
    assert colours["baseline"] == first.axes[0].get_lines()[0].get_color() == "tab:blue"
    assert colours["full:2"] == plots.VARIANT_COLOURS["full"] and colours["run B: every-2"] == "tab:red"
    assert colours["measured"] not in plots.VARIANT_COLOURS.values()


def test_line_plot_from_zero_markers_only_and_marks():
    figure = plots.line_plot(
        {"overlap 0": ([8, 1024], [0.994, 0.991])},
        "GPUs",
        "efficiency",
        "t",
        log_x=True,
        joined=False,
        y_from_zero=True,
        marks={"overlap 0": (8, 0.994, "largest")},
    )
    axes = figure.axes[0]
    assert axes.get_ylim()[0] == 0 and axes.get_ylim()[1] > 1  # 0.991-0.994 is a sliver, not the whole height
    points = axes.get_lines()[0]
    assert points.get_linestyle() == "None" and points.get_marker() == "o"
    assert [text.get_text() for text in axes.texts] == ["largest"]
