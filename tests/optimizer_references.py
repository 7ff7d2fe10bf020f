"""The optimizers bertbench's follow, transcribed in NumPy (float64) from their sources, for test_optim and the
optimizer-rules figures to compare against. Each `step(grads, lr)` updates `params` (a list of arrays) in place.

- AdamWeightDecay(bias_correction=False): Google's AdamWeightDecayOptimizer.apply_gradients (google-research/bert
  optimization.py); bias_correction=True is torch.optim.AdamW's documented algorithm (amsgrad off).
- FusedLamb: apex's FusedLAMB.step (apex/optimizers/fused_lamb.py) and its kernel (csrc/multi_tensor_lamb.cu,
  LAMBStage1Functor in MOMENT_MODE_1, LAMBStage2Functor) with the defaults NVIDIA's PyTorch BERT runs it with.
  apex computes in float32 with its scalar arguments cast to float32; the transcription keeps the formulas and
  computes in float64, so bertbench's float32 results agree with it to float32 rounding.
- clip_by_global_norm: tf.clip_by_global_norm, which create_optimizer applies before AdamWeightDecayOptimizer.

FedGradients is the module that drives bertbench's real TrainStep with given gradients; google_trajectory reads
fixtures/google_bert/adam_weight_decay.npz (300 steps of Google's create_optimizer, written by TensorFlow) in
bertbench's names and layout.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

GOOGLE_FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "google_bert", "adam_weight_decay.npz")
# Google's variables and bertbench's names for them; TF kernels are (in, out), torch's Linear weights (out, in).
GOOGLE_NAMES = {
    "layer/dense/kernel": "dense.weight",
    "layer/dense/bias": "dense.bias",
    "layer/LayerNorm/gamma": "LayerNorm.weight",
    "layer/LayerNorm/beta": "LayerNorm.bias",
}


@dataclass(frozen=True)
class GoogleTrajectory:
    """Google's run in bertbench's names and layout: the initial weights, the gradients fed at each step (before
    clipping), the weights after each step and the learning rate each step applied (float32, as TF computed it)."""

    initial: dict[str, np.ndarray]
    grads: list[dict[str, np.ndarray]]
    params: list[dict[str, np.ndarray]]
    learning_rates: np.ndarray
    init_lr: float
    num_train_steps: int
    num_warmup_steps: int


def google_trajectory(path: str = GOOGLE_FIXTURE) -> GoogleTrajectory:
    fixture = np.load(path)
    names = [GOOGLE_NAMES[name] for name in fixture["names"]]

    def layout(name: str, array: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.swapaxes(array, -1, -2) if name == "dense.weight" else array)

    def at(key: str, t: int | None = None) -> dict[str, np.ndarray]:
        return {
            name: layout(name, fixture[f"{key}_{i}"] if t is None else fixture[f"{key}_{i}"][t])
            for i, name in enumerate(names)
        }

    steps = int(fixture["num_train_steps"])
    return GoogleTrajectory(
        at("init"),
        [at("grads", t) for t in range(steps)],
        [at("params", t) for t in range(steps)],
        fixture["learning_rates"],
        float(fixture["init_lr"]),
        steps,
        int(fixture["num_warmup_steps"]),
    )


def global_norm(arrays: list[np.ndarray]) -> float:
    return float(np.sqrt(sum(np.sum(np.square(array, dtype=np.float64)) for array in arrays)))


def clip_by_global_norm(grads: list[np.ndarray], clip_norm: float) -> list[np.ndarray]:
    """tf.clip_by_global_norm: t * clip_norm / max(global_norm, clip_norm)."""
    scale = clip_norm / max(global_norm(grads), clip_norm)
    return [np.asarray(grad, np.float64) * scale for grad in grads]


class AdamWeightDecay:
    """Google's rule (bias_correction=False) or torch.optim.AdamW's (True); `decayed[i]`: tensor i takes weight
    decay (Google's exclusions: not biases, not LayerNorm)."""

    def __init__(
        self,
        params: list[np.ndarray],
        decayed: list[bool],
        weight_decay: float = 0.01,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-6,
        bias_correction: bool = False,
    ):
        self.params = [np.array(param, np.float64) for param in params]
        self.decayed, self.weight_decay = decayed, weight_decay
        self.beta_1, self.beta_2, self.epsilon, self.bias_correction = beta_1, beta_2, epsilon, bias_correction
        self.m = [np.zeros_like(param) for param in self.params]
        self.v = [np.zeros_like(param) for param in self.params]
        self.t = 0

    def step(self, grads: list[np.ndarray], lr: float) -> None:
        self.t += 1
        for i, (param, grad) in enumerate(zip(self.params, grads)):
            grad = np.asarray(grad, np.float64)
            self.m[i] = self.beta_1 * self.m[i] + (1.0 - self.beta_1) * grad
            self.v[i] = self.beta_2 * self.v[i] + (1.0 - self.beta_2) * np.square(grad)
            if self.bias_correction:  # torch: p (1 - lr wd), then - lr m_hat / (sqrt(v_hat) + eps)
                m_hat = self.m[i] / (1.0 - self.beta_1**self.t)
                v_hat = self.v[i] / (1.0 - self.beta_2**self.t)
                decay = self.weight_decay if self.decayed[i] else 0.0
                self.params[i] = param * (1.0 - lr * decay) - lr * m_hat / (np.sqrt(v_hat) + self.epsilon)
            else:  # Google: update = m / (sqrt(v) + eps) (+ wd p); p - lr update
                update = self.m[i] / (np.sqrt(self.v[i]) + self.epsilon)
                if self.decayed[i] and self.weight_decay:
                    update += self.weight_decay * param
                self.params[i] = param - lr * update


class FusedLamb:
    """apex FusedLAMB (bias_correction=True, adam_w_mode=True, grad_averaging=True); `weight_decays[i]`: the weight
    decay of tensor i's parameter group. max_grad_norm None: no clipping (apex always clips; None stands for a
    norm that never exceeds it)."""

    def __init__(
        self,
        params: list[np.ndarray],
        weight_decays: list[float],
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        max_grad_norm: float | None = 1.0,
        use_nvlamb: bool = False,
    ):
        self.params = [np.array(param, np.float64) for param in params]
        self.weight_decays = weight_decays
        self.beta1, self.beta2 = betas
        self.eps, self.max_grad_norm, self.use_nvlamb = eps, max_grad_norm, use_nvlamb
        self.m = [np.zeros_like(param) for param in self.params]
        self.v = [np.zeros_like(param) for param in self.params]
        self.step_count = 0  # apex's group["step"]: every tensor here steps together

    def step(self, grads: list[np.ndarray], lr: float) -> None:
        self.step_count += 1
        t = self.step_count
        # fused_lamb.py: the global norm of every gradient; the kernel divides by norm / max_grad_norm above it.
        norm = global_norm(grads)
        clip = norm / self.max_grad_norm if self.max_grad_norm is not None and norm > self.max_grad_norm else 1.0
        beta3 = 1.0 - self.beta1  # grad_averaging
        bias_correction1, bias_correction2 = 1.0 - self.beta1**t, 1.0 - self.beta2**t
        for i, (param, grad) in enumerate(zip(self.params, grads)):
            decay = self.weight_decays[i]
            scaled_grad = np.asarray(grad, np.float64) / clip
            self.m[i] = self.m[i] * self.beta1 + beta3 * scaled_grad
            self.v[i] = self.v[i] * self.beta2 + (1.0 - self.beta2) * scaled_grad * scaled_grad
            next_m_unbiased = self.m[i] / bias_correction1
            next_v_unbiased = self.v[i] / bias_correction2
            denom = np.sqrt(next_v_unbiased) + self.eps
            update = next_m_unbiased / denom + decay * param
            # LAMBStage2Functor: the trust ratio where use_nvlamb or the group decays, both norms non-zero.
            ratio = lr
            if self.use_nvlamb or decay != 0.0:
                param_norm, update_norm = np.linalg.norm(param), np.linalg.norm(update)
                if param_norm != 0.0 and update_norm != 0.0:
                    ratio = lr * (param_norm / update_norm)
            self.params[i] = param - ratio * update


class FedGradients(nn.Module):
    """Parameters under dotted names, as a model holds them (so parameter_groups applies Google's exclusions by
    name), whose loss is sum(parameter x fed[name]): each parameter's gradient is what the batch feeds it."""

    def __init__(self, initial: dict[str, np.ndarray]):
        super().__init__()
        for name, value in initial.items():
            *path, leaf = name.split(".")
            module = self
            for part in path:
                if not hasattr(module, part):
                    module.add_module(part, nn.Module())
                module = getattr(module, part)
            module.register_parameter(leaf, nn.Parameter(torch.tensor(value, dtype=torch.float32)))

    def forward(self, **fed: torch.Tensor) -> SimpleNamespace:
        return SimpleNamespace(loss=sum((parameter * fed[name]).sum() for name, parameter in self.named_parameters()))
