"""`bertbench bench squad-data`: the speed of run_squad's data path, feature creation and answer post-processing.

run_squad's own code, timed on files of SQuAD v1.1's size: windows/s of the training set (start and end positions)
and of the dev set (offsets, max-context flags), and questions/s of the post-processing (n-best answers from start
and end logits, here random ones) of the dev set, each repeated --repeats times (median, min and max). The files are
yours (--train_file, --predict_file, --vocab_file), or by default a corpus assembled here from real English: the
docstrings of the installed Python packages, in paragraphs of ~120 words (as SQuAD's), 87,599 training questions
over 18,896 paragraphs and 10,570 dev questions over 2,067, with a 30,522-piece WordPiece vocab trained on it (so
words split into pieces as real text does). A question is a sentence of its paragraph with the answer (1-5 words)
taken out.

    bertbench bench squad-data                        # the assembled corpus, seq 384, doc_stride 128 (a few minutes)
    bertbench bench squad-data --train_file train-v1.1.json --predict_file dev-v1.1.json --vocab_file vocab.txt
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import random
import re
import sysconfig
import tempfile
import time
from collections.abc import Sequence

import numpy as np

from bertbench.bench import settings
from bertbench.bench.errors import BenchError
from bertbench.bench.output import BenchOutput
from bertbench.bench.results import Column, Row, Spread, noisy_rows, table
from bertbench.common.errors import UsageError
from bertbench.common.flags import description, setting
from bertbench.common.noise import LoadWatch
from bertbench.tasks.squad.answers import GoogleAnswerText, postprocess
from bertbench.tasks.squad.features import convert_examples
from bertbench.tasks.squad.reading import SquadDataError, read_examples
from bertbench.tasks.tokenization import BertTokenizer, VocabError

SQUAD_SIZES = {"train": (18_896, 87_599), "dev": (2_067, 10_570)}  # paragraphs, questions of SQuAD v1.1
USER_FILES = ("train_file", "predict_file", "vocab_file")
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # in the order of BERT's vocab.txt


@dataclasses.dataclass(frozen=True)
class SquadDataSettings(settings.BenchSettings):
    """Data (default: a SQuAD v1.1-sized corpus assembled from docstrings) and windows (run_squad's flags)."""

    bench = "squad-data"

    train_file: str | None = setting("A SQuAD training file (train-v1.1.json).", None)
    predict_file: str | None = setting("A SQuAD dev file (dev-v1.1.json).", None)
    vocab_file: str | None = setting("The vocab.txt to tokenize them with.", None)
    version_2_with_negative: bool = setting("The files are SQuAD v2.0.", False)
    scale: float = setting(
        "Size of the assembled corpus relative to SQuAD v1.1's (0.1 for a quick look).", 1.0, positive=True
    )
    max_seq_length: int = setting("Tokens per window.", 384, positive=True)
    doc_stride: int = setting("Tokens between window starts.", 128, positive=True)
    max_query_length: int = setting("Question tokens kept.", 64, positive=True)
    repeats: int = setting("Timed repeats of each figure.", 3, positive=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        given = [name for name in USER_FILES if getattr(self, name)]
        if given and len(given) != len(USER_FILES):
            missing = [name for name in USER_FILES if name not in given]
            raise UsageError(f"--{' --'.join(given)} given without --{' --'.join(missing)}: give all three")
        if self.max_seq_length <= self.max_query_length + 3:
            raise UsageError(
                f"--max_seq_length {self.max_seq_length} leaves no room for context after "
                f"--max_query_length {self.max_query_length}"
            )


SETTINGS = SquadDataSettings


def check_files(settings: SquadDataSettings) -> None:
    """The files given exist: checked before anything is written."""
    for name in USER_FILES:
        path = getattr(settings, name)
        if path and not os.path.isfile(path):
            raise BenchError(f"--{name} {path}: no such file")


# ---- a SQuAD-sized corpus of real English -------------------------------------------------------------------------


def docstring_sentences(limit_words: int) -> list[str]:
    """Sentences of prose from the docstrings of the standard library and installed packages."""
    sentences, words = [], 0
    for root in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]):
        for directory, _, files in sorted(os.walk(root)):
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                try:
                    with open(os.path.join(directory, name), encoding="utf-8") as handle:
                        tree = ast.parse(handle.read())
                except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
                    continue
                for node in ast.walk(tree):
                    if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                        continue
                    for sentence in re.split(r"(?<=[.!?])\s+", " ".join((ast.get_docstring(node) or "").split())):
                        count = len(sentence.split())
                        if 6 <= count <= 40 and sentence[0].isupper():
                            sentences.append(sentence)
                            words += count
                if words >= limit_words:
                    return sentences
    return sentences


def make_corpus(sentences: list[str], paragraphs: int, questions: int, seed: int) -> dict:
    """SQuAD JSON: paragraphs of ~120 words drawn from `sentences`, questions spread evenly over them."""
    rng = random.Random(seed)
    articles, made = [], 0
    for number in range(paragraphs):
        chosen, length = [], 0
        while length < 120:
            chosen.append(rng.choice(sentences))
            length += len(chosen[-1].split())
        context = " ".join(chosen)
        qas = []
        for index in range(questions * (number + 1) // paragraphs - made):
            sentence = rng.choice(chosen)
            words = sentence.split()
            size = rng.randint(1, min(5, len(words) - 2))
            first = rng.randrange(0, len(words) - size)
            answer = " ".join(words[first : first + size])
            start = context.index(sentence) + len(" ".join(words[:first])) + (1 if first else 0)
            question = " ".join(words[:first] + ["what"] + words[first + size :]).rstrip(".!?") + "?"
            qas.append(
                {
                    "id": f"{seed}-{number}-{index}",
                    "question": question,
                    "answers": [{"text": answer, "answer_start": start}],
                }
            )
        made += len(qas)
        articles.append({"title": f"docstrings {number}", "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": "1.1", "data": articles}


def train_vocab(sentences: list[str], path: str, size: int = 30_522) -> None:
    """A BERT-style uncased WordPiece vocab.txt (ids in line order, [PAD] 0 as in BERT's) trained on the
    sentences."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=size, special_tokens=BERT_SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(sentences, trainer)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{token}\n" for token, _ in vocab))


def assemble_corpus(root: str, scale: float) -> dict:
    """train-v1.1.json, dev-v1.1.json and vocab.txt under `root`; what they were made of."""
    started = time.perf_counter()
    sentences = docstring_sentences(limit_words=int(1_500_000 * min(1.0, scale)))
    if len(sentences) < 100:
        raise BenchError(
            "too few docstrings in this Python installation to assemble a corpus: give --train_file, "
            "--predict_file and --vocab_file"
        )
    for split, (paragraphs, questions) in SQUAD_SIZES.items():
        with open(os.path.join(root, f"{split}-v1.1.json"), "w", encoding="utf-8") as handle:
            json.dump(
                make_corpus(
                    sentences, max(1, round(paragraphs * scale)), max(1, round(questions * scale)), seed=len(split)
                ),
                handle,
            )
    train_vocab(sentences, os.path.join(root, "vocab.txt"))
    return {
        "sentences": len(sentences),
        "words": sum(len(sentence.split()) for sentence in sentences),
        "seconds": time.perf_counter() - started,
    }


# ---- the figures --------------------------------------------------------------------------------------------------


def timed(call, repeats: int) -> tuple[object, list[float]]:
    seconds, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = call()
        seconds.append(time.perf_counter() - started)
    return result, seconds


def speed_row(
    settings: SquadDataSettings, step: str, count: int, unit: str, seconds: Sequence[float], **columns
) -> Row:
    """A timed step's row: its rate (`unit` per second, the median of the repeats' with their spread), the `count`
    it made of them and the seconds of each repeat."""
    setting = {
        "set": step,
        "max_seq_length": settings.max_seq_length,
        "doc_stride": settings.doc_stride,
        "max_query_length": settings.max_query_length,
    }
    values = {"count": count, "items": unit, "seconds": Spread.of(seconds), **columns}
    return Row("per_s", f"{unit}/s", setting, Spread.of_rate(count, seconds), values)


def measure_speed(settings: SquadDataSettings, files: dict[str, str], tokenizer: BertTokenizer) -> list[Row]:
    rows = []
    for split, training in (("train", True), ("dev", False)):
        examples = read_examples(files[split], training=training, version_2=settings.version_2_with_negative)
        features, seconds = timed(
            lambda: convert_examples(
                examples,
                tokenizer,
                settings.max_seq_length,
                settings.doc_stride,
                settings.max_query_length,
                training,
            ),
            settings.repeats,
        )
        rows.append(
            speed_row(settings, f"{split} features", len(features), "windows", seconds, questions=len(examples))
        )
        print(
            f"  {split} set: {len(examples):,} questions, {len(features):,} windows, "
            f"{rows[-1].median():,.0f} windows/s",
            flush=True,
        )
        if not training:
            generator = np.random.default_rng(0)
            starts, ends = (
                generator.standard_normal((len(features), settings.max_seq_length)).astype(np.float32) for _ in range(2)
            )
            # run_squad's default answer text, Google's: the figure is the speed users get.
            _, seconds = timed(
                lambda: postprocess(
                    examples,
                    features,
                    starts,
                    ends,
                    n_best_size=20,
                    max_answer_length=30,
                    version_2=settings.version_2_with_negative,
                    answer_text=GoogleAnswerText(tokenizer),
                ),
                settings.repeats,
            )
            rows.append(
                speed_row(
                    settings,
                    "dev answers from logits (n-best 20)",
                    len(examples),
                    "questions",
                    seconds,
                    windows=len(features),
                )
            )
            print(f"  post-processing: {rows[-1].median():,.0f} questions/s", flush=True)
    return rows


COLUMNS = [
    Column("step", "set"),
    Column("items", "count", ",d"),
    Column("of", "items"),
    Column("seconds: median (min–max, CV)", "seconds", ".2f"),
    Column("per second", "per_s", lambda row: f"{row.median():,.0f}"),
]


def markdown(settings: SquadDataSettings, rows: Sequence[Row]) -> str:
    return "\n".join(
        [
            f"# SQuAD data path: seq {settings.max_seq_length}, doc_stride {settings.doc_stride}, "
            f"max_query_length {settings.max_query_length}",
            "",
            f"Median of {settings.repeats} repeats, with min, max and CV (stdev / mean).",
            "",
            table(rows, COLUMNS),
        ]
    )


def run(settings: SquadDataSettings, argv: Sequence[str]) -> None:
    check_files(settings)
    output = BenchOutput(settings.directory, settings.bench, argv, settings.overwrite)
    with tempfile.TemporaryDirectory() as root:
        corpus = None
        if settings.train_file:
            files = {"train": settings.train_file, "dev": settings.predict_file, "vocab": settings.vocab_file}
        else:
            print("assembling a SQuAD v1.1-sized corpus from docstrings and training a WordPiece vocab ...", flush=True)
            corpus = assemble_corpus(root, settings.scale)
            files = {"train": f"{root}/train-v1.1.json", "dev": f"{root}/dev-v1.1.json", "vocab": f"{root}/vocab.txt"}
        try:
            tokenizer = BertTokenizer.from_vocab_file(files["vocab"])
            load = LoadWatch()
            rows = measure_speed(settings, files, tokenizer)
            output.warn(load.busy())
        except (SquadDataError, VocabError) as error:
            raise BenchError(str(error)) from None
    output.warn(noisy_rows(rows, "seconds", lambda row: row.get("set")))
    text = markdown(settings, rows)
    output.write_result(settings, rows, {"corpus": corpus} if corpus else {}, text)
    print(text)
    print(f"\nwrote {output.path('.json')} and {output.path('.md')}")


main = settings.main_for(SquadDataSettings, description(__doc__), run)
