"""bertbench against fixtures written by Google's original BERT code (tests/fixtures/google_bert, made by
make_fixtures.py with bert-tensorflow 1.0.4 under TensorFlow): tokens, GLUE features, SQuAD features and predictions.

No TensorFlow here: the fixtures hold Google's outputs, and these tests drive bertbench's own paths (its tokenizer,
its GLUE reader and encoder, its SQuAD reader, windows and post-processing) on the same inputs. A failure names the
first mismatching input and shows both outputs. The optimizer trajectory (adam_weight_decay.npz) is tested elsewhere.
"""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from bertbench.tasks import glue
from bertbench.tasks.squad.answers import GoogleAnswerText, postprocess
from bertbench.tasks.squad.features import convert_examples
from bertbench.tasks.squad.reading import read_examples
from bertbench.tasks.tokenization import BertTokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "google_bert"


def load_json(name: str):
    path = FIXTURES / name
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    return json.loads(path.read_text(encoding="utf-8"))


@functools.cache
def fixture(name: str):
    return load_json(name)


@functools.cache
def tokenizer(do_lower_case: bool) -> BertTokenizer:
    return BertTokenizer.from_vocab_file(FIXTURES / "vocab.txt", do_lower_case=do_lower_case)


def first_difference(expected, actual) -> str:
    """Where two sequences part, with a little context on either side."""
    expected, actual = list(expected), list(actual)
    index = next((i for i, (a, b) in enumerate(zip(expected, actual)) if a != b), min(len(expected), len(actual)))
    window = slice(max(0, index - 3), index + 4)
    return (
        f"first difference at position {index} (lengths {len(expected)} vs {len(actual)}): "
        f"Google ...{expected[window]}... bertbench ...{actual[window]}..."
    )


def mismatch_report(mismatches: list[str], total: int, what: str) -> str:
    head = f"{len(mismatches)} of {total} {what} differ from Google's; the first:\n"
    return head + "\n".join(mismatches[:3])


# ---- tokens ------------------------------------------------------------------------------------------------------

CASINGS = {"uncased": True, "cased": False}


def token_cases(source: str):
    return [case for case in fixture("tokens.json.gz")["cases"] if case["source"] == source]


@pytest.mark.parametrize("casing", CASINGS)
def test_tokens_of_every_real_text_line(casing):
    lines = (FIXTURES / "real_text.txt").read_text(encoding="utf-8").split("\n")
    cases = token_cases("real_text.txt")
    assert len(cases) == len(lines)
    mismatches = []
    for case in cases:
        text = lines[case["line"]]
        actual = tokenizer(CASINGS[casing]).tokenize(text)
        if actual != case[casing]:
            mismatches.append(
                f"real_text.txt line {case['line']}: {text!r}\n  {first_difference(case[casing], actual)}"
                f"\n  Google    {case[casing]}\n  bertbench {actual}"
            )
    assert not mismatches, mismatch_report(mismatches, len(cases), f"{casing} lines")


EDGE_CASES = token_cases("edge")


@pytest.mark.parametrize("casing", CASINGS)
@pytest.mark.parametrize("case", EDGE_CASES, ids=[case["name"] for case in EDGE_CASES])
def test_tokens_of_edge_cases(case, casing):
    actual = tokenizer(CASINGS[casing]).tokenize(case["text"])
    assert actual == case[casing], (
        f"{case['name']}: {case['text']!r}\n  {first_difference(case[casing], actual)}"
        f"\n  Google    {case[casing]}\n  bertbench {actual}"
    )


DEPARTURES = token_cases("documented_departure")


@pytest.mark.xfail(strict=True, reason="a departure of the Rust normalizer documented in bertbench/tokenization.py")
@pytest.mark.parametrize("case", DEPARTURES, ids=[case["name"] for case in DEPARTURES])
def test_tokens_of_documented_departures(case):
    actual = tokenizer(True).tokenize(case["text"])
    assert actual == case["uncased"], (
        f"{case['name']}: {case['text']!r}\n  Google    {case['uncased']}\n  bertbench {actual}"
    )


# ---- GLUE --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["MRPC", "CoLA"])
def test_glue_reader_gives_googles_examples(task):
    expected = [case for case in fixture("glue_features.json.gz")["examples"] if case["task"] == task]
    data_dir = FIXTURES / fixture("glue_features.json.gz")["data_dirs"][task]
    examples = glue.get_processor(task).train_examples(data_dir)
    actual = [{"guid": e.guid, "text_a": e.text_a, "text_b": e.text_b, "label": e.label} for e in examples]
    google = [{key: case[key] for key in ("guid", "text_a", "text_b", "label")} for case in expected]
    # Google numbers a file's examples by line (MRPC: after the header, from 1); bertbench from 0. Only the texts
    # and labels reach the model.
    for row in actual + google:
        row.pop("guid")
    assert len(actual) == len(google)
    mismatches = [
        f"row {i}:\n  Google    {g}\n  bertbench {a}" for i, (g, a) in enumerate(zip(google, actual)) if g != a
    ]
    assert not mismatches, mismatch_report(mismatches, len(google), f"{task} examples")


@pytest.mark.parametrize("max_seq_length", [32, 128])
@pytest.mark.parametrize("task", ["MRPC", "CoLA"])
def test_glue_features_through_bertbench_reader_and_encoder(task, max_seq_length):
    data = fixture("glue_features.json.gz")
    expected = [case for case in data["examples"] if case["task"] == task]
    examples = glue.get_processor(task).train_examples(FIXTURES / data["data_dirs"][task])
    features = glue.encode_examples(examples, tokenizer(data["do_lower_case"]), task, max_seq_length)
    mismatches = []
    for row, case in enumerate(expected):
        google = case["features"][str(max_seq_length)]
        actual = {
            "input_ids": features["input_ids"][row].tolist(),
            "input_mask": features["attention_mask"][row].tolist(),
            "segment_ids": features["token_type_ids"][row].tolist(),
            "label_id": int(features["labels"][row]),
        }
        for key in ("input_ids", "input_mask", "segment_ids", "label_id"):
            if actual[key] != google[key]:
                mismatches.append(
                    f"{case['guid']} text_a={case['text_a']!r} text_b={case['text_b']!r}: {key}\n"
                    f"  Google    {tokenizer(True).convert_ids_to_tokens(google['input_ids'])}\n"
                    f"  bertbench {tokenizer(True).convert_ids_to_tokens(actual['input_ids'])}\n"
                    f"  {first_difference(google[key], actual[key]) if key != 'label_id' else ''}"
                )
                break
    assert not mismatches, mismatch_report(mismatches, len(expected), f"{task} features at {max_seq_length}")


@pytest.mark.parametrize("max_seq_length", [32, 128])
def test_glue_features_through_encode(max_seq_length):
    """BertTokenizer.encode, the one-example path, agrees with Google too."""
    data = fixture("glue_features.json.gz")
    mismatches = []
    for case in data["examples"]:
        google = case["features"][str(max_seq_length)]
        inputs = tokenizer(True).encode(case["text_a"], case["text_b"], max_seq_length)
        actual = {
            "input_ids": inputs.input_ids,
            "input_mask": inputs.attention_mask,
            "segment_ids": inputs.token_type_ids,
        }
        if any(actual[key] != google[key] for key in actual):
            mismatches.append(
                f"{case['task']} {case['guid']} text_a={case['text_a']!r} text_b={case['text_b']!r}\n"
                f"  Google    {google}\n  bertbench {actual}"
            )
    assert not mismatches, mismatch_report(mismatches, len(data["examples"]), "encode results")


# ---- SQuAD -------------------------------------------------------------------------------------------------------

SQUAD_VERSIONS = ["v1.1", "v2.0"]


def squad_settings():
    return fixture("squad_features.json.gz")["settings"]


@functools.cache
def bertbench_squad(version: str, training: bool, answer_span: str = "google"):
    data = fixture("squad_features.json.gz")
    settings = data["settings"]
    examples = read_examples(FIXTURES / data[version]["file"], training=training, version_2=version == "v2.0")
    features = convert_examples(
        examples,
        tokenizer(settings["do_lower_case"]),
        settings["max_seq_length"],
        settings["doc_stride"],
        settings["max_query_length"],
        training=training,
        answer_span=answer_span,
    )
    return examples, features


def window_name(version, google, question_ids):
    return (
        f"{version} question {question_ids[google['example_index']]} window {google['doc_span_index']} "
        f"(unique_id {google['unique_id']})"
    )


@pytest.mark.parametrize("version", SQUAD_VERSIONS)
def test_squad_eval_features(version):
    data = fixture("squad_features.json.gz")[version]
    examples, features = bertbench_squad(version, training=False)
    assert [example.question_id for example in examples] == data["question_ids"]
    google_windows = [(f["example_index"], f["doc_span_index"]) for f in data["eval"]]
    assert len(features) == len(data["eval"]), (
        f"{len(data['eval'])} windows from Google, {len(features)} from bertbench; windows per question: "
        f"{first_difference([i for i, _ in google_windows], features.example_index.tolist())}"
    )
    assert features.example_index.tolist() == [i for i, _ in google_windows]
    vocab = tokenizer(squad_settings()["do_lower_case"])
    mismatches = []
    for row, google in enumerate(data["eval"]):
        length = len(google["tokens"])
        in_context = np.zeros(len(google["input_ids"]), dtype=bool)
        in_context[[int(position) for position in google["token_to_orig_map"]]] = True
        max_context = np.zeros(len(google["input_ids"]), dtype=bool)
        for position, flag in google["token_is_max_context"].items():
            max_context[int(position)] = flag
        comparisons = {
            "input_ids": (google["input_ids"], features.inputs["input_ids"][row].tolist()),
            "segment_ids": (google["segment_ids"], features.inputs["token_type_ids"][row].tolist()),
            "input_mask": (google["input_mask"], features.inputs["attention_mask"][row].tolist()),
            "context positions (token_to_orig_map keys)": (
                in_context.tolist(),
                (features.token_offsets[row, :, 0] >= 0).tolist(),
            ),
            "token_is_max_context": (max_context.tolist(), features.max_context[row].tolist()),
        }
        for key, (expected, actual) in comparisons.items():
            if expected != actual:
                actual_tokens = vocab.convert_ids_to_tokens(features.inputs["input_ids"][row].tolist())
                mismatches.append(
                    f"{window_name(version, google, data['question_ids'])}: {key}\n"
                    f"  {first_difference(expected, actual)}\n"
                    f"  Google tokens    {google['tokens']}\n"
                    f"  bertbench tokens {actual_tokens[: length + 2]}"
                )
                break
    assert not mismatches, mismatch_report(mismatches, len(data["eval"]), f"{version} eval windows")


@pytest.mark.parametrize("version", SQUAD_VERSIONS)
def test_squad_training_features(version):
    data = fixture("squad_features.json.gz")[version]
    examples, features = bertbench_squad(version, training=True)
    # Google's reader kept every training question of these files (make_fixtures.py checks it): bertbench too.
    assert [example.question_id for example in examples] == data["question_ids"]
    assert len(features) == len(data["train_positions"])
    assert features.example_index.tolist() == [f["example_index"] for f in data["eval"]]
    starts = features.inputs["start_positions"].tolist()
    ends = features.inputs["end_positions"].tolist()
    vocab = tokenizer(squad_settings()["do_lower_case"])
    mismatches = []
    for row, (google, (start, end, impossible)) in enumerate(zip(data["eval"], data["train_positions"])):
        same_ids = features.inputs["input_ids"][row].tolist() == google["input_ids"]
        if (starts[row], ends[row]) != (start, end) or not same_ids:
            example = examples[google["example_index"]]
            mismatches.append(
                f"{window_name(version, google, data['question_ids'])}: answer {example.answer_text!r} "
                f"(impossible: {impossible})\n"
                f"  Google    start/end {start}, {end}: {google['tokens'][start : end + 1]}\n"
                f"  bertbench start/end {starts[row]}, {ends[row]}: "
                f"{vocab.convert_ids_to_tokens(features.inputs['input_ids'][row, starts[row] : ends[row] + 1].tolist())}"
                + ("" if same_ids else "\n  (the windows' input_ids differ too)")
            )
    assert not mismatches, mismatch_report(mismatches, len(features), f"{version} training windows")


@pytest.mark.parametrize("version", SQUAD_VERSIONS)
def test_squad_training_features_of_the_character_rule_part_where_answers_cut_punctuated_words(version):
    """--train_answer_span=characters points at the tokens holding the answer's characters: it parts from Google's
    targets only on the answers make_fixtures.py places inside words split at punctuation (its last article), where
    no run of the words' tokens is the answer's own (Google's rule then takes the whole words) or where that run
    comes first in the word ("bye" in "bye-bye,")."""
    data = fixture("squad_features.json.gz")[version]
    examples, features = bertbench_squad(version, training=True, answer_span="characters")
    positions = zip(features.inputs["start_positions"].tolist(), features.inputs["end_positions"].tolist())
    parted = {
        examples[google["example_index"]].answer_text
        for google, (start, end), (google_start, google_end, _) in zip(data["eval"], positions, data["train_positions"])
        if (start, end) != (google_start, google_end)
    }
    assert parted == {"coded", "'decod", "e's", 'oftware"', "ate-of-the-ar", "PL-comp", "895-1943", "bye"}
    punctuated = load_json(data["file"])["data"][-1]["paragraphs"][0]
    assert "'decoded'," in punctuated["context"] and parted <= {qa["answers"][0]["text"] for qa in punctuated["qas"]}


def google_training_reads(squad: dict) -> tuple[list[str], list[str]]:
    """The question ids Google's read_squad_examples (run_squad.py, is_training=True) keeps and those it skips with
    "Could not find answer", its rule transcribed: the context split into words at its is_whitespace characters,
    char_to_word_offset, and the answer's whitespace_tokenize words looked for in the words it spans."""

    def is_whitespace(c):
        return c == " " or c == "\t" or c == "\r" or c == "\n" or ord(c) == 0x202F

    kept, skipped = [], []
    for entry in squad["data"]:
        for paragraph in entry["paragraphs"]:
            doc_tokens, char_to_word_offset, prev_is_whitespace = [], [], True
            for c in paragraph["context"]:
                if is_whitespace(c):
                    prev_is_whitespace = True
                else:
                    if prev_is_whitespace:
                        doc_tokens.append(c)
                    else:
                        doc_tokens[-1] += c
                    prev_is_whitespace = False
                char_to_word_offset.append(len(doc_tokens) - 1)
            for qa in paragraph["qas"]:
                if qa.get("is_impossible", False):
                    kept.append(qa["id"])
                    continue
                answer = qa["answers"][0]
                start_position = char_to_word_offset[answer["answer_start"]]
                end_position = char_to_word_offset[answer["answer_start"] + len(answer["text"]) - 1]
                actual_text = " ".join(doc_tokens[start_position : end_position + 1])
                cleaned_answer_text = " ".join(answer["text"].strip().split())
                (skipped if actual_text.find(cleaned_answer_text) == -1 else kept).append(qa["id"])
    return kept, skipped


def with_no_break_spaces(squad: dict) -> dict:
    """The SQuAD data with the first space of every other multi-word answer made a no-break space, in the context
    (every answer's text taken again from it: the lengths do not change)."""
    squad = json.loads(json.dumps(squad))
    for entry in squad["data"]:
        for paragraph in entry["paragraphs"]:
            context = paragraph["context"]
            answers = [qa["answers"][0] for qa in paragraph["qas"] if qa["answers"]]
            for answer in answers[::2]:
                space = answer["text"].find(" ")
                if space > 0:
                    at = answer["answer_start"] + space
                    context = context[:at] + "\u00a0" + context[at + 1 :]
            paragraph["context"] = context
            for answer in answers:
                answer["text"] = context[answer["answer_start"] : answer["answer_start"] + len(answer["text"])]
    return squad


@pytest.mark.parametrize("version", SQUAD_VERSIONS)
def test_squad_training_questions_are_those_googles_reader_keeps(version, tmp_path):
    data = fixture("squad_features.json.gz")[version]
    squad = load_json(data["file"])
    assert google_training_reads(squad) == (data["question_ids"], [])  # the transcription agrees with Google's run
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps(with_no_break_spaces(squad)), encoding="utf-8")
    kept, skipped = google_training_reads(json.loads(changed.read_text(encoding="utf-8")))
    assert len(skipped) >= 20
    warnings = []
    examples = read_examples(changed, training=True, version_2=version == "v2.0", warn=warnings.append)
    assert [example.question_id for example in examples] == kept
    assert len(warnings) == 1 and f"skipped {len(skipped)} training questions" in warnings[0]
    assert warnings[0].endswith(": " + ", ".join(skipped))
    everything = read_examples(changed, training=True, version_2=version == "v2.0", keep_unaligned_answers=True)
    assert [example.question_id for example in everything] == data["question_ids"]


@functools.cache
def bertbench_predictions(version: str):
    data = fixture("squad_features.json.gz")
    settings = data["settings"]
    logits = np.load(FIXTURES / data["logits"])
    rows = data[version]["logit_rows"]
    scale = float(logits["logit_scale"])
    start_logits = logits["start_logits"][rows].astype(np.float64) / scale
    end_logits = logits["end_logits"][rows].astype(np.float64) / scale
    examples, features = bertbench_squad(version, training=False)
    return postprocess(
        examples,
        features,
        start_logits,
        end_logits,
        settings["n_best_size"],
        settings["max_answer_length"],
        version == "v2.0",
        settings["null_score_diff_threshold"],
        GoogleAnswerText(tokenizer(settings["do_lower_case"])),
    )


def squad_contexts(version):
    squad = load_json(fixture("squad_features.json.gz")[version]["file"])
    return {
        qa["id"]: paragraph["context"]
        for article in squad["data"]
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }


@pytest.mark.parametrize("version", SQUAD_VERSIONS)
def test_squad_predictions(version):
    tag = "v2" if version == "v2.0" else "v1"
    google = load_json(f"squad/predictions_{tag}.json")
    predictions = bertbench_predictions(version)
    assert list(predictions.answers) == list(google)
    contexts = squad_contexts(version)
    mismatches = [
        f"question {question_id}: Google {answer!r}, bertbench {predictions.answers[question_id]!r}"
        f"{answer_difference(answer, predictions.answers[question_id])}\n"
        f"  context {contexts[question_id]!r}"
        for question_id, answer in google.items()
        if predictions.answers[question_id] != answer
    ]
    assert not mismatches, mismatch_report(mismatches, len(google), f"{version} answers")


def answer_difference(google: str, ours: str) -> str:
    """A hint at how two answer texts differ (the assertion stays exact)."""
    if " ".join(ours.split()) == google:
        return " (only in whitespace: Google joins the context's whitespace-split words with single spaces)"
    if ours and ours in google:
        return (
            " (Google's is the whole whitespace-split words around bertbench's: its get_final_text falls back "
            "to them when lower-casing/accent stripping changes the words' length)"
        )
    return ""


def test_squad_null_odds():
    google = load_json("squad/null_odds_v2.json")
    null_odds = bertbench_predictions("v2.0").null_odds
    assert list(null_odds) == list(google)
    mismatches = [
        f"question {question_id}: Google {odds!r}, bertbench {null_odds[question_id]!r}"
        for question_id, odds in google.items()
        if abs(null_odds[question_id] - odds) > 1e-5
    ]
    assert not mismatches, mismatch_report(mismatches, len(google), "v2.0 null odds")


@pytest.mark.parametrize("version", SQUAD_VERSIONS)
def test_squad_nbest(version):
    """The n-best lists: the same texts in the same order, with the same probabilities and logits."""
    tag = "v2" if version == "v2.0" else "v1"
    google = load_json(f"squad/nbest_predictions_{tag}.json.gz")
    nbest = bertbench_predictions(version).nbest
    assert list(nbest) == list(google)
    mismatches = []
    for question_id, entries in google.items():
        ours = nbest[question_id]
        differing = [
            index
            for index, (a, b) in enumerate(zip(entries, ours))
            if a["text"] != b["text"]
            or any(abs(a[key] - b[key]) > 1e-6 for key in ("probability", "start_logit", "end_logit"))
        ]
        if differing or len(ours) != len(entries):
            index = differing[0] if differing else min(len(ours), len(entries))
            google_entry = entries[index] if index < len(entries) else None
            our_entry = ours[index] if index < len(ours) else None
            hint = answer_difference(google_entry["text"], our_entry["text"]) if google_entry and our_entry else ""
            mismatches.append(
                f"question {question_id}: entry {index} of {len(entries)} (bertbench {len(ours)})"
                f"{hint}\n  Google    {google_entry}\n  bertbench {our_entry}"
            )
    assert not mismatches, mismatch_report(mismatches, len(google), f"{version} n-best lists")
