"""A deterministic synthetic sentence-pair task with its own tiny vocabulary.

Sentence A is "the ADJ NOUN VERB the ADJ NOUN ." and sentence B "the ADJ NOUN VERB ."; every adjective is either
positive or negative, and the label says whether most of the three adjectives of the pair are positive. Neither
sentence decides the label alone (A may hold one of each), so the model must read the pair, as in GLUE's pair tasks,
yet a 2-layer BERT trained from scratch learns it within a hundred steps on a CPU.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
POSITIVE = ["happy", "brave", "quick", "kind", "bright", "calm"]
NEGATIVE = ["sad", "lazy", "angry", "dull", "grim", "rude"]
NOUNS = ["cat", "dog", "bird", "fox", "horse", "mouse", "lion", "owl", "frog", "bear", "wolf", "deer"]
VERBS = ["sees", "likes", "follows", "chases", "meets", "helps", "watches", "finds"]
LABELS = ["mostly_negative", "mostly_positive"]


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
        moods = [rng.randrange(2) for _ in range(3)]
        first, second, third = (rng.choice(POSITIVE if mood else NEGATIVE) for mood in moods)
        text_a = f"the {first} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {second} {rng.choice(NOUNS)} ."
        text_b = f"the {third} {rng.choice(NOUNS)} {rng.choice(VERBS)} ."
        examples.append(PairExample(text_a, text_b, int(sum(moods) >= 2)))
    return examples


def vocabulary() -> list[str]:
    return SPECIAL_TOKENS + ["the", "."] + POSITIVE + NEGATIVE + NOUNS + VERBS


def write_vocab(directory: str | os.PathLike) -> str:
    """Write the task's vocab.txt (one token per line, line number = id) and return its path."""
    path = os.path.join(directory, "vocab.txt")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(vocabulary()) + "\n")
    return path
