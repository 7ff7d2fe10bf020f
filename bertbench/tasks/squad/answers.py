"""SQuAD answers from the model's start/end logits, as Google's run_squad write_predictions makes them: the n-best
spans of every question across its windows, their text in the context, and for v2.0 the no-answer odds; what
run_squad writes as predictions.json, nbest_predictions.json and null_odds.json.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from bertbench.tasks.squad.features import SquadFeatures
from bertbench.tasks.squad.reading import SquadExample, google_words
from bertbench.tasks.tokenization import BertTokenizer


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
        # The last context's spans of words by (first word, last word): a question's candidate spans (dozens, until
        # n_best_size texts differ) mostly fall in the same few words, whose tokenizing and character alignment were
        # most of the post-processing's time; the questions of a context come one after the other.
        self._span_context: str | None = None
        self._spans: dict[tuple[int, int], _WordSpan] = {}

    def _words(self, context: str) -> tuple[list[str], np.ndarray]:
        if context not in self._words_of:
            words, starts = google_words(context)
            self._words_of[context] = words, np.array(starts, dtype=np.int64)
        return self._words_of[context]

    def __call__(self, context: str, input_ids: np.ndarray, offsets: np.ndarray, first: int, last: int) -> str:
        words, starts = self._words(context)
        first_word, last_word = np.searchsorted(starts, offsets[[first, last], 0], side="right") - 1
        if context != self._span_context:
            self._span_context, self._spans = context, {}
        key = (int(first_word), int(last_word))
        if key not in self._spans:
            original = " ".join(words[first_word : last_word + 1])
            self._spans[key] = _WordSpan(original, " ".join(self.tokenizer.basic_tokenize(original)))
        pieces = " ".join(self.tokenizer.convert_ids_to_tokens(input_ids[first : last + 1]))
        predicted = " ".join(pieces.replace(" ##", "").replace("##", "").split())
        return self._spans[key].final_text(predicted)


class _WordSpan:
    """Original words, joined by single spaces, and their tokenized text, aligned character by character (spaces
    aside) as Google's get_final_text aligns them: `positions` maps a tokenized character to the original's, None
    when the two have different numbers of characters."""

    __slots__ = ("original", "tokenized", "positions")

    def __init__(self, original: str, tokenized: str):
        self.original, self.tokenized = original, tokenized
        original_chars = [index for index, character in enumerate(original) if character != " "]
        tokenized_chars = [index for index, character in enumerate(tokenized) if character != " "]
        self.positions = (
            dict(zip(tokenized_chars, original_chars)) if len(original_chars) == len(tokenized_chars) else None
        )

    def final_text(self, predicted: str) -> str:
        """Google's get_final_text: find the predicted text in the tokenized text and map it back to the original
        words; the whole original words where that fails."""
        start = self.tokenized.find(predicted)
        end = start + len(predicted) - 1
        if start == -1 or self.positions is None or start not in self.positions or end not in self.positions:
            return self.original
        return self.original[self.positions[start] : self.positions[end] + 1]


def postprocess(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    start_logits,
    end_logits,
    n_best_size: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
    answer_text: GoogleAnswerText | None = None,
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
            candidates += _span_candidates(
                row,
                starts,
                ends,
                features.token_offsets[row],
                features.max_context[row],
                n_best_size,
                max_answer_length,
            )
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
                text = (
                    example.context[offsets[first, 0] : offsets[last, 1]]
                    if answer_text is None
                    else answer_text(example.context, features.inputs["input_ids"][row].numpy(), offsets, first, last)
                )
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
            {
                "text": text,
                "probability": float(probability),
                "start_logit": float(candidate.start_logit),
                "end_logit": float(candidate.end_logit),
            }
            for (text, candidate), probability in zip(nbest, probabilities)
        ]
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
        answers[example.question_id] = (
            ""
            if odds > null_score_diff_threshold
            else next(text for text, candidate in nbest if candidate is best_span)
        )
    return SquadPredictions(answers, nbest_json, null_odds if version_2 else None)


def _span_candidates(
    row: int,
    starts: np.ndarray,
    ends: np.ndarray,
    offsets: np.ndarray,
    max_context: np.ndarray,
    n_best_size: int,
    max_answer_length: int,
) -> list[_Candidate]:
    """The valid (start, end) pairs among one window's n_best_size best starts and ends."""
    top_starts = np.argsort(-starts, kind="stable")[:n_best_size, None]
    top_ends = np.argsort(-ends, kind="stable")[None, :n_best_size]
    in_context = offsets[:, 0] >= 0
    valid = (
        in_context[top_starts]
        & max_context[top_starts]
        & in_context[top_ends]
        & (top_ends >= top_starts)
        & (top_ends - top_starts < max_answer_length)
    )
    first, last = np.broadcast_arrays(top_starts, top_ends)
    return [
        _Candidate(starts[i] + ends[j], starts[i], ends[j], (row, int(i), int(j)))
        for i, j in zip(first[valid], last[valid])
    ]
