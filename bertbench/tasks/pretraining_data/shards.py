"""create_pretraining_data's output: NVIDIA's hdf5 shards, each chunk's instances dealt round-robin to the shards of
their length bin and written in whole compressed hdf5 chunks (ShardWriter), and where the files go: written in a
temporary directory beside the output and moved into place only when complete (OutputLayout).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import h5py
import numpy as np

from bertbench.common.durable import move_files
from bertbench.tasks.pretraining import NVIDIA_DTYPES, SHARD_KEYS
from bertbench.tasks.pretraining_data.instances import ChunkInstances
from bertbench.tasks.pretraining_data.settings import PROGRAM, DataError, DataSettings

STATS_FILE = "create_pretraining_data.json"  # the statistics, beside the shards
# Tokens of one input_ids hdf5 chunk (256 KB as int32): small enough that every shard's unwritten rows together stay
# modest with hundreds of shards, large enough for gzip to work well.
CHUNK_TOKENS = 65536
GZIP_LEVEL = 4  # h5py's default, and so NVIDIA's


def _padded(
    values: np.ndarray, offsets: np.ndarray, counts: np.ndarray, rows: np.ndarray, width: int, dtype
) -> tuple[np.ndarray, np.ndarray]:
    """Rows `rows` of a ragged array (row r is values[offsets[r]:offsets[r] + counts[r]]) zero-padded to `width`,
    and the mask of the real entries."""
    lengths = counts[rows]
    real = np.arange(width) < lengths[:, None]
    padded = np.zeros((len(rows), width), dtype=dtype)
    starts = offsets[rows] - (np.cumsum(lengths) - lengths)  # minus where each row begins in the gathered run
    padded[real] = values[np.repeat(starts, lengths) + np.arange(int(lengths.sum()))]
    return padded, real


def _deflate(rows: np.ndarray, chunk_rows: int) -> bytes:
    """One hdf5 chunk as the gzip filter stores it: zlib data of the whole chunk, the last one padded with zeros."""
    if len(rows) < chunk_rows:
        rows = np.concatenate([rows, np.zeros((chunk_rows - len(rows), *rows.shape[1:]), rows.dtype)])
    return zlib.compress(np.ascontiguousarray(rows).tobytes(), GZIP_LEVEL)


class _Shard:
    """One hdf5 file in NVIDIA's layout, appended to in whole hdf5 chunks: rows wait in memory until a chunk's worth
    is there, so that no compressed chunk is ever read back and compressed again."""

    def __init__(self, path: str, width: int, settings: DataSettings, vocab_size: int):
        self.path, self.width, self.settings, self.vocab_size = path, width, settings, vocab_size
        self.chunk_rows = max(1, CHUNK_TOKENS // width)
        self.pending: list[dict[str, np.ndarray]] = []
        self.pending_rows = self.rows = 0
        self.created = False

    def add(self, rows: dict[str, np.ndarray]) -> None:
        self.pending.append(rows)
        self.pending_rows += len(rows["next_sentence_labels"])

    def take(self, final: bool) -> tuple[int, dict[str, np.ndarray]]:
        """The rows to write now (whole chunks; with `final` all) and the row of the file they start at."""
        count = self.pending_rows if final else self.pending_rows - self.pending_rows % self.chunk_rows
        merged = {
            key: np.concatenate([rows[key] for rows in self.pending]) if self.pending else None for key in SHARD_KEYS
        }
        self.pending_rows -= count
        self.pending = [{key: merged[key][count:].copy() for key in SHARD_KEYS}] if self.pending_rows else []
        start, self.rows = self.rows, self.rows + count
        return start, {key: values[:count] for key, values in merged.items() if count}

    def write(self, start: int, count: int, chunks: dict[str, list[bytes]]) -> None:
        """Append `count` rows from `start`, as compressed chunks (`_deflate`)."""
        if not self.created:
            self._create()
        if not count:
            return
        with h5py.File(self.path, "a") as shard:
            for key in SHARD_KEYS:
                dataset = shard[key]
                dataset.resize(start + count, axis=0)
                for index, data in enumerate(chunks[key]):
                    origin = (start + index * self.chunk_rows,) + (0,) * (dataset.ndim - 1)
                    dataset.id.write_direct_chunk(origin, data)

    def _create(self) -> None:
        widths = {
            "input_ids": self.width,
            "input_mask": self.width,
            "segment_ids": self.width,
            "masked_lm_positions": self.settings.max_predictions_per_seq,
            "masked_lm_ids": self.settings.max_predictions_per_seq,
        }
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with h5py.File(self.path, "w-") as shard:
            for key in SHARD_KEYS:
                tail = (widths[key],) if key in widths else ()
                shard.create_dataset(
                    key,
                    shape=(0, *tail),
                    maxshape=(None, *tail),
                    chunks=(self.chunk_rows, *tail),
                    dtype=NVIDIA_DTYPES[key],
                    compression="gzip",
                    compression_opts=GZIP_LEVEL,
                )
            # Readers ignore these; they say how the file was made.
            settings = self.settings
            shard.attrs.update(
                {
                    "max_seq_length": settings.max_seq_length,
                    "max_predictions_per_seq": settings.max_predictions_per_seq,
                    "masked_lm_prob": settings.masked_lm_prob,
                    "dupe_factor": settings.dupe_factor,
                    "short_seq_prob": settings.short_seq_prob,
                    "do_whole_word_mask": settings.do_whole_word_mask,
                    "random_seed": settings.random_seed,
                    "do_lower_case": settings.do_lower_case,
                    "vocab_size": self.vocab_size,
                    "length_bin_edge": self.width,
                }
            )
        self.created = True


class ShardWriter:
    """Deals each chunk's instances round-robin to the shards of their length bin, one counter per bin running on
    across chunks, and counts what it wrote. Compression, most of the writing's work, runs on a thread pool (zlib
    releases the GIL) and the compressed chunks go into the files as they are, so this one process keeps up with
    many workers."""

    def __init__(self, layout: OutputLayout, vocab_size: int, compressor: ThreadPoolExecutor):
        self.edges = layout.settings.bin_edges
        self.predictions = layout.settings.max_predictions_per_seq
        self.compressor = compressor
        self.names = [[layout.shard_name(edge, index) for index in range(layout.num_shards)] for edge in self.edges]
        self.shards = [
            [_Shard(os.path.join(layout.temp_dir, name), edge, layout.settings, vocab_size) for name in names]
            for edge, names in zip(self.edges, self.names)
        ]
        self.instances = [0] * len(self.edges)
        self.tokens = self.worker_peak_rss = 0

    def add(self, chunk: ChunkInstances) -> None:
        offsets = np.cumsum(chunk.lengths) - chunk.lengths
        mask_offsets = np.cumsum(chunk.masked_counts) - chunk.masked_counts
        bins = np.searchsorted(self.edges, chunk.lengths)  # the smallest edge >= the length
        self.tokens += int(chunk.lengths.sum())
        self.worker_peak_rss = max(self.worker_peak_rss, chunk.worker_peak_rss)
        for b, (edge, shards) in enumerate(zip(self.edges, self.shards)):
            members = np.flatnonzero(bins == b)
            for index, shard in enumerate(shards):
                # Member j goes to shard (instances dealt before + j) mod shards.
                rows = members[(index - self.instances[b]) % len(shards) :: len(shards)]
                if len(rows):
                    shard.add(self._rows(chunk, rows, offsets, mask_offsets, edge))
            self.instances[b] += len(members)
        self._write(
            [shard for shards in self.shards for shard in shards if shard.pending_rows >= shard.chunk_rows], final=False
        )

    def _rows(
        self, chunk: ChunkInstances, rows: np.ndarray, offsets: np.ndarray, mask_offsets: np.ndarray, width: int
    ) -> dict[str, np.ndarray]:
        input_ids, real = _padded(chunk.tokens, offsets, chunk.lengths, rows, width, NVIDIA_DTYPES["input_ids"])
        segment_b = np.arange(width) >= chunk.a_lengths[rows][:, None] + 2  # after A's [SEP]
        positions, _ = _padded(
            chunk.masked_positions,
            mask_offsets,
            chunk.masked_counts,
            rows,
            self.predictions,
            NVIDIA_DTYPES["masked_lm_positions"],
        )
        ids, _ = _padded(
            chunk.masked_ids, mask_offsets, chunk.masked_counts, rows, self.predictions, NVIDIA_DTYPES["masked_lm_ids"]
        )
        return {
            "input_ids": input_ids,
            "input_mask": real.astype(NVIDIA_DTYPES["input_mask"]),
            "segment_ids": (segment_b & real).astype(NVIDIA_DTYPES["segment_ids"]),
            "masked_lm_positions": positions,
            "masked_lm_ids": ids,
            "next_sentence_labels": chunk.next_sentence_labels[rows].astype(NVIDIA_DTYPES["next_sentence_labels"]),
        }

    def _write(self, shards: list[_Shard], final: bool) -> None:
        """Compress every ready chunk of `shards` at once, so that the threads have work, then write them."""
        jobs = []
        for shard in shards:
            start, rows = shard.take(final)
            count = len(rows["next_sentence_labels"]) if rows else 0
            chunks = {
                key: [
                    self.compressor.submit(_deflate, values[first : first + shard.chunk_rows], shard.chunk_rows)
                    for first in range(0, count, shard.chunk_rows)
                ]
                for key, values in rows.items()
            }
            jobs.append((shard, start, count, chunks))
        for shard, start, count, chunks in jobs:
            shard.write(start, count, {key: [job.result() for job in futures] for key, futures in chunks.items()})

    def finish(self) -> list[str]:
        """Write what waits; returns the shards' names (OutputLayout.shard_name). A bin without instances gets no
        files; a bin with fewer instances than shards gets some empty ones, so that its set is complete."""
        written = []
        for count, names, shards in zip(self.instances, self.names, self.shards):
            if count:
                self._write(shards, final=True)
                written.extend(names)
        return written


class OutputLayout:
    """Where the files go: shards and statistics are written in a temporary directory beside them and moved into
    place at the end, so a failed or interrupted run leaves nothing behind and never replaces a file."""

    def __init__(self, settings: DataSettings):
        self.settings = settings
        if settings.output_file is not None:
            self.base = os.path.dirname(os.path.abspath(settings.output_file))
            self.num_shards = 1
        else:
            self.base = settings.output_dir
            self.num_shards = settings.num_shards
        self.temp_dir = os.path.join(self.base, f".{PROGRAM}.tmp-{os.getpid()}")

    def shard_name(self, edge: int, index: int) -> str:
        """A shard's path relative to the output (and the temporary) directory."""
        if self.settings.output_file is not None:
            return os.path.basename(self.settings.output_file)
        name = f"{self.settings.shard_prefix}_{index:05d}.hdf5"
        return os.path.join(f"len_{edge}", name) if self.settings.length_bins else name

    @property
    def stats_name(self) -> str:
        if self.settings.output_file is not None:
            return os.path.basename(self.settings.output_file) + ".json"
        return STATS_FILE

    def final_path(self, name: str) -> str:
        return os.path.join(self.base, name)

    def refuse_existing(self) -> None:
        names = [self.shard_name(edge, index) for edge in self.settings.bin_edges for index in range(self.num_shards)]
        for name in names + [self.stats_name]:
            if os.path.lexists(self.final_path(name)):
                raise DataError(f"{self.final_path(name)}: already exists; remove it or choose another output")

    def move_into_place(self, names: Sequence[str]) -> None:
        self.refuse_existing()  # once more: the run may have taken hours
        move_files((os.path.join(self.temp_dir, name), self.final_path(name)) for name in names)
