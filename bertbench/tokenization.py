"""BERT WordPiece tokenization from a Google vocab.txt, run by HF `tokenizers` (Rust, with character offsets).

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
import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

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


def load_vocab(path: str | os.PathLike) -> dict[str, int]:
    """Read a Google vocab.txt (a directory means its vocab.txt): one token per line, the line's index is its id."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "vocab.txt")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise VocabError(f"{path}: no such vocabulary file") from None
    # An editor's byte-order mark would otherwise glue itself to the first token ("\ufeff[PAD]").
    data = data.removeprefix(codecs.BOM_UTF8)
    if not data.strip():
        raise VocabError(f"{path}: empty vocabulary file")
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
    missing = [token for token in SPECIAL_TOKENS if token not in vocab]
    if missing:
        raise VocabError(f"{path}: missing special token{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return vocab


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
            clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case)
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}", pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, self.cls_id), (SEP, self.sep_id)])
        backend.decoder = decoders.WordPiece()
        # The specials are deliberately not registered as added tokens: Google splits a literal "[MASK]" in the
        # text into "[", "mask", "]" like any other word, and so does this tokenizer.
        self._backend = backend

    @classmethod
    def from_vocab_file(cls, path: str | os.PathLike, do_lower_case: bool = True) -> "BertTokenizer":
        """Load vocab.txt; do_lower_case must match the checkpoint (uncased models True, cased False)."""
        return cls(load_vocab(path), do_lower_case=do_lower_case)

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
            self._backend.encode(text_a, add_special_tokens=False).ids, ids_b, max_seq_length)
        padding = [0] * (max_seq_length - len(input_ids))
        return ModelInputs(input_ids=input_ids + [self.pad_id] * len(padding),
                           token_type_ids=token_type_ids + padding,
                           attention_mask=[1] * len(input_ids) + padding)

    def encode_batch(self, pairs: Sequence[str | tuple[str, str | None]],
                     max_seq_length: int = 128) -> ModelInputs:
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
                encoding_a.ids, next(encodings_b).ids if pair else None, max_seq_length)
            input_ids[row, :len(ids)] = ids
            token_type_ids[row, :len(ids)] = type_ids
            attention_mask[row, :len(ids)] = 1
        return ModelInputs(input_ids, token_type_ids, attention_mask)

    def _check_backend_settings(self) -> None:
        assert self._backend.truncation is None and self._backend.padding is None, \
            "truncation or padding enabled on the backend would override Google's rules"

    def _truncate_and_add_specials(self, ids_a: list[int], ids_b: list[int] | None,
                                   max_seq_length: int) -> tuple[list[int], list[int]]:
        """Input ids and segment ids, unpadded, in the backend template's layout. Built here rather than by
        `Tokenizer.post_process` because truncating an `Encoding` costs ~50x more than slicing ids, and this
        loop is serial Python while tokenization runs on every core."""
        if not ids_b:
            # A second text that tokenizes to nothing ("", spaces, a zero-width space) is no pair, as in Google's
            # run_classifier (`if tokens_b:`): [CLS] A [SEP], not [CLS] A [SEP] [SEP].
            if max_seq_length < 2:
                raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS] and [SEP]")
            ids_a = ids_a[:max_seq_length - 2]
            return [self.cls_id, *ids_a, self.sep_id], [0] * (len(ids_a) + 2)
        if max_seq_length < 3:
            raise ValueError(f"max_seq_length={max_seq_length} leaves no room for [CLS], [SEP] and [SEP]")
        length_a, length_b = truncated_pair_lengths(len(ids_a), len(ids_b), max_seq_length - 3)
        return ([self.cls_id, *ids_a[:length_a], self.sep_id, *ids_b[:length_b], self.sep_id],
                [0] * (length_a + 2) + [1] * (length_b + 1))
