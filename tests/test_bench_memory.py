from types import SimpleNamespace

import pytest
import torch

from bertbench.bench import measure, memory, workload
from bertbench.bench.results import BenchResult, Ratio, Spread
from bertbench.model.saved_activations import saved_activation_bytes


@pytest.mark.parametrize("threshold, limit", [(37, 100), (1, 100), (64, 64), (500, 100), (0, 100), (99, 100)])
def test_largest_fitting_finds_the_threshold_in_few_probes(threshold, limit):
    probes = []

    def fits(batch):
        probes.append(batch)
        return batch <= threshold

    assert memory.largest_fitting(fits, limit) == min(threshold, limit)
    assert len(probes) <= 2 * limit.bit_length() + 1


@pytest.mark.parametrize("variant", ["baseline", "full", "selective", "every-2"])
def test_the_line_through_batch_1_2_4_gives_the_measured_largest_batch(variant):
    config = workload.bert_config("tiny", 32)
    saved = memory.SavedBytes(config, "pretraining", workload.Variant.parse(variant), "fp32", 32, "cpu")
    cap = 3 * 2**20
    found = memory.cpu_search(saved, cap, 4096, 10**6)
    assert found["method"] == "line through batch 1, 2, 4" and found["verified"]
    largest = found["max_batch"]
    assert saved(largest) <= cap < saved(largest + 1)  # counted, not predicted
    assert found["saved_bytes_at_max_batch"] == saved(largest)
    assert saved(largest) == found["saved_bytes_fixed"] + largest * found["saved_bytes_per_sequence"]


def test_a_large_bf16_batch_is_predicted_not_counted_and_the_limit_holds():
    config = workload.bert_config("tiny", 32)
    saved = memory.SavedBytes(config, "finetuning", workload.Variant.parse("full"), "bf16", 32, "cpu")
    assert not saved.on_meta
    found = memory.cpu_search(saved, 2**30, 4096, 1000)
    assert not found["verified"] and sorted(saved.counted) == [1, 2, 4]
    assert found["max_batch"] > 1000
    assert memory.cpu_search(saved, 2**30, 100, 0)["max_batch"] == 100


@pytest.mark.parametrize("kind", workload.STEP_KINDS)
@pytest.mark.parametrize("variant", ["baseline", "full", "selective", "every-2"])
def test_bytes_counted_on_the_meta_device_equal_the_cpus(kind, variant):
    config = workload.bert_config("tiny", 48)
    on_meta = memory.SavedBytes(config, kind, workload.Variant.parse(variant), "fp32", 48, "cpu")
    assert on_meta.on_meta and next(on_meta.model.parameters()).device.type == "meta"
    model = workload.build(config, kind, workload.Variant.parse(variant))
    inputs = workload.synthetic_batch(config, kind, 3, 48)
    on_cpu = saved_activation_bytes(lambda: workload.forward_loss(model, inputs, "fp32", "cpu"), model)[1]
    assert on_meta(3) == on_cpu


def test_a_cap_below_one_sequence_fits_nothing():
    config = workload.bert_config("tiny", 32)
    saved = memory.SavedBytes(config, "finetuning", workload.Variant.parse("baseline"), "fp32", 32, "cpu")
    assert memory.cpu_search(saved, 1000, 4096, 10**6)["max_batch"] == 0


def test_memory_bench_orders_the_policies_and_times_them_at_one_batch(tmp_path, monkeypatch):
    drawn, real_plot = [], memory.line_plot
    monkeypatch.setattr(
        memory, "line_plot", lambda *args, **options: drawn.append(options) or real_plot(*args, **options)
    )
    # A clock of known step times: the baseline's steps take 0.2 and 0.1 s, every recompute policy's 0.3 and 0.2 s.
    steps_timed = {}

    def known_times(steps, warmup, repeats, device):
        steps_timed.update({name: repeats for name in steps})
        return {name: [0.2, 0.1] if name == "baseline" else [0.3, 0.2] for name in steps}

    monkeypatch.setattr(measure, "time_steps", known_times)
    flags = ["--model", "tiny", "--seq_lengths", "32", "--cap_gib", "0.004", "--steps", "2", "--warmup", "0"]
    assert memory.main([*flags, "--device", "cpu", "--output_dir", str(tmp_path)]) == 0
    result = BenchResult.read(str(tmp_path / "memory.json"))
    rows = {row.get("variant"): row for row in result.rows}
    assert result.context == {"device": "cpu", "cap_bytes": int(0.004 * 2**30)}
    for row in result.rows:
        assert (row.measured, row.unit, row.status) == ("max_batch", "sequences", "measured")
        assert row.setting == {
            "model": "tiny",
            "kind": "pretraining",
            "precision": "fp32",
            "seq": 32,
            "variant": row.get("variant"),
        }
        assert row.value == Spread.exact(row.median()) and isinstance(row.get("slowdown"), Ratio)
    largest = {name: row.median() for name, row in rows.items()}
    assert largest["full"] > largest["selective"] > largest["baseline"] > 0
    assert largest["every-2"] > largest["baseline"]
    assert rows["full"].median("max_batch_vs_first") * largest["baseline"] == pytest.approx(largest["full"])
    assert steps_timed == dict.fromkeys(rows, 2)  # every variant, 2 steps, together
    (time_batch,) = {row.get("time_batch") for row in rows.values()}
    assert time_batch == min(8, largest["baseline"])
    markdown = (tmp_path / "memory.md").read_text()
    assert "| 0.150 (0.100–0.200, CV 47%) |" in markdown  # the baseline's median step, its range and CV
    for name, row in rows.items():  # each variant's time at the one batch, relative to the first variant's
        step, fastest = (0.15, 0.1) if name == "baseline" else (0.25, 0.2)
        assert (row.get("step_seconds").median, row.get("step_seconds").min) == pytest.approx((step, fastest))
        assert row.median("slowdown") == pytest.approx(1.0 if name == "baseline" else 0.25 / 0.15)
        seq_per_s = row.get("seq_per_s")
        assert (seq_per_s.median, seq_per_s.max) == pytest.approx((time_batch / step, time_batch / fastest))
    assert "| 32 | full |" in markdown and "1.67x (noisy: inputs' CV 47%)" in markdown
    assert (tmp_path / "memory-seq32.png").stat().st_size > 1000
    # each variant's largest batch is marked on its line, at the bytes counted there
    (options,) = drawn
    assert options["marks"] == {
        name: (largest[name], row.get("saved_bytes_at_max_batch") / 2**30, f"{name}: {largest[name]:,}")
        for name, row in rows.items()
    }


def test_a_variant_that_fits_nothing_has_no_figure_and_says_why(tmp_path):
    flags = ["--model", "tiny", "--seq_lengths", "32", "--cap_gib", "0.0000001", "--variants", "baseline"]
    assert memory.main([*flags, "--device", "cpu", "--output_dir", str(tmp_path)]) == 0
    (row,) = BenchResult.read(str(tmp_path / "memory.json")).rows
    assert row.value is None and row.status == "no batch fits under the cap"
    assert row.get("max_batch_vs_first") is None and row.get("step_seconds") is None
    assert "| 32 | baseline | no batch fits under the cap |" in (tmp_path / "memory.md").read_text()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--cap_gib", "0"], "--cap_gib must be positive, got 0.0"),
        (["--variants", "baseline,fast"], "--variants: unknown variant 'fast'"),
        (["--seq_lengths", "128,0"], "--seq_lengths must be positive, got 128,0"),
        (["--time_batch", "-1"], "--time_batch must be 0 or more, got -1"),
        (["--kind", "pretrain"], "--kind: invalid choice: 'pretrain'"),
        (["--model", "huge"], "unknown model 'huge'"),
    ],
)
def test_bad_flags_are_refused_in_one_line_before_anything_is_written(tmp_path, capsys, flags, message):
    assert memory.main(["--model", "tiny", *flags, "--output_dir", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert message in error and error.startswith("bertbench bench memory: error: ")
    assert len(error.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.gpu
def test_gpu_search_runs_under_a_real_cap(tmp_path):
    assert (
        memory.main(
            [
                "--model",
                "tiny",
                "--seq_lengths",
                "128",
                "--cap_gib",
                "1",
                "--device",
                "cuda",
                "--variants",
                "baseline,full",
                "--max_batch",
                "2048",
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    rows = {row.get("variant"): row for row in BenchResult.read(str(tmp_path / "memory.json")).rows}
    assert rows["full"].median() >= rows["baseline"].median() > 0
    assert all(row.get("peak_bytes_at_max_batch") <= 2**30 for row in rows.values())


def test_the_gpu_cap_counts_only_the_benchs_memory_and_is_lifted_after(monkeypatch):
    """Seen on an H100 (tests in one process): a cap set on the whole process squeezed the bench under what earlier
    code held, and stayed on after it, failing the next bench's allocations."""
    fractions = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2 * 2**30)  # held by the caller
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, index: fractions.append((f, index)))
    with pytest.raises(RuntimeError), memory.allocator_cap(torch.device("cuda", 0), 2**30):
        assert fractions == [((2**30 + 2 * 2**30) / (80 * 2**30), 0)]  # 1 GiB for the bench, on top of the 2 held
        raise RuntimeError("a failed search")
    assert fractions[-1] == (1.0, 0)  # lifted, even after a failure
    with memory.allocator_cap(torch.device("cpu"), 2**30):
        pass
    assert len(fractions) == 2  # no cap on a CPU
