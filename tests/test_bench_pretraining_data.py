"""`bertbench bench pretraining-data`: the synthetic corpus and vocab, one create_pretraining_data process per worker
count, the figures it reports, and one-line errors."""

import numpy as np
import pytest

from bertbench import cli as bertbench_cli
from bertbench.bench import pretraining_data, settings
from bertbench.bench.results import BenchResult, Ratio
from bertbench.tasks.synthetic import write_vocab
from bertbench.tasks.tokenization import BertTokenizer

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SMALL = ["--megabytes", "0.3", "--num_shards", "2", "--max_seq_length", "64", "--max_predictions_per_seq", "10"]


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    out = tmp_path_factory.mktemp("pretraining-data")
    assert (
        pretraining_data.main(
            SMALL + ["--workers", "1,2", "--length_bins_at", "128", "--keep_corpus", "--output_dir", str(out)]
        )
        == 0
    )
    return out, BenchResult.read(str(out / "pretraining-data.json"))


@pytest.mark.slow
def test_every_worker_count_makes_the_same_instances_and_reports_its_figures(measured):
    out, result = measured
    one, two, _ = result.rows
    assert (one.setting, two.setting) == (
        {"workers": 1, "max_seq_length": 64, "max_predictions_per_seq": 10, "bins": None},
        {"workers": 2, "max_seq_length": 64, "max_predictions_per_seq": 10, "bins": None},
    )
    # one run each: no spread, so the speed-up is never marked noisy
    assert one.get("speedup") == Ratio(1.0, None) and two.get("speedup") == Ratio(two.median() / one.median(), None)
    for key in ("documents", "sentences", "instances", "tokens"):
        assert one.get(key) == two.get(key) > 0, key
    corpus_bytes = (out / pretraining_data.KEPT_CORPUS).stat().st_size
    for row in (one, two):
        assert (row.measured, row.unit, row.value.n) == ("mb_per_s", "MB/s", 1)
        assert row.get("sentences_per_s") == pytest.approx(row.get("sentences") / row.get("seconds"))
        assert row.get("input_mb") == corpus_bytes / 1e6  # the whole corpus read, whatever the worker count
        assert row.median() == pytest.approx(corpus_bytes / 1e6 / row.get("seconds"))
        # every instance padded to --max_seq_length 64
        assert row.get("padding_fraction") == pytest.approx(1 - row.get("tokens") / (row.get("instances") * 64))
        # MiB of a Python process with NumPy, not bytes or GiB
        assert 10 < row.get("peak_rss_main_mib") < 4096 and 10 < row.get("peak_rss_worker_mib") < 4096
        assert row.get("output_mb") > 0
    assert result.context["corpus"]["source"] == "synthetic"


@pytest.mark.slow
def test_length_bins_run_saves_padding(measured):
    _, result = measured
    row = result.rows[-1]
    assert row.setting == {"workers": 2, "max_seq_length": 128, "max_predictions_per_seq": 20, "bins": "32,64,96,128"}
    assert row.get("length_bins") == [32, 64, 96, 128] and row.get("speedup") is None  # other settings
    assert row.get("padding_fraction_with_bins") < row.get("padding_fraction")
    assert row.get("padding_saved_fraction") == pytest.approx(
        1 - row.get("padding_fraction_with_bins") / row.get("padding_fraction"), abs=0.05
    )


def test_markdown_plots_and_kept_corpus(measured):
    out, _ = measured
    assert "| 2 | 64 | – |" in (out / "pretraining-data.md").read_text()
    for name in ("throughput", "memory"):
        assert (out / f"pretraining-data-{name}.png").read_bytes().startswith(PNG_SIGNATURE)
    assert (out / pretraining_data.KEPT_CORPUS).stat().st_size > 0.3e6
    assert len((out / pretraining_data.KEPT_VOCAB).read_text().split("\n")) == 30522 + 1
    assert not [path.name for path in out.iterdir() if path.name.startswith(".")]  # the work directory is gone


def test_synthetic_corpus_is_deterministic_and_in_googles_format(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        pretraining_data.make_synthetic_corpus(str(tmp_path / name), 0.2, seed=7, vocab_file=None)
    first = (tmp_path / "a" / "corpus.txt").read_bytes()
    assert first == (tmp_path / "b" / "corpus.txt").read_bytes() and len(first) >= 0.2e6
    documents = first.decode().strip("\n").split("\n\n")
    assert len(documents) > 10 and all("" not in document.split("\n") for document in documents)
    assert all(line[0].isupper() and line[-1] in ".?!" for line in documents[0].split("\n"))


def test_synthetic_vocab_has_berts_size_and_splits_rare_words(tmp_path):
    info = pretraining_data.make_synthetic_corpus(str(tmp_path), 0.5, seed=0, vocab_file=None)
    vocab = (tmp_path / "vocab.txt").read_text().split("\n")[:-1]
    assert len(vocab) == len(set(vocab)) == 30522
    assert {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"} <= set(vocab) and vocab[0] == "[PAD]"
    tokenizer = BertTokenizer.from_vocab_file(info["vocab_file"])
    text = (tmp_path / "corpus.txt").read_text()[:20000]
    pieces = tokenizer.tokenize(text)
    assert "[UNK]" not in pieces
    split_share = np.mean([piece.startswith("##") for piece in pieces])
    assert 0.01 < split_share < 0.5  # some words are split into WordPieces, most are whole


def test_a_user_corpus(tmp_path):
    corpus = tmp_path / "text.txt"
    corpus.write_text(
        "the happy cat sees the sad dog .\nthe calm owl likes the kind fox .\n\n"
        "the rude wolf finds the dull deer .\nthe bright bird meets the grim lion .\n"
    )
    out = tmp_path / "out"
    assert (
        bertbench_cli.main(
            [
                "bench",
                "pretraining-data",
                "--corpus",
                str(corpus),
                "--vocab_file",
                write_vocab(tmp_path),
                "--workers",
                "1",
                "--max_seq_length",
                "32",
                "--max_predictions_per_seq",
                "5",
                "--num_shards",
                "1",
                "--output_dir",
                str(out),
            ]
        )
        == 0
    )
    (row,) = BenchResult.read(str(out / "pretraining-data.json")).rows
    assert row.get("documents") == 2 and row.get("sentences") == 4


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--corpus=a.txt", "--megabytes=5"], "--corpus and --megabytes: give one"),
        (["--corpus=a.txt"], "--corpus needs --vocab_file"),
        (["--workers=1,0"], "--workers must be positive, got 1,0"),
    ],
)
def test_contradictory_or_bad_settings_are_one_line(flags, message, tmp_path, error_line):
    assert pretraining_data.main([*flags, "--output_dir", str(tmp_path / "out")]) == 2
    assert message in error_line() and not (tmp_path / "out").exists()


def test_errors_are_one_line_and_results_are_not_overwritten(measured, tmp_path, error_line):
    assert (
        pretraining_data.main(
            ["--corpus", str(tmp_path / "missing.txt"), "--vocab_file", "v.txt", "--output_dir", str(tmp_path / "out")]
        )
        == 2
    )
    assert "--corpus " + str(tmp_path / "missing.txt") + ": no such file" in error_line()
    assert not (tmp_path / "out").exists()
    out, _ = measured
    before = {path.name: path.read_bytes() for path in out.iterdir()}
    assert pretraining_data.main(SMALL + ["--workers", "1", "--output_dir", str(out)]) == 2
    assert "pretraining-data.json exists" in error_line()
    assert {path.name: path.read_bytes() for path in out.iterdir()} == before


def test_a_failing_create_pretraining_data_is_quoted_in_one_line(tmp_path, error_line):
    out = tmp_path / "out"
    assert (
        pretraining_data.main(
            [
                "--megabytes",
                "0.05",
                "--workers",
                "1",
                "--max_seq_length",
                "4",
                "--max_predictions_per_seq",
                "1",
                "--output_dir",
                str(out),
            ]
        )
        == 1
    )
    assert error_line() == (
        "bertbench bench pretraining-data: error: create_pretraining_data with 1 worker(s) failed "
        "(exit 2): create_pretraining_data: error: --max_seq_length must be at least 5 ([CLS] A "
        "[SEP] B [SEP]), got 4"
    )
    assert not out.exists()


def test_the_bench_command_lists_it(capsys):
    assert bertbench_cli.main(["bench", "--help"]) == 0
    assert "  pretraining-data " in capsys.readouterr().out


def test_corpus_files_are_comma_separated_and_the_settings_run_again_from_their_command_line():
    parsed = settings.parse(
        pretraining_data.PretrainingDataSettings,
        ["--corpus=wiki_00.txt,wiki_01.txt", "--vocab_file=vocab.txt", "--workers=1,4", "--output_dir=out"],
        "",
    )
    assert parsed.corpus == ("wiki_00.txt", "wiki_01.txt") and parsed.workers == (1, 4) and parsed.megabytes is None
    assert settings.parse(pretraining_data.PretrainingDataSettings, settings.as_argv(parsed), "") == parsed
