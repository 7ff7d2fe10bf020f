"""`bertbench example-data` and the TF1 checkpoint writer under it: the writer against checkpoints TensorFlow wrote
(tests/fixtures/tf1_tiny: read, written, read again, byte for byte) and the example directory's contents. Every
command of its README.txt runs as printed in test_scripts.py, whose scripts most of them are."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bertbench import example_data
from bertbench.model.config import BertConfig
from bertbench.tasks.tokenization import BertTokenizer
from bertbench.weights.pretrained import load_state_dict
from bertbench.weights.tf_checkpoint import (
    TFCheckpoint,
    TFCheckpointError,
    list_variables,
    read_tf_checkpoint,
    write_tf_checkpoint,
)
from bertbench.weights.tf_names import map_tf_names

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "tf1_tiny"


@pytest.mark.parametrize("prefix", ["bert_model.ckpt", "classifier.ckpt"])
def test_written_checkpoints_are_tensorflows_byte_for_byte(tmp_path, prefix):
    """What TensorFlow wrote, read and written again: the same variables and values, and the same bytes in both
    files (TensorFlow's table layout, header, entries and CRCs)."""
    tensors = read_tf_checkpoint(FIXTURE / prefix)
    written = write_tf_checkpoint(tmp_path / "copy.ckpt", tensors)
    assert list_variables(written) == list_variables(FIXTURE / prefix)
    again = read_tf_checkpoint(written)
    assert all(
        again[name].dtype == value.dtype and again[name].tobytes() == value.tobytes() for name, value in tensors.items()
    )
    for suffix in (".index", ".data-00000-of-00001"):
        assert (tmp_path / f"copy.ckpt{suffix}").read_bytes() == (FIXTURE / f"{prefix}{suffix}").read_bytes()


def test_writer_spans_several_blocks_and_every_writable_dtype(tmp_path):
    tensors = {f"layer_{n:04d}/" + "w" * 300: np.full((2, 3), n, np.float32) for n in range(1000)}  # > 256 KiB of keys
    tensors.update(
        {
            "half": np.arange(3, dtype=np.float16),
            "double": np.ones(2),
            "count": np.int64(7),
            "ids": np.arange(4, dtype=np.int32),
            "flags": np.array([True, False]),
            "empty": np.zeros((0, 3), np.float32),
        }
    )
    checkpoint = TFCheckpoint(write_tf_checkpoint(tmp_path / "big", tensors))
    assert set(checkpoint.entries) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(checkpoint.read(name), value)
        assert checkpoint.read(name).dtype == np.asarray(value).dtype
    with pytest.raises(TFCheckpointError, match="cannot write tensor 'text' of dtype <U1"):
        write_tf_checkpoint(tmp_path / "bad", {"text": np.array(["a"])})


def test_refuses_a_directory_it_would_clobber_before_writing(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine.txt").write_text("keep")
    (tmp_path / "file").write_text("")
    for target, named, message in (
        ("full", "full", "exists and is not empty (pass --overwrite to replace it)"),
        ("file", "file", "exists and is not a directory"),
        ("missing/sub", "missing", "no such directory"),
    ):
        assert example_data.main([str(tmp_path / target)]) == 2
        assert capsys.readouterr().err == f"bertbench example-data: error: {tmp_path / named}: {message}\n"
    assert sorted(os.listdir(tmp_path)) == ["file", "full"] and os.listdir(tmp_path / "full") == ["mine.txt"]


def test_overwrite_replaces_the_directory_whole(tmp_path):
    (tmp_path / "stale.txt").write_text("old")
    assert example_data.main([str(tmp_path), "--overwrite"]) == 0
    assert sorted(os.listdir(tmp_path)) == [
        "README.txt",
        "bert",
        "bert-hf",
        "bert-nvidia",
        "corpus",
        "glue",
        "shards",
        "squad",
    ]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    directory = tmp_path_factory.mktemp("example") / "data"
    assert example_data.main([str(directory)]) == 0
    return directory


def test_the_tiny_bert_is_googles_layout_and_the_hf_directory_holds_the_same_weights(example):
    bert = example / "bert"
    assert sorted(os.listdir(bert)) == [
        "bert_config.json",
        "bert_model.ckpt.data-00000-of-00001",
        "bert_model.ckpt.index",
        "vocab.txt",
    ]
    config = BertConfig.from_json_file(bert / "bert_config.json")
    shapes = {name: shape for name, (_, shape) in list_variables(bert / "bert_model.ckpt").items()}
    mapping = map_tf_names(shapes, config)
    assert not mapping.skipped and "cls/predictions/output_bias" in mapping.names  # Google's names, nothing else
    from_tf, from_hf = load_state_dict(bert / "bert_model.ckpt"), load_state_dict(example / "bert-hf")
    from_nvidia = load_state_dict(example / "bert-nvidia" / "ckpt_1.pt")  # NVIDIA's names, read as HF's
    assert set(from_tf) <= set(from_hf) | {"cls.predictions.decoder.weight"} and set(from_hf) <= set(from_nvidia)
    for name, value in from_tf.items():
        assert torch.equal(value, from_hf[name]) and torch.equal(value, from_nvidia[name]), name
    assert 0.01 < from_tf["bert.encoder.layer.0.attention.self.query.weight"].std() < 0.03  # initializer_range 0.02


def test_every_file_is_tokenised_by_the_one_vocabulary(example):
    tokenizer = BertTokenizer.from_vocab_file(example / "bert" / "vocab.txt", do_lower_case=True)
    rows = (example / "glue" / "MRPC" / "train.tsv").read_text().splitlines()[1:]
    texts = [(example / "corpus" / "train.txt").read_text()] + [" ".join(row.split("\t")[3:]) for row in rows]
    for version in ("1.1", "2.0"):
        dataset = json.loads((example / "squad" / f"v{version}" / f"train-v{version}.json").read_text())
        texts += [
            paragraph["context"] + " " + " ".join(qa["question"] for qa in paragraph["qas"])
            for article in dataset["data"]
            for paragraph in article["paragraphs"]
        ]
    assert all("[UNK]" not in tokenizer.tokenize(text) for text in texts)
    for name, seq in (("phase1", 128), ("phase2", 512), ("eval", 128)):
        stats = json.loads((example / "shards" / name / "create_pretraining_data.json").read_text())
        assert stats["settings"]["max_seq_length"] == seq
        assert stats["settings"]["input_file"].startswith(f"{example}/corpus/")  # the paths a user sees
