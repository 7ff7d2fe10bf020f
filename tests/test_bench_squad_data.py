"""`bertbench bench squad-data`: run_squad's feature creation and post-processing timed on SQuAD files (given, or a
corpus assembled from docstrings), repeated, with their spread."""

import json

import pytest

from bertbench.bench import squad_data
from bertbench.bench.results import BenchResult, Spread
from bertbench.tasks import synthetic
from bertbench.tasks.squad.features import convert_examples
from bertbench.tasks.squad.reading import read_examples
from bertbench.tasks.tokenization import BertTokenizer


def test_given_files_are_timed_by_run_squads_own_code(tmp_path):
    train, dev = synthetic.write_squad(tmp_path / "data", "2.0", train=40, dev=20)
    vocab = synthetic.write_vocab(tmp_path)
    out = tmp_path / "out"
    assert (
        squad_data.main(
            [
                f"--train_file={train}",
                f"--predict_file={dev}",
                f"--vocab_file={vocab}",
                "--version_2_with_negative",
                "--max_seq_length=32",
                "--doc_stride=8",
                "--max_query_length=12",
                "--repeats=3",
                f"--output_dir={out}",
            ]
        )
        == 0
    )
    rows = BenchResult.read(str(out / "squad-data.json")).rows
    markdown = (out / "squad-data.md").read_text()
    for row in rows:
        seconds = row.get("seconds")
        assert f"| {seconds.median:.2f} ({seconds.min:.2f}–{seconds.max:.2f}, CV " in markdown
    tokenizer = BertTokenizer.from_vocab_file(vocab)
    windows = {
        split: len(convert_examples(read_examples(path, training, True), tokenizer, 32, 8, 12, training))
        for split, path, training in (("train", train, True), ("dev", dev, False))
    }
    assert [(row.get("set"), row.get("count"), row.unit) for row in rows] == [
        ("train features", windows["train"], "windows/s"),
        ("dev features", windows["dev"], "windows/s"),
        ("dev answers from logits (n-best 20)", 60, "questions/s"),
    ]
    for row in rows:
        assert row.measured == "per_s" and row.value.n == 3
        assert row.median() == pytest.approx(row.get("count") / row.get("seconds").median)
        assert (row.get("max_seq_length"), row.get("doc_stride"), row.get("max_query_length")) == (32, 8, 12)
    assert rows[1].get("questions") == 60 and windows["train"] > 120  # windows: every question's context, in strides


def test_each_figure_is_the_median_of_its_repeats_with_their_range(monkeypatch):
    clock = iter([0.0, 1.0, 10.0, 14.0, 20.0, 22.0])  # a fake clock: three calls of 1, 4 and 2 seconds
    monkeypatch.setattr(squad_data.time, "perf_counter", lambda: next(clock))
    result, seconds = squad_data.timed(lambda: "done", repeats=3)
    assert (result, seconds) == ("done", [1.0, 4.0, 2.0])
    settings = squad_data.SquadDataSettings(output_dir="unused")
    row = squad_data.speed_row(settings, "train features", 100, "windows", seconds)
    # CV: the sample stdev over the mean, of the seconds (1.528 / 2.333) and of the rates (38.19 / 58.33)
    assert row.get("seconds") == Spread(2.0, 1.0, 4.0, pytest.approx(0.6547, abs=1e-4), 3)
    assert row.value == Spread(50.0, 25.0, 100.0, pytest.approx(0.6547, abs=1e-4), 3)
    assert (row.unit, row.get("items"), row.get("count")) == ("windows/s", "windows", 100)


def test_the_assembled_corpus_has_squads_shape_at_scale(tmp_path):
    corpus = squad_data.assemble_corpus(str(tmp_path), scale=0.002)
    for split, (paragraphs, questions) in squad_data.SQUAD_SIZES.items():
        data = json.loads((tmp_path / f"{split}-v1.1.json").read_text())["data"]
        assert len(data) == round(paragraphs * 0.002)
        assert sum(len(article["paragraphs"][0]["qas"]) for article in data) == round(questions * 0.002)
        for article in data:  # every answer is where answer_start says
            context = article["paragraphs"][0]["context"]
            for qa in article["paragraphs"][0]["qas"]:
                answer = qa["answers"][0]
                assert context[answer["answer_start"] :].startswith(answer["text"])
    assert corpus["sentences"] > 100
    assert (tmp_path / "vocab.txt").read_text().split("\n")[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--train_file=x.json"], "--train_file given without --predict_file --vocab_file: give all three"),
        (["--train_file=x", "--predict_file=y", "--vocab_file=z"], "--train_file x: no such file"),
        (["--scale=0"], "--scale must be positive, got 0.0"),
        (["--max_seq_length=60"], "--max_seq_length 60 leaves no room for context after --max_query_length 64"),
        (["--repeats=0"], "--repeats must be positive, got 0"),
    ],
)
def test_bad_settings_fail_in_one_line_and_write_nothing(tmp_path, error_line, flags, message):
    out = tmp_path / "out"
    assert squad_data.main(flags + [f"--output_dir={out}"]) == 2
    assert message in error_line() and not out.exists()
