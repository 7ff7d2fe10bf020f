import json

import pytest

from bertbench import cli as bertbench_cli
from bertbench.bench import plan, scaling
from bertbench.bench.results import BenchResult, Ratio, Row, Spread
from bertbench.common.noise import cv_text
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
    result = BenchResult.read(str(tmp_path / "scaling.json"))
    one, two = result.rows_measuring("seq_per_s")
    assert [row.get(key) for key in ("processes", "nodes") for row in (one, two)] == [1, 2, 1, 1]
    assert (one.get("global_batch"), two.get("global_batch")) == (16, 32)
    # the figures' arithmetic has its oracles below (canned jobs, a written log); here, that the jobs ran as asked
    assert one.get("speedup") == one.get("efficiency") == Ratio(1.0, None)
    assert two.median("speedup") > 0 and two.get("backend") == "gloo"
    for row in (one, two):  # the median step of the 6 after the excluded 2, with its spread over them
        step = row.get("step_seconds")
        assert row.get("timed_steps") == 6 and step.n == 6 and step.min <= step.median <= step.max
        assert row.value.min <= row.value.median <= row.value.max
        assert (row.get("threads"), row.get("device_type")) == (1, "cpu")
    sizes = result.rows_measuring("allreduce_seconds")
    context = result.context
    assert context["gradient_bytes"] == 4 * context["parameters"]
    assert {context["gradient_bytes"], 2**24} <= {row.get("size_bytes") for row in sizes}
    assert {row.get("processes") for row in sizes} == {2} and all(row.value.n == 2 for row in sizes)
    # the ring model is fitted to the times measured on the 2-process job
    assert (context["latency_seconds"], context["bus_bandwidth_bytes_per_s"]) == plan.fit_alpha_beta(
        [row.get("size_bytes") for row in sizes], [row.value.median for row in sizes], 2
    )
    markdown = (tmp_path / "scaling.md").read_text()
    assert "| 1 | 2 | 32 |" in markdown
    (exposed,) = result.rows_measuring("exposed_allreduce_seconds")
    with_it, without = exposed.get("step_with_allreduce_seconds"), exposed.get("step_without_allreduce_seconds")
    assert (
        f"{exposed.value.median * 1e3:.1f} ms exposed per DDP step (median of 2 interleaved "
        f"pairs: {with_it.median * 1e3:.1f} ms with, {without.median * 1e3:.1f} ms without; exposed per pair "
        f"{exposed.value.min * 1e3:.1f} to "
    ) in markdown
    sixteen = next(row.value.scaled(1e3) for row in sizes if row.get("size_bytes") == 2**24)
    assert f"| 16.000 | {sixteen.median:,.3f} ({sixteen.min:,.3f}–{sixteen.max:,.3f}, CV " in markdown
    assert plan.main(["--validate", str(tmp_path / "scaling.json"), "--output_dir", str(tmp_path / "plan")]) == 0
    checked = {row.get("processes"): row for row in BenchResult.read(str(tmp_path / "plan" / "plan.json")).rows}
    assert checked[2].get("measured_efficiency") == two.get("efficiency")
    assert checked[1].get("predicted_efficiency_no_overlap") == 1.0
    assert (tmp_path / "scaling-efficiency.png").exists() and (tmp_path / "scaling-throughput.png").exists()


def canned_job(processes: int, step_seconds: list[float], steady_seq_per_s: float) -> dict:
    """What a torchrun job of `processes` reports (run_job), with the Estimator's steady seq/s made different from
    the median step's, to tell which one speedup is of."""
    return {
        "nodes": 1,
        "processes": processes,
        "global_batch": 8 * processes,
        "step_seconds": step_seconds,
        "steady_seq_per_s": steady_seq_per_s,
        "timed_steps": len(step_seconds),
        "parameters": 1000,
        "backend": "gloo" if processes > 1 else None,
        "threads": 1,
        "device_type": "cpu",
    }


def test_speedup_and_efficiency_are_of_each_jobs_median_step(tmp_path, monkeypatch):
    jobs = {
        1: canned_job(1, [0.08, 0.08, 0.08], steady_seq_per_s=90.0),  # 100 seq/s
        2: canned_job(2, [16 / 150, 0.05, 0.2], steady_seq_per_s=190.0),  # 150 seq/s at the median step
    }
    monkeypatch.setattr(scaling, "run_job", lambda settings, processes: jobs[processes])
    assert scaling.main(["--model", "tiny", "--processes", "1,2", "--output_dir", str(tmp_path)]) == 0
    one, two = BenchResult.read(str(tmp_path / "scaling.json")).rows
    # 150 / 100 seq/s on twice the processes (the steady figures, 190 / 90, would give 2.11 and 106%)
    assert (one.get("speedup"), one.get("efficiency")) == (Ratio(1.0, None), Ratio(1.0, None))
    assert (two.median("speedup"), two.median("efficiency")) == pytest.approx((1.5, 0.75))
    # the second job's steps vary (CV 67% of its seq/s): its ratios say so, the reference's do not
    assert two.get("efficiency").inputs_cv == pytest.approx(two.value.cv) and two.get("efficiency").noisy
    markdown = (tmp_path / "scaling.md").read_text()
    assert (
        f"| 1 | 2 | 16 | 0.1067 (0.0500–0.2000, CV {cv_text(two.get('step_seconds').cv)}) | 150.00 | 1.50x (noisy"
        in markdown
    )
    assert f"| 75.0% (noisy: inputs' CV {cv_text(two.value.cv)}) |" in markdown and "A ratio marked noisy" in markdown


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
    rows = BenchResult.read(str(tmp_path / "out" / "scaling.json")).rows
    assert [(row.get("nodes"), row.get("processes"), row.get("global_batch")) for row in rows] == [
        (1, 4, 32),
        (2, 8, 64),
        (4, 16, 128),
    ]
    assert [row.median("speedup") for row in rows] == pytest.approx([1.0, 1.75, 3.0])
    assert [row.median("efficiency") for row in rows] == pytest.approx([1.0, 0.875, 0.75])
    assert rows[1].median("step_seconds") == pytest.approx(64 / 700)
    assert {(row.get("model"), row.get("seq"), row.get("batch_per_process")) for row in rows} == {("runs", 128, 8)}


def test_runs_with_other_threads_or_devices_and_superlinear_efficiency_are_flagged(tmp_path, capsys):
    runs = [
        write_run(tmp_path / "cpu_nodes1", 1, 100.0, device="cpu", threads=1),
        write_run(tmp_path / "cpu_nodes2", 2, 507.4, device="cpu", threads=2, nodes=2),
    ]
    assert scaling.main(["--runs", *runs, "--output_dir", str(tmp_path / "out")]) == 0
    result = BenchResult.read(str(tmp_path / "out" / "scaling.json"))
    assert result.rows[1].median("efficiency") == pytest.approx(2.537)
    mismatch, superlinear = result.warnings
    assert mismatch.startswith(
        f"the compared runs are not alike: they differ in threads per process ({runs[0]}: 1, "
        f"{runs[1]}: 2), so speedup and efficiency"
    )
    assert superlinear.startswith(f"efficiency above 100% (253.7% at 2 processes, {runs[1]}, marked (!))")
    markdown = (tmp_path / "out" / "scaling.md").read_text()
    assert "| 2 | 2 | 16 | 0.0315 | 507.40 | 5.07x | 253.7% (!) | cpu | 2 |" in markdown
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
    def job(settings, processes):  # what the torchrun job would find, without running it
        return canned_job(processes, [0.02 * processes**0.5] * 3, 100.0)

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
        Row(
            "seq_per_s",
            "seq/s",
            {"processes": 1},
            Spread(100.0, 90.0, 104.0, 0.05, 5),
            {"efficiency": Ratio(1.0, None)},
        ),
        Row(
            "seq_per_s",
            "seq/s",
            {"processes": 2},
            Spread(198.0, 180.0, 199.0, 0.04, 5),
            {"efficiency": Ratio(0.99, 0.05)},
        ),
        Row("allreduce_seconds", "s", {"processes": 2, "size_bytes": 4096}, Spread.exact(1e-3)),  # not plotted
    ]
    scaling.plots(rows, {"model": "base", "seq": 128, "batch_per_process": 8})
    series, title, options = drawn["efficiency"]
    assert title == "scaling efficiency: base, seq 128, 8 sequences per process" and options["y_from_zero"]
    assert series["measured"] == ([1, 2], [1.0, 0.99])
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
