import json

import pytest
import torch

from bertbench import devices, synthetic
from bertbench.bench import flops, measure, workload
from conftest import TINY_BERT



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


def test_full_recompute_redoes_exactly_the_encoder_forward():
    config = workload.bert_config("tiny", 32)
    batch = synthetic.synthetic_batch(config, "finetuning", 2, 32)
    counted = {}
    for name in ("baseline", "full"):
        model = workload.build(config, "finetuning", workload.Variant.parse(name))
        counted[name] = measure.count_flops(lambda: model(**batch).loss.backward())
    assert counted["full"] - counted["baseline"] == 2 * flops.encoder_forward_flops(config, 32)


@pytest.mark.parametrize("name, precision, tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4), ("NVIDIA H100 PCIe", "bf16", 756.0), ("NVIDIA H200", "fp32", 66.9),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312.0), ("NVIDIA A10", "fp16", 125.0), ("NVIDIA L40S", "bf16", 362.1),
    ("NVIDIA L4", "fp32", 30.3), ("Tesla V100-SXM2-32GB", "bf16", None), ("Some Future GPU", "bf16", None)])
def test_gpu_peaks_match_the_longest_name(name, precision, tflops):
    peak = flops.gpu_peak_flops(name, precision)
    assert peak == (None if tflops is None else pytest.approx(tflops * 1e12))


def test_cpu_peak_is_the_measured_matmul():
    assert flops.peak_flops(torch.device("cpu"), "fp32", 1.5e11) == (1.5e11, "measured fp32 matmul on cpu")
    with pytest.raises(ValueError):
        flops.peak_flops(torch.device("cpu"), "fp32")


@pytest.mark.parametrize("text, expected", [("baseline", ("baseline", "full", 2)), ("full", ("recompute", "full", 2)),
                                            ("selective", ("recompute", "selective", 2)),
                                            ("every-3", ("recompute", "every-k", 3))])
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
