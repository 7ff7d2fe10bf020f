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

The parts are bertbench.tasks.pretraining_data's (settings, corpus, instances, shards); this module runs them: the
worker pool between reading and writing, the statistics, and the command.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from bertbench.common.errors import run_command
from bertbench.common.flags import FlagParser, add_dataclass_flags, description
from bertbench.common.signals import signal_status
from bertbench.tasks.pretraining_data import instances
from bertbench.tasks.pretraining_data.corpus import CorpusReader, resolve_input_files
from bertbench.tasks.pretraining_data.instances import make_chunk, start_worker
from bertbench.tasks.pretraining_data.settings import PROGRAM, DataError, DataSettings
from bertbench.tasks.pretraining_data.shards import OutputLayout, ShardWriter
from bertbench.tasks.tokenization import BertTokenizer, VocabError
from bertbench.training.devices import peak_memory_bytes
from bertbench.training.progress import format_duration, log, progress_bar


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
        self.log(
            f"{reader.bytes_read / 1e6:,.1f}/{self.total_mb:,.1f} MB read, "
            f"{reader.sentences / elapsed:,.0f} sentences/s, {instances:,} instances written, "
            f"{format_duration(elapsed)}"
        )

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


def _write_shards(
    settings: DataSettings, paths: list[str], tokenizer: BertTokenizer, layout: OutputLayout, log: Callable[[str], None]
) -> tuple[CorpusReader, ShardWriter, int, list[str]]:
    """Chunks go to the workers as they are read, at most two per worker in flight (so memory does not grow with
    the corpus), and their instances are written in chunk order (so the output does not depend on the workers).
    Returns the reader and writer (which hold the counts), the number of chunks and the shards' names."""
    reader = CorpusReader(paths, settings.chunk_megabytes * 1e6)
    progress = _Progress(sum(os.path.getsize(path) for path in paths), log)
    threads = max(1, (os.cpu_count() or 1) // settings.num_workers)
    # Not fork: this process may run torch's or the tokenizer's threads, which a forked child would find broken.
    # A fork server that has imported the workers' module forks each worker ready to run, where spawn would import
    # it again in every worker.
    context = get_context("forkserver")
    # Under `python -m` this module is __main__, which every worker would import again (and runpy warns) unless the
    # fork server has imported it.
    context.set_forkserver_preload([*(["__main__"] if __name__ == "__main__" else []), instances.__name__])
    with ThreadPoolExecutor(os.cpu_count()) as compressor:
        writer = ShardWriter(layout, tokenizer.vocab_size, compressor)
        pool = ProcessPoolExecutor(
            settings.num_workers,
            mp_context=context,
            initializer=start_worker,
            initargs=(tokenizer.vocab, settings, threads),
        )
        in_flight: deque = deque()
        chunks = 0
        try:
            for chunks, documents in enumerate(reader.chunks(), 1):
                in_flight.append(pool.submit(make_chunk, chunks - 1, documents))
                while len(in_flight) >= 2 * settings.num_workers or (in_flight and in_flight[0].done()):
                    writer.add(in_flight.popleft().result())
                    progress.show(reader, sum(writer.instances))
            while in_flight:
                writer.add(in_flight.popleft().result())
                progress.show(reader, sum(writer.instances))
        except BrokenProcessPool:
            raise DataError(
                f"a worker process died, most likely out of memory: lower --chunk_megabytes "
                f"({settings.chunk_megabytes:g}) or --num_workers ({settings.num_workers})"
            ) from None
        finally:
            progress.close()
            pool.shutdown(wait=True, cancel_futures=True)
        if not reader.documents:
            raise DataError(f"{', '.join(paths)}: no documents (every line is blank)")
        if not sum(writer.instances):
            raise DataError(f"{', '.join(paths)}: no instances (no line has a token after tokenization)")
        return reader, writer, chunks, writer.finish()


def _statistics(
    settings: DataSettings, paths: list[str], reader: CorpusReader, writer: ShardWriter, chunks: int, seconds: float
) -> dict[str, Any]:
    instances = sum(writer.instances)
    padded = instances * settings.max_seq_length
    padded_bins = sum(count * edge for count, edge in zip(writer.instances, settings.bin_edges))
    stats: dict[str, Any] = {
        "settings": dataclasses.asdict(settings),
        "input_files": [{"path": path, "bytes": os.path.getsize(path)} for path in paths],
        "input_bytes": reader.bytes_read,
        "chunks": chunks,
        "documents": reader.documents,
        "sentences": reader.sentences,
        "instances": instances,
        "tokens": writer.tokens,
        "padded_tokens": padded,
        "padding_fraction": 1 - writer.tokens / padded,
    }
    if settings.length_bins:
        stats.update(
            {
                "instances_per_bin": {str(edge): count for edge, count in zip(settings.bin_edges, writer.instances)},
                "padded_tokens_with_bins": padded_bins,
                "padding_fraction_with_bins": 1 - writer.tokens / padded_bins,
                "padding_saved_fraction": (
                    1 - (padded_bins - writer.tokens) / (padded - writer.tokens) if padded > writer.tokens else 0.0
                ),
            }
        )
    stats.update(
        {
            "seconds": seconds,
            "sentences_per_second": reader.sentences / seconds,
            "megabytes_per_second": reader.bytes_read / 1e6 / seconds,
            "peak_rss_bytes": peak_memory_bytes("cpu"),
            "peak_worker_rss_bytes": writer.worker_peak_rss,
            "num_workers": settings.num_workers,
        }
    )
    return stats


def _summary(stats: dict[str, Any], layout: OutputLayout) -> str:
    settings = layout.settings
    where = settings.output_file or settings.output_dir
    files = "1 shard" if settings.output_file else f"{layout.num_shards} shard(s) per bin"
    text = (
        f"Read {len(stats['input_files'])} file(s), {stats['input_bytes'] / 1e6:,.1f} MB: {stats['documents']:,} "
        f"documents, {stats['sentences']:,} sentences, in {stats['chunks']:,} chunk(s) with "
        f"{stats['num_workers']} worker(s) in {stats['seconds']:.1f} s ({stats['sentences_per_second']:,.0f} "
        f"sentences/s, {stats['megabytes_per_second']:.2f} MB/s). Wrote {stats['instances']:,} instances of "
        f"{stats['tokens']:,} tokens into {files} in {where}; padded to {settings.max_seq_length} they would be "
        f"{stats['padding_fraction']:.1%} padding"
    )
    if settings.length_bins:
        text += (
            f", in length bins {_join(settings.length_bins)} ({_join(stats['instances_per_bin'].values())} "
            f"instances) {stats['padding_fraction_with_bins']:.1%}, {stats['padding_saved_fraction']:.1%} of "
            "the padding saved"
        )
    return (
        text + f". Peak RSS {stats['peak_rss_bytes'] / 2**20:,.0f} MiB in the main process, "
        f"{stats['peak_worker_rss_bytes'] / 2**20:,.0f} MiB in the largest worker."
    )


def _join(values: Sequence[Any]) -> str:
    return ",".join(str(value) for value in values)


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
            create_pretraining_data(DataSettings(**values))
        except KeyboardInterrupt:
            print(f"{prog}: interrupted; nothing was written", file=sys.stderr)
            return signal_status("SIGINT")
        return None

    return run_command(prog, body, input_errors=(DataError, VocabError))


if __name__ == "__main__":
    sys.exit(main())
