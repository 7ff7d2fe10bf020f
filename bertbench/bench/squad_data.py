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

import argparse
import ast
import json
import os
import random
import re
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence

import numpy as np

from bertbench.bench import cli
from bertbench.bench.output import BenchOutput, markdown_table, spread_column
from bertbench.bench.workload import BenchError
from bertbench.common.noise import LoadWatch, noisy_warning, rate_spread, spread, spread_fields
from bertbench.tasks.squad.answers import GoogleAnswerText, postprocess
from bertbench.tasks.squad.features import convert_examples
from bertbench.tasks.squad.reading import SquadDataError, read_examples
from bertbench.tasks.tokenization import BertTokenizer, VocabError

SQUAD_SIZES = {"train": (18_896, 87_599), "dev": (2_067, 10_570)}  # paragraphs, questions of SQuAD v1.1
USER_FILES = ("train_file", "predict_file", "vocab_file")
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # in the order of BERT's vocab.txt


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser_for("squad-data", __doc__.splitlines()[0])
    files = parser.add_argument_group("data (default: a SQuAD v1.1-sized corpus assembled from docstrings)")
    files.add_argument("--train_file", default=None, help="A SQuAD training file (train-v1.1.json).")
    files.add_argument("--predict_file", default=None, help="A SQuAD dev file (dev-v1.1.json).")
    files.add_argument("--vocab_file", default=None, help="The vocab.txt to tokenize them with.")
    files.add_argument("--version_2_with_negative", action="store_true", help="The files are SQuAD v2.0.")
    files.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="Size of the assembled corpus relative to SQuAD v1.1's (0.1 for a quick look).",
    )
    window = parser.add_argument_group("windows (run_squad's flags)")
    window.add_argument("--max_seq_length", type=cli.positive_int, default=384, help="Tokens per window.")
    window.add_argument("--doc_stride", type=cli.positive_int, default=128, help="Tokens between window starts.")
    window.add_argument("--max_query_length", type=cli.positive_int, default=64, help="Question tokens kept.")
    window.add_argument("--repeats", type=cli.positive_int, default=3, help="Timed repeats of each figure.")
    return parser


def check_settings(args: argparse.Namespace) -> None:
    given = [name for name in USER_FILES if getattr(args, name)]
    if given and len(given) != len(USER_FILES):
        raise BenchError(
            f"--{' --'.join(given)} given without --"
            + " --".join(name for name in USER_FILES if name not in given)
            + ": give all three"
        )
    for name in given:
        if not os.path.isfile(getattr(args, name)):
            raise BenchError(f"--{name} {getattr(args, name)}: no such file")
    if not args.scale > 0:
        raise BenchError(f"--scale must be positive, got {args.scale}")
    if args.max_seq_length <= args.max_query_length + 3:
        raise BenchError(
            f"--max_seq_length {args.max_seq_length} leaves no room for context after "
            f"--max_query_length {args.max_query_length}"
        )


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


def speed_row(name: str, count: int, unit: str, seconds: list[float], **extra) -> dict:
    return {
        "set": name,
        "count": count,
        "unit": unit,
        **spread_fields("seconds", spread(seconds)),
        **spread_fields("per_s", rate_spread(count, seconds)),
        **extra,
    }


def measure_speed(args: argparse.Namespace, files: dict[str, str], tokenizer: BertTokenizer) -> list[dict]:
    rows = []
    for split, training in (("train", True), ("dev", False)):
        examples = read_examples(files[split], training=training, version_2=args.version_2_with_negative)
        features, seconds = timed(
            lambda: convert_examples(
                examples, tokenizer, args.max_seq_length, args.doc_stride, args.max_query_length, training
            ),
            args.repeats,
        )
        rows.append(speed_row(f"{split} features", len(features), "windows", seconds, questions=len(examples)))
        print(
            f"  {split} set: {len(examples):,} questions, {len(features):,} windows, "
            f"{rows[-1]['per_s']:,.0f} windows/s",
            flush=True,
        )
        if not training:
            generator = np.random.default_rng(0)
            starts, ends = (
                generator.standard_normal((len(features), args.max_seq_length)).astype(np.float32) for _ in range(2)
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
                    version_2=args.version_2_with_negative,
                    answer_text=GoogleAnswerText(tokenizer),
                ),
                args.repeats,
            )
            rows.append(
                speed_row(
                    "dev answers from logits (n-best 20)", len(examples), "questions", seconds, windows=len(features)
                )
            )
            print(f"  post-processing: {rows[-1]['per_s']:,.0f} questions/s", flush=True)
    return rows


COLUMNS = [
    ("step", "set", ""),
    ("items", "count", ",d"),
    ("of", "unit", ""),
    spread_column("seconds: median (min–max, CV)", "seconds", ".2f"),
    ("per second", "per_s", ",.0f"),
]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        check_settings(args)
        output = BenchOutput(cli.output_dir(args, "squad-data"), "squad-data", argv, args.overwrite)
        with tempfile.TemporaryDirectory() as root:
            corpus = None
            if args.train_file:
                files = {"train": args.train_file, "dev": args.predict_file, "vocab": args.vocab_file}
            else:
                print(
                    "assembling a SQuAD v1.1-sized corpus from docstrings and training a WordPiece vocab ...",
                    flush=True,
                )
                corpus = assemble_corpus(root, args.scale)
                files = {
                    "train": f"{root}/train-v1.1.json",
                    "dev": f"{root}/dev-v1.1.json",
                    "vocab": f"{root}/vocab.txt",
                }
            try:
                tokenizer = BertTokenizer.from_vocab_file(files["vocab"])
                load = LoadWatch()
                rows = measure_speed(args, files, tokenizer)
                output.warn(load.busy())
            except (SquadDataError, VocabError) as error:
                raise BenchError(str(error)) from None
        output.warn(noisy_warning(rows, "seconds", lambda row: row["set"]))
        text = "\n".join(
            [
                f"# SQuAD data path: seq {args.max_seq_length}, doc_stride {args.doc_stride}, "
                f"max_query_length {args.max_query_length}",
                "",
                f"Median of {args.repeats} repeats, with min, max and CV (stdev / mean).",
                "",
                markdown_table(rows, COLUMNS),
            ]
        )
        print(output.write(vars(args), {"corpus": corpus, "rows": rows}, text))
        print(f"\nwrote {output.path('.json')} and {output.path('.md')}")

    return cli.run("bertbench bench squad-data", body)
