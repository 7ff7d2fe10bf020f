"""The optimizer rules against their sources, and what a step of each costs for BERT-large.

(a) Update ratios: per step, ||delta p|| of bertbench's step over ||delta p|| of the source's, all tensors together,
    with the same gradients from the same start; each run free from the start (bertbench's real TrainStep: clipping,
    optimizer, schedule). Adam: the 300 steps of Google's own create_optimizer that TensorFlow wrote
    (tests/fixtures/google_bert/adam_weight_decay.npz), for both adamw rules. LAMB: the same 300 gradients and
    schedule against the NumPy transcription of apex FusedLAMB (tests/optimizer_references.py), for lamb, nvlamb, and
    bertbench's LAMB before this change (the per-parameter class below, with torch's clip_grad_norm_ as TrainStep
    clipped then) against apex's lamb.
(b) optimizer.step() of BERT-large pre-training's parameters (335M, fp32, CPU) with random gradients, interleaved
    rounds: the LAMB before (per-parameter loop), the multi-tensor LAMB, Google's AdamW, torch's fused AdamW.

    PYTHONPATH=. python docs/results/cpu-2core/optimizer-rules/measure.py [--repeats 7] [--skip_timing]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterable

import numpy as np
import torch

from bertbench.model.config import BertConfig
from bertbench.model.modeling import BertForPreTraining
from bertbench.model.sizes import MODEL_SIZES
from bertbench.training import optim
from bertbench.training.config import TrainConfig
from bertbench.training.step import TrainStep

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "tests"))
from optimizer_references import AdamWeightDecay, FedGradients, FusedLamb, clip_by_global_norm, google_trajectory  # noqa: E402

WARMUP_ROUNDS = 2


class LambBefore(torch.optim.Optimizer):
    """bertbench's Lamb before issue 17, as it was: a Python loop over the parameters, the trust ratio on every
    tensor."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
    ):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
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
                trust_ratio = torch.where(
                    (weight_norm > 0) & (update_norm > 0), weight_norm / update_norm, torch.ones_like(weight_norm)
                )
                parameter.sub_(update * (group["lr"] * trust_ratio))


def flat(weights: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(value, np.float64).ravel() for value in weights.values()])


def bertbench_run(google, optimizer: str, bias_correction: bool) -> list[np.ndarray]:
    """The weights after each step of bertbench's TrainStep fed Google's gradients, at Google's schedule."""
    model = FedGradients(google.initial)
    step = TrainStep(
        model,
        TrainConfig(
            num_train_steps=google.num_train_steps,
            learning_rate=google.init_lr,
            warmup_proportion=google.num_warmup_steps / google.num_train_steps,
            optimizer=optimizer,
            adam_bias_correction=bias_correction,
        ),
    )
    weights = []
    for grads in google.grads:
        step(iter([{name: torch.from_numpy(grad) for name, grad in grads.items()}]))
        weights.append(flat({name: p.detach().numpy() for name, p in model.named_parameters()}))
    return weights


def before_run(google) -> list[np.ndarray]:
    """The LAMB before, clipped as TrainStep clipped then (torch's clip_grad_norm_), at the same schedule."""
    model = FedGradients(google.initial)
    optimizer = LambBefore(optim.parameter_groups(model, 0.01), lr=google.init_lr)
    weights = []
    for t, grads in enumerate(google.grads):
        for name, parameter in model.named_parameters():
            parameter.grad = torch.from_numpy(grads[name].copy())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = google.init_lr * optim.warmup_decay_factor(t, google.num_train_steps, google.num_warmup_steps)
        optimizer.step()
        weights.append(flat({name: p.detach().numpy() for name, p in model.named_parameters()}))
    return weights


def transcription_run(google) -> list[np.ndarray]:
    """The float64 transcription of Google's rule at Google's float32 learning rates: how far Google's own float32
    rounding moves each step."""
    names = list(google.initial)
    reference = AdamWeightDecay(list(google.initial.values()), [name == "dense.weight" for name in names])
    weights = []
    for t, grads in enumerate(google.grads):
        reference.step(clip_by_global_norm([grads[name] for name in names], 1.0), float(google.learning_rates[t]))
        weights.append(flat(dict(zip(names, reference.params))))
    return weights


def apex_run(google, use_nvlamb: bool) -> list[np.ndarray]:
    names = list(google.initial)
    reference = FusedLamb(
        list(google.initial.values()),
        [0.0 if name.endswith("bias") or "LayerNorm" in name else 0.01 for name in names],
        max_grad_norm=1.0,
        use_nvlamb=use_nvlamb,
    )
    weights = []
    for t, grads in enumerate(google.grads):
        reference.step(
            [grads[name] for name in names],
            google.init_lr * optim.warmup_decay_factor(t, google.num_train_steps, google.num_warmup_steps),
        )
        weights.append(flat(dict(zip(names, reference.params))))
    return weights


def update_ratios(ours: list[np.ndarray], theirs: list[np.ndarray], start: np.ndarray) -> np.ndarray:
    """||delta p|| ours / theirs at each step whose source update is not zero (step 0's learning rate is 0)."""
    ours_before, theirs_before, ratios = start, start, []
    for mine, source in zip(ours, theirs):
        source_norm = np.linalg.norm(source - theirs_before)
        ratios.append(np.linalg.norm(mine - ours_before) / source_norm if source_norm else np.nan)
        ours_before, theirs_before = mine, source
    return np.array(ratios)


def ratio_table(google) -> None:
    start = flat(google.initial)
    googles = [flat(weights) for weights in google.params]
    rows = [
        (
            "adamw (Google's rule, default)",
            bertbench_run(google, "adamw", False),
            googles,
            "Google's create_optimizer (TF)",
        ),
        (
            "adamw --adam_bias_correction",
            bertbench_run(google, "adamw", True),
            googles,
            "Google's create_optimizer (TF)",
        ),
        (
            "(NumPy float64 transcription of Google's rule)",
            transcription_run(google),
            googles,
            "Google's create_optimizer (TF)",
        ),
        ("lamb", bertbench_run(google, "lamb", False), apex_run(google, False), "apex FusedLAMB (NumPy)"),
        ("nvlamb", bertbench_run(google, "nvlamb", False), apex_run(google, True), "apex FusedLAMB use_nvlamb (NumPy)"),
        ("LAMB before (trust ratio everywhere)", before_run(google), apex_run(google, False), "apex FusedLAMB (NumPy)"),
    ]
    warmup = google.num_warmup_steps
    print(
        f"(a) ||delta p|| bertbench / source per step, 4 tensors, {google.num_train_steps} steps, peak lr "
        f"{google.init_lr}, warm-up {warmup} steps, clipping at 1.0"
    )
    print(
        f"| bertbench | source | steps 1-{warmup - 1}: min / median / max | steps {warmup}-"
        f"{google.num_train_steps - 1}: min / median / max |"
    )
    print("|---|---|---|---|")
    for name, ours, theirs, source in rows:
        ratios = update_ratios(ours, theirs, start)
        cells = [
            f"{np.nanmin(part):.4f} / {np.nanmedian(part):.4f} / {np.nanmax(part):.4f}"
            for part in (ratios[1:warmup], ratios[warmup:])
        ]
        print(f"| {name} | {source} | {cells[0]} | {cells[1]} |")


def timing_table(repeats: int) -> None:
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**MODEL_SIZES["large"]))
    parameters = [p for p in model.parameters() if p.requires_grad]
    count = sum(p.numel() for p in parameters)
    grads = [torch.randn_like(p) * 1e-3 for p in parameters]
    optimizers = {
        "LAMB before (per-parameter loop)": LambBefore(optim.parameter_groups(model, 0.01), lr=1e-3),
        "lamb (multi-tensor)": optim.build_optimizer(model, "lamb", 1e-3),
        "adamw, Google's rule (multi-tensor)": optim.build_optimizer(model, "adamw", 1e-3),
        "adamw --adam_bias_correction (torch fused)": optim.build_optimizer(
            model, "adamw", 1e-3, adam_bias_correction=True
        ),
    }
    times = {name: [] for name in optimizers}
    for parameter, grad in zip(parameters, grads):
        parameter.grad = torch.empty_like(grad)
    for round_ in range(WARMUP_ROUNDS + repeats):  # the first rounds set the states up and fault their pages in
        order = list(optimizers) if round_ % 2 == 0 else list(reversed(optimizers))
        for name in order:
            torch._foreach_copy_([parameter.grad for parameter in parameters], grads)  # LAMB writes into them
            started = time.perf_counter()
            optimizers[name].step()
            elapsed = time.perf_counter() - started
            if round_ >= WARMUP_ROUNDS:
                times[name].append(elapsed)
    print(
        f"\n(b) optimizer.step() of BERT-large pre-training ({count / 1e6:.0f}M fp32 parameters, CPU, "
        f"{torch.get_num_threads()} threads), {repeats} interleaved rounds after {WARMUP_ROUNDS} untimed"
    )
    print("| optimizer | median s | min s | max s |")
    print("|---|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip_timing", action="store_true")
    args = parser.parse_args()
    ratio_table(google_trajectory())
    if not args.skip_timing:
        timing_table(args.repeats)


if __name__ == "__main__":
    main()
