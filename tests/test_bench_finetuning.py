"""`bertbench bench finetuning`: the runners trained as users run them (in-process, from Python values), each
variant in interleaved rounds with the spread of its figures; timed-save cost and resume after SIGKILL."""

import pytest
from helpers import read_json

from bertbench.bench import finetuning
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
    return out, read_json(out / "finetuning.json"), calls


@pytest.mark.slow
def test_each_variant_runs_in_flipping_rounds_through_the_runner(glue):
    order = [(modeling, policy) for _, modeling, policy in glue[2]]
    base, selective = ("baseline", None), ("recompute", "selective")
    assert order == [base, selective, selective, base, base, selective]
    assert {name for name, _, _ in glue[2]} == {"run_classifier"}


@pytest.mark.slow
def test_figures_are_each_runs_own_with_median_range_and_cv(glue):
    out, report, _ = glue
    assert report["runner"] == "run_classifier" and [row["variant"] for row in report["rows"]] == [
        "baseline",
        "selective",
    ]
    markdown = (out / "finetuning.md").read_text()
    for row in report["rows"]:
        runs = row["runs"]
        assert len(runs) == 3
        rates = sorted(run["steady_seq_per_s"] for run in runs)
        # noise.spread_fields' convention: KEY is the median, KEY_min / KEY_max / KEY_cv beside it
        assert (row["steady_seq_per_s"], row["steady_seq_per_s_min"], row["steady_seq_per_s_max"]) == (
            rates[1],
            rates[0],
            rates[2],
        )
        assert f"| {row['variant']} | {row['steady_seq_per_s']:.1f} ({rates[0]:.1f}–{rates[2]:.1f}, CV " in markdown
        for run in runs:
            assert run["steps"] == 2 * 128 // 16 and run["saves"] >= 1
            assert run["dev_acc"] * 408 == pytest.approx(round(run["dev_acc"] * 408))  # of the 408 dev pairs
            assert run["checkpoint_bytes"] > 0
    baseline, _ = report["rows"]
    # same seed, same weights at the start, bit-identical gradients: the same dev accuracy in every run
    assert {run["dev_acc"] for row in report["rows"] for run in row["runs"]} == {baseline["runs"][0]["dev_acc"]}
    assert baseline["dev_acc_cv"] == 0.0
    assert (out / "finetuning-seq-per-s.png").read_bytes().startswith(b"\x89PNG")


def test_a_variants_figures_are_the_median_of_its_runs_and_its_ratio_is_to_the_first_variant(tmp_path, monkeypatch):
    # canned runs: each variant's figures in the order its runs come (the rounds alternate which variant goes first)
    rates = {"baseline": [100.0, 120.0, 90.0], "recompute": [80.0, 70.0, 75.0]}
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
    baseline, selective = read_json(tmp_path / "finetuning.json")["rows"]
    # baseline: median 100 of 100, 120, 90 (stdev 15.275 / mean 103.33); selective: median 75
    assert (baseline["steady_seq_per_s"], baseline["steady_seq_per_s_min"], baseline["steady_seq_per_s_max"]) == (
        100.0,
        90.0,
        120.0,
    )
    assert baseline["steady_seq_per_s_cv"] == pytest.approx(0.147825, rel=1e-5)
    assert (selective["steady_seq_per_s"], selective["vs_first_variant"], baseline["vs_first_variant"]) == (
        75.0,
        0.75,
        1.0,
    )
    # a save's share of the time between saves at the original's default of one every 1200 s
    assert (baseline["save_share_at_default"], selective["save_share_at_default"]) == pytest.approx((0.0005, 0.001))


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
    report = read_json(tmp_path / "finetuning.json")
    (row,) = report["rows"]
    assert report["runner"] == "run_squad" and report["model_config"]["hidden_size"] == 64
    # exact match over the 300 built-in dev questions
    assert row["exact"] * 3 == pytest.approx(round(row["exact"] * 3))
    resume = report["resume_after_sigkill"]
    assert resume["resumed_from"].endswith(f"ckpt-{resume['killed_after_checkpoint_step']:09d}.pt")
    assert 0 < resume["restore_seconds"] < resume["launch_to_training_seconds"]


@pytest.mark.parametrize("task, shape", [("glue", (2, 64, 0.1)), ("squad", (2, 128, 0.0))])
def test_each_task_trains_its_built_in_model_on_the_built_in_vocabulary(task, shape):
    args = finetuning.build_parser().parse_args([f"--task={task}"])
    config = finetuning.bert_config(args)
    assert (config.num_hidden_layers, config.hidden_size, config.hidden_dropout_prob) == shape
    assert config.vocab_size == len(synthetic.vocabulary())
    assert config.max_position_embeddings >= finetuning.seq_length(args)


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
    ],
)
def test_bad_settings_fail_in_one_line_and_write_nothing(tmp_path, error_line, flags, message):
    out = tmp_path / "out"
    assert finetuning.main(flags + [f"--output_dir={out}"]) == 2
    assert message in error_line() and not out.exists()
