"""BERT pre-training data: NVIDIA's hdf5 shard layout, reading and checking shards, the training stream (whole shards
per rank, resumable at any batch, optional length bins), evaluation features and masked-LM / next-sentence accuracy.

NVIDIA's layout (DeepLearningExamples' create_pretraining_data.py, and MLPerf's fixed-length shards): one hdf5 file
holds N sequences as the datasets
    input_ids, input_mask, segment_ids       [N, max_seq_length]
    masked_lm_positions, masked_lm_ids        [N, max_predictions_per_seq]   (padding: position 0, id 0)
    next_sentence_labels                      [N]                            (0: B follows A, 1: B is random)
MLPerf's variable-length shards (NVIDIA's convert_fixed2variable.py) hold one unpadded array per sequence for the
same keys and may leave input_mask out (a sequence's length is its mask); both read the same here.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bertbench.model.config import IGNORE_INDEX

if TYPE_CHECKING:  # torch is imported where batches are made: create_pretraining_data's workers need none of it
    import torch

# The datasets of a shard, and the dtypes NVIDIA's writer gives them (gzip-compressed).
SHARD_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
NVIDIA_DTYPES = {
    "input_ids": np.int32,
    "input_mask": np.int8,
    "segment_ids": np.int8,
    "masked_lm_positions": np.int32,
    "masked_lm_ids": np.int32,
    "next_sentence_labels": np.int8,
}
SHARD_SUFFIXES = (".hdf5", ".h5")
# Keys a variable-length (MLPerf) shard may leave out, because the array lengths carry them.
_OPTIONAL_IN_VARLENGTH = ("input_mask",)


class ShardError(ValueError):
    """A pre-training shard that cannot be read or does not have NVIDIA's layout; the message names the file."""


def find_shards(spec: str) -> list[str]:
    """The shard files `spec` names: a directory (every .hdf5/.h5 file under it, recursively, as NVIDIA's
    --input_dir), a file, or a comma-separated list of those and glob patterns (Google's --input_file); sorted."""
    found: list[str] = []
    for part in (piece.strip() for piece in spec.split(",")):
        if not part:
            continue
        if os.path.isdir(part):
            matches = []
            for root, directories, names in os.walk(part):
                # Hidden entries are not shards: a temporary directory of create-pretraining-data, for one.
                directories[:] = [name for name in directories if not name.startswith(".")]
                matches += [
                    os.path.join(root, name)
                    for name in names
                    if name.endswith(SHARD_SUFFIXES) and not name.startswith(".")
                ]
            if not matches:
                raise ShardError(f"{part}: no .hdf5 or .h5 shard in this directory")
        else:
            matches = [path for path in glob.glob(part) if os.path.isfile(path)]
            if not matches:
                raise ShardError(
                    f"{part}: no such shard file" + (" (the pattern matches nothing)" if glob.has_magic(part) else "")
                )
        found.extend(matches)
    if not found:
        raise ShardError(f"{spec!r}: names no shard")
    return sorted(set(found))


@dataclass(frozen=True)
class ShardLimits:
    """What the model and the run can take: shards beyond these are refused before any training."""

    max_seq_length: int
    max_predictions_per_seq: int
    vocab_size: int
    type_vocab_size: int = 2


def _import_h5py():
    try:
        import h5py
    except ImportError as error:  # a dependency, but say what to do if an environment lacks it
        raise ShardError(f"reading hdf5 shards needs h5py ({error}); pip install h5py") from None
    return h5py


def _read(path: str, read):
    """`read(handle, varlength)` on the open shard, once every dataset is known to be there; a file that is not
    hdf5 or lacks a dataset is a ShardError naming it. varlength: MLPerf's variable-length rows."""
    h5py = _import_h5py()
    try:
        with h5py.File(path, "r") as handle:
            varlength = "input_ids" in handle and h5py.check_vlen_dtype(handle["input_ids"].dtype) is not None
            missing = [
                key for key in SHARD_KEYS if key not in handle and not (varlength and key in _OPTIONAL_IN_VARLENGTH)
            ]
            if missing:
                raise ShardError(
                    f"{path}: no dataset {', '.join(missing)}: not a pre-training shard in NVIDIA's "
                    f"layout (it has {', '.join(sorted(handle)) or 'no datasets'})"
                )
            return read(handle, varlength)
    except ShardError:
        raise
    except (OSError, KeyError, TypeError, ValueError) as error:
        raise ShardError(f"{path}: cannot be read as hdf5 ({' '.join(str(error).split())})") from None


def _check_shapes(path: str, shapes: Mapping[str, tuple[int, ...]], limits: ShardLimits, varlength: bool) -> None:
    """Every dataset holds the same number of sequences; fixed-length ones agree on the length and the number of
    predictions, and are no longer than the run's sequences. (No sequences is allowed: create-pretraining-data
    leaves shards empty on a tiny corpus.)"""
    ids = shapes["input_ids"]
    count = ids[0] if ids else 0
    for key, shape in shapes.items():
        if not shape or shape[0] != count:
            raise ShardError(f"{path}: {key} has shape {list(shape)}, input_ids has {count} sequences")
    if varlength:
        return
    predictions = shapes["masked_lm_positions"]
    if len(ids) != 2 or len(predictions) != 2:
        raise ShardError(
            f"{path}: input_ids has shape {list(ids)} and masked_lm_positions {list(predictions)}, "
            "expected [sequences, length] and [sequences, predictions]"
        )
    expected = {"input_mask": ids, "segment_ids": ids, "masked_lm_ids": predictions, "next_sentence_labels": (count,)}
    for key, shape in expected.items():
        if shapes[key] != shape:
            raise ShardError(
                f"{path}: {key} has shape {list(shapes[key])}, input_ids {list(ids)} asks for {list(shape)}"
            )
    if ids[1] > limits.max_seq_length:
        raise ShardError(f"{path}: sequences of {ids[1]} tokens, longer than --max_seq_length {limits.max_seq_length}")


def _label_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Some writers keep next_sentence_labels as an [N, 1] column."""
    return shape[:1] if len(shape) == 2 and shape[1] == 1 else shape


def check_layout(path: str, limits: ShardLimits) -> int:
    """Open a shard and check its keys and shapes without reading the data (cheap enough to do for every shard of
    a run before training starts); returns its number of sequences. `read_shard` checks the values."""

    def read(handle, varlength):
        shapes = {key: handle[key].shape for key in SHARD_KEYS if key in handle}
        shapes["next_sentence_labels"] = _label_shape(shapes["next_sentence_labels"])
        _check_shapes(path, shapes, limits, varlength)
        return shapes["input_ids"][0] if shapes["input_ids"] else 0

    return _read(path, read)


def _pad_rows(rows, width: int | None, path: str, key: str) -> np.ndarray:
    """Variable-length rows (MLPerf) padded with 0 to `width` (their longest if None)."""
    lengths = [len(row) for row in rows]
    width = max(lengths, default=0) if width is None else width
    if lengths and max(lengths) > width:
        raise ShardError(f"{path}: {key} has a sequence of {max(lengths)} entries, more than {width}")
    out = np.zeros((len(rows), width), dtype=np.int64)
    for index, row in enumerate(rows):
        out[index, : len(row)] = row
    return out


def read_shard(path: str, limits: ShardLimits, widen: bool = True) -> dict[str, np.ndarray]:
    """The six arrays of one shard (int64; in the file's integer types with `widen=False`, which only checks),
    checked: every key present, shapes that agree, masked positions inside each sequence, ids inside the vocabulary.
    Anything else is a ShardError naming the file (and row)."""
    raw = _read(path, lambda handle, varlength: {key: handle[key][()] for key in SHARD_KEYS if key in handle})
    arrays: dict[str, np.ndarray] = {}
    for key, value in raw.items():
        if value.dtype != object and not np.issubdtype(value.dtype, np.integer):
            raise ShardError(f"{path}: {key} holds {value.dtype} values, not integers")
        if value.dtype != object:
            arrays[key] = value.astype(np.int64, copy=False) if widen else value
        elif key == "next_sentence_labels":  # a one-element row per sequence
            arrays[key] = np.asarray([int(np.asarray(row).reshape(-1)[0]) for row in value])
        else:  # variable-length rows, padded here
            width = limits.max_predictions_per_seq if key.startswith("masked_lm") else None
            arrays[key] = _pad_rows(value, width, path, key)
    if "input_mask" not in arrays:
        lengths = np.array([len(row) for row in raw["input_ids"]])
        arrays["input_mask"] = (np.arange(arrays["input_ids"].shape[1]) < lengths[:, None]).astype(np.int64)
    arrays["next_sentence_labels"] = arrays["next_sentence_labels"].reshape(
        _label_shape(arrays["next_sentence_labels"].shape)
    )
    _check_shapes(path, {key: array.shape for key, array in arrays.items()}, limits, varlength=False)
    _check_values(path, arrays, limits)
    return arrays


def check_shard(path: str, limits: ShardLimits) -> None:
    """read_shard's checks of every value, without widening the arrays to int64 (about half its time): what a run
    does for each shard before it starts."""
    read_shard(path, limits, widen=False)


def _first_bad_row(bad: np.ndarray) -> int:
    return int(np.nonzero(bad.reshape(len(bad), -1).any(axis=1))[0][0])


def _check_values(path: str, arrays: Mapping[str, np.ndarray], limits: ShardLimits) -> None:
    lengths = arrays["input_mask"].sum(axis=1)
    positions = arrays["masked_lm_positions"]
    used = int((positions != 0).sum(axis=1).max(initial=0))
    if used > limits.max_predictions_per_seq:
        raise ShardError(
            f"{path}: up to {used} masked positions per sequence, more than --max_predictions_per_seq "
            f"{limits.max_predictions_per_seq}"
        )
    real = _real_predictions(positions)
    outside = real & ((positions < 0) | (positions >= lengths[:, None]))
    if outside.any():
        row = _first_bad_row(outside)
        raise ShardError(
            f"{path}: row {row}: masked position {int(positions[row][outside[row]][0])} is outside "
            f"its sequence of {int(lengths[row])} tokens"
        )
    for key, bound in (
        ("input_ids", limits.vocab_size),
        ("masked_lm_ids", limits.vocab_size),
        ("segment_ids", limits.type_vocab_size),
        ("next_sentence_labels", 2),
    ):
        values = arrays[key]
        bad = (values < 0) | (values >= bound)
        if bad.any():
            row = _first_bad_row(bad)
            value = values[row][bad[row]][0] if values.ndim > 1 else values[row]
            raise ShardError(f"{path}: row {row}: {key} value {int(value)} is outside 0..{bound - 1}")


def _real_predictions(positions: np.ndarray) -> np.ndarray:
    """Which prediction slots are real: those before the first 0 (position 0 is [CLS], never masked, so NVIDIA
    pads with it)."""
    return np.cumprod(positions != 0, axis=1).astype(bool)


def sequence_lengths(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    return arrays["input_mask"].sum(axis=1)


def model_batch(
    arrays: Mapping[str, np.ndarray], index: np.ndarray | slice, width: int | None = None
) -> dict[str, torch.Tensor]:
    """BertForPreTraining's inputs for rows `index`, cut to `width` columns (a length bin's edge): padding slots of
    the predictions get label IGNORE_INDEX and position 0."""
    width = arrays["input_ids"].shape[1] if width is None else width
    positions = arrays["masked_lm_positions"][index]
    real = _real_predictions(positions)
    labels = np.where(real, arrays["masked_lm_ids"][index], IGNORE_INDEX)
    import torch

    return {
        "input_ids": torch.from_numpy(np.ascontiguousarray(arrays["input_ids"][index, :width])),
        "token_type_ids": torch.from_numpy(np.ascontiguousarray(arrays["segment_ids"][index, :width])),
        "attention_mask": torch.from_numpy(np.ascontiguousarray(arrays["input_mask"][index, :width])),
        "masked_lm_positions": torch.from_numpy(np.where(real, positions, 0)),
        "masked_lm_labels": torch.from_numpy(labels),
        "next_sentence_labels": torch.from_numpy(np.ascontiguousarray(arrays["next_sentence_labels"][index])),
    }


def parse_length_bins(text: str | None, max_seq_length: int) -> tuple[int, ...] | None:
    """ "128,256,384,512" -> (128, 256, 384, 512), checked by check_length_bins; None for no bins."""
    if not text:
        return None
    try:
        edges = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--length_bins must be comma-separated integers, got {text!r}") from None
    check_length_bins(edges, max_seq_length)
    return edges


def check_length_bins(edges: Sequence[int], max_seq_length: int) -> None:
    """Bin edges must be positive, ascending and end at max_seq_length (the longest sequence needs a bin)."""
    shown = ",".join(str(edge) for edge in edges)
    if not edges or edges[0] < 1 or any(high <= low for low, high in zip(edges, edges[1:])):
        raise ValueError(f"--length_bins must be positive and ascending, got {shown}")
    if edges[-1] != max_seq_length:
        raise ValueError(f"--length_bins must end at --max_seq_length {max_seq_length}, got {shown}")


def bin_of(lengths: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """Index of the smallest edge >= each length."""
    return np.searchsorted(np.asarray(edges), lengths, side="left")


class PretrainingBatches:
    """An endless stream of training batches from shard files, one shard in memory at a time (the next one is read
    in the background), resumable at any batch.

    Epoch e visits the shards in a seeded order; rank r of W processes reads shards r, r+W, ... of it (every rank
    the same number, wrapping round the order when W does not divide the count, as NVIDIA's loader does), so a
    shard is read by one process. Inside a shard the sequences are permuted (seeded by epoch and shard) and cut
    into batches of `batch_size`; with length bins each batch is drawn from one bin and cut to the bin's edge, so
    short sequences are not padded to max_seq_length. Every batch is full: a shard's last partial batch (of each
    bin) is left out, and counted in `dropped`.
    """

    def __init__(
        self,
        files: Sequence[str],
        batch_size: int,
        seed: int,
        limits: ShardLimits,
        rank: int = 0,
        world_size: int = 1,
        length_bins: Sequence[int] | None = None,
    ):
        if len(files) < world_size:
            raise ShardError(
                f"{len(files)} shard(s) for {world_size} processes: each process reads whole shards, "
                f"so make at least {world_size} (create-pretraining-data --num_shards)"
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.files = list(files)
        self.batch_size, self.seed, self.limits = batch_size, seed, limits
        self.rank, self.world_size = rank, world_size
        self.length_bins = tuple(length_bins) if length_bins else None
        self.shards_per_epoch = math.ceil(len(self.files) / world_size)
        # Position: epoch, shard of this rank's list in that epoch, batch inside that shard.
        self.epoch_index, self.shard_cursor, self.batch_cursor = 0, 0, 0
        self.consumed = 0  # sequences, every rank's
        self.dropped = 0  # sequences of partial batches left out by this rank
        self._plan: tuple[tuple[int, int], list[tuple[np.ndarray, int]], dict[str, np.ndarray]] | None = None
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shard-reader")
        self._next: tuple[tuple[int, int], Future] | None = None

    @property
    def epoch(self) -> float:
        """Epochs this rank has read, fractional (by shards, and by batches inside the current one)."""
        in_shard = 0.0
        if self._plan is not None and self._plan[0] == (self.epoch_index, self.shard_cursor):
            in_shard = self.batch_cursor / max(1, len(self._plan[1]))
        return self.epoch_index + (self.shard_cursor + in_shard) / self.shards_per_epoch

    def _shard_file(self, epoch: int, cursor: int) -> int:
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))
        return int(order[(cursor * self.world_size + self.rank) % len(self.files)])

    def _batches_of(
        self, file_index: int, epoch: int, arrays: Mapping[str, np.ndarray]
    ) -> list[tuple[np.ndarray, int]]:
        """The shard's batches in order: (row indices, width)."""
        rng = np.random.default_rng([self.seed, epoch, file_index, 1])
        order = rng.permutation(len(arrays["input_ids"]))
        width = arrays["input_ids"].shape[1]
        if self.length_bins is None:
            groups = [(order, width)]
        else:
            bins = bin_of(sequence_lengths(arrays)[order], self.length_bins)
            groups = [(order[bins == b], min(edge, width)) for b, edge in enumerate(self.length_bins)]
        batches = []
        for rows, group_width in groups:
            full = len(rows) // self.batch_size * self.batch_size
            batches += [
                (rows[start : start + self.batch_size], group_width) for start in range(0, full, self.batch_size)
            ]
        if self.length_bins is not None:  # interleave the bins, or a run would see all short sequences first
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def _read(self, file_index: int) -> dict[str, np.ndarray]:
        return read_shard(self.files[file_index], self.limits)

    def _load(self, epoch: int, cursor: int) -> None:
        """Make shard `cursor` of `epoch` the current one (from the background read when it is that one) and start
        reading the one after it."""
        key = (epoch, cursor)
        file_index = self._shard_file(epoch, cursor)
        if self._next is not None and self._next[0] == key:
            arrays = self._next[1].result()
        else:
            arrays = self._read(file_index)
        self._plan = (key, self._batches_of(file_index, epoch, arrays), arrays)
        following = (epoch, cursor + 1) if cursor + 1 < self.shards_per_epoch else (epoch + 1, 0)
        self._next = (following, self._loader.submit(self._read, self._shard_file(*following)))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        empty_shards = 0
        while True:
            if self._plan is None or self._plan[0] != (self.epoch_index, self.shard_cursor):
                self._load(self.epoch_index, self.shard_cursor)
                if self.batch_cursor == 0:
                    self.dropped += len(self._plan[2]["input_ids"]) - sum(len(rows) for rows, _ in self._plan[1])
            _, batches, arrays = self._plan
            if self.batch_cursor < len(batches):
                rows, width = batches[self.batch_cursor]
                self.batch_cursor += 1
                self.consumed += self.batch_size * self.world_size
                return model_batch(arrays, rows, width)
            empty_shards = empty_shards + 1 if not batches else 0
            if empty_shards > self.shards_per_epoch:
                raise ShardError(
                    f"no shard of this process holds a full batch of {self.batch_size} sequences"
                    + (" in any length bin" if self.length_bins else "")
                    + f" (e.g. {self.files[0]})"
                )
            self.batch_cursor = 0
            self.shard_cursor += 1
            if self.shard_cursor == self.shards_per_epoch:
                self.epoch_index, self.shard_cursor = self.epoch_index + 1, 0

    def state_dict(self) -> dict[str, object]:
        return {
            "epoch": self.epoch_index,
            "shard": self.shard_cursor,
            "batch": self.batch_cursor,
            "consumed": self.consumed,
            "dropped": self.dropped,
            "rank": self.rank,
            "world_size": self.world_size,
            "shards": len(self.files),
            "batch_size": self.batch_size,
            "seed": self.seed,
            "length_bins": list(self.length_bins or ()),
        }

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        current = self.state_dict()
        for key in ("world_size", "rank", "shards", "batch_size", "seed", "length_bins"):
            if state.get(key) != current[key]:
                raise ValueError(
                    f"the data position was saved with {key} {state.get(key)}, this run has {current[key]}"
                )
        self.epoch_index, self.shard_cursor, self.batch_cursor = state["epoch"], state["shard"], state["batch"]
        self.consumed, self.dropped = state["consumed"], state["dropped"]
        self._plan = None

    def close(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=True)


def read_eval_set(
    files: Sequence[str], limits: ShardLimits, max_examples: int | None = None
) -> dict[str, torch.Tensor]:
    """Every sequence of the eval shards (in file order, the first `max_examples` if given; MLPerf scores 10,000),
    padded to the widest shard, as model inputs."""
    parts, remaining = [], max_examples
    for path in files:
        if remaining is not None and remaining <= 0:
            break
        arrays = read_shard(path, limits)
        count = len(arrays["input_ids"]) if remaining is None else min(remaining, len(arrays["input_ids"]))
        parts.append(model_batch(arrays, slice(0, count)))
        remaining = None if remaining is None else remaining - count
    import torch

    width = max(part["input_ids"].shape[1] for part in parts)
    widened = [
        {
            name: (
                torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]))
                if name in ("input_ids", "token_type_ids", "attention_mask")
                else tensor
            )
            for name, tensor in part.items()
        }
        for part in parts
    ]
    return {name: torch.cat([part[name] for part in widened]) for name in widened[0]}


def prediction_counts(output, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per sequence: masked tokens predicted right, masked tokens, the masked tokens' summed cross-entropy, the
    next-sentence label predicted right and its cross-entropy (for Estimator.evaluate's `extract`; summed by
    `accuracies`)."""
    import torch.nn.functional as F  # here, as torch is: see the imports

    labels, next_sentence = batch["masked_lm_labels"], batch["next_sentence_labels"].flatten()
    real = labels != IGNORE_INDEX
    right = (output.mlm_logits.argmax(-1) == labels) & real
    token_loss = F.cross_entropy(
        output.mlm_logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view_as(labels)
    return {
        "mlm_correct": right.sum(1),
        "mlm_count": real.sum(1),
        "mlm_loss": token_loss.sum(1),
        "nsp_correct": (output.nsp_logits.argmax(-1) == next_sentence).long(),
        "nsp_loss": F.cross_entropy(output.nsp_logits.float(), next_sentence, reduction="none"),
    }


def accuracies(counts: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Masked-LM accuracy (over masked tokens, as MLPerf scores it) and next-sentence accuracy, and the two losses
    as Google's run_pretraining reports them: the masked-LM loss a mean over the masked tokens, the next-sentence
    loss a mean over the sequences."""
    masked = int(counts["mlm_count"].sum())
    return {
        "masked_lm_accuracy": int(counts["mlm_correct"].sum()) / max(1, masked),
        "masked_lm_loss": float(counts["mlm_loss"].double().sum()) / max(1, masked),
        "next_sentence_accuracy": float(counts["nsp_correct"].float().mean()),
        "next_sentence_loss": float(counts["nsp_loss"].double().mean()),
        "masked_tokens": masked,
    }
