"""TensorFlow's on-disk encodings, by hand: protobuf fields, the masked CRC32C and TFRecord framing. Checkpoints
(weights.tf_checkpoint) and TensorBoard's event files (training.events) are read and written with them, with
neither TensorFlow nor the protobuf package installed.

References: protobuf's wire format (encoding.md); tensorflow/core/lib/hash/crc32c.h (Mask);
tensorflow/core/lib/io/record_writer.cc (a record: length, masked CRC of the length, data, masked CRC of the data).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import google_crc32c

_CRC_CHUNK = 1 << 23
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER_SIZE = _LENGTH.size + _CRC.size


class WireError(ValueError):
    """Bytes that are not the protobuf message they should be; the message says what is wrong, the caller names the
    file."""


def masked_crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC32C as LevelDB and TensorFlow store it: rotated and offset so that CRCs of CRCs stay strong."""
    view = memoryview(data)
    crc = 0
    for start in range(0, len(view), _CRC_CHUNK):
        # google_crc32c takes only immutable bytes: copying a chunk at a time keeps memory flat for big tensors.
        crc = google_crc32c.extend(crc, bytes(view[start : start + _CRC_CHUNK]))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def encode_varint(value: int) -> bytes:
    """A non-negative int as a protobuf varint: seven bits a byte, low bits first."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The protobuf varint at data[pos:] and the position after it."""
    result = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            break
    raise WireError("bad varint")


def field(number: int, value: int | float | bytes, fixed: str | None = None) -> bytes:
    """One protobuf field: bytes length-delimited, an int a varint, or `value` packed by the struct format `fixed`
    ("<I" a fixed32, "<f" a float, "<d" a double) as a 4- or 8-byte field."""
    if isinstance(value, bytes):
        return encode_varint(number << 3 | 2) + encode_varint(len(value)) + value
    if fixed is not None:
        packed = struct.pack(fixed, value)
        return encode_varint(number << 3 | (5 if len(packed) == 4 else 1)) + packed
    return encode_varint(number << 3) + encode_varint(value)


def decode_fields(data: bytes) -> dict[int, list]:
    """A protobuf message as {field number: [values]}: ints for varint and fixed fields, bytes otherwise."""
    fields: dict[int, list] = {}
    pos = 0
    while pos < len(data):
        tag, pos = read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = read_varint(data, pos)
        elif wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            value = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        elif wire_type == 2:
            length, pos = read_varint(data, pos)
            value = data[pos : pos + length]
            pos += length
        else:
            raise WireError(f"protobuf wire type {wire_type}")
        if pos > len(data):
            raise WireError("truncated protobuf message")
        fields.setdefault(number, []).append(value)
    return fields


def last(fields: dict[int, list], number: int, default=0):
    """Protobuf's rule for a repeated scalar field on the wire: the last value wins."""
    return fields[number][-1] if number in fields else default


def frame_record(data: bytes) -> bytes:
    """`data` as one TFRecord: its length and that length's masked CRC, the data and its masked CRC."""
    length = _LENGTH.pack(len(data))
    return length + _CRC.pack(masked_crc32c(length)) + data + _CRC.pack(masked_crc32c(data))


@dataclass(frozen=True)
class Record:
    """A record of a TFRecord file: its data and where it starts; `intact` False when the data fails its CRC."""

    offset: int
    data: bytes
    intact: bool


@dataclass(frozen=True)
class RecordScan:
    """What scan_records found: the records, and the offset where reading stopped early (None when it reached the
    end): at a record an append cut short (`cut`), or at a length that fails its CRC, past which nothing can be
    framed."""

    records: list[Record]
    stopped_at: int | None = None
    cut: bool = False


def scan_records(data: bytes) -> RecordScan:
    """The records of a TFRecord file's bytes, in order."""
    records: list[Record] = []
    pos = 0
    while pos < len(data):
        header = data[pos : pos + _HEADER_SIZE]
        if len(header) < _HEADER_SIZE:
            return RecordScan(records, pos, cut=True)
        (length,) = _LENGTH.unpack_from(header)
        if masked_crc32c(header[: _LENGTH.size]) != _CRC.unpack_from(header, _LENGTH.size)[0]:
            return RecordScan(records, pos)
        end = pos + _HEADER_SIZE + length + _CRC.size
        if end > len(data):
            return RecordScan(records, pos, cut=True)
        payload = data[pos + _HEADER_SIZE : end - _CRC.size]
        records.append(Record(pos, payload, masked_crc32c(payload) == _CRC.unpack_from(data, end - _CRC.size)[0]))
        pos = end
    return RecordScan(records)
