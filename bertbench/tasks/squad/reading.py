"""Reading SQuAD v1.1 / v2.0 JSON files: the questions the runner trains on and predicts (SquadExample), and the
checks every reader of the files shares. Errors name the file and the question id (SquadDataError).

Besides the official nested layout (articles, paragraphs, questions), a file may hold HF datasets' flattened SQuAD,
what HF's run_qa.py reads: a `data` list of {id, title, context, question, answers: {text: [...], answer_start:
[...]}} records, a question without answers unanswerable (v2.0). load_json turns it into the nested layout.

Training questions whose answer Google's reader cannot find in the context's whitespace-split words (an answer holding
a no-break space) are skipped with a warning, as Google's read_squad_examples skips them, unless kept on request.
"""

from __future__ import annotations

import bisect
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from bertbench.common.durable import read_json


class SquadDataError(ValueError):
    """A SQuAD file is missing, not JSON or lacks a field; the message names the file and the question id."""


def load_json(path: str):
    """A SQuAD file's JSON, HF's flattened records in the nested layout; a missing file or one that is not JSON is a
    SquadDataError naming it."""
    try:
        data = read_json(path, SquadDataError)
    except FileNotFoundError:
        raise SquadDataError(f"{path}: no such file") from None
    records = data.get("data") if isinstance(data, dict) else None
    if isinstance(records, list) and records and all(isinstance(record, dict) for record in records):
        if all("context" in record and "paragraphs" not in record for record in records):
            return {**data, "data": _nested(records, path)}
    return data


def _nested(records: list[dict], path: str) -> list[dict]:
    """HF's flattened records as articles of paragraphs of questions (each run of records on one context a
    paragraph), their answers as lists of {text, answer_start}, is_impossible where there are none."""
    articles: list[dict] = []
    for record in records:
        question_id = required_field(record, "id", path, "a record")
        answers = required_field(record, "answers", path, f"question {question_id}")
        texts, starts = (answers.get(key) if isinstance(answers, dict) else None for key in ("text", "answer_start"))
        if not isinstance(texts, list) or not isinstance(starts, list) or len(texts) != len(starts):
            raise SquadDataError(
                f"{path}: question {question_id}: answers is {answers!r}, expected {{text: [...], answer_start: "
                "[...]}, lists of one length"
            )
        qa = {
            "id": question_id,
            "question": required_field(record, "question", path, f"question {question_id}"),
            "answers": [{"text": text, "answer_start": start} for text, start in zip(texts, starts)],
            **({} if texts else {"is_impossible": True}),
        }
        title = record.get("title")
        if not articles or articles[-1]["title"] != title:
            articles.append({"title": title, "paragraphs": []})
        paragraphs = articles[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != record["context"]:
            paragraphs.append({"context": record["context"], "qas": []})
        paragraphs[-1]["qas"].append(qa)
    return articles


def is_impossible_flag(qa: dict, where: str) -> bool:
    """A question's is_impossible flag (v2.0; absent: False), which must be a JSON boolean."""
    is_impossible = qa.get("is_impossible", False)
    if not isinstance(is_impossible, bool):
        raise SquadDataError(f"{where}: is_impossible is {is_impossible!r}, expected true or false")
    return is_impossible


def required_field(container, name: str, path: str, owner: str):
    """container[name], where `owner` (in file `path`) must have that field."""
    if not isinstance(container, dict) or name not in container:
        raise SquadDataError(f"{path}: {owner} has no '{name}' field")
    return container[name]


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


def read_examples(
    path: str | os.PathLike,
    training: bool,
    version_2: bool,
    keep_unaligned_answers: bool = False,
    warn: Callable[[str], None] = _print_warning,
) -> list[SquadExample]:
    """Every question of a SQuAD file. With `training`, each question needs an answer whose answer_start points at
    its text in the context (or, with `version_2`, is_impossible); the first answer is the one trained on.

    Training questions whose answer Google's run_squad cannot find in the context's words (`_google_finds_answer`)
    are skipped, as Google's read_squad_examples skips them, and one line through `warn` names them;
    `keep_unaligned_answers` keeps them.

    Errors name the file and the question id: a missing field, an empty context, a repeated id, an answer_start that
    does not match the answer text, an unanswerable question without `version_2`."""
    path = os.fspath(path)
    data = load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise SquadDataError(f"{path}: not a SQuAD file (no 'data' list)")
    examples, seen, skipped = [], set(), []
    for article in data["data"]:
        for paragraph in required_field(article, "paragraphs", path, "an article"):
            questions = required_field(paragraph, "qas", path, "a paragraph")
            if not questions:
                continue
            owner = f"the paragraph of question {required_field(questions[0], 'id', path, 'a question')}"
            context = required_field(paragraph, "context", path, owner)
            if not isinstance(context, str) or not context.strip():
                raise SquadDataError(f"{path}: {owner}: empty context")
            words = None
            for qa in questions:
                example = _read_example(qa, context, path, training, version_2)
                if example.question_id in seen:
                    raise SquadDataError(f"{path}: question {example.question_id}: the id is used twice")
                seen.add(example.question_id)
                if training and not example.is_impossible and not keep_unaligned_answers:
                    words = words or google_words(context)
                    if not _google_finds_answer(words, example.answer_start, example.answer_text):
                        skipped.append(example.question_id)
                        continue
                examples.append(example)
    if skipped:
        warn(
            f"warning: {path}: skipped {len(skipped)} training question{'s' if len(skipped) != 1 else ''} as "
            "Google's run_squad skips them, their answer text not found in the context's whitespace-split words "
            f'(its "Could not find answer"; --keep_unaligned_answers trains on them): {", ".join(skipped)}'
        )
    if not examples:
        raise SquadDataError(f"{path}: no questions" + (" left to train on" if skipped else ""))
    return examples


def google_words(context: str) -> tuple[list[str], list[int]]:
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
    return " ".join(words[first : last + 1]).find(" ".join(answer_text.split())) != -1


def _read_example(qa, context: str, path: str, training: bool, version_2: bool) -> SquadExample:
    question_id = str(required_field(qa, "id", path, "a question"))
    where = f"{path}: question {question_id}"
    question = required_field(qa, "question", path, f"question {question_id}")
    if not isinstance(question, str):  # an empty one is allowed: it only leaves the window all context
        raise SquadDataError(f"{where}: the question is {question!r}, not text")
    if not training:
        return SquadExample(question_id, question, context, -1, "")
    if is_impossible_flag(qa, where):
        if not version_2:
            raise SquadDataError(
                f"{where}: is unanswerable (is_impossible), a SQuAD v2.0 question; train on this "
                "file with --version_2_with_negative"
            )
        return SquadExample(question_id, question, context, -1, "", True)
    answers = required_field(qa, "answers", path, f"question {question_id}")
    if not isinstance(answers, list) or not answers:
        raise SquadDataError(f"{where}: no answer to train on (answers is empty and is_impossible is not true)")
    for answer in answers:
        text = required_field(answer, "text", path, f"an answer of question {question_id}")
        start = required_field(answer, "answer_start", path, f"an answer of question {question_id}")
        if not isinstance(text, str) or not text.strip():
            raise SquadDataError(f"{where}: empty answer text")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise SquadDataError(f"{where}: answer_start is {start!r}, expected a character offset")
        found = context[start : start + len(text)]
        if found != text:
            raise SquadDataError(
                f"{where}: answer_start {start} points at {found!r} in the context, not at the answer text {text!r}"
            )
    first = answers[0]
    return SquadExample(question_id, question, context, first["answer_start"], first["text"])
