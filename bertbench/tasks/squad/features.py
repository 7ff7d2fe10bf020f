"""SQuAD features for BERT, as Google's run_squad.py builds them: [CLS] question [SEP] context window [SEP], the
question cut to max_query_length tokens, long contexts split into windows doc_stride tokens apart. Token positions
come from the fast tokenizer's character offsets, so a predicted span maps back to the original context text, not
to joined word pieces. A training answer's tokens follow Google's rule by default (ANSWER_SPANS: the whole words
holding it, narrowed to the first run of tokens that are the answer text's own), or the tokens holding its
characters. A training window that does not hold the whole answer, and every window of an unanswerable v2.0 question,
points at [CLS].
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from bertbench.tasks.squad.reading import SquadDataError, SquadExample, google_words
from bertbench.tasks.tokenization import BertTokenizer

# Which context tokens a training answer's start and end positions point at (see _google_answer_tokens and
# _character_answer_tokens).
ANSWER_SPANS = ("google", "characters")


@dataclass
class SquadFeatures:
    """One row per context window. `inputs` holds the model's tensors (start_positions and end_positions too when
    built for training); the arrays say where each row's tokens come from, for post-processing."""

    inputs: dict  # name -> int64 tensor [windows, max_seq_length]; start/end_positions [windows]
    example_index: np.ndarray  # [windows] index into the examples list of each window
    token_offsets: np.ndarray | None  # [windows, seq, 2] character span in the context; (-1, -1) off the context
    max_context: np.ndarray | None  # [windows, seq] this window has the most context on both sides of the token

    def __len__(self) -> int:
        return len(self.example_index)


def convert_examples(
    examples: Sequence[SquadExample],
    tokenizer: BertTokenizer,
    max_seq_length: int,
    doc_stride: int,
    max_query_length: int,
    training: bool,
    answer_span: str = "google",
) -> SquadFeatures:
    """Windows of every example. Questions and contexts are tokenized in parallel batches (each distinct context
    once: a SQuAD paragraph serves about five questions); windows and answer positions come from the offsets.

    Windows follow Google's run_squad: each holds up to max_seq_length - len(question) - 3 context tokens and starts
    doc_stride tokens after the previous one, the last ending at the context's end. A training window holding the
    whole answer (its tokens by the `answer_span` rule, one of ANSWER_SPANS) points start/end_positions at it; other
    windows, and unanswerable questions, at [CLS] (0)."""
    if answer_span not in ANSWER_SPANS:
        raise ValueError(f"answer_span must be one of {', '.join(ANSWER_SPANS)}, got {answer_span!r}")
    if max_seq_length <= max_query_length + 3:
        raise ValueError(
            f"max_seq_length {max_seq_length} leaves no room for the context after a question of up to "
            f"{max_query_length} tokens and [CLS] [SEP] [SEP]; it must exceed max_query_length + 3"
        )
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be at least 1, got {doc_stride}")
    backend = tokenizer.backend
    questions = backend.encode_batch([example.question for example in examples], add_special_tokens=False)
    contexts = list(dict.fromkeys(example.context for example in examples))
    context_index = {context: index for index, context in enumerate(contexts)}
    encoded_contexts = backend.encode_batch(contexts, add_special_tokens=False)
    vanishes = functools.lru_cache(maxsize=None)(lambda character: backend.normalizer.normalize_str(character) == "")
    context_tokens = [
        (
            np.array(encoding.ids, dtype=np.int64),
            _with_vanished_characters(context, np.array(encoding.offsets, dtype=np.int64).reshape(-1, 2), vanishes),
        )
        for context, encoding in zip(contexts, encoded_contexts)
    ]

    by_words = training and answer_span == "google"
    answers = (
        backend.encode_batch([example.answer_text for example in examples], add_special_tokens=False)
        if by_words
        else None
    )
    words_of = functools.lru_cache(maxsize=None)(
        lambda number: _token_words(contexts[number], context_tokens[number][1])
    )

    windows: list[_Window] = []
    for index, (example, question) in enumerate(zip(examples, questions)):
        question_ids = question.ids[:max_query_length]
        doc_ids, doc_offsets = context_tokens[context_index[example.context]]
        if len(doc_ids) == 0:
            raise SquadDataError(f"question {example.question_id}: its context has no tokens")
        answer = (
            None
            if not training or example.is_impossible
            else _google_answer_tokens(example, doc_ids, *words_of(context_index[example.context]), answers[index].ids)
            if by_words
            else _character_answer_tokens(example, doc_offsets)
        )
        spans = _window_spans(len(doc_ids), max_seq_length - len(question_ids) - 3, doc_stride)
        best_window = None if training else _best_window_per_token(spans, len(doc_ids))
        for number, (start, length) in enumerate(spans):
            positions = 0, 0
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                positions = answer[0] - start + len(question_ids) + 2, answer[1] - start + len(question_ids) + 2
            is_max_context = None if best_window is None else best_window[start : start + length] == number
            windows.append(
                _Window(
                    index,
                    question_ids,
                    doc_ids[start : start + length],
                    doc_offsets[start : start + length],
                    positions,
                    is_max_context,
                )
            )

    count = len(windows)
    input_ids = np.full((count, max_seq_length), tokenizer.pad_id, dtype=np.int64)
    token_type_ids = np.zeros((count, max_seq_length), dtype=np.int64)
    attention_mask = np.zeros((count, max_seq_length), dtype=np.int64)
    offsets = None if training else np.full((count, max_seq_length, 2), -1, dtype=np.int32)
    max_context = None if training else np.zeros((count, max_seq_length), dtype=bool)
    for row, window in enumerate(windows):
        first = len(window.question_ids) + 2  # where the context starts in the row
        end = first + len(window.doc_ids)
        input_ids[row, 0] = tokenizer.cls_id
        input_ids[row, 1 : first - 1] = window.question_ids
        input_ids[row, first - 1] = input_ids[row, end] = tokenizer.sep_id
        input_ids[row, first:end] = window.doc_ids
        token_type_ids[row, first : end + 1] = 1
        attention_mask[row, : end + 1] = 1
        if not training:
            offsets[row, first:end] = window.doc_offsets
            max_context[row, first:end] = window.is_max_context
    inputs = {
        "input_ids": torch.from_numpy(input_ids),
        "token_type_ids": torch.from_numpy(token_type_ids),
        "attention_mask": torch.from_numpy(attention_mask),
    }
    if training:
        positions = torch.tensor([window.positions for window in windows], dtype=torch.int64).reshape(-1, 2)
        inputs["start_positions"], inputs["end_positions"] = positions[:, 0].clone(), positions[:, 1].clone()
    return SquadFeatures(
        inputs, np.array([window.example_index for window in windows], dtype=np.int64), offsets, max_context
    )


class _Window(NamedTuple):
    example_index: int
    question_ids: list[int]
    doc_ids: np.ndarray  # the window's context tokens
    doc_offsets: np.ndarray  # and their character spans
    positions: tuple[int, int]  # answer start and end in the row; (0, 0) = [CLS]
    is_max_context: np.ndarray | None


_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # the ASCII characters the normalizer deletes


def _with_vanished_characters(context: str, offsets: np.ndarray, vanishes) -> np.ndarray:
    """Token offsets extended over the characters the normalizer deletes (a decomposed accent when stripping
    accents, a zero-width space, a control character), so that an answer keeps them, as Google's answers (whole
    original words) do: those right after a token join it ("Cafe\u0301"), those left before a token, after a space
    or another kept character, join the token that follows ("\u0301a", a mark opening a word)."""
    if len(offsets) == 0 or context.isascii() and not _ASCII_CONTROL.search(context):
        return offsets  # the common case: nothing in the context vanishes
    next_starts = np.append(offsets[1:, 0], len(context))
    for token in np.flatnonzero(offsets[:, 1] < next_starts):
        end = int(offsets[token, 1])
        while end < next_starts[token] and vanishes(context[end]):
            end += 1
        offsets[token, 1] = end
    previous_ends = np.insert(offsets[:-1, 1], 0, 0)
    for token in np.flatnonzero(offsets[:, 0] > previous_ends):
        start = int(offsets[token, 0])
        while start > previous_ends[token] and vanishes(context[start - 1]):
            start -= 1
        offsets[token, 0] = start
    return offsets


def _window_spans(num_tokens: int, budget: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over a context of num_tokens tokens."""
    spans, start = [], 0
    while True:
        length = min(num_tokens - start, budget)
        spans.append((start, length))
        if start + length >= num_tokens:
            return spans
        start += min(length, doc_stride)


def _best_window_per_token(spans: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """For each context token, the window that sees most context around it: the largest min(left, right) context,
    plus 0.01 x window length to prefer longer windows; the first such window on a tie (Google's
    _check_is_max_context)."""
    token = np.arange(num_tokens)
    scores = np.full((len(spans), num_tokens), -np.inf)
    for number, (start, length) in enumerate(spans):
        inside = slice(start, start + length)
        scores[number, inside] = np.minimum(token[inside] - start, start + length - 1 - token[inside]) + 0.01 * length
    return scores.argmax(axis=0)


def _character_answer_tokens(example: SquadExample, doc_offsets: np.ndarray) -> tuple[int, int]:
    """The "characters" rule: the first and last context token holding a character of the answer (the first token
    ending after its first character, the last starting before its end)."""
    answer_end = example.answer_start + len(example.answer_text)
    first = int(np.searchsorted(doc_offsets[:, 1], example.answer_start, side="right"))
    last = int(np.searchsorted(doc_offsets[:, 0], answer_end, side="left")) - 1
    return _checked_span(example, first, last)


def _token_words(context: str, doc_offsets: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """(the word of each context token, where each word starts): the context's words as Google's run_squad splits
    them (reading.google_words), a token belonging to the word holding its first character."""
    _, word_starts = google_words(context)
    return np.searchsorted(word_starts, doc_offsets[:, 0], side="right") - 1, word_starts


def _google_answer_tokens(
    example: SquadExample, doc_ids: np.ndarray, token_words: np.ndarray, word_starts: list[int], answer_ids: list[int]
) -> tuple[int, int]:
    """The "google" rule, Google's run_squad's (convert_examples_to_features and _improve_answer_span): the tokens of
    the whole words holding the answer's first and last characters (char_to_word_offset: a space belongs to the
    word before it), narrowed to the first run of them, from the left, that is the answer text's own tokens; the
    whole words when none is (an answer starting or ending inside a word piece, or in a word split at punctuation
    where its text tokenizes otherwise)."""
    first_word = bisect.bisect_right(word_starts, example.answer_start) - 1
    last_word = bisect.bisect_right(word_starts, example.answer_start + len(example.answer_text) - 1) - 1
    first = int(np.searchsorted(token_words, first_word, side="left"))
    last = int(np.searchsorted(token_words, last_word, side="right")) - 1
    length = len(answer_ids)
    if length:
        for start in range(first, last - length + 2):
            if np.array_equal(doc_ids[start : start + length], answer_ids):
                return start, start + length - 1
    return _checked_span(example, first, last)


def _checked_span(example: SquadExample, first: int, last: int) -> tuple[int, int]:
    if first > last:
        raise SquadDataError(
            f"question {example.question_id}: the answer {example.answer_text!r} covers no token of the context"
        )
    return first, last
