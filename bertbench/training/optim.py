"""Optimizers and learning-rate schedules of BERT training: Google's AdamW, PyTorch's AdamW, apex's LAMB and
NVIDIA's TF LAMB; global-norm clipping; warm-up then linear/polynomial decay.

The update rules, each named by where it comes from:

- `adamw` without bias correction (`AdamWeightDecay`, the runners' default): Google's AdamWeightDecayOptimizer
  (google-research/bert optimization.py), which NVIDIA's TF BERT and the Adam of NVIDIA's PyTorch run_squad
  (apex FusedAdam, bias_correction=False) also apply: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
  p -= lr (m / (sqrt(v) + eps) + wd p). The original recipes' learning rates are for this rule.
- `adamw` with bias correction (`adam_bias_correction`): torch.optim.AdamW, HF Trainer's default: m / (1 - b1^t)
  and v / (1 - b2^t) in place of m and v. Over the first hundreds of steps its updates are several times smaller.
- `lamb` (`Lamb`): apex FusedLAMB with NVIDIA's PyTorch BERT settings (apex/optimizers/fused_lamb.py,
  csrc/multi_tensor_lamb.cu): the bias-corrected Adam direction plus decoupled weight decay, scaled per tensor by the
  trust ratio ||p|| / ||update|| only in groups whose weight decay is not 0; biases and LayerNorm take a plain Adam
  step at the learning rate.
- `nvlamb` (`Lamb(use_nvlamb=True)`): the trust ratio on every tensor, apex's use_nvlamb=True and NVIDIA's TF
  LAMBOptimizer.

All take Google's epsilon 1e-6 and betas (0.9, 0.999) unless told otherwise (HF Trainer's epsilon is 1e-8). Weight
decay skips biases and LayerNorm parameters, as Google's optimization.py does. Gradients are clipped before the
optimizer to a global norm of 1.0 as Google and apex clip (`clip_by_global_norm`; `clip_and_step` is the training
step's clipping and step).

On a GPU every rule runs `fused`: in one or two passes over each tensor rather than a dozen multi-tensor ones, so that
the step costs little more than the traffic of its rule (fp32: read p, g, m, v and write p, m, v, 28 bytes a parameter;
LAMB's trust ratio needs the norm of the update before p changes, so a second pass: 40 bytes; the global norm of the
clipping one more read of g). Google's AdamW and torch's AdamW run torch's fused AdamW kernel; LAMB and nvlamb run
`_lamb_update` compiled by torch.compile, whose foreach ops inductor fuses into a few kernels. Without loss scaling, the
clipping rides in those kernels too (`grad_scale`): the step reads the gradients once for their norm and once more to
update, instead of scaling them in place first. The fused rules are the eager ones to float rounding. On the CPU
Google's AdamW runs torch's fused kernel too (2-4x faster than the multi-tensor step there), and LAMB its eager form
(the fused one compiles; it can be forced, as the tests do). The schedule follows Google's and NVIDIA's
BERT: the decay runs over the whole training (from step 0 to num_train_steps) and the linear warm-up overrides its first
steps, so the learning rate is 0 at the first step and peaks at the last warm-up step. HF Trainer's (`schedule="hf"`)
starts the decay at the warm-up's end, from the peak, and its polynomial decay ends at 1e-7 rather than 0.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from bertbench.common.errors import one_line

OPTIMIZERS = ("adamw", "lamb", "nvlamb")
DECAYS = ("linear", "poly")
# How warm-up and decay fit together: Google's and NVIDIA's BERT, or HF Trainer's get_scheduler (warmup_decay_factor).
SCHEDULES = ("google", "hf")
HF_POLYNOMIAL_LR_END = 1e-7  # get_polynomial_decay_schedule_with_warmup's default, which HF's Trainer keeps


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


@torch.no_grad()
def clip_by_global_norm(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Multiply every gradient by max_norm / max(norm, max_norm), where norm is the L2 norm of all of them together:
    Google's tf.clip_by_global_norm and apex FusedLAMB's clipping. Returns the norm before clipping.
    (torch's clip_grad_norm_ multiplies by max_norm / (norm + 1e-6) instead, a little below Google's factor.)"""
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = _global_norm(grads)
    torch._foreach_mul_(grads, max_norm / torch.clamp(norm, min=max_norm))
    return norm


def _global_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))


@torch.no_grad()
def clip_and_step(
    optimizer: torch.optim.Optimizer,
    parameters: Iterable[torch.Tensor],
    max_grad_norm: float | None,
    scaler: torch.amp.GradScaler,
) -> torch.Tensor | None:
    """The training step's clipping and optimizer step: fp16 gradients unscaled (`scaler`), clipped to a global norm
    of `max_grad_norm` (None: not clipped), then the step through the scaler (skipped when fp16 gradients
    overflowed). Returns the norm before clipping, or None.

    A fused optimizer without loss scaling takes the clipping into its own pass over the gradients: it divides them
    by `grad_scale` = max(norm, max_grad_norm) / max_grad_norm (torch's fused kernels' argument; apex FusedLAMB
    divides so too), the same factor clip_by_global_norm multiplies by, and the gradients are read once for the
    norm instead of three times. Under loss scaling GradScaler hands torch's fused AdamW a grad_scale of its own, so
    there the gradients are clipped in place first."""
    if max_grad_norm is None:
        scaler.step(optimizer)
        return None
    scaler.unscale_(optimizer)
    if scaler.is_enabled() or not _clips_in_step(optimizer):
        norm = clip_by_global_norm(parameters, max_grad_norm)
        scaler.step(optimizer)
        return norm
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if not grads:
        scaler.step(optimizer)
        return torch.zeros(())
    norm = _global_norm(grads)
    optimizer.grad_scale = torch.clamp(norm, min=max_grad_norm) / max_grad_norm
    try:
        scaler.step(optimizer)
    finally:
        del optimizer.grad_scale
    return norm


def _clips_in_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` divides the gradients by its `grad_scale` attribute inside its step (torch's fused Adam
    family reads it so, as bertbench's fused rules do)."""
    if isinstance(optimizer, (AdamWeightDecay, Lamb)):
        return optimizer._fused_here()
    # torch's steps each group by its own "fused" (a checkpoint's groups bring theirs), not by the defaults
    return isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) and all(
        group.get("fused") for group in optimizer.param_groups
    )


def _without_dynamo_wrapper(method):
    """An Optimizer method without the torch._disable_dynamo wrapper torch puts on it (functools.wraps keeps the
    method as __wrapped__); the method as it is where torch gives it no such wrapper (or another one)."""
    wrapper_file = getattr(getattr(method, "__code__", None), "co_filename", "")
    if hasattr(method, "__wrapped__") and os.path.basename(wrapper_file) == "_compile.py":  # torch/_compile.py
        return method.__wrapped__
    return method


class _AdamMoments(torch.optim.Optimizer):
    """What the Adam-family rules share: settings checked once, and each group's tensors gathered into lists for the
    multi-tensor (torch._foreach_*) kernels, with the moments and step count under torch's state names."""

    name = "Adam"

    # torch.optim.Optimizer wraps these four in torch._disable_dynamo, whose first call imports torch._dynamo in
    # every run, compiled or not: with modeling's one disabled call, 1.9 s of the 4.7 s of CPU the README's GLUE
    # command took on a core here, and hundreds of modules read from a cluster's shared file system (DDP's forward
    # loads it in its own right). The wrapper matters only when they are called inside a compiled region, which they
    # never are here (the training step compiles the model and LAMB's update, not the optimizer's bookkeeping).
    add_param_group = _without_dynamo_wrapper(torch.optim.Optimizer.add_param_group)
    zero_grad = _without_dynamo_wrapper(torch.optim.Optimizer.zero_grad)
    state_dict = _without_dynamo_wrapper(torch.optim.Optimizer.state_dict)
    load_state_dict = _without_dynamo_wrapper(torch.optim.Optimizer.load_state_dict)

    def __init__(
        self,
        params: Iterable,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        fused: bool | None,
    ):
        if lr < 0 or eps <= 0 or not all(0 <= beta < 1 for beta in betas) or weight_decay < 0:
            raise ValueError(
                f"invalid {self.name} settings: lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}"
            )
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.fused = fused  # None: on FUSED_DEVICES. Not a group setting: a checkpoint's groups stay as they were
        self._fused_default: bool | None = None

    # Where the rule runs fused unless told: its fused form's devices.
    FUSED_DEVICES: frozenset[str] = frozenset({"cuda"})

    def _fused_here(self) -> bool:
        if self.fused is not None:
            return self.fused
        if self._fused_default is None:  # asked on every step (clip_and_step and each group): the parameters stay put
            self._fused_default = all(
                parameter.device.type in self.FUSED_DEVICES
                for group in self.param_groups
                for parameter in group["params"]
            )
        return self._fused_default

    def _gather(self, group: dict) -> tuple[list, list, list, list, list[int]]:
        """The group's parameters that have gradients, their gradients and moments, and their step counts, counting
        this step (state created on first use)."""
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for parameter in group["params"]:
            if parameter.grad is None:
                continue
            state = self.state[parameter]
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(parameter, memory_format=torch.preserve_format)
            state["step"] += 1
            params.append(parameter)
            grads.append(parameter.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        return params, grads, exp_avgs, exp_avg_sqs, steps

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, exp_avgs, exp_avg_sqs, steps = self._gather(group)
            if params:
                self._step_group(group, params, grads, exp_avgs, exp_avg_sqs, steps)
        return loss

    def _step_group(
        self, group: dict, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list[int]
    ) -> None:
        self._moments(group, grads, exp_avgs, exp_avg_sqs)
        self._update(group, params, grads, exp_avgs, exp_avg_sqs, steps)

    def _update(
        self, group: dict, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list[int]
    ) -> None:
        """The rule's step for one group's tensors, their moments already updated."""
        raise NotImplementedError

    def _moments(self, group: dict, grads: list, exp_avgs: list, exp_avg_sqs: list) -> None:
        """m = b1 m + (1 - b1) g (as a lerp, which torch's AdamW also uses: one pass instead of two, the same value up
        to rounding); v = b2 v + (1 - b2) g^2."""
        beta1, beta2 = group["betas"]
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)


class AdamWeightDecay(_AdamMoments):
    """Google's AdamWeightDecayOptimizer (google-research/bert optimization.py; also NVIDIA's TF BERT and apex
    FusedAdam with bias_correction=False): Adam without bias correction, decoupled weight decay.

        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p -= lr (m / (sqrt(v) + eps) + wd p)

    The step count is kept (state "step") though the rule does not read it, so that checkpoints of every rule here
    hold the same state: torch's names, the step an int as LAMB has always kept it."""

    name = "AdamWeightDecay"
    # torch's fused AdamW kernel runs on the CPU too, in one pass where the multi-tensor step makes seven: for a
    # small model with BERT's 30,522-word embedding table the step took 25 ms of a 90 ms training step eagerly on
    # the 2-core CPU (docs/training.md, "A small model's step on the CPU").
    FUSED_DEVICES = frozenset({"cpu", "cuda"})

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        fused: bool | None = None,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, fused)

    def _step_group(
        self, group: dict, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list[int]
    ) -> None:
        """With `fused`, the rule in one pass over each tensor: torch's fused AdamW kernel (one read and write of
        parameter, gradient and moments, where the multi-tensor step makes seven passes), given a step count so
        large that its bias corrections are exactly 1 (1 - 0.9^(2^30) is 1 in floating point): Google's rule.
        The kernel decays p by lr x wd x p before the Adam update, as _update below and Google do, and divides the
        gradients by `grad_scale` when clip_and_step sets it (the clipping)."""
        if not self._fused_here():
            super()._step_group(group, params, grads, exp_avgs, exp_avg_sqs, steps)
            return
        no_bias_correction = params[0].new_full((), 2.0**30, dtype=torch.float32)
        beta1, beta2 = group["betas"]
        torch._fused_adamw_(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            [no_bias_correction] * len(params),
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            amsgrad=False,
            maximize=False,
            grad_scale=getattr(self, "grad_scale", None),
        )

    def _update(
        self, group: dict, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list[int]
    ) -> None:
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denoms, group["eps"])
        # Google's p - lr (m / denom + wd p), decay first as p (1 - lr wd): the same value up to rounding, without
        # a buffer for the update.
        if group["weight_decay"]:
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
        torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-group["lr"])


class Lamb(_AdamMoments):
    """LAMB (You et al. 2020) as apex's FusedLAMB computes it with NVIDIA's PyTorch BERT settings (apex
    apex/optimizers/fused_lamb.py and csrc/multi_tensor_lamb.cu; bias_correction, adam_w_mode and grad_averaging on):

        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd p
        p -= lr ||p|| / ||u|| u   in a group whose weight decay is not 0 (or with use_nvlamb), when both norms are
                                  non-zero; otherwise p -= lr u, a plain Adam step (biases and LayerNorm)

    The norms are per tensor. use_nvlamb=True applies the trust ratio to every tensor: apex's use_nvlamb and NVIDIA's
    TF LAMBOptimizer (`nvlamb` in OPTIMIZERS). apex also clips the gradients to a global norm of 1.0 (its
    max_grad_norm); here the training step clips them the same way (clip_and_step): in place before the eager step,
    or inside the fused one, which divides them by `grad_scale` as apex's stage 1 does. The step count t is each
    parameter's own (apex counts one per group; they agree while every parameter has a gradient at every step).

    `fused` (default: on a GPU where torch.compile can run) steps each group through `_lamb_update` compiled: the
    same rule in a few fused kernels, compiled once per group (the learning rate and the step counts' bias
    corrections go in as tensors, so their change from step to step compiles nothing new)."""

    name = "LAMB"

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        use_nvlamb: bool = False,
        fused: bool | None = None,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, fused)
        self.use_nvlamb = use_nvlamb  # not a group setting, as in apex: a checkpoint's groups stay as they were

    def _fused_here(self) -> bool:
        if self.fused is None and not _triton_available():
            return False  # a GPU without Triton: inductor cannot compile for it
        return super()._fused_here()

    def _step_group(
        self, group: dict, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list[int]
    ) -> None:
        grad_scale = getattr(self, "grad_scale", None)
        if not self._fused_here():
            if grad_scale is not None:  # set for a fused step that fell back to the eager one (below)
                torch._foreach_div_(grads, grad_scale)
            super()._step_group(group, params, grads, exp_avgs, exp_avg_sqs, steps)
            return
        beta1, beta2 = group["betas"]
        # The scalars _update computes in float64 and the kernels apply in float32, computed here the same way and
        # sent to the device in one copy: the learning rate, then each tensor's eps x sqrt(bc2), then its
        # sqrt(bc2) / bc1.
        bias_correction2_sqrt = [math.sqrt(1 - beta2**step) for step in steps]
        scalars = torch.tensor(
            [
                group["lr"],
                *(group["eps"] * scale for scale in bias_correction2_sqrt),
                *(scale / (1 - beta1**step) for scale, step in zip(bias_correction2_sqrt, steps)),
            ],
            dtype=torch.float32,
        )
        scalars = scalars.to(params[0].device, non_blocking=True)
        try:
            compiled_lamb_update()(
                params,
                grads,
                exp_avgs,
                exp_avg_sqs,
                scalars,
                grad_scale,
                beta1,
                beta2,
                group["weight_decay"],
                self.use_nvlamb or bool(group["weight_decay"]),
            )
        except torch._dynamo.exc.TorchDynamoException as error:
            # Compiling fails before the graph runs, so nothing has changed yet: the run goes on with the eager rule
            # (the clipping the fused pass would have applied done in place first), and says so once.
            warnings.warn(
                f"fused LAMB could not be compiled here ({one_line(error)}); LAMB steps with the eager "
                "multi-tensor rule instead",
                RuntimeWarning,
                stacklevel=2,
            )
            self.fused = False
            self._step_group(group, params, grads, exp_avgs, exp_avg_sqs, steps)

    def _update(
        self, group: dict, params: list, grads: list, exp_avgs: list, exp_avg_sqs: list, steps: list[int]
    ) -> None:
        beta1, beta2 = group["betas"]
        lr, weight_decay = group["lr"], group["weight_decay"]
        # (m / bc1) / (sqrt(v / bc2) + eps) as m (sqrt(bc2) / bc1) / (sqrt(v) + eps sqrt(bc2)): the same value up to
        # rounding, one pass over the model fewer (torch's AdamW arranges it so too).
        bias_correction2_sqrt = [math.sqrt(1 - beta2**step) for step in steps]
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denoms, [group["eps"] * scale for scale in bias_correction2_sqrt])
        # The update goes into the gradients, as apex writes it: they are not read again (TrainStep sets them to
        # None right after the step), and the update needs no second buffer the size of the model.
        updates = grads
        torch._foreach_zero_(updates)
        torch._foreach_addcdiv_(
            updates, exp_avgs, denoms, [scale / (1 - beta1**step) for scale, step in zip(bias_correction2_sqrt, steps)]
        )
        del denoms
        if weight_decay:
            torch._foreach_add_(updates, params, alpha=weight_decay)
        if self.use_nvlamb or weight_decay:
            param_norms = torch.stack(torch._foreach_norm(params))
            update_norms = torch.stack(torch._foreach_norm(updates))
            ratios = torch.where(
                (param_norms != 0) & (update_norms != 0),
                lr * (param_norms / update_norms),
                torch.full_like(param_norms, lr),
            )
            torch._foreach_mul_(updates, ratios.unbind())
            torch._foreach_sub_(params, updates)
        else:
            torch._foreach_add_(params, updates, alpha=-lr)


def build_optimizer(
    model: nn.Module,
    name: str,
    learning_rate: float,
    weight_decay: float = 0.01,
    eps: float = 1e-6,
    betas: tuple[float, float] = (0.9, 0.999),
    adam_bias_correction: bool = False,
    fused: bool | None = None,
) -> torch.optim.Optimizer:
    """`name` from OPTIMIZERS over Google's parameter groups: adamw is Google's AdamWeightDecay, or with
    adam_bias_correction PyTorch's AdamW; lamb is apex's LAMB, nvlamb LAMB with the trust ratio on every tensor.
    Google's epsilon 1e-6. `fused`: the one-pass form of the rule (see the module docstring); None: where it is the
    default (torch's AdamW wherever the device supports its fused kernel, the others on a GPU)."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    groups = parameter_groups(model, weight_decay)
    kind = optimizer_class(name, adam_bias_correction)
    if kind is torch.optim.AdamW:
        return torch.optim.AdamW(
            groups, lr=learning_rate, betas=betas, eps=eps, fused=_fused_supported(model) if fused is None else fused
        )
    if kind is AdamWeightDecay:
        return AdamWeightDecay(groups, lr=learning_rate, betas=betas, eps=eps, fused=fused)
    return Lamb(groups, lr=learning_rate, betas=betas, eps=eps, use_nvlamb=name == "nvlamb", fused=fused)


def rule(optimizer: str, adam_bias_correction: bool) -> str:
    """The update rule of an optimizer name and adam_bias_correction (which only adamw reads), in words."""
    if optimizer == "adamw":
        return (
            "adamw with bias correction (torch.optim.AdamW)"
            if adam_bias_correction
            else "adamw without bias correction (Google's AdamWeightDecayOptimizer)"
        )
    return {"lamb": "lamb (apex FusedLAMB)", "nvlamb": "nvlamb (LAMB's trust ratio on every tensor)"}[optimizer]


def legacy_rule(optimizer: str) -> tuple[str, bool]:
    """(optimizer, adam_bias_correction) in today's names for a run recorded before bertbench had
    adam_bias_correction: its adamw was torch.optim.AdamW (bias-corrected) and its lamb put the trust ratio on every
    tensor (today's nvlamb). Other names (NVIDIA's adam) stay as they are."""
    return ("nvlamb" if optimizer == "lamb" else optimizer), True


def recorded_rule(fields: Mapping[str, Any]) -> tuple[str, bool]:
    """(optimizer, adam_bias_correction) of TrainConfig fields as a checkpoint records them (legacy_rule's for one
    written before adam_bias_correction existed)."""
    if "adam_bias_correction" not in fields:
        return legacy_rule(fields["optimizer"])
    return fields["optimizer"], fields["adam_bias_correction"]


def optimizer_class(optimizer: str, adam_bias_correction: bool) -> type[torch.optim.Optimizer]:
    """The class that build_optimizer makes, and so the form of its state."""
    if optimizer == "adamw":
        return torch.optim.AdamW if adam_bias_correction else AdamWeightDecay
    return Lamb


def _lamb_update(
    params: list,
    grads: list,
    exp_avgs: list,
    exp_avg_sqs: list,
    scalars: torch.Tensor,
    grad_scale: torch.Tensor | None,
    beta1: float,
    beta2: float,
    weight_decay: float,
    trust_ratio: bool,
) -> None:
    """Lamb._update after _moments, op for op, with the gradients divided by `grad_scale` (the clipping, when given)
    and the Python floats that change per step in `scalars` (see Lamb._step_group): what inductor compiles, reading
    gradients, parameters and moments once to write the moments and the update, the parameters and the update once
    for their norms (torch's multi-tensor norm), and the update and parameters once more to apply the trust ratio:
    52 bytes a parameter in fp32. The update is a buffer of inductor's rather than the gradients (writing it there
    too would cost 4 bytes more: inductor keeps the buffer either way); the gradients are left unclipped, which
    nothing reads after the step."""
    count = len(params)
    lr, eps_scaled, step_sizes = scalars[0], scalars[1 : 1 + count].unbind(), scalars[1 + count :].unbind()
    if grad_scale is not None:
        grads_in = torch._foreach_div(grads, grad_scale)
    else:
        grads_in = grads
    torch._foreach_lerp_(exp_avgs, grads_in, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads_in, grads_in, 1 - beta2)
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_add_(denoms, list(eps_scaled))
    updates = torch._foreach_mul(exp_avgs, list(step_sizes))
    torch._foreach_div_(updates, denoms)
    if weight_decay:
        torch._foreach_add_(updates, params, alpha=weight_decay)
    if trust_ratio:
        param_norms = torch.stack(torch._foreach_norm(params))
        update_norms = torch.stack(torch._foreach_norm(updates))
        ratios = torch.where(
            (param_norms != 0) & (update_norms != 0), lr * (param_norms / update_norms), lr.expand_as(param_norms)
        )
        torch._foreach_mul_(updates, list(ratios.unbind()))
    else:
        torch._foreach_mul_(updates, lr)
    torch._foreach_sub_(params, updates)


@functools.cache
def compiled_lamb_update():
    """The fused LAMB update compiled, once per process."""
    # dynamic=False: the tensors' shapes never change in a run, and static ones fuse best. One compiled graph per
    # group (its weight decay and tensor count differ), shared by every Lamb: dynamo's recompile limit (8 by
    # default) is per function, which a run's two groups, or lamb and nvlamb beside each other, stay under.
    return torch.compile(_lamb_update, fullgraph=True, dynamic=False)


def _triton_available() -> bool:
    from torch.utils._triton import has_triton

    return has_triton()


def _fused_supported(model: nn.Module) -> bool:
    devices = {parameter.device.type for parameter in model.parameters()}
    return devices <= {"cpu", "cuda"} and all(parameter.is_floating_point() for parameter in model.parameters())


def warmup_decay_factor(
    step: int,
    num_train_steps: int,
    num_warmup_steps: int,
    decay: str = "linear",
    power: float = 1.0,
    schedule: str = "google",
    end_factor: float = 0.0,
) -> float:
    """Multiplier of the peak learning rate at `step` (0 = the first update). google: the decay runs from step 0 and
    the warm-up overrides its first steps; hf: the decay runs from the peak at the warm-up's end, linear to 0 or
    polynomial to `end_factor` (HF's lr_end over the peak) and stays there after the last step."""
    if decay not in DECAYS:
        raise ValueError(f"unknown decay {decay!r}; choose one of {', '.join(DECAYS)}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if step < num_warmup_steps:
        return step / num_warmup_steps
    if schedule == "google":
        remaining = max(0.0, 1.0 - step / max(1, num_train_steps))
        return remaining if decay == "linear" else remaining**power
    if decay == "linear":
        return max(0.0, (num_train_steps - step) / max(1, num_train_steps - num_warmup_steps))
    if step >= num_train_steps:  # HF's value there, without its division by zero when the warm-up is every step
        return end_factor
    remaining = 1 - (step - num_warmup_steps) / (num_train_steps - num_warmup_steps)
    return (1 - end_factor) * remaining**power + end_factor


def warmup_decay_schedule(
    optimizer: torch.optim.Optimizer,
    num_train_steps: int,
    warmup_proportion: float = 0.1,
    decay: str = "linear",
    power: float = 1.0,
    schedule: str = "google",
    warmup_steps: int | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over `warmup_steps`, or warmup_proportion of the steps (Google's schedule rounds down, HF's
    up, as each computes it), then linear or polynomial decay to 0 at num_train_steps (warmup_decay_factor).
    Call `step()` after every optimizer step."""
    if num_train_steps < 1:
        raise ValueError(f"num_train_steps must be at least 1, got {num_train_steps}")
    if not 0.0 <= warmup_proportion <= 1.0:
        raise ValueError(f"warmup_proportion must be in [0, 1], got {warmup_proportion}")
    if warmup_steps is None:
        rounded = math.floor if schedule == "google" else math.ceil
        warmup_steps = rounded(num_train_steps * warmup_proportion)
    end_factor = HF_POLYNOMIAL_LR_END / optimizer.defaults["lr"] if schedule == "hf" and decay == "poly" else 0.0
    if end_factor >= 1:
        raise ValueError(f"HF's polynomial decay ends at {HF_POLYNOMIAL_LR_END}, above the peak learning rate")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: warmup_decay_factor(step, num_train_steps, warmup_steps, decay, power, schedule, end_factor),
    )
