"""Raw text to BERT pre-training shards in NVIDIA's hdf5 layout: Google's create_pretraining_data.py, reimplemented
to stream corpora far larger than memory through worker processes.

    python -m bertbench.tasks.create_pretraining_data --input_file='wiki/*.txt' --vocab_file=$BERT_DIR/vocab.txt \\
        --output_dir=shards/ --num_shards=256 --max_seq_length=128 --max_predictions_per_seq=20 \\
        --masked_lm_prob=0.15 --dupe_factor=10 --num_workers=16

Input is Google's: one sentence per line, a blank line between documents. Google's script holds the whole corpus in
memory, draws "random next" sentences from any document and shuffles all instances together. Here the text is read
as a stream and cut at document boundaries into chunks of about --chunk_megabytes, and a chunk stands in for Google's
whole corpus: its documents are tokenized, turned into instances --dupe_factor times (new sentence pairs and a new
mask each pass), with random next sentences drawn from the chunk's other documents, and the chunk's instances are
shuffled together. Chunk k draws from a generator seeded from (--random_seed, k) alone, so the shards are the same
whatever --num_workers is. Instances are dealt round-robin to the shards, which therefore differ in size by at most
one (per length bin).

Where this departs from Google's script, on purpose: a document also ends with its file (Google's runs on into the
next file); with --do_whole_word_mask a "##" piece at the start of segment B is a word of its own (Google's glues it
to the last word of A across the [SEP]); and the output is NVIDIA's hdf5, not TFRecord.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import glob
import json
import os
import random
import shutil
import signal
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, NamedTuple

import h5py
import numpy as np

from bertbench.training.devices import peak_memory_bytes
from bertbench.common.durable import fsync_path
from bertbench.common.errors import description, run_command, signal_status
from bertbench.common.flags import FlagParser, add_dataclass_flags, setting
from bertbench.training.progress import format_duration, log, progress_bar
from bertbench.tasks.pretraining import NVIDIA_DTYPES, SHARD_KEYS, check_length_bins, parse_length_bins
from bertbench.tasks.tokenization import BertTokenizer, VocabError, truncated_pair_lengths

PROGRAM = "create_pretraining_data"
STATS_FILE = "create_pretraining_data.json"
# Tokens of one input_ids hdf5 chunk (256 KB as int32): small enough that every shard's unwritten rows together stay
# modest with hundreds of shards, large enough for gzip to work well.
CHUNK_TOKENS = 65536
# Sentences per call to the tokenizer: enough to keep its threads busy, few enough that the `Encoding` objects
# (offsets and strings besides the ids) stay small.
TOKENIZE_BATCH = 8192
GZIP_LEVEL = 4  # h5py's default, and so NVIDIA's


# Google's names for its TFRecord output: refused, since the shards written are HDF5 (a .tfrecord name would hide it).
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tf_record")


class DataError(ValueError):
    """Input or settings a user gave that cannot work; the message names the file or flag."""


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The flags (Google's names and defaults): what to read, how to make instances and where to write them.

    Each field's help is its flag's --help text."""

    input_file: str = setting("Comma-separated text files or glob patterns: one sentence per line, a blank line "
                              "between documents (Google's format).")
    vocab_file: str = setting("vocab.txt of the model to pre-train.")
    output_dir: str | None = setting("Directory for the shards, <shard_prefix>_<i:05d>.hdf5 (in len_<edge>/ with "
                                     "--length_bins), and the statistics, create_pretraining_data.json. Give this "
                                     "or --output_file.", None)
    output_file: str | None = setting("NVIDIA's single shard at this path, statistics in PATH.json. Give this or "
                                      "--output_dir.", None)
    num_shards: int = setting("Shards (per length bin) in --output_dir; instances are dealt round-robin, so shard "
                              "sizes differ by at most one.", 1)
    shard_prefix: str = setting("File name prefix of the shards in --output_dir.", "training")
    do_lower_case: bool = setting("Lower-case and strip accents (uncased models).", True)
    do_whole_word_mask: bool = setting("Mask all WordPiece pieces of a word together.", False)
    max_seq_length: int = setting("Tokens per instance, [CLS] and [SEP]s included; shorter ones are padded with 0.",
                                  128)
    max_predictions_per_seq: int = setting("Most masked tokens per instance.", 20)
    random_seed: int = setting("Seed: chunk k draws from a generator seeded from (random_seed, k) alone.", 12345)
    dupe_factor: int = setting("Passes over each chunk's documents, each with new sentence pairs and a new mask.",
                                10)
    masked_lm_prob: float = setting("Share of an instance's tokens to mask (rounded, at least one).", 0.15)
    short_seq_prob: float = setting("Probability that an instance aims at a random shorter length, so the model "
                                    "also sees short sequences.", 0.1)
    length_bins: tuple[int, ...] | None = setting(
        "Ascending comma-separated bin edges ending at --max_seq_length, e.g. 128,256,384,512: each instance goes to "
        "the smallest bin that holds it, whose shards in len_<edge>/ are padded to <edge> only, so batches drawn "
        "from one bin carry less padding (the MLPerf trick).", None)
    num_workers: int = setting("Worker processes making instances; the output does not depend on it.", 1)
    chunk_megabytes: float = setting("Text per chunk (MB), cut at document boundaries. A chunk stands in for "
                                     "Google's whole corpus: random next sentences come from its own documents and "
                                     "its instances are shuffled together. Memory grows with this (times "
                                     "--dupe_factor and the workers), not with the corpus.", 8.0)

    def __post_init__(self):
        if (self.output_dir is None) == (self.output_file is None):
            raise DataError("give exactly one of --output_dir and --output_file")
        for name in ("num_shards", "max_predictions_per_seq", "dupe_factor", "num_workers"):
            if getattr(self, name) < 1:
                raise DataError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.max_seq_length < 5:
            raise DataError(f"--max_seq_length must be at least 5 ([CLS] A [SEP] B [SEP]), got {self.max_seq_length}")
        if self.max_predictions_per_seq >= self.max_seq_length:
            raise DataError(f"--max_predictions_per_seq ({self.max_predictions_per_seq}) must be less than "
                            f"--max_seq_length ({self.max_seq_length})")
        if not 0 < self.masked_lm_prob < 1:
            raise DataError(f"--masked_lm_prob must be between 0 and 1, got {self.masked_lm_prob}")
        if not 0 <= self.short_seq_prob <= 1:
            raise DataError(f"--short_seq_prob must be between 0 and 1, got {self.short_seq_prob}")
        if not self.chunk_megabytes > 0:
            raise DataError(f"--chunk_megabytes must be positive, got {self.chunk_megabytes}")
        if not self.shard_prefix or os.sep in self.shard_prefix:
            raise DataError(f"--shard_prefix must be a file name, got {self.shard_prefix!r}")
        if self.output_file is not None and (self.num_shards != 1 or self.length_bins):
            raise DataError("--output_file writes one shard: use --output_dir for --num_shards or --length_bins")
        if self.output_file is not None and self.output_file.lower().endswith(TFRECORD_SUFFIXES):
            stem = os.path.splitext(self.output_file)[0]
            raise DataError(f"--output_file={self.output_file}: this writes NVIDIA's HDF5 layout, not Google's "
                            f"TFRecords (run_pretraining reads HDF5); name it {stem}.hdf5")
        if self.length_bins is not None:
            try:
                check_length_bins(self.length_bins, self.max_seq_length)
            except ValueError as error:
                raise DataError(str(error)) from None

    @property
    def bin_edges(self) -> tuple[int, ...]:
        return self.length_bins or (self.max_seq_length,)


def _join(values: Sequence[Any]) -> str:
    return ",".join(str(value) for value in values)


# ---------------------------------------------------------------------------------------------------------------
# Reading: a stream of chunks of documents.

def resolve_input_files(patterns: str) -> list[str]:
    """Google's --input_file: comma-separated files or glob patterns, each of which must name something."""
    paths: list[str] = []
    for pattern in filter(None, (part.strip() for part in patterns.split(","))):
        # Sorted: the output must not depend on the directory's order. A name with "[" may be a file, not a pattern.
        matches = sorted(glob.glob(pattern)) or ([pattern] if os.path.exists(pattern) else [])
        if not matches:
            raise DataError(f"--input_file {pattern}: no such file")
        for path in matches:
            if not os.path.isfile(path):
                raise DataError(f"--input_file {path}: not a file")
            if not os.access(path, os.R_OK):
                raise DataError(f"--input_file {path}: not readable")
        paths.extend(matches)
    if not paths:
        raise DataError("--input_file names no file")
    return paths


class CorpusReader:
    """Documents (lists of stripped non-blank lines) in chunks of about `chunk_bytes` of text; counts what it read
    so that progress can be shown while the chunks are being worked on."""

    def __init__(self, paths: Sequence[str], chunk_bytes: float):
        self.paths, self.chunk_bytes = paths, chunk_bytes
        self.bytes_read = self.sentences = self.documents = 0

    def chunks(self) -> Iterator[list[list[str]]]:
        chunk: list[list[str]] = []
        chunk_start = 0  # bytes read before the chunk's first line
        for path in self.paths:
            for document in self._documents(path):
                chunk.append(document)
                if self.bytes_read - chunk_start >= self.chunk_bytes:
                    yield chunk
                    chunk, chunk_start = [], self.bytes_read
        if chunk:
            yield chunk

    def _documents(self, path: str) -> Iterator[list[str]]:
        """A file's documents; the last one ends with the file (Google's would run on into the next file)."""
        document: list[str] = []
        with open(path, "rb") as handle:
            for line_number, raw in enumerate(handle, 1):
                self.bytes_read += len(raw)
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as error:
                    raise DataError(f"{path}:{line_number}: not valid UTF-8 ({error.reason} at byte "
                                    f"{error.start + 1} of the line)") from None
                if line:
                    document.append(line)
                    self.sentences += 1
                elif document:
                    self.documents += 1
                    yield document
                    document = []
        if document:
            self.documents += 1
            yield document


# ---------------------------------------------------------------------------------------------------------------
# Making instances (in the workers).

class ChunkInstances(NamedTuple):
    """A chunk's instances in their shuffled order, ragged arrays stored back to back (compact to send between
    processes; the writer pads each row to its bin's width)."""

    tokens: np.ndarray  # C int (int32): every instance's ids, [CLS] A [SEP] B [SEP] with the masks applied
    lengths: np.ndarray  # int32 [n]: tokens of each instance
    a_lengths: np.ndarray  # int32 [n]: tokens of segment A, so the first [SEP] is at a_length + 1
    masked_positions: np.ndarray  # C int (int32), ascending within each instance
    masked_ids: np.ndarray  # C int (int32): the original ids at those positions
    masked_counts: np.ndarray  # int32 [n]
    next_sentence_labels: np.ndarray  # int8 [n]: 1 when B is a random next sentence
    worker_peak_rss: int  # bytes, the peak so far of the process that made them


class InstanceMaker:
    """Google's create_training_instances for one chunk, on token ids. A document is a list of (start, end)
    sentence spans in the chunk's token list, so segments A and B are spans too and are only copied once, into
    the finished instance."""

    def __init__(self, tokenizer: BertTokenizer, settings: DataSettings):
        self.backend = tokenizer.backend
        self.settings = settings
        self.cls_id, self.sep_id, self.mask_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id
        self.vocab_size = tokenizer.vocab_size
        by_id = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
        self.is_subword = [token.startswith("##") for token in by_id]
        self.max_num_tokens = settings.max_seq_length - 3

    def make(self, chunk_index: int, documents: list[list[str]]) -> ChunkInstances:
        tokens, spans = self._tokenize(documents)
        # A string seed is hashed with SHA-512 by `random`, the same in every process and Python run.
        rng = random.Random(f"{self.settings.random_seed}/{chunk_index}")
        rng.shuffle(spans)
        pairs: list[tuple[int, int, int, int, bool]] = []
        for _ in range(self.settings.dupe_factor):
            for document_index in range(len(spans)):
                self._add_pairs(spans, document_index, rng, pairs)
        rng.shuffle(pairs)
        out = _Columns()
        for pair in pairs:
            self._add_instance(tokens, pair, rng, out)
        return out.finish()

    def _tokenize(self, documents: list[list[str]]) -> tuple[list[int], list[list[tuple[int, int]]]]:
        lines = [line for document in documents for line in document]
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets, which only SQuAD needs: ~15% faster.
        encode_batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        sentences = (encoding.ids for start in range(0, len(lines), TOKENIZE_BATCH)
                     for encoding in encode_batch(lines[start:start + TOKENIZE_BATCH], add_special_tokens=False))
        tokens: list[int] = []
        spans: list[list[tuple[int, int]]] = []
        for document in documents:
            document_spans = []
            for _, ids in zip(document, sentences):
                if ids:  # as Google's, a line that tokenizes to nothing is no sentence
                    document_spans.append((len(tokens), len(tokens) + len(ids)))
                    tokens.extend(ids)
            if document_spans:
                spans.append(document_spans)
        return tokens, spans

    def _add_pairs(self, documents: list[list[tuple[int, int]]], index: int, rng: random.Random,
                   pairs: list[tuple[int, int, int, int, bool]]) -> None:
        """Google's create_instances_from_document up to the masking: the (A span, B span, is random) pairs."""
        document = documents[index]
        target = self.max_num_tokens
        if rng.random() < self.settings.short_seq_prob:
            target = rng.randint(2, self.max_num_tokens)
        first = length = i = 0  # the current chunk of sentences is document[first:i + 1]
        while i < len(document):
            length += document[i][1] - document[i][0]
            if i == len(document) - 1 or length >= target:
                count = i - first + 1
                a_sentences = rng.randint(1, count - 1) if count >= 2 else 1
                a_start, a_end = document[first][0], document[first + a_sentences - 1][1]
                is_random = count == 1 or rng.random() < 0.5
                if is_random:
                    for _ in range(10):
                        other = rng.randint(0, len(documents) - 1)
                        if other != index:
                            break
                    random_document = documents[other]
                    start = last = rng.randint(0, len(random_document) - 1)
                    b_target = target - (a_end - a_start)
                    while (last < len(random_document) - 1
                           and random_document[last][1] - random_document[start][0] < b_target):
                        last += 1
                    b_start, b_end = random_document[start][0], random_document[last][1]
                    i -= count - a_sentences  # put back the sentences B did not use: the next pair starts there
                else:
                    b_start, b_end = document[first + a_sentences][0], document[i][1]
                pairs.append(self._truncate(a_start, a_end, b_start, b_end, rng) + (is_random,))
                first, length = i + 1, 0
            i += 1

    def _truncate(self, a_start: int, a_end: int, b_start: int, b_end: int,
                  rng: random.Random) -> tuple[int, int, int, int]:
        """Google's truncate_seq_pair: tokens go from the longer segment, each from its front or back by a coin
        flip, so the number cut from the front is binomial: one draw of random bits stands in for the flips."""
        length_a, length_b = a_end - a_start, b_end - b_start
        keep_a, keep_b = truncated_pair_lengths(length_a, length_b, self.max_num_tokens)
        a_start += rng.getrandbits(length_a - keep_a).bit_count()
        b_start += rng.getrandbits(length_b - keep_b).bit_count()
        return a_start, a_start + keep_a, b_start, b_start + keep_b

    def _add_instance(self, tokens: list[int], pair: tuple[int, int, int, int, bool], rng: random.Random,
                      out: _Columns) -> None:
        """Google's create_masked_lm_predictions on [CLS] A [SEP] B [SEP]."""
        a_start, a_end, b_start, b_end, is_random = pair
        instance = [self.cls_id, *tokens[a_start:a_end], self.sep_id, *tokens[b_start:b_end], self.sep_id]
        length_a = a_end - a_start
        segments = ((1, length_a + 1), (length_a + 2, len(instance) - 1))  # positions of A and of B
        settings = self.settings
        to_predict = min(settings.max_predictions_per_seq, max(1, int(round(len(instance) * settings.masked_lm_prob))))
        if settings.do_whole_word_mask:
            words: list[list[int]] = []
            for start, end in segments:
                for position in range(start, end):
                    if position > start and self.is_subword[instance[position]]:
                        words[-1].append(position)
                    else:
                        words.append([position])
            rng.shuffle(words)
            chosen: list[int] = []
            for word in words:
                if len(chosen) >= to_predict:
                    break
                if len(chosen) + len(word) <= to_predict:  # a word is masked whole or not at all
                    chosen.extend(word)
            positions = sorted(chosen)
        else:
            # Google shuffles all candidates and takes the first `to_predict`: a uniform sample, drawn directly.
            candidates = len(instance) - 3
            picks = rng.sample(range(candidates), min(to_predict, candidates))
            positions = sorted(pick + 1 if pick < length_a else pick + 2 for pick in picks)
        labels = [instance[position] for position in positions]
        for position in positions:
            if rng.random() < 0.8:
                instance[position] = self.mask_id
            elif rng.random() >= 0.5:  # else (half of the other 20%) the token stays as it is
                instance[position] = rng.randrange(self.vocab_size)  # Google: any word of the vocab, uniformly
        out.add(instance, length_a, positions, labels, is_random)


class _Columns:
    """Growing ragged columns of a chunk's instances (array.array: 4 bytes a token, not a Python list's 8+)."""

    def __init__(self):
        self.tokens, self.positions, self.ids = array.array("i"), array.array("i"), array.array("i")
        self.lengths, self.a_lengths, self.counts, self.labels = [], [], [], []

    def add(self, instance: list[int], length_a: int, positions: list[int], ids: list[int], is_random: bool) -> None:
        self.tokens.extend(instance)
        self.positions.extend(positions)
        self.ids.extend(ids)
        self.lengths.append(len(instance))
        self.a_lengths.append(length_a)
        self.counts.append(len(positions))
        self.labels.append(is_random)

    def finish(self) -> ChunkInstances:
        def int32(values: list[int]) -> np.ndarray:
            return np.asarray(values, dtype=np.int32)

        def view(values: array.array) -> np.ndarray:  # no copy: the tokens are the chunk's largest array
            return np.frombuffer(values, dtype=np.intc)
        return ChunkInstances(view(self.tokens), int32(self.lengths), int32(self.a_lengths), view(self.positions),
                              view(self.ids), int32(self.counts), np.asarray(self.labels, dtype=np.int8),
                              peak_memory_bytes("cpu"))



_MAKER: InstanceMaker | None = None  # a worker process's own


def _start_worker(vocab: dict[str, int], settings: DataSettings, threads: int) -> None:
    # The tokenizer's thread pool would otherwise take every core in every worker.
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    # Ctrl-C is the main process's to handle: it stops the work and removes the partial output.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _MAKER
    _MAKER = InstanceMaker(BertTokenizer(vocab, do_lower_case=settings.do_lower_case), settings)


def _make_chunk(chunk_index: int, documents: list[list[str]]) -> ChunkInstances:
    return _MAKER.make(chunk_index, documents)


# ---------------------------------------------------------------------------------------------------------------
# Writing: shards filled in whole hdf5 chunks, dealt round-robin.

def _padded(values: np.ndarray, offsets: np.ndarray, counts: np.ndarray, rows: np.ndarray, width: int,
            dtype) -> tuple[np.ndarray, np.ndarray]:
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
        merged = {key: np.concatenate([rows[key] for rows in self.pending]) if self.pending else None
                  for key in SHARD_KEYS}
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
        widths = {"input_ids": self.width, "input_mask": self.width, "segment_ids": self.width,
                  "masked_lm_positions": self.settings.max_predictions_per_seq,
                  "masked_lm_ids": self.settings.max_predictions_per_seq}
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with h5py.File(self.path, "w-") as shard:
            for key in SHARD_KEYS:
                tail = (widths[key],) if key in widths else ()
                shard.create_dataset(key, shape=(0, *tail), maxshape=(None, *tail), chunks=(self.chunk_rows, *tail),
                                     dtype=NVIDIA_DTYPES[key], compression="gzip", compression_opts=GZIP_LEVEL)
            # Readers ignore these; they say how the file was made.
            settings = self.settings
            shard.attrs.update({
                "max_seq_length": settings.max_seq_length, "max_predictions_per_seq": settings.max_predictions_per_seq,
                "masked_lm_prob": settings.masked_lm_prob, "dupe_factor": settings.dupe_factor,
                "short_seq_prob": settings.short_seq_prob, "do_whole_word_mask": settings.do_whole_word_mask,
                "random_seed": settings.random_seed, "do_lower_case": settings.do_lower_case,
                "vocab_size": self.vocab_size, "length_bin_edge": self.width})
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
        self.shards = [[_Shard(os.path.join(layout.temp_dir, name), edge, layout.settings, vocab_size)
                        for name in names] for edge, names in zip(self.edges, self.names)]
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
                rows = members[(index - self.instances[b]) % len(shards)::len(shards)]
                if len(rows):
                    shard.add(self._rows(chunk, rows, offsets, mask_offsets, edge))
            self.instances[b] += len(members)
        self._write([shard for shards in self.shards for shard in shards if shard.pending_rows >= shard.chunk_rows],
                    final=False)

    def _rows(self, chunk: ChunkInstances, rows: np.ndarray, offsets: np.ndarray, mask_offsets: np.ndarray,
              width: int) -> dict[str, np.ndarray]:
        input_ids, real = _padded(chunk.tokens, offsets, chunk.lengths, rows, width, NVIDIA_DTYPES["input_ids"])
        segment_b = np.arange(width) >= chunk.a_lengths[rows][:, None] + 2  # after A's [SEP]
        positions, _ = _padded(chunk.masked_positions, mask_offsets, chunk.masked_counts, rows, self.predictions,
                               NVIDIA_DTYPES["masked_lm_positions"])
        ids, _ = _padded(chunk.masked_ids, mask_offsets, chunk.masked_counts, rows, self.predictions,
                         NVIDIA_DTYPES["masked_lm_ids"])
        return {"input_ids": input_ids, "input_mask": real.astype(NVIDIA_DTYPES["input_mask"]),
                "segment_ids": (segment_b & real).astype(NVIDIA_DTYPES["segment_ids"]),
                "masked_lm_positions": positions, "masked_lm_ids": ids,
                "next_sentence_labels": chunk.next_sentence_labels[rows].astype(NVIDIA_DTYPES["next_sentence_labels"])}

    def _write(self, shards: list[_Shard], final: bool) -> None:
        """Compress every ready chunk of `shards` at once, so that the threads have work, then write them."""
        jobs = []
        for shard in shards:
            start, rows = shard.take(final)
            count = len(rows["next_sentence_labels"]) if rows else 0
            chunks = {key: [self.compressor.submit(_deflate, values[first:first + shard.chunk_rows], shard.chunk_rows)
                            for first in range(0, count, shard.chunk_rows)] for key, values in rows.items()}
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


# ---------------------------------------------------------------------------------------------------------------
# Output files: named, checked, and moved into place only when complete.

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
        directories = {self.base}
        for name in names:
            final = self.final_path(name)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            directories.add(os.path.dirname(final))
            fsync_path(os.path.join(self.temp_dir, name))
            os.replace(os.path.join(self.temp_dir, name), final)
        for directory in directories:
            fsync_path(directory)


# ---------------------------------------------------------------------------------------------------------------
# The run.

class _Progress:
    """A progress bar over the input's bytes on a terminal (progress.progress_bar); elsewhere a log line every 10
    seconds."""

    def __init__(self, total_bytes: int, log: Callable[[str], None]):
        self.total_mb, self.log = total_bytes / 1e6, log
        self.bar = progress_bar(total_bytes, unit="B", unit_scale=True)
        self.started = self.last = time.monotonic()

    def show(self, reader: CorpusReader, instances: int) -> None:
        if not self.bar.disable:
            self.bar.set_postfix_str(f"{instances:,} instances", refresh=False)
            self.bar.update(reader.bytes_read - self.bar.n)
            return
        now = time.monotonic()
        if now - self.last < 10.0:
            return
        self.last = now
        elapsed = now - self.started
        self.log(f"{reader.bytes_read / 1e6:,.1f}/{self.total_mb:,.1f} MB read, "
                 f"{reader.sentences / elapsed:,.0f} sentences/s, {instances:,} instances written, "
                 f"{format_duration(elapsed)}")

    def close(self) -> None:
        self.bar.close()


def create_pretraining_data(settings: DataSettings, log: Callable[[str], None] = log) -> dict[str, Any]:
    """Read `settings.input_file`, write the shards and the statistics file; returns the statistics. Raises
    DataError, VocabError or OSError for input or output a user can fix; nothing is written then."""
    started = time.monotonic()
    paths = resolve_input_files(settings.input_file)
    tokenizer = BertTokenizer.from_vocab_file(settings.vocab_file, do_lower_case=settings.do_lower_case)
    layout = OutputLayout(settings)
    layout.refuse_existing()
    created_base = not os.path.isdir(layout.base)
    os.makedirs(layout.temp_dir)
    try:
        reader, writer, chunks, shard_names = _write_shards(settings, paths, tokenizer, layout, log)
        stats = _statistics(settings, paths, reader, writer, chunks, time.monotonic() - started)
        with open(os.path.join(layout.temp_dir, layout.stats_name), "w", encoding="utf-8") as handle:
            json.dump(stats, handle, indent=2)
            handle.write("\n")
        layout.move_into_place(shard_names + [layout.stats_name])
    except BaseException:
        shutil.rmtree(layout.temp_dir, ignore_errors=True)
        if created_base:
            with contextlib.suppress(OSError):  # not empty: someone else has written there meanwhile
                os.rmdir(layout.base)
        raise
    shutil.rmtree(layout.temp_dir)  # only the emptied len_<edge>/ directories are left in it
    for edge, count in zip(settings.bin_edges, writer.instances):
        if not count:
            log(f"length bin {edge}: no instances, no files written")
    log(_summary(stats, layout))
    return stats


def _write_shards(settings: DataSettings, paths: list[str], tokenizer: BertTokenizer, layout: OutputLayout,
                  log: Callable[[str], None]) -> tuple[CorpusReader, ShardWriter, int, list[str]]:
    """Chunks go to the workers as they are read, at most two per worker in flight (so memory does not grow with
    the corpus), and their instances are written in chunk order (so the output does not depend on the workers).
    Returns the reader and writer (which hold the counts), the number of chunks and the shards' names."""
    reader = CorpusReader(paths, settings.chunk_megabytes * 1e6)
    progress = _Progress(sum(os.path.getsize(path) for path in paths), log)
    threads = max(1, (os.cpu_count() or 1) // settings.num_workers)
    # Not fork: this process may run torch's or the tokenizer's threads, which a forked child would find broken.
    # A fork server that has imported this module (and so torch, through bertbench.tasks.pretraining) forks each
    # worker ready to run, where spawn would import torch again in every worker (seconds and ~200 MB each).
    context = get_context("forkserver")
    # Under `python -m` this module is __main__, which the workers import by that name: preloaded under its own
    # name as well, it would be imported twice in each worker (and runpy warns).
    context.set_forkserver_preload(["__main__" if __name__ == "__main__" else __name__])
    with ThreadPoolExecutor(os.cpu_count()) as compressor:
        writer = ShardWriter(layout, tokenizer.vocab_size, compressor)
        pool = ProcessPoolExecutor(settings.num_workers, mp_context=context, initializer=_start_worker,
                                   initargs=(tokenizer.vocab, settings, threads))
        in_flight: deque = deque()
        chunks = 0
        try:
            for chunks, documents in enumerate(reader.chunks(), 1):
                in_flight.append(pool.submit(_make_chunk, chunks - 1, documents))
                while len(in_flight) >= 2 * settings.num_workers or (in_flight and in_flight[0].done()):
                    writer.add(in_flight.popleft().result())
                    progress.show(reader, sum(writer.instances))
            while in_flight:
                writer.add(in_flight.popleft().result())
                progress.show(reader, sum(writer.instances))
        except BrokenProcessPool:
            raise DataError(f"a worker process died, most likely out of memory: lower --chunk_megabytes "
                            f"({settings.chunk_megabytes:g}) or --num_workers ({settings.num_workers})") from None
        finally:
            progress.close()
            pool.shutdown(wait=True, cancel_futures=True)
        if not reader.documents:
            raise DataError(f"{', '.join(paths)}: no documents (every line is blank)")
        if not sum(writer.instances):
            raise DataError(f"{', '.join(paths)}: no instances (no line has a token after tokenization)")
        return reader, writer, chunks, writer.finish()


def _statistics(settings: DataSettings, paths: list[str], reader: CorpusReader, writer: ShardWriter, chunks: int,
                seconds: float) -> dict[str, Any]:
    instances = sum(writer.instances)
    padded = instances * settings.max_seq_length
    padded_bins = sum(count * edge for count, edge in zip(writer.instances, settings.bin_edges))
    stats: dict[str, Any] = {
        "settings": dataclasses.asdict(settings),
        "input_files": [{"path": path, "bytes": os.path.getsize(path)} for path in paths],
        "input_bytes": reader.bytes_read, "chunks": chunks, "documents": reader.documents,
        "sentences": reader.sentences, "instances": instances, "tokens": writer.tokens,
        "padded_tokens": padded, "padding_fraction": 1 - writer.tokens / padded,
    }
    if settings.length_bins:
        stats.update({
            "instances_per_bin": {str(edge): count for edge, count in zip(settings.bin_edges, writer.instances)},
            "padded_tokens_with_bins": padded_bins, "padding_fraction_with_bins": 1 - writer.tokens / padded_bins,
            "padding_saved_fraction": (1 - (padded_bins - writer.tokens) / (padded - writer.tokens)
                                       if padded > writer.tokens else 0.0)})
    stats.update({
        "seconds": seconds, "sentences_per_second": reader.sentences / seconds,
        "megabytes_per_second": reader.bytes_read / 1e6 / seconds,
        "peak_rss_bytes": peak_memory_bytes("cpu"), "peak_worker_rss_bytes": writer.worker_peak_rss,
        "num_workers": settings.num_workers})
    return stats


def _summary(stats: dict[str, Any], layout: OutputLayout) -> str:
    settings = layout.settings
    where = settings.output_file or settings.output_dir
    files = "1 shard" if settings.output_file else f"{layout.num_shards} shard(s) per bin"
    text = (f"Read {len(stats['input_files'])} file(s), {stats['input_bytes'] / 1e6:,.1f} MB: {stats['documents']:,} "
            f"documents, {stats['sentences']:,} sentences, in {stats['chunks']:,} chunk(s) with "
            f"{stats['num_workers']} worker(s) in {stats['seconds']:.1f} s ({stats['sentences_per_second']:,.0f} "
            f"sentences/s, {stats['megabytes_per_second']:.2f} MB/s). Wrote {stats['instances']:,} instances of "
            f"{stats['tokens']:,} tokens into {files} in {where}; padded to {settings.max_seq_length} they would be "
            f"{stats['padding_fraction']:.1%} padding")
    if settings.length_bins:
        text += (f", in length bins {_join(settings.length_bins)} ({_join(stats['instances_per_bin'].values())} "
                 f"instances) {stats['padding_fraction_with_bins']:.1%}, {stats['padding_saved_fraction']:.1%} of "
                 "the padding saved")
    return (text + f". Peak RSS {stats['peak_rss_bytes'] / 2**20:,.0f} MiB in the main process, "
            f"{stats['peak_worker_rss_bytes'] / 2**20:,.0f} MiB in the largest worker.")


# ---------------------------------------------------------------------------------------------------------------
# The command.

def build_parser(prog: str = PROGRAM) -> FlagParser:
    """The flags, one per DataSettings field, with its help text and default."""
    parser = FlagParser(prog=prog, description=description(__doc__))
    add_dataclass_flags(parser, DataSettings, one_of=("output_dir", "output_file"))
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    def body() -> int | None:
        parser = build_parser(prog)
        values = {**parser.defaults, **vars(parser.parse_args(argv))}
        try:
            values["length_bins"] = parse_length_bins(values["length_bins"], values["max_seq_length"])
        except ValueError as error:
            raise DataError(str(error)) from None
        try:
            create_pretraining_data(DataSettings(**values))
        except KeyboardInterrupt:
            print(f"{prog}: interrupted; nothing was written", file=sys.stderr)
            return signal_status("SIGINT")
        return None
    return run_command(prog, body, input_errors=(DataError, VocabError))


if __name__ == "__main__":
    sys.exit(main())
