"""Builds a task model from either modeling module, chosen by name (--modeling / --recompute-policy)."""

from __future__ import annotations

import argparse

from torch import nn

from bertbench import modeling, recompute
from bertbench.config import BertConfig
from bertbench.errors import UsageError

MODELINGS = ("baseline", "recompute")
TASKS = {
    "encoder": "BertModel",
    "pretraining": "BertForPreTraining",
    "classification": "BertForSequenceClassification",
    "question_answering": "BertForQuestionAnswering",
}


def build_model(task: str, config: BertConfig, modeling_name: str = "baseline", recompute_policy: str = "full",
                recompute_every: int = 2, **head_kwargs) -> nn.Module:
    """A model for `task` (see TASKS) from the baseline or the recompute module; head_kwargs go to the head
    (num_labels for classification)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASKS)}")
    if modeling_name == "baseline":
        return getattr(modeling, TASKS[task])(config, **head_kwargs)
    if modeling_name == "recompute":
        return getattr(recompute, TASKS[task])(config, policy=recompute_policy, every_k=recompute_every,
                                               **head_kwargs)
    raise ValueError(f"unknown modeling {modeling_name!r}; choose one of {', '.join(MODELINGS)}")


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that pick the modeling module, shared by every runner."""
    group = parser.add_argument_group("modeling")
    group.add_argument("--modeling", choices=MODELINGS, default="baseline",
                       help="baseline: keep every activation (modeling_v0); recompute: activation checkpointing "
                            "(modeling_v2). Both have the same weights and checkpoints.")
    group.add_argument("--recompute-policy", "--recompute_policy", choices=recompute.POLICIES, default="full",
                       help="With --modeling recompute: full (every block), every-k (every k-th block), selective "
                            "(keep dense-layer outputs, recompute attention core and element-wise ops).")
    group.add_argument("--recompute-every", "--recompute_every", type=int, default=2, metavar="K",
                       help="k of the every-k policy.")


def model_from_args(args: argparse.Namespace, task: str, config: BertConfig, **head_kwargs) -> nn.Module:
    if args.recompute_every < 1:
        raise UsageError(f"--recompute-every must be at least 1, got {args.recompute_every}")
    return build_model(task, config, args.modeling, args.recompute_policy, args.recompute_every, **head_kwargs)
