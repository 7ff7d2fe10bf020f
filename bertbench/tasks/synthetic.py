"""Deterministic synthetic tasks with their own tiny vocabulary: a sentence-pair task (written as GLUE files too), a
reading-comprehension task in SQuAD's format, and a pre-training corpus in Google's text format.

Pair task: sentence A is "the ADJ NOUN VERB the ADJ NOUN ." and sentence B "the ADJ NOUN VERB ."; every adjective
is either positive or negative, and the label says whether most of the three adjectives of the pair are positive.
Neither sentence decides the label alone (A may hold one of each), so the model must read the pair, as in GLUE's
pair tasks, yet a 2-layer BERT trained from scratch learns it within a hundred steps on a CPU.

SQuAD task: a paragraph of 2-5 sentences "the ADJ NOUN VERB the ADJ NOUN ." (no noun or adjective twice) and
questions that name one of its phrases, "where is the calm owl ?", answered by that phrase's span ("calm owl"). In
v2.0 a third of the questions pair an adjective of the paragraph with an animal it does not mention, and have no
answer. The model has to match the question's words to the paragraph's (one attention hop), which a 2-layer BERT
of hidden size 128 learns from scratch in a few hundred steps.

Random batches: random ids with a step kind's labels, full-length or of given lengths, for timing a step whose cost
does not depend on the values (the named model shapes the benches time are model/sizes.py's).
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bertbench.model.config import IGNORE_INDEX, BertConfig

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIVE = ["happy", "brave", "quick", "kind", "bright", "calm"]
NEGATIVE = ["sad", "lazy", "angry", "dull", "grim", "rude"]
NOUNS = ["cat", "dog", "bird", "fox", "horse", "mouse", "lion", "owl", "frog", "bear", "wolf", "deer"]
VERBS = ["sees", "likes", "follows", "chases", "meets", "helps", "watches", "finds"]
LABELS = ["mostly_negative", "mostly_positive"]
QUESTION_WORDS = ["where", "is", "?"]


@dataclass(frozen=True)
class PairExample:
    text_a: str
    text_b: str
    label: int  # index into LABELS


def make_examples(count: int, seed: int) -> list[PairExample]:
    """`count` examples; the same seed always gives the same list."""
    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        text_a, text_b, positives = _random_pair(rng)
        examples.append(PairExample(text_a, text_b, int(positives >= 2)))
    return examples


def _random_pair(rng: random.Random) -> tuple[str, str, int]:
    """Sentence A, sentence B and how many of their three adjectives are positive."""
    moods = [rng.randrange(2) for _ in range(3)]
    first, second, third = (rng.choice(POSITIVE if mood else NEGATIVE) for mood in moods)
    text_a = f"the {first} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {second} {rng.choice(NOUNS)} ."
    text_b = f"the {third} {rng.choice(NOUNS)} {rng.choice(VERBS)} ."
    return text_a, text_b, sum(moods)


def make_corpus(documents: int, seed: int) -> list[list[str]]:
    """A pre-training corpus: documents of 4-12 sentences "the ADJ NOUN VERB the ADJ NOUN ." that all tell of one
    animal (the subject of every sentence). A masked subject can be read off the document's other sentences, and a
    random next sentence (another document's) usually tells of another animal, so the text holds what both tasks
    need."""
    rng = random.Random(f"corpus-{seed}")
    corpus = []
    for _ in range(documents):
        subject = rng.choice(NOUNS)
        corpus.append(
            [
                f"the {rng.choice(POSITIVE + NEGATIVE)} {subject} {rng.choice(VERBS)} the "
                f"{rng.choice(POSITIVE + NEGATIVE)} {rng.choice([noun for noun in NOUNS if noun != subject])} ."
                for _ in range(rng.randint(4, 12))
            ]
        )
    return corpus


def write_corpus(path: str | os.PathLike, documents: int = 600, seed: int = 0) -> str:
    """The corpus in Google's pre-training text format: one sentence per line, a blank line between documents."""
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n\n".join("\n".join(document) for document in make_corpus(documents, seed)) + "\n")
    return os.fspath(path)


def vocabulary() -> list[str]:
    return SPECIAL_TOKENS + ["the", "."] + POSITIVE + NEGATIVE + NOUNS + VERBS + QUESTION_WORDS


def write_vocab(directory: str | os.PathLike) -> str:
    """Write the task's vocab.txt (one token per line, line number = id) and return its path."""
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(vocabulary()) + "\n")
    return path


# GLUE tasks the built-in pairs can stand in for, with their label of a pair holding `positives` (0-3) positive
# adjectives. Header lines are those of the GLUE v1 release.
_GLUE_LABEL = {
    "MRPC": lambda positives: str(int(positives >= 2)),
    "SST-2": lambda positives: str(int(positives >= 2)),
    "CoLA": lambda positives: str(int(positives >= 2)),
    "STS-B": lambda positives: f"{5 * positives / 3:.3f}",
    "MNLI": lambda positives: ("contradiction", "neutral", "neutral", "entailment")[positives],
}
GLUE_STAND_INS = tuple(_GLUE_LABEL)
_MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
    "sentence2_parse\tsentence1\tsentence2"
)
_STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"


def _glue_row(task: str, index: int, text_a: str, text_b: str, label: str | None) -> str:
    """One line of `task`'s train/dev file (label given) or test file (label None), in the release's columns."""
    if task == "MRPC":
        return "\t".join(
            [label if label is not None else str(index), str(2 * index), str(2 * index + 1), text_a, text_b]
        )
    if task in ("SST-2", "CoLA"):
        sentence = f"{text_a} {text_b}"
        if label is None:
            return f"{index}\t{sentence}"
        return f"{sentence}\t{label}" if task == "SST-2" else f"demo\t{label}\t\t{sentence}"
    if task == "STS-B":
        row = [str(index), "demo", "demo", "2024", str(index), "none", "none", text_a, text_b]
        return "\t".join(row + ([label] if label is not None else []))
    row = [str(index), str(index), f"{index}x", "demo", "( a )", "( b )", "(ROOT a)", "(ROOT b)", text_a, text_b]
    return "\t".join(row + ([label, label] if label is not None else []))


def _glue_header(task: str, split: str) -> str | None:
    labelled = split != "test"
    if task == "MRPC":
        return ("Quality" if labelled else "index") + "\t#1 ID\t#2 ID\t#1 String\t#2 String"
    if task == "SST-2":
        return "sentence\tlabel" if labelled else "index\tsentence"
    if task == "CoLA":
        return None if labelled else "index\tsentence"  # CoLA's train and dev files have no header
    if task == "STS-B":
        return _STSB_HEADER + ("\tscore" if labelled else "")
    return _MNLI_HEADER + ("\tlabel1\tgold_label" if labelled else "")


def write_glue_task(
    directory: str | os.PathLike,
    task: str = "MRPC",
    train: int = 3668,
    dev: int = 408,
    test: int = 1725,
    seed: int = 0,
    lengths: Sequence[int] | None = None,
) -> str:
    """Write the built-in task as GLUE `task`'s files (the release's file names, headers and columns) under
    directory/<task>/ and return that path; with the defaults it has MRPC's size. MNLI gets both dev and test sets,
    matched and mismatched. `lengths`: the pairs' token counts ([CLS] and two [SEP] counted), cycled over every
    split's pairs, each pair made that long with words that change no label (nouns and verbs, half in each
    sentence); a length below the built-in pair's 16 tokens leaves the pair as it is."""
    if task not in _GLUE_LABEL:
        raise ValueError(f"the built-in data can stand in for {', '.join(GLUE_STAND_INS)}, not {task!r}")
    task_dir = os.path.join(directory, task)
    os.makedirs(task_dir, exist_ok=True)
    suffixes = ("_matched", "_mismatched") if task == "MNLI" else ("",)
    splits = [("train", train, True)] + [(f"dev{suffix}", dev, True) for suffix in suffixes]
    splits += [(f"test{suffix}", test, False) for suffix in suffixes]
    for number, (split, count, labelled) in enumerate(splits):
        lines = [] if _glue_header(task, split) is None else [_glue_header(task, split)]
        rng, filler_rng = random.Random(f"{seed}-{number}"), random.Random(f"{seed}-{number}-filler")
        for index in range(count):
            text_a, text_b, positives = _random_pair(rng)
            if lengths:
                text_a, text_b = _lengthened(text_a, text_b, lengths[(index + number) % len(lengths)], filler_rng)
            label = _GLUE_LABEL[task](positives) if labelled else None
            lines.append(_glue_row(task, index, text_a, text_b, label))
        with open(os.path.join(task_dir, f"{split}.tsv"), "w", encoding="utf-8", newline="\n") as handle:
            handle.write("\n".join(lines) + "\n")
    return task_dir


def _lengthened(text_a: str, text_b: str, length: int, rng: random.Random) -> tuple[str, str]:
    """The pair with words appended (nouns and verbs: no adjective, so the label holds) up to `length` tokens, [CLS]
    and two [SEP] counted; every word of the built-in vocabulary is one token."""
    missing = length - 3 - len(text_a.split()) - len(text_b.split())
    if missing <= 0:
        return text_a, text_b
    words = [rng.choice(NOUNS + VERBS) for _ in range(missing)]
    half = (missing + 1) // 2
    return " ".join([text_a, *words[:half]]), " ".join([text_b, *words[half:]])


def make_squad(
    paragraphs: int, seed: int, version_2: bool = True, questions_per_paragraph: int = 3, training: bool = True
) -> dict:
    """A SQuAD-format dataset (the JSON object of train-v1.1.json / dev-v2.0.json). Training questions carry one
    answer, as SQuAD's train files do; dev questions two (with and without the article), as its dev files carry
    several annotators' answers. Sentences are joined by one or two spaces or a newline, so answers sit at
    uneven character offsets."""
    rng = random.Random(f"squad-{seed}")
    articles = []
    for number in range(paragraphs):
        sentences = rng.randint(2, 5)  # 4-10 animals: every noun and adjective of a paragraph is distinct
        nouns = rng.sample(NOUNS, 2 * sentences)
        adjectives = rng.sample(POSITIVE + NEGATIVE, 2 * sentences)
        context, phrases = "", {}  # noun -> (character offset, "ADJ NOUN")
        for index in range(sentences):
            if context:
                context += rng.choice([" ", " ", "  ", "\n"])
            subject, object_ = (f"{adjectives[2 * index + k]} {nouns[2 * index + k]}" for k in (0, 1))
            context += "the "
            phrases[nouns[2 * index]] = len(context), subject
            context += f"{subject} {rng.choice(VERBS)} the "
            phrases[nouns[2 * index + 1]] = len(context), object_
            context += f"{object_} ."
        questions = []
        for index in range(questions_per_paragraph):
            start, phrase = phrases[rng.choice(sorted(phrases))]
            qa = {"id": f"demo-{seed}-{number}-{index}", "question": f"where is the {phrase} ?", "answers": []}
            if version_2 and rng.random() < 1 / 3:  # an adjective of the paragraph with an animal not in it
                absent = rng.choice([noun for noun in NOUNS if noun not in phrases])
                qa["question"] = f"where is the {phrase.split()[0]} {absent} ?"
            else:
                qa["answers"].append({"text": phrase, "answer_start": start})
                if not training:  # a second annotator who took the article too
                    qa["answers"].append({"text": f"the {phrase}", "answer_start": start - 4})
            if version_2:
                qa["is_impossible"] = not qa["answers"]
            questions.append(qa)
        articles.append({"title": f"demo {number}", "paragraphs": [{"context": context, "qas": questions}]})
    return {"version": "v2.0" if version_2 else "1.1", "data": articles}


def write_squad(
    directory: str | os.PathLike, version: str = "2.0", train: int = 600, dev: int = 100, seed: int = 0
) -> tuple[str, str]:
    """Write train-v<version>.json and dev-v<version>.json (`train` and `dev` paragraphs of three questions) into
    directory, as in a SQuAD download, and return their paths."""
    if version not in ("1.1", "2.0"):
        raise ValueError(f"SQuAD versions are 1.1 and 2.0, not {version!r}")
    os.makedirs(directory, exist_ok=True)
    paths = []
    for split, paragraphs, number in (("train", train, 0), ("dev", dev, 1)):
        dataset = make_squad(paragraphs, seed=2 * seed + number, version_2=version == "2.0", training=split == "train")
        path = os.path.join(directory, f"{split}-v{version}.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(dataset, handle, indent=1)
        paths.append(path)
    return paths[0], paths[1]


# Masked positions per sequence, as NVIDIA's phase 1 (seq 128: 20) and phase 2 (seq 512: 80) data has them.
MASKED_SHARE = 0.15625


def masked_positions(seq: int) -> int:
    return max(1, round(seq * MASKED_SHARE))


def synthetic_batch(
    config: BertConfig,
    kind: str,
    batch: int,
    seq: int,
    device: torch.device | str = "cpu",
    seed: int = 0,
    lengths: Sequence[int] | None = None,
) -> dict[str, torch.Tensor]:
    """A batch of random ids with the labels of `kind`: full-length (no padding), or with each sequence's real
    length in `lengths` (pair length, [CLS] and [SEP] included) and [PAD] (id 0, mask 0, token type 0) after it, as
    a padded batch of real text is. The token types split each sequence's real tokens in two halves; pre-training
    predicts masked_positions(length) positions among a sequence's real tokens, the rest of the masked_positions(seq)
    slots being padding (position 0, label IGNORE_INDEX), as in Google's data. A full-length `lengths` gives the
    batch `lengths=None` does."""
    lengths = torch.full((batch,), seq) if lengths is None else torch.tensor(lengths)
    assert lengths.shape == (batch,) and 1 <= lengths.min() and lengths.max() <= seq, lengths
    generator = torch.Generator().manual_seed(seed)
    positions = torch.arange(seq).expand(batch, seq)
    real = positions < lengths[:, None]
    values = {
        "input_ids": torch.randint(1, config.vocab_size, (batch, seq), generator=generator) * real,
        "token_type_ids": (real & (positions >= lengths[:, None] // 2)).long(),
        "attention_mask": real.long(),
    }
    if kind == "pretraining":
        predictions = masked_positions(seq)
        values["masked_lm_positions"] = torch.zeros(batch, predictions, dtype=torch.long)
        for row, length in enumerate(lengths.tolist()):
            chosen = torch.randperm(length, generator=generator)[: masked_positions(length)]
            values["masked_lm_positions"][row, : len(chosen)] = chosen
        labels = torch.randint(1, config.vocab_size, (batch, predictions), generator=generator)
        predicted = torch.arange(predictions) < torch.tensor([masked_positions(n) for n in lengths.tolist()])[:, None]
        values["masked_lm_labels"] = labels.where(predicted, IGNORE_INDEX)
        values["next_sentence_labels"] = torch.randint(0, 2, (batch,), generator=generator)
    elif kind == "finetuning":
        values["labels"] = torch.randint(0, 2, (batch,), generator=generator)
    else:
        raise ValueError(f"unknown step kind {kind!r}: use pretraining or finetuning")
    return {name: tensor.to(device) for name, tensor in values.items()}
