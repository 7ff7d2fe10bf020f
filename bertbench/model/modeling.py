"""Baseline BERT (the original suite's modeling_v0): embeddings, encoder, pooler and task heads.

The maths is Google BERT's (exact erf GELU, LayerNorm eps 1e-12, post-LayerNorm blocks); attention runs through
PyTorch's scaled_dot_product_attention. Module attribute names follow HF transformers, so the state dict of every
class here has HF's names and HF checkpoints load without a name table. No training code lives here; activation
checkpointing is applied from outside by `bertbench.model.recompute`.

A batch with padding runs unpadded by default (MosaicBERT's unpadding): its real tokens are packed into rows once
(bertbench.model.packing.Packing, made on the host by the model's Packer before the batch reaches the device, or here from
a device mask), the embeddings and blocks run on those rows only, attention runs per sequence by one of
attention.ATTENTION_KERNELS (on a GPU flash attention's variable-length kernel), and the heads get the padded layout
back. Which path and kernel a batch takes is attention.path_rule's measured choice for the device and model.
`set_unpadding(model, False)` gives the padded path of Google's and NVIDIA's code, where every sequence is computed
at the batch's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from bertbench.model.attention import ATTENTION_KERNELS, attention, path_rule
from bertbench.model.config import IGNORE_INDEX, BertConfig
from bertbench.model.packing import Packer, Packing, PathRule

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

    def forward(
        self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, packing: Packing | None = None
    ) -> torch.Tensor:
        """[batch, seq] ids -> [batch, seq, hidden]; with `packing`, [tokens, hidden] for its real tokens only."""
        seq_length = input_ids.shape[1]
        if seq_length > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"sequence length {seq_length} exceeds max_position_embeddings="
                f"{self.position_embeddings.num_embeddings}"
            )
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
            return attention(attention_mask, *projected, self.num_heads, dropout_p)
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
            nn.init.trunc_normal_(sub.weight, std=initializer_range, a=-2 * initializer_range, b=2 * initializer_range)
            if isinstance(sub, nn.Linear) and sub.bias is not None:
                nn.init.zeros_(sub.bias)
        elif isinstance(sub, nn.LayerNorm):
            nn.init.ones_(sub.weight)
            nn.init.zeros_(sub.bias)


def sdpa_padding_mask(attention_mask: torch.Tensor | None, packing: Packing | None = None) -> torch.Tensor | None:
    """[batch, seq] 1/0 padding mask -> [batch, 1, 1, seq] boolean mask that broadcasts over heads and queries, or
    None when nothing is padded: SDPA then skips a pass over every score matrix (and on a GPU may use flash
    attention), as HF does. A host-made `packing` says so without a look at the mask; otherwise the check costs a
    host sync on a GPU, far less than the masked attention it saves. Under torch.compile the mask is always applied:
    a branch on the batch would make a graph for each side of it (or break the graph at every call)."""
    if attention_mask is None:
        return None
    if not torch.compiler.is_compiling():
        if packing is not None and packing.padding_share == 0:
            return None
        if packing is None and bool(attention_mask.all()):
            return None
    return attention_mask.bool()[:, None, None, :]


def set_unpadding(model: nn.Module, unpad: bool = True, attention_kernel: str | None = None) -> nn.Module:
    """Choose the path of every BertModel in `model`: unpadded (batches with padding run on their real tokens only)
    or padded (every sequence computed at the batch's length, Google's and NVIDIA's path); attention_kernel is the
    unpadded path's (ATTENTION_KERNELS; None or auto: the device's measured default, attention.path_rule). Weights
    and state-dict names are the same on both paths. Returns the model."""
    if attention_kernel is not None and attention_kernel not in ATTENTION_KERNELS:
        raise ValueError(f"unknown attention kernel {attention_kernel!r}; choose one of {', '.join(ATTENTION_KERNELS)}")
    for module in model.modules():
        if isinstance(module, BertModel):
            module.unpad, module.attention_kernel = unpad, attention_kernel
    return model


def compute_dtype(module: nn.Module, device: torch.device | str) -> torch.dtype:
    """The dtype a forward of `module` computes its matmuls in here: autocast's, else its weights'."""
    device_type = torch.device(device).type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return next(module.parameters()).dtype


def packer_for(
    model: nn.Module,
    device: torch.device | str,
    dtype: torch.dtype | None = None,
    compiled: bool = False,
    bucketed: bool = False,
) -> Packer | None:
    """The Packer that makes the batches' packings on the host for `model` (its first BertModel's path) computing
    in `dtype` (default: its weights') on `device`; None for a model without a BertModel, which takes no packing."""
    bert = next((module for module in model.modules() if isinstance(module, BertModel)), None)
    if bert is None:
        return None
    return Packer(bert.path_rule(device, dtype or next(bert.parameters()).dtype, compiled), bucketed)


# torch.compiler.disable in torch's lazy form, which imports torch._dynamo at the first call rather than with this
# module, so that an eager run starts without it (see optim._AdamMoments). Its graph break reads "marked as skipped".
@torch._disable_dynamo
def _packing_on_device(bert: BertModel, attention_mask: torch.Tensor, compiled: bool) -> Packing:
    # A mask already on the device: its sizes cost a sync, and torch.compile traces the model around this call.
    device = attention_mask.device
    return Packer(bert.path_rule(device, compute_dtype(bert, device), compiled))(attention_mask)


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

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> BertModelOutput:
        """`packing`: the batch's Packing made on the host by this model's packer (bertbench.training.step passes it);
        without one, a batch with padding is packed here from its mask, at the cost of a host sync."""
        if packing is None and attention_mask is not None and self.unpad:
            packing = _packing_on_device(self, attention_mask, torch.compiler.is_compiling())
        if packing is None or packing.kernel is None or not self.unpad:
            mask = sdpa_padding_mask(attention_mask, packing)
            sequence_output = self.encoder(self.embeddings(input_ids, token_type_ids), mask)
            return BertModelOutput(sequence_output, self._pool(sequence_output))
        packed = self.encoder(self.embeddings(input_ids, token_type_ids, packing), packing)
        sequence_output = packing.unpack(packed)
        return BertModelOutput(sequence_output, self._pool(sequence_output), packing)

    def path_rule(self, device: torch.device | str, dtype: torch.dtype, compiled: bool = False) -> PathRule | None:
        """The path and kernel this model's batches take on `device` computing in `dtype` (None: always padded)."""
        if not self.unpad:
            return None
        return path_rule(device, self.config.head_dim, dtype, self.attention_kernel, compiled)

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

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        masked_lm_positions: torch.Tensor | None = None,
        masked_lm_labels: torch.Tensor | None = None,
        next_sentence_labels: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> PreTrainingOutput:
        """masked_lm_positions [batch, P] selects the positions to predict (the vocab projection, the largest
        matmul of the head, then runs on P positions, not the whole sequence); masked_lm_labels is [batch, P] with
        positions, else [batch, seq]; IGNORE_INDEX marks padding. next_sentence_labels: 0 = is next, 1 = random."""
        encoded = self.bert(input_ids, token_type_ids, attention_mask, packing)
        hidden = encoded.sequence_output
        if masked_lm_positions is not None:
            hidden = torch.gather(hidden, 1, masked_lm_positions[..., None].expand(-1, -1, hidden.shape[-1]))
        mlm_logits = self.cls.predictions(hidden)
        nsp_logits = self.cls.seq_relationship(encoded.pooled_output)
        mlm_loss = nsp_loss = None
        if masked_lm_labels is not None:
            mlm_loss = F.cross_entropy(
                mlm_logits.flatten(0, 1).float(), masked_lm_labels.flatten(), ignore_index=IGNORE_INDEX
            )
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

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> ClassifierOutput:
        pooled = self.bert(input_ids, token_type_ids, attention_mask, packing).pooled_output
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

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        start_positions: torch.Tensor | None = None,
        end_positions: torch.Tensor | None = None,
        packing: Packing | None = None,
    ) -> QuestionAnsweringOutput:
        encoded = self.bert(input_ids, token_type_ids, attention_mask, packing)
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
