"""`bertbench bench finetuning`: the runners trained as users run them (in-process, from Python values), each
variant in interleaved rounds with the spread of its figures; timed-save cost and resume after SIGKILL."""

import os
import statistics

import pytest

from bertbench.bench import finetuning, settings
from bertbench.bench.results import BenchResult, Ratio, Spread
from bertbench.runners.skeleton import TaskRunner
from bertbench.tasks import synthetic

QUICK = ["--model=tiny", "--max_seq_length=32", "--train_batch_size=16", "--save_checkpoints_secs=0.05"]


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    out = tmp_path_factory.mktemp("finetuning")
    calls = []
    run_values = TaskRunner.run_values
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            TaskRunner,
            "run_values",
            lambda spec, values, output=None: (
                calls.append((spec.name, values["modeling"], values.get("recompute_policy")))
                or run_values(spec, values, output)
            ),
        )
        assert (
            finetuning.main(
                QUICK
                + [
                    "--variants=baseline,selective",
                    "--rounds=3",
                    "--max_train_samples=128",
                    "--num_train_epochs=2",
                    "--no_resume",
                    f"--output_dir={out}",
                ]
            )
            == 0
        )
    return out, BenchResult.read(str(out / "finetuning.json")), calls


@pytest.mark.slow
def test_each_variant_runs_in_flipping_rounds_through_the_runner(glue):
    order = [(modeling, policy) for _, modeling, policy in glue[2]]
    base, selective = ("baseline", None), ("recompute", "selective")
    assert order == [base, selective, selective, base, base, selective]
    assert {name for name, _, _ in glue[2]} == {"run_classifier"}


@pytest.mark.slow
def test_figures_are_each_runs_own_with_median_range_and_cv(glue):
    out, result, _ = glue
    assert result.context["runner"] == "run_classifier"
    assert [row.setting for row in result.rows] == [
        {"task": "glue", "model": "tiny", "lengths": "built-in", "precision": "fp32", "variant": variant}
        for variant in ("baseline", "selective")
    ]
    markdown = (out / "finetuning.md").read_text()
    for row in result.rows:
        runs = row.get("runs")
        assert len(runs) == 3 and row.measured == "steady_seq_per_s" and row.unit == "seq/s"
        rates = sorted(run["steady_seq_per_s"] for run in runs)
        assert (row.value.median, row.value.min, row.value.max, row.value.n) == (rates[1], rates[0], rates[2], 3)
        assert f"| {row.get('variant')} | {rates[1]:.1f} ({rates[0]:.1f}–{rates[2]:.1f}, CV " in markdown
        for run in runs:
            assert run["steps"] == 2 * 128 // 16 and run["saves"] >= 1
            assert run["dev_acc"] * 408 == pytest.approx(round(run["dev_acc"] * 408))  # of the 408 dev pairs
            assert run["checkpoint_bytes"] > 0
    baseline, _ = result.rows
    # same seed, same weights at the start, bit-identical gradients: the same dev accuracy in every run
    assert {run["dev_acc"] for row in result.rows for run in row.get("runs")} == {baseline.get("runs")[0]["dev_acc"]}
    assert baseline.get("dev_acc").cv == 0.0
    assert (out / "finetuning-seq-per-s.png").read_bytes().startswith(b"\x89PNG")


def test_a_variants_figures_are_the_median_of_its_runs_and_its_ratio_is_to_the_first_variant(tmp_path, monkeypatch):
    # canned runs: each variant's figures in the order its runs come (the rounds alternate which variant goes first)
    rates = {"baseline": [100.0, 120.0, 90.0], "recompute": [80.0, 30.0, 75.0]}
    save_seconds = {"baseline": 0.6, "recompute": 1.2}

    def canned_run(spec, values, scores):
        modeling = values["modeling"]
        return {
            "steady_seq_per_s": rates[modeling].pop(0),
            "steps": 16,
            "seconds": 1.0,
            "saves": 2,
            "seconds_per_save": save_seconds[modeling],
            "checkpoint_bytes": 1000,
            "dev_acc": 0.5,
        }

    monkeypatch.setattr(finetuning, "train_once", canned_run)
    args = QUICK + ["--variants=baseline,selective", "--rounds=3", "--no_resume", f"--output_dir={tmp_path}"]
    assert finetuning.main(args) == 0
    baseline, selective = BenchResult.read(str(tmp_path / "finetuning.json")).rows
    # baseline: median 100 of 100, 120, 90 (stdev 15.275 / mean 103.33); selective: median 75 of 80, 30, 75
    assert baseline.value == Spread(100.0, 90.0, 120.0, pytest.approx(0.147825, rel=1e-5), 3)
    assert selective.value.median == 75.0 and baseline.get("vs_first_variant") == Ratio(1.0, baseline.value.cv)
    # the ratio carries its inputs' larger CV: the selective runs' 45% (stdev 27.54 / mean 61.67), marked noisy
    assert selective.get("vs_first_variant") == Ratio(0.75, selective.value.cv)
    assert selective.value.cv == pytest.approx(0.4466, abs=1e-4)
    markdown = (tmp_path / "finetuning.md").read_text()
    assert "| baseline | 100.0 (90.0–120.0, CV 15%) | 1.000x |" in markdown
    assert "| selective | 75.0 (30.0–80.0, CV 45%) | 0.750x (noisy: inputs' CV 45%) |" in markdown
    assert "A ratio marked noisy is drawn from figures whose repeats vary by more than CV 20%" in markdown
    # a save's share of the time between saves at the original's default of one every 1200 s
    assert (baseline.get("save_share_at_default"), selective.get("save_share_at_default")) == pytest.approx(
        (0.0005, 0.001)
    )


@pytest.mark.slow
def test_squad_runs_and_a_killed_run_resumes_from_its_checkpoint(tmp_path):
    # 40 steps of 8 questions: the run killed at its step-10 checkpoint has 30 to go
    assert (
        finetuning.main(
            [
                "--task=squad",
                "--model=tiny",
                "--variants=baseline",
                "--rounds=1",
                "--max_train_samples=320",
                "--train_batch_size=8",
                "--num_train_epochs=1",
                f"--output_dir={tmp_path}",
            ]
        )
        == 0
    )
    result = BenchResult.read(str(tmp_path / "finetuning.json"))
    (row,) = result.rows
    assert result.context["runner"] == "run_squad" and result.context["model_config"]["hidden_size"] == 64
    # exact match over the 300 built-in dev questions
    assert row.median("exact") * 3 == pytest.approx(round(row.median("exact") * 3))
    # the resume after SIGKILL: columns of the first variant's row
    assert row.get("resumed_from").endswith(f"ckpt-{row.get('killed_after_checkpoint_step'):09d}.pt")
    assert 0 < row.get("restore_seconds") < row.get("launch_to_training_seconds")


@pytest.mark.parametrize("task, shape", [("glue", (2, 64, 0.1)), ("squad", (2, 128, 0.0))])
def test_each_task_trains_its_built_in_model_on_the_built_in_vocabulary(task, shape):
    parsed = settings.parse(finetuning.FinetuningSettings, [f"--task={task}"], "")
    config = finetuning.bert_config(parsed)
    assert (config.num_hidden_layers, config.hidden_size, config.hidden_dropout_prob) == shape
    assert config.vocab_size == len(synthetic.vocabulary())
    assert config.max_position_embeddings >= parsed.seq_length


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--variants=baseline,hf"],
            "variant hf is HF transformers' model: compare with it in `bertbench bench throughput",
        ),
        (["--variants=every-0"], "unknown variant 'every-0'"),
        (["--model=huge"], "unknown model 'huge'"),
        (["--num_train_epochs=0"], "--num_train_epochs must be positive, got 0.0"),
        (["--device=tpu"], "--device"),
        (["--task=squad", "--lengths=full"], "--lengths: the squad task has its own lengths (glue only)"),
        (["--lengths=full,full"], "--lengths: give each at least once and none twice"),
        (["--lengths=no-such-file"], "--lengths no-such-file: neither full, real-text nor a readable file"),
        (["--precisions=fp8"], "--precisions: unknown precision 'fp8': use fp32, fp16, bf16"),
        (["--precisions=bf16,bf16"], "--precisions: give each at least once and none twice"),
        (["--precisions=fp16", "--device=cpu"], "--precisions: on cpu: fp16 needs a CUDA GPU"),
    ],
)
def test_bad_settings_fail_in_one_line_and_write_nothing(tmp_path, error_line, flags, message):
    out = tmp_path / "out"
    assert finetuning.main(flags + [f"--output_dir={out}"]) == 2
    assert message in error_line() and not out.exists()


def test_each_lengths_is_a_row_of_its_own_interleaved_with_the_others(tmp_path, monkeypatch):
    seen = []

    def canned_run(spec, values, scores):
        train = (tmp_path / "seen").with_suffix(f".{len(seen)}")
        seen.append((values["data_dir"], values["modeling"]))
        train.write_text(open(os.path.join(values["data_dir"], "train.tsv"), encoding="utf-8").read())
        return {
            "steady_seq_per_s": 100.0 if "glue-0" in values["data_dir"] else 50.0,
            "steps": 1,
            "seconds": 1.0,
            "saves": 1,
            "seconds_per_save": 0.1,
            "checkpoint_bytes": 1,
            "dev_acc": 0.5,
        }

    monkeypatch.setattr(finetuning, "train_once", canned_run)
    args = QUICK + ["--variants=baseline", "--lengths=real-text,full", "--rounds=2", "--no_resume"]
    assert finetuning.main(args + [f"--output_dir={tmp_path / 'out'}"]) == 0
    assert [os.path.basename(os.path.dirname(data)) for data, _ in seen] == [
        "glue-0",
        "glue-1",
        "glue-1",
        "glue-0",
    ]
    real, full = BenchResult.read(str(tmp_path / "out" / "finetuning.json")).rows
    assert (real.get("lengths"), full.get("lengths")) == ("real-text", "full")
    assert full.get("vs_first_variant").value == 0.5
    pair_lengths = [
        [
            3 + len(line.split("\t")[3].split()) + len(line.split("\t")[4].split())
            for line in (tmp_path / f"seen.{run}").read_text().splitlines()[1:]
        ]
        for run in (0, 1)
    ]
    assert set(pair_lengths[1]) == {32}  # full: every pair fills --max_seq_length
    assert min(pair_lengths[0]) == 16 and max(pair_lengths[0]) == 32 and 20 < statistics.mean(pair_lengths[0]) < 32
    assert (
        "| real-text | baseline | 100.0 (100.0–100.0, CV 0.0%) | 1.000x |"
        in (tmp_path / "out" / "finetuning.md").read_text()
    )


def test_the_settings_run_again_from_their_command_line():
    parsed = settings.parse(
        finetuning.FinetuningSettings, [*QUICK, "--variants=full,every-2", "--no_resume", "--output_dir=x"], ""
    )
    assert parsed.variants == ("full", "every-2") and parsed.no_resume and parsed.save_checkpoints_secs == 0.05
    assert settings.parse(finetuning.FinetuningSettings, settings.as_argv(parsed), "") == parsed


def test_each_precision_is_a_row_and_vary_seed_gives_every_row_the_same_seeds(tmp_path, monkeypatch):
    """--precisions fp32,bf16 --vary_seed: the accuracy-parity runs, each precision trained from each round's seed."""
    seen = []

    def canned_run(spec, values, scores):
        seen.append((values["precision"], values["seed"]))
        accuracy = {("fp32", 7): 0.8, ("bf16", 7): 0.75, ("fp32", 8): 0.9, ("bf16", 8): 0.85}
        return {
            "steady_seq_per_s": 100.0 if values["precision"] == "fp32" else 25.0,
            "steps": 1,
            "seconds": 1.0,
            "saves": 1,
            "seconds_per_save": 0.1,
            "checkpoint_bytes": 1,
            "dev_acc": accuracy[values["precision"], values["seed"]],
        }

    monkeypatch.setattr(finetuning, "train_once", canned_run)
    args = QUICK + ["--variants=baseline", "--precisions=fp32,bf16", "--vary_seed", "--seed=7", "--rounds=2"]
    assert finetuning.main(args + ["--no_resume", f"--output_dir={tmp_path / 'out'}"]) == 0
    assert seen == [("fp32", 7), ("bf16", 7), ("bf16", 8), ("fp32", 8)]  # flipped order, a seed per round
    fp32, bf16 = BenchResult.read(str(tmp_path / "out" / "finetuning.json")).rows
    assert (fp32.get("precision"), bf16.get("precision")) == ("fp32", "bf16")
    assert [run["seed"] for run in bf16.get("runs")] == [7, 8]
    assert (bf16.get("dev_acc").min, bf16.get("dev_acc").max, bf16.get("vs_first_variant").value) == (0.75, 0.85, 0.25)
    markdown = (tmp_path / "out" / "finetuning.md").read_text()
    assert "round r from seed 7 + r" in markdown
    assert "| bf16 | baseline | 25.0 (25.0–25.0, CV 0.0%) | 0.250x | 0.800 (0.750–0.850" in markdown
