"""SQuAD's official scoring, that of evaluate-v1.1.py and evaluate-v2.0.py: answers are normalised (lower-cased,
punctuation removed, the articles a/an/the removed, whitespace collapsed); exact match and token-overlap F1 are each
the maximum over the question's ground truths. v2.0 questions without an answer have the empty string as their only
ground truth; with no-answer probabilities the scorer also finds the threshold that would have scored best.
"""

from __future__ import annotations

import collections
import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass

from bertbench.tasks.squad.reading import (
    SquadDataError,
    is_impossible_flag,
    load_json,
    required_field,
)

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
    data = load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise SquadDataError(f"{path}: not a SQuAD file (no 'data' list)")
    questions, version_2 = [], data.get("version") == "v2.0"
    for article in data["data"]:
        for paragraph in required_field(article, "paragraphs", path, "an article"):
            for qa in required_field(paragraph, "qas", path, "a paragraph"):
                question_id = str(required_field(qa, "id", path, "a question"))
                answers = required_field(qa, "answers", path, f"question {question_id}")
                is_impossible_flag(qa, f"{path}: question {question_id}")
                version_2 = version_2 or "is_impossible" in qa
                texts = tuple(
                    required_field(answer, "text", path, f"an answer of question {question_id}") for answer in answers
                )
                bad = [text for text in texts if not isinstance(text, str)]
                if bad:
                    raise SquadDataError(f"{path}: question {question_id}: an answer's text is {bad[0]!r}, not text")
                questions.append(ScoredQuestion(question_id, texts))
    return questions, version_2


def read_predictions(path: str | os.PathLike, value_type: type = str) -> dict:
    """A JSON object of question id -> answer text (predictions.json) or -> no-answer probability (null_odds.json)."""
    path = os.fspath(path)
    data = load_json(path)
    if not isinstance(data, dict):
        raise SquadDataError(f"{path}: expected a JSON object of question id -> {value_type.__name__}")
    for question_id, value in data.items():
        if value_type is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            continue
        if not isinstance(value, value_type):
            raise SquadDataError(f"{path}: question {question_id}: {value!r} is not a {value_type.__name__}")
    return data


def evaluate(
    questions: list[ScoredQuestion],
    predictions: Mapping[str, str],
    version_2: bool,
    no_answer_probabilities: Mapping[str, float] | None = None,
    threshold: float = 1.0,
    warn=print,
) -> dict[str, float]:
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
        return {
            "exact_match": 100.0 * sum(exact.values()) / len(questions),
            "f1": 100.0 * sum(f1.values()) / len(questions),
        }
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
            result.update(
                {f"{label}_{key}": value for key, value in _summary(exact_thresholded, f1_thresholded, subset).items()}
            )
    if no_answer_probabilities is not None:
        for name, scores in (("exact", exact), ("f1", f1)):
            best, best_threshold = find_best_threshold(predictions, scores, no_answer_probabilities, has_answer)
            result[f"best_{name}"], result[f"best_{name}_thresh"] = best, best_threshold
    return result


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], question_ids: list[str]) -> dict[str, float]:
    total = len(question_ids)
    return {
        "exact": 100.0 * sum(exact[q] for q in question_ids) / total,
        "f1": 100.0 * sum(f1[q] for q in question_ids) / total,
        "total": total,
    }


def _apply_threshold(
    scores: Mapping[str, float], probabilities: Mapping[str, float], has_answer: Mapping[str, bool], threshold: float
) -> dict[str, float]:
    """Above the threshold the model is taken to say "no answer": right exactly when there is none."""
    return {
        question_id: (float(not has_answer[question_id]) if probabilities.get(question_id, 0.0) > threshold else score)
        for question_id, score in scores.items()
    }


def find_best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    probabilities: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
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
