"""create_pretraining_data's settings: the flags, with Google's names and defaults, as one frozen dataclass checked
when it is built, and the error a user's input or settings raise."""

from __future__ import annotations

import dataclasses
import os

from bertbench.common.flags import setting
from bertbench.tasks.pretraining import check_length_bins

PROGRAM = "create_pretraining_data"  # the command's name: its messages and its temporary directory's

# Google's names for its TFRecord output: refused, since the shards written are HDF5 (a .tfrecord name would hide it).
TFRECORD_SUFFIXES = (".tfrecord", ".tfrecords", ".tf_record")


class DataError(ValueError):
    """Input or settings a user gave that cannot work; the message names the file or flag."""


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """The flags (Google's names and defaults): what to read, how to make instances and where to write them.

    Each field's help is its flag's --help text."""

    input_file: str = setting(
        "Comma-separated text files or glob patterns: one sentence per line, a blank line "
        "between documents (Google's format)."
    )
    vocab_file: str = setting("vocab.txt of the model to pre-train.")
    output_dir: str | None = setting(
        "Directory for the shards, <shard_prefix>_<i:05d>.hdf5 (in len_<edge>/ with "
        "--length_bins), and the statistics, create_pretraining_data.json. Give this "
        "or --output_file.",
        None,
    )
    output_file: str | None = setting(
        "NVIDIA's single shard at this path, statistics in PATH.json. Give this or --output_dir.", None
    )
    num_shards: int = setting(
        "Shards (per length bin) in --output_dir; instances are dealt round-robin, so shard "
        "sizes differ by at most one.",
        1,
    )
    shard_prefix: str = setting("File name prefix of the shards in --output_dir.", "training")
    do_lower_case: bool = setting("Lower-case and strip accents (uncased models).", True)
    do_whole_word_mask: bool = setting("Mask all WordPiece pieces of a word together.", False)
    max_seq_length: int = setting(
        "Tokens per instance, [CLS] and [SEP]s included; shorter ones are padded with 0.", 128
    )
    max_predictions_per_seq: int = setting("Most masked tokens per instance.", 20)
    random_seed: int = setting("Seed: chunk k draws from a generator seeded from (random_seed, k) alone.", 12345)
    dupe_factor: int = setting("Passes over each chunk's documents, each with new sentence pairs and a new mask.", 10)
    masked_lm_prob: float = setting("Share of an instance's tokens to mask (rounded, at least one).", 0.15)
    short_seq_prob: float = setting(
        "Probability that an instance aims at a random shorter length, so the model also sees short sequences.", 0.1
    )
    length_bins: tuple[int, ...] | None = setting(
        "Ascending comma-separated bin edges ending at --max_seq_length, e.g. 128,256,384,512: each instance goes to "
        "the smallest bin that holds it, whose shards in len_<edge>/ are padded to <edge> only, so batches drawn "
        "from one bin carry less padding (the MLPerf trick).",
        None,
    )
    num_workers: int = setting("Worker processes making instances; the output does not depend on it.", 1)
    chunk_megabytes: float = setting(
        "Text per chunk (MB), cut at document boundaries. A chunk stands in for "
        "Google's whole corpus: random next sentences come from its own documents and "
        "its instances are shuffled together. Memory grows with this (times "
        "--dupe_factor and the workers), not with the corpus.",
        8.0,
    )

    def __post_init__(self):
        if (self.output_dir is None) == (self.output_file is None):
            raise DataError("give exactly one of --output_dir and --output_file")
        for name in ("num_shards", "max_predictions_per_seq", "dupe_factor", "num_workers"):
            if getattr(self, name) < 1:
                raise DataError(f"--{name} must be positive, got {getattr(self, name)}")
        if self.max_seq_length < 5:
            raise DataError(f"--max_seq_length must be at least 5 ([CLS] A [SEP] B [SEP]), got {self.max_seq_length}")
        if self.max_predictions_per_seq >= self.max_seq_length:
            raise DataError(
                f"--max_predictions_per_seq ({self.max_predictions_per_seq}) must be less than "
                f"--max_seq_length ({self.max_seq_length})"
            )
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
            raise DataError(
                f"--output_file={self.output_file}: this writes NVIDIA's HDF5 layout, not Google's "
                f"TFRecords (run_pretraining reads HDF5); name it {stem}.hdf5"
            )
        if self.length_bins is not None:
            try:
                check_length_bins(self.length_bins, self.max_seq_length)
            except ValueError as error:
                raise DataError(str(error)) from None

    @property
    def bin_edges(self) -> tuple[int, ...]:
        return self.length_bins or (self.max_seq_length,)
