"""Every bench and runner on a CUDA GPU (skipped without one): each on cuda:0, and on cuda:1 where a second GPU
exists, with a tiny model for a few steps, its outputs checked; run_pretraining in fp16 and bf16 resumed from a
middle checkpoint ends where the uninterrupted run ends, its loss scaler restored."""

import os
import shutil

import pytest
import torch
from helpers import read_json, runner_command

from bertbench.bench import budget, finetuning, memory, profile, scaling, throughput
from bertbench.bench.results import BenchResult
from bertbench.training.checkpoint import list_checkpoints, load_checkpoint

pytestmark = pytest.mark.gpu
DEVICES = [
    "cuda:0",
    pytest.param("cuda:1", marks=pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")),
]


@pytest.fixture(params=DEVICES)
def device(request):
    """The GPU a test runs on; the current device and the allocator's cap (memory sets one) are put back after."""
    current = torch.cuda.current_device()
    yield request.param
    torch.cuda.set_per_process_memory_fraction(1.0, torch.device(request.param).index)
    torch.cuda.set_device(current)


def test_throughput_times_the_step_on_the_gpu_it_was_given(device, tmp_path):
    assert (
        throughput.main(
            [
                "--model",
                "tiny",
                "--kinds",
                "finetuning",
                "--seq_lengths",
                "32",
                "--batch_sizes",
                "4",
                "--warmup",
                "1",
                "--steps",
                "2",
                "--variants",
                "baseline,full",
                "--precisions",
                "bf16",
                "--device",
                device,
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = read_json(tmp_path / "throughput.json")
    assert report["device"] == device and report["machine"]["gpu"] == torch.cuda.get_device_name(device)
    rows = {row["variant"]: row for row in report["rows"]}
    assert all(not row["out_of_memory"] and row["seq_per_s"] > 0 for row in rows.values())
    assert rows["full"]["memory_kind"] == "CUDA allocated" and rows["full"]["step_memory_bytes"] > 0
    assert torch.cuda.current_device() == torch.device(device).index


def test_memory_finds_the_largest_batch_under_the_cap_of_its_gpu(device, tmp_path):
    assert (
        memory.main(
            [
                "--model",
                "tiny",
                "--seq_lengths",
                "32",
                "--cap_gib",
                "1",
                "--variants",
                "baseline,full",
                "--max_batch",
                "512",
                "--steps",
                "2",
                "--device",
                device,
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    result = BenchResult.read(str(tmp_path / "memory.json"))
    assert result.context == {"device": device, "cap_bytes": 2**30}
    assert [row.get("variant") for row in result.rows] == ["baseline", "full"]
    for row in result.rows:
        assert row.median() > 0 and row.get("verified") and 0 < row.get("peak_bytes_at_max_batch") <= 2**30
        assert row.median("seq_per_s") > 0


def test_profile_has_a_device_time_table(device, tmp_path):
    assert (
        profile.main(
            [
                "--model",
                "tiny",
                "--batch_size",
                "2",
                "--max_seq_length",
                "32",
                "--warmup",
                "1",
                "--steps",
                "2",
                "--device",
                device,
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = read_json(tmp_path / "profile.json")
    assert report["time"] == "self CUDA" and report["settings"]["device"] == device
    assert report["categories"]["matmul"]["seconds"] > 0 and report["matmul_tflops_per_s"] > 0
    assert 0 < report["operator_share_of_step"] <= 1
    assert report["top_operators"] and all(row["self_seconds"] >= 0 for row in report["top_operators"])
    assert "## Time by category (self CUDA, per step)" in (tmp_path / "profile.md").read_text()


def test_scaling_runs_one_process_on_the_gpu(device, tmp_path):
    assert (
        scaling.main(
            [
                "--model",
                "tiny",
                "--seq_length",
                "32",
                "--batch_per_process",
                "8",
                "--steps",
                "3",
                "--excluded_steps",
                "1",
                "--processes",
                "1",
                "--device",
                device,
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    (row,) = read_json(tmp_path / "scaling.json")["models"][0]["rows"]
    assert row["device_type"] == "cuda" and row["processes"] == 1 and row["seq_per_s"] > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_scaling_runs_two_processes_over_nccl(tmp_path):
    assert (
        scaling.main(
            [
                "--model",
                "tiny",
                "--seq_length",
                "32",
                "--batch_per_process",
                "8",
                "--steps",
                "3",
                "--excluded_steps",
                "1",
                "--processes",
                "1,2",
                "--allreduce_rounds",
                "2",
                "--allreduce_repeats",
                "2",
                "--device",
                "cuda",
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = read_json(tmp_path / "scaling.json")["models"][0]
    assert [row["backend"] for row in report["rows"]] == [None, "nccl"]
    assert report["allreduce"]["bus_bandwidth_bytes_per_s"] > 0


def test_budget_trains_its_contender_on_the_gpu(device, tmp_path):
    assert (
        budget.main(
            [
                "--minutes=0.02",
                "--contenders=baseline:1",
                "--hidden=32",
                "--layers=1",
                "--max_seq_length=32",
                "--log_step_count_steps=1",
                "--device",
                device,
                f"--output_dir={tmp_path}",
            ]
        )
        == 0
    )
    (row,) = read_json(tmp_path / "budget.json")["rows"]
    assert row["steps"] > 0
    (run,) = os.listdir(tmp_path / "runs")
    assert read_json(tmp_path / "runs" / run / "train_results.json")["device"] == device


def test_finetuning_trains_and_resumes_on_the_gpu(device, tmp_path):
    assert (
        finetuning.main(
            [
                "--task=glue",
                "--model=tiny",
                "--variants=baseline",
                "--rounds=1",
                "--max_train_samples=320",
                "--train_batch_size=8",
                "--num_train_epochs=1",
                "--device",
                device,
                f"--output_dir={tmp_path}",
            ]
        )
        == 0
    )
    report = read_json(tmp_path / "finetuning.json")
    (row,) = report["rows"]
    assert row["steady_seq_per_s"] > 0
    assert report["resume_after_sigkill"]["resumed_from"].endswith(".pt")


@pytest.mark.parametrize("runner", ["classifier", "squad"])
def test_fine_tuning_runners_train_on_the_gpu(device, runner, runner_inputs, tmp_path):
    main, argv = runner_command(runner, runner_inputs, tmp_path / "run", f"--device={device}", "--precision=bf16")
    assert main(argv) == 0
    results = read_json(tmp_path / "run" / "train_results.json")
    assert results["device"] == device and results["precision"] == "bf16" and results["global_step"] >= 2


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_pretraining_resumes_in_mixed_precision_where_the_uninterrupted_run_ends(
    device, precision, runner_inputs, tmp_path
):
    """A run stopped after its step-4 checkpoint (the later ones removed, as a kill leaves it) and started again
    ends with the uninterrupted run's weights (up to the GPU kernels' atomics: far closer than the training since
    step 4 moved them) and loss scaler (the same scale and growth tracker)."""
    flags = (
        f"--device={device}",
        f"--precision={precision}",
        "--num_train_steps=8",
        "--save_checkpoints_steps=4",
        "--keep_checkpoint_max=3",
    )
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    main, argv = runner_command("pretraining", runner_inputs, whole, *flags)
    assert main(argv) == 0
    shutil.copytree(whole, resumed)
    for step, path in list_checkpoints(resumed):
        if step > 4:
            os.remove(path)
    main, argv = runner_command("pretraining", runner_inputs, resumed, *flags)
    assert main(argv) == 0
    results = read_json(resumed / "train_results.json")
    assert results["resumed_from"].endswith("ckpt-000000004.pt") and results["device"] == device
    middle, first, second = (
        load_checkpoint(path)
        for path in (list_checkpoints(whole)[0][1], list_checkpoints(whole)[-1][1], list_checkpoints(resumed)[-1][1])
    )
    assert middle["step"] == 4 and first["step"] == second["step"] == 8
    moved = max((first["model"][name] - middle["model"][name]).abs().max().item() for name in first["model"])
    apart = max((first["model"][name] - second["model"][name]).abs().max().item() for name in first["model"])
    assert moved > 0 and apart <= 1e-2 * moved
    assert second["scaler"] == first["scaler"]
    assert ("scale" in middle["scaler"]) == (precision == "fp16")
