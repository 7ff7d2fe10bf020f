"""`bertbench bench suite`: the parts it runs, the headline figures it reads from their reports, the targets, what
it does when a part fails, and the input it refuses before running anything. Plus throughput's `+compile` variants,
which its compile part times."""

import json
import os
import sys

import pytest
import torch
from helpers import snapshot

from bertbench.bench import suite, throughput, workload

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def throughput_row(variant, seq=128, batch=8, **figures):
    return {"variant": variant, "seq": seq, "batch": batch, "out_of_memory": False, **figures}


# Reports as the parts write them (only the keys the suite reads), with round numbers whose ratios are known.
REPORTS = {
    "phase1": {
        "rows": [
            throughput_row("baseline", 128, 256, seq_per_s=1500.0, mfu=0.55),
            throughput_row("hf", 128, 256, seq_per_s=1000.0, mfu=0.40),
            throughput_row("baseline", 128, 64, seq_per_s=900.0, mfu=0.30),
            throughput_row("hf", 128, 64, out_of_memory=True),
        ]
    },
    "phase2": {
        "rows": [
            throughput_row("baseline", 512, 32, step_seconds=0.10, saved_bytes=1000, seq_per_s=320.0, mfu=0.45),
            throughput_row("full", 512, 32, step_seconds=0.125, saved_bytes=100),
            throughput_row("selective", 512, 32, step_seconds=0.12, saved_bytes=600),
            throughput_row("hf", 512, 32, seq_per_s=200.0, mfu=0.3),
        ]
    },
    "largest-batch": {
        "rows": [
            {"variant": "baseline", "max_batch": 64, "seq_per_s_at_max_batch": 300.0},
            {"variant": "full", "max_batch": 400, "seq_per_s_at_max_batch": 330.0},
            {"variant": "selective", "max_batch": 100, "seq_per_s_at_max_batch": 270.0},
        ]
    },
    "finetuning": {
        "rows": [
            throughput_row("baseline", batch=32, real_tokens_per_s=200_000.0, path="unpadded/varlen", host_share=0.4),
            throughput_row("baseline/padded", batch=32, real_tokens_per_s=100_000.0),
            throughput_row("hf", batch=32, real_tokens_per_s=80_000.0),
            throughput_row("hf-dynamic", batch=32, real_tokens_per_s=160_000.0),
        ]
    },
    "compile": {
        "rows": [
            throughput_row("baseline", 128, 256, seq_per_s=1000.0),
            throughput_row("baseline+compile", 128, 256, seq_per_s=1250.0, compile_seconds=42.0),
        ]
    },
    "optimizer": {
        "rows": [
            {"optimizer": "lamb:fused", "form": "fused", "step_ms": 3.0, "floor_ms": 2.0, "ratio_to_floor": 1.5},
            {"optimizer": "lamb:eager", "form": "eager", "step_ms": 9.0, "floor_ms": 2.0, "ratio_to_floor": 4.5},
        ]
    },
}


def summary_of(reports):
    return {
        "pretraining": suite.pretraining_rows(reports),
        "recompute": suite.recompute_rows(reports),
        "compile": suite.compile_rows(reports),
        "finetuning": suite.finetuning_rows(reports),
        "optimizer": suite.optimizer_rows(reports),
    }


def test_headline_figures_pair_each_figure_with_what_it_is_compared_with():
    summary = summary_of(REPORTS)
    pretraining = {(row["seq"], row["batch"]): row for row in summary["pretraining"]}
    assert pretraining[(128, 256)]["vs_hf"] == pytest.approx(1.5)
    assert pretraining[(512, 32)]["vs_hf"] == pytest.approx(1.6)
    assert pretraining[(128, 64)]["vs_hf"] is None and pretraining[(128, 64)]["hf_seq_per_s"] is None  # HF OOM
    recompute = {row["variant"]: row for row in summary["recompute"]}
    assert recompute["full"]["slowdown"] == pytest.approx(1.25)
    assert recompute["full"]["saved_vs_baseline"] == pytest.approx(0.1)
    assert recompute["selective"]["saved_vs_baseline"] == pytest.approx(0.6)
    assert recompute["full"]["at_max_vs_baseline"] == pytest.approx(1.1)
    assert recompute["selective"]["max_batch"] == 100
    assert "every-2" not in recompute  # measured by neither part
    (finetuning,) = summary["finetuning"]
    assert (finetuning["vs_padded"], finetuning["vs_hf"], finetuning["vs_hf_dynamic"]) == pytest.approx(
        (2.0, 2.5, 1.25)
    )
    (compiled,) = summary["compile"]
    assert compiled["vs_eager"] == pytest.approx(1.25) and compiled["compile_seconds"] == 42.0


def test_targets_say_which_hold():
    found = {row["what"]: row["met"] for row in suite.checks(summary_of(REPORTS))}
    assert found["MFU, pre-training seq 128 batch 256"] is True  # 55% >= 50%
    assert found["MFU, pre-training seq 512 batch 32"] is False  # 45%
    assert "MFU, pre-training seq 128 batch 64" not in found  # the targets name batch 256 and 32
    assert found["fine-tuning batch 32: default / HF dynamic (real tokens/s)"] is False  # 1.25 < 1.6
    assert found["fine-tuning batch 32: default / padded (real tokens/s)"] is True  # 2.0 >= 1.5
    assert found["recompute full: step time / baseline's"] is True  # 1.25 <= 1.30
    assert found["recompute selective: step time / baseline's"] is False  # 1.20 > 1.10
    assert found["recompute full: seq/s at its largest batch / baseline's at its own"] is True
    assert found["recompute selective: seq/s at its largest batch / baseline's at its own"] is False
    assert found["optimizer lamb:fused: step / memory floor (28 bytes a parameter)"] is True  # 1.5 <= 1.5
    assert not any("eager" in what for what in found)  # a GPU steps in the fused form


def test_parts_follow_the_size_and_leave_out_hf_without_transformers():
    standard = {part.name: part for part in suite.parts(suite.SCALES["standard"], torch.device("cuda"), True)}
    assert list(standard) == ["phase1", "phase2", "compile", "finetuning", "largest-batch", "optimizer"]
    flags = " ".join(standard["phase1"].flags)
    assert "--model large" in flags and "--precisions bf16" in flags and "--optimizer lamb" in flags
    assert "--batch_sizes 64,256" in flags and "--variants baseline,hf" in flags
    assert "--variants baseline,baseline+compile" in " ".join(standard["compile"].flags)
    assert "--lengths real-text" in " ".join(standard["finetuning"].flags)
    small = suite.parts(suite.SCALES["small"], torch.device("cpu"), False)
    for part in small:
        assert "large" not in part.flags and "bf16" not in part.flags  # mini and tiny, fp32 on a CPU
        assert not any(flag.startswith("hf") or flag.endswith(",hf") or ",hf," in flag for flag in part.flags)


def fake_run_part(reports, failing=()):
    """run_part as the suite calls it, writing `reports` as the parts would, and failing the parts in `failing`."""

    def run(part, command):
        directory = command[command.index("--output_dir") + 1]
        os.makedirs(directory, exist_ok=True)
        status = 1 if part.name in failing else 0
        if not status:
            with open(os.path.join(directory, f"{part.bench}.json"), "w") as handle:
                json.dump({**reports[part.name], "warnings": ["noisy"]}, handle)
        return {
            "name": part.name,
            "bench": part.bench,
            "what": part.what,
            "command": " ".join(command),
            "wall_seconds": 1.0,
            "exit_status": status,
            "report": os.path.join(part.name, f"{part.bench}.json"),
            **({"error": "error: CUDA out of memory"} if status else {}),
        }

    return run


def test_a_failed_part_is_reported_and_the_suite_exits_1_after_writing_the_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "run_part", fake_run_part(REPORTS, failing={"phase2"}))
    out = tmp_path / "suite"
    assert suite.main(["--device", "cpu", "--size", "standard", "--output_dir", str(out)]) == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("bertbench bench suite: error: 1 part(s) failed: phase2: error: CUDA out of memory")
    )
    report = json.loads((out / "suite.json").read_text())
    assert [part["name"] for part in report["parts"]] == [
        "phase1",
        "phase2",
        "compile",
        "finetuning",
        "largest-batch",
        "optimizer",
    ]
    assert (
        report["summary"]["recompute"][0]["variant"] == "baseline"
        and "slowdown" not in report["summary"]["recompute"][0]
    )  # phase 2 failed: only the largest batches
    assert "phase1: noisy" in report["warnings"]
    assert report["targets"] == []  # targets are a GPU's
    text = (out / "suite.md").read_text()
    assert "FAILED (1): error: CUDA out of memory" in text and "[throughput.md](phase1/throughput.md)" in text
    for plot in ("speed", "recompute"):
        assert (out / f"suite-{plot}.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--parts", "phase1,warp"], "--parts: unknown part 'warp'"),
        (["--device", "cuda:3"], "--device 'cuda:3'"),
        (["--cap_gib", "0"], "--cap_gib must be positive"),
        (["--warmup", "-1"], "--warmup must be 0 or more"),
        (["--size", "huge"], "--size"),
    ],
)
def test_bad_input_is_refused_before_anything_runs(tmp_path, monkeypatch, error_line, flags, message):
    monkeypatch.setattr(suite, "run_part", lambda *args: pytest.fail("a part ran"))
    out = tmp_path / "suite"
    try:
        status = suite.main(flags + ["--output_dir", str(out)])
    except SystemExit as exit:  # argparse's own checks (a choice) exit from parse_args
        status = exit.code
    assert status == 2
    assert message in error_line()
    assert not out.exists()


def test_an_earlier_parts_results_are_kept_unless_overwrite(tmp_path, monkeypatch, error_line):
    monkeypatch.setattr(suite, "run_part", fake_run_part(REPORTS))
    out = tmp_path / "suite"
    (out / "optimizer").mkdir(parents=True)
    (out / "optimizer" / "optimizer.json").write_text("{}")
    before = snapshot(out)
    assert suite.main(["--device", "cpu", "--parts", "optimizer", "--output_dir", str(out)]) == 2
    assert "optimizer.json exists: choose another --output_dir or pass --overwrite" in error_line()
    assert snapshot(out) == before
    assert suite.main(["--device", "cpu", "--parts", "optimizer", "--output_dir", str(out), "--overwrite"]) == 0


def test_run_part_keeps_the_output_and_names_the_error(tmp_path, capsys):
    part = suite.Part("broken", "throughput", "a part that fails", ())
    command = [
        sys.executable,
        "-c",
        "print('step 1'); import sys; sys.exit('error: no such file x.json')",
        "--output_dir",
        str(tmp_path / "broken"),
    ]
    result = suite.run_part(part, command)
    assert result["exit_status"] == 1 and result["error"] == "error: no such file x.json"
    log = (tmp_path / "broken" / "output.log").read_text()
    assert "step 1" in log and "error: no such file x.json" in log
    assert "broken| step 1" in capsys.readouterr().out  # shown as it runs, with the part's name


def run_suite(out, *flags):
    """The suite's status is 0 with `flags` into `out`; its report."""
    assert suite.main([*flags, "--output_dir", str(out)]) == 0
    return json.loads((out / "suite.json").read_text())


@pytest.mark.slow
def test_a_real_part_runs_as_its_own_process(tmp_path):
    out = tmp_path / "suite"
    report = run_suite(out, "--device", "cpu", "--parts", "finetuning", "--steps", "1", "--warmup", "0")
    (part,) = report["parts"]
    assert part["exit_status"] == 0 and part["command"].startswith("bertbench bench throughput --model tiny")
    assert (out / "finetuning" / "throughput.json").exists() and (out / "finetuning" / "output.log").exists()
    rows = report["summary"]["finetuning"]
    assert [row["batch"] for row in rows] == [8, 32]
    assert all(row["real_tokens_per_s"] > 0 and row["vs_padded"] > 0 for row in rows)


# ---- throughput's +compile variants ----------------------------------------------------------------------------------


def test_a_compile_variant_is_a_bertbench_variant_in_throughput_only():
    variant = workload.Variant.parse("selective/padded+compile", compiled=True)
    assert (variant.name, variant.policy, variant.unpad, variant.compiled) == (
        "selective/padded+compile",
        "selective",
        False,
        True,
    )
    with pytest.raises(workload.BenchError, match="compiled variant"):
        workload.Variant.parse("baseline+compile")  # memory, profile: they time no compiled step
    with pytest.raises(workload.BenchError, match="compiled variant"):
        workload.Variant.parse("hf+compile", hf=True, compiled=True)


def test_eager_and_compiled_variants_are_timed_side_by_side(tmp_path, monkeypatch):
    compiled, compile = [], torch.compile

    def aot_eager(model):  # dynamo's graph run through AOTAutograd eagerly: no C++ compile in a test
        compiled.append(model)
        return compile(model, backend="aot_eager")

    monkeypatch.setattr(torch, "compile", aot_eager)
    torch._dynamo.reset()
    try:
        assert (
            throughput.main(
                [
                    "--model",
                    "tiny",
                    "--seq_lengths",
                    "32",
                    "--batch_sizes",
                    "2",
                    "--warmup",
                    "1",
                    "--steps",
                    "2",
                    "--kinds",
                    "finetuning",
                    "--variants",
                    "baseline,baseline+compile",
                    "--device",
                    "cpu",
                    "--no_memory",
                    "--output_dir",
                    str(tmp_path),
                ]
            )
            == 0
        )
    finally:
        torch._dynamo.reset()
    assert len(compiled) == 1  # the compiled variant's step, and only it
    rows = {row["variant"]: row for row in json.loads((tmp_path / "throughput.json").read_text())["rows"]}
    assert "compile_seconds" not in rows["baseline"] and rows["baseline"]["first_step_seconds"] > 0
    assert 0 <= rows["baseline+compile"]["compile_seconds"] < rows["baseline+compile"]["first_step_seconds"]
    assert "| compile (s) |" in (tmp_path / "throughput.md").read_text()


@pytest.mark.gpu
def test_gpu_small_suite_runs_every_part_on_cuda(tmp_path):
    report = run_suite(tmp_path / "suite", "--device", "cuda:0", "--size", "small", "--steps", "2", "--warmup", "1")
    assert all(part["exit_status"] == 0 for part in report["parts"])
    summary = report["summary"]
    assert {row["variant"] for row in summary["recompute"]} == set(suite.RECOMPUTE_VARIANTS)
    assert all(row["max_batch"] > 0 and row["slowdown"] > 0 for row in summary["recompute"])
    assert summary["finetuning"] and summary["pretraining"] and summary["optimizer"]
