"""SQuAD scoring against hand-computed figures (the official evaluate-v1.1.py / evaluate-v2.0.py definitions)."""

import json
import random

import pytest

from bertbench import cli
from bertbench.tasks.squad.reading import SquadDataError
from bertbench.tasks.squad.scoring import (
    ScoredQuestion,
    evaluate,
    exact_match,
    f1_score,
    find_best_threshold,
    normalize_answer,
    read_predictions,
    read_questions,
)


def test_normalisation():
    assert normalize_answer("The  Cat's, a HAT!") == "cats hat"
    assert normalize_answer("an apple\tand\nthe pear") == "apple and pear"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_exact_and_f1_by_hand():
    assert exact_match("the Broncos", "Broncos") == 1
    assert f1_score("the big red dog", "red dog") == pytest.approx(0.8)  # P 2/3, R 1
    assert f1_score("dog dog", "dog") == pytest.approx(2 / 3)  # overlap counts each token at most as often as both
    assert f1_score("cat", "dog") == 0.0


def test_empty_answers_v2_against_v1():
    assert f1_score("", "") == 1.0 and f1_score("a", "") == 1.0  # "a" normalises to nothing
    assert f1_score("", "", version_2=False) == 0.0
    assert f1_score("Normans", "") == 0.0


def squad_file(tmp_path, questions, version=None):
    data = {"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": questions}]}]}
    if version:
        data["version"] = version
    path = tmp_path / "data.json"
    path.write_text(json.dumps(data))
    return path


V1 = [
    {
        "id": "q1",
        "question": "?",
        "answers": [{"text": "Denver Broncos", "answer_start": 0}, {"text": "Broncos", "answer_start": 7}],
    },
    {"id": "q2", "question": "?", "answers": [{"text": "Santa Clara, California", "answer_start": 0}]},
    {"id": "q3", "question": "?", "answers": [{"text": "Levi's Stadium", "answer_start": 0}]},
]


def test_v1_file_by_hand(tmp_path):
    questions, version_2 = read_questions(squad_file(tmp_path, V1))
    warnings = []
    figures = evaluate(questions, {"q1": "the Broncos", "q2": "Santa Clara"}, version_2, warn=warnings.append)
    assert not version_2
    # EM: 1 + 0 + 0 (unanswered); F1: 1 + 0.8 (P 1, R 2/3) + 0.
    assert figures == pytest.approx({"exact_match": 100 / 3, "f1": 60.0})
    assert warnings == ["Unanswered question q3 will receive score 0."]


V2 = [
    {"id": "q1", "question": "?", "answers": [{"text": "Normans", "answer_start": 0}], "is_impossible": False},
    {
        "id": "q2",
        "question": "?",
        "answers": [],
        "is_impossible": True,
        "plausible_answers": [{"text": "France", "answer_start": 0}],
    },
    {"id": "q3", "question": "?", "answers": [], "is_impossible": True},
    {
        "id": "q4",
        "question": "?",
        "answers": [{"text": "10th and 11th centuries", "answer_start": 0}],
        "is_impossible": False,
    },
]
V2_PREDICTIONS = {"q1": "Normans", "q2": "", "q3": "France", "q4": "10th century"}


def test_v2_file_by_hand(tmp_path):
    questions, version_2 = read_questions(squad_file(tmp_path, V2))
    assert version_2
    figures = evaluate(questions, V2_PREDICTIONS, version_2)
    # q4: F1 of "10th century" vs "10th and 11th centuries" = 2 * 0.5 * 0.25 / 0.75 = 1/3.
    assert figures == pytest.approx(
        {
            "exact": 50.0,
            "f1": 100 * (2 + 1 / 3) / 4,
            "total": 4,
            "HasAns_exact": 50.0,
            "HasAns_f1": 100 * (4 / 3) / 2,
            "HasAns_total": 2,
            "NoAns_exact": 50.0,
            "NoAns_f1": 50.0,
            "NoAns_total": 2,
        }
    )


def test_v2_no_answer_threshold_and_best_threshold_by_hand(tmp_path):
    questions, _ = read_questions(squad_file(tmp_path, V2, version="v2.0"))
    probabilities = {"q1": 0.1, "q2": 0.9, "q3": 0.8, "q4": 0.3}
    figures = evaluate(questions, V2_PREDICTIONS, True, probabilities, threshold=0.5)
    # Above 0.5, q2 and q3 are "no answer", which is right for both: q3 turns from 0 to 1.
    assert figures["exact"] == pytest.approx(75.0) and figures["f1"] == pytest.approx(100 * (3 + 1 / 3) / 4)
    # Sweep from "no answer everywhere" (2 right) in rising probability: q1 +1 (0.1), q4 +0 / +1/3 (0.3),
    # q3 -1 (it has a non-empty answer), q2 +0.
    assert figures["best_exact"] == pytest.approx(75.0) and figures["best_exact_thresh"] == 0.1
    assert figures["best_f1"] == pytest.approx(100 * (3 + 1 / 3) / 4) and figures["best_f1_thresh"] == 0.3


def official_find_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    """evaluate-v2.0.py's find_best_thresh, verbatim apart from style."""
    num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    cur_score = best_score = num_no_ans
    best_thresh = 0.0
    qid_list = sorted(na_probs, key=lambda k: na_probs[k])
    for qid in qid_list:
        if qid not in scores:
            continue
        if qid_to_has_ans[qid]:
            diff = scores[qid]
        else:
            diff = -1 if preds[qid] else 0
        cur_score += diff
        if cur_score > best_score:
            best_score = cur_score
            best_thresh = na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def test_best_threshold_admits_tied_questions_in_the_probability_files_order(tmp_path):
    questions, _ = read_questions(squad_file(tmp_path, V2, version="v2.0"))
    # All tied, q3 first in the file: q3 (no answer, but answered) -1, then q1 +1: never above the start (2 of 4).
    probabilities = {"q3": 0.5, "q1": 0.5, "q4": 0.5, "q2": 0.5}
    figures = evaluate(questions, V2_PREDICTIONS, True, probabilities)
    assert (figures["best_exact"], figures["best_exact_thresh"]) == (50.0, 0.0)
    # In the data file's order q1 would come first and the sweep would report 75.0 at 0.5.
    probabilities = {"q1": 0.5, "q2": 0.5, "q3": 0.5, "q4": 0.5}
    figures = evaluate(questions, V2_PREDICTIONS, True, probabilities)
    assert (figures["best_exact"], figures["best_exact_thresh"]) == (75.0, 0.5)
    has_answer = {question.question_id: question.has_answer for question in questions}
    generator = random.Random(0)
    for _ in range(200):
        ids = list(has_answer)
        generator.shuffle(ids)
        probabilities = {q: generator.choice([0.0, 0.25, 0.5]) for q in ids}
        exact = {q: float(generator.random() < 0.5) for q in has_answer}
        predictions = {q: generator.choice(["", "x"]) for q in has_answer}
        ours = find_best_threshold(predictions, exact, probabilities, has_answer)
        assert ours == official_find_best_thresh(predictions, exact, probabilities, has_answer)


def test_answers_that_normalise_to_nothing_in_v2():
    question = ScoredQuestion("q", ("the",))
    assert question.has_answer and question.ground_truths(True) == ("",)
    assert question.ground_truths(False) == ("the",)


def test_command_prints_json_and_warns(tmp_path, capsys):
    data = squad_file(tmp_path, V1)
    predictions = tmp_path / "predictions.json"
    predictions.write_text(json.dumps({"q1": "Denver Broncos", "q2": "Santa Clara, California", "q3": "Levi"}))
    out = tmp_path / "eval.json"
    assert cli.main(["evaluate-squad", str(data), str(predictions), "-o", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text()) and printed["exact_match"] == pytest.approx(200 / 3)


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "data.json: not JSON"),
        ('{"data": [{"paragraphs": [{"qas": [{"id": "q9", "question": "?"}]}]}]}', "question q9 has no 'answers'"),
        ('{"version": "v2.0"}', "no 'data' list"),
    ],
)
def test_bad_data_files(tmp_path, capsys, content, message):
    (tmp_path / "data.json").write_text(content)
    (tmp_path / "predictions.json").write_text("{}")
    assert cli.main(["evaluate-squad", str(tmp_path / "data.json"), str(tmp_path / "predictions.json")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_bad_prediction_values(tmp_path):
    path = tmp_path / "predictions.json"
    path.write_text(json.dumps({"q1": ["Broncos"]}))
    with pytest.raises(SquadDataError, match="question q1: \\['Broncos'\\] is not a str"):
        read_predictions(path)
    path.write_text(json.dumps({"q1": "0.5"}))
    with pytest.raises(SquadDataError, match="is not a float"):
        read_predictions(path, float)
