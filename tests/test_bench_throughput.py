import dataclasses
import importlib.util
import pathlib
import shutil

import pytest
import torch

from bertbench import cli as bertbench_cli
from bertbench.bench import settings, throughput, workload
from bertbench.bench.results import BenchResult, Ratio, Spread
from bertbench.common import noise
from bertbench.model import flops
from bertbench.tasks import synthetic
from bertbench.training import devices
from bertbench.training.config import TrainConfig
from bertbench.training.step import TrainStep

TINY = ["--model", "tiny", "--seq_lengths", "32", "--batch_sizes", "2,4", "--warmup", "1", "--steps", "2"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SETTING_KEYS = {"model", "kind", "seq", "precision", "lengths", "batch", "variant"}
SPREAD_COLUMNS = ("step_seconds", "tokens_per_s", "real_tokens_per_s", "tflops", "mfu")


def read(directory) -> BenchResult:
    """The result a run wrote into `directory`, read back as every reader of bench results reads it."""
    return BenchResult.read(str(directory / "throughput.json"))


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("throughput")
    measure_peak = throughput.measure.matmul_flops_per_second
    with pytest.MonkeyPatch.context() as patch:
        # the peak measured as the bench measures it, on matrices of 512 x 512 instead of 2048 (1.3 CPU-seconds)
        patch.setattr(throughput.measure, "matmul_flops_per_second", lambda size, *args: measure_peak(512, *args))
        assert (
            throughput.main(
                TINY
                + ["--kinds", "pretraining,finetuning", "--variants", "baseline,full,every-2", "--output_dir", str(out)]
            )
            == 0
        )
    return out, read(out)


@pytest.mark.slow
def test_a_row_for_every_setting_in_the_result_schema(swept):
    _, result = swept
    rows = result.rows
    assert {(row.measured, row.unit, row.status) for row in rows} == {("seq_per_s", "seq/s", "measured")}
    assert {frozenset(row.setting) for row in rows} == {frozenset(SETTING_KEYS)}
    settings = {(row.get("kind"), row.get("variant"), row.get("batch")) for row in rows}
    assert len(rows) == len(settings) == 2 * 3 * 2
    assert {(row.get("model"), row.get("seq"), row.get("precision"), row.get("lengths")) for row in rows} == {
        ("tiny", 32, "fp32", "full")
    }
    assert set(result.context) == {"device", "peaks", "training_step", "lengths"}
    assert result.context["peaks"]["fp32"]["source"] == "measured fp32 matmul on cpu"
    assert result.context["peaks"]["fp32"]["flops_per_s"] > 0
    assert result.settings["batch_sizes"] == [2, 4] and result.settings["seed"] == 0
    for row in rows:  # the figures' arithmetic: test_figures_from_a_clock_of_known_step_times
        assert row.get("timed_steps") == 2 and row.get("memory_kind") == "process RSS"
        for key in ("seq_per_s", *SPREAD_COLUMNS):
            spread = row.get(key)
            assert isinstance(spread, Spread) and spread.n == 2 and spread.cv is not None
            assert 0 < spread.min <= spread.median <= spread.max
        assert isinstance(row.get("speed_vs_first_variant"), Ratio)
        assert row.get("path") == "unpadded/auto" and row.get("padding_share") == 0
        for key in ("saved_bytes", "peak_memory_bytes", "step_memory_bytes", "first_step_seconds"):
            assert row.get(key) > 0


def test_recompute_saves_fewer_bytes_and_bytes_grow_with_the_batch(swept):
    _, result = swept
    saved = {(row.get("kind"), row.get("variant"), row.get("batch")): row.get("saved_bytes") for row in result.rows}
    for kind in ("pretraining", "finetuning"):
        for batch in (2, 4):
            assert saved[kind, "full", batch] < saved[kind, "every-2", batch] < saved[kind, "baseline", batch]
        assert saved[kind, "baseline", 4] > saved[kind, "baseline", 2]


def test_json_markdown_and_plots_are_written(swept):
    out, result = swept
    assert result.bench == "throughput" and result.machine["cpu_count"] >= 1
    assert result.versions["torch"] == torch.__version__ and result.command.startswith("bertbench bench thr")
    markdown = (out / "throughput.md").read_text()
    row = next(
        row
        for row in result.rows
        if (row.get("kind"), row.get("variant"), row.get("batch")) == ("pretraining", "every-2", 4)
    )
    assert (
        f"| pretraining | 32 | fp32 | every-2 | 4 | {row.value.text('.2f')} | {row.median('step_seconds'):.4f} | "
        f"{row.get('speed_vs_first_variant').text('.3f')} | "
    ) in markdown
    assert "MFU above 100%" not in markdown  # a tiny model is far below the peak
    for name in ("pretraining-seq32-fp32", "finetuning-seq32-fp32-memory"):
        assert (out / f"throughput-{name}.png").read_bytes().startswith(PNG_SIGNATURE)


def test_results_are_never_overwritten_by_accident(swept, error_line):
    out, _ = swept
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert throughput.main(TINY + ["--output_dir", str(out)]) == 2
    assert error_line() == (
        f"bertbench bench throughput: error: {out / 'throughput.json'} exists: choose another "
        "--output_dir or pass --overwrite"
    )
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def test_overwrite_replaces_the_files(swept, tmp_path, monkeypatch):
    # the sweep's 12 rows, with their saved bytes, replaced by one row without them (--no_memory)
    shutil.copytree(swept[0], tmp_path, dirs_exist_ok=True)
    unreachable_peak(monkeypatch)
    args = TINY + ["--kinds", "finetuning", "--variants", "baseline", "--batch_sizes", "2", "--no_memory"]
    assert throughput.main(args + ["--output_dir", str(tmp_path), "--overwrite"]) == 0
    (row,) = read(tmp_path).rows
    assert "saved_bytes" not in row.columns
    assert "| pretraining |" not in (tmp_path / "throughput.md").read_text()


def count_calls(monkeypatch, cls, name):
    """Wrap cls.name so that every call is counted (with the instance it ran on)."""
    calls = []
    original = getattr(cls, name)

    def counted(self, *args, **kwargs):
        calls.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, counted)
    return calls


def test_the_bench_times_the_training_step_with_its_recipe(tmp_path, monkeypatch):
    unreachable_peak(monkeypatch)
    steps = count_calls(monkeypatch, TrainStep, "__call__")
    micro_batches = count_calls(monkeypatch, TrainStep, "forward_loss")
    assert (
        throughput.main(
            TINY
            + [
                "--kinds",
                "finetuning",
                "--variants",
                "baseline",
                "--batch_sizes",
                "2",
                "--gradient_accumulation_steps",
                "3",
                "--optimizer",
                "lamb",
                "--max_grad_norm",
                "0.5",
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    # 1 warm-up + 2 timed steps + the memory step, each of 3 micro-batches; the saved-bytes count runs one more
    # forward through the same step.
    assert len(steps) == 4 and len(micro_batches) == 4 * 3 + 1
    config = steps[0].config
    assert (config.optimizer, config.gradient_accumulation_steps, config.max_grad_norm) == ("lamb", 3, 0.5)
    assert type(steps[0].optimizer).__name__ == "Lamb"
    assert read(tmp_path).rows[0].get("sequences_per_step") == 6


def counted_finetuning_flops(batch: int, seq: int) -> int:
    """FLOPs of a tiny fine-tuning step's forward and backward, counted by PyTorch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    config = workload.bert_config("tiny", seq)
    model = workload.build(config, "finetuning", workload.Variant.parse("baseline"))
    with FlopCounterMode(display=False) as counter:
        model(**synthetic.synthetic_batch(config, "finetuning", batch, seq)).loss.backward()
    return sum(counter.get_flop_counts()["Global"].values())


def test_figures_from_a_clock_of_known_step_times(tmp_path, monkeypatch):
    """Baseline steps of 0.5, 0.25 and 1 s (full recompute's twice as long) against a peak of 1 TFLOP/s: every
    figure of the row by hand; the steps vary by CV 65%, so the ratio between the variants is marked noisy."""
    from bertbench.bench import measure

    clock = {"baseline": [0.5, 0.25, 1.0], "full": [1.0, 0.5, 2.0]}
    monkeypatch.setattr(
        measure,
        "time_steps",
        lambda steps, warmup, repeats, device, host_seconds=None: {name: clock[name] for name in steps},
    )
    monkeypatch.setattr(
        throughput,
        "device_peaks",
        lambda precisions, device: {precision: (1e12, "a data sheet") for precision in precisions},
    )
    assert throughput.main([*QUICK, "--variants", "baseline,full", "--steps", "3", "--output_dir", str(tmp_path)]) == 0
    row, full = read(tmp_path).rows
    step = row.get("step_seconds")
    assert (step.median, step.min, step.max, step.n) == (0.5, 0.25, 1.0, 3)
    assert step.cv == pytest.approx(0.654654, rel=1e-5)  # stdev 0.381881 / mean 0.583333
    assert (row.value.median, row.value.min, row.value.max) == (4.0, 2.0, 8.0)  # 2 sequences a step
    tokens = row.get("tokens_per_s")
    assert (tokens.median, tokens.min, tokens.max) == (128.0, 64.0, 256.0)
    flops_per_step = counted_finetuning_flops(2, 32)
    assert row.get("model_flops_per_step") == flops_per_step
    assert row.median("tflops") == pytest.approx(flops_per_step / 0.5 / 1e12)
    mfu = row.get("mfu")
    assert (mfu.median, mfu.max) == pytest.approx((flops_per_step * 2 / 1e12, flops_per_step * 4 / 1e12))
    first, second = row.get("speed_vs_first_variant"), full.get("speed_vs_first_variant")
    assert (row.get("variant"), first.value, second.value) == ("baseline", 1.0, 0.5)
    assert second.noisy and second.inputs_cv == pytest.approx(step.cv)
    markdown = (tmp_path / "throughput.md").read_text()
    assert "| 0.500x (noisy: inputs' CV 65%) |" in markdown
    assert "A ratio marked noisy is drawn from figures whose repeats vary by more than CV 20%" in markdown


def test_ratios_are_to_the_first_variant_of_the_same_setting(swept):
    # their arithmetic: test_figures_from_a_clock_of_known_step_times; here, each setting (kind, batch) has its own
    # reference, its first variant, whose ratio is then 1 (the other setting's steps take other times)
    _, result = swept
    firsts = [row for row in result.rows if row.get("variant") == "baseline"]
    assert len(firsts) == 4 and {row.median("speed_vs_first_variant") for row in firsts} == {1.0}


@pytest.mark.parametrize("kind", workload.STEP_KINDS)
def test_the_hf_contender_holds_the_baselines_weights_and_trains_by_the_same_step(kind):
    pytest.importorskip("transformers")
    config = workload.bert_config("tiny", 32, dropout=0.0)
    baseline, hf = (workload.build(config, kind, workload.Variant.parse(name, hf=True)) for name in ("baseline", "hf"))
    assert (
        type(hf.hf).__name__
        == {"pretraining": "BertForPreTraining", "finetuning": "BertForSequenceClassification"}[kind]
    )
    batch = synthetic.synthetic_batch(config, kind, 3, 32)
    torch.testing.assert_close(hf(**batch).loss, baseline(**batch).loss, rtol=1e-5, atol=1e-5)
    steps = {
        name: workload.train_step(config, kind, workload.Variant.parse(name, hf=True), "fp32", 3, 32, model=model)
        for name, model in (("baseline", baseline), ("hf", hf))
    }
    for step in steps.values():
        assert isinstance(step.step, TrainStep)
        step()
    # one AdamW step from the same weights on the same batch: the same weights after it
    after = steps["baseline"].model.state_dict()
    for name, tensor in steps["hf"].model.hf.state_dict().items():
        if name in after:
            torch.testing.assert_close(tensor, after[name], rtol=1e-4, atol=1e-5)


def test_an_mfu_above_100_percent_is_flagged_as_a_peak_measured_under_load(tmp_path, monkeypatch):
    # the matmul peak "measured" at 1 MFLOP/s: every step then achieves more than the peak, however busy the machine
    # (at 1 GFLOP/s, a loaded 2-core machine once ran the tiny model's steps at 0.6 of it)
    monkeypatch.setattr(
        throughput,
        "device_peaks",
        lambda precisions, device: {precision: (1e6, "measured fp32 matmul on cpu") for precision in precisions},
    )
    assert (
        throughput.main(
            TINY
            + [
                "--kinds",
                "finetuning",
                "--variants",
                "baseline",
                "--batch_sizes",
                "2",
                "--no_memory",
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    result = read(tmp_path)
    mfu = result.rows[0].median("mfu")
    assert mfu > 1
    assert f"MFU above 100% in 1 row(s) (up to {mfu:.0%})" in "".join(result.warnings)
    assert f"**Warning:** MFU above 100% in 1 row(s) (up to {mfu:.0%})" in (tmp_path / "throughput.md").read_text()


QUICK = TINY + ["--kinds", "finetuning", "--variants", "baseline", "--batch_sizes", "2", "--no_memory"]


def unreachable_peak(monkeypatch):
    """Skip measuring the matmul peak (a second of the test) with one no step reaches."""
    monkeypatch.setattr(
        throughput,
        "device_peaks",
        lambda precisions, device: {precision: (1e15, "a peak no CPU step reaches") for precision in precisions},
    )


def test_a_load_average_above_the_cores_is_a_busy_machine_warning(tmp_path, monkeypatch, capsys):
    unreachable_peak(monkeypatch)
    loads = iter([(1.0, 1.0, 1.0), (9.5, 4.0, 2.0)])  # before and after the sweep
    monkeypatch.setattr(noise.os, "getloadavg", lambda: next(loads))
    monkeypatch.setattr(noise.os, "sched_getaffinity", lambda pid: {0, 1})
    assert throughput.main(QUICK + ["--output_dir", str(tmp_path)]) == 0
    warning = (
        "the machine was busy: the 1-minute load average was 1.00 before the measurement and 9.50 after it, "
        "above the 2 core(s) available"
    )
    assert warning in read(tmp_path).warnings[0]
    assert f"**Warning:** {warning}" in (tmp_path / "throughput.md").read_text()
    assert f"warning: {warning}" in capsys.readouterr().out


def test_steps_that_vary_more_than_the_threshold_are_a_noisy_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(noise.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    unreachable_peak(monkeypatch)
    times = {"steady": [0.010, 0.0102, 0.0098], "disturbed": [0.010, 0.030, 0.011]}
    for name, seconds in times.items():
        monkeypatch.setattr(
            throughput.measure,
            "time_steps",
            lambda steps, *args, seconds=seconds: {step: list(seconds) for step in steps},
        )
        assert throughput.main(QUICK + ["--output_dir", str(tmp_path / name)]) == 0
    quiet, noisy = (read(tmp_path / name) for name in times)
    assert quiet.warnings == () and quiet.rows[0].get("step_seconds").cv < noise.BUSY_CV
    assert not quiet.rows[0].get("speed_vs_first_variant").noisy
    assert "noisy" not in (tmp_path / "steady" / "throughput.md").read_text()
    cv = noisy.rows[0].get("step_seconds").cv
    assert cv == pytest.approx(0.663, abs=0.001)  # stdev 0.0113 over the mean 0.017
    (warning,) = noisy.warnings
    assert warning.startswith(
        f"noisy step times: the repeats of 1 of 1 setting(s) vary by more than CV 20% (up to "
        f"{cv:.0%}, finetuning seq 32 fp32 baseline batch 2)"
    )


def test_the_speed_plots_get_each_settings_range_as_error_bars(swept, monkeypatch):
    _, result = swept
    drawn = {}
    monkeypatch.setattr(
        throughput,
        "line_plot",
        lambda series, xlabel, ylabel, title, **options: drawn.setdefault(ylabel, {}).update({title: series}),
    )
    throughput.plots(result.rows)
    speed = drawn["sequences / s"]["tiny, pretraining, seq 32, fp32"]
    rows = [row for row in result.rows if (row.get("kind"), row.get("variant")) == ("pretraining", "full")]
    assert speed["full"] == (
        [row.get("batch") for row in rows],
        [row.value.median for row in rows],
        [row.value.min for row in rows],
        [row.value.max for row in rows],
    )


def test_the_bench_step_has_the_training_defaults():
    # Only the schedule's length and warm-up differ (so the learning rate stays at its peak while timed).
    bench = workload.train_config("bf16")
    assert bench.warmup_proportion == 0 and bench.num_train_steps >= 10**9
    assert dataclasses.replace(bench, num_train_steps=100, warmup_proportion=0.1) == TrainConfig(
        num_train_steps=100, precision="bf16"
    )


def test_with_trainer_reports_both_figures_over_alternating_rounds(tmp_path, monkeypatch):
    unreachable_peak(monkeypatch)
    steps = count_calls(monkeypatch, TrainStep, "__call__")
    assert (
        throughput.main(
            TINY
            + [
                "--kinds",
                "finetuning",
                "--variants",
                "baseline",
                "--batch_sizes",
                "2",
                "--no_memory",
                "--with_trainer",
                "--trainer_rounds",
                "2",
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    result = read(tmp_path)
    (swept,) = result.rows_measuring("seq_per_s")
    (row,) = result.rows_measuring("trainer_seq_per_s")
    assert (row.unit, dict(row.setting)) == ("seq/s", dict(swept.setting))
    assert len(row.get("bench_rounds")) == len(row.get("trainer_rounds")) == 2
    bench = row.get("bench_seq_per_s")
    assert (bench.n, row.value.n) == (2, 2)
    ratio = row.get("trainer_over_bench")
    assert ratio.value == pytest.approx(row.value.median / bench.median)
    assert ratio.inputs_cv == max(bench.cv, row.value.cv)
    # The sweep's 3 steps, 2 bench rounds of 3 and 2 trainer runs of 1 + 2 steps: all through TrainStep.
    assert len(steps) == 3 + 2 * 3 + 2 * 3
    assert "## The bench's step and the trainer's loop" in (tmp_path / "throughput.md").read_text()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--variants", "baseline,sometimes"], "unknown variant 'sometimes'"),
        (["--precisions", "fp8"], "--precisions: unknown precision 'fp8'"),
        (["--kinds", "inference"], "--kinds: unknown kind 'inference'"),
        (["--batch_sizes", "8,0"], "--batch_sizes must be positive, got 8,0"),
        (["--warmup", "-1"], "--warmup must be 0 or more, got -1"),
        (["--max_grad_norm", "-1"], "--max_grad_norm must be 0 or more, got -1"),
        (["--optimizer", "adam"], "argument --optimizer: invalid choice: 'adam'"),
        (["--batch_size", "8"], "unrecognized arguments: --batch_size (did you mean --batch_sizes?)"),
        (["--model", "missing/bert_config.json"], "unknown model 'missing/bert_config.json'"),
        # a run on a CPU trains fp16 in fp32 (training.step.fallbacks): a bench times what runs train with
        (
            ["--precisions", "fp32,fp16", "--device", "cpu"],
            "on cpu: fp16 needs a CUDA GPU: a run trains otherwise here",
        ),
    ],
)
def test_bad_settings_fail_in_one_line_and_write_nothing(tmp_path, error_line, flags, message):
    out = tmp_path / "out"
    assert throughput.main(TINY + flags + ["--output_dir", str(out)]) == 2
    assert message in error_line()
    assert not out.exists()


def test_the_settings_give_back_the_command_line_they_came_from(tmp_path):
    given = ["--model", "tiny", "--kinds", "finetuning", "--batch_sizes", "2,8", "--no_memory", "--cuda_graphs=false"]
    parsed = settings.parse(throughput.SETTINGS, given + ["--output_dir", str(tmp_path)], "")
    assert (parsed.kinds, parsed.batch_sizes, parsed.no_memory, parsed.cuda_graphs) == (
        ("finetuning",),
        (2, 8),
        True,
        False,
    )
    assert (parsed.warmup, parsed.steps, parsed.seq_lengths, parsed.variants) == (
        2,
        5,
        (128,),
        workload.ALL_VARIANTS,
    )
    assert settings.parse(throughput.SETTINGS, settings.as_argv(parsed), "") == parsed


def test_the_bench_command_lists_every_kind(capsys, error_line):
    assert bertbench_cli.main(["bench", "--help"]) == 0
    usage = capsys.readouterr().out
    for kind in (
        "suite",
        "throughput",
        "memory",
        "optimizer",
        "scaling",
        "budget",
        "profile",
        "plan",
        "finetuning",
        "squad-data",
        "pretraining-data",
    ):
        assert f"  {kind} " in usage
    assert bertbench_cli.main(["bench", "speed"]) == 2
    assert error_line() == (
        "bertbench bench: error: unknown bench 'speed'; choose one of suite, throughput, memory, optimizer, "
        "scaling, budget, finetuning, profile, plan, squad-data, pretraining-data"
    )


@pytest.mark.gpu
def test_gpu_sweep_uses_the_data_sheet_peak_and_the_allocator(tmp_path):
    """The baseline replays CUDA graphs (whose memory was taken at capture, so not measured per step); recompute
    launches from the host, and its step's memory is the allocator's."""
    assert (
        throughput.main(
            TINY
            + ["--device", "cuda", "--precisions", "bf16", "--variants", "baseline,full", "--output_dir", str(tmp_path)]
        )
        == 0
    )
    result = read(tmp_path)
    rows = {(row.get("kind"), row.get("variant")): row for row in result.rows}
    for kind in ("pretraining", "finetuning"):
        assert rows[kind, "baseline"].get("cuda_graphs")["replays"] > 0
        assert rows[kind, "baseline"].get("memory_kind").startswith("not measured: CUDA graphs")
        assert rows[kind, "full"].get("cuda_graphs") is None and rows[kind, "full"].get("step_memory_bytes") > 0
        assert rows[kind, "full"].get("memory_kind") == "CUDA allocated"
        assert isinstance(rows[kind, "full"].get("host_share"), Ratio)
    source = result.context["peaks"]["bf16"]["source"]
    assert source.endswith("data sheet, bf16 dense") or source == "measured bf16 matmul on cuda"


# ---- --lengths: batches with real text's lengths -------------------------------------------------------------------

FIBONACCI = "# Fibonacci, one above the sequence length\n3 5 8\n13 21 34  # 34: cut to 32\n"
LENGTHS_RUN = [
    "--model",
    "tiny",
    "--seq_lengths",
    "32",
    "--batch_sizes",
    "4",
    "--warmup",
    "1",
    "--steps",
    "2",
    "--kinds",
    "finetuning",
    "--no_memory",
]
HF_AND_OURS = "baseline,baseline/padded,hf,hf-dynamic"


@pytest.fixture(scope="module")
def lengths_run(tmp_path_factory):
    """One interleaved run of bertbench's two paths and HF's two paddings on lengths drawn from FIBONACCI, with the
    input ids each step was fed (by step) and the shapes HF's models were."""
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("lengths")
    (out / "lengths.txt").write_text(FIBONACCI)
    fed, hf_shapes = {}, {}
    forward_loss, hf_forward = TrainStep.forward_loss, workload.HFContender.forward

    def recorded_forward_loss(self, batch):
        fed.setdefault(id(self), []).append(batch["input_ids"])
        return forward_loss(self, batch)

    def recorded_hf_forward(self, input_ids, *args, **kwargs):
        hf_shapes.setdefault(id(self), []).append(tuple(input_ids.shape))
        return hf_forward(self, input_ids, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TrainStep, "forward_loss", recorded_forward_loss)
        patch.setattr(workload.HFContender, "forward", recorded_hf_forward)
        patch.setattr(
            throughput,
            "device_peaks",
            lambda precisions, device: {precision: (1e12, "a round peak") for precision in precisions},
        )
        assert (
            throughput.main(
                LENGTHS_RUN
                + ["--lengths", str(out / "lengths.txt"), "--variants", HF_AND_OURS, "--output_dir", str(out / "run")]
            )
            == 0
        )
    return out, read(out / "run"), list(fed.values()), hf_shapes


def test_a_lengths_file_is_read_past_comments_and_cut_to_the_sequence_length(tmp_path):
    path = tmp_path / "lengths.txt"
    path.write_text(FIBONACCI)
    lengths = workload.Lengths.parse(str(path))
    assert lengths.values == (3, 5, 8, 13, 21, 34)
    drawn = lengths.draw(400, 32)
    assert drawn == lengths.draw(400, 32) and set(drawn) == {3, 5, 8, 13, 21, 32}


NOT_A_LENGTH = "is not a sequence length (an integer of 2 or more: [CLS] and [SEP] at least)"


@pytest.mark.parametrize(
    "text, message",
    [
        ("# lengths\n12 40\n7 1.5\n", f":3: '1.5' {NOT_A_LENGTH}"),
        ("5\n 9 1 # too short\n", f":2: '1' {NOT_A_LENGTH}"),
        ("# nothing but a comment\n", ": no sequence lengths in it"),
    ],
)
def test_a_bad_lengths_file_fails_in_one_line_naming_file_and_line_and_writes_nothing(
    tmp_path, error_line, text, message
):
    path, out = tmp_path / "lengths.txt", tmp_path / "out"
    path.write_text(text)
    assert throughput.main(QUICK + ["--lengths", str(path), "--output_dir", str(out)]) == 2
    assert error_line() == f"bertbench bench throughput: error: {path}{message}"
    assert not out.exists()


def test_an_unknown_lengths_name_is_neither_a_name_nor_a_file(tmp_path, error_line):
    assert throughput.main(QUICK + ["--lengths", "real_text", "--output_dir", str(tmp_path / "out")]) == 2
    assert error_line().startswith(
        "bertbench bench throughput: error: --lengths real_text: neither full, real-text nor a readable file"
    )


def test_the_built_in_distribution_is_the_committed_recipe_on_real_text():
    from bertbench.tasks.tokenization import BertTokenizer

    fixtures = pathlib.Path(__file__).parent / "fixtures" / "google_bert"
    spec = importlib.util.spec_from_file_location("make_lengths", fixtures / "make_lengths.py")
    make_lengths = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_lengths)
    lengths = workload.Lengths.parse("real-text")
    assert list(lengths.values) == make_lengths.pair_lengths(
        (fixtures / "real_text.txt").read_text(encoding="utf-8"), BertTokenizer.from_vocab_file(fixtures / "vocab.txt")
    )
    summary = lengths.summary()
    assert (summary["count"], round(summary["mean"], 1), summary["median"], summary["longest"]) == (489, 64.2, 57, 128)
    assert round(summary["share_at_longest"], 3) == 0.125


def test_every_variant_trains_the_same_examples(lengths_run):
    _, result, fed, hf_shapes = lengths_run
    # each of the 4 steps: 1 warm-up and 2 timed calls of one micro-batch, going round the 2 timed calls' batches
    drawn = workload.Lengths("file", (3, 5, 8, 13, 21, 34)).draw(8, 32)
    cycle = [drawn[:4], drawn[4:]]
    assert len(fed) == 4 and all(len(ids) == 3 for ids in fed)
    wide = [ids for ids in fed if all(batch.shape == (4, 32) for batch in ids)]
    (cut,) = [ids for ids in fed if not all(batch.shape == (4, 32) for batch in ids)]
    for number, batch in enumerate(cut):  # round 0 is the warm-up, on the cycle's first batch like round 2
        longest = max(cycle[number % 2])
        assert batch.shape == (4, longest) and all(torch.equal(ids[number][:, :longest], batch) for ids in wide)
        assert all(torch.equal(ids[number], wide[0][number]) for ids in wide)
    assert {batch.shape[1] for batch in cut} == {32, 21}  # a batch of the cycle was cut
    # HF's model receives the cut batches (and the other one full ones)
    assert sorted(map(sorted, hf_shapes.values())) == [[(4, 21), (4, 32), (4, 32)], [(4, 32)] * 3]
    real = sum(drawn) / 2
    assert [row.get("real_tokens_per_step") for row in result.rows] == [real] * 4


def test_real_tokens_padding_and_model_flops_count_the_real_lengths(lengths_run):
    out, result, _, _ = lengths_run
    drawn = workload.Lengths("file", (3, 5, 8, 13, 21, 34)).draw(8, 32)
    config = workload.bert_config("tiny", 32)
    flops_per_step = sum(flops.train_flops(config, "finetuning", length) for length in drawn) / 2
    for row in result.rows:
        assert row.get("lengths") == str(out / "lengths.txt")
        assert row.median("real_tokens_per_s") / row.median() == pytest.approx(sum(drawn) / len(drawn))
        assert row.get("padding_share") == pytest.approx(1 - sum(drawn) / (8 * 32))
        assert row.get("model_flops_per_step") == pytest.approx(flops_per_step)
        assert row.median("mfu") == pytest.approx(flops_per_step / 1e12 / row.median("step_seconds"))
    assert {row.get("variant"): row.get("path") for row in result.rows} == {
        "baseline": "unpadded/auto",
        "baseline/padded": "padded",
        "hf": "hf padded to max",
        "hf-dynamic": "hf dynamic",
    }
    assert result.context["lengths"]["count"] == 6 and result.context["lengths"]["longest"] == 34
    markdown = (out / "run" / "throughput.md").read_text()
    assert (
        f"- sequence lengths: {out / 'lengths.txt'} (file): 6 lengths, mean 14.0, median 10.5, 16.7% at the "
        "longest (34); 16.7% cut to seq 32"
    ) in markdown
    row = result.rows[1]
    assert f"| finetuning | 32 | fp32 | baseline/padded | padded | 4 | {row.value.text('.2f')} | " in markdown
    assert f"| {row.median('real_tokens_per_s'):,.0f} | {row.get('padding_share'):.1%} | " in markdown


def test_pretraining_predicts_among_the_real_tokens_and_is_credited_for_them():
    config = workload.bert_config("tiny", 32)
    lengths = workload.Lengths("file", (2, 9, 30, 40))
    step = workload.train_step(
        config, "pretraining", workload.Variant.parse("baseline"), "fp32", 3, 32, lengths=lengths, steps=2
    )
    drawn = lengths.draw(6, 32)
    for number, batch in enumerate(step.batches):
        real = torch.tensor(drawn[3 * number : 3 * number + 3])
        assert torch.equal(batch["attention_mask"].sum(1), real)
        assert torch.equal(batch["input_ids"] == 0, batch["attention_mask"] == 0)
        predicted = batch["masked_lm_labels"] != -100
        assert predicted.sum(1).tolist() == [synthetic.masked_positions(length) for length in real.tolist()]
        assert bool((batch["masked_lm_positions"] < batch["attention_mask"].sum(1, keepdim=True)).all())
    row = throughput.figures([0.5, 0.5], step, config, "pretraining", 32, 1e12)
    assert row["model_flops_per_step"] == pytest.approx(
        sum(flops.train_flops(config, "pretraining", length, synthetic.masked_positions(length)) for length in drawn)
        / 2
    )


def test_padded_variants_train_as_runs_with_unpad_false():
    variant = workload.Variant.parse("every-3/padded")
    assert variant.runner_values() == {
        "modeling": "recompute",
        "recompute_policy": "every-k",
        "recompute_every": 3,
        "unpad": False,
    }
    model = workload.build(workload.bert_config("tiny", 32), "finetuning", variant)
    assert [module.unpad for module in model.modules() if hasattr(module, "unpad")] == [False]
    with pytest.raises(workload.BenchError, match="unknown variant 'hf/padded'"):
        workload.Variant.parse("hf/padded", hf=True)


def test_the_seed_seeds_the_weights_and_the_batches():
    config = workload.bert_config("tiny", 32)
    lengths = workload.Lengths("file", (3, 5, 8, 13, 21, 34))
    first, again, other = (
        workload.train_step(
            config, "finetuning", workload.Variant.parse("baseline"), "fp32", 2, 32, lengths=lengths, steps=2, seed=seed
        )
        for seed in (0, 0, 1)
    )

    def same(a, b) -> bool:
        weights = zip(a.model.state_dict().values(), b.model.state_dict().values())
        batches = [(x[key], y[key]) for x, y in zip(a.batches, b.batches) for key in x]
        return all(torch.equal(x, y) for x, y in [*weights, *batches])

    assert same(first, again) and not same(first, other)


def test_bf16_on_a_cpu_without_a_bf16_unit_is_timed_with_the_reason_it_is_slow(monkeypatch):
    monkeypatch.setattr(devices, "cpu_features", lambda: ("AMD EPYC", {"avx", "avx2"}))
    (line,) = workload.slow_precisions(("fp32", "bf16"), torch.device("cpu"))
    assert line.startswith("--precision=bf16: this CPU (AMD EPYC: AVX2) has no bf16 matmul unit")
    monkeypatch.setattr(devices, "cpu_features", lambda: ("Intel Xeon", {"avx512_f", "avx512_bf16"}))
    assert workload.slow_precisions(("fp32", "bf16"), torch.device("cpu")) == []
