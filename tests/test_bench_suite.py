"""`bertbench bench suite`: the parts it builds as the benches' settings, the headline rows it reads from their
results (a pure function of results.BenchResult), what it prints (a screen, each warning once), the targets, what it
does when a part fails, and the input it refuses before running anything; one real run of its cheapest parts, read
back by `bertbench report`. Plus throughput's `+compile` variants, which its compile part times."""

import contextlib
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import snapshot
from matplotlib.colors import to_hex

from bertbench import cli
from bertbench.bench import plots, report, suite, throughput, workload
from bertbench.bench.results import BenchResult, Ratio, Row, Spread
from bertbench.bench.settings import parse
from bertbench.training import devices

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def timed(median, cv=0.02, n=5):
    """A figure timed `n` times, its spread `cv`."""
    return Spread(median, 0.98 * median, 1.02 * median, cv, n)


SPREAD_COLUMNS = ("mfu", "step_seconds", "real_tokens_per_s")  # throughput's timed columns


def throughput_row(variant, seq=128, batch=8, seq_per_s=None, **columns):
    kind = "finetuning" if "real_tokens_per_s" in columns else "pretraining"
    setting = dict(model="mini", kind=kind, seq=seq, precision="fp32", lengths="full", batch=batch, variant=variant)
    value = timed(seq_per_s) if seq_per_s else timed(100.0)
    columns = {key: timed(item) if key in SPREAD_COLUMNS else item for key, item in columns.items()}
    return Row("seq_per_s", "seq/s", setting, value, columns)


def result(bench, rows, warnings=()):
    return BenchResult(bench, {}, tuple(rows), {}, tuple(warnings))


def largest(variant, max_batch, at_max):
    setting = dict(model="mini", kind="pretraining", precision="fp32", seq=512, variant=variant)
    return Row("max_batch", "sequences", setting, Spread.exact(max_batch), {"seq_per_s_at_max_batch": timed(at_max)})


def optimizer_row(name, form, step_ms, floor_ms):
    columns = {"floor_ms": floor_ms, "ratio_to_floor": Ratio.of(timed(step_ms), floor_ms)}
    return Row("step_ms", "ms", {"optimizer": name, "rule": name.split(":")[0], "form": form}, timed(step_ms), columns)


# The parts' results (only what the suite reads), with round numbers whose ratios are known.
RESULTS = {
    "phase1": result(
        "throughput",
        [
            throughput_row("baseline", 128, 256, 1500.0, mfu=0.55),
            throughput_row("hf", 128, 256, 1000.0, mfu=0.40),
            throughput_row("baseline", 128, 64, 900.0, mfu=0.30),
            Row("seq_per_s", "seq/s", {"seq": 128, "batch": 64, "variant": "hf"}, None, {}, "out of memory"),
        ],
        ["noisy step times"],
    ),
    "phase2": result(
        "throughput",
        [
            throughput_row("baseline", 512, 32, 320.0, step_seconds=0.10, saved_bytes=1000, mfu=0.45),
            throughput_row("full", 512, 32, 256.0, step_seconds=0.125, saved_bytes=100),
            throughput_row("selective", 512, 32, 266.0, step_seconds=0.12, saved_bytes=600),
            throughput_row("hf", 512, 32, 200.0, mfu=0.3),
        ],
        ["noisy step times"],
    ),
    "largest-batch": result(
        "memory", [largest("baseline", 64, 300.0), largest("full", 400, 330.0), largest("selective", 100, 270.0)]
    ),
    "finetuning": result(
        "throughput",
        [
            throughput_row("baseline", batch=32, real_tokens_per_s=200_000.0, path="unpadded/varlen"),
            throughput_row("baseline/padded", batch=32, real_tokens_per_s=100_000.0),
            throughput_row("hf", batch=32, real_tokens_per_s=80_000.0),
            throughput_row("hf-dynamic", batch=32, real_tokens_per_s=160_000.0),
        ],
    ),
    "compile": result(
        "throughput",
        [
            throughput_row("baseline", 128, 256, 1000.0),
            throughput_row("baseline+compile", 128, 256, 1250.0, compile_seconds=42.0),
        ],
    ),
    "optimizer": result(
        "optimizer", [optimizer_row("lamb:fused", "fused", 3.0, 2.0), optimizer_row("lamb:eager", "eager", 9.0, 2.0)]
    ),
}


def by(rows, **setting):
    (row,) = [row for row in rows if all(row.get(key) == value for key, value in setting.items())]
    return row


def test_headline_rows_pair_each_figure_with_what_it_is_compared_with():
    rows = suite.headlines(RESULTS, with_targets=False)
    assert by(rows, part="phase1", batch=256).median("vs_hf") == pytest.approx(1.5)
    pretraining = [row for row in rows if row.measured == "seq_per_s" and row.get("kind") == "pretraining"]
    assert by(pretraining, part="phase2").median("vs_hf") == pytest.approx(1.6)
    assert by(pretraining, part="phase1", batch=64).get("vs_hf") is None  # HF ran out of memory
    above_peak = dict(RESULTS, phase1=result("throughput", [throughput_row("baseline", 128, 8, 100.0, mfu=1.38)]))
    assert by(suite.headlines(above_peak, False), part="phase1").get("mfu") is None  # cannot be right: no headline
    recompute = [row for row in rows if row.measured == "step_seconds"]
    assert by(recompute, variant="full").median("slowdown") == pytest.approx(1.25)
    assert by(recompute, variant="full").median("saved_vs_baseline") == pytest.approx(0.1)
    assert by(recompute, variant="selective").median("saved_vs_baseline") == pytest.approx(0.6)
    assert by(recompute, variant="baseline").get("slowdown") is None  # no ratio of the baseline to itself
    searched = [row for row in rows if row.measured == "max_batch"]
    assert by(searched, variant="full").median("at_max_vs_baseline") == pytest.approx(1.1)
    assert by(searched, variant="selective").median() == 100
    assert not [row for row in rows if row.get("variant") == "every-2"]  # measured by neither part
    finetuning = by(rows, part="finetuning")
    assert [finetuning.median(key) for key in ("vs_padded", "vs_hf", "vs_hf_dynamic")] == pytest.approx([2, 2.5, 1.25])
    compiled = by(rows, part="compile")
    assert compiled.median("vs_eager") == pytest.approx(1.25) and compiled.get("compile_seconds") == 42.0
    assert all(isinstance(row.get(key), Ratio) for row in rows for key in ("vs_hf", "slowdown") if row.get(key))


def test_a_noisy_ratio_is_marked_and_too_few_repeats_make_no_headline():
    noisy = dict(RESULTS)
    noisy["largest-batch"] = result(
        "memory",
        [
            largest("baseline", 5, 8.5),
            Row(
                "max_batch",
                "sequences",
                {"seq": 512, "variant": "selective"},
                Spread.exact(5),
                {"seq_per_s_at_max_batch": Spread(6.4, 0.71, 4.62 * 2, 1.09, 3)},
            ),
        ],
    )
    noisy["compile"] = result(
        "throughput",
        [throughput_row("baseline", 128, 256, 1000.0), throughput_row("baseline+compile", 128, 256, 1250.0)],
    )
    noisy["compile"] = with_value(noisy["compile"], "baseline+compile", timed(1250.0, n=2))
    rows = suite.headlines(noisy, with_targets=False)
    selective = by(rows, part="largest-batch", variant="selective")
    assert selective.get("at_max_vs_baseline").noisy
    line = suite.summary_line(selective)
    assert "seq/s vs baseline's 0.75x (noisy: inputs' CV 109%)" in line
    markdown = suite.markdown("small", "cpu", [], rows, [])
    assert "| 0.75x (noisy: inputs' CV 109%) |" in markdown and "A ratio marked noisy" in markdown
    assert not [row for row in rows if row.get("part") == "compile"]  # its compiled seq/s was timed twice


def with_value(bench_result, variant, value):
    rows = [
        dataclasses.replace(row, value=value) if row.get("variant") == variant else row for row in bench_result.rows
    ]
    return dataclasses.replace(bench_result, rows=tuple(rows))


def test_targets_say_which_hold():
    rows = suite.headlines(RESULTS, with_targets=True)
    texts = {
        (row.get("part"), row.get("variant") or row.get("optimizer"), row.get("batch"), key): suite.target_text(
            row, key
        )
        for row in rows
        for key in ("mfu", "vs_hf_dynamic", "vs_padded", "slowdown", "at_max_vs_baseline", "ratio_to_floor")
        if suite.target_text(row, key)
    }
    assert texts[("phase1", "baseline", 256, "mfu")] == " (target >= 0.5: met)"  # 55%
    assert texts[("phase2", "baseline", 32, "mfu")] == " (target >= 0.5: NOT met)"  # 45%
    assert ("phase1", "baseline", 64, "mfu") not in texts  # the targets name batch 256 and 32
    assert texts[("finetuning", "baseline", 32, "vs_hf_dynamic")] == " (target >= 1.6: NOT met)"  # 1.25
    assert texts[("finetuning", "baseline", 32, "vs_padded")] == " (target >= 1.5: met)"  # 2.0
    assert texts[("phase2", "full", 32, "slowdown")] == " (target <= 1.3: met)"  # 1.25
    assert texts[("phase2", "selective", 32, "slowdown")] == " (target <= 1.1: NOT met)"  # 1.20
    assert texts[("largest-batch", "full", None, "at_max_vs_baseline")] == " (target >= 1: met)"
    assert texts[("largest-batch", "selective", None, "at_max_vs_baseline")] == " (target >= 1: NOT met)"
    assert texts[("optimizer", "lamb:fused", None, "ratio_to_floor")] == " (target <= 1.5: met)"  # 1.5
    assert ("optimizer", "lamb:eager", None, "ratio_to_floor") not in texts  # a GPU steps in the fused form
    assert not any(suite.target_text(row, "mfu") for row in suite.headlines(RESULTS, with_targets=False))


def test_what_is_printed_is_a_screen_with_each_warning_once():
    rows = suite.headlines(RESULTS, with_targets=False)
    warnings = suite.part_warnings(RESULTS)
    assert warnings == ["phase1, phase2: noisy step times"]  # once, naming the parts that gave it
    ran = [{"name": name, "wall_seconds": 10.0, "exit_status": 0} for name in RESULTS]
    lines = suite.printed_summary("small", "cpu", ran, rows, warnings, ["a note"], "out/suite.md")
    assert len(lines) <= suite.MAX_PRINTED_LINES
    assert lines[0] == "suite: small on cpu, 6 part(s) in 60 s"
    assert lines[-3:] == [
        "note: a note",
        "warning: noisy step times (phase1, phase2; in full in suite.md)",
        "report: out/suite.md",
    ]
    assert "  phase1 baseline (seq 128, batch 256): 1,500 seq/s (CV 2.0%), MFU 55.0%; vs HF 1.50x" in lines
    busy = [
        f"{part}: the machine was busy: the load average was {load}" for part, load in (("phase1", 5), ("optimizer", 7))
    ]
    assert suite.warnings_by_kind(busy) == ["the machine was busy (phase1, optimizer; in full in suite.md)"]
    many = suite.printed_summary("small", "cpu", ran, rows * 5, warnings, [], "out/suite.md")
    assert len(many) == suite.MAX_PRINTED_LINES and many[-3] == f"  ... {len(rows) * 5 - 20} more in out/suite.md"
    flooded = suite.printed_summary(
        "small", "cpu", ran, rows, [f"a: warning {n}" for n in range(40)], [], "out/suite.md"
    )
    assert len(flooded) == suite.MAX_PRINTED_LINES and flooded[-1] == "report: out/suite.md"
    assert flooded[-2] == "  ... 19 more in out/suite.md"  # 21 warnings fit, and the report's path


def test_parts_are_the_benches_settings_and_follow_the_size(tmp_path):
    standard = {
        part.name: part for part in suite.parts(suite.SCALES["standard"], torch.device("cuda"), True, str(tmp_path))
    }
    assert list(standard) == list(suite.PART_NAMES)
    phase1 = standard["phase1"].settings
    assert isinstance(phase1, throughput.ThroughputSettings)
    assert (phase1.model, phase1.precisions, phase1.optimizer, phase1.batch_sizes, phase1.variants) == (
        "large",
        ("bf16",),
        "lamb",
        (64, 256),
        ("baseline", "hf"),
    )
    assert standard["compile"].settings.variants == ("baseline", "baseline+compile")
    assert standard["finetuning"].settings.lengths == "real-text"
    for part in standard.values():  # each part's command line parses back to its settings
        command = part.command()
        assert command[:5] == [sys.executable, "-m", "bertbench", "bench", part.bench]
        assert parse(type(part.settings), command[5:], "") == part.settings
        assert part.settings.directory == str(tmp_path / part.name)
    small = suite.parts(suite.SCALES["small"], torch.device("cpu"), False, str(tmp_path))
    for part in small:  # mini and tiny, fp32 on a CPU, no HF without transformers
        flags = part.command()
        assert part.settings.model in ("mini", "tiny") and not [
            flag for flag in flags if "bf16" in flag or "hf" in flag
        ]


def test_compile_is_left_out_on_a_cpu_at_the_small_size_unless_named(tmp_path):
    settings = suite.SuiteSettings(output_dir=str(tmp_path))
    size, chosen, notes = suite.plan(settings, torch.device("cpu"))
    assert size == "small" and "compile" not in [part.name for part in chosen]
    assert any("run it with --parts compile" in note for note in notes)
    named = suite.SuiteSettings(output_dir=str(tmp_path), parts=("compile",))
    if not suite.compile_unavailable(torch.device("cpu")):
        assert [part.name for part in suite.plan(named, torch.device("cpu"))[1]] == ["compile"]


def test_on_a_cpu_with_a_bf16_unit_fine_tuning_runs_bf16_beside_fp32_and_says_why_not_elsewhere(tmp_path, monkeypatch):
    settings = suite.SuiteSettings(output_dir=str(tmp_path))
    monkeypatch.setattr(devices, "cpu_features", lambda: ("Intel Xeon", {"avx512_f", "amx_tile", "amx_bf16"}))
    _, chosen, notes = suite.plan(settings, torch.device("cpu"))
    finetuning = next(part for part in chosen if part.name == "finetuning")
    assert finetuning.settings.precisions == ("fp32", "bf16") and "fp32 and bf16" in finetuning.what
    assert {part.settings.precisions for part in chosen if part.name in ("phase1", "phase2")} == {("fp32",)}
    assert not [note for note in notes if "bf16" in note]
    monkeypatch.setattr(devices, "cpu_features", lambda: ("AMD EPYC", {"avx", "avx2"}))
    _, chosen, notes = suite.plan(settings, torch.device("cpu"))
    assert next(part for part in chosen if part.name == "finetuning").settings.precisions == ("fp32",)
    assert "fine-tuning in fp32 only: this CPU (AMD EPYC: AVX2) has no bf16 matmul unit" in " ".join(notes)
    # the headlines: a row per precision, bf16's against fp32's
    rows = []
    for precision, tokens in (("fp32", 100_000.0), ("bf16", 250_000.0)):
        for variant, share in (("baseline", 1.0), ("baseline/padded", 0.5)):
            row = throughput_row(variant, batch=32, real_tokens_per_s=tokens * share, path="unpadded/auto")
            rows.append(dataclasses.replace(row, setting={**row.setting, "precision": precision}))
    headlines = suite.headlines(dict(RESULTS, finetuning=result("throughput", rows)), with_targets=False)
    finetuning = {row.get("precision"): row for row in headlines if row.get("part") == "finetuning"}
    assert finetuning["bf16"].median("vs_fp32") == pytest.approx(2.5) and finetuning["fp32"].get("vs_fp32") is None
    assert finetuning["bf16"].median("vs_padded") == pytest.approx(2.0)
    assert "finetuning baseline (seq 128, batch 32, bf16)" in suite.summary_line(finetuning["bf16"])
    assert "vs fp32 2.50" in suite.summary_line(finetuning["bf16"])


def fake_run_part(results, failing=()):
    """run_part as the suite calls it, writing `results` as the parts would, and failing the parts in `failing`."""

    def run(part):
        directory = part.settings.directory
        status = 1 if part.name in failing else 0
        if not status:
            os.makedirs(directory, exist_ok=True)
            with open(f"{directory}/{part.bench}.json", "w") as handle:
                json.dump(results[part.name].to_json(), handle)
        return {
            "name": part.name,
            "bench": part.bench,
            "what": part.what,
            "command": " ".join(part.command()),
            "wall_seconds": 1.0,
            "exit_status": status,
            "report": f"{part.name}/{part.bench}.json",
            **({"error": "error: CUDA out of memory"} if status else {}),
        }

    return run


def test_a_failed_part_is_reported_and_the_suite_exits_1_after_writing_the_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(suite, "run_part", fake_run_part(RESULTS, failing={"phase2"}))
    out = tmp_path / "suite"
    assert suite.main(["--device", "cpu", "--size", "standard", "--output_dir", str(out)]) == 1
    printed = capsys.readouterr()
    assert (
        printed.err.strip()
        .splitlines()[-1]
        .startswith("bertbench bench suite: error: 1 part(s) failed: phase2: error: CUDA out of memory")
    )
    assert len(printed.out.strip().splitlines()) <= 25  # the running line and the summary
    assert printed.out.count("noisy step times") == 1
    written = BenchResult.read(str(out / "suite.json"))
    assert [part["name"] for part in written.context["parts"]] == list(suite.PART_NAMES)
    assert not [row for row in written.rows if row.measured == "step_seconds"]  # phase 2 failed
    assert [row.get("variant") for row in written.rows if row.measured == "max_batch"] == [
        "baseline",
        "full",
        "selective",
    ]
    assert written.warnings == ("phase1: noisy step times",)
    assert not any(key.startswith("target_") for row in written.rows for key in row.columns)  # targets are a GPU's
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
    monkeypatch.setattr(suite, "run_part", fake_run_part(RESULTS))
    out = tmp_path / "suite"
    (out / "optimizer").mkdir(parents=True)
    (out / "optimizer" / "optimizer.json").write_text("{}")
    before = snapshot(out)
    assert suite.main(["--device", "cpu", "--parts", "optimizer", "--output_dir", str(out)]) == 2
    assert "optimizer.json exists: choose another --output_dir or pass --overwrite" in error_line()
    assert snapshot(out) == before
    assert suite.main(["--device", "cpu", "--parts", "optimizer", "--output_dir", str(out), "--overwrite"]) == 0


def test_run_part_keeps_the_output_in_its_log_and_names_the_error(tmp_path, monkeypatch, capsys):
    part = suite.Part("broken", "a part that fails", suite.SuiteSettings(output_dir=str(tmp_path / "broken")))
    script = "print('step 1'); import sys; sys.exit('error: no such file x.json')"
    monkeypatch.setattr(suite.Part, "command", lambda self: [sys.executable, "-c", script])
    ran = suite.run_part(part)
    assert ran["exit_status"] == 1 and ran["error"] == "error: no such file x.json"
    log = (tmp_path / "broken" / "output.log").read_text()
    assert "step 1" in log and "error: no such file x.json" in log
    assert capsys.readouterr().out == ""  # kept, not printed


def test_a_recompute_plot_draws_each_series_in_its_own_colour_and_marker():
    figure = plots.bar_plot(
        {
            "step time": {"full": 1.3, "selective": 0.97},
            "saved vs baseline": {"full": 0.14},
            "seq/s": {"full": Ratio(0.75, 1.09)},
        },
        "ratio",
        "t",
        (1.0, "baseline = 1"),
    )
    axes = figure.axes[0]
    colours = [to_hex(container.patches[0].get_facecolor()) for container in axes.containers]
    assert len(set(colours)) == 3  # not the baseline's blue thrice
    assert [text.get_text() for text in axes.texts] == ["1.30", "0.97", "0.14", "0.75\nnoisy"]  # marked as printed
    legend = axes.get_legend()
    assert [text.get_text() for text in legend.get_texts()] == [
        "baseline = 1",
        "step time",
        "saved vs baseline",
        "seq/s",
    ]
    assert legend.get_bbox_to_anchor().x0 > axes.get_window_extent().x1 - 1  # right of the axes: over no bar
    lines = plots.line_plot({"baseline": ([1, 2], [1, 2]), "run B: baseline": ([1, 2], [2, 3])}, "x", "y", "t")
    drawn = [(line.get_color(), line.get_marker()) for line in lines.axes[0].get_lines()]
    assert len(set(color for color, _ in drawn)) == 2 and len(set(marker for _, marker in drawn)) == 2


@pytest.mark.slow
def test_a_suite_of_its_cheapest_parts_runs_and_report_reads_it(tmp_path, capsys, monkeypatch):
    # The small size's parts on the tiny model, at batches 2 and 4, without HF's contenders (its import and steps
    # were half the run): the parts still run as the suite's processes and are read back as at any size. The HF
    # comparisons are test_headline_rows_pair_each_figure_with_what_it_is_compared_with's, HF's contenders
    # test_bench_throughput's.
    every_part = suite.parts

    def cheapest_parts(scale, device, with_hf, *rest):
        return every_part(dataclasses.replace(scale, large="tiny", finetuning_batches=(2, 4)), device, False, *rest)

    monkeypatch.setattr(suite, "parts", cheapest_parts)
    start = subprocess.run

    def optimizer_in_process(command, **options):
        """The optimizer part's command line run by this process (its imports are this process's already), its output
        into its log; the finetuning part's a process, as the suite starts its parts."""
        if command[3:5] != ["bench", "optimizer"]:
            return start(command, **options)
        with contextlib.redirect_stdout(options["stdout"]), contextlib.redirect_stderr(options["stdout"]):
            return subprocess.CompletedProcess(command, cli.main(command[3:]))

    monkeypatch.setattr(suite.subprocess, "run", optimizer_in_process)
    out = tmp_path / "suite"
    flags = ["--device", "cpu", "--parts", "finetuning,optimizer", "--steps", "3", "--warmup", "0"]
    assert suite.main([*flags, "--output_dir", str(out)]) == 0
    written = BenchResult.read(str(out / "suite.json"))
    assert [part["exit_status"] for part in written.context["parts"]] == [0, 0]
    assert written.context["parts"][0]["command"].startswith("bertbench bench throughput --output_dir=")
    assert (out / "finetuning" / "throughput.json").exists() and (out / "finetuning" / "output.log").exists()
    finetuning = [row for row in written.rows if row.get("part") == "finetuning"]
    assert [row.get("batch") for row in finetuning] == [2, 4]  # a headline row for each batch
    assert all(row.median() > 0 and row.median("vs_padded") > 0 for row in finetuning)
    assert [row.get("optimizer") for row in written.rows if row.get("part") == "optimizer"]
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) <= 25 and printed[-1] == f"report: {out / 'suite.md'}"
    assert report.main([str(out), "--output_dir", str(tmp_path / "r")]) == 0  # the suite and both parts' benches
    compared = BenchResult.read(str(tmp_path / "r" / "report.json")).context["comparisons"]
    assert {title.split(":")[0] for title in compared} == {"suite", "throughput", "optimizer"}


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
    # a peak instead of measuring it (1.5 CPU-seconds): the test reads the compile's figures, not MFU
    monkeypatch.setattr(throughput, "device_peaks", lambda precisions, device: dict.fromkeys(precisions, (1e15, "x")))
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
    rows = {row.get("variant"): row for row in BenchResult.read(str(tmp_path / "throughput.json")).rows}
    assert rows["baseline"].get("compile_seconds") is None and rows["baseline"].get("first_step_seconds") > 0
    compiled = rows["baseline+compile"]
    assert 0 <= compiled.get("compile_seconds") < compiled.get("first_step_seconds")
    assert "| compile (s) |" in (tmp_path / "throughput.md").read_text()


@pytest.mark.gpu
def test_gpu_small_suite_runs_every_part_on_cuda(tmp_path):
    out = tmp_path / "suite"
    flags = ["--device", "cuda:0", "--size", "small", "--steps", "3", "--warmup", "1", "--output_dir", str(out)]
    assert suite.main(flags) == 0
    written = BenchResult.read(str(out / "suite.json"))
    assert all(part["exit_status"] == 0 for part in written.context["parts"])
    assert len(written.context["parts"]) == len(suite.PART_NAMES)  # compile runs on a GPU
    searched = [row for row in written.rows if row.measured == "max_batch"]
    assert {row.get("variant") for row in searched} == set(suite.RECOMPUTE_VARIANTS)
    assert all(row.median() > 0 for row in searched)
    assert {row.get("part") for row in written.rows} >= {"phase1", "phase2", "finetuning", "optimizer"}
