"""BERT WordPiece tokenization from a Google vocab.txt (or an HF tokenizer.json's WordPiece vocabulary), run by HF
`tokenizers` (Rust, with character offsets), and the tokenizer files of an HF directory read and written.

The pipeline reproduces Google's FullTokenizer (BasicTokenizer + WordpieceTokenizer): clean text, pad CJK
characters with spaces, lower-case and strip accents (both or neither, as Google's do_lower_case), split on
whitespace and punctuation, then greedy longest-match-first WordPiece with [UNK] for words over 200 characters.
Pair truncation follows Google's run_classifier `_truncate_seq_pair`, not the `tokenizers` longest-first rule,
which keeps the extra token in B instead of A when both sequences must shrink to an odd total.

A sweep of every code point against Google's Python finds these departures, all inside the Rust normalizer and
all in rare text, so they are left as they are: private-use characters (U+E000-F8FF, planes 15-16) are deleted
where Google keeps them (and so emits [UNK]); U+2B820-2B91F (start of CJK Extension E) are not split into single
tokens; lower-casing maps a word-final capital sigma to "σ" where Python's str.lower gives "ς"; and characters
whose Unicode category changed between Python's and Rust's Unicode versions follow Rust's tables.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

UNK, CLS, SEP, PAD, MASK = "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"
SPECIAL_TOKENS = (UNK, CLS, SEP, PAD, MASK)
MAX_INPUT_CHARS_PER_WORD = 200  # Google's WordpieceTokenizer (HF's default is 100): longer words become [UNK].


class VocabError(ValueError):
    """A vocab.txt a user supplied is unusable; the message names the file and, where there is one, the line."""


class ModelInputs(NamedTuple):
    """The three BERT inputs: lists of ints from `encode`, int64 arrays of shape (batch, length) from `encode_batch`."""

    input_ids: list[int] | np.ndarray
    token_type_ids: list[int] | np.ndarray
    attention_mask: list[int] | np.ndarray


VOCAB_TXT, TOKENIZER_JSON, TOKENIZER_CONFIG = "vocab.txt", "tokenizer.json", "tokenizer_config.json"


def vocab_path(path: str | os.PathLike) -> str:
    """The vocabulary file `path` names: itself, or for a directory its vocab.txt, else its tokenizer.json (an HF
    directory written by transformers 5 has only the latter)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        return path
    txt, tokenizer_json = os.path.join(path, VOCAB_TXT), os.path.join(path, TOKENIZER_JSON)
    return tokenizer_json if not os.path.isfile(txt) and os.path.isfile(tokenizer_json) else txt


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """Read a Google vocab.txt (one token per line, the line's index is its id) or the WordPiece vocabulary of an HF
    tokenizer.json (any file whose text is a JSON object); a directory means its vocab.txt or tokenizer.json."""
    path = vocab_path(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise VocabError(f"{path}: no such vocabulary file") from None
    except IsADirectoryError:
        raise VocabError(f"{path}: a directory with no vocab.txt or tokenizer.json") from None
    # An editor's byte-order mark would otherwise glue itself to the first token ("\ufeff[PAD]").
    data = data.removeprefix(codecs.BOM_UTF8)
    if not data.strip():
        raise VocabError(f"{path}: empty vocabulary file")
    if path.endswith(".json") or data.lstrip().startswith(b"{"):
        document = _json_object(data)
        if document is not None or path.endswith(".json"):  # a vocab.txt may start with "{", but is no JSON
            return _check_specials(path, _tokenizer_json(path, document).vocab)
    # Split on "\n" only, like Google's reader, so that no other Unicode line break inside a token shifts the ids.
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    vocab: dict[str, int] = {}
    for index, raw in enumerate(lines):
        line_number = index + 1
        try:
            token = raw.decode("utf-8").strip()  # Google's load_vocab strips surrounding whitespace.
        except UnicodeDecodeError:
            raise VocabError(f"{path}:{line_number}: not valid UTF-8") from None
        if not token:
            # Google would give "" this id; no text can ever produce it, so the file is more likely damaged.
            raise VocabError(f"{path}:{line_number}: empty line, expected one token per line")
        if token in vocab:
            raise VocabError(f"{path}:{line_number}: duplicate token {token!r}, first on line {vocab[token] + 1}")
        vocab[token] = index
    return _check_specials(path, vocab)


def _check_specials(path: str, vocab: dict[str, int]) -> dict[str, int]:
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise VocabError(f"{path}: missing special token{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return vocab


def _json_object(data: bytes) -> dict | None:
    try:
        document = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return document if isinstance(document, dict) else None


class TokenizerFile(NamedTuple):
    """What an HF tokenizer.json says that bertbench uses: the WordPiece vocabulary, and whether its normalizer
    lower-cases (None: it has no BertNormalizer, so it does not say)."""

    vocab: dict[str, int]
    do_lower_case: bool | None


def read_tokenizer_json(path: str | os.PathLike) -> TokenizerFile:
    """An HF tokenizer.json's WordPiece vocabulary (model.vocab, token -> id) and lower-casing (its BertNormalizer).
    Another model type (BPE, Unigram), ids that are not 0..n-1, or lower-casing without accent stripping (or the
    reverse: Google ties them, and so does bertbench) are a VocabError naming the file."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read().removeprefix(codecs.BOM_UTF8)
    except FileNotFoundError:
        raise VocabError(f"{path}: no such tokenizer file") from None
    return _tokenizer_json(path, _json_object(data))


def _tokenizer_json(path: str, document: dict | None) -> TokenizerFile:
    if document is None:
        raise VocabError(f"{path}: not a JSON object, so not an HF tokenizer.json")
    model = document.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if kind != "WordPiece":
        raise VocabError(f"{path}: model.type is {kind!r}, not 'WordPiece': not a BERT tokenizer")
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise VocabError(f"{path}: model.vocab is not a non-empty object of token -> id")
    ids = list(vocab.values())
    if not all(type(index) is int for index in ids) or sorted(ids) != list(range(len(ids))):
        raise VocabError(f"{path}: model.vocab's ids are not 0 to {len(vocab) - 1}, each once")
    return TokenizerFile(dict(sorted(vocab.items(), key=lambda item: item[1])), _lower_case(path, document))


def _lower_case(path: str, document: dict) -> bool | None:
    """A tokenizer.json normalizer's lower-casing: its BertNormalizer's (also inside a Sequence), else None."""
    normalizer = document.get("normalizer")
    found = [normalizer] if isinstance(normalizer, dict) else []
    while found and found[0].get("type") == "Sequence":
        found = [part for part in found[0].get("normalizers", []) if isinstance(part, dict)] + found[1:]
    bert = next((part for part in found if part.get("type") == "BertNormalizer"), None)
    if bert is None:
        return None
    lowercase = bool(bert.get("lowercase", True))
    strip_accents = bert.get("strip_accents")
    if strip_accents is not None and bool(strip_accents) != lowercase:
        raise VocabError(
            f"{path}: the normalizer has lowercase={str(lowercase).lower()} but "
            f"strip_accents={str(bool(strip_accents)).lower()}; BERT (Google's and bertbench's) strips "
            "accents exactly when it lower-cases"
        )
    return lowercase


class TokenizerSettings(NamedTuple):
    """The tokenizer an HF directory holds: its vocabulary file, and its lower-casing with the file that says it
    (None, None when no file does)."""

    vocab_file: str | None
    do_lower_case: bool | None
    lower_case_from: str | None


def directory_tokenizer(directory: str | os.PathLike) -> TokenizerSettings:
    """What an HF directory says about its tokenizer: vocab.txt (else tokenizer.json) as the vocabulary; lower-casing
    from tokenizer_config.json's do_lower_case (what transformers applies), else tokenizer.json's normalizer."""
    directory = os.fspath(directory)
    vocab_file = vocab_path(directory)
    vocab_file = vocab_file if os.path.isfile(vocab_file) else None
    config_path = os.path.join(directory, TOKENIZER_CONFIG)
    if os.path.isfile(config_path):
        with open(config_path, "rb") as handle:
            settings = _json_object(handle.read())
        if settings is None:
            raise VocabError(f"{config_path}: not a JSON object")
        value = settings.get("do_lower_case")
        if value is not None:
            if not isinstance(value, bool):
                raise VocabError(f"{config_path}: do_lower_case is {value!r}, expected true or false")
            return TokenizerSettings(vocab_file, value, config_path)
    tokenizer_json = os.path.join(directory, TOKENIZER_JSON)
    if os.path.isfile(tokenizer_json):
        lower = read_tokenizer_json(tokenizer_json).do_lower_case
        if lower is not None:
            return TokenizerSettings(vocab_file, lower, tokenizer_json)
    return TokenizerSettings(vocab_file, None, None)


def truncated_pair_lengths(length_a: int, length_b: int, budget: int) -> tuple[int, int]:
    """Lengths Google's `_truncate_seq_pair` leaves: pop from the longer sequence (from B on a tie) until they fit."""
    if length_a + length_b <= budget:
        return length_a, length_b
    shorter = min(length_a, length_b)
    if budget - shorter >= shorter:
        # Popping stops before the longer one shrinks below the shorter one, so only the longer one is cut.
        return (budget - shorter, length_b) if length_a > length_b else (length_a, budget - shorter)
    # Both shrink to equal length, after which popping alternates starting with B, so A keeps the odd token.
    return (budget + 1) // 2, budget // 2


class BertTokenizer:
    """Google BERT tokenization over a `tokenizers.Tokenizer`; build it with `from_vocab_file`."""

    def __init__(self, vocab: dict[str, int], do_lower_case: bool = True):
        self.vocab = vocab
        self.do_lower_case = do_lower_case
        self._id_to_token = {index: token for token, index in vocab.items()}
        self.unk_id, self.cls_id, self.sep_id = vocab[UNK], vocab[CLS], vocab[SEP]
        self.pad_id, self.mask_id = vocab[PAD], vocab[MASK]

        backend = Tokenizer(models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
        # Google ties accent stripping to lower-casing: cased models keep accents.
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
        )
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, self.cls_id), (SEP, self.sep_id)],
        )
        backend.decoder = decoders.WordPiece()
        # The specials are deliberately not registered as added tokens: Google splits a literal "[MASK]" in the
        # text into "[", "mask", "]" like any other word, and so does this tokenizer.
        self._backend = backend

    @classmethod
    def from_vocab_file(cls, path: str | os.PathLike, do_lower_case: bool = True) -> BertTokenizer:
        """Load vocab.txt; do_lower_case must match the checkpoint (uncased models True, cased False)."""
        return cls(load_vocab(path), do_lower_case=do_lower_case)

    def save_hf_files(self, directory: str | os.PathLike, model_max_length: int) -> None:
        """The files with which transformers' AutoTokenizer loads this tokenizer offline (BertTokenizer, fast or
        not): vocab.txt, tokenizer_config.json (do_lower_case kept), special_tokens_map.json and tokenizer.json. In
        tokenizer.json the special tokens are registered as HF registers them, so that HF never splits a literal
        "[MASK]" in the text (this tokenizer, as Google's, does); every other text tokenizes the same."""
        directory = os.fspath(directory)
        with open(os.path.join(directory, VOCAB_TXT), "w", encoding="utf-8", newline="\n") as handle:
            handle.writelines(f"{self._id_to_token[index]}\n" for index in range(len(self.vocab)))
        specials = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK}
        _write_json(
            os.path.join(directory, TOKENIZER_CONFIG),
            {
                "tokenizer_class": "BertTokenizer",
                "do_lower_case": self.do_lower_case,
                "strip_accents": None,
                "tokenize_chinese_chars": True,
                "model_max_length": model_max_length,
                "clean_up_tokenization_spaces": False,
                **specials,
            },
        )
        _write_json(os.path.join(directory, "special_tokens_map.json"), specials)
        exported = Tokenizer.from_str(self._backend.to_str())
        exported.add_special_tokens(
            [
                AddedToken(token, special=True, normalized=False)
                for token in sorted(SPECIAL_TOKENS, key=self.vocab.__getitem__)
            ]
        )
        exported.save(os.path.join(directory, TOKENIZER_JSON))

    @property
    def backend(self) -> Tokenizer:
        """The underlying `tokenizers.Tokenizer`, for offsets (SQuAD). Leave its truncation and padding off:
        `encode` and `encode_batch` apply Google's own rules."""
        return self._backend

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str) -> list[str]:
        """Word pieces of `text`, without [CLS]/[SEP]."""
        return self._backend.encode(text, add_special_tokens=False).tokens

    def basic_tokenize(self, text: str) -> list[str]:
        """Words of `text` before WordPiece: Google's BasicTokenizer (cleaned, lower-cased and accent-stripped as
        do_lower_case says, split on whitespace, punctuation and CJK characters)."""
        normalized = self._backend.normalizer.normalize_str(text)
        return [word for word, _ in self._backend.pre_tokenizer.pre_tokenize_str(normalized)]

    def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
        """Ids of vocabulary tokens; a token not in vocab.txt raises KeyError, as in Google's convert_by_vocab."""
        return [self.vocab[token] for token in tokens]

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._id_to_token[int(index)] for index in ids]

    def encode(self, text_a: str, text_b: str | None = None, max_seq_length: int = 128) -> ModelInputs:
        """[CLS] A [SEP] (B [SEP]) truncated as Google's run_classifier does, padded with [PAD] to max_seq_length.
        A text_b with no tokens makes no second segment."""
        self._check_backend_settings()
        ids_b = None if text_b is None else self._backend.encode(text_b, add_special_tokens=False).ids
        input_ids, token_type_ids = self._truncate_and_add_specials(
            self._backend.encode(text_a, add_special_tokens=False).ids, ids_b, max_seq_length
        )
        padding = [0] * (max_seq_length - len(input_ids))
        return ModelInputs(
            input_ids=input_ids + [self.pad_id] * len(padding),
            token_type_ids=token_type_ids + padding,
            attention_mask=[1] * len(input_ids) + padding,
        )

    def encode_batch(self, pairs: Sequence[str | tuple[str, str | None]], max_seq_length: int = 128) -> ModelInputs:
        """`encode` for many examples (a text, or a (text_a, text_b or None) pair), tokenized in parallel by
        `tokenizers`; returns int64 arrays of shape (len(pairs), max_seq_length)."""
        self._check_backend_settings()
        texts_a: list[str] = []
        texts_b: list[str] = []
        has_b: list[bool] = []
        for example in pairs:
            text_a, text_b = (example, None) if isinstance(example, str) else example
            texts_a.append(text_a)
            has_b.append(text_b is not None)
            if text_b is not None:
                texts_b.append(text_b)
        encodings_a = self._backend.encode_batch(texts_a, add_special_tokens=False)
        encodings_b = iter(self._backend.encode_batch(texts_b, add_special_tokens=False))
        input_ids = np.full((len(texts_a), max_seq_length), self.pad_id, dtype=np.int64)
        token_type_ids = np.zeros((len(texts_a), max_seq_length), dtype=np.int64)
        attention_mask = np.zeros((len(texts_a), max_seq_length), dtype=np.int64)
        for row, (encoding_a, pair) in enumerate(zip(encodings_a, has_b)):
            ids, type_ids = self._truncate_and_add_specials(
                encoding_a.ids, next(encodings_b).ids if pair else None, max_seq_length
            )
            input_ids[row, : len(ids)] = ids
            token_type_ids[row, : len(ids)] = type_ids
            attention_mask[row, : len(ids)] = 1
        return ModelInputs(input_ids, token_type_ids, attention_mask)

    def _check_backend_settings(self) -> None:
        assert self._backend.truncation is None and self._backend.padding is None, (
            "truncation or padding enabled on the backend would override Google's rules"
        )

    def _truncate_and_add_specials(
        self, ids_a: list[int], ids_b: list[int] | None, max_seq_length: int
    ) -> tuple[list[int], list[int]]:
        """Input ids and segment ids, unpadded, in the backend template's layout. Built here rather than by
        `Tokenizer.post_process` because truncating an `Encoding` costs ~50x more than slicing ids, and this
        loop is serial Python while tokenization runs on every core."""
        if not ids_b:
            # A second text that tokenizes to nothing ("", spaces, a zero-width space) is no pair, as in Google's
            # run_classifier (`if tokens_b:`): [CLS] A [SEP], not [CLS] A [SEP] [SEP].
            if max_seq_length < 2:
                raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS] and [SEP]")
            ids_a = ids_a[: max_seq_length - 2]
            return [self.cls_id, *ids_a, self.sep_id], [0] * (len(ids_a) + 2)
        if max_seq_length < 3:
            raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS], [SEP] and [SEP]")
        length_a, length_b = truncated_pair_lengths(len(ids_a), len(ids_b), max_seq_length - 3)
        return (
            [self.cls_id, *ids_a[:length_a], self.sep_id, *ids_b[:length_b], self.sep_id],
            [0] * (length_a + 2) + [1] * (length_b + 1),
        )


def _write_json(path: str, values: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(values, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
