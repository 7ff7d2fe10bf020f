"""Reads and writes TensorFlow tensor-bundle checkpoints (PREFIX.index + PREFIX.data-NNNNN-of-NNNNN) without
TensorFlow.

This is the format of every TF1 `tf.train.Saver` (V2) and TF2 `tf.train.Checkpoint` checkpoint, Google's and NVIDIA's
BERT releases included. PREFIX.index is a LevelDB-style table: sorted keys, each a tensor name whose value is a
BundleEntryProto saying where the tensor's raw little-endian bytes lie in which data shard; the key "" holds a
BundleHeaderProto. Every block and every tensor carries a masked CRC32C, and both are checked, so a damaged download
fails here with the file's name instead of training from garbage. The protobuf fields and the CRCs are
bertbench.common.tf_wire's.

The writer makes what a TF1 `tf.train.Saver` makes of float, int and bool variables (one data shard, TensorFlow's
table layout), so that example models can be shipped as Google ships BERT.

References: tensorflow/core/util/tensor_bundle/tensor_bundle.{proto,cc}, tensorflow/core/lib/io/{format,block,
block_builder,table_builder}.cc.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from bertbench.common import tf_wire
from bertbench.common.durable import write_atomically
from bertbench.common.tf_wire import WireError, decode_fields, encode_varint, field, last, masked_crc32c


class TFCheckpointError(ValueError):
    """A TensorFlow checkpoint a user pointed at is missing, damaged or unsupported; the message names the file (and
    tensor). A bertbench training checkpoint's is training.checkpoint.CheckpointError."""


_TABLE_MAGIC = 0xDB4775248B80FB57
_FOOTER_SIZE = 48  # two block handles padded to 40 bytes, then the 8-byte magic
_BLOCK_TRAILER_SIZE = 5  # 1-byte compression type + 4-byte masked CRC32C
_NO_COMPRESSION = 0

# TensorFlow's DataType enum (types.proto) for the types a checkpoint may hold; only _NUMPY_DTYPES can be read.
_DTYPE_NAMES = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    8: "complex64",
    9: "int64",
    10: "bool",
    14: "bfloat16",
    17: "uint16",
    18: "complex128",
    19: "float16",
    20: "resource",
    21: "variant",
    22: "uint32",
    23: "uint64",
}
# bfloat16 is read as its raw 16 bits (numpy has no bfloat16) and widened to float32, which is exact.
_NUMPY_DTYPES = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),
    "int32": np.dtype("<i4"),
    "int64": np.dtype("<i8"),
    "bool": np.dtype("?"),
}
# TF2 checkpoints store their object graph as a string tensor under this key; it is bookkeeping, not a variable.
_OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_DATA_SUFFIX = re.compile(r"\.data-\d{5}-of-\d{5}$")


def read_varint(data: bytes, pos: int, where: str) -> tuple[int, int]:
    """The protobuf varint at data[pos:] and the position after it; `where` names the file in the error."""
    try:
        return tf_wire.read_varint(data, pos)
    except WireError as error:
        raise TFCheckpointError(f"{where}: corrupt index ({error})") from None


def _proto_fields(data: bytes, where: str) -> dict[int, list]:
    """A protobuf message as {field number: [values]} (tf_wire.decode_fields); `where` names the file in the error."""
    try:
        return decode_fields(data)
    except WireError as error:
        raise TFCheckpointError(f"{where}: corrupt index ({error})") from None


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lies in the data shards, decoded from its BundleEntryProto."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int
    partitioned: bool

    @classmethod
    def decode(cls, name: str, value: bytes, where: str) -> TensorEntry:
        fields = _proto_fields(value, where)
        dtype = last(fields, 1)
        shape = _proto_fields(last(fields, 2, b""), where)
        if last(shape, 3):
            raise TFCheckpointError(f"{where}: tensor {name!r} has a shape of unknown rank")
        dims = tuple(last(_proto_fields(dim, where), 1) for dim in shape.get(2, []))
        return cls(
            name=name,
            dtype=_DTYPE_NAMES.get(dtype, f"DataType {dtype}"),
            shape=dims,
            shard=last(fields, 3),
            offset=last(fields, 4),
            size=last(fields, 5),
            crc32c=last(fields, 6),
            partitioned=bool(fields.get(7)),
        )


def read_block(index: bytes, handle: bytes, where: str) -> bytes:
    """The contents of the block a BlockHandle (offset, size varints) points at, its CRC and compression checked."""
    offset, pos = read_varint(handle, 0, where)
    size, _ = read_varint(handle, pos, where)
    end = offset + size + _BLOCK_TRAILER_SIZE
    if end > len(index):
        raise TFCheckpointError(f"{where}: corrupt index (block at {offset} runs past the end of the file)")
    compression = index[offset + size]
    stored_crc = int.from_bytes(index[offset + size + 1 : end], "little")
    if masked_crc32c(index[offset : offset + size + 1]) != stored_crc:
        raise TFCheckpointError(f"{where}: corrupt index (CRC mismatch in the block at offset {offset})")
    if compression != _NO_COMPRESSION:
        raise TFCheckpointError(
            f"{where}: block at offset {offset} uses compression type {compression}; "
            "only uncompressed tables (what TensorFlow writes) are supported"
        )
    return index[offset : offset + size]


def block_entries(block: bytes, where: str):
    """Yields (key, value) of a block; keys are prefix-compressed against the previous key."""
    if len(block) < 4:
        raise TFCheckpointError(f"{where}: corrupt index (block too short)")
    num_restarts = int.from_bytes(block[-4:], "little")
    limit = len(block) - 4 - 4 * num_restarts
    if limit < 0:
        raise TFCheckpointError(f"{where}: corrupt index (bad restart count)")
    key = b""
    pos = 0
    while pos < limit:
        shared, pos = read_varint(block, pos, where)
        unshared, pos = read_varint(block, pos, where)
        value_size, pos = read_varint(block, pos, where)
        if shared > len(key) or pos + unshared + value_size > limit:
            raise TFCheckpointError(f"{where}: corrupt index (bad block entry)")
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + value_size]
        pos += value_size


def resolve_prefix(path: str | os.PathLike) -> str:
    """The checkpoint prefix for PREFIX, PREFIX.index, a data shard, or a directory holding one checkpoint."""
    path = os.fspath(path)
    if os.path.isdir(path):
        state = os.path.join(path, "checkpoint")
        if os.path.isfile(state):
            with open(state, encoding="utf-8") as handle:
                match = re.search(r'^model_checkpoint_path:\s*"(.*)"\s*$', handle.read(), re.MULTILINE)
            if not match:
                raise TFCheckpointError(f"{state}: no model_checkpoint_path line")
            prefix = os.path.join(path, match.group(1))  # join keeps an absolute path as it is
            if not os.path.exists(prefix + ".index"):  # an absolute path from the machine that trained it
                prefix = os.path.join(path, os.path.basename(match.group(1)))
            return prefix
        indexes = sorted(glob.glob(os.path.join(glob.escape(path), "*.index")))
        if len(indexes) != 1:
            found = ", ".join(os.path.basename(index) for index in indexes) or "none"
            raise TFCheckpointError(
                f"{path}: expected exactly one *.index checkpoint, found {found}; give the checkpoint prefix instead"
            )
        return indexes[0][: -len(".index")]
    if path.endswith(".index"):
        return path[: -len(".index")]
    return _DATA_SUFFIX.sub("", path)


class TFCheckpoint:
    """An open tensor-bundle checkpoint: its index is parsed up front, tensors are read one at a time on demand."""

    def __init__(self, path: str | os.PathLike):
        self.prefix = resolve_prefix(path)
        self.index_path = self.prefix + ".index"
        try:
            with open(self.index_path, "rb") as handle:
                index = handle.read()
        except FileNotFoundError:
            raise TFCheckpointError(f"{self.index_path}: no such file (not a TensorFlow checkpoint?)") from None
        where = self.index_path
        if len(index) < _FOOTER_SIZE or int.from_bytes(index[-8:], "little") != _TABLE_MAGIC:
            raise TFCheckpointError(f"{where}: not a TensorFlow checkpoint index (bad magic number)")
        footer = index[-_FOOTER_SIZE:]
        _, pos = read_varint(footer, 0, where)  # metaindex handle: offset, size (TF writes no meta blocks)
        _, pos = read_varint(footer, pos, where)
        top = read_block(index, footer[pos:], where)
        self.entries: dict[str, TensorEntry] = {}
        header = None
        for _, handle in block_entries(top, where):
            for key, value in block_entries(read_block(index, handle, where), where):
                if key == b"":
                    header = _proto_fields(value, where)
                elif not key.startswith(b"\x00"):  # keys starting with NUL hold the slices of partitioned tensors
                    name = key.decode("utf-8", errors="replace")
                    self.entries[name] = TensorEntry.decode(name, value, f"{where}: tensor {name!r}")
        if header is None:
            raise TFCheckpointError(f"{where}: corrupt index (no bundle header)")
        if last(header, 2):
            raise TFCheckpointError(f"{where}: big-endian checkpoints are not supported")
        self.num_shards = last(header, 1, 1)

    @property
    def variables(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """{name: (dtype name, shape)} as TensorFlow's list_variables reports them."""
        return {name: (entry.dtype, entry.shape) for name, entry in self.entries.items()}

    def shard_path(self, shard: int) -> str:
        return f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}"

    def read(self, name: str) -> np.ndarray:
        """One tensor, CRC-checked: floats as float32/float16/float64 (bfloat16 widened to float32), ints, bools."""
        entry = self.entries.get(name)
        if entry is None:
            raise TFCheckpointError(f"{self.index_path}: no tensor named {name!r}")
        if entry.partitioned:
            raise TFCheckpointError(
                f"{self.index_path}: tensor {name!r} is a partitioned variable (saved in slices), "
                "which is not supported"
            )
        dtype = _NUMPY_DTYPES.get(entry.dtype)
        if dtype is None:
            raise TFCheckpointError(f"{self.index_path}: tensor {name!r} has unsupported dtype {entry.dtype}")
        count = int(np.prod(entry.shape, dtype=np.int64))
        if entry.size != count * dtype.itemsize:
            raise TFCheckpointError(
                f"{self.index_path}: tensor {name!r} has {entry.size} bytes, but shape "
                f"{list(entry.shape)} of {entry.dtype} needs {count * dtype.itemsize}"
            )
        path = self.shard_path(entry.shard)
        # seek + read into one buffer that becomes the array: peak memory is one copy of each tensor.
        buffer = bytearray(entry.size)
        try:
            with open(path, "rb") as handle:
                file_size = os.fstat(handle.fileno()).st_size
                if entry.offset + entry.size > file_size:
                    raise TFCheckpointError(
                        f"{path}: truncated: tensor {name!r} needs bytes up to "
                        f"{entry.offset + entry.size}, the file has {file_size}"
                    )
                handle.seek(entry.offset)
                handle.readinto(buffer)
        except FileNotFoundError:
            raise TFCheckpointError(f"{path}: no such file (data shard {entry.shard} of {self.index_path})") from None
        if masked_crc32c(buffer) != entry.crc32c:
            raise TFCheckpointError(f"{path}: CRC mismatch in tensor {name!r} (corrupt data file)")
        array = np.frombuffer(buffer, dtype=dtype).reshape(entry.shape)
        if entry.dtype == "bfloat16":
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array


def list_variables(path: str | os.PathLike) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype name, shape)} of every tensor in a checkpoint, without reading any data."""
    return TFCheckpoint(path).variables


def read_tf_checkpoint(path: str | os.PathLike, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The named tensors (default: all but TF2's object graph) as numpy arrays, read and CRC-checked one by one."""
    checkpoint = TFCheckpoint(path)
    if names is None:
        names = [name for name in checkpoint.entries if name != _OBJECT_GRAPH_KEY]
    return {name: checkpoint.read(name) for name in names}


# ---------------------------------------------------------------------------------------------------------------
# Writing.

_DTYPE_ENUMS = {name: number for number, name in _DTYPE_NAMES.items()}
_BLOCK_SIZE = 262144  # TensorFlow's table::Options: a data block is closed once it is this large
_RESTART_INTERVAL = 16  # keys between restart points (full keys) within a block, as LevelDB writes them


def _encode_entry(dtype: str, shape: tuple[int, ...], offset: int, size: int, crc: int) -> bytes:
    """A BundleEntryProto of shard 0; proto3 leaves zero scalars out, as TensorFlow's serializer does."""
    dims = b"".join(field(2, field(1, dim) if dim else b"") for dim in shape)
    entry = field(1, _DTYPE_ENUMS[dtype]) + field(2, dims)
    entry += (field(4, offset) if offset else b"") + (field(5, size) if size else b"")
    return entry + field(6, crc, fixed="<I")


class _BlockBuilder:
    """A table block: prefix-compressed entries, then the restart offsets and their count (fixed32 each)."""

    def __init__(self) -> None:
        self.buffer, self.restarts, self.first, self.last, self.count = bytearray(), [0], b"", b"", 0

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.count % _RESTART_INTERVAL:
            limit = min(len(key), len(self.last))
            while shared < limit and key[shared] == self.last[shared]:
                shared += 1
        elif self.count:
            self.restarts.append(len(self.buffer))
        self.buffer += encode_varint(shared) + encode_varint(len(key) - shared) + encode_varint(len(value))
        self.buffer += key[shared:] + value
        self.first = self.first if self.count else key
        self.last, self.count = key, self.count + 1

    def size(self) -> int:
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def finish(self) -> bytes:
        restarts = b"".join(offset.to_bytes(4, "little") for offset in self.restarts)
        return bytes(self.buffer) + restarts + len(self.restarts).to_bytes(4, "little")


def _separator(start: bytes, limit: bytes) -> bytes:
    """LevelDB's FindShortestSeparator: a short key >= start and < limit, for the index block."""
    common = 0
    while common < min(len(start), len(limit)) and start[common] == limit[common]:
        common += 1
    if common < min(len(start), len(limit)) and start[common] < 0xFF and start[common] + 1 < limit[common]:
        return start[:common] + bytes([start[common] + 1])
    return start


def _successor(key: bytes) -> bytes:
    """LevelDB's FindShortSuccessor: a short key >= key, for the last data block."""
    for position, byte in enumerate(key):
        if byte != 0xFF:
            return key[:position] + bytes([byte + 1])
    return key


def _table(entries: list[tuple[bytes, bytes]]) -> bytes:
    """An SSTable of sorted (key, value) entries as TensorFlow's TableBuilder writes it: data blocks, an empty
    metaindex block, the index block (a short key separating each data block from the next, with its handle) and
    the footer."""
    out = bytearray()

    def add_block(contents: bytes) -> bytes:
        handle = encode_varint(len(out)) + encode_varint(len(contents))
        trailer = bytes([_NO_COMPRESSION])
        out.extend(contents + trailer + masked_crc32c(contents + trailer).to_bytes(4, "little"))
        return handle

    blocks, block = [], _BlockBuilder()
    for key, value in entries:
        block.add(key, value)
        if block.size() >= _BLOCK_SIZE:  # TableBuilder's check, after each entry
            blocks.append(block)
            block = _BlockBuilder()
    blocks += [block] if block.count else []
    index = _BlockBuilder()
    for number, block in enumerate(blocks):
        key = _separator(block.last, blocks[number + 1].first) if number + 1 < len(blocks) else _successor(block.last)
        index.add(key, add_block(block.finish()))
    metaindex = add_block(_BlockBuilder().finish())
    handles = metaindex + add_block(index.finish())
    out += handles + bytes(_FOOTER_SIZE - 8 - len(handles)) + _TABLE_MAGIC.to_bytes(8, "little")
    return bytes(out)


def write_tf_checkpoint(prefix: str | os.PathLike, tensors: Mapping[str, np.ndarray]) -> str:
    """Writes `tensors` ({variable name: array}) as PREFIX.index and PREFIX.data-00000-of-00001, the checkpoint a
    TF1 Saver writes, and returns PREFIX. Arrays are stored little-endian in name order; float32, float64, float16,
    int32, int64 and bool are supported. Each file is written under a temporary name and renamed, data first, so
    a reader never finds an index without its data."""
    prefix = os.fspath(prefix)
    writable = {dtype: name for name, dtype in _NUMPY_DTYPES.items() if name != "bfloat16"}
    data, entries = bytearray(), []
    for name in sorted(tensors):
        array = np.asarray(tensors[name])
        dtype = writable.get(array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype)
        if dtype is None or not name:
            raise TFCheckpointError(
                f"{prefix}: cannot write tensor {name!r} of dtype {array.dtype} (supported: "
                f"{', '.join(writable.values())}; names must not be empty)"
            )
        raw = np.ascontiguousarray(array, dtype=_NUMPY_DTYPES[dtype]).tobytes()
        entries.append(
            (name.encode("utf-8"), _encode_entry(dtype, array.shape, len(data), len(raw), masked_crc32c(raw)))
        )
        data += raw
    header = field(1, 1) + field(3, field(1, 1))  # one shard, little-endian (0, left out), format version 1
    index = _table([(b"", header)] + entries)
    for path, contents in ((f"{prefix}.data-00000-of-00001", data), (f"{prefix}.index", index)):
        write_atomically(path, bytes(contents))
    return prefix
