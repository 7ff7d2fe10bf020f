import argparse
import json

import pytest

from bertbench.bench import measure, memory, workload


@pytest.mark.parametrize("threshold, limit", [(37, 100), (1, 100), (64, 64), (500, 100), (0, 100), (99, 100)])
def test_largest_fitting_finds_the_threshold_in_few_probes(threshold, limit):
    probes = []

    def fits(batch):
        probes.append(batch)
        return batch <= threshold

    assert memory.largest_fitting(fits, limit) == min(threshold, limit)
    assert len(probes) <= 2 * limit.bit_length() + 1


def search_args(**overrides):
    return argparse.Namespace(**{"max_batch": 4096, "verify_tokens": 10**6, **overrides})


@pytest.mark.parametrize("variant", ["baseline", "full", "selective", "every-2"])
def test_the_line_through_batch_1_2_4_gives_the_measured_largest_batch(variant):
    config = workload.bert_config("tiny", 32)
    saved = memory.SavedBytes(config, "pretraining", workload.Variant.parse(variant), "fp32", 32, "cpu")
    cap = 3 * 2**20
    found = memory.cpu_search(saved, cap, search_args())
    assert found["method"] == "line through batch 1, 2, 4" and found["verified"]
    largest = found["max_batch"]
    assert saved(largest) <= cap < saved(largest + 1)  # counted, not predicted
    assert found["saved_bytes_at_max_batch"] == saved(largest)
    assert saved(largest) == found["saved_bytes_fixed"] + largest * found["saved_bytes_per_sequence"]


def test_a_large_bf16_batch_is_predicted_not_counted_and_the_limit_holds():
    config = workload.bert_config("tiny", 32)
    saved = memory.SavedBytes(config, "finetuning", workload.Variant.parse("full"), "bf16", 32, "cpu")
    assert not saved.on_meta
    found = memory.cpu_search(saved, 2**30, search_args(verify_tokens=1000))
    assert not found["verified"] and sorted(saved.counted) == [1, 2, 4]
    assert found["max_batch"] > 1000
    assert memory.cpu_search(saved, 2**30, search_args(max_batch=100, verify_tokens=0))["max_batch"] == 100


@pytest.mark.parametrize("kind", workload.STEP_KINDS)
@pytest.mark.parametrize("variant", ["baseline", "full", "selective", "every-2"])
def test_bytes_counted_on_the_meta_device_equal_the_cpus(kind, variant):
    config = workload.bert_config("tiny", 48)
    on_meta = memory.SavedBytes(config, kind, workload.Variant.parse(variant), "fp32", 48, "cpu")
    assert on_meta.on_meta and next(on_meta.model.parameters()).device.type == "meta"
    model = workload.build(config, kind, workload.Variant.parse(variant))
    inputs = workload.synthetic_batch(config, kind, 3, 48)
    on_cpu = measure.saved_activation_bytes(lambda: workload.forward_loss(model, inputs, "fp32", "cpu"), model)[1]
    assert on_meta(3) == on_cpu


def test_a_cap_below_one_sequence_fits_nothing():
    config = workload.bert_config("tiny", 32)
    saved = memory.SavedBytes(config, "finetuning", workload.Variant.parse("baseline"), "fp32", 32, "cpu")
    assert memory.cpu_search(saved, 1000, search_args())["max_batch"] == 0


def test_memory_bench_orders_the_policies_and_times_them_at_one_batch(tmp_path, monkeypatch):
    drawn, real_plot = [], memory.line_plot
    monkeypatch.setattr(memory, "line_plot", lambda *args, **options: drawn.append(options) or real_plot(*args,
                                                                                                        **options))
    assert memory.main(["--model", "tiny", "--seq_lengths", "32", "--cap_gib", "0.004", "--steps", "2",
                        "--warmup", "0", "--output_dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "memory.json").read_text())
    rows = {row["variant"]: row for row in report["rows"]}
    assert report["cap_bytes"] == int(0.004 * 2**30)
    assert rows["full"]["max_batch"] > rows["selective"]["max_batch"] > rows["baseline"]["max_batch"] > 0
    assert rows["every-2"]["max_batch"] > rows["baseline"]["max_batch"]
    assert rows["full"]["max_batch_vs_first"] == rows["full"]["max_batch"] / rows["baseline"]["max_batch"]
    assert {row["time_batch"] for row in rows.values()} == {min(8, rows["baseline"]["max_batch"])}
    markdown = (tmp_path / "memory.md").read_text()
    for row in rows.values():  # each variant's time at the one batch, relative to the first variant's
        assert row["slowdown"] == pytest.approx(row["step_seconds"] / rows["baseline"]["step_seconds"])
        assert row["seq_per_s"] == pytest.approx(row["time_batch"] / row["step_seconds"])
        assert row["seq_per_s_max"] == pytest.approx(row["time_batch"] / row["step_seconds_min"])
        assert row["step_seconds_cv"] is not None  # two timed steps
        assert (f"| {row['step_seconds']:.3f} ({row['step_seconds_min']:.3f}–{row['step_seconds_max']:.3f}, CV "
                in markdown)
    assert "| 32 | full |" in markdown
    assert (tmp_path / "memory-seq32.png").stat().st_size > 1000
    # each variant's largest batch is marked on its line, at the bytes counted there
    (options,) = drawn
    assert options["marks"] == {name: (row["max_batch"], row["saved_bytes_at_max_batch"] / 2**30,
                                       f"{name}: {row['max_batch']:,}") for name, row in rows.items()}


def test_a_non_positive_cap_is_refused(tmp_path, error_line):
    assert memory.main(["--model", "tiny", "--cap_gib", "0", "--output_dir", str(tmp_path / "out")]) == 2
    assert error_line() == "bertbench bench memory: error: --cap_gib must be positive, got 0.0"
    assert not (tmp_path / "out").exists()


@pytest.mark.gpu
def test_gpu_search_runs_under_a_real_cap(tmp_path):
    assert memory.main(["--model", "tiny", "--seq_lengths", "128", "--cap_gib", "1", "--device", "cuda",
                        "--variants", "baseline,full", "--max_batch", "2048", "--output_dir", str(tmp_path)]) == 0
    rows = {row["variant"]: row for row in json.loads((tmp_path / "memory.json").read_text())["rows"]}
    assert rows["full"]["max_batch"] >= rows["baseline"]["max_batch"] > 0
    assert all(row["peak_bytes_at_max_batch"] <= 2**30 for row in rows.values())
