"""bertbench.tasks.tokenization against Google's BERT tokenization.

The reference is transformers' slow, pure-Python port of Google's tokenization.py (`BertTokenizerLegacy` in
transformers 5; `transformers.BertTokenizer` is now itself backed by `tokenizers`). Its BasicTokenizer and
WordpieceTokenizer are called directly, as Google's FullTokenizer does, so that the port's added-token handling
(which keeps a literal "[MASK]" in the text whole, where Google splits it) stays out of the comparison.
"""

import itertools

import numpy as np
import pytest
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from bertbench.tasks.tokenization import BertTokenizer, VocabError, load_vocab, truncated_pair_lengths

VOCAB = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    # punctuation, ASCII symbols Google counts as punctuation, and Unicode punctuation
    ".",
    ",",
    "!",
    "?",
    "'",
    '"',
    "(",
    ")",
    "-",
    "$",
    "^",
    "`",
    "#",
    "@",
    "&",
    "*",
    "~",
    "[",
    "]",
    "¿",
    "¡",
    "«",
    "»",
    "—",
    "…",
    "、",
    "。",
    "「",
    "」",
    # lower-case words and continuation pieces
    "the",
    "quick",
    "brown",
    "fox",
    "jump",
    "##s",
    "##ed",
    "##ing",
    "over",
    "lazy",
    "dog",
    "hello",
    "world",
    "hel",
    "##lo",
    "un",
    "##aff",
    "##able",
    "cafe",
    "naive",
    "que",
    "hola",
    "mask",
    "a",
    "##a",
    "x",
    "5",
    "2",
    # cased and accented forms, reachable only with do_lower_case=False
    "The",
    "Hello",
    "Héllo",
    "Naïve",
    "café",
    "Café",
    "World",
    "Qué",
    # CJK characters, one token each
    "中",
    "国",
    "人",
    "你",
    "好",
    "日",
    "本",
]

TEXTS = [
    "The quick brown fox jumped over the lazy dogs.",
    "Héllo Naïve café",
    "HÉLLO, World! unaffable",
    "¿Qué? ¡Hola! «hola» — hello… 「你好」、中国。",
    "$5^2 `x` #hello @world & *fox* ~dog~",
    "hello中国world 你好人 日本",
    "hello\tworld\nfox\r\ndog\u00a0cafe\u2003naive",
    "hel\x00lo wor\ufffdld ca\u200bfe na\u200dive \ufeffdog fo\x07x ju\x1bmp",
    "unknownword hellozzz zzz jumps jumping",
    "a" * 100 + " " + "a" * 101 + " fox",
    "a" * 200 + " " + "a" * 201 + " fox",
    "hello [MASK] world [CLS]",
    "   ",
    "",
]


def write_vocab(directory, tokens, name="vocab.txt"):
    path = directory / name
    path.write_text("".join(token + "\n" for token in tokens), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    return write_vocab(tmp_path_factory.mktemp("vocab"), VOCAB)


def reference_tokenizer(vocab_file, do_lower_case):
    reference = BertTokenizerLegacy(
        str(vocab_file), do_lower_case=do_lower_case, tokenize_chinese_chars=True, strip_accents=None
    )
    # Google's WordpieceTokenizer makes words over 200 characters [UNK]; the port's default is 100.
    reference.wordpiece_tokenizer.max_input_chars_per_word = 200
    return reference


def google_tokenize(reference, text):
    """Google's FullTokenizer.tokenize: basic tokenization, then WordPiece on each word."""
    return [
        piece
        for word in reference.basic_tokenizer.tokenize(text)
        for piece in reference.wordpiece_tokenizer.tokenize(word)
    ]


def google_truncate_seq_pair(tokens_a, tokens_b, max_length):
    """Google's run_classifier._truncate_seq_pair, verbatim apart from style."""
    while len(tokens_a) + len(tokens_b) > max_length:
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def google_features(reference, text_a, text_b, max_seq_length):
    """input_ids, segment_ids, input_mask as Google's run_classifier.convert_single_example builds them: a text_b
    that is empty (`if example.text_b`) or tokenizes to nothing (`if tokens_b`) makes no second segment."""
    tokens_a = google_tokenize(reference, text_a)
    tokens_b = google_tokenize(reference, text_b) if text_b else None
    if not tokens_b:
        tokens_a = tokens_a[: max_seq_length - 2]
        tokens, segment_ids = ["[CLS]", *tokens_a, "[SEP]"], [0] * (len(tokens_a) + 2)
    else:
        google_truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
        tokens = ["[CLS]", *tokens_a, "[SEP]", *tokens_b, "[SEP]"]
        segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
    input_ids = reference.convert_tokens_to_ids(tokens)
    padding = [0] * (max_seq_length - len(input_ids))
    return input_ids + padding, segment_ids + padding, [1] * len(input_ids) + padding


@pytest.mark.parametrize("do_lower_case", [True, False])
@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_matches_google(vocab_file, do_lower_case, text):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file, do_lower_case=do_lower_case)
    expected = google_tokenize(reference_tokenizer(vocab_file, do_lower_case), text)
    assert tokenizer.tokenize(text) == expected
    assert tokenizer.convert_tokens_to_ids(expected) == [tokenizer.vocab[token] for token in expected]


@pytest.mark.parametrize(
    "do_lower_case, expected",
    [
        (True, ["hello", "naive", "cafe"]),
        (False, ["Héllo", "Naïve", "café"]),
    ],
)
def test_accents_are_stripped_only_when_lower_casing(vocab_file, do_lower_case, expected):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file, do_lower_case=do_lower_case)
    assert tokenizer.tokenize("Héllo Naïve café") == expected


def test_punctuation_splits_words(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    # $ ^ ` are not Unicode punctuation, but Google treats every non-alphanumeric ASCII character as punctuation.
    assert tokenizer.tokenize("$5^2`x") == ["$", "5", "^", "2", "`", "x"]
    assert tokenizer.tokenize("¿qué?«hola»—…") == ["¿", "que", "?", "«", "hola", "»", "—", "…"]


def test_cjk_characters_are_single_tokens(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    assert tokenizer.tokenize("hello中国world你好") == ["hello", "中", "国", "world", "你", "好"]


def test_whitespace_characters_separate_and_invisible_characters_vanish(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    assert tokenizer.tokenize("hello\tworld\nfox\r\ndog\u00a0cafe") == ["hello", "world", "fox", "dog", "cafe"]
    # NUL, U+FFFD, zero-width and other control/format characters are deleted, joining the pieces around them.
    assert tokenizer.tokenize("hel\x00lo wor\ufffdld ca\u200bfe do\x07g") == ["hello", "world", "cafe", "dog"]


def test_word_longer_than_200_characters_is_unknown(vocab_file):
    # Google's max_input_chars_per_word is 200 (HF's WordPiece default, 100, would make "a" * 101 unknown).
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    assert tokenizer.tokenize("a" * 101) == ["a"] + ["##a"] * 100
    assert tokenizer.tokenize("a" * 200) == ["a"] + ["##a"] * 199
    assert tokenizer.tokenize("a" * 201 + " fox") == ["[UNK]", "fox"]


@pytest.mark.parametrize("text_b", ["", "   ", "\u200b", "\t\n", "\x00"])
def test_second_text_without_tokens_is_no_pair(vocab_file, text_b):
    # Google's run_classifier: `if example.text_b` and then `if tokens_b` -- [CLS] a [SEP], not [CLS] a [SEP] [SEP].
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    encoded = tokenizer.encode("the fox", text_b, max_seq_length=6)
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids) == ["[CLS]", "the", "fox", "[SEP]", "[PAD]", "[PAD]"]
    assert encoded.token_type_ids == [0] * 6
    # A is truncated to max - 2, as a single sentence, not max - 3.
    encoded = tokenizer.encode("the quick brown fox", text_b, max_seq_length=5)
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids) == ["[CLS]", "the", "quick", "brown", "[SEP]"]
    batch = tokenizer.encode_batch([("the quick brown fox", text_b)], max_seq_length=5)
    assert batch.input_ids[0].tolist() == encoded.input_ids


def test_word_without_a_full_wordpiece_cover_is_one_unknown(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    assert tokenizer.tokenize("hellozzz unaffable") == ["[UNK]", "un", "##aff", "##able"]


def test_special_ids_and_id_round_trip(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    ids = (tokenizer.pad_id, tokenizer.unk_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id)
    assert ids == (0, 1, 2, 3, 4)
    assert tokenizer.vocab_size == len(VOCAB)
    tokens = tokenizer.tokenize("The lazy dogs jumped")
    assert tokenizer.convert_ids_to_tokens(tokenizer.convert_tokens_to_ids(tokens)) == tokens
    with pytest.raises(KeyError):
        tokenizer.convert_tokens_to_ids(["zzz"])


def test_pair_is_truncated_from_the_longer_side_and_padded(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    # 4 + 5 pieces into a budget of 10 - 3 = 7: Google pops B down to 4, then B again on the tie, so A keeps 4 and
    # B keeps 3 (the `tokenizers` longest-first rule would keep 3 and 4).
    encoded = tokenizer.encode("the quick brown fox", "lazy dogs jumped", max_seq_length=10)
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids) == [
        "[CLS]",
        "the",
        "quick",
        "brown",
        "fox",
        "[SEP]",
        "lazy",
        "dog",
        "##s",
        "[SEP]",
    ]
    assert encoded.token_type_ids == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    assert encoded.attention_mask == [1] * 10

    encoded = tokenizer.encode("the quick brown fox", "lazy dogs jumped", max_seq_length=14)
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids) == [
        "[CLS]",
        "the",
        "quick",
        "brown",
        "fox",
        "[SEP]",
        "lazy",
        "dog",
        "##s",
        "jump",
        "##ed",
        "[SEP]",
        "[PAD]",
        "[PAD]",
    ]
    assert encoded.token_type_ids == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0]
    assert encoded.attention_mask == [1] * 12 + [0] * 2

    encoded = tokenizer.encode("The quick brown fox jumped", max_seq_length=6)
    assert tokenizer.convert_ids_to_tokens(encoded.input_ids) == ["[CLS]", "the", "quick", "brown", "fox", "[SEP]"]
    assert encoded.token_type_ids == [0] * 6


@pytest.mark.parametrize("max_seq_length", [3, 4, 7, 8, 11, 16, 64])
def test_encode_matches_google_run_classifier(vocab_file, max_seq_length):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    reference = reference_tokenizer(vocab_file, do_lower_case=True)
    for text_a, text_b in itertools.product(TEXTS[:6], [None, *TEXTS[:6], *TEXTS[-2:], "\u200b"]):
        expected = google_features(reference, text_a, text_b, max_seq_length)
        assert tuple(tokenizer.encode(text_a, text_b, max_seq_length)) == expected, (text_a, text_b)


def test_truncated_pair_lengths_equal_google_loop():
    for length_a, length_b, budget in itertools.product(range(12), range(12), range(14)):
        tokens_a, tokens_b = list(range(length_a)), list(range(length_b))
        google_truncate_seq_pair(tokens_a, tokens_b, budget)
        assert truncated_pair_lengths(length_a, length_b, budget) == (len(tokens_a), len(tokens_b))


def test_encode_rejects_a_length_without_room_for_specials(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    with pytest.raises(ValueError, match="max_seq_length=2"):
        tokenizer.encode("hello", "world", max_seq_length=2)
    with pytest.raises(ValueError, match="max_seq_length=1"):
        tokenizer.encode("hello", max_seq_length=1)


def test_encode_batch_equals_encode(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    examples = [TEXTS[0], (TEXTS[1], TEXTS[2]), (TEXTS[3], None), (TEXTS[4], TEXTS[5]), "", (TEXTS[6], "")]
    batch = tokenizer.encode_batch(examples, max_seq_length=24)
    for array in batch:
        assert array.dtype == np.int64 and array.shape == (len(examples), 24)
    for row, example in enumerate(examples):
        text_a, text_b = (example, None) if isinstance(example, str) else example
        single = tokenizer.encode(text_a, text_b, max_seq_length=24)
        for batch_array, single_list in zip(batch, single):
            assert batch_array[row].tolist() == single_list


def test_backend_template_lays_out_pairs_like_encode(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file)
    encoding = tokenizer.backend.encode(TEXTS[0], TEXTS[5])
    encoded = tokenizer.encode(TEXTS[0], TEXTS[5], max_seq_length=len(encoding.ids))
    assert (encoded.input_ids, encoded.token_type_ids) == (encoding.ids, encoding.type_ids)


def test_offsets_point_into_the_original_text(vocab_file):
    tokenizer = BertTokenizer.from_vocab_file(vocab_file, do_lower_case=True)
    text = "HÉLLO, Naïve Café-dogs!"
    encoding = tokenizer.backend.encode(text)
    pieces = [(token, text[start:end]) for token, (start, end) in zip(encoding.tokens, encoding.offsets)]
    assert pieces == [
        ("[CLS]", ""),
        ("hello", "HÉLLO"),
        (",", ","),
        ("naive", "Naïve"),
        ("cafe", "Café"),
        ("-", "-"),
        ("dog", "dog"),
        ("##s", "s"),
        ("!", "!"),
        ("[SEP]", ""),
    ]


def test_vocab_file_lines_are_ids(tmp_path):
    path = tmp_path / "vocab.txt"
    # Windows line endings, surrounding blanks and a missing final newline are all what Google's reader accepts.
    path.write_bytes("\r\n".join(["[PAD]", "[UNK] ", " [CLS]", "[SEP]", "[MASK]", "héllo"]).encode("utf-8"))
    vocab = load_vocab(path)
    assert vocab == {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "héllo": 5}
    assert load_vocab(tmp_path) == vocab


@pytest.mark.parametrize(
    "lines, message",
    [
        ([], r"vocab\.txt: empty vocabulary file$"),
        (
            ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "fox", "dog", "fox"],
            r"vocab\.txt:8: duplicate token 'fox', first on line 6$",
        ),
        (["[PAD]", "[UNK]", "[CLS]", "[SEP]"], r"vocab\.txt: missing special token \[MASK\]$"),
        (["[CLS]", "[SEP]", "[UNK]"], r"vocab\.txt: missing special tokens \[PAD\], \[MASK\]$"),
        (["[PAD]", "[UNK]", "", "[CLS]", "[SEP]", "[MASK]"], r"vocab\.txt:3: empty line, expected one token per line$"),
    ],
)
def test_bad_vocab_is_reported_with_file_and_line(tmp_path, lines, message):
    path = write_vocab(tmp_path, lines)
    with pytest.raises(VocabError, match=message) as error:
        BertTokenizer.from_vocab_file(path)
    assert str(error.value).startswith(str(path))
    assert "\n" not in str(error.value)


def test_missing_or_undecodable_vocab_is_reported(tmp_path):
    with pytest.raises(VocabError, match=r"nope\.txt: no such vocabulary file$"):
        load_vocab(tmp_path / "nope.txt")
    path = tmp_path / "vocab.txt"
    path.write_bytes(b"[PAD]\n[UNK]\n\xff\xfe\n")
    with pytest.raises(VocabError, match=r"vocab\.txt:3: not valid UTF-8$"):
        load_vocab(path)
