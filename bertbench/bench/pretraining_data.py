"""`bertbench bench pretraining-data`: throughput and peak memory of create_pretraining_data over worker counts.

Each run is `python -m bertbench.tasks.create_pretraining_data` in a process of its own, so that the peak resident set it
reports (ru_maxrss of its main process, and of its largest worker) is that run's alone; the figures come from the
statistics file it writes, create_pretraining_data.json. The speed-up of each worker count is relative to the first
one given. The text is a corpus the user gives (`--corpus` and its `--vocab_file`) or, by default, a synthetic one
generated here from `--seed`, so that the figures can be made on a machine without a network: English-like
pseudo-words of syllables with Zipf frequencies, in sentences and documents of English-like lengths, and a vocab.txt
of BERT-base's size made from it, in which the rarer words are split into WordPieces as a real vocab splits them.

    bertbench bench pretraining-data --megabytes 120 --workers 1,2,4,8
    bertbench bench pretraining-data --corpus wiki_00.txt,wiki_01.txt --vocab_file $BERT_DIR/vocab.txt
    bertbench bench pretraining-data --megabytes 20 --workers 4 --length_bins_at 512   # padding saved by bins
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np

from bertbench.bench import settings, workload
from bertbench.bench.errors import BenchRunFailed
from bertbench.bench.output import BenchOutput
from bertbench.bench.plots import line_plot
from bertbench.bench.results import Column, Ratio, Row, Spread, table
from bertbench.common.durable import move_files, read_json
from bertbench.common.errors import UsageError
from bertbench.common.flags import description, setting
from bertbench.common.noise import LoadWatch
from bertbench.tasks import synthetic
from bertbench.tasks.pretraining_data.shards import STATS_FILE
from bertbench.tasks.tokenization import VocabError, load_vocab

BENCH = "pretraining-data"
# What --keep_corpus keeps of the synthetic corpus, beside the bench's own files.
KEPT_CORPUS, KEPT_VOCAB = f"{BENCH}-corpus.txt", f"{BENCH}-vocab.txt"

# ---- the synthetic corpus -------------------------------------------------------------------------------------------

VOCAB_SIZE = 30522  # BERT-base's
# BERT's first ids: [PAD], 99 unused slots (which a model may take over for its own tokens), [UNK] [CLS] [SEP] [MASK].
SPECIAL_TOKENS = ["[PAD]", *(f"[unused{index}]" for index in range(99)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# About the number of distinct words in a few hundred MB of English: twice the vocab, so that the vocab holds the
# frequent half whole and the rare half is split into pieces, as WordPiece splits a real corpus.
LEXICON_SIZE = 60000
# Slots for "##" pieces (syllables and suffixes that continue a word): enough to split rare words into a few pieces
# rather than into characters; the rest of the vocab is whole words.
CONTINUATION_PIECES = 3000
ONSETS = [
    "",
    "s",
    "t",
    "b",
    "m",
    "d",
    "l",
    "p",
    "r",
    "c",
    "h",
    "f",
    "n",
    "w",
    "g",
    "st",
    "tr",
    "pr",
    "br",
    "ch",
    "sh",
    "th",
    "gr",
    "cl",
    "pl",
    "k",
    "v",
    "fl",
    "dr",
    "cr",
    "sl",
    "sp",
    "j",
    "y",
    "wh",
    "str",
    "fr",
    "z",
]
NUCLEI = ["a", "e", "i", "o", "u", "ea", "ou", "ai", "ee", "oo", "io", "oa", "y"]
CODAS = ["", "n", "r", "s", "t", "l", "nd", "m", "st", "ng", "d", "ck", "nt", "rd", "sh", "th", "x"]
SUFFIXES = ["s", "ed", "ing", "er", "ly", "es", "ion", "al", "ness", "ment", "able", "ful", "est", "less", "ity"]
# Word shapes by frequency rank, as in English: the most frequent words have one syllable, the common ones two, the
# rare ones two or three, and some of those a suffix.
ONE_SYLLABLE_RANKS, TWO_SYLLABLE_RANKS, SUFFIX_FROM_RANK, SUFFIX_SHARE = 300, 6000, 1000, 0.3
ZIPF_OFFSET = 2.7  # Zipf-Mandelbrot's q: frequency of rank r is proportional to 1 / (r + q), as fitted to English
SENTENCES_PER_DOCUMENT = (3, 60)
WORDS_PER_SENTENCE = (5, 35)
COMMA_SHARE = 0.06  # words followed by a comma
ENDINGS = {".": 0.88, "?": 0.08, "!": 0.04}
BLOCK_BYTES = 4_000_000  # text generated and written at a time: memory stays small whatever --megabytes is


class Lexicon:
    """The corpus's words in frequency rank order, each with the syllables (and suffix) it is made of, and the
    Zipf probability of each rank."""

    def __init__(self, rng: np.random.Generator, size: int = LEXICON_SIZE):
        syllables, weights = self._syllables()
        self.words: list[str] = []
        self.pieces: list[list[str]] = []
        seen: set[str] = set()
        while len(self.words) < size:  # a few rounds: a candidate that repeats an earlier word is drawn again
            ranks = np.arange(len(self.words), size)
            lengths = np.where(
                ranks < ONE_SYLLABLE_RANKS,
                1,
                np.where(ranks < TWO_SYLLABLE_RANKS, 2, 2 + (rng.random(len(ranks)) < 0.5)),
            )
            drawn = rng.choice(len(syllables), size=(len(ranks), 3), p=weights)
            suffixes = np.where(
                (ranks >= SUFFIX_FROM_RANK) & (rng.random(len(ranks)) < SUFFIX_SHARE),
                rng.integers(len(SUFFIXES), size=len(ranks)),
                -1,
            )
            for length, row, suffix in zip(lengths.tolist(), drawn.tolist(), suffixes.tolist()):
                parts = [syllables[index] for index in row[:length]] + ([SUFFIXES[suffix]] if suffix >= 0 else [])
                word = "".join(parts)
                if word not in seen and len(self.words) < size:
                    seen.add(word)
                    self.words.append(word)
                    self.pieces.append(parts)
        weights = 1.0 / (np.arange(size) + ZIPF_OFFSET)
        self.probabilities = weights / weights.sum()
        self.cdf = np.cumsum(self.probabilities)

    @staticmethod
    def _syllables() -> tuple[list[str], np.ndarray]:
        """Every onset + nucleus + coda, each part's options weighted 1/(i+1) in list order (common ones first)."""

        def weights(count: int) -> np.ndarray:
            return 1.0 / np.arange(1, count + 1)

        joint = np.einsum("i,j,k->ijk", weights(len(ONSETS)), weights(len(NUCLEI)), weights(len(CODAS))).ravel()
        syllables = [onset + nucleus + coda for onset in ONSETS for nucleus in NUCLEI for coda in CODAS]
        return syllables, joint / joint.sum()

    def mean_word_bytes(self) -> float:
        return float(np.dot(self.probabilities, [len(word) for word in self.words]))


def generate_corpus(path: str, megabytes: float, seed: int) -> Lexicon:
    """Write about `megabytes` of synthetic text in Google's format to path (whole documents: it stops at the first
    document boundary past the size); returns the lexicon it drew the words from."""
    rng = np.random.default_rng(seed)
    lexicon = Lexicon(rng)
    size = len(lexicon.words)
    separators = [" ", ", "] + [ending + "\n" for ending in ENDINGS] + [ending + "\n\n" for ending in ENDINGS]
    # Every piece of text there is: the words, capitalised (a sentence's first), then what follows a word.
    table = np.array(
        [word.encode() for word in lexicon.words]
        + [word.capitalize().encode() for word in lexicon.words]
        + [separator.encode() for separator in separators],
        dtype=object,
    )
    space, comma, sentence_end, document_end = 2 * size, 2 * size + 1, 2 * size + 2, 2 * size + 2 + len(ENDINGS)
    mean_sentences, mean_words = np.mean(SENTENCES_PER_DOCUMENT), np.mean(WORDS_PER_SENTENCE)
    bytes_per_document = mean_sentences * mean_words * (lexicon.mean_word_bytes() + 1 + COMMA_SHARE)
    target, written = megabytes * 1e6, 0
    with open(path, "wb") as handle:
        while written < target:
            documents = math.ceil(min(target - written, BLOCK_BYTES) / bytes_per_document)
            sentences = rng.integers(SENTENCES_PER_DOCUMENT[0], SENTENCES_PER_DOCUMENT[1] + 1, documents)
            lengths = rng.integers(WORDS_PER_SENTENCE[0], WORDS_PER_SENTENCE[1] + 1, int(sentences.sum()))
            words = np.minimum(np.searchsorted(lexicon.cdf, rng.random(int(lengths.sum())), side="right"), size - 1)
            last_words = np.cumsum(lengths) - 1
            endings = rng.choice(len(ENDINGS), size=len(lengths), p=list(ENDINGS.values()))
            last_sentences = np.cumsum(sentences) - 1
            follows = np.where(rng.random(len(words)) < COMMA_SHARE, comma, space)
            follows[last_words] = sentence_end + endings
            follows[last_words[last_sentences]] = document_end + endings[last_sentences]
            words[last_words - lengths + 1] += size
            pieces = np.empty(2 * len(words), dtype=np.int64)
            pieces[0::2], pieces[1::2] = words, follows
            block = b"".join(table[pieces].tolist())
            handle.write(block)
            written += len(block)
    return lexicon


def synthetic_vocab(lexicon: Lexicon, size: int = VOCAB_SIZE) -> list[str]:
    """BERT's special tokens; every character and "##" + character; the syllables and suffixes that most often
    continue the words left out, as "##" pieces; then whole words, most frequent first, up to `size` tokens.

    Frequent means by the lexicon's Zipf probabilities rather than by the counts in the corpus: a small corpus holds
    fewer distinct words than the vocab has room for, and a vocab of those would split none of them. So the vocab
    is the one a large corpus gives, and the text is tokenized alike whatever --megabytes is."""
    characters = sorted(set("".join(lexicon.words)) | set("".join(ENDINGS)) | {","})
    head = SPECIAL_TOKENS + characters + ["##" + character for character in characters]
    continuing: Counter[str] = Counter()
    left_out = size - len(head) - CONTINUATION_PIECES  # rank of the first word that will not be in the vocab
    for pieces, probability in zip(lexicon.pieces[left_out:], lexicon.probabilities[left_out:].tolist()):
        for piece in pieces[1:]:
            continuing[piece] += probability
    vocab = dict.fromkeys(head + ["##" + piece for piece, _ in continuing.most_common(CONTINUATION_PIECES)])
    for word in lexicon.words:
        if len(vocab) == size:
            break
        vocab.setdefault(word)
    assert len(vocab) == size, (len(vocab), size)
    return list(vocab)


def make_synthetic_corpus(directory: str, megabytes: float, seed: int, vocab_file: str | None) -> dict:
    """corpus.txt (and, unless a vocab is given, vocab.txt) in directory; returns what the report says of them."""
    started = time.perf_counter()
    corpus = os.path.join(directory, "corpus.txt")
    lexicon = generate_corpus(corpus, megabytes, seed)
    if vocab_file is None:
        vocab_file = os.path.join(directory, "vocab.txt")
        with open(vocab_file, "w", encoding="utf-8") as handle:
            handle.write("\n".join(synthetic_vocab(lexicon)) + "\n")
    return {
        "source": "synthetic",
        "files": [corpus],
        "bytes": os.path.getsize(corpus),
        "seed": seed,
        "lexicon_words": len(lexicon.words),
        "vocab_file": vocab_file,
        "generate_seconds": time.perf_counter() - started,
    }


# ---- the bench ------------------------------------------------------------------------------------------------------

SYNTHETIC_MEGABYTES = 120.0


@dataclasses.dataclass(frozen=True)
class PretrainingDataSettings(settings.BenchSettings):
    """Corpus (the user's, or a synthetic one: the default) and create_pretraining_data's settings."""

    bench = BENCH

    corpus: tuple[str, ...] | None = setting(
        "Text files in Google's format (a sentence per line, a blank line between documents), comma-separated; "
        "needs --vocab_file.",
        None,
    )
    megabytes: float | None = setting(
        f"Size of the synthetic corpus (MB of text; default: {SYNTHETIC_MEGABYTES:g}, which makes 15 chunks of 8 MB, "
        "enough for 8 workers).",
        None,
        positive=True,
    )
    vocab_file: str | None = setting(
        "vocab.txt (default for the synthetic corpus: one of BERT-base's size made from it).", None
    )
    seed: int = setting("Seed of the synthetic corpus: same seed, same bytes.", 0)
    keep_corpus: bool = setting(
        f"Keep the synthetic corpus and vocab as {KEPT_CORPUS} and {KEPT_VOCAB} in --output_dir "
        "(they are removed with the shards otherwise).",
        False,
    )
    workers: tuple[int, ...] = setting(
        "--num_workers of each run; the first is the reference of the speed-up.", (1, 2), positive=True
    )
    max_seq_length: int = setting("Tokens per instance.", 128, positive=True)
    max_predictions_per_seq: int = setting("Most masked tokens per instance.", 20, positive=True)
    dupe_factor: int = setting(
        "Passes over each chunk (Google's default is 10). Instances, output and the time spent making and writing "
        "them grow linearly with it, while the text is read and tokenized once, so one pass is the quickest figure "
        "of both parts.",
        1,
        positive=True,
    )
    num_shards: int = setting("Output shards (per length bin).", 16, positive=True)
    chunk_megabytes: float = setting(
        "Text per chunk: what each worker holds at a time, and so its memory.", 8.0, positive=True
    )
    length_bins: tuple[int, ...] | None = setting(
        "Bin edges ending at --max_seq_length, e.g. 32,64,128: instances are padded only to their bin's edge (the "
        "padding saved is reported).",
        None,
        positive=True,
    )
    length_bins_at: int | None = setting(
        "Also one run at max_seq_length SEQ (phase 2: 512) with length bins at its quarters (128,256,384,512) and "
        "15.6%% of SEQ predictions (80), with the most --workers: the padding bins save on long sequences. Off by "
        "default: it takes about as long again as the other runs together.",
        None,
        positive=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.corpus is not None and self.megabytes is not None:
            raise UsageError("--corpus and --megabytes: give one (your corpus, or the size of a synthetic one)")
        if self.corpus is not None and self.vocab_file is None:
            raise UsageError("--corpus needs --vocab_file (the vocab of the model to pre-train)")

    @property
    def synthetic_megabytes(self) -> float:
        return self.megabytes or SYNTHETIC_MEGABYTES


SETTINGS = PretrainingDataSettings


def corpus_files(paths: Sequence[str]) -> list[str]:
    """--corpus as create_pretraining_data's --input_file: each an existing file, escaped against its globbing."""
    for path in paths:
        if not os.path.isfile(path):
            raise workload.BenchError(f"--corpus {path}: no such file")
    return [glob.escape(path) for path in paths]


def check_vocab(path: str) -> None:
    try:
        load_vocab(path)
    except VocabError as error:
        raise workload.BenchError(f"--vocab_file {error}") from None


def run_once(
    files: Sequence[str],
    vocab_file: str,
    work: str,
    workers: int,
    seq: int,
    predictions: int,
    bins: Sequence[int] | None,
    settings: PretrainingDataSettings,
) -> dict:
    """One create_pretraining_data process: its statistics as a dict of figures (`row` makes them a Row). The
    shards are removed after their size is taken (they are as large as the text: several runs would fill a
    disk)."""
    shards = os.path.join(work, f"shards-seq{seq}-workers{workers}")
    command = [
        sys.executable,
        "-m",
        "bertbench.tasks.create_pretraining_data",
        f"--input_file={','.join(files)}",
        f"--vocab_file={vocab_file}",
        f"--output_dir={shards}",
        f"--num_shards={settings.num_shards}",
        f"--max_seq_length={seq}",
        f"--max_predictions_per_seq={predictions}",
        f"--dupe_factor={settings.dupe_factor}",
        f"--num_workers={workers}",
        f"--chunk_megabytes={settings.chunk_megabytes}",
    ]
    if bins:
        command.append(f"--length_bins={','.join(map(str, bins))}")
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise BenchRunFailed(
            f"create_pretraining_data with {workers} worker(s) failed (exit {done.returncode}): {last}"
        )
    stats = read_json(os.path.join(shards, STATS_FILE))
    output_bytes = sum(
        os.path.getsize(os.path.join(directory, name))
        for directory, _, names in os.walk(shards)
        for name in names
        if name != STATS_FILE
    )
    shutil.rmtree(shards)
    row = {
        "workers": workers,
        "max_seq_length": seq,
        "max_predictions_per_seq": predictions,
        "length_bins": list(bins) if bins else None,
        "bins": ",".join(map(str, bins)) if bins else None,
        "dupe_factor": settings.dupe_factor,
        "input_mb": stats["input_bytes"] / 1e6,
        "chunks": stats["chunks"],
        "documents": stats["documents"],
        "sentences": stats["sentences"],
        "instances": stats["instances"],
        "tokens": stats["tokens"],
        "seconds": stats["seconds"],
        "wall_seconds": wall,
        "sentences_per_s": stats["sentences_per_second"],
        "mb_per_s": stats["megabytes_per_second"],
        "instances_per_s": stats["instances"] / stats["seconds"],
        "peak_rss_main_mib": stats["peak_rss_bytes"] / 2**20,
        "peak_rss_worker_mib": stats["peak_worker_rss_bytes"] / 2**20,
        "output_mb": output_bytes / 1e6,
        "padding_fraction": stats["padding_fraction"],
        "padding_fraction_with_bins": stats.get("padding_fraction_with_bins"),
        "padding_saved_fraction": stats.get("padding_saved_fraction"),
    }
    print(
        f"  {workers} worker(s), seq {seq}{' bins ' + row['bins'] if bins else ''}: {row['mb_per_s']:.2f} MB/s, "
        f"{row['sentences_per_s']:,.0f} sentences/s, peak RSS {row['peak_rss_main_mib']:,.0f} MiB main, "
        f"{row['peak_rss_worker_mib']:,.0f} MiB worker ({wall:.1f} s with start-up)",
        flush=True,
    )
    return row


SETTING_KEYS = ("workers", "max_seq_length", "max_predictions_per_seq", "bins")


def row(figures: dict, reference: Spread | None) -> Row:
    """A run's figures as a Row: its MB/s (one run: no spread) for its setting, the rest as columns, and its speed-up
    over `reference` (the first worker count's MB/s) for a run of the same settings but the workers."""
    value = Spread.exact(figures["mb_per_s"])
    columns = {key: item for key, item in figures.items() if key not in (*SETTING_KEYS, "mb_per_s")}
    if reference is not None:
        columns["speedup"] = Ratio.of(value, reference)
    return Row("mb_per_s", "MB/s", {key: figures[key] for key in SETTING_KEYS}, value, columns)


def run_all(settings: PretrainingDataSettings, work: str) -> tuple[dict, list[Row]]:
    """The corpus, then a run per worker count (and the --length_bins_at run, last): (corpus, rows)."""
    if settings.corpus:
        corpus = {
            "source": "files",
            "files": list(settings.corpus),
            "bytes": sum(map(os.path.getsize, settings.corpus)),
            "vocab_file": settings.vocab_file,
        }
        files = corpus_files(settings.corpus)
    else:
        corpus = make_synthetic_corpus(work, settings.synthetic_megabytes, settings.seed, settings.vocab_file)
        files = corpus["files"]
        print(f"  synthetic corpus: {corpus['bytes'] / 1e6:,.1f} MB in {corpus['generate_seconds']:.1f} s", flush=True)
    runs = [
        run_once(
            files,
            corpus["vocab_file"],
            work,
            workers,
            settings.max_seq_length,
            settings.max_predictions_per_seq,
            settings.length_bins,
            settings,
        )
        for workers in settings.workers
    ]
    first = Spread.exact(runs[0]["mb_per_s"])
    rows = [row(figures, first) for figures in runs]
    if settings.length_bins_at:
        seq = settings.length_bins_at
        figures = run_once(
            files,
            corpus["vocab_file"],
            work,
            max(settings.workers),
            seq,
            synthetic.masked_positions(seq),
            [seq * quarter // 4 for quarter in range(1, 5)],
            settings,
        )
        rows.append(row(figures, None))
    return corpus, rows


COLUMNS = [
    Column("workers", "workers", "d"),
    Column("seq", "max_seq_length", "d"),
    Column("length bins", "bins"),
    Column("input MB", "input_mb", ",.1f"),
    Column("documents", "documents", ",d"),
    Column("sentences", "sentences", ",d"),
    Column("instances", "instances", ",d"),
    Column("seconds", "seconds", ",.1f"),
    Column("sentences/s", "sentences_per_s", ",.0f"),
    Column("MB/s", "mb_per_s", ",.2f"),
    Column("instances/s", "instances_per_s", ",.0f"),
    Column("speed-up", "speedup", ".2f"),
    Column("peak RSS main (MiB)", "peak_rss_main_mib", ",.0f"),
    Column("peak RSS worker (MiB)", "peak_rss_worker_mib", ",.0f"),
    Column("output MB", "output_mb", ",.1f"),
    Column("padding", "padding_fraction", ".1%"),
    Column("padding in bins", "padding_fraction_with_bins", ".1%"),
    Column("padding saved", "padding_saved_fraction", ".1%"),
]


def markdown(settings: PretrainingDataSettings, corpus: dict, rows: Sequence[Row]) -> str:
    size = f"{corpus['bytes'] / 1e6:,.1f} MB"
    source = (
        f"synthetic corpus of {size} (seed {corpus['seed']})"
        if corpus["source"] == "synthetic"
        else f"{len(corpus['files'])} file(s), {size}"
    )
    lines = [
        f"# Pre-training data creation: {source}, dupe factor {settings.dupe_factor}, {settings.num_shards} shards, "
        f"{settings.chunk_megabytes:g} MB chunks",
        "",
        table(rows, COLUMNS),
        "",
        "seconds: create_pretraining_data's own (reading, tokenizing, making instances, writing), without the "
        "interpreter's start-up. Peak RSS: the main process (reading, writing, compressing) and the largest "
        "worker (tokenizing, making instances), each its own peak. Padding: the share of padding tokens in "
        "the shards; with length bins, what is left of it in the bins and the share of it they save. Each "
        "worker count runs once: these figures have no spread (a run on a busy machine is flagged).",
    ]
    if settings.length_bins_at:
        lines += [
            "",
            f"The last row is the --length_bins_at {settings.length_bins_at} run; its speed-up is not given "
            "(other settings).",
        ]
    return "\n".join(lines)


def plots(rows: Sequence[Row]) -> dict:
    """Throughput and peak memory over the worker counts (the --length_bins_at run left out: other settings)."""
    rows = [row for row in rows if "speedup" in row.columns]
    workers = [row.get("workers") for row in rows]
    linear = [rows[0].median() * count / workers[0] for count in workers]
    return {
        "throughput": line_plot(
            {"measured": (workers, [row.median() for row in rows])},
            "workers",
            "MB of text / s",
            "create_pretraining_data throughput",
            log_x=True,
            reference=(workers, linear, "linear"),
        ),
        "memory": line_plot(
            {
                "main process": (workers, [row.get("peak_rss_main_mib") for row in rows]),
                "largest worker": (workers, [row.get("peak_rss_worker_mib") for row in rows]),
            },
            "workers",
            "peak RSS (MiB)",
            "create_pretraining_data peak memory",
            log_x=True,
        ),
    }


def moved(source: str, destination: str) -> str:
    move_files([(source, destination)])
    return destination


def run(settings: PretrainingDataSettings, argv: Sequence[str]) -> None:
    if settings.corpus:
        corpus_files(settings.corpus)
    if settings.vocab_file is not None:
        check_vocab(settings.vocab_file)
    keep_corpus = settings.keep_corpus and not settings.corpus
    keep_vocab = settings.keep_corpus and not settings.vocab_file
    directory = settings.directory
    output = BenchOutput(
        directory,
        BENCH,
        argv,
        settings.overwrite,
        other_files=[KEPT_CORPUS] * keep_corpus + [KEPT_VOCAB] * keep_vocab,
    )
    created = not os.path.isdir(directory)
    os.makedirs(directory, exist_ok=True)
    # In the output directory, not /tmp: that may be memory (tmpfs), which the shards would then fill and count.
    work = tempfile.mkdtemp(prefix=f".{BENCH}-work-", dir=directory)
    try:
        load = LoadWatch()
        corpus, rows = run_all(settings, work)
        output.warn(load.busy("the runs"))
        text = markdown(settings, corpus, rows)
        if keep_corpus:
            corpus["files"] = [moved(corpus["files"][0], os.path.join(directory, KEPT_CORPUS))]
        if keep_vocab:
            corpus["vocab_file"] = moved(corpus["vocab_file"], os.path.join(directory, KEPT_VOCAB))
        output.write_result(settings, rows, {"corpus": corpus}, text, plots(rows))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if created and not os.listdir(directory):
            os.rmdir(directory)
    print(text)
    print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")


main = settings.main_for(PretrainingDataSettings, description(__doc__), run)
