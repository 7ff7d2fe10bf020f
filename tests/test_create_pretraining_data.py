"""create_pretraining_data on small corpora of the built-in task's words: NVIDIA's shard layout, Google's instances
and masking checked row by row against the text, determinism across workers, length bins, streaming in small
chunks, and output that is all there or not there at all."""

import json
import os
import random

import h5py
import numpy as np
import pytest

from bertbench.tasks.create_pretraining_data import build_parser, create_pretraining_data, main
from bertbench.tasks.pretraining import NVIDIA_DTYPES, SHARD_KEYS
from bertbench.tasks.pretraining_data.settings import DataError, DataSettings
from bertbench.tasks.synthetic import NEGATIVE, NOUNS, POSITIVE, VERBS, vocabulary, write_vocab

SEQ, PREDICTIONS = 32, 5
SUBWORDS = ["##s", "##ish"]  # "cats" -> cat ##s, "foxish" -> fox ##ish


def sentence(rng: random.Random, subwords: bool = False) -> str:
    """'the ADJ* NOUN VERB the ADJ* NOUN .', 6 to 12 words; with `subwords` some nouns take a '##' piece."""

    def noun() -> str:
        adjectives = " ".join(rng.choice(POSITIVE + NEGATIVE) for _ in range(rng.randint(0, 2)))
        ending = rng.choice(["", "s", "ish"]) if subwords else ""
        return f"{adjectives} {rng.choice(NOUNS)}{ending}".strip()

    return f"the {noun()} {rng.choice(VERBS)} the {noun()} ."


def write_corpus(path, documents: int, seed: int = 0, subwords: bool = False) -> list[str]:
    """Google's format; returns each document's text as its tokens joined by spaces."""
    rng = random.Random(seed)
    texts = []
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(documents):
            lines = [sentence(rng, subwords) for _ in range(rng.randint(1, 8))]
            handle.write("\n".join(lines) + "\n\n")
            texts.append(" ".join(lines))
    if subwords:
        texts = [
            " ".join(
                f"{word[:-3]} ##ish"
                if word.endswith("ish")
                else f"{word[:-1]} ##s"
                if word.endswith("s") and word[:-1] in NOUNS
                else word
                for word in text.split()
            )
            for text in texts
        ]
    return texts


def flags(corpus, vocab, out, *extra) -> list[str]:
    return [
        f"--input_file={corpus}",
        f"--vocab_file={vocab}",
        f"--output_dir={out}",
        f"--max_seq_length={SEQ}",
        f"--max_predictions_per_seq={PREDICTIONS}",
        "--dupe_factor=3",
        *extra,
    ]


def read(paths) -> dict[str, np.ndarray]:
    """The shards' datasets, rows of all files in order."""
    arrays = {key: [] for key in SHARD_KEYS}
    for path in paths:
        with h5py.File(path, "r") as shard:
            for key in SHARD_KEYS:
                arrays[key].append(shard[key][:])
    return {key: np.concatenate(values) for key, values in arrays.items()}


def shard_paths(directory, count: int) -> list:
    return [directory / f"training_{index:05d}.hdf5" for index in range(count)]


def check_instances(
    arrays, words: list[str], documents: list[str], masked_lm_prob: float = 0.15, whole_words: bool = False
) -> dict[str, np.ndarray]:
    """Assert what every row must satisfy; returns the original tokens (masks undone), lengths and A's lengths."""
    ids = {word: index for index, word in enumerate(words)}
    cls, sep, mask = ids["[CLS]"], ids["[SEP]"], ids["[MASK]"]
    input_ids, input_mask, segment_ids = arrays["input_ids"], arrays["input_mask"], arrays["segment_ids"]
    positions, labels = arrays["masked_lm_positions"], arrays["masked_lm_ids"]
    width = input_ids.shape[1]
    lengths = input_mask.sum(axis=1)
    real = np.arange(width) < lengths[:, None]
    assert (input_mask == real).all() and (input_ids[~real] == 0).all() and (segment_ids[~real] == 0).all()
    assert (input_ids[:, 0] == cls).all()
    originals = input_ids.copy()
    a_lengths = np.zeros(len(input_ids), dtype=int)
    texts = [f" {text} " for text in documents]
    for row in range(len(input_ids)):
        count = int((positions[row] > 0).sum())  # position 0 is [CLS], never masked: 0 is padding
        chosen = positions[row, :count]
        assert (positions[row, count:] == 0).all() and (labels[row, count:] == 0).all()
        assert (np.diff(chosen) > 0).all() and chosen.max() < lengths[row]
        originals[row, chosen] = labels[row, :count]
        seps = np.flatnonzero(originals[row, : lengths[row]] == sep)
        assert len(seps) == 2 and seps[1] == lengths[row] - 1, originals[row]
        a_lengths[row] = seps[0] - 1
        assert (segment_ids[row, : seps[0] + 1] == 0).all() and (
            segment_ids[row, seps[0] + 1 : lengths[row]] == 1
        ).all()
        assert not set(chosen.tolist()) & {0, *seps.tolist()}
        wanted = min(PREDICTIONS, max(1, int(round(lengths[row] * masked_lm_prob))))
        assert count == wanted if not whole_words else 1 <= count <= wanted
        # A and B are runs of words of the corpus; unless B is random it follows A in A's document, right after
        # it when the pair was not truncated (truncation may cut A's end and B's start).
        a_text = " " + " ".join(words[index] for index in originals[row, 1 : seps[0]]) + " "
        b_text = " " + " ".join(words[index] for index in originals[row, seps[0] + 1 : seps[1]]) + " "
        assert any(a_text in text for text in texts) and any(b_text in text for text in texts), (a_text, b_text)
        if not arrays["next_sentence_labels"][row]:
            if lengths[row] < SEQ:
                assert any(a_text[:-1] + b_text in text for text in texts), (a_text, b_text)
            else:
                assert any(
                    text.find(b_text, text.find(a_text) + len(a_text) - 1) > 0 for text in texts if a_text in text
                ), (a_text, b_text)
    replaced = input_ids[np.arange(len(input_ids))[:, None], positions][positions > 0]
    assert_near((replaced == mask).mean(), 0.8, len(replaced))
    assert_near((replaced == labels[positions > 0]).mean(), 0.1 + 0.1 / len(words), len(replaced))  # kept
    return {"originals": originals, "lengths": lengths, "a_lengths": a_lengths}


def assert_near(share: float, probability: float, count: int) -> None:
    """`share` of `count` draws is within 4 standard deviations of `probability`."""
    assert abs(share - probability) < 4 * (probability * (1 - probability) / count) ** 0.5, (share, probability)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    documents = write_corpus(root / "corpus.txt", documents=300)
    return root / "corpus.txt", write_vocab(root), documents


@pytest.fixture(scope="module")
def made(corpus, tmp_path_factory):
    """The corpus made into two shards, once with one worker and once with two."""
    text, vocab, _ = corpus
    outs = [tmp_path_factory.mktemp("made") / "out", tmp_path_factory.mktemp("made") / "out"]
    for out, workers in zip(outs, (1, 2)):
        assert main(flags(text, vocab, out, "--num_shards=2", f"--num_workers={workers}")) == 0
    return outs


def test_shards_have_nvidia_layout_and_statistics(made, corpus):
    out = made[0]
    assert sorted(os.listdir(out)) == ["create_pretraining_data.json", "training_00000.hdf5", "training_00001.hdf5"]
    with open(out / "create_pretraining_data.json") as handle:
        stats = json.load(handle)
    rows = 0
    for path in shard_paths(out, 2):
        with h5py.File(path, "r") as shard:
            assert sorted(shard) == sorted(SHARD_KEYS)
            count = len(shard["next_sentence_labels"])
            for key in SHARD_KEYS:
                assert shard[key].dtype == NVIDIA_DTYPES[key] and shard[key].compression == "gzip"
                assert shard[key].shape == {
                    "masked_lm_positions": (count, PREDICTIONS),
                    "masked_lm_ids": (count, PREDICTIONS),
                    "next_sentence_labels": (count,),
                }.get(key, (count, SEQ))
            attrs = dict(shard.attrs)
            assert {
                key: attrs[key]
                for key in (
                    "max_seq_length",
                    "dupe_factor",
                    "length_bin_edge",
                    "vocab_size",
                    "random_seed",
                    "do_whole_word_mask",
                )
            } == {
                "max_seq_length": SEQ,
                "dupe_factor": 3,
                "length_bin_edge": SEQ,
                "vocab_size": len(vocabulary()),
                "random_seed": 12345,
                "do_whole_word_mask": False,
            }
            rows += count
    assert stats["instances"] == rows and stats["documents"] == 300 and stats["num_workers"] == 1
    assert stats["sentences"] == sum(1 for line in open(corpus[0]) if line.strip())
    assert stats["input_bytes"] == os.path.getsize(corpus[0]) == stats["input_files"][0]["bytes"]
    assert stats["padded_tokens"] == rows * SEQ and 0 < stats["tokens"] < stats["padded_tokens"]
    assert stats["peak_rss_bytes"] > 0 and stats["peak_worker_rss_bytes"] > 0 and stats["seconds"] > 0
    assert {"sentences_per_second", "megabytes_per_second", "padding_fraction", "settings"} <= set(stats)
    assert "padded_tokens_with_bins" not in stats


def test_instances_are_googles_pairs_with_googles_masks(made, corpus):
    arrays = read(shard_paths(made[0], 2))
    found = check_instances(arrays, vocabulary(), corpus[2])
    assert 0.4 < arrays["next_sentence_labels"].mean() < 0.65
    assert len(np.unique(found["lengths"])) > 10  # short_seq_prob and document ends give shorter instances


def test_output_does_not_depend_on_workers_but_on_the_seed(made, corpus, tmp_path):
    one, two = (read(shard_paths(out, 2)) for out in made)
    for key in SHARD_KEYS:
        assert np.array_equal(one[key], two[key]), key
    assert main(flags(corpus[0], corpus[1], tmp_path / "seed", "--num_shards=2", "--random_seed=7")) == 0
    other = read(shard_paths(tmp_path / "seed", 2))
    assert other["input_ids"].shape != one["input_ids"].shape or not np.array_equal(
        other["input_ids"], one["input_ids"]
    )


def test_python_api_returns_the_statistics(corpus, tmp_path, capsys):
    settings = DataSettings(
        input_file=str(corpus[0]),
        vocab_file=corpus[1],
        output_file=str(tmp_path / "one.hdf5"),
        max_seq_length=SEQ,
        max_predictions_per_seq=PREDICTIONS,
        dupe_factor=1,
    )
    stats = create_pretraining_data(settings)
    assert sorted(os.listdir(tmp_path)) == ["one.hdf5", "one.hdf5.json"]
    with open(tmp_path / "one.hdf5.json") as handle:
        assert json.load(handle)["instances"] == stats["instances"] == len(read([tmp_path / "one.hdf5"])["input_ids"])
    assert f"{stats['instances']:,} instances" in capsys.readouterr().out


def test_whole_word_masking_masks_every_piece_of_a_word(tmp_path):
    words = vocabulary() + SUBWORDS
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    documents = write_corpus(tmp_path / "corpus.txt", documents=150, subwords=True)
    split_alone = {}
    for whole in (True, False):
        out = tmp_path / f"whole_{whole}"
        assert (
            main(
                flags(
                    tmp_path / "corpus.txt",
                    tmp_path / "vocab.txt",
                    out,
                    f"--do_whole_word_mask={whole}",
                    "--masked_lm_prob=0.3",
                )
            )
            == 0
        )
        arrays = read(shard_paths(out, 1))
        found = check_instances(arrays, words, documents, masked_lm_prob=0.3, whole_words=whole)
        subword = np.isin(found["originals"], [words.index(piece) for piece in SUBWORDS])
        alone = 0
        for row, positions in enumerate(arrays["masked_lm_positions"]):
            masked = set(positions[positions > 0].tolist())
            segment_starts = {1, found["a_lengths"][row] + 2}
            for position in range(1, found["lengths"][row] - 1):
                joined = subword[row, position] and position not in segment_starts  # continues the word before
                alone += joined and (position in masked) != (position - 1 in masked)
        split_alone[whole] = alone
    assert split_alone[True] == 0 and split_alone[False] > 10


def test_length_bins_pad_each_instance_to_the_smallest_bin_that_holds_it(corpus, tmp_path, capsys):
    out = tmp_path / "bins"
    assert (
        main(flags(corpus[0], corpus[1], out, "--length_bins=4,16,24,32", "--short_seq_prob=0.5", "--num_shards=2"))
        == 0
    )
    assert sorted(os.listdir(out)) == ["create_pretraining_data.json", "len_16", "len_24", "len_32"]
    assert "length bin 4: no instances" in capsys.readouterr().out  # no instance is shorter than 5 tokens
    with open(out / "create_pretraining_data.json") as handle:
        stats = json.load(handle)
    tokens = 0
    for low, edge in ((4, 16), (16, 24), (24, 32)):
        paths = shard_paths(out / f"len_{edge}", 2)
        assert sorted(os.listdir(out / f"len_{edge}")) == [path.name for path in paths]
        arrays = read(paths)
        assert arrays["input_ids"].shape == (stats["instances_per_bin"][str(edge)], edge)
        with h5py.File(paths[0], "r") as shard:
            assert shard.attrs["length_bin_edge"] == edge
        lengths = check_instances(arrays, vocabulary(), corpus[2])["lengths"]
        assert (lengths > low).all() and (lengths <= edge).all()
        tokens += lengths.sum()
    assert stats["tokens"] == tokens and stats["instances_per_bin"]["4"] == 0
    assert stats["padded_tokens_with_bins"] < stats["padded_tokens"]
    assert stats["padding_fraction_with_bins"] < stats["padding_fraction"] and stats["padding_saved_fraction"] > 0


def test_small_chunks_stream_the_corpus_into_balanced_shards(tmp_path):
    documents = write_corpus(tmp_path / "corpus.txt", documents=400, seed=3)
    vocab = write_vocab(tmp_path)
    out = tmp_path / "out"
    assert (
        main(
            flags(
                tmp_path / "corpus.txt",
                vocab,
                out,
                "--chunk_megabytes=0.001",
                "--num_shards=3",
                "--length_bins=24,32",
                "--num_workers=2",
                "--dupe_factor=1",
            )
        )
        == 0
    )
    with open(out / "create_pretraining_data.json") as handle:
        stats = json.load(handle)
    assert stats["chunks"] > 20 and stats["documents"] == 400
    for edge in (24, 32):
        sizes = []
        for path in shard_paths(out / f"len_{edge}", 3):
            arrays = read([path])
            sizes.append(len(arrays["input_ids"]))
        assert max(sizes) - min(sizes) <= 1 and sum(sizes) == stats["instances_per_bin"][str(edge)]
    check_instances(read(shard_paths(out / "len_32", 3)), vocabulary(), documents)


def test_refuses_an_existing_output_file_and_touches_nothing(corpus, tmp_path, error_line):
    out = tmp_path / "out"
    out.mkdir()
    (out / "training_00001.hdf5").write_bytes(b"keep")
    assert main(flags(corpus[0], corpus[1], out, "--num_shards=2")) == 2
    assert (
        error_line() == f"create_pretraining_data: error: {out / 'training_00001.hdf5'}: already exists; "
        "remove it or choose another output"
    )
    assert os.listdir(out) == ["training_00001.hdf5"] and (out / "training_00001.hdf5").read_bytes() == b"keep"


def test_a_decode_error_midway_leaves_nothing(corpus, tmp_path, error_line):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"the cat sees the dog .\n" * 100 + b"the \xff cat .\n")
    out = tmp_path / "new" / "out"
    assert main(flags(f"{corpus[0]},{bad}", corpus[1], out, "--chunk_megabytes=0.001")) == 2
    assert (
        error_line() == f"create_pretraining_data: error: {bad}:101: not valid UTF-8 (invalid start byte at "
        "byte 5 of the line)"
    )
    assert not out.exists() and os.listdir(tmp_path / "new") == []


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--length_bins=16,8,32"], "--length_bins must be positive and ascending, got 16,8,32"),
        (["--length_bins=16,24"], "--length_bins must end at --max_seq_length 32, got 16,24"),
        (["--length_bins=16,x"], "argument --length_bins: '16,x': invalid literal for int() with base 10: 'x'"),
        (["--masked_lm_prob=1"], "--masked_lm_prob must be between 0 and 1, got 1.0"),
        (["--max_predictions_per_seq=32"], "--max_predictions_per_seq (32) must be less than --max_seq_length (32)"),
        (["--num_workers=0"], "--num_workers must be positive, got 0"),
    ],
)
def test_bad_flags_are_one_line_errors(corpus, tmp_path, error_line, extra, message):
    assert main(flags(corpus[0], corpus[1], tmp_path / "out", *extra)) == 2
    assert error_line() == f"create_pretraining_data: error: {message}"
    assert not (tmp_path / "out").exists()


def test_bad_input_is_a_one_line_error_naming_it(corpus, tmp_path, error_line):
    assert main(flags(tmp_path / "nothing*.txt", corpus[1], tmp_path / "out")) == 2
    assert error_line() == f"create_pretraining_data: error: --input_file {tmp_path / 'nothing*.txt'}: no such file"
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n")
    assert main(flags(blank, corpus[1], tmp_path / "out")) == 2
    assert error_line() == f"create_pretraining_data: error: {blank}: no documents (every line is blank)"
    assert main(flags(corpus[0], tmp_path / "missing.txt", tmp_path / "out")) == 2
    assert "missing.txt: no such vocabulary file" in error_line()
    assert not (tmp_path / "out").exists()


def test_flags_are_the_settings_with_googles_defaults(corpus):
    parser = build_parser()
    fields = [name for name in DataSettings.__dataclass_fields__]
    assert [
        action.dest for action in parser._actions if action.dest != "help" and action.help != "==SUPPRESS=="
    ] == fields
    assert {
        name: parser.defaults[name]
        for name in (
            "max_seq_length",
            "max_predictions_per_seq",
            "random_seed",
            "dupe_factor",
            "masked_lm_prob",
            "short_seq_prob",
            "do_lower_case",
            "do_whole_word_mask",
        )
    } == {
        "max_seq_length": 128,
        "max_predictions_per_seq": 20,
        "random_seed": 12345,
        "dupe_factor": 10,
        "masked_lm_prob": 0.15,
        "short_seq_prob": 0.1,
        "do_lower_case": True,
        "do_whole_word_mask": False,
    }
    given = vars(parser.parse_args(["--input_file=a", "--vocab_file=v", "--output_file=o", "--do_lower_case=false"]))
    assert given["do_lower_case"] is False
    assert (
        vars(parser.parse_args(["--input_file=a", "--vocab_file=v", "--output_dir=o", "--nodo_lower_case"]))[
            "do_lower_case"
        ]
        is False
    )
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--input_file=a", "--vocab_file=v", "--output_dir=o", "--output_file=p"])
    assert exit_info.value.code == 2
    with pytest.raises(DataError, match="--output_file writes one shard"):
        DataSettings(input_file="a", vocab_file="v", output_file="o", num_shards=2)
