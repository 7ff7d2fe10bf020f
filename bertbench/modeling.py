"""Baseline BERT (the original suite's modeling_v0): embeddings, encoder, pooler and task heads.

The maths is Google BERT's (exact erf GELU, LayerNorm eps 1e-12, post-LayerNorm blocks); attention runs through
PyTorch's scaled_dot_product_attention. Module attribute names follow HF transformers, so the state dict of every
class here has HF's names and HF checkpoints load without a name table. No training code lives here; activation
checkpointing is applied from outside by `bertbench.recompute`.
"""

from __future__ import annotations

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

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        seq_length = input_ids.shape[1]
        if seq_length > self.position_embeddings.num_embeddings:
            raise ValueError(f"sequence length {seq_length} exceeds max_position_embeddings="
                             f"{self.position_embeddings.num_embeddings}")
        positions = torch.arange(seq_length, device=input_ids.device)
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

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        query, key, value = (self._split_heads(proj(hidden)) for proj in (self.query, self.key, self.value))
        context = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=self.dropout_prob if self.training else 0.0)
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


@dataclass
class BertModelOutput:
    sequence_output: torch.Tensor  # [batch, seq, hidden]
    pooled_output: torch.Tensor | None  # [batch, hidden]; None without a pooler


class BertModel(nn.Module):
    """The encoder: embeddings, transformer blocks and pooler. Token-level heads (SQuAD) leave the pooler out, as
    HF's do: a parameter that never gets a gradient would break DistributedDataParallel."""

    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        init_weights(self, config.initializer_range)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> BertModelOutput:
        sequence_output = self.encoder(self.embeddings(input_ids, token_type_ids), sdpa_padding_mask(attention_mask))
        pooled_output = None if self.pooler is None else self.pooler(sequence_output)
        return BertModelOutput(sequence_output, pooled_output)


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
        sequence_output = self.bert(input_ids, token_type_ids, attention_mask).sequence_output
        start_logits, end_logits = self.qa_outputs(sequence_output).float().unbind(-1)
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = (F.cross_entropy(start_logits, start_positions) + F.cross_entropy(end_logits, end_positions)) / 2
        return QuestionAnsweringOutput(loss, start_logits, end_logits)

