"""SQuAD v1.1 and v2.0: reading the files, features for BERT (question + context windows), turning start/end logits
back into answer text, and the official scoring (exact match and F1).

Features follow Google's run_squad.py: [CLS] question [SEP] context window [SEP], the question cut to
max_query_length tokens, long contexts split into windows doc_stride tokens apart. Token positions come from the
fast tokenizer's character offsets, so an answer maps to tokens exactly (accents, CJK, runs of whitespace) and a
predicted span maps back to the original context text, not to joined word pieces. A training window that does not
hold the whole answer, and every window of an unanswerable v2.0 question, points at [CLS]. Training questions whose
answer Google's reader cannot find in the context's whitespace-split words (an answer holding a no-break space) are
skipped with a warning, as Google's read_squad_examples skips them, unless kept on request.

Scoring is that of the official evaluate-v1.1.py and evaluate-v2.0.py: answers are normalised (lower-cased,
punctuation removed, the articles a/an/the removed, whitespace collapsed); exact match and token-overlap F1 are each
the maximum over the question's ground truths. v2.0 questions without an answer have the empty string as their only
ground truth; with no-answer probabilities the scorer also finds the threshold that would have scored best.
"""

from __future__ import annotations

import bisect
import collections
import functools
import json
import os
import re
import string
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from bertbench.tasks.tokenization import BertTokenizer


class SquadDataError(ValueError):
    """A SQuAD file is missing, not JSON or lacks a field; the message names the file and the question id."""


_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """The official normalisation: lower-case, drop punctuation, drop a/an/the, collapse whitespace."""
    text = "".join(character for character in text.lower() if character not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(truth))


def f1_score(prediction: str, truth: str, version_2: bool = True) -> float:
    """Token-overlap F1 of the normalised answers. v2.0 scores an empty answer on either side 1 when both are empty,
    0 otherwise; v1.1 has no such case (empty answers always score 0)."""
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if version_2 and (not predicted or not expected):
        return float(predicted == expected)
    common = collections.Counter(predicted) & collections.Counter(expected)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(expected)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class ScoredQuestion:
    question_id: str
    answers: tuple[str, ...]  # the answer texts as the file gives them; empty for a v2.0 question without answer

    @property
    def has_answer(self) -> bool:
        return bool(self.answers)

    def ground_truths(self, version_2: bool) -> tuple[str, ...]:
        """v1.1 compares with every answer text. v2.0 drops texts that normalise to nothing, and a question left
        without any has the empty string as its only ground truth (as the official v2.0 script does)."""
        if not version_2 and self.answers:
            return self.answers
        return tuple(text for text in self.answers if normalize_answer(text)) or ("",)


def read_questions(path: str | os.PathLike) -> tuple[list[ScoredQuestion], bool]:
    """Every question of a SQuAD file with its answer texts, and whether the file is v2.0 (version "v2.0", or
    questions with is_impossible)."""
    path = os.fspath(path)
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise SquadDataError(f"{path}: not a SQuAD file (no 'data' list)")
    questions, version_2 = [], data.get("version") == "v2.0"
    for article in data["data"]:
        for paragraph in _field(article, "paragraphs", path, "an article"):
            for qa in _field(paragraph, "qas", path, "a paragraph"):
                question_id = str(_field(qa, "id", path, "a question"))
                answers = _field(qa, "answers", path, f"question {question_id}")
                _is_impossible(qa, f"{path}: question {question_id}")
                version_2 = version_2 or "is_impossible" in qa
                texts = tuple(_field(answer, "text", path, f"an answer of question {question_id}")
                              for answer in answers)
                bad = [text for text in texts if not isinstance(text, str)]
                if bad:
                    raise SquadDataError(f"{path}: question {question_id}: an answer's text is {bad[0]!r}, not text")
                questions.append(ScoredQuestion(question_id, texts))
    return questions, version_2


def _load_json(path: str):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise SquadDataError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise SquadDataError(f"{path}: not valid JSON ({error})") from None


def _is_impossible(qa: dict, where: str) -> bool:
    """A question's is_impossible flag (v2.0; absent: False), which must be a JSON boolean."""
    is_impossible = qa.get("is_impossible", False)
    if not isinstance(is_impossible, bool):
        raise SquadDataError(f"{where}: is_impossible is {is_impossible!r}, expected true or false")
    return is_impossible


def _field(container, name: str, path: str, owner: str):
    if not isinstance(container, dict) or name not in container:
        raise SquadDataError(f"{path}: {owner} has no '{name}' field")
    return container[name]


def read_predictions(path: str | os.PathLike, value_type: type = str) -> dict:
    """A JSON object of question id -> answer text (predictions.json) or -> no-answer probability (null_odds.json)."""
    path = os.fspath(path)
    data = _load_json(path)
    if not isinstance(data, dict):
        raise SquadDataError(f"{path}: expected a JSON object of question id -> {value_type.__name__}")
    for question_id, value in data.items():
        if value_type is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            continue
        if not isinstance(value, value_type):
            raise SquadDataError(f"{path}: question {question_id}: {value!r} is not a {value_type.__name__}")
    return data


def evaluate(questions: list[ScoredQuestion], predictions: Mapping[str, str], version_2: bool,
             no_answer_probabilities: Mapping[str, float] | None = None, threshold: float = 1.0,
             warn=print) -> dict[str, float]:
    """Official figures in percent. v1.1: {exact_match, f1}. v2.0: {exact, f1, total, HasAns_exact, HasAns_f1,
    HasAns_total, NoAns_...}, and with no-answer probabilities best_exact, best_exact_thresh, best_f1,
    best_f1_thresh. A question without a prediction scores 0 and is reported through `warn`."""
    exact, f1 = {}, {}
    for question in questions:
        if question.question_id not in predictions:
            warn(f"Unanswered question {question.question_id} will receive score 0.")
            exact[question.question_id] = f1[question.question_id] = 0.0
            continue
        prediction = predictions[question.question_id]
        truths = question.ground_truths(version_2)
        exact[question.question_id] = max(exact_match(prediction, truth) for truth in truths)
        f1[question.question_id] = max(f1_score(prediction, truth, version_2) for truth in truths)
    if not questions:
        raise SquadDataError("no questions to score")
    if not version_2:
        return {"exact_match": 100.0 * sum(exact.values()) / len(questions),
                "f1": 100.0 * sum(f1.values()) / len(questions)}
    has_answer = {question.question_id: question.has_answer for question in questions}
    if no_answer_probabilities is not None:
        exact_thresholded = _apply_threshold(exact, no_answer_probabilities, has_answer, threshold)
        f1_thresholded = _apply_threshold(f1, no_answer_probabilities, has_answer, threshold)
    else:
        exact_thresholded, f1_thresholded = exact, f1
    result = _summary(exact_thresholded, f1_thresholded, list(has_answer))
    for label, wanted in (("HasAns", True), ("NoAns", False)):
        subset = [question_id for question_id, answered in has_answer.items() if answered == wanted]
        if subset:
            result.update({f"{label}_{key}": value
                           for key, value in _summary(exact_thresholded, f1_thresholded, subset).items()})
    if no_answer_probabilities is not None:
        for name, scores in (("exact", exact), ("f1", f1)):
            best, best_threshold = _best_threshold(predictions, scores, no_answer_probabilities, has_answer)
            result[f"best_{name}"], result[f"best_{name}_thresh"] = best, best_threshold
    return result


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], question_ids: list[str]) -> dict[str, float]:
    total = len(question_ids)
    return {"exact": 100.0 * sum(exact[q] for q in question_ids) / total,
            "f1": 100.0 * sum(f1[q] for q in question_ids) / total, "total": total}


def _apply_threshold(scores: Mapping[str, float], probabilities: Mapping[str, float],
                     has_answer: Mapping[str, bool], threshold: float) -> dict[str, float]:
    """Above the threshold the model is taken to say "no answer": right exactly when there is none."""
    return {question_id: (float(not has_answer[question_id])
                          if probabilities.get(question_id, 0.0) > threshold else score)
            for question_id, score in scores.items()}


def _best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float], probabilities: Mapping[str, float],
                    has_answer: Mapping[str, bool]) -> tuple[float, float]:
    """The official sweep: start from answering "no answer" everywhere, then admit questions in order of rising
    no-answer probability; the best score met and the probability at which it was met. Questions of equal
    probability are admitted in the probability file's order, as the official script's stable sort of that file
    does (the data file's order can give another best score)."""
    current = best = float(sum(not answered for answered in has_answer.values()))
    best_threshold = 0.0
    in_file_order = [q for q in probabilities if q in scores] + [q for q in scores if q not in probabilities]
    for question_id in sorted(in_file_order, key=lambda q: probabilities.get(q, 0.0)):
        if question_id not in predictions:
            continue
        if has_answer[question_id]:
            difference = scores[question_id]
        else:
            difference = -1.0 if predictions[question_id] else 0.0
        current += difference
        if current > best:
            best, best_threshold = current, probabilities.get(question_id, 0.0)
    return 100.0 * best / len(scores), best_threshold


# ---- examples: what the runner trains on and predicts ------------------------------------------------------------

# Google's run_squad splits a paragraph into words at these characters only (its is_whitespace).
_GOOGLE_WORD = re.compile(r"[^ \t\r\n\u202f]+")


@dataclass(frozen=True)
class SquadExample:
    question_id: str
    question: str
    context: str
    answer_start: int  # character offset of the (first) answer in context; -1 when there is none
    answer_text: str  # "" for an unanswerable v2.0 question, and for questions read for prediction only
    is_impossible: bool = False


def _print_warning(message: str) -> None:
    print(message, file=sys.stderr)


def read_examples(path: str | os.PathLike, training: bool, version_2: bool, keep_unaligned_answers: bool = False,
                  warn: Callable[[str], None] = _print_warning) -> list[SquadExample]:
    """Every question of a SQuAD file. With `training`, each question needs an answer whose answer_start points at
    its text in the context (or, with `version_2`, is_impossible); the first answer is the one trained on.

    Training questions whose answer Google's run_squad cannot find in the context's words (`_google_finds_answer`)
    are skipped, as Google's read_squad_examples skips them, and one line through `warn` names them;
    `keep_unaligned_answers` keeps them.

    Errors name the file and the question id: a missing field, an empty context, a repeated id, an answer_start that
    does not match the answer text, an unanswerable question without `version_2`."""
    path = os.fspath(path)
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise SquadDataError(f"{path}: not a SQuAD file (no 'data' list)")
    examples, seen, skipped = [], set(), []
    for article in data["data"]:
        for paragraph in _field(article, "paragraphs", path, "an article"):
            questions = _field(paragraph, "qas", path, "a paragraph")
            if not questions:
                continue
            owner = f"the paragraph of question {_field(questions[0], 'id', path, 'a question')}"
            context = _field(paragraph, "context", path, owner)
            if not isinstance(context, str) or not context.strip():
                raise SquadDataError(f"{path}: {owner}: empty context")
            words = None
            for qa in questions:
                example = _read_example(qa, context, path, training, version_2)
                if example.question_id in seen:
                    raise SquadDataError(f"{path}: question {example.question_id}: the id is used twice")
                seen.add(example.question_id)
                if training and not example.is_impossible and not keep_unaligned_answers:
                    words = words or _google_words(context)
                    if not _google_finds_answer(words, example.answer_start, example.answer_text):
                        skipped.append(example.question_id)
                        continue
                examples.append(example)
    if skipped:
        warn(f"warning: {path}: skipped {len(skipped)} training question{'s' if len(skipped) != 1 else ''} as "
             "Google's run_squad skips them, their answer text not found in the context's whitespace-split words "
             f"(its \"Could not find answer\"; --keep_unaligned_answers trains on them): {', '.join(skipped)}")
    if not examples:
        raise SquadDataError(f"{path}: no questions" + (" left to train on" if skipped else ""))
    return examples


def _google_words(context: str) -> tuple[list[str], list[int]]:
    """The context's words as Google's run_squad splits them (doc_tokens), and where each starts."""
    matches = list(_GOOGLE_WORD.finditer(context))
    return [match.group() for match in matches], [match.start() for match in matches]


def _google_finds_answer(context_words: tuple[list[str], list[int]], answer_start: int, answer_text: str) -> bool:
    """Google's read_squad_examples test of a training answer: the words from the one holding the answer's first
    character to the one holding its last (char_to_word_offset: a space belongs to the word before it), joined by
    single spaces, must contain the answer's own words (whitespace_tokenize, Python's str.split) joined likewise.
    The context is split at spaces, tabs, line breaks and U+202F only, the answer at every Unicode space, so an
    answer holding a no-break space (U+00A0), an ideographic space (U+3000) or the like is not found."""
    words, starts = context_words
    first = bisect.bisect_right(starts, answer_start) - 1
    last = bisect.bisect_right(starts, answer_start + len(answer_text) - 1) - 1
    return " ".join(words[first:last + 1]).find(" ".join(answer_text.split())) != -1


def _read_example(qa, context: str, path: str, training: bool, version_2: bool) -> SquadExample:
    question_id = str(_field(qa, "id", path, "a question"))
    where = f"{path}: question {question_id}"
    question = _field(qa, "question", path, f"question {question_id}")
    if not isinstance(question, str):  # an empty one is allowed: it only leaves the window all context
        raise SquadDataError(f"{where}: the question is {question!r}, not text")
    if not training:
        return SquadExample(question_id, question, context, -1, "")
    if _is_impossible(qa, where):
        if not version_2:
            raise SquadDataError(f"{where}: is unanswerable (is_impossible), a SQuAD v2.0 question; train on this "
                                 "file with --version_2_with_negative")
        return SquadExample(question_id, question, context, -1, "", True)
    answers = _field(qa, "answers", path, f"question {question_id}")
    if not isinstance(answers, list) or not answers:
        raise SquadDataError(f"{where}: no answer to train on (answers is empty and is_impossible is not true)")
    for answer in answers:
        text = _field(answer, "text", path, f"an answer of question {question_id}")
        start = _field(answer, "answer_start", path, f"an answer of question {question_id}")
        if not isinstance(text, str) or not text.strip():
            raise SquadDataError(f"{where}: empty answer text")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise SquadDataError(f"{where}: answer_start is {start!r}, expected a character offset")
        found = context[start:start + len(text)]
        if found != text:
            raise SquadDataError(f"{where}: answer_start {start} points at {found!r} in the context, not at the "
                                 f"answer text {text!r}")
    first = answers[0]
    return SquadExample(question_id, question, context, first["answer_start"], first["text"])


# ---- features: [CLS] question [SEP] context window [SEP] ---------------------------------------------------------

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


def convert_examples(examples: Sequence[SquadExample], tokenizer: BertTokenizer, max_seq_length: int,
                     doc_stride: int, max_query_length: int, training: bool) -> SquadFeatures:
    """Windows of every example. Questions and contexts are tokenized in parallel batches (each distinct context
    once: a SQuAD paragraph serves about five questions); windows and answer positions come from the offsets.

    Windows follow Google's run_squad: each holds up to max_seq_length - len(question) - 3 context tokens and starts
    doc_stride tokens after the previous one, the last ending at the context's end. A training window holding the
    whole answer points start/end_positions at it; other windows, and unanswerable questions, at [CLS] (0)."""
    if max_seq_length <= max_query_length + 3:
        raise ValueError(f"max_seq_length {max_seq_length} leaves no room for the context after a question of up to "
                         f"{max_query_length} tokens and [CLS] [SEP] [SEP]; it must exceed max_query_length + 3")
    if doc_stride < 1:
        raise ValueError(f"doc_stride must be at least 1, got {doc_stride}")
    backend = tokenizer.backend
    questions = backend.encode_batch([example.question for example in examples], add_special_tokens=False)
    contexts = list(dict.fromkeys(example.context for example in examples))
    context_index = {context: index for index, context in enumerate(contexts)}
    encoded_contexts = backend.encode_batch(contexts, add_special_tokens=False)
    vanishes = functools.lru_cache(maxsize=None)(lambda character: backend.normalizer.normalize_str(character) == "")
    context_tokens = [(np.array(encoding.ids, dtype=np.int64),
                       _with_vanished_characters(context, np.array(encoding.offsets, dtype=np.int64).reshape(-1, 2),
                                                 vanishes))
                      for context, encoding in zip(contexts, encoded_contexts)]

    windows: list[_Window] = []
    for index, (example, question) in enumerate(zip(examples, questions)):
        question_ids = question.ids[:max_query_length]
        doc_ids, doc_offsets = context_tokens[context_index[example.context]]
        if len(doc_ids) == 0:
            raise SquadDataError(f"question {example.question_id}: its context has no tokens")
        answer = _answer_tokens(example, doc_offsets) if training else None
        spans = _window_spans(len(doc_ids), max_seq_length - len(question_ids) - 3, doc_stride)
        best_window = None if training else _best_window_per_token(spans, len(doc_ids))
        for number, (start, length) in enumerate(spans):
            positions = 0, 0
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                positions = answer[0] - start + len(question_ids) + 2, answer[1] - start + len(question_ids) + 2
            is_max_context = None if best_window is None else best_window[start:start + length] == number
            windows.append(_Window(index, question_ids, doc_ids[start:start + length],
                                   doc_offsets[start:start + length], positions, is_max_context))

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
        input_ids[row, 1:first - 1] = window.question_ids
        input_ids[row, first - 1] = input_ids[row, end] = tokenizer.sep_id
        input_ids[row, first:end] = window.doc_ids
        token_type_ids[row, first:end + 1] = 1
        attention_mask[row, :end + 1] = 1
        if not training:
            offsets[row, first:end] = window.doc_offsets
            max_context[row, first:end] = window.is_max_context
    inputs = {"input_ids": torch.from_numpy(input_ids), "token_type_ids": torch.from_numpy(token_type_ids),
              "attention_mask": torch.from_numpy(attention_mask)}
    if training:
        positions = torch.tensor([window.positions for window in windows], dtype=torch.int64).reshape(-1, 2)
        inputs["start_positions"], inputs["end_positions"] = positions[:, 0].clone(), positions[:, 1].clone()
    return SquadFeatures(inputs, np.array([window.example_index for window in windows], dtype=np.int64), offsets,
                         max_context)


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


def _answer_tokens(example: SquadExample, doc_offsets: np.ndarray) -> tuple[int, int] | None:
    """The first and last context token of the answer: the first token ending after the answer's first character,
    the last starting before its end. None for an unanswerable question."""
    if example.is_impossible:
        return None
    answer_end = example.answer_start + len(example.answer_text)
    first = int(np.searchsorted(doc_offsets[:, 1], example.answer_start, side="right"))
    last = int(np.searchsorted(doc_offsets[:, 0], answer_end, side="left")) - 1
    if first > last:
        raise SquadDataError(f"question {example.question_id}: the answer {example.answer_text!r} covers no token "
                             "of the context")
    return first, last


# ---- answers: from start/end logits back to context text ---------------------------------------------------------

@dataclass
class SquadPredictions:
    """What run_squad writes: predictions.json, nbest_predictions.json and, for v2.0, null_odds.json."""

    answers: dict[str, str]  # question id -> answer text ("" = no answer)
    nbest: dict[str, list[dict]]  # question id -> [{text, probability, start_logit, end_logit}], best first
    null_odds: dict[str, float] | None  # question id -> null score minus best span score (v2.0)


class _Candidate(NamedTuple):
    score: float
    start_logit: float
    end_logit: float
    tokens: tuple[int, int, int] | None  # (window row, first, last position in the row); None = no answer


ANSWER_TEXTS = ("google", "context")


class GoogleAnswerText:
    """An answer's text as Google's run_squad write_predictions makes it: the original words the span's tokens fall
    in, joined by single spaces, then trimmed to the predicted tokens by get_final_text -- which gives back the
    whole words, punctuation included, when it cannot align them character by character (an accent stripped from a
    decomposed letter changes a word's length) and takes the first place the tokens' text occurs in the words."""

    def __init__(self, tokenizer: BertTokenizer):
        self.tokenizer = tokenizer
        self._words_of: dict[str, tuple[list[str], np.ndarray]] = {}  # context -> its words and where they start

    def _words(self, context: str) -> tuple[list[str], np.ndarray]:
        if context not in self._words_of:
            words, starts = _google_words(context)
            self._words_of[context] = words, np.array(starts, dtype=np.int64)
        return self._words_of[context]

    def __call__(self, context: str, input_ids: np.ndarray, offsets: np.ndarray, first: int, last: int) -> str:
        words, starts = self._words(context)
        first_word, last_word = np.searchsorted(starts, offsets[[first, last], 0], side="right") - 1
        original = " ".join(words[first_word:last_word + 1])
        pieces = " ".join(self.tokenizer.convert_ids_to_tokens(input_ids[first:last + 1]))
        predicted = " ".join(pieces.replace(" ##", "").replace("##", "").split())
        return _google_final_text(predicted, original, " ".join(self.tokenizer.basic_tokenize(original)))


def _google_final_text(predicted: str, original: str, tokenized: str) -> str:
    """Google's get_final_text: find the predicted text in the original words' tokenized text and map it back
    character by character, spaces aside; the whole original words where that fails."""
    start = tokenized.find(predicted)
    if start == -1:
        return original
    original_chars = [index for index, character in enumerate(original) if character != " "]
    tokenized_chars = [index for index, character in enumerate(tokenized) if character != " "]
    if len(original_chars) != len(tokenized_chars):
        return original
    position = {index: rank for rank, index in enumerate(tokenized_chars)}
    end = start + len(predicted) - 1
    if start not in position or end not in position:
        return original
    return original[original_chars[position[start]]:original_chars[position[end]] + 1]


def postprocess(examples: Sequence[SquadExample], features: SquadFeatures, start_logits, end_logits,
                n_best_size: int = 20, max_answer_length: int = 30, version_2: bool = False,
                null_score_diff_threshold: float = 0.0, answer_text: GoogleAnswerText | None = None
                ) -> SquadPredictions:
    """Google's run_squad write_predictions: in every window of an example, pair the n_best_size highest start
    logits with the n_best_size highest end logits; keep spans inside the context, starting at a token this window
    has the most context for, not ending before they start, at most max_answer_length tokens; rank them by start +
    end logit across windows. The answer is the ranked span's original context text. v2.0 also scores "no answer"
    as the lowest [CLS] start + end logit over the windows, and answers "" when that beats the best span by more
    than null_score_diff_threshold.

    An answer's text is Google's (`GoogleAnswerText`: whole words, single spaces, get_final_text) when
    `answer_text` is given, else the exact characters of the context its tokens cover."""
    start_logits = np.asarray(start_logits, dtype=np.float64)
    end_logits = np.asarray(end_logits, dtype=np.float64)
    assert features.token_offsets is not None, "post-processing needs features built with training=False"
    answers, nbest_json, null_odds = {}, {}, {}
    # An example's windows are consecutive rows.
    for rows in np.split(np.arange(len(features)), np.flatnonzero(np.diff(features.example_index)) + 1):
        example = examples[features.example_index[rows[0]]]
        candidates, null = [], None
        for row in rows:
            starts, ends = start_logits[row], end_logits[row]
            if null is None or starts[0] + ends[0] < null.score:
                null = _Candidate(starts[0] + ends[0], starts[0], ends[0], None)
            candidates += _span_candidates(row, starts, ends, features.token_offsets[row], features.max_context[row],
                                           n_best_size, max_answer_length)
        if version_2:
            candidates.append(null)
        candidates.sort(key=lambda candidate: -candidate.score)
        nbest, seen = [], set()
        for candidate in candidates:
            if len(nbest) == n_best_size:
                break
            if candidate.tokens is None:
                text = ""
            else:
                row, first, last = candidate.tokens
                offsets = features.token_offsets[row]
                text = (example.context[offsets[first, 0]:offsets[last, 1]] if answer_text is None else
                        answer_text(example.context, features.inputs["input_ids"][row].numpy(), offsets, first, last))
            if text not in seen:
                seen.add(text)
                nbest.append((text, candidate))
        if version_2 and "" not in seen:
            nbest.append(("", null))
        if not nbest:  # no span passed the filters (v1.1): Google's placeholder answer
            nbest.append(("empty", _Candidate(0.0, 0.0, 0.0, None)))
        scores = np.array([candidate.score for _, candidate in nbest])
        probabilities = np.exp(scores - scores.max())
        probabilities /= probabilities.sum()
        nbest_json[example.question_id] = [
            {"text": text, "probability": float(probability), "start_logit": float(candidate.start_logit),
             "end_logit": float(candidate.end_logit)}
            for (text, candidate), probability in zip(nbest, probabilities)]
        if not version_2:
            answers[example.question_id] = nbest[0][0]
            continue
        best_span = next((candidate for text, candidate in nbest if text), None)
        if best_span is None:
            # No span passed the filters: as sure of "no answer" as a finite JSON number can say.
            null_odds[example.question_id] = sys.float_info.max
            answers[example.question_id] = ""
            continue
        odds = float(null.score - best_span.start_logit - best_span.end_logit)
        null_odds[example.question_id] = odds
        answers[example.question_id] = "" if odds > null_score_diff_threshold else next(
            text for text, candidate in nbest if candidate is best_span)
    return SquadPredictions(answers, nbest_json, null_odds if version_2 else None)


def _span_candidates(row: int, starts: np.ndarray, ends: np.ndarray, offsets: np.ndarray, max_context: np.ndarray,
                     n_best_size: int, max_answer_length: int) -> list[_Candidate]:
    """The valid (start, end) pairs among one window's n_best_size best starts and ends."""
    top_starts = np.argsort(-starts, kind="stable")[:n_best_size, None]
    top_ends = np.argsort(-ends, kind="stable")[None, :n_best_size]
    in_context = offsets[:, 0] >= 0
    valid = (in_context[top_starts] & max_context[top_starts] & in_context[top_ends] & (top_ends >= top_starts)
             & (top_ends - top_starts < max_answer_length))
    first, last = np.broadcast_arrays(top_starts, top_ends)
    return [_Candidate(starts[i] + ends[j], starts[i], ends[j], (row, int(i), int(j)))
            for i, j in zip(first[valid], last[valid])]
