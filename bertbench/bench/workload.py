"""What a bench times: a model size, a step kind, a modeling variant and a precision, on synthetic data.

Every bench (throughput, memory, profile) builds its steps here, so that "BERT-base, pre-training, seq 128,
recompute/selective, bf16" means the same model, batch and step everywhere. The data is random token ids: a step's
cost does not depend on the values, and no file or network is needed.
"""

from __future__ import annotations

import dataclasses
import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from bertbench import optim
from bertbench.config import BertConfig, ConfigError
from bertbench.models import build_model

# Named model shapes; any bert_config.json / HF config.json path works as well.
MODEL_SIZES = {
    "tiny": dict(vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
    "mini": dict(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                 intermediate_size=1024),
    "base": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072),
    "large": dict(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096),
}
# pretraining: BertForPreTraining with MLM on the masked positions only plus NSP (NVIDIA's / MLPerf's step);
# finetuning: sequence classification (GLUE's step).
STEP_KINDS = ("pretraining", "finetuning")
PRECISIONS = ("fp32", "bf16", "fp16")
# Masked positions per sequence, as NVIDIA's phase 1 (seq 128: 20) and phase 2 (seq 512: 80) data has them.
MASKED_SHARE = 0.15625


class BenchError(ValueError):
    """A bench setting or input file a user supplied is unusable; the message names it."""


@dataclass(frozen=True)
class Variant:
    """A modeling module with its recompute policy: "baseline", "full", "selective" or "every-K"."""

    name: str
    modeling: str
    policy: str = "full"
    every_k: int = 2

    @classmethod
    def parse(cls, text: str) -> "Variant":
        if text == "baseline":
            return cls(text, "baseline")
        if text in ("full", "selective"):
            return cls(text, "recompute", text)
        if text.startswith("every-") and text[len("every-"):].isdigit() and int(text[len("every-"):]) >= 1:
            return cls(text, "recompute", "every-k", int(text[len("every-"):]))
        raise BenchError(f"unknown variant {text!r}: use baseline, full, selective or every-K (K >= 1)")


ALL_VARIANTS = ("baseline", "full", "selective", "every-2")


def bert_config(model: str, max_seq_length: int, dropout: float = 0.1) -> BertConfig:
    """A named size (MODEL_SIZES) or a bert_config.json / config.json path, with positions for max_seq_length."""
    if model in MODEL_SIZES:
        values = dict(MODEL_SIZES[model], max_position_embeddings=max(512, max_seq_length),
                      hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
        return BertConfig(**values)
    if not os.path.exists(model):
        raise BenchError(f"unknown model {model!r}: use {', '.join(MODEL_SIZES)} or a bert_config.json path")
    try:
        config = BertConfig.from_json_file(model)
    except ConfigError as error:
        raise BenchError(str(error)) from None
    if max_seq_length > config.max_position_embeddings:
        raise BenchError(f"{model}: max_position_embeddings={config.max_position_embeddings} is shorter than "
                         f"sequence length {max_seq_length}")
    return config


def masked_positions(seq: int) -> int:
    return max(1, round(seq * MASKED_SHARE))


def synthetic_batch(config: BertConfig, kind: str, batch: int, seq: int, device: torch.device | str = "cpu",
                    seed: int = 0) -> dict[str, torch.Tensor]:
    """A full-length batch (no padding) of random ids with the labels of `kind`."""
    generator = torch.Generator().manual_seed(seed)
    values = {"input_ids": torch.randint(1, config.vocab_size, (batch, seq), generator=generator),
              "token_type_ids": (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous(),
              "attention_mask": torch.ones(batch, seq, dtype=torch.long)}
    if kind == "pretraining":
        predictions = masked_positions(seq)
        values["masked_lm_positions"] = torch.stack([torch.randperm(seq, generator=generator)[:predictions]
                                                     for _ in range(batch)])
        values["masked_lm_labels"] = torch.randint(1, config.vocab_size, (batch, predictions), generator=generator)
        values["next_sentence_labels"] = torch.randint(0, 2, (batch,), generator=generator)
    elif kind == "finetuning":
        values["labels"] = torch.randint(0, 2, (batch,), generator=generator)
    else:
        raise BenchError(f"unknown step kind {kind!r}: use {' or '.join(STEP_KINDS)}")
    return {name: tensor.to(device) for name, tensor in values.items()}


def build(config: BertConfig, kind: str, variant: Variant, device: torch.device | str = "cpu") -> nn.Module:
    """The model of a step kind from the variant's modeling module, in training mode, seeded alike for all."""
    torch.manual_seed(0)
    task = "pretraining" if kind == "pretraining" else "classification"
    head = {} if kind == "pretraining" else {"num_labels": 2}
    model = build_model(task, config, variant.modeling, variant.policy, variant.every_k, **head)
    return model.to(device).train()


def autocast(precision: str, device: torch.device | str):
    device_type = torch.device(device).type
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def forward_loss(model: nn.Module, batch: dict[str, torch.Tensor], precision: str,
                 device: torch.device | str) -> torch.Tensor:
    with autocast(precision, device):
        return model(**batch).loss


@dataclass
class TrainStep:
    """One optimizer step (forward, backward, AdamW) of a model on a fixed batch; call it to run a step."""

    model: nn.Module
    batch: dict[str, torch.Tensor]
    precision: str
    device: torch.device
    optimizer: torch.optim.Optimizer = dataclasses.field(init=False)
    scaler: torch.amp.GradScaler = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.device = torch.device(self.device)
        if self.precision not in PRECISIONS:
            raise BenchError(f"unknown precision {self.precision!r}: use {', '.join(PRECISIONS)}")
        self.optimizer = optim.build_optimizer(self.model, "adamw", 1e-5)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")

    def forward(self) -> torch.Tensor:
        return forward_loss(self.model, self.batch, self.precision, self.device)

    def __call__(self) -> None:
        self.scaler.scale(self.forward()).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


def train_step(config: BertConfig, kind: str, variant: Variant, precision: str, batch: int, seq: int,
               device: torch.device | str = "cpu", model: nn.Module | None = None) -> TrainStep:
    """A TrainStep for one setting; pass `model` to reuse one already built for the same kind and variant."""
    device = torch.device(device)
    model = model if model is not None else build(config, kind, variant, device)
    return TrainStep(model, synthetic_batch(config, kind, batch, seq, device), precision, device)

