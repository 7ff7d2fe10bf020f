"""Model FLOPs from the config: what MFU counts, in the training loop's logs and in the benches.

MFU counts the model's FLOPs, not the hardware's: a recompute model does its forward twice but is credited once, as
in the PaLM paper's definition, so recompute shows up as lower MFU, which is the trade it makes. Only matmuls are
counted (embeddings, softmax, LayerNorm and GELU are a few percent); training is 3x the forward (the backward
computes gradients of both the inputs and the weights). Each sequence counts at its real length, whatever a path
computes on its padding. The peaks MFU divides by are training.devices'.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from bertbench.model.config import IGNORE_INDEX, BertConfig


def attention_forward_flops(config: BertConfig, seq: int) -> int:
    """Matmul FLOPs of one sequence's attention scores (Q K^T) and mix (P V) in all layers: the part that grows
    with the square of the length."""
    return config.num_hidden_layers * 2 * 2 * seq * seq * config.hidden_size


def encoder_forward_flops(config: BertConfig, seq: int) -> int:
    """Matmul FLOPs of one sequence through the encoder: projections, attention scores and mix, feed-forward."""
    h, ffn = config.hidden_size, config.intermediate_size
    dense = config.num_hidden_layers * 2 * seq * (4 * h * h + 2 * h * ffn)
    return dense + attention_forward_flops(config, seq)


def forward_flops(config: BertConfig, kind: str, seq: int, masked_positions: int = 0) -> int:
    """Matmul FLOPs of one sequence's forward, heads included. pretraining: pooler + NSP, and the MLM transform and
    vocab projection on `masked_positions` positions only; finetuning: pooler and a 2-way classifier."""
    h = config.hidden_size
    pooler = 2 * h * h
    if kind == "pretraining":
        heads = pooler + 2 * h * 2 + 2 * masked_positions * (h * h + h * config.vocab_size)
    else:
        heads = pooler + 2 * h * 2
    return encoder_forward_flops(config, seq) + heads


def train_flops(config: BertConfig, kind: str, seq: int, masked_positions: int = 0) -> int:
    """Model FLOPs of one sequence's training step: forward + backward = 3 x forward."""
    return 3 * forward_flops(config, kind, seq, masked_positions)


def batch_train_flops(config: BertConfig, batch: Mapping[str, torch.Tensor]) -> int:
    """Model FLOPs of training on a host batch of a task model's inputs: each sequence at its real length (its
    attention_mask), pre-training's MLM head (a batch with masked_lm_labels) on its real predictions only. A
    sequence's FLOPs are linear in its predictions, so they are summed once per distinct length."""
    input_ids, mask = batch["input_ids"], batch.get("attention_mask")
    lengths = mask.sum(1) if mask is not None else torch.full(input_ids.shape[:1], input_ids.shape[1])
    labels = batch.get("masked_lm_labels")
    kind = "finetuning" if labels is None else "pretraining"
    total = sum(
        count * train_flops(config, kind, length)
        for length, count in zip(*(values.tolist() for values in torch.unique(lengths, return_counts=True)))
    )
    if labels is not None:
        per_prediction = train_flops(config, kind, 1, 1) - train_flops(config, kind, 1)
        total += per_prediction * int((labels != IGNORE_INDEX).sum())
    return total
