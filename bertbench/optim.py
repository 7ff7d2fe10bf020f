"""Optimizers and learning-rate schedules of BERT training: AdamW and LAMB, warm-up then linear/polynomial decay.

Weight decay skips biases and LayerNorm parameters, as Google's optimization.py does. The schedule follows Google's
and NVIDIA's BERT: the decay runs over the whole training (from step 0 to num_train_steps) and the linear warm-up
overrides its first steps, so the learning rate is 0 at the first step and peaks at the last warm-up step.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch
from torch import nn

OPTIMIZERS = ("adamw", "lamb")
DECAYS = ("linear", "poly")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: decayed weights, and biases plus LayerNorm parameters without decay (Google's exclusions)."""
    decayed, undecayed = [], []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
            undecayed.append(parameter)
        else:
            decayed.append(parameter)
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": undecayed, "weight_decay": 0.0}]


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2020, as NVIDIA's BERT pre-training uses it): the bias-corrected Adam direction plus decoupled
    weight decay, scaled per parameter tensor by the trust ratio ||weight|| / ||update||."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01):
        if lr < 0 or eps <= 0 or not all(0 <= beta < 1 for beta in betas) or weight_decay < 0:
            raise ValueError(f"invalid LAMB settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                state = self.state[parameter]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                state["step"] += 1
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(parameter.grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(parameter.grad, parameter.grad, value=1 - beta2)
                corrected_avg = exp_avg / (1 - beta1 ** state["step"])
                corrected_sq = exp_avg_sq / (1 - beta2 ** state["step"])
                update = corrected_avg / (corrected_sq.sqrt() + group["eps"])
                if group["weight_decay"]:
                    update.add_(parameter, alpha=group["weight_decay"])
                weight_norm, update_norm = parameter.norm(), update.norm()
                # Zero norms (fresh zero-initialised biases, or no update) fall back to a plain Adam step.
                trust_ratio = torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm,
                                          torch.ones_like(weight_norm))
                parameter.sub_(update * (group["lr"] * trust_ratio))
        return loss


def build_optimizer(model: nn.Module, name: str, learning_rate: float, weight_decay: float = 0.01,
                    eps: float = 1e-6, betas: tuple[float, float] = (0.9, 0.999)) -> torch.optim.Optimizer:
    """AdamW (PyTorch's, fused into one kernel where the device supports it) or LAMB; Google's epsilon 1e-6."""
    groups = parameter_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=_fused_supported(model))
    if name == "lamb":
        return Lamb(groups, lr=learning_rate, betas=betas, eps=eps)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def _fused_supported(model: nn.Module) -> bool:
    devices = {parameter.device.type for parameter in model.parameters()}
    return devices <= {"cpu", "cuda"} and all(parameter.is_floating_point() for parameter in model.parameters())


def warmup_decay_factor(step: int, num_train_steps: int, num_warmup_steps: int, decay: str = "linear",
                        power: float = 1.0) -> float:
    """Multiplier of the peak learning rate at `step` (0 = the first update)."""
    if decay not in DECAYS:
        raise ValueError(f"unknown decay {decay!r}; choose one of {', '.join(DECAYS)}")
    if step < num_warmup_steps:
        return step / num_warmup_steps
    remaining = max(0.0, 1.0 - step / max(1, num_train_steps))
    return remaining if decay == "linear" else remaining ** power


def warmup_decay_schedule(optimizer: torch.optim.Optimizer, num_train_steps: int, warmup_proportion: float = 0.1,
                          decay: str = "linear", power: float = 1.0) -> torch.optim.lr_scheduler.LambdaLR:
    """Google's schedule: linear warm-up over warmup_proportion of the steps, then linear or polynomial decay to
    0 at num_train_steps. Call `step()` after every optimizer step."""
    if num_train_steps < 1:
        raise ValueError(f"num_train_steps must be at least 1, got {num_train_steps}")
    if not 0.0 <= warmup_proportion <= 1.0:
        raise ValueError(f"warmup_proportion must be in [0, 1], got {warmup_proportion}")
    num_warmup_steps = math.floor(num_train_steps * warmup_proportion)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_decay_factor(step, num_train_steps, num_warmup_steps, decay, power))
