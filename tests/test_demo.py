"""The built-in demo on a shortened run: every variant learns the task and ends with the baseline's weights."""

import json

import pytest

from bertbench.demo import data
from bertbench.demo.run import DemoConfig, main, run


def test_examples_are_deterministic_balanced_and_need_both_sentences():
    first, again = data.make_examples(400, seed=3), data.make_examples(400, seed=3)
    assert first == again and first != data.make_examples(400, seed=4)
    assert 0.35 < sum(example.label for example in first) / len(first) < 0.65
    positive = set(data.POSITIVE)
    mixed_a = [ex for ex in first if sum(word in positive for word in ex.text_a.split()) == 1]
    # with one positive and one negative adjective in A, B decides the label
    assert mixed_a and all(ex.label == (ex.text_b.split()[1] in positive) for ex in mixed_a)


def test_vocab_covers_every_word(tmp_path):
    vocab = open(data.write_vocab(tmp_path), encoding="utf-8").read().split("\n")
    words = {word for ex in data.make_examples(200, 0) for word in (ex.text_a + " " + ex.text_b).split()}
    assert words <= set(vocab) and vocab[0] == "[PAD]"


def test_short_demo_beats_chance_with_identical_weights(tmp_path, capsys):
    assert main(["--steps", "60", "--train_examples", "1024", "--dev_examples", "256",
                 "--output_dir", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "demo_results.json").read_text())
    results = {result["model"]: result for result in report["results"]}
    assert list(results) == ["baseline", "recompute/full", "recompute/every-k", "recompute/selective"]
    for result in results.values():
        assert result["dev_accuracy"] >= 0.8, result  # chance is 0.5
        assert result["train_seq_per_s"] > 0
    assert report["max_weight_difference_vs_baseline"] == 0.0
    saved = {name: result["saved_for_backward_bytes"] for name, result in results.items()}
    assert saved["recompute/full"] < saved["recompute/selective"] < saved["baseline"]
    assert saved["recompute/every-k"] < saved["baseline"]
    table = capsys.readouterr().out
    assert "bytes vs base" in table and "recompute/selective" in table


def test_demo_help_lists_every_setting(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(f"--{name}" in out for name in DemoConfig.__dataclass_fields__)


def test_shortest_run_times_a_step():
    result = run(DemoConfig(steps=2, train_examples=64, dev_examples=32))["results"][0]
    assert result["train_seq_per_s"] > 0 and result["step_ms"] > 0 and result["saved_for_backward_bytes"] > 0


def test_run_is_reproducible():
    settings = DemoConfig(steps=8, train_examples=256, dev_examples=64)
    first, second = run(settings), run(settings)
    assert [r["final_loss"] for r in first["results"]] == [r["final_loss"] for r in second["results"]]


@pytest.mark.parametrize("argv, message", [(["--steps", "1"], "--steps must be at least 2"),
                                           (["--hidden_size", "30"], "multiple of the 4 attention heads"),
                                           (["--max_seq_length", "12"], "at least 16")])
def test_bad_settings_are_one_line_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
