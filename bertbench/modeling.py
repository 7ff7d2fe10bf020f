"""Baseline BERT (the original suite's modeling_v0): embeddings, encoder, pooler and task heads.

The maths is Google BERT's (exact erf GELU, LayerNorm eps 1e-12, post-LayerNorm blocks); attention runs through
PyTorch's scaled_dot_product_attention. Module attribute names follow HF transformers, so the state dict of every
class here has HF's names and HF checkpoints load without a name table. No training code lives here; activation
checkpointing is applied from outside by `bertbench.recompute`.

A batch with padding runs unpadded by default (MosaicBERT's unpadding): BertModel packs its real tokens into rows
once (Packing), the embeddings and blocks run on those rows only, attention runs per sequence by one of
ATTENTION_KERNELS, and the heads get the padded layout back. `set_unpadding(model, False)` gives the padded path of
Google's and NVIDIA's code, where every sequence is computed at the batch's length.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from bertbench.config import IGNORE_INDEX, BertConfig

_ACTIVATIONS = {
    "gelu": nn.GELU,
    "gelu_new": partial(nn.GELU, approximate="tanh"),
    "gelu_pytorch_tanh": partial(nn.GELU, approximate="tanh"),
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "swish": nn.SiLU,
    "tanh": nn.Tanh,
}


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                packing: Packing | None = None) -> torch.Tensor:
        """[batch, seq] ids -> [batch, seq, hidden]; with `packing`, [tokens, hidden] for its real tokens only."""
        seq_length = input_ids.shape[1]
        if seq_length > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence length {seq_length} exceeds max_position_embeddings="
                             f"{self.position_embeddings.num_embeddings}")
        if packing is None:
            positions = torch.arange(seq_length, device=input_ids.device)
        else:
            input_ids, positions = packing.pack(input_ids), packing.positions
            token_type_ids = None if token_type_ids is None else packing.pack(token_type_ids)
        embeddings = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        if token_type_ids is None:
            embeddings = embeddings + self.token_type_embeddings.weight[0]
        else:
            embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_prob = config.attention_probs_dropout_prob

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_length, _ = x.shape
        return x.view(batch, seq_length, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | Packing | None) -> torch.Tensor:
        """hidden [batch, seq, hidden] with an SDPA mask (or None), or [tokens, hidden] with its Packing."""
        dropout_p = self.dropout_prob if self.training else 0.0
        projected = (proj(hidden) for proj in (self.query, self.key, self.value))
        if isinstance(attention_mask, Packing):
            return attention_mask.attention(*projected, self.num_heads, dropout_p)
        query, key, value = (self._split_heads(x) for x in projected)
        context = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout_p)
        batch, _, seq_length, _ = context.shape
        return context.transpose(1, 2).reshape(batch, seq_length, self.num_heads * self.head_dim)


class BertResidualOutput(nn.Module):
    """Projection back to hidden size, dropout, residual add and post-LayerNorm: closes both sub-layers of a block
    (after attention from hidden_size, after the feed-forward from intermediate_size)."""

    def __init__(self, config: BertConfig, in_features: int):
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertResidualOutput(config, config.hidden_size)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(hidden, attention_mask), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = _ACTIVATIONS[config.hidden_act]()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.activation(self.dense(hidden))


class BertLayer(nn.Module):
    """One transformer block; the unit that recompute policies wrap."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertResidualOutput(config, config.intermediate_size)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        attended = self.attention(hidden, attention_mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden, attention_mask)
        return hidden


class BertPooler(nn.Module):
    """tanh(dense) of the [CLS] vector, the input of the NSP and classification heads."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, sequence_output: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(sequence_output[:, 0]))


def init_weights(module: nn.Module, initializer_range: float) -> None:
    """Google BERT's initialisation: truncated normal (cut at 2 std) weights, zero biases, unit LayerNorm."""
    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(sub.weight, std=initializer_range, a=-2 * initializer_range,
                                  b=2 * initializer_range)
            if isinstance(sub, nn.Linear) and sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)


def sdpa_padding_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """[batch, seq] 1/0 padding mask -> [batch, 1, 1, seq] boolean mask that broadcasts over heads and queries, or
    None when nothing is padded: SDPA then skips a pass over every score matrix (and on a GPU may use flash
    attention), as HF does. The check costs a host sync on a GPU, far less than the masked attention it saves; under
    torch.compile the mask is always applied, since a value-dependent branch would break the graph at every call."""
    if attention_mask is None:
        return None
    if not torch.compiler.is_compiling() and bool(attention_mask.all()):
        return None
    return attention_mask.bool()[:, None, None, :]


class Packing:
    """The real tokens of a padded [batch, seq] batch packed into [tokens] rows: the unpadded path's layout
    (MosaicBERT's unpadding, the packed input of NVIDIA's MLPerf FMHA). Embeddings, dense layers, LayerNorms, GELU
    and dropout run on these rows only; `attention` runs each sequence's attention over its own tokens. The mask may
    have any shape (each row's real tokens are found, not assumed to come first)."""

    def __init__(self, attention_mask: torch.Tensor, kernel: str):
        self.mask = attention_mask.bool()
        self.batch, self.seq_length = self.mask.shape
        self.indices = self.mask.flatten().nonzero().squeeze(1)  # [tokens]: sequence by sequence, in order
        self.positions = self.indices % self.seq_length  # each token's position in its sequence
        self.lengths = self.mask.sum(1)
        self.cu_seqlens = F.pad(self.lengths.cumsum(0), (1, 0))  # [batch + 1]: where each sequence's rows start
        # Host-side sizes, read once here rather than in every layer (a GPU sync each).
        self.length_list = self.lengths.tolist()
        self.max_seqlen = max(self.length_list)
        self.kernel = kernel if kernel != "auto" else \
            "per-sequence" if self.max_seqlen >= PER_SEQUENCE_MIN_LENGTH else "masked"
        if self.kernel == "masked":  # its sizes read the mask: computed here, outside torch.compile's graph
            _ = self.narrow_indices

    @functools.cached_property
    def width(self) -> int:
        """The columns up to every sequence's last real token (the masked kernel's batch length)."""
        return int(self.mask.any(0).nonzero().max()) + 1 if self.max_seqlen else 1

    @functools.cached_property
    def narrow_mask(self) -> torch.Tensor:
        return self.mask[:, :self.width].contiguous()  # a view's stride would be one more guard under compile

    @functools.cached_property
    def narrow_indices(self) -> torch.Tensor:
        """The packed rows' places in [batch, width]."""
        return self.narrow_mask.flatten().nonzero().squeeze(1)

    @property
    def tokens(self) -> int:
        return len(self.indices)

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """[batch, seq, ...] -> [tokens, ...]"""
        return padded.flatten(0, 1).index_select(0, self.indices)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[tokens, ...] -> [batch, seq, ...], zeros at the padding."""
        flat = packed.new_zeros(self.batch * self.seq_length, *packed.shape[1:]).index_copy(0, self.indices, packed)
        return flat.view(self.batch, self.seq_length, *packed.shape[1:])

    def attention(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, num_heads: int,
                  dropout_p: float) -> torch.Tensor:
        """Each sequence's scaled dot-product attention over its own tokens: [tokens, hidden] x 3 -> [tokens,
        hidden], by this packing's kernel (ATTENTION_KERNELS)."""
        return _KERNELS[self.kernel](self, query, key, value, num_heads, dropout_p)


def _heads(rows: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[..., tokens, hidden] -> [..., heads, tokens, head_dim]"""
    return rows.unflatten(-1, (num_heads, -1)).transpose(-3, -2)


def _merge_heads(context: torch.Tensor) -> torch.Tensor:
    return context.transpose(-3, -2).flatten(-2)


def _per_sequence_attention(packing: Packing, query, key, value, num_heads: int, dropout_p: float) -> torch.Tensor:
    """One SDPA call per sequence, no mask: the fastest on a CPU for sequences of 64 tokens or more (BERT-base, batch
    8, real-text lengths: its step 1.08x the masked kernel's)."""
    pieces = zip(*(x.split(packing.length_list) for x in (query, key, value)))
    return torch.cat([_merge_heads(F.scaled_dot_product_attention(*(_heads(x, num_heads) for x in qkv),
                                                                   dropout_p=dropout_p)) for qkv in pieces])


def _nested_attention(packing: Packing, query, key, value, num_heads: int, dropout_p: float) -> torch.Tensor:
    """SDPA on jagged nested tensors: one call for the batch, which CUDA runs with flash or memory-efficient
    attention's variable-length kernels, without padding."""
    offsets = packing.cu_seqlens

    def nested(rows):
        return torch.nested.nested_tensor_from_jagged(rows.unflatten(-1, (num_heads, -1)), offsets,
                                                      max_seqlen=packing.max_seqlen).transpose(1, 2)

    context = F.scaled_dot_product_attention(nested(query), nested(key), nested(value), dropout_p=dropout_p)
    return context.transpose(1, 2).values().flatten(1)


def _masked_attention(packing: Packing, query, key, value, num_heads: int, dropout_p: float) -> torch.Tensor:
    """Rows scattered back to [batch, longest sequence], SDPA with the padding mask, packed again (MosaicBERT's
    path without flash attention): no host-side sizes, so torch.compile traces it as one graph."""
    rows = packing.batch * packing.width

    def padded(x):
        flat = x.new_zeros(rows, x.shape[-1]).index_copy(0, packing.narrow_indices, x)
        return _heads(flat.view(packing.batch, packing.width, -1), num_heads)

    context = F.scaled_dot_product_attention(padded(query), padded(key), padded(value),
                                             attn_mask=packing.narrow_mask[:, None, None, :], dropout_p=dropout_p)
    return _merge_heads(context).flatten(0, 1).index_select(0, packing.narrow_indices)


def _block_diagonal_attention(packing: Packing, query, key, value, num_heads: int,
                              dropout_p: float) -> torch.Tensor:
    """All packed rows as one sequence under a block-diagonal mask: each token attends to its own sequence only."""
    sequence = torch.repeat_interleave(packing.lengths)
    mask = sequence[:, None] == sequence[None, :]
    return _merge_heads(F.scaled_dot_product_attention(*(_heads(x, num_heads) for x in (query, key, value)),
                                                       attn_mask=mask, dropout_p=dropout_p))


_KERNELS = {"per-sequence": _per_sequence_attention, "nested": _nested_attention, "masked": _masked_attention,
            "block-diagonal": _block_diagonal_attention}
# "auto": per-sequence for a batch whose longest sequence has at least PER_SEQUENCE_MIN_LENGTH tokens, masked for a
# shorter one, whose sequences' attention is too small to pay for a call each. On the 2-core CPU (fine-tuning step,
# docs/results/cpu-2core/unpadded): at 128 tokens per-sequence ran 1.57-1.87x the padded path's seq/s and masked
# 1.18-1.73x (BERT-tiny to base, batch 8-32); at 48 (the built-in SQuAD's model, batch 32) per-sequence 0.78-0.97x
# and masked 1.02-1.17x.
ATTENTION_KERNELS = ("auto", *_KERNELS)
PER_SEQUENCE_MIN_LENGTH = 64


def default_attention_kernel(device: torch.device | str, compiled: bool | None = None) -> str:
    """The unpadded path's attention on `device`: auto on a CPU (per-sequence SDPA or masked, measured fastest, see
    _KERNELS), nested tensors (flash varlen) on a GPU; under torch.compile (`compiled`, default: whether this runs
    under it), masked."""
    if torch.compiler.is_compiling() if compiled is None else compiled:
        return "masked"
    return "auto" if torch.device(device).type == "cpu" else "nested"


# Below this share of padding a batch runs padded: packing and per-sequence attention cost more than the padding
# they skip (measured in docs/results/cpu-2core/unpadded).
MIN_PADDING_SHARE = 0.1


def worth_unpadding(attention_mask: torch.Tensor) -> bool:
    """Whether a batch with padding gains from the unpadded path. Under torch.compile always (a value-dependent
    branch would break the graph at every call)."""
    if torch.compiler.is_compiling():
        return True
    return float(attention_mask.sum()) <= (1 - MIN_PADDING_SHARE) * attention_mask.numel()


@torch.compiler.disable
def _packing(attention_mask: torch.Tensor, kernel: str) -> Packing:
    # Its sizes depend on the mask's values: torch.compile traces the model around it, not through it.
    return Packing(attention_mask, kernel)


def set_unpadding(model: nn.Module, unpad: bool = True, attention_kernel: str | None = None) -> nn.Module:
    """Choose the path of every BertModel in `model`: unpadded (batches with padding run on their real tokens only)
    or padded (every sequence computed at the batch's length, Google's and NVIDIA's path); attention_kernel is the
    unpadded path's (ATTENTION_KERNELS; None: the device's default). Weights and state-dict names are the same on
    both paths. Returns the model."""
    if attention_kernel is not None and attention_kernel not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {attention_kernel!r}; choose one of {', '.join(ATTENTION_KERNELS)}")
    for module in model.modules():
        if isinstance(module, BertModel):
            module.unpad, module.attention_kernel = unpad, attention_kernel
    return model


@dataclass
class BertModelOutput:
    sequence_output: torch.Tensor  # [batch, seq, hidden]; zeros at the padding on the unpadded path
    pooled_output: torch.Tensor | None  # [batch, hidden]; None without a pooler
    packing: Packing | None = None  # the unpadded path's layout; None when the batch ran padded


class BertModel(nn.Module):
    """The encoder: embeddings, transformer blocks and pooler. Token-level heads (SQuAD) leave the pooler out, as
    HF's do: a parameter that never gets a gradient would break DistributedDataParallel.

    A batch with padding runs unpadded (see Packing and set_unpadding): the embeddings and blocks see its real tokens
    only, and the sequence output is put back in the padded layout, with zeros at the padding, for the heads. Real
    tokens attend to real tokens only on either path, so their outputs are the padded path's; the padding's own
    outputs, which nothing reads but the SQuAD loss (and a pooler whose position 0 is padding, which BERT's inputs,
    starting with [CLS], never have), are not computed."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        self.unpad = True
        self.attention_kernel: str | None = None
        init_weights(self, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> BertModelOutput:
        mask = sdpa_padding_mask(attention_mask)
        if mask is None or not self.unpad or not worth_unpadding(attention_mask):
            sequence_output = self.encoder(self.embeddings(input_ids, token_type_ids), mask)
            return BertModelOutput(sequence_output, self._pool(sequence_output))
        packing = _packing(attention_mask, self.attention_kernel or default_attention_kernel(input_ids.device))
        packed = self.encoder(self.embeddings(input_ids, token_type_ids, packing), packing)
        sequence_output = packing.unpack(packed)
        return BertModelOutput(sequence_output, self._pool(sequence_output), packing)

    def _pool(self, sequence_output: torch.Tensor) -> torch.Tensor | None:
        return None if self.pooler is None else self.pooler(sequence_output)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = _ACTIVATIONS[config.hidden_act]()
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.activation(self.dense(hidden)))


class BertLMPredictionHead(nn.Module):
    """Masked-LM head; its decoder weight is the word-embedding matrix (tied, as in Google BERT)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.decoder.bias = self.bias

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.transform(hidden))


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None  # mlm_loss + nsp_loss, of those whose labels were given
    mlm_logits: torch.Tensor  # [batch, num_positions, vocab] when positions are given, else [batch, seq, vocab]
    nsp_logits: torch.Tensor  # [batch, 2]
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None


class BertForPreTraining(nn.Module):
    """Masked-LM + next-sentence-prediction pre-training model."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        # Not the decoder: its weight is the word-embedding matrix, initialised by BertModel already.
        init_weights(self.cls.predictions.transform, config.initializer_range)
        init_weights(self.cls.seq_relationship, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, masked_lm_positions: torch.Tensor | None = None,
                masked_lm_labels: torch.Tensor | None = None,
                next_sentence_labels: torch.Tensor | None = None) -> PreTrainingOutput:
        """masked_lm_positions [batch, P] selects the positions to predict (the vocab projection, the largest
        matmul of the head, then runs on P positions, not the whole sequence); masked_lm_labels is [batch, P] with
        positions, else [batch, seq]; IGNORE_INDEX marks padding. next_sentence_labels: 0 = is next, 1 = random."""
        encoded = self.bert(input_ids, token_type_ids, attention_mask)
        hidden = encoded.sequence_output
        if masked_lm_positions is not None:
            hidden = torch.gather(hidden, 1, masked_lm_positions[..., None].expand(-1, -1, hidden.shape[-1]))
        mlm_logits = self.cls.predictions(hidden)
        nsp_logits = self.cls.seq_relationship(encoded.pooled_output)
        mlm_loss = nsp_loss = None
        if masked_lm_labels is not None:
            mlm_loss = F.cross_entropy(mlm_logits.flatten(0, 1).float(), masked_lm_labels.flatten(),
                                       ignore_index=IGNORE_INDEX)
        if next_sentence_labels is not None:
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_labels.flatten())
        losses = [loss for loss in (mlm_loss, nsp_loss) if loss is not None]
        return PreTrainingOutput(sum(losses) if losses else None, mlm_logits, nsp_logits, mlm_loss, nsp_loss)


@dataclass
class ClassifierOutput:
    loss: torch.Tensor | None
    logits: torch.Tensor  # [batch, num_labels]; [batch, 1] for regression


class BertForSequenceClassification(nn.Module):
    """Classifier on the pooled [CLS] vector; num_labels=1 makes it a regressor (STS-B) trained with MSE."""

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        pooled = self.bert(input_ids, token_type_ids, attention_mask).pooled_output
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels)
        return ClassifierOutput(loss, logits)


@dataclass
class QuestionAnsweringOutput:
    loss: torch.Tensor | None
    start_logits: torch.Tensor  # [batch, seq]
    end_logits: torch.Tensor  # [batch, seq]


class BertForQuestionAnswering(nn.Module):
    """Span extraction head (SQuAD): a start and an end logit per token."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        init_weights(self.qa_outputs, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> QuestionAnsweringOutput:
        encoded = self.bert(input_ids, token_type_ids, attention_mask)
        logits = self.qa_outputs(encoded.sequence_output).float()
        if encoded.packing is not None:
            # The padded path's span softmax also spans the padding, whose states this path does not compute; a
            # padding position is never an answer, so here it gets no probability.
            logits = logits.masked_fill(~encoded.packing.mask[..., None], torch.finfo(logits.dtype).min)
        start_logits, end_logits = logits.unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(end_logits, end_positions)) / 2
        return QuestionAnsweringOutput(loss, start_logits, end_logits)

