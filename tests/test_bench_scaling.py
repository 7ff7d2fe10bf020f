import json

import pytest

from bertbench import cli as bertbench_cli
from bertbench.bench import plan, report, scaling
from bertbench.common.run_files import METRICS


@pytest.mark.slow
def test_one_and_two_processes_under_torchrun(tmp_path):
    assert (
        scaling.main(
            [
                "--model",
                "tiny",
                "--seq_length",
                "32",
                "--batch_per_process",
                "16",
                "--steps",
                "6",
                "--excluded_steps",
                "2",
                "--allreduce_rounds",
                "2",
                "--allreduce_repeats",
                "2",
                "--device",
                "cpu",
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "scaling.json").read_text())
    (model,) = report["models"]
    one, two = model["rows"]
    assert (one["processes"], two["processes"], one["nodes"], two["nodes"]) == (1, 2, 1, 1)
    assert (one["global_batch"], two["global_batch"]) == (16, 32)
    # the figures' arithmetic has its oracles below (canned jobs, a written log); here, that the jobs ran as asked
    assert one["speedup"] == one["efficiency"] == 1.0 and two["speedup"] > 0 and two["backend"] == "gloo"
    for row in (one, two):  # the median step of the 6 after the excluded 2, with its spread over them
        assert row["timed_steps"] == 6 and row["step_seconds_min"] <= row["step_seconds"] <= row["step_seconds_max"]
        assert row["seq_per_s_min"] <= row["seq_per_s"] <= row["seq_per_s_max"]
        assert (row["threads"], row["device_type"]) == (1, "cpu")
    allreduce = model["allreduce"]
    assert model["gradient_bytes"] == 4 * model["parameters"]
    assert {model["gradient_bytes"], 2**24} <= set(allreduce["sizes_bytes"])
    assert allreduce["processes"] == 2 and len(allreduce["seconds"]) == len(allreduce["sizes_bytes"])
    # the ring model is fitted to the times measured on the 2-process job
    assert (allreduce["latency_seconds"], allreduce["bus_bandwidth_bytes_per_s"]) == plan.fit_alpha_beta(
        allreduce["sizes_bytes"], allreduce["seconds"], 2
    )
    markdown = (tmp_path / "scaling.md").read_text()
    assert "| 1 | 2 | 32 |" in markdown
    in_steps = model["allreduce_in_steps"]
    assert (
        f"{in_steps['exposed_allreduce_seconds'] * 1e3:.1f} ms exposed per DDP step (median of 2 interleaved "
        f"pairs: {in_steps['step_with_allreduce_seconds'] * 1e3:.1f} ms with, "
        f"{in_steps['step_without_allreduce_seconds'] * 1e3:.1f} ms without; exposed per pair "
        f"{in_steps['exposed_allreduce_seconds_min'] * 1e3:.1f} to "
    ) in markdown
    sixteen = allreduce["sizes_bytes"].index(2**24)
    assert (
        f"| 16.000 | {allreduce['seconds'][sixteen] * 1e3:,.3f} ({allreduce['seconds_min'][sixteen] * 1e3:,.3f}"
        f"–{allreduce['seconds_max'][sixteen] * 1e3:,.3f}, CV "
    ) in markdown
    assert plan.main(["--validate", str(tmp_path / "scaling.json"), "--output_dir", str(tmp_path / "plan")]) == 0
    checked = {row["processes"]: row for row in json.loads((tmp_path / "plan" / "plan.json").read_text())["validation"]}
    assert checked[2]["measured_efficiency"] == pytest.approx(two["efficiency"])
    assert checked[1]["predicted_efficiency_no_overlap"] == 1.0
    assert (tmp_path / "scaling-efficiency.png").exists() and (tmp_path / "scaling-throughput.png").exists()


def canned_job(processes: int, seq_per_s: float, steady_seq_per_s: float) -> dict:
    """What a torchrun job of `processes` reports (run_job), with the median window's seq/s and the Estimator's
    steady seq/s made different, to tell which one speedup is of."""
    return {
        "nodes": 1,
        "processes": processes,
        "batch_per_process": 8,
        "global_batch": 8 * processes,
        **{f"seq_per_s{suffix}": seq_per_s for suffix in ("", "_min", "_max")},
        "seq_per_s_cv": 0.0,
        **{f"step_seconds{suffix}": 8 * processes / seq_per_s for suffix in ("", "_min", "_max")},
        "step_seconds_cv": 0.0,
        "steady_seq_per_s": steady_seq_per_s,
        "timed_steps": 8,
        "parameters": 1000,
        "backend": "gloo" if processes > 1 else None,
        "threads": 1,
        "device_type": "cpu",
    }


def test_speedup_and_efficiency_are_of_each_jobs_median_step(tmp_path, monkeypatch):
    jobs = {1: canned_job(1, 100.0, steady_seq_per_s=90.0), 2: canned_job(2, 150.0, steady_seq_per_s=190.0)}
    monkeypatch.setattr(scaling, "run_job", lambda args, processes: jobs[processes])
    assert scaling.main(["--model", "tiny", "--processes", "1,2", "--output_dir", str(tmp_path)]) == 0
    one, two = json.loads((tmp_path / "scaling.json").read_text())["models"][0]["rows"]
    # 150 / 100 seq/s on twice the processes (the steady figures, 190 / 90, would give 2.11 and 106%)
    assert (one["speedup"], one["efficiency"]) == (1.0, 1.0)
    assert (two["speedup"], two["efficiency"]) == pytest.approx((1.5, 0.75))
    assert (
        "| 1 | 2 | 16 | 0.1067 (0.1067–0.1067, CV 0.0%) | 150.00 | 1.50 | 75.0% |"
        in (tmp_path / "scaling.md").read_text()
    )


def test_a_jobs_step_times_are_read_from_its_one_step_windows(tmp_path):
    # rank 0 logs each step's seq/s over all the ranks' sequences: 32 sequences at 64, 128 and 16 seq/s
    records = [{"step": step, "seq_per_s": rate} for step, rate in ((1, 8.0), (2, 64.0), (3, 128.0), (4, 16.0))]
    (tmp_path / METRICS).write_text("".join(json.dumps(record) + "\n" for record in records))
    assert scaling.steady_step_seconds(str(tmp_path), 1, 32) == [0.5, 0.25, 2.0]


def write_run(directory, world_size, seq_per_s, **overrides):
    directory.mkdir(parents=True)
    results = {
        "world_size": world_size,
        "train_batch_size": 8,
        "num_accumulation_steps": 1,
        "max_seq_length": 128,
        "modeling": "recompute",
        "precision": "fp16",
        "steady_sentences_per_second": seq_per_s,
        "device": "cuda:0",
        **overrides,
    }
    (directory / "train_results.json").write_text(json.dumps(results))
    return str(directory)


def test_runs_of_the_job_templates_make_the_table(tmp_path):
    runs = [
        write_run(tmp_path / "mrpc_recompute_nodes2", 8, 700.0),
        write_run(tmp_path / "mrpc_recompute_nodes1", 4, 400.0),
        write_run(tmp_path / "other", 16, 1200.0, nodes=4),
    ]
    assert bertbench_cli.main(["bench", "scaling", "--runs", *runs, "--output_dir", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "scaling.json").read_text())["models"][0]["rows"]
    assert [(row["nodes"], row["processes"], row["global_batch"]) for row in rows] == [
        (1, 4, 32),
        (2, 8, 64),
        (4, 16, 128),
    ]
    assert [row["speedup"] for row in rows] == pytest.approx([1.0, 1.75, 3.0])
    assert [row["efficiency"] for row in rows] == pytest.approx([1.0, 0.875, 0.75])
    assert rows[1]["step_seconds"] == pytest.approx(64 / 700)


def test_runs_with_other_threads_or_devices_and_superlinear_efficiency_are_flagged(tmp_path, capsys):
    runs = [
        write_run(tmp_path / "cpu_nodes1", 1, 100.0, device="cpu", threads=1),
        write_run(tmp_path / "cpu_nodes2", 2, 507.4, device="cpu", threads=2, nodes=2),
    ]
    assert scaling.main(["--runs", *runs, "--output_dir", str(tmp_path / "out")]) == 0
    report = json.loads((tmp_path / "out" / "scaling.json").read_text())
    assert report["models"][0]["rows"][1]["efficiency"] == pytest.approx(2.537)
    mismatch, superlinear = report["warnings"]
    assert mismatch.startswith(
        f"the compared runs are not alike: they differ in threads per process ({runs[0]}: 1, "
        f"{runs[1]}: 2), so speedup and efficiency"
    )
    assert superlinear.startswith(f"efficiency above 100% (253.7% at 2 processes, {runs[1]}, marked (!))")
    markdown = (tmp_path / "out" / "scaling.md").read_text()
    assert "| 2 | 2 | 16 | 0.0315 | 507.40 | 5.07 | 253.7% (!) | cpu | 2 |" in markdown
    assert markdown.count("**Warning:**") == 2 and "warning: efficiency above 100%" in capsys.readouterr().out
    # another device is a mismatch too; alike runs warn of nothing
    gpu = write_run(tmp_path / "gpu_nodes2", 2, 180.0, threads=1)
    assert scaling.main(["--runs", runs[0], gpu, "--output_dir", str(tmp_path / "devices")]) == 0
    (warning,) = json.loads((tmp_path / "devices" / "scaling.json").read_text())["warnings"]
    assert f"differ in device ({runs[0]}: cpu, {gpu}: cuda)" in warning
    alike = write_run(tmp_path / "alike_nodes2", 2, 180.0, device="cpu", threads=1)
    assert scaling.main(["--runs", runs[0], alike, "--output_dir", str(tmp_path / "alike")]) == 0
    assert json.loads((tmp_path / "alike" / "scaling.json").read_text())["warnings"] == []


def test_local_jobs_with_more_threads_than_cores_are_flagged(tmp_path, monkeypatch):
    def job(args, processes):  # what the torchrun job would find, without running it
        seconds = 0.02 * processes**0.5
        return {
            "nodes": 1,
            "processes": processes,
            "batch_per_process": 8,
            "global_batch": 8 * processes,
            "seq_per_s": 8 * processes / seconds,
            "step_seconds": seconds,
            "step_seconds_cv": 0.02,
            "parameters": 1000,
            "threads": 1,
            "device_type": "cpu",
            "backend": "gloo",
        }

    monkeypatch.setattr(scaling, "run_job", job)
    monkeypatch.setattr(scaling, "available_cores", lambda: 2)
    assert (
        scaling.main(["--model", "tiny", "--processes", "1,2,4", "--device", "cpu", "--output_dir", str(tmp_path)]) == 0
    )
    warnings = json.loads((tmp_path / "scaling.json").read_text())["warnings"]
    assert [warning for warning in warnings if "more threads" in warning] == [
        "the 4-process job(s) ran more threads (processes x 1 per process) than the 2 core(s) available: the "
        "processes took turns on the cores, which is not the scaling of a machine with a core per thread"
    ]


def test_plots_name_the_setting_and_start_efficiency_at_zero(monkeypatch):
    drawn = {}
    monkeypatch.setattr(
        scaling,
        "line_plot",
        lambda series, xlabel, ylabel, title, **options: drawn.update({ylabel: (series, title, options)}),
    )
    rows = [
        {"processes": 1, "seq_per_s": 100.0, "seq_per_s_min": 90.0, "seq_per_s_max": 104.0, "efficiency": 1.0},
        {"processes": 2, "seq_per_s": 198.0, "seq_per_s_min": 180.0, "seq_per_s_max": 199.0, "efficiency": 0.99},
    ]
    scaling.plots({"model": "base", "seq": 128, "batch_per_process": 8, "rows": rows})
    series, title, options = drawn["efficiency"]
    assert title == "scaling efficiency: base, seq 128, 8 sequences per process" and options["y_from_zero"]
    series, title, _ = drawn["sequences / s"]
    assert title == "throughput: base, seq 128, 8 sequences per process"
    assert series["measured"] == ([1, 2], [100.0, 198.0], [90.0, 180.0], [104.0, 199.0])


def test_runs_that_differ_or_are_unfinished_are_refused(tmp_path, error_line):
    first = write_run(tmp_path / "a_nodes1", 4, 400.0)
    other = write_run(tmp_path / "b_nodes2", 8, 700.0, max_seq_length=512)
    assert scaling.main(["--runs", first, other, "--output_dir", str(tmp_path / "out")]) == 2
    assert "differ in batch per process, sequence length" in error_line()
    (tmp_path / "empty").mkdir()
    assert scaling.main(["--runs", first, str(tmp_path / "empty"), "--output_dir", str(tmp_path / "out")]) == 2
    assert error_line() == (
        f"bertbench bench scaling: error: {tmp_path / 'empty' / 'train_results.json'}: no such "
        "file (not a finished run directory)"
    )
    partial = write_run(tmp_path / "c", 2, None)
    assert scaling.main(["--runs", partial, "--output_dir", str(tmp_path / "out")]) == 2
    assert "missing key 'steady_sentences_per_second'" in error_line()
    assert not (tmp_path / "out").exists()


def test_report_lines_up_scaling_runs(tmp_path):
    for name, rates in (("cpu", (400.0, 700.0)), ("gpu", (4000.0, 7800.0))):
        runs = [write_run(tmp_path / name / f"r_nodes{nodes}", 4 * nodes, rate) for nodes, rate in zip((1, 2), rates)]
        assert scaling.main(["--runs", *runs, "--output_dir", str(tmp_path / f"{name}-bench")]) == 0
    assert (
        report.main(
            [str(tmp_path / "cpu-bench"), str(tmp_path / "gpu-bench"), "--output_dir", str(tmp_path / "report")]
        )
        == 0
    )
    merged = json.loads((tmp_path / "report" / "report.json").read_text())["comparisons"]["scaling"]
    two_nodes = next(row for row in merged["rows"] if row["nodes"] == 2)
    first, last = merged["runs"]
    assert two_nodes[f"efficiency@{first}"] == pytest.approx(0.875)
    assert two_nodes[f"efficiency@{last}"] == pytest.approx(0.975)
    assert two_nodes["efficiency:ratio"] == pytest.approx(0.975 / 0.875)
    assert (tmp_path / "report" / "report-scaling-efficiency.png").exists()
