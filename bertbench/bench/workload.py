"""What a bench times: a model size, a step kind, a modeling variant and a precision, on synthetic data.

Every bench (throughput, memory, profile, scaling) builds its steps here, so that "BERT-base, pre-training, seq 128,
recompute/selective, bf16" means the same model, batch and step everywhere, and the step is the one users train with:
bertbench.train_step.TrainStep with the training defaults (optimizer, schedule, clipping, loss scaling). The data is
random token ids: a step's cost does not depend on the values, and no file or network is needed.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

import torch
from torch import nn

from bertbench.config import IGNORE_INDEX, BertConfig, ConfigError
from bertbench.synthetic import MODEL_SIZES, synthetic_batch
from bertbench.distributed import Distributed
from bertbench.models import build_model
from bertbench.train_step import TrainStep, autocast, fallbacks
from bertbench.training_config import TrainConfig

# pretraining: BertForPreTraining with MLM on the masked positions only plus NSP (NVIDIA's / MLPerf's step);
# finetuning: sequence classification (GLUE's step).
STEP_KINDS = ("pretraining", "finetuning")
PRECISIONS = ("fp32", "bf16", "fp16")


class BenchError(ValueError):
    """A bench setting or input file a user supplied is unusable; the message names it."""


class BenchRunFailed(RuntimeError):
    """A run the bench started (a contender, a data-creation job) failed; the message quotes why."""


@dataclass(frozen=True)
class Variant:
    """A modeling module with its recompute policy: "baseline", "full", "selective" or "every-K"; or "hf", HF
    transformers' BERT with the baseline's weights (the reference users compare against), trained by the same step."""

    name: str
    modeling: str
    policy: str = "full"
    every_k: int = 2

    @classmethod
    def parse(cls, text: str, hf: bool = False) -> "Variant":
        """A variant by name; `hf` only where the bench takes it (the HF model has no runner, no recompute)."""
        if text == "baseline" or text == "hf" and hf:
            return cls(text, text)
        if text == "hf":
            raise BenchError("variant hf is HF transformers' model: compare with it in `bertbench bench throughput "
                             "--variants baseline,hf`")
        if text in ("full", "selective"):
            return cls(text, "recompute", text)
        if text.startswith("every-") and text[len("every-"):].isdigit() and int(text[len("every-"):]) >= 1:
            return cls(text, "recompute", "every-k", int(text[len("every-"):]))
        raise BenchError(f"unknown variant {text!r}: use baseline, full, selective or every-K (K >= 1)"
                         + (" or hf" if hf else ""))

    def runner_values(self) -> dict:
        """The runners' flags that pick this variant, as values by flag name (see runner.run_values)."""
        if self.modeling != "recompute":
            return {"modeling": self.modeling}
        return {"modeling": "recompute", "recompute_policy": self.policy, "recompute_every": self.every_k}


ALL_VARIANTS = ("baseline", "full", "selective", "every-2")
# The schedule length of a bench step: long enough that the learning rate never decays noticeably while timed.
BENCH_STEPS = 10**9


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


def build(config: BertConfig, kind: str, variant: Variant, device: torch.device | str = "cpu") -> nn.Module:
    """The model of a step kind from the variant's modeling module, in training mode, seeded alike for all."""
    torch.manual_seed(0)
    task = "pretraining" if kind == "pretraining" else "classification"
    head = {} if kind == "pretraining" else {"num_labels": 2}
    if variant.modeling == "hf":
        model = HFContender(build_model(task, config, **head), config, kind)
    else:
        model = build_model(task, config, variant.modeling, variant.policy, variant.every_k, **head)
    return model.to(device).train()


class HFContender(nn.Module):
    """HF transformers' BertForPreTraining or BertForSequenceClassification (its default attention, sdpa), holding
    `baseline`'s weights, fed bertbench's batches: pre-training labels become HF's (-100 outside the masked
    positions), so HF computes its MLM logits at every position, as its model does."""

    def __init__(self, baseline: nn.Module, config: BertConfig, kind: str):
        super().__init__()
        try:
            import transformers
        except ImportError:
            raise BenchError("variant hf needs HF transformers: pip install transformers") from None
        classes = {"pretraining": (transformers.BertForPreTraining, {}),
                   "finetuning": (transformers.BertForSequenceClassification, {"num_labels": 2})}
        model_class, head = classes[kind]
        self.hf = model_class(transformers.BertConfig(**config.to_hf_dict(), **head))
        missing, _ = self.hf.load_state_dict(baseline.state_dict(), strict=False)
        if [name for name in missing if not name.endswith("position_ids")]:
            raise BenchError(f"HF {model_class.__name__} lacks bertbench's weights {missing}")

    def forward(self, input_ids, token_type_ids, attention_mask, labels=None, masked_lm_positions=None,
                masked_lm_labels=None, next_sentence_labels=None):
        if masked_lm_positions is not None:
            labels = torch.full_like(input_ids, IGNORE_INDEX).scatter(1, masked_lm_positions, masked_lm_labels)
            extra = {"next_sentence_label": next_sentence_labels}
        else:
            extra = {}
        return self.hf(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
                       labels=labels, **extra)


def forward_loss(model: nn.Module, batch: dict[str, torch.Tensor], precision: str,
                 device: torch.device | str) -> torch.Tensor:
    """The loss of a forward under the training step's precision (for counting saved bytes without a step)."""
    with autocast(precision, device):
        return model(**batch).loss


def train_config(precision: str, **overrides) -> TrainConfig:
    """The TrainConfig a bench step trains with: the training defaults (AdamW, weight decay, clipping at 1.0, one
    micro-batch, no compile) with the bench's precision and any `overrides`. The schedule spans BENCH_STEPS without
    warm-up, so the learning rate stays at its peak however many steps a bench times."""
    if precision not in PRECISIONS:
        raise BenchError(f"unknown precision {precision!r}: use {', '.join(PRECISIONS)}")
    try:
        return TrainConfig(num_train_steps=BENCH_STEPS, warmup_proportion=0.0, precision=precision, **overrides)
    except ValueError as error:
        raise BenchError(str(error)) from None


def check_runnable(train: TrainConfig, device: torch.device | str) -> TrainConfig:
    """`train`, which a run trains with as it is on `device`; a setting that a run would change there (fp16 on a
    CPU, compile without a compiler: train_step.fallbacks) is a BenchError, rather than timed as no run trains
    or relabelled."""
    changes = fallbacks(train, device)
    if changes:
        raise BenchError(f"on {device}: {changes[0].reason}: a run trains otherwise here (fp32, eager), so a bench "
                         "does not time it")
    return train


@dataclass
class BenchStep:
    """The training step users train with (bertbench.train_step.TrainStep), fed one fixed synthetic batch;
    call it to run one optimizer step (gradient_accumulation_steps micro-batches of that batch)."""

    step: TrainStep
    batch: dict[str, torch.Tensor]

    @property
    def model(self) -> nn.Module:
        return self.step.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.step.optimizer

    @property
    def device(self) -> torch.device:
        return self.step.device

    @property
    def sequences(self) -> int:
        """Sequences one call trains: the batch times the micro-batches per step."""
        return len(self.batch["input_ids"]) * self.step.config.gradient_accumulation_steps

    def forward(self) -> torch.Tensor:
        return self.step.forward_loss(self.batch)

    def __call__(self) -> None:
        self.step(itertools.repeat(self.batch))


def train_step(config: BertConfig, kind: str, variant: Variant, precision: str, batch: int, seq: int,
               device: torch.device | str = "cpu", model: nn.Module | None = None,
               dist: Distributed | None = None, **train_overrides) -> BenchStep:
    """The training step of one setting; pass `model` to reuse one already built for the same kind and variant, and
    `train_overrides` (TrainConfig fields: optimizer, gradient_accumulation_steps, compile, ...) to time another
    recipe. Under torchrun pass the job's `dist`: the step is then DDP's, as in training."""
    device = torch.device(device)
    dist = dist or Distributed(device=device)
    train = check_runnable(train_config(precision, **train_overrides), device)
    model = model if model is not None else build(config, kind, variant, device)
    step = TrainStep(model, train, dist)
    return BenchStep(step, synthetic_batch(config, kind, batch, seq, device))
