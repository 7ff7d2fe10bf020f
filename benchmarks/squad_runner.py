"""Figures of the SQuAD runner on this machine (a benchmark that prints numbers, not a test).

1. Feature creation, in windows/s, by run_squad's own code on a corpus of SQuAD v1.1's size (87,599 training
   questions over 18,896 paragraphs; 10,570 dev questions over 2,067 paragraphs) at seq 384, doc_stride 128,
   max_query_length 64. The text is English assembled here from the docstrings of the installed Python packages
   (paragraphs of about 120 words, as SQuAD's), tokenized with a 30,522-piece WordPiece vocab trained on it, so
   words split into pieces as real text does. Questions are a sentence of the paragraph with the answer (1-5 words)
   taken out. Then the post-processing of the dev set (n-best answers from start/end logits), in questions/s.
2. Training throughput at seq 384, baseline vs each recompute policy, as timed train steps of the QA model on real
   windows, the variants interleaved (median of --repeats): BERT-Tiny (2 x 128) and BERT-base (12 x 768). BERT-Tiny
   also through run_squad itself, one variant after the other (steady sentences/s, as the original reported it).
3. Exact match and F1 on the built-in SQuAD v2.0 data, with the demo's QA settings, baseline and recompute.

    python benchmarks/squad_runner.py                # about 15 minutes on 2 cores
    python benchmarks/squad_runner.py --skip-base --output figures.json
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import random
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from bertbench.bench import measure
from bertbench.bench.output import machine, markdown_table, write_report
from bertbench.config import BertConfig
from bertbench.demo.run import DemoConfig, question_answering
from bertbench.models import build_model
from bertbench.tasks.squad import convert_examples, postprocess, read_examples
from bertbench.tokenization import SPECIAL_TOKENS, BertTokenizer

VARIANTS = (("baseline", "full"), ("recompute", "full"), ("recompute", "every-k"), ("recompute", "selective"))
SQUAD_SIZES = {"train": (18_896, 87_599), "dev": (2_067, 10_570)}  # paragraphs, questions of SQuAD v1.1


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny-questions", type=int, default=1024,
                        help="Training questions of each BERT-Tiny run (--max_train_samples).")
    parser.add_argument("--tiny-batch", type=int, default=32, help="train_batch_size of the BERT-Tiny runs.")
    parser.add_argument("--base-batch", type=int, default=4, help="Sequences per BERT-base train step.")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed BERT-base steps per variant.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed BERT-base steps per variant.")
    parser.add_argument("--skip-base", action="store_true", help="Skip the BERT-base timing.")
    parser.add_argument("--skip-builtin", action="store_true", help="Skip the EM/F1 runs on the built-in data.")
    parser.add_argument("--output", help="Also write the figures as JSON here.")
    return parser.parse_args(argv)


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
            answer = " ".join(words[first:first + size])
            start = context.index(sentence) + len(" ".join(words[:first])) + (1 if first else 0)
            question = " ".join(words[:first] + ["what"] + words[first + size:]).rstrip(".!?") + "?"
            qas.append({"id": f"{seed}-{number}-{index}", "question": question,
                        "answers": [{"text": answer, "answer_start": start}]})
        made += len(qas)
        articles.append({"title": f"docstrings {number}", "paragraphs": [{"context": context, "qas": qas}]})
    return {"version": "1.1", "data": articles}


def train_vocab(sentences: list[str], path: str, size: int = 30_522) -> None:
    """A BERT-style uncased WordPiece vocab.txt (ids in line order) trained on the sentences."""
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=size, special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    tokenizer.train_from_iterator(sentences, trainer)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("".join(f"{token}\n" for token, _ in vocab))


def build_corpus(root: str) -> dict:
    started = time.perf_counter()
    sentences = docstring_sentences(limit_words=1_500_000)
    for split, (paragraphs, questions) in SQUAD_SIZES.items():
        with open(os.path.join(root, f"{split}-v1.1.json"), "w", encoding="utf-8") as handle:
            json.dump(make_corpus(sentences, paragraphs, questions, seed=len(split)), handle)
    train_vocab(sentences, os.path.join(root, "vocab.txt"))
    return {"sentences": len(sentences), "words": sum(len(sentence.split()) for sentence in sentences),
            "seconds": time.perf_counter() - started}


# ---- 1. feature creation and post-processing ---------------------------------------------------------------------

def feature_speed(root: str, tokenizer: BertTokenizer) -> dict:
    figures = {}
    for split, training in (("train", True), ("dev", False)):
        examples = read_examples(os.path.join(root, f"{split}-v1.1.json"), training=training, version_2=False)
        started = time.perf_counter()
        features = convert_examples(examples, tokenizer, 384, 128, 64, training)
        seconds = time.perf_counter() - started
        figures[split] = {"questions": len(examples), "windows": len(features), "seconds": seconds,
                          "windows_per_s": len(features) / seconds, "questions_per_s": len(examples) / seconds}
        if not training:
            generator = np.random.default_rng(0)
            starts, ends = (generator.standard_normal((len(features), 384)).astype(np.float32) for _ in range(2))
            started = time.perf_counter()
            postprocess(examples, features, starts, ends, n_best_size=20, max_answer_length=30)
            seconds = time.perf_counter() - started
            figures["postprocess"] = {"questions": len(examples), "seconds": seconds,
                                      "questions_per_s": len(examples) / seconds}
    return figures


# ---- 2. training throughput at seq 384 ---------------------------------------------------------------------------

def bert_config(vocab_size: int, layers: int, hidden: int) -> BertConfig:
    """Google's shapes: heads of 64 dimensions, feed-forward 4 x hidden."""
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=max(1, hidden // 64), intermediate_size=4 * hidden)


def tiny_throughput(root: str, args, vocab_size: int) -> list[dict]:
    config_file = os.path.join(root, "tiny_config.json")
    with open(config_file, "w", encoding="utf-8") as handle:
        json.dump(dataclasses.asdict(bert_config(vocab_size, layers=2, hidden=128)), handle)
    rows = []
    for modeling, policy in VARIANTS:
        out = os.path.join(root, f"tiny_{modeling}_{policy}")
        command = [sys.executable, "-m", "bertbench.run_squad", "--do_train",
                   f"--train_file={os.path.join(root, 'train-v1.1.json')}",
                   f"--vocab_file={os.path.join(root, 'vocab.txt')}", f"--bert_config_file={config_file}",
                   "--max_seq_length=384", "--doc_stride=128", f"--train_batch_size={args.tiny_batch}",
                   f"--max_train_samples={args.tiny_questions}", "--num_train_epochs=1", "--learning_rate=1e-4",
                   "--save_checkpoints_secs=0", "--log_step_count_steps=1000000", "--device=cpu",
                   f"--modeling={modeling}", f"--recompute-policy={policy}", f"--output_dir={out}"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stdout + done.stderr)
        with open(os.path.join(out, "train_results.json"), encoding="utf-8") as handle:
            result = json.load(handle)
        name = modeling if modeling == "baseline" else f"recompute/{policy}"
        rows.append({"model": name, "steps": result["global_step"],
                     "steady_seq_per_s": result["steady_sentences_per_second"]})
        print(f"  BERT-Tiny {name}: {rows[-1]['steady_seq_per_s']:.1f} seq/s", flush=True)
    for row in rows:
        row["vs_baseline"] = row["steady_seq_per_s"] / rows[0]["steady_seq_per_s"]
    return rows


def interleaved_throughput(root: str, tokenizer: BertTokenizer, config: BertConfig, batch_size: int, warmup: int,
                           repeats: int) -> list[dict]:
    """Train steps of the QA model on real windows, the variants interleaved (the fairest ratio on a shared
    machine); median seconds per step."""
    examples = read_examples(os.path.join(root, "train-v1.1.json"), training=True, version_2=False)[:2 * batch_size]
    features = convert_examples(examples, tokenizer, 384, 128, 64, training=True)
    batch = {name: tensor[:batch_size] for name, tensor in features.inputs.items()}
    steps = {}
    for modeling, policy in VARIANTS:
        torch.manual_seed(0)
        model = build_model("question_answering", config, modeling, policy).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01, fused=True)
        steps[modeling if modeling == "baseline" else f"recompute/{policy}"] = measure.make_train_step(
            model, optimizer, batch)
    times = measure.time_steps(steps, warmup, repeats)
    rows = []
    for name, seconds in times.items():
        step = statistics.median(seconds)
        rows.append({"model": name, "step_s": step, "step_min_s": min(seconds), "step_max_s": max(seconds),
                     "seq_per_s": batch_size / step})
    for row in rows:
        row["vs_baseline"] = row["seq_per_s"] / rows[0]["seq_per_s"]
    return rows


# ---- 3. EM/F1 on the built-in data -------------------------------------------------------------------------------

def builtin_scores(root: str) -> list[dict]:
    rows = []
    for name, flags in (("baseline", []), ("recompute/full", ["--modeling=recompute"])):
        result = question_answering(DemoConfig(), os.path.join(root, name.replace("/", "_")), flags)
        rows.append({"model": name, **{key: result[key] for key in
                                       ("exact", "f1", "has_answer_exact", "no_answer_exact",
                                        "no_answer_everywhere_exact", "steps", "train_seq_per_s")}})
        print(f"  built-in SQuAD v2.0, {name}: EM {result['exact']:.1f} F1 {result['f1']:.1f}", flush=True)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    report = {"machine": machine()}
    with tempfile.TemporaryDirectory() as root:
        print("assembling a SQuAD v1.1-sized corpus from docstrings and training a WordPiece vocab ...", flush=True)
        report["corpus"] = build_corpus(root)
        tokenizer = BertTokenizer.from_vocab_file(os.path.join(root, "vocab.txt"))
        report["features"] = figures = feature_speed(root, tokenizer)
        print("\n## Feature creation (seq 384, doc_stride 128, max_query_length 64)\n")
        print(markdown_table([{"set": split, **figures[split]} for split in ("train", "dev")],
                             [("set", "set", "s"), ("questions", "questions", ",d"), ("windows", "windows", ",d"),
                              ("seconds", "seconds", ".2f"), ("windows/s", "windows_per_s", ",.0f"),
                              ("questions/s", "questions_per_s", ",.0f")]))
        post = figures["postprocess"]
        print(f"\npost-processing {post['questions']:,} dev questions (n-best 20): {post['seconds']:.2f} s, "
              f"{post['questions_per_s']:,.0f} questions/s")

        print("\n## Training at seq 384, fp32, AdamW\n", flush=True)
        report["tiny_run_squad"] = tiny_throughput(root, args, tokenizer.vocab_size)
        print(f"\nBERT-Tiny (2 x 128), batch {args.tiny_batch}, {args.tiny_questions} questions, run_squad:\n")
        print(markdown_table(report["tiny_run_squad"], [("model", "model", "s"), ("steps", "steps", "d"),
                                                        ("steady seq/s", "steady_seq_per_s", ".1f"),
                                                        ("vs baseline", "vs_baseline", ".2f")]))
        shapes = {"tiny": (2, 128, args.tiny_batch, 2, 5)}
        if not args.skip_base:
            shapes["base"] = (12, 768, args.base_batch, args.warmup, args.repeats)
        for name, (layers, hidden, batch_size, warmup, repeats) in shapes.items():
            config = bert_config(tokenizer.vocab_size, layers, hidden)
            report[name] = rows = interleaved_throughput(root, tokenizer, config, batch_size, warmup, repeats)
            print(f"\n{layers} x {hidden}, batch {batch_size}, interleaved train steps, median of {repeats}:\n",
                  flush=True)
            print(markdown_table(rows, [("model", "model", "s"), ("step s", "step_s", ".2f"),
                                        ("min", "step_min_s", ".2f"), ("max", "step_max_s", ".2f"),
                                        ("seq/s", "seq_per_s", ".2f"), ("vs baseline", "vs_baseline", ".2f")]))
        if not args.skip_builtin:
            print("\n## Built-in SQuAD v2.0 data (the demo's QA step)\n", flush=True)
            report["builtin"] = builtin_scores(root)
            print(markdown_table(report["builtin"], [("model", "model", "s"), ("EM", "exact", ".1f"),
                                                     ("F1", "f1", ".1f"),
                                                     ("HasAns EM", "has_answer_exact", ".1f"),
                                                     ("NoAns EM", "no_answer_exact", ".1f"),
                                                     ("no-answer-only EM", "no_answer_everywhere_exact", ".1f"),
                                                     ("steps", "steps", "d"), ("seq/s", "train_seq_per_s", ".0f")]))
    write_report(args.output, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
