"""SQuAD reading, windows and answer mapping, and post-processing back to context text."""

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertbench.runners.config import parse_config
from bertbench.runners.squad import SPEC, read
from bertbench.tasks.squad.answers import GoogleAnswerText, postprocess
from bertbench.tasks.squad.features import ANSWER_SPANS, convert_examples
from bertbench.tasks.squad.reading import SquadDataError, SquadExample, read_examples
from bertbench.tasks.tokenization import BertTokenizer

WORDS = [
    "the",
    "cafe",
    "muller",
    "est",
    "ouvert",
    "a",
    "big",
    "dog",
    "barks",
    "at",
    "night",
    "$",
    "100",
    "##0",
    "in",
    "new",
    "york",
    "'",
    "s",
    "北",
    "京",
    "大",
    "学",
    "is",
    ".",
    ",",
    "un",
    "##believ",
    "##able",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "who", "what", "?"] + WORDS) + "\n")
    return BertTokenizer.from_vocab_file(path)


def example(context, answer=None, start=None, question="what is it ?", question_id="q"):
    if answer is None:
        return SquadExample(question_id, question, context, -1, "", is_impossible=True)
    start = context.index(answer) if start is None else start
    return SquadExample(question_id, question, context, start, answer)


def answer_tokens(features, tokenizer, row=0):
    start, end = (int(features.inputs[name][row]) for name in ("start_positions", "end_positions"))
    return tokenizer.convert_ids_to_tokens(features.inputs["input_ids"][row, start : end + 1].tolist())


@pytest.mark.parametrize(
    "context, answer, tokens",
    [
        ("Le Café  Müller est ouvert.", "Müller", ["muller"]),  # accents stripped by the tokenizer, offsets kept
        ("Le Café  Müller est ouvert.", "Café  Müller", ["cafe", "muller"]),  # a run of spaces inside the answer
        ("a dog\t barks\n\nat night", "barks\n\nat", ["barks", "at"]),
        ("北京大学 is big", "京大", ["京", "大"]),  # CJK characters are tokens of their own
        ("it is unbelievable .", "unbelievable", ["un", "##believ", "##able"]),
        ("the dog's $1000 cafe", "$1000", ["$", "100", "##0"]),
        ("New York's cafe", "York", ["york"]),
    ],
)
def test_answers_map_to_exactly_their_tokens(tokenizer, context, answer, tokens):
    features = convert_examples([example(context, answer)], tokenizer, 32, 8, 8, training=True)
    assert answer_tokens(features, tokenizer) == tokens


@pytest.mark.parametrize(
    "answer_span, tokens",
    [("google", ["un", "##believ", "##able"]), ("characters", ["##believ"])],
)
def test_an_answer_inside_a_word_maps_to_the_word_or_to_its_pieces(tokenizer, answer_span, tokens):
    """ "believ" tokenizes to [UNK] alone: no run of the word's tokens is it, and Google's rule takes the word."""
    features = convert_examples(
        [example("an unbelievable dog", "believ")], tokenizer, 32, 8, 8, training=True, answer_span=answer_span
    )
    assert answer_tokens(features, tokenizer) == tokens


@pytest.mark.parametrize(
    "context, answer, start, google, characters",
    [
        # The answer's own tokens occur twice in the word: Google's rule takes the first, from the left.
        ("a dog,dog barks", "dog", 6, (1, 1), (3, 3)),
        # They occur once, after the word's other pieces: both rules point at them.
        ("it is $1000, then", "1000,", 7, (3, 5), (3, 5)),
        # The answer cuts a piece ("000" tokenizes to [UNK]): Google's rule takes the whole word, punctuation too.
        ("it is $1000, then", "000", 8, (2, 5), (3, 4)),
    ],
)
def test_googles_rule_narrows_the_words_to_the_first_run_of_the_answers_tokens(
    tokenizer, context, answer, start, google, characters
):
    assert context[start : start + len(answer)] == answer
    for answer_span, expected in (("google", google), ("characters", characters)):
        features = convert_examples(
            [example(context, answer, start)], tokenizer, 32, 8, 8, training=True, answer_span=answer_span
        )
        context_start = 6  # after [CLS] what is [UNK] ? [SEP]
        positions = (int(features.inputs["start_positions"][0]), int(features.inputs["end_positions"][0]))
        assert positions == (expected[0] + context_start, expected[1] + context_start), answer_span


def test_the_runners_flag_chooses_the_rule_and_google_s_is_the_default(tmp_path):
    fixtures = Path(__file__).parent / "fixtures" / "google_bert"
    tokenizer = BertTokenizer.from_vocab_file(fixtures / "vocab.txt", do_lower_case=True)
    positions = {}
    for flag in ["", *(f"--train_answer_span={answer_span}" for answer_span in ANSWER_SPANS)]:
        config, _ = parse_config(
            SPEC,
            [
                "--do_train",
                f"--train_file={fixtures / 'squad' / 'train-v1.1.json'}",
                f"--vocab_file={fixtures / 'vocab.txt'}",
                f"--bert_config_file={tmp_path / 'bert_config.json'}",
                f"--output_dir={tmp_path / 'run'}",
                "--max_seq_length=64",
                "--doc_stride=32",
                "--max_query_length=16",
                *([flag] if flag else []),
            ],
        )
        train = read(config.task, tokenizer, lambda line: None).train
        positions[flag] = torch.stack([train["start_positions"], train["end_positions"]])
    google, characters = positions["--train_answer_span=google"], positions["--train_answer_span=characters"]
    assert torch.equal(positions[""], google) and not torch.equal(google, characters)


def google_windows(num_tokens, budget, stride):
    """Google's run_squad doc_spans loop, as written there."""
    spans, start = [], 0
    while start < num_tokens:
        length = min(num_tokens - start, budget)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, stride)
    return spans


def google_is_max_context(spans, index, position):
    best_score, best_index = None, None
    for number, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, number
    return index == best_index


@pytest.mark.parametrize("max_seq_length, doc_stride", [(16, 3), (16, 5), (20, 128), (24, 7)])
def test_windows_cover_the_context_like_googles_and_answers_outside_point_at_cls(tokenizer, max_seq_length, doc_stride):
    words = [
        random.Random(seed).choice(["a", "big", "dog", "barks", "at", "night", "in", "new", "york"])
        for seed in range(40)
    ]
    context = " ".join(words)
    answer_word = 27
    start = len(" ".join(words[:answer_word])) + 1
    answer = " ".join(words[answer_word : answer_word + 2])
    question = "who is it ?"  # 4 tokens
    train = convert_examples(
        [example(context, answer, start, question)], tokenizer, max_seq_length, doc_stride, 8, training=True
    )
    predict = convert_examples(
        [example(context, answer, start, question)], tokenizer, max_seq_length, doc_stride, 8, training=False
    )
    spans = google_windows(len(words), max_seq_length - 4 - 3, doc_stride)
    assert len(train) == len(predict) == len(spans)
    for row, (span_start, length) in enumerate(spans):
        ids = train.inputs["input_ids"][row]
        assert tokenizer.convert_ids_to_tokens(ids[6 : 6 + length].tolist()) == words[span_start : span_start + length]
        assert ids[6 + length] == tokenizer.sep_id and int(train.inputs["attention_mask"][row].sum()) == 7 + length
        assert train.inputs["token_type_ids"][row].tolist() == [0] * 6 + [1] * (length + 1) + [0] * (
            max_seq_length - 7 - length
        )
        inside = span_start <= answer_word and answer_word + 1 < span_start + length
        positions = (int(train.inputs["start_positions"][row]), int(train.inputs["end_positions"][row]))
        assert positions == ((6 + answer_word - span_start, 7 + answer_word - span_start) if inside else (0, 0))
        offsets = predict.token_offsets[row]
        assert (offsets[:6] == -1).all() and (offsets[6 + length :] == -1).all()
        assert [context[a:b] for a, b in offsets[6 : 6 + length]] == words[span_start : span_start + length]
        expected = [google_is_max_context(spans, row, span_start + i) for i in range(length)]
        assert predict.max_context[row, 6 : 6 + length].tolist() == expected
        assert not predict.max_context[row, :6].any()
    assert any(train.inputs["start_positions"] > 0) and any(train.inputs["start_positions"] == 0)


def test_questions_are_cut_and_unanswerable_questions_point_at_cls(tokenizer):
    long_question = " ".join(["what"] * 20)
    features = convert_examples(
        [example("a big dog", None, question=long_question)], tokenizer, 16, 4, 5, training=True
    )
    ids = features.inputs["input_ids"][0]
    assert tokenizer.convert_ids_to_tokens(ids[:7].tolist()) == ["[CLS]"] + ["what"] * 5 + ["[SEP]"]
    assert (int(features.inputs["start_positions"][0]), int(features.inputs["end_positions"][0])) == (0, 0)


def test_examples_share_tokenized_contexts_and_keep_their_order(tokenizer):
    examples = [
        example("a big dog barks", "dog", question_id="1"),
        example("at night", "night", question_id="2"),
        example("a big dog barks", "barks", question_id="3"),
    ]
    features = convert_examples(examples, tokenizer, 16, 4, 4, training=True)
    assert features.example_index.tolist() == [0, 1, 2]
    assert [answer_tokens(features, tokenizer, row) for row in range(3)] == [["dog"], ["night"], ["barks"]]


def test_too_short_a_sequence_is_refused(tokenizer):
    with pytest.raises(ValueError, match="must exceed max_query_length"):
        convert_examples([example("a dog", "dog")], tokenizer, 10, 4, 7, training=True)


def logits_for(features, spans, length):
    """Start/end logits: 0 everywhere, and for each (row, start, end, value) value at start and at end."""
    starts = np.zeros((len(features), length))
    ends = np.zeros((len(features), length))
    for row, start, end, value in spans:
        starts[row, start] += value
        ends[row, end] += value
    return starts, ends


def test_answer_text_comes_from_the_context_not_from_word_pieces(tokenizer):
    context = "Le Café  Müller est   ouvert, un-believable!"
    examples = [example(context, question="who ?")]
    features = convert_examples(examples, tokenizer, 32, 8, 8, training=False)
    # [CLS] who ? [SEP] le cafe muller ... : context tokens start at row position 4
    tokens = tokenizer.convert_ids_to_tokens(features.inputs["input_ids"][0].tolist())
    cafe, ouvert = tokens.index("cafe"), tokens.index("ouvert")
    starts, ends = logits_for(features, [(0, cafe, ouvert, 5.0)], 32)
    predictions = postprocess(examples, features, starts, ends, n_best_size=5, max_answer_length=10)
    assert predictions.answers["q"] == "Café  Müller est   ouvert"
    nbest = predictions.nbest["q"]
    assert nbest[0]["text"] == "Café  Müller est   ouvert" and nbest[0]["start_logit"] == 5.0
    assert [entry["probability"] for entry in nbest] == [1.0] and len(nbest) == 1  # the one span in the context

    # A second span, "Müller", of logit 2: four spans in all, of scores 5+5, 5+2, 2+5 and 2+2; their probabilities
    # are the softmax of those (Google's n-best probabilities).
    muller = tokens.index("muller")
    starts, ends = logits_for(features, [(0, cafe, ouvert, 5.0), (0, muller, muller, 2.0)], 32)
    nbest = postprocess(examples, features, starts, ends, n_best_size=5, max_answer_length=10).nbest["q"]
    assert [entry["text"] for entry in nbest] == [
        "Café  Müller est   ouvert",
        "Café  Müller",
        "Müller est   ouvert",
        "Müller",
    ]
    weights = [math.exp(10), math.exp(7), math.exp(7), math.exp(4)]
    assert [entry["probability"] for entry in nbest] == pytest.approx([weight / sum(weights) for weight in weights])


@pytest.mark.parametrize(
    "context, answer",
    [
        ("the Cafe\u0301 is big", "Cafe\u0301"),  # a decomposed accent: the mark is stripped, and kept in the answer
        ("the Cafe\u0301. is big", "Cafe\u0301"),  # before punctuation
        ("the cafe\u200b\u0301 is big", "cafe\u200b\u0301"),  # a zero-width space, then a mark
        ("the cafe\x07 is big", "cafe\x07"),  # an ASCII control character
        ("the \u0301cafe is big", "\u0301cafe"),  # a mark opening a word goes with the token after it
        ("\u200b\u0301cafe is big", "\u200b\u0301cafe"),  # at the start of the context
        ("the dog\u0301 \u0301cafe is big", "\u0301cafe"),  # the mark after "dog" stays with "dog"
    ],
)
def test_an_answer_keeps_the_characters_the_normalizer_deletes_around_its_tokens(tokenizer, context, answer):
    # Google answers with whole original words here ("GNU Cafe\u0301" scores EM 100 against the same gold text).
    examples = [example(context, question="who ?")]
    features = convert_examples(examples, tokenizer, 32, 8, 8, training=False)
    tokens = tokenizer.convert_ids_to_tokens(features.inputs["input_ids"][0].tolist())
    starts, ends = logits_for(features, [(0, tokens.index("cafe"), tokens.index("cafe"), 5.0)], 32)
    assert postprocess(examples, features, starts, ends).answers["q"] == answer
    # The training side maps the same answer to the same token.
    training = convert_examples([example(context, answer)], tokenizer, 32, 8, 8, training=True)
    assert answer_tokens(training, tokenizer) == ["cafe"]


@pytest.mark.parametrize(
    "context, first, last, google, exact",
    [
        # Google joins the span's words with single spaces.
        (
            "Le Café  Müller est   ouvert, un-believable!",
            "cafe",
            "ouvert",
            "Café Müller est ouvert",
            "Café  Müller est   ouvert",
        ),
        # Where stripping an accent changes a word's length, Google gives back the whole words, punctuation included.
        ("the (Cafe\u0301) is big", "cafe", "cafe", "(Cafe\u0301)", "Cafe\u0301"),
        # Otherwise it trims the words to the predicted tokens.
        ("the big dog's cafe.", "dog", "dog", "dog", "dog"),
        # A no-break space is inside a word for Google's run_squad, and its length test fails on it too.
        ("the dog barks\u00a0a night", "a", "a", "barks\u00a0a", "a"),
        # It takes the first place the tokens' text occurs in the words: the "a" of "Cafe", not the "A" predicted.
        ("the Cafe-A is big", "a", "a", "a", "A"),
    ],
)
def test_googles_answer_text(tokenizer, context, first, last, google, exact):
    examples = [example(context, question="who ?")]
    features = convert_examples(examples, tokenizer, 32, 8, 8, training=False)
    tokens = tokenizer.convert_ids_to_tokens(features.inputs["input_ids"][0].tolist())
    starts, ends = logits_for(features, [(0, tokens.index(first), tokens.index(last), 5.0)], 32)
    assert postprocess(examples, features, starts, ends, answer_text=GoogleAnswerText(tokenizer)).answers["q"] == google
    assert postprocess(examples, features, starts, ends).answers["q"] == exact


def test_spans_must_be_ordered_short_inside_the_context_and_max_context(tokenizer):
    context = "a big dog barks at night in new york"
    examples = [example(context, question="who ?")]
    features = convert_examples(examples, tokenizer, 32, 8, 8, training=False)
    tokens = tokenizer.convert_ids_to_tokens(features.inputs["input_ids"][0].tolist())
    position = {token: tokens.index(token) for token in ("who", "a", "dog", "night", "york")}
    starts, ends = np.zeros((1, 32)), np.zeros((1, 32))
    starts[0, [position["who"], position["night"], position["a"]]] = 20.0, 10.0, 1.0
    ends[0, [position["who"], position["dog"], position["york"], position["night"]]] = 20.0, 10.0, 8.0, 2.0
    # in the question: 40; "night ... dog" ends before it starts: 20; "night in new york" is 4 tokens: 18
    nbest = postprocess(examples, features, starts, ends, n_best_size=20, max_answer_length=3).nbest["q"]
    assert [(entry["text"], entry["start_logit"] + entry["end_logit"]) for entry in nbest[:2]] == [
        ("night", 12.0),
        ("a big dog", 11.0),
    ]
    answers = postprocess(examples, features, starts, ends, n_best_size=20, max_answer_length=4).answers
    assert answers["q"] == "night in new york"


def test_the_best_span_across_windows_wins_and_only_from_its_max_context_window(tokenizer):
    words = "a big dog barks at night in new york a big dog barks at night".split()
    context = " ".join(words)
    examples = [example(context, question="who ?")]
    features = convert_examples(examples, tokenizer, 12, 3, 8, training=False)  # 7 context tokens per window
    assert len(features) > 2
    starts = np.full((len(features), 12), -5.0)
    ends = np.full((len(features), 12), -5.0)
    # "night" (word 5) in every window holding it, with a higher score in a window that is not its max context
    for row in range(len(features)):
        for position in range(12):
            a, b = features.token_offsets[row, position]
            if a >= 0 and context[a:b] == "night" and a < 30:
                starts[row, position] = ends[row, position] = 9.0 if not features.max_context[row, position] else 4.0
    predictions = postprocess(examples, features, starts, ends, n_best_size=3, max_answer_length=5)
    assert predictions.answers["q"] == "night"
    assert predictions.nbest["q"][0]["start_logit"] == 4.0  # the max-context window's score


def test_version_2_null_score_against_the_best_span(tokenizer):
    examples = [example("a big dog barks", question="who ?", question_id="x")]
    features = convert_examples(examples, tokenizer, 16, 4, 4, training=False)
    tokens = tokenizer.convert_ids_to_tokens(features.inputs["input_ids"][0].tolist())
    dog = tokens.index("dog")
    starts, ends = logits_for(features, [(0, 0, 0, 2.0), (0, dog, dog, 3.0)], 16)  # null 4.0, span 6.0
    predictions = postprocess(examples, features, starts, ends, version_2=True)
    assert predictions.answers == {"x": "dog"} and predictions.null_odds == {"x": pytest.approx(-2.0)}
    assert "" in [entry["text"] for entry in predictions.nbest["x"]]
    assert postprocess(examples, features, starts, ends, version_2=True, null_score_diff_threshold=-2.5).answers == {
        "x": ""
    }
    assert postprocess(examples, features, starts, ends).null_odds is None


def test_no_valid_span_gives_googles_placeholder_or_no_answer(tokenizer):
    examples = [example("dog", question="who ?")]
    features = convert_examples(examples, tokenizer, 8, 4, 4, training=False)
    starts, ends = np.zeros((1, 8)), np.zeros((1, 8))
    ends[0, 4] = -1.0  # the only context token: end there ranks last, so n_best_size 1 never reaches it
    assert postprocess(examples, features, starts, ends, n_best_size=1).answers == {"q": "empty"}
    v2 = postprocess(examples, features, starts, ends, n_best_size=1, version_2=True)
    assert v2.answers == {"q": ""} and v2.null_odds["q"] > 1e300


# ---- reading files --------------------------------------------------------------------------------------------


def squad_file(tmp_path, paragraphs, version="1.1"):
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}))
    return path


def qa(question_id, text=None, start=None, **extra):
    answers = [] if text is None else [{"text": text, "answer_start": start}]
    return {"id": question_id, "question": "who ?", "answers": answers, **extra}


def test_read_examples_keeps_order_first_answer_and_impossible(tmp_path):
    path = squad_file(
        tmp_path,
        [
            {"context": "a big dog", "qas": [qa("1", "big", 2), qa("2", is_impossible=True)]},
            {"context": "barks", "qas": [qa("3", "barks", 0)]},
        ],
        version="v2.0",
    )
    examples = read_examples(path, training=True, version_2=True)
    assert [(e.question_id, e.answer_text, e.answer_start, e.is_impossible) for e in examples] == [
        ("1", "big", 2, False),
        ("2", "", -1, True),
        ("3", "barks", 0, False),
    ]
    # for prediction the answers are not read (the scorer reads them), so dev files need no answer_start
    assert [e.answer_start for e in read_examples(path, training=False, version_2=False)] == [-1, -1, -1]


def test_training_skips_the_answers_googles_reader_cannot_find_unless_kept(tmp_path):
    # Google's read_squad_examples splits the context at " \t\r\n\u202f" only and the answer at every Unicode space
    # (str.split), then looks for the answer's words in the context's words it spans: an answer holding a no-break
    # or ideographic space is not found, and the question is skipped. An answer inside a word is found.
    def at(context, question_id, text):
        return qa(question_id, text, context.index(text))

    first, second, third = (
        "the dog barks\u00a0a night",
        "北京\u3000大学 is big",
        "a big\u202fdog, an unbelievable dog\t barks",
    )
    path = squad_file(
        tmp_path,
        [
            {
                "context": first,
                "qas": [
                    at(first, "nbsp", "barks\u00a0a"),
                    at(first, "word", "a night"),
                    qa("none", is_impossible=True),
                ],
            },
            {"context": second, "qas": [at(second, "ideographic", "北京\u3000大学")]},
            {
                "context": third,
                "qas": [
                    at(third, "narrow", "big\u202fdog"),
                    at(third, "inside", "believ"),
                    at(third, "tab", "dog\t barks"),
                ],
            },
        ],
        version="v2.0",
    )
    warnings = []
    examples = read_examples(path, training=True, version_2=True, warn=warnings.append)
    assert [example.question_id for example in examples] == ["word", "none", "narrow", "inside", "tab"]
    assert warnings == [
        f"warning: {path}: skipped 2 training questions as Google's run_squad skips them, their "
        "answer text not found in the context's whitespace-split words (its \"Could not find "
        'answer"; --keep_unaligned_answers trains on them): nbsp, ideographic'
    ]
    kept = read_examples(path, training=True, version_2=True, keep_unaligned_answers=True, warn=warnings.append)
    assert [example.question_id for example in kept] == [
        "nbsp",
        "word",
        "none",
        "ideographic",
        "narrow",
        "inside",
        "tab",
    ]
    assert len(read_examples(path, training=False, version_2=True, warn=warnings.append)) == 7
    assert len(warnings) == 1


def test_a_file_whose_every_answer_is_skipped_says_so(tmp_path):
    path = squad_file(tmp_path, [{"context": "a big\u00a0dog", "qas": [qa("q1", "big\u00a0dog", 2)]}])
    with pytest.raises(SquadDataError, match="no questions left to train on"):
        read_examples(path, training=True, version_2=False, warn=lambda line: None)


@pytest.mark.parametrize(
    "paragraphs, message",
    [
        (
            [{"context": "a big dog", "qas": [qa("q7", "big", 3)]}],
            "question q7: answer_start 3 points at 'ig ' in the context, not at the answer text 'big'",
        ),
        ([{"context": "   ", "qas": [qa("q8", "big", 2)]}], "the paragraph of question q8: empty context"),
        ([{"context": "a big dog", "qas": [{"id": "q9", "answers": []}]}], "question q9 has no 'question' field"),
        (
            [{"context": "a big dog", "qas": [{"id": "q10", "question": "?", "answers": [{"text": "big"}]}]}],
            "an answer of question q10 has no 'answer_start' field",
        ),
        ([{"context": "a big dog", "qas": [qa("q11")]}], "question q11: no answer to train on"),
        (
            [{"context": "a big dog", "qas": [qa("q12", is_impossible=True)]}],
            "question q12: is unanswerable (is_impossible), a SQuAD v2.0 question",
        ),
        (
            [{"context": "a big dog", "qas": [qa("q13", "big", 2), qa("q13", "dog", 6)]}],
            "question q13: the id is used twice",
        ),
        ([{"context": "a big dog", "qas": [qa("q14", "big", "2")]}], "question q14: answer_start is '2'"),
        ([{"qas": [qa("q15", "big", 2)]}], "the paragraph of question q15 has no 'context' field"),
    ],
)
def test_bad_training_files_name_the_file_and_question(tmp_path, paragraphs, message):
    path = squad_file(tmp_path, paragraphs)
    with pytest.raises(SquadDataError) as error:
        read_examples(path, training=True, version_2=False)
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value)


def test_malformed_json_and_empty_files(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"data": [')
    with pytest.raises(SquadDataError, match="broken.json: not JSON"):
        read_examples(path, training=False, version_2=False)
    with pytest.raises(SquadDataError, match="no questions"):
        read_examples(squad_file(tmp_path, []), training=False, version_2=False)
    with pytest.raises(SquadDataError, match="no such file"):
        read_examples(tmp_path / "missing.json", training=False, version_2=False)
