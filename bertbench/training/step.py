"""The training step: one optimizer step as users train it, and as every bench times it.

`TrainStep` owns the optimizer, the learning-rate schedule and the fp16 loss scaler of one model, and runs a step:
gradient_accumulation_steps micro-batches of forward and backward under the run's precision (gradients all-reduced
once, on the last micro-batch, under DDP), global-norm clipping (Google's and apex's) with the optimizer
(optim.clip_and_step, which folds the clipping into a fused optimizer's pass), and the schedule. An fp16 step whose
gradients overflow is skipped and does not advance the schedule (NVIDIA's BERT). The Estimator's loop calls it with
the run's batch stream; the benches call it with a fixed synthetic batch, so a bench figure is the speed of this
step.

Each micro-batch is made ready on the host (`prepare`): the model's Packer packs its real tokens from the CPU mask
(bertbench.model.packing), and its tensors go to the device pinned and without blocking, so the forward makes no host
sync. On a CUDA GPU the forward and backward replay from CUDA graphs (bertbench.training.cuda_graphs) where they can.

The step runs what its TrainConfig says. `fallbacks` are the settings that cannot apply on a device (fp16 on a CPU
trains in fp32; compile where torch.compile cannot run trains eagerly), each with the value that runs instead: the
runners build a job's TrainConfig with them (runners.config.RunnerConfig.train_config), the benches refuse them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from bertbench.model import modeling
from bertbench.model.packing import Packer, Packing
from bertbench.model.precision import precision_dtype
from bertbench.training import devices, optim
from bertbench.training.config import TrainConfig
from bertbench.training.cuda_graphs import GraphedMicroBatches
from bertbench.training.distributed import Distributed


def autocast(precision: str, device: torch.device | str):
    """The forward's precision context: none for fp32, autocast to fp16 or bf16 otherwise."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(torch.device(device).type, dtype=precision_dtype(precision))


def compile_unavailable(device: torch.device | str) -> str | None:
    """Why torch.compile's default backend (inductor) cannot run on `device` here, None when it can: without a C++
    compiler the first compiled call fails with a traceback, after the run has started."""
    if not torch._dynamo.is_dynamo_supported():
        return "this Python is not supported by torch.compile"
    device_type = torch.device(device).type
    if device_type == "cpu":
        from torch._inductor import cpp_builder, exc

        try:
            cpp_builder.get_cpp_compiler()  # inductor's own search: config.cpp.cxx, $CXX, g++
        except exc.InvalidCxxCompiler:
            return "inductor finds no C++ compiler; install g++ or set CXX"
    elif device_type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            return "inductor needs Triton on a GPU"
    return None


@dataclass(frozen=True)
class Fallback:
    """A setting that cannot apply on a device: why, the field's value that runs instead, and what that is."""

    reason: str
    field: str
    value: object
    instead: str

    @property
    def note(self) -> str:
        """The one line a run's log tells of it."""
        return f"{self.reason}; {self.instead}"


def fallbacks(config: TrainConfig, device: torch.device | str) -> list[Fallback]:
    """The settings of `config` that cannot apply on `device`. fp16 on a CPU trains in fp32: CPU autocast to fp16
    runs, but on a CPU without fp16 matmuls many times slower than fp32 (13x for a BERT-mini step on an AVX-512
    EPYC), and its loss scaling guards fp16 only."""
    found = []
    if config.precision == "fp16" and torch.device(device).type == "cpu":
        found.append(
            Fallback(
                "fp16 needs a CUDA GPU",
                "precision",
                "fp32",
                f"on {torch.device(device).type} this run trains in fp32 (--precision=fp32 to say so)",
            )
        )
    reason = compile_unavailable(device) if config.compile else None
    if reason is not None:
        found.append(
            Fallback(
                f"torch.compile cannot run here ({reason})",
                "compile",
                False,
                "this run trains eagerly (--use_xla=false to say so)",
            )
        )
    return found


def slow_here(config: TrainConfig, device: torch.device | str) -> list[str]:
    """The settings of `config` that run on `device` as asked but many times slower than another setting would, one
    line each for the run's log and a bench's warnings: bf16 on a CPU without a bf16 matmul unit."""
    if config.precision == "bf16" and torch.device(device).type == "cpu":
        reason = devices.cpu_bf16_unavailable()
        if reason is not None:
            return [f"--precision=bf16: {reason}, many times slower than fp32 (--precision=fp32 trains faster here)"]
    return []


def wrap_for_training(model: nn.Module, config: TrainConfig, dist: Distributed) -> nn.Module:
    """The module the step runs: DistributedDataParallel under torchrun (unless the workers train apart), then
    torch.compile when asked; the parameters stay the model's own."""
    wrapped = model
    if dist.enabled and config.sync_gradients:
        device_ids = [dist.device.index] if dist.device.type == "cuda" else None
        wrapped = nn.parallel.DistributedDataParallel(wrapped, device_ids=device_ids)
    if config.compile:
        wrapped = torch.compile(wrapped)
    return wrapped


def graphs_unavailable(model: nn.Module, config: TrainConfig, dist: Distributed, packer: Packer | None) -> str | None:
    """Why the step cannot replay its micro-batches from CUDA graphs here, None when it can."""
    if not config.cuda_graphs:
        return "--cuda_graphs=false"
    if dist.device.type != "cuda":
        return f"CUDA graphs need a CUDA GPU (this is {dist.device.type})"
    if dist.enabled and config.sync_gradients:
        return "DistributedDataParallel all-reduces the gradients from backward hooks, outside a graph"
    policy = getattr(model, "recompute_policy", None)
    # Selective recompute runs no checkpoint eagerly (a saved-tensor hook recomputes GELU), so its step is captured
    # as the baseline's is; compiled, it runs under torch's checkpoint as the other policies always do.
    if policy and (policy != "selective" or config.compile):
        return "activation checkpointing saves the CUDA RNG state in the forward, which a graph capture cannot read"
    rule = packer.rule if packer is not None else None
    if rule is not None and rule.kernel != "varlen":
        return f"the {rule.kernel} kernel's sizes change with every batch (graphs need flash attention's buckets)"
    return None


def to_device(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch's tensors and packing on `device`: to a GPU from pinned memory, without blocking the host."""
    moved = {}
    for name, value in batch.items():
        if isinstance(value, (torch.Tensor, Packing)):
            if value.device.type == "cpu" and device.type == "cuda":
                value = value.pin_memory()
            value = value.to(device, non_blocking=True)
        moved[name] = value
    return moved


@dataclass
class StepResult:
    """What one step did. `loss` stays on the device (reading it would synchronise every step)."""

    loss: torch.Tensor  # mean over the micro-batches
    grad_norm: torch.Tensor | None  # before clipping; None without clipping
    skipped: bool  # fp16 gradients overflowed: no update, the schedule did not advance
    learning_rate: float  # the learning rate the optimizer applied


class TrainStep:
    """One optimizer step of `model` under `config`; the schedule's warm-up and decay run from
    `schedule_start_step` (0, or the step an earlier phase ended at) to config.num_train_steps."""

    def __init__(
        self, model: nn.Module, config: TrainConfig, dist: Distributed | None = None, schedule_start_step: int = 0
    ):
        self.dist = dist or Distributed()
        self.device = self.dist.device
        self.model = model.to(self.device)
        self.config = config
        self.schedule_start_step = schedule_start_step
        self.optimizer = optim.build_optimizer(
            model,
            config.optimizer,
            config.learning_rate,
            config.weight_decay,
            eps=config.adam_epsilon,
            betas=(config.adam_beta1, config.adam_beta2),
            adam_bias_correction=config.adam_bias_correction,
        )
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.precision == "fp16")
        self.schedule = optim.warmup_decay_schedule(
            self.optimizer,
            config.num_train_steps - schedule_start_step,
            config.warmup_proportion,
            config.decay,
            config.decay_power,
            config.schedule,
            config.warmup_steps,
        )
        self.training_model = wrap_for_training(model, config, self.dist)
        packer = modeling.packer_for(model, self.device, precision_dtype(config.precision), config.compile)
        self.graphs_note = graphs_unavailable(model, config, self.dist, packer)
        self.graphs = None
        if self.graphs_note is None:
            self.graphs = GraphedMicroBatches(model, self.device)
            packer = None if packer is None else replace(packer, bucketed=True)  # a few sizes, a graph each
        self.packer = packer  # None: the model takes no packing (HF's, in the benches)

    def prepare(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """A micro-batch as the step feeds it to the model: its packing made on the host from its mask (when the
        model takes one and the batch has none), then on the device."""
        if self.packer is not None and "attention_mask" in batch and "packing" not in batch:
            batch = {**batch, "packing": self.packer(batch["attention_mask"])}
        return to_device(batch, self.device)

    def forward_loss(self, batch: Mapping[str, Any]) -> torch.Tensor:
        """The loss of one micro-batch (on the device, see prepare) under the step's precision, through the module
        the step trains."""
        with autocast(self.config.precision, self.device):
            return self.training_model(**batch).loss

    def _forward_backward(self, batch: Mapping[str, Any]) -> torch.Tensor:
        loss = self.forward_loss(batch) / self.config.gradient_accumulation_steps
        self.scaler.scale(loss).backward()
        return loss.detach()

    def execution(self) -> dict[str, Any]:
        """How the step ran: CUDA graphs (what they did, or why they did not run)."""
        if self.graphs is not None:
            return {"cuda_graphs": self.graphs.summary()}
        return {"cuda_graphs": None, "cuda_graphs_off": self.graphs_note}

    def __call__(self, batches: Iterator[Mapping[str, torch.Tensor]]) -> StepResult:
        """Read gradient_accumulation_steps micro-batches from `batches` and take one optimizer step."""
        accumulation = self.config.gradient_accumulation_steps
        total_loss = torch.zeros((), device=self.device)
        for micro_step in range(accumulation):
            batch = self.prepare(next(batches))
            if self.graphs is not None:
                total_loss += self.graphs(batch, self._forward_backward)
                continue
            # Gradients are all-reduced once per optimizer step, on the last micro-batch, not on every one.
            defer_sync = micro_step < accumulation - 1 and hasattr(self.training_model, "no_sync")
            with self.training_model.no_sync() if defer_sync else nullcontext():
                total_loss += self._forward_backward(batch)
        scale_before = self.scaler.get_scale() if self.scaler.is_enabled() else None
        learning_rate = self.optimizer.param_groups[0]["lr"]
        grad_norm = optim.clip_and_step(self.optimizer, self.model.parameters(), self.config.max_grad_norm, self.scaler)
        self.scaler.update()
        # The graphs add into the same gradient tensors every step: zeroed, not dropped.
        self.optimizer.zero_grad(set_to_none=self.graphs is None)
        skipped = self.scaler.is_enabled() and self.scaler.get_scale() < scale_before
        if not skipped:
            self.schedule.step()
        return StepResult(total_loss, grad_norm, skipped, learning_rate)

    def state_dict(self) -> dict:
        """The optimizer's, schedule's and loss scaler's states, as a checkpoint holds them."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "schedule": self.schedule.state_dict(),
            "schedule_start_step": self.schedule_start_step,
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state: Mapping) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        # A checkpoint of steps without loss scaling (fp32, bf16, or fp16 asked for on a CPU, which trained in fp32)
        # has no scale: an fp16 step resuming it starts from the initial scale, as a new fp16 run does.
        if state["scaler"] or not self.scaler.is_enabled():
            self.scaler.load_state_dict(state["scaler"])

    def load_optimizer_moments(self, optimizer_state: Mapping) -> None:
        """Take an earlier phase's optimizer moments, keeping this run's learning rate and weight decay (NVIDIA's
        phase 2)."""
        settings = [
            {key: value for key, value in group.items() if key != "params"} for group in self.optimizer.param_groups
        ]
        self.optimizer.load_state_dict(optimizer_state)
        for group, fresh in zip(self.optimizer.param_groups, settings):
            group.update(fresh)
