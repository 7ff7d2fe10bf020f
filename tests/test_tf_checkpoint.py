"""The pure-Python TF checkpoint reader against checkpoints real TensorFlow wrote (tests/fixtures/tf1_tiny)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bertbench.weights.tf_checkpoint import (
    TFCheckpoint,
    TFCheckpointError,
    list_variables,
    masked_crc32c,
    read_tf_checkpoint,
    read_varint,
)

FIXTURE = Path(__file__).parent / "fixtures" / "tf1_tiny"
PREFIXES = ["bert_model.ckpt", "classifier.ckpt", "dtypes/dtypes.ckpt", "tf2/ckpt-2"]
EXPECTED = np.load(FIXTURE / "expected_values.npz")
VARIABLES = json.loads((FIXTURE / "expected_variables.json").read_text())


def expected_for(prefix):
    return {
        key.split(":", 1)[1]: (dtype, tuple(shape))
        for key, (dtype, shape) in VARIABLES.items()
        if key.startswith(prefix + ":")
    }


def copy_checkpoint(tmp_path, prefix="bert_model.ckpt"):
    for path in FIXTURE.glob(prefix + ".*"):
        shutil.copy(path, tmp_path / path.name)
    return tmp_path / Path(prefix).name


@pytest.mark.parametrize("prefix", PREFIXES)
def test_list_variables_matches_tensorflow(prefix):
    assert list_variables(FIXTURE / prefix) == expected_for(prefix)


@pytest.mark.parametrize("prefix", PREFIXES)
def test_values_are_tensorflows_bit_for_bit(prefix):
    checkpoint = TFCheckpoint(FIXTURE / prefix)
    # TensorFlow can read its partitioned variable; bertbench refuses it (tested below).
    names = [name for name in expected_for(prefix) if f"{prefix}:{name}" in EXPECTED.files and name != "partitioned"]
    assert names
    for name in names:
        value, expected = checkpoint.read(name), EXPECTED[f"{prefix}:{name}"]
        assert value.dtype == expected.dtype and value.shape == expected.shape, name
        assert value.tobytes() == expected.tobytes(), name


def test_reads_all_of_an_nvidia_style_checkpoint_with_slots_and_step():
    values = read_tf_checkpoint(FIXTURE / "bert_model.ckpt")
    assert set(values) == set(expected_for("bert_model.ckpt"))
    assert values["global_step"].dtype == np.int64 and values["global_step"] == 12345
    assert values["loss_scale"] == 32768.0
    slot = "bert/encoder/layer_1/attention/self/query/kernel/adam_v"
    np.testing.assert_array_equal(values[slot], EXPECTED[f"bert_model.ckpt:{slot}"])
    gamma = values["bert/embeddings/LayerNorm/gamma"]
    assert 0.5 < gamma.mean() < 1.5 and gamma.std() > 0  # the fixture is random, not zeros


def test_reads_selected_names_and_every_dtype_from_two_shards():
    checkpoint = TFCheckpoint(FIXTURE / "dtypes" / "dtypes.ckpt")
    assert checkpoint.num_shards == 2
    values = read_tf_checkpoint(
        FIXTURE / "dtypes" / "dtypes.ckpt", names=["half", "bfloat16", "double", "int32", "int64", "flags", "scalar"]
    )
    assert {name: value.dtype.name for name, value in values.items()} == {
        "half": "float16",
        "bfloat16": "float32",
        "double": "float64",
        "int32": "int32",
        "int64": "int64",
        "flags": "bool",
        "scalar": "float32",
    }
    assert values["scalar"].shape == ()


def test_refuses_string_and_partitioned_variables():
    checkpoint = TFCheckpoint(FIXTURE / "dtypes" / "dtypes.ckpt")
    with pytest.raises(TFCheckpointError, match=r"dtypes\.ckpt\.index: tensor 'text' has unsupported dtype string"):
        checkpoint.read("text")
    with pytest.raises(TFCheckpointError, match=r"tensor 'partitioned' is a partitioned variable"):
        checkpoint.read("partitioned")
    with pytest.raises(TFCheckpointError, match=r"no tensor named 'nope'"):
        checkpoint.read("nope")


def test_tf2_directory_follows_the_checkpoint_file_and_skips_the_object_graph():
    values = read_tf_checkpoint(FIXTURE / "tf2")
    assert set(values) == {
        "kernel/.ATTRIBUTES/VARIABLE_VALUE",
        "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
        "step/.ATTRIBUTES/VARIABLE_VALUE",
    }
    assert values["step/.ATTRIBUTES/VARIABLE_VALUE"] == 2  # ckpt-2, the latest, not ckpt-1


@pytest.mark.parametrize(
    "form", ["bert_model.ckpt", "bert_model.ckpt.index", "bert_model.ckpt.data-00000-of-00001", "."]
)
def test_path_forms(tmp_path, form):
    copy_checkpoint(tmp_path)
    assert TFCheckpoint(tmp_path / form).prefix == str(tmp_path / "bert_model.ckpt")


def test_checkpoint_file_with_a_path_from_another_machine(tmp_path):
    copy_checkpoint(tmp_path)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "/gone/run7/bert_model.ckpt"\n')
    assert TFCheckpoint(tmp_path).prefix == str(tmp_path / "bert_model.ckpt")


def test_directory_with_several_checkpoints_is_ambiguous():
    with pytest.raises(
        TFCheckpointError,
        match=r"tf1_tiny: expected exactly one \*\.index checkpoint, found "
        r"bert_model\.ckpt\.index, classifier\.ckpt\.index",
    ):
        TFCheckpoint(FIXTURE)


def test_missing_index(tmp_path):
    with pytest.raises(TFCheckpointError, match=r"nothing\.ckpt\.index: no such file"):
        list_variables(tmp_path / "nothing.ckpt")


def test_flipped_data_byte_is_a_crc_error_naming_the_tensor(tmp_path):
    prefix = copy_checkpoint(tmp_path)
    name = "bert/encoder/layer_1/output/dense/kernel"
    entry = TFCheckpoint(prefix).entries[name]
    data = tmp_path / "bert_model.ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[entry.offset + entry.size // 2] ^= 0x10
    data.write_bytes(raw)
    with pytest.raises(TFCheckpointError, match=rf"data-00000-of-00001: CRC mismatch in tensor '{name}'"):
        read_tf_checkpoint(prefix)
    assert read_tf_checkpoint(prefix, names=["bert/pooler/dense/bias"])  # other tensors stay readable


def test_truncated_data_file(tmp_path):
    prefix = copy_checkpoint(tmp_path)
    data = tmp_path / "bert_model.ckpt.data-00000-of-00001"
    data.write_bytes(data.read_bytes()[:-100])
    with pytest.raises(TFCheckpointError, match=r"bert_model\.ckpt\.data-00000-of-00001: truncated: tensor"):
        read_tf_checkpoint(prefix)


def test_missing_data_shard(tmp_path):
    prefix = copy_checkpoint(tmp_path, "dtypes/dtypes.ckpt")
    (tmp_path / "dtypes.ckpt.data-00001-of-00002").unlink()
    assert read_tf_checkpoint(prefix, names=["half"])  # shard 0 is still there
    with pytest.raises(TFCheckpointError, match=r"dtypes\.ckpt\.data-00001-of-00002: no such file \(data shard 1"):
        read_tf_checkpoint(prefix, names=["int32"])


def test_damaged_index_block(tmp_path):
    prefix = copy_checkpoint(tmp_path)
    index = tmp_path / "bert_model.ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[20] ^= 0x01  # inside the first data block
    index.write_bytes(raw)
    with pytest.raises(TFCheckpointError, match=r"bert_model\.ckpt\.index: corrupt index \(CRC mismatch"):
        list_variables(prefix)


def test_bad_magic(tmp_path):
    prefix = copy_checkpoint(tmp_path)
    index = tmp_path / "bert_model.ckpt.index"
    index.write_bytes(index.read_bytes()[:-1] + b"\x00")
    with pytest.raises(TFCheckpointError, match=r"bert_model\.ckpt\.index: not a TensorFlow checkpoint index"):
        list_variables(prefix)


def test_compressed_block_is_refused(tmp_path):
    prefix = copy_checkpoint(tmp_path)
    index = tmp_path / "bert_model.ckpt.index"
    raw = bytearray(index.read_bytes())
    footer = bytes(raw[-48:])
    _, pos = read_varint(footer, 0, "footer")
    _, pos = read_varint(footer, pos, "footer")
    offset, pos = read_varint(footer, pos, "footer")
    size, _ = read_varint(footer, pos, "footer")
    raw[offset + size] = 1  # snappy, with a CRC that matches so only the compression type is wrong
    raw[offset + size + 1 : offset + size + 5] = masked_crc32c(bytes(raw[offset : offset + size + 1])).to_bytes(
        4, "little"
    )
    index.write_bytes(raw)
    with pytest.raises(TFCheckpointError, match=r"uses compression type 1"):
        list_variables(prefix)
