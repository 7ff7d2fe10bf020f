"""Making pre-training instances from a chunk of documents, in create_pretraining_data's worker processes: Google's
create_training_instances (sentence pairs, random next sentences, masks) on token ids, its output as compact ragged
arrays (ChunkInstances) to send back to the writer. start_worker and make_chunk are what a worker runs.
"""

from __future__ import annotations

import array
import os
import random
import signal
from typing import NamedTuple

import numpy as np

from bertbench.tasks.pretraining_data.settings import DataSettings
from bertbench.tasks.tokenization import BertTokenizer, truncated_pair_lengths
from bertbench.training.devices import peak_memory_bytes

# Sentences per call to the tokenizer: enough to keep its threads busy, few enough that the `Encoding` objects
# (offsets and strings besides the ids) stay small.
TOKENIZE_BATCH = 8192


class ChunkInstances(NamedTuple):
    """A chunk's instances in their shuffled order, ragged arrays stored back to back (compact to send between
    processes; the writer pads each row to its bin's width)."""

    tokens: np.ndarray  # C int (int32): every instance's ids, [CLS] A [SEP] B [SEP] with the masks applied
    lengths: np.ndarray  # int32 [n]: tokens of each instance
    a_lengths: np.ndarray  # int32 [n]: tokens of segment A, so the first [SEP] is at a_length + 1
    masked_positions: np.ndarray  # C int (int32), ascending within each instance
    masked_ids: np.ndarray  # C int (int32): the original ids at those positions
    masked_counts: np.ndarray  # int32 [n]
    next_sentence_labels: np.ndarray  # int8 [n]: 1 when B is a random next sentence
    worker_peak_rss: int  # bytes, the peak so far of the process that made them


class InstanceMaker:
    """Google's create_training_instances for one chunk, on token ids. A document is a list of (start, end)
    sentence spans in the chunk's token list, so segments A and B are spans too and are only copied once, into
    the finished instance."""

    def __init__(self, tokenizer: BertTokenizer, settings: DataSettings):
        self.backend = tokenizer.backend
        self.settings = settings
        self.cls_id, self.sep_id, self.mask_id = tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id
        self.vocab_size = tokenizer.vocab_size
        by_id = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
        self.is_subword = [token.startswith("##") for token in by_id]
        self.max_num_tokens = settings.max_seq_length - 3

    def make(self, chunk_index: int, documents: list[list[str]]) -> ChunkInstances:
        tokens, spans = self._tokenize(documents)
        # A string seed is hashed with SHA-512 by `random`, the same in every process and Python run.
        rng = random.Random(f"{self.settings.random_seed}/{chunk_index}")
        rng.shuffle(spans)
        pairs: list[tuple[int, int, int, int, bool]] = []
        for _ in range(self.settings.dupe_factor):
            for document_index in range(len(spans)):
                self._add_pairs(spans, document_index, rng, pairs)
        rng.shuffle(pairs)
        out = _Columns()
        for pair in pairs:
            self._add_instance(tokens, pair, rng, out)
        return out.finish()

    def _tokenize(self, documents: list[list[str]]) -> tuple[list[int], list[list[tuple[int, int]]]]:
        lines = [line for document in documents for line in document]
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets, which only SQuAD needs: ~15% faster.
        encode_batch = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        sentences = (
            encoding.ids
            for start in range(0, len(lines), TOKENIZE_BATCH)
            for encoding in encode_batch(lines[start : start + TOKENIZE_BATCH], add_special_tokens=False)
        )
        tokens: list[int] = []
        spans: list[list[tuple[int, int]]] = []
        for document in documents:
            document_spans = []
            for _, ids in zip(document, sentences):
                if ids:  # as Google's, a line that tokenizes to nothing is no sentence
                    document_spans.append((len(tokens), len(tokens) + len(ids)))
                    tokens.extend(ids)
            if document_spans:
                spans.append(document_spans)
        return tokens, spans

    def _add_pairs(
        self,
        documents: list[list[tuple[int, int]]],
        index: int,
        rng: random.Random,
        pairs: list[tuple[int, int, int, int, bool]],
    ) -> None:
        """Google's create_instances_from_document up to the masking: the (A span, B span, is random) pairs."""
        document = documents[index]
        target = self.max_num_tokens
        if rng.random() < self.settings.short_seq_prob:
            target = rng.randint(2, self.max_num_tokens)
        first = length = i = 0  # the current chunk of sentences is document[first:i + 1]
        while i < len(document):
            length += document[i][1] - document[i][0]
            if i == len(document) - 1 or length >= target:
                count = i - first + 1
                a_sentences = rng.randint(1, count - 1) if count >= 2 else 1
                a_start, a_end = document[first][0], document[first + a_sentences - 1][1]
                is_random = count == 1 or rng.random() < 0.5
                if is_random:
                    for _ in range(10):
                        other = rng.randint(0, len(documents) - 1)
                        if other != index:
                            break
                    random_document = documents[other]
                    start = last = rng.randint(0, len(random_document) - 1)
                    b_target = target - (a_end - a_start)
                    while (
                        last < len(random_document) - 1
                        and random_document[last][1] - random_document[start][0] < b_target
                    ):
                        last += 1
                    b_start, b_end = random_document[start][0], random_document[last][1]
                    i -= count - a_sentences  # put back the sentences B did not use: the next pair starts there
                else:
                    b_start, b_end = document[first + a_sentences][0], document[i][1]
                pairs.append(self._truncate(a_start, a_end, b_start, b_end, rng) + (is_random,))
                first, length = i + 1, 0
            i += 1

    def _truncate(
        self, a_start: int, a_end: int, b_start: int, b_end: int, rng: random.Random
    ) -> tuple[int, int, int, int]:
        """Google's truncate_seq_pair: tokens go from the longer segment, each from its front or back by a coin
        flip, so the number cut from the front is binomial: one draw of random bits stands in for the flips."""
        length_a, length_b = a_end - a_start, b_end - b_start
        keep_a, keep_b = truncated_pair_lengths(length_a, length_b, self.max_num_tokens)
        a_start += rng.getrandbits(length_a - keep_a).bit_count()
        b_start += rng.getrandbits(length_b - keep_b).bit_count()
        return a_start, a_start + keep_a, b_start, b_start + keep_b

    def _add_instance(
        self, tokens: list[int], pair: tuple[int, int, int, int, bool], rng: random.Random, out: _Columns
    ) -> None:
        """Google's create_masked_lm_predictions on [CLS] A [SEP] B [SEP]."""
        a_start, a_end, b_start, b_end, is_random = pair
        instance = [self.cls_id, *tokens[a_start:a_end], self.sep_id, *tokens[b_start:b_end], self.sep_id]
        length_a = a_end - a_start
        segments = ((1, length_a + 1), (length_a + 2, len(instance) - 1))  # positions of A and of B
        settings = self.settings
        to_predict = min(settings.max_predictions_per_seq, max(1, round(len(instance) * settings.masked_lm_prob)))
        if settings.do_whole_word_mask:
            words: list[list[int]] = []
            for start, end in segments:
                for position in range(start, end):
                    if position > start and self.is_subword[instance[position]]:
                        words[-1].append(position)
                    else:
                        words.append([position])
            rng.shuffle(words)
            chosen: list[int] = []
            for word in words:
                if len(chosen) >= to_predict:
                    break
                if len(chosen) + len(word) <= to_predict:  # a word is masked whole or not at all
                    chosen.extend(word)
            positions = sorted(chosen)
        else:
            # Google shuffles all candidates and takes the first `to_predict`: a uniform sample, drawn directly.
            candidates = len(instance) - 3
            picks = rng.sample(range(candidates), min(to_predict, candidates))
            positions = sorted(pick + 1 if pick < length_a else pick + 2 for pick in picks)
        labels = [instance[position] for position in positions]
        for position in positions:
            if rng.random() < 0.8:
                instance[position] = self.mask_id
            elif rng.random() >= 0.5:  # else (half of the other 20%) the token stays as it is
                instance[position] = rng.randrange(self.vocab_size)  # Google: any word of the vocab, uniformly
        out.add(instance, length_a, positions, labels, is_random)


class _Columns:
    """Growing ragged columns of a chunk's instances (array.array: 4 bytes a token, not a Python list's 8+)."""

    def __init__(self):
        self.tokens, self.positions, self.ids = array.array("i"), array.array("i"), array.array("i")
        self.lengths, self.a_lengths, self.counts, self.labels = [], [], [], []

    def add(self, instance: list[int], length_a: int, positions: list[int], ids: list[int], is_random: bool) -> None:
        self.tokens.extend(instance)
        self.positions.extend(positions)
        self.ids.extend(ids)
        self.lengths.append(len(instance))
        self.a_lengths.append(length_a)
        self.counts.append(len(positions))
        self.labels.append(is_random)

    def finish(self) -> ChunkInstances:
        def int32(values: list[int]) -> np.ndarray:
            return np.asarray(values, dtype=np.int32)

        def view(values: array.array) -> np.ndarray:  # no copy: the tokens are the chunk's largest array
            return np.frombuffer(values, dtype=np.intc)

        return ChunkInstances(
            view(self.tokens),
            int32(self.lengths),
            int32(self.a_lengths),
            view(self.positions),
            view(self.ids),
            int32(self.counts),
            np.asarray(self.labels, dtype=np.int8),
            peak_memory_bytes("cpu"),
        )


_MAKER: InstanceMaker | None = None  # a worker process's own


def start_worker(vocab: dict[str, int], settings: DataSettings, threads: int) -> None:
    """A worker process's initializer: its own InstanceMaker, its tokenizer on `threads` threads."""
    # The tokenizer's thread pool would otherwise take every core in every worker.
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    # Ctrl-C is the main process's to handle: it stops the work and removes the partial output.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _MAKER
    _MAKER = InstanceMaker(BertTokenizer(vocab, do_lower_case=settings.do_lower_case), settings)


def make_chunk(chunk_index: int, documents: list[list[str]]) -> ChunkInstances:
    """A worker's task: the instances of chunk `chunk_index`."""
    return _MAKER.make(chunk_index, documents)
