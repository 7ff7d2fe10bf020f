"""Reading NVIDIA / MLPerf pre-training shards, the shard stream (ranks, resume, length bins) and the accuracies."""

import types

import h5py
import numpy as np
import pytest
import torch
from helpers import write_nvidia_shard

from bertbench.model.config import IGNORE_INDEX
from bertbench.tasks.pretraining import (
    NVIDIA_DTYPES,
    SHARD_KEYS,
    PretrainingBatches,
    ShardError,
    ShardLimits,
    accuracies,
    bin_of,
    check_layout,
    find_shards,
    model_batch,
    parse_length_bins,
    prediction_counts,
    read_eval_set,
    read_shard,
)

LIMITS = ShardLimits(max_seq_length=32, max_predictions_per_seq=5, vocab_size=48)


def test_the_fixture_has_nvidias_layout(tmp_path):
    path = write_nvidia_shard(tmp_path / "a.hdf5")
    with h5py.File(path) as handle:
        assert sorted(handle) == sorted(SHARD_KEYS)
        assert {key: handle[key].dtype for key in SHARD_KEYS} == {key: np.dtype(t) for key, t in NVIDIA_DTYPES.items()}
        assert handle["input_ids"].compression == "gzip"


def test_fixed_and_variable_length_shards_read_the_same(tmp_path):
    fixed = read_shard(str(write_nvidia_shard(tmp_path / "fixed.hdf5", seed=3)), LIMITS)
    varlength = read_shard(str(write_nvidia_shard(tmp_path / "var.hdf5", seed=3, varlength=True)), LIMITS)
    assert fixed.keys() == varlength.keys() == set(SHARD_KEYS)
    for key in SHARD_KEYS:
        assert fixed[key].dtype == np.int64
        width = fixed[key].shape[1] if fixed[key].ndim == 2 else None
        got = varlength[key]
        if width is not None:  # variable-length rows are padded to their longest only
            got = np.pad(got, ((0, 0), (0, width - got.shape[1])))
        np.testing.assert_array_equal(fixed[key], got, err_msg=key)


def test_model_batch_marks_prediction_padding_and_cuts_to_a_width(tmp_path):
    path = write_nvidia_shard(tmp_path / "a.hdf5", count=4, lengths=[10, 20, 32, 12])
    arrays = read_shard(str(path), LIMITS)
    batch = model_batch(arrays, np.array([0, 3]), width=16)
    assert batch["input_ids"].shape == (2, 16) and batch["input_ids"].dtype == torch.int64
    real = torch.from_numpy(arrays["masked_lm_positions"][[0, 3]] != 0)
    assert torch.equal(batch["masked_lm_labels"] != IGNORE_INDEX, real)
    assert torch.equal(batch["masked_lm_labels"][real], torch.from_numpy(arrays["masked_lm_ids"][[0, 3]])[real])
    assert (batch["masked_lm_positions"][~real] == 0).all()
    assert batch["attention_mask"].sum(1).tolist() == [10, 12]


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda h: h.__delitem__("masked_lm_ids"), "no dataset masked_lm_ids"),
        (
            lambda h: (h.__delitem__("segment_ids"), h.create_dataset("segment_ids", data=np.zeros((8, 30), "i1"))),
            r"segment_ids has shape \[8, 30\]",
        ),
        (
            lambda h: (
                h.__delitem__("next_sentence_labels"),
                h.create_dataset("next_sentence_labels", data=np.zeros(5, "i1")),
            ),
            r"next_sentence_labels has shape \[5\]",
        ),
    ],
)
def test_layout_errors_name_the_file(tmp_path, damage, message):
    path = str(write_nvidia_shard(tmp_path / "bad.hdf5", count=8))
    with h5py.File(path, "a") as handle:
        damage(handle)
    for check in (check_layout, read_shard):
        with pytest.raises(ShardError, match=f"bad.hdf5: {message}"):
            check(path, LIMITS)


@pytest.mark.parametrize(
    "key, row, value, message",
    [
        ("masked_lm_positions", 2, 40, r"row 2: masked position 40 is outside its sequence"),
        ("input_ids", 5, 48, r"row 5: input_ids value 48 is outside 0..47"),
        ("masked_lm_ids", 1, -1, r"row 1: masked_lm_ids value -1"),
        ("next_sentence_labels", 0, 2, r"row 0: next_sentence_labels value 2 is outside 0..1"),
    ],
)
def test_value_errors_name_the_file_and_row(tmp_path, key, row, value, message):
    path = str(write_nvidia_shard(tmp_path / "bad.hdf5", count=8))
    with h5py.File(path, "a") as handle:
        data = handle[key][()]
        if data.ndim == 2:
            data[row, 0] = value
        else:
            data[row] = value
        handle[key][...] = data
    with pytest.raises(ShardError, match=f"bad.hdf5: {message}"):
        read_shard(path, LIMITS)


def test_shards_wider_than_the_run_or_not_hdf5_are_refused(tmp_path):
    wide = str(write_nvidia_shard(tmp_path / "wide.hdf5", seq=64))
    with pytest.raises(ShardError, match="wide.hdf5: sequences of 64 tokens, longer than --max_seq_length 32"):
        check_layout(wide, LIMITS)
    with pytest.raises(
        ShardError, match="wide.hdf5: up to 5 masked positions per sequence, more than --max_predictions_per_seq 2"
    ):
        read_shard(wide, ShardLimits(max_seq_length=64, max_predictions_per_seq=2, vocab_size=48))
    text = tmp_path / "notes.hdf5"
    text.write_text("not hdf5")
    with pytest.raises(ShardError, match="notes.hdf5: cannot be read as hdf5"):
        read_shard(str(text), LIMITS)


def test_find_shards_takes_directories_files_and_patterns(tmp_path):
    for name in ("a/x.hdf5", "a/b/y.h5", "c/z.hdf5", "a/.tmp-1/w.hdf5"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        write_nvidia_shard(tmp_path / name, count=2)
    assert find_shards(str(tmp_path / "a")) == [str(tmp_path / "a/b/y.h5"), str(tmp_path / "a/x.hdf5")]
    assert find_shards(f"{tmp_path}/c/*.hdf5,{tmp_path}/a/x.hdf5") == [
        str(tmp_path / "a/x.hdf5"),
        str(tmp_path / "c/z.hdf5"),
    ]
    with pytest.raises(ShardError, match="nothing"):
        find_shards(f"{tmp_path}/none/*.hdf5")
    with pytest.raises(ShardError, match="no such shard file"):
        find_shards(str(tmp_path / "missing.hdf5"))


def test_length_bins_parse_and_assign():
    assert parse_length_bins("128,256,384,512", 512) == (128, 256, 384, 512)
    assert parse_length_bins(None, 512) is None
    for bad in ("128,64,512", "a,512", "128,256"):
        with pytest.raises(ValueError, match="--length_bins"):
            parse_length_bins(bad, 512)
    assert bin_of(np.array([1, 128, 129, 512]), (128, 256, 384, 512)).tolist() == [0, 0, 1, 3]


def shards(tmp_path, count=4, per_shard=24, **kwargs):
    return [str(write_nvidia_shard(tmp_path / f"s{i}.hdf5", count=per_shard, seed=i, **kwargs)) for i in range(count)]


def rows_of(batch):
    return {tuple(row.tolist()) for row in batch["input_ids"]}


def test_ranks_read_disjoint_whole_shards(tmp_path):
    files = shards(tmp_path, count=4, per_shard=16)
    streams = [PretrainingBatches(files, 8, seed=1, limits=LIMITS, rank=rank, world_size=2) for rank in range(2)]
    seen = [set(), set()]
    for _ in range(4):  # 2 shards of 2 batches per rank: one epoch
        for rank, stream in enumerate(streams):
            seen[rank] |= rows_of(next(stream))
    everything = set().union(*(rows_of(model_batch(read_shard(f, LIMITS), slice(None))) for f in files))
    assert not seen[0] & seen[1] and seen[0] | seen[1] == everything
    assert all(stream.epoch == 1.0 for stream in streams)
    with pytest.raises(ShardError, match="1 shard\\(s\\) for 2 processes"):
        PretrainingBatches(files[:1], 8, seed=1, limits=LIMITS, rank=0, world_size=2)


def test_the_stream_resumes_at_the_very_next_batch(tmp_path):
    files = shards(tmp_path, count=3, per_shard=20)
    stream = PretrainingBatches(files, 6, seed=5, limits=LIMITS)
    for _ in range(7):  # across a shard boundary (3 full batches per shard, 2 sequences left out of each)
        next(stream)
    state = stream.state_dict()
    expected = [next(stream) for _ in range(8)]
    resumed = PretrainingBatches(files, 6, seed=5, limits=LIMITS)
    resumed.load_state_dict(state)
    for want in expected:
        got = next(resumed)
        assert all(torch.equal(got[key], want[key]) for key in want)
    assert resumed.dropped == stream.dropped == 2 * 5  # 15 batches: 5 shards started, each leaving 2 out
    other = PretrainingBatches(files, 4, seed=5, limits=LIMITS)
    with pytest.raises(ValueError, match="batch_size 6"):
        other.load_state_dict(state)
    for each in (stream, resumed, other):
        each.close()


def test_length_bins_draw_each_batch_from_one_bin_and_cut_it(tmp_path):
    lengths = np.random.default_rng(0).integers(9, 33, 64)
    files = [str(write_nvidia_shard(tmp_path / "s.hdf5", count=64, lengths=lengths))]
    stream = PretrainingBatches(files, 4, seed=0, limits=LIMITS, length_bins=(12, 20, 32))
    widths = set()
    for _ in range(12):
        batch = next(stream)
        width = batch["input_ids"].shape[1]
        real = batch["attention_mask"].sum(1)
        low = {12: 0, 20: 12, 32: 20}[width]
        assert ((real > low) & (real <= width)).all()
        widths.add(width)
    assert widths == {12, 20, 32}
    stream.close()


def test_empty_shards_are_read_and_passed_over(tmp_path):
    empty = tmp_path / "empty.hdf5"
    with h5py.File(empty, "w") as handle:
        for key in SHARD_KEYS:
            width = {"masked_lm_positions": 5, "masked_lm_ids": 5, "next_sentence_labels": None}.get(key, 32)
            handle.create_dataset(key, shape=(0,) if width is None else (0, width), dtype=NVIDIA_DTYPES[key])
    assert check_layout(str(empty), LIMITS) == 0 and len(read_shard(str(empty), LIMITS)["input_ids"]) == 0
    full = str(write_nvidia_shard(tmp_path / "full.hdf5", count=8))
    stream = PretrainingBatches([str(empty), full], 4, seed=0, limits=LIMITS)
    assert [len(next(stream)["input_ids"]) for _ in range(5)] == [4] * 5
    stream.close()


def test_a_stream_with_no_full_batch_says_so(tmp_path):
    stream = PretrainingBatches(shards(tmp_path, count=2, per_shard=3), 4, seed=0, limits=LIMITS)
    with pytest.raises(ShardError, match="no shard of this process holds a full batch of 4"):
        next(stream)


def test_eval_set_pads_shards_to_the_widest(tmp_path):
    narrow = str(write_nvidia_shard(tmp_path / "a.hdf5", count=5, seq=16, lengths=[10] * 5))
    wide = str(write_nvidia_shard(tmp_path / "b.hdf5", count=5, seq=32, seed=1))
    features = read_eval_set([narrow, wide], LIMITS, max_examples=7)
    assert features["input_ids"].shape == (7, 32)
    assert (features["attention_mask"][:5, 10:] == 0).all()


def test_accuracies_count_masked_tokens_only():
    batch = {
        "masked_lm_labels": torch.tensor([[5, 6, IGNORE_INDEX], [7, IGNORE_INDEX, IGNORE_INDEX]]),
        "next_sentence_labels": torch.tensor([0, 1]),
    }
    logits = torch.zeros(2, 3, 10)
    logits[0, 0, 5] = logits[0, 1, 9] = logits[1, 0, 7] = logits[0, 2, 1] = 1  # right, wrong, right, (padding)
    output = types.SimpleNamespace(mlm_logits=logits, nsp_logits=torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    result = accuracies(prediction_counts(output, batch))
    accuracy = {key: result[key] for key in ("masked_lm_accuracy", "next_sentence_accuracy", "masked_tokens")}
    assert accuracy == {"masked_lm_accuracy": 2 / 3, "next_sentence_accuracy": 0.5, "masked_tokens": 3}
