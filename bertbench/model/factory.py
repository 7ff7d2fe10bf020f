"""Builds a task model from either modeling module, chosen by name (--modeling / --recompute-policy)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from bertbench.common.errors import UsageError
from bertbench.common.flags import setting
from bertbench.model import modeling, recompute
from bertbench.model.attention import ATTENTION_KERNELS
from bertbench.model.config import BertConfig
from bertbench.model.precision import precision_dtype

MODELINGS = ("baseline", "recompute")
TASKS = {
    "encoder": "BertModel",
    "pretraining": "BertForPreTraining",
    "classification": "BertForSequenceClassification",
    "question_answering": "BertForQuestionAnswering",
}


def build_model(
    task: str,
    config: BertConfig,
    modeling_name: str = "baseline",
    recompute_policy: str = "full",
    recompute_every: int = 2,
    unpad: bool = True,
    attention_kernel: str | None = None,
    **head_kwargs,
) -> nn.Module:
    """A model for `task` (see TASKS) from the baseline or the recompute module, on the unpadded or the padded path
    (modeling.set_unpadding); head_kwargs go to the head (num_labels for classification)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if modeling_name == "baseline":
        model = getattr(modeling, TASKS[task])(config, **head_kwargs)
    elif modeling_name == "recompute":
        model = getattr(recompute, TASKS[task])(config, policy=recompute_policy, every_k=recompute_every, **head_kwargs)
    else:
        raise ValueError(f"unknown modeling {modeling_name!r}; choose one of {', '.join(MODELINGS)}")
    return modeling.set_unpadding(model, unpad, attention_kernel)


def unrunnable(modeling_name: str, attention_kernel: str | None, device: torch.device | str) -> str | None:
    """Why a model of these settings cannot train on `device`, None when it can: on a CPU, torch runs SDPA on
    nested tensors by a fallback whose tensors activation checkpointing cannot save."""
    if modeling_name == "recompute" and attention_kernel == "nested" and torch.device(device).type == "cpu":
        return (
            "--attention_kernel=nested with --modeling=recompute needs a GPU: on a CPU checkpointing cannot save "
            "the nested tensors of torch's fallback attention (use per-sequence, the CPU's default)"
        )
    return None


def path_of(model: nn.Module, device: torch.device | str, precision: str, compiled: bool) -> tuple[str, str]:
    """What a model's batches with padding run on here, as train_results.json and the benches name it ("padded",
    or "unpadded/KERNEL"; "unpadded/auto" picks per batch by its longest sequence), and why (attention.path_rule)."""
    packer = modeling.packer_for(model, device, precision_dtype(precision), compiled)
    if packer is None or packer.rule is None:
        return "padded", "--unpad=false: every sequence computed at the batch's length"
    rule = packer.rule
    below = f"; a batch with under {rule.min_padding_share:.0%} padding runs padded" if rule.min_padding_share else ""
    return f"unpadded/{rule.kernel}", rule.reason + below


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """The modeling module and how it runs (the same weights either way)."""

    modeling: str = setting(
        "baseline: keep every activation (modeling_v0); recompute: activation checkpointing "
        "(modeling_v2). Both have the same weights and checkpoints.",
        "baseline",
        choices=MODELINGS,
        defines_training=True,
    )
    recompute_policy: str = setting(
        "With --modeling recompute: full (every block), every-k (every k-th block), "
        "selective (every block keeps all but its GELU output, recomputed in backward).",
        "full",
        choices=recompute.POLICIES,
        defines_training=True,
    )
    recompute_every: int = setting("k of the every-k policy.", 2, positive=True, defines_training=True)
    unpad: bool = setting(
        "Run batches with padding on their real tokens only (variable-length attention); "
        "--unpad=false (or --nounpad) computes every sequence at --max_seq_length, as Google's and "
        "NVIDIA's code. The same weights and maths, but for SQuAD's loss, which gives the padding "
        "no probability. Where a batch has too little padding to gain (under 10%% on a CPU) it runs "
        "padded either way.",
        True,
        defines_training=True,
    )
    attention_kernel: str | None = setting(
        "The unpadded path's attention (default: the device's measured fastest, see docs/benchmarks.md): varlen (one "
        "call over the packed rows: flash attention's variable-length kernel on a GPU in fp16/bf16, the masked kernel "
        "where flash cannot run; a reference implementation on a CPU), per-sequence (each sequence's attention on "
        "its own, in a few operators), masked (the rows put back in a batch as long as its longest sequence, SDPA "
        "with the padding mask), nested (SDPA on jagged nested tensors), block-diagonal (all rows as one sequence, a "
        "block-diagonal mask) or auto (the default; on a CPU, per-sequence for a batch whose longest sequence has 64 "
        "tokens or more, else masked).",
        None,
        choices=ATTENTION_KERNELS,
        defines_training=True,
    )

    def __post_init__(self) -> None:
        if self.recompute_every < 1:
            raise UsageError(f"--recompute-every must be at least 1, got {self.recompute_every}")
        if self.modeling not in MODELINGS:
            raise UsageError(f"--modeling: unknown {self.modeling!r}; choose one of {', '.join(MODELINGS)}")

    def build(self, task: str, config: BertConfig, **head_kwargs) -> nn.Module:
        """The task model these settings describe (build_model)."""
        return build_model(
            task,
            config,
            self.modeling,
            self.recompute_policy,
            self.recompute_every,
            self.unpad,
            self.attention_kernel,
            **head_kwargs,
        )

    def unrunnable(self, device: torch.device | str) -> str | None:
        return unrunnable(self.modeling, self.attention_kernel, device)
