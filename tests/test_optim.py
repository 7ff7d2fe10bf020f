"""Optimizers, clipping and schedules: each update rule step by step against a NumPy transcription of its source
(optimizer_references: Google's AdamWeightDecayOptimizer, torch's AdamW, apex's FusedLAMB), through the real
TrainStep with clipping engaged, and against the trajectory Google's own code wrote (fixtures/google_bert)."""

import copy
import functools
import io
import math

import numpy as np
import pytest
import torch
from helpers import tiny_config
from optimizer_references import (
    AdamWeightDecay,
    FedGradients,
    FusedLamb,
    clip_by_global_norm,
    global_norm,
    google_trajectory,
)
from torch import nn

from bertbench.model import modeling
from bertbench.training import optim
from bertbench.training.config import TrainConfig
from bertbench.training.step import TrainStep

# (optimizer, adam_bias_correction): every rule build_optimizer makes.
RULES = [("adamw", False), ("adamw", True), ("lamb", False), ("nvlamb", False)]


def initial_values(seed: int = 0) -> dict[str, np.ndarray]:
    """A decayed embedding and kernel, zero-initialised biases, LayerNorm at ones and zeros (BERT's initialisation)."""
    rng = np.random.default_rng(seed)
    return {
        "embeddings.word_embeddings.weight": rng.normal(0, 0.02, (10, 4)).astype(np.float32),
        "dense.weight": rng.normal(0, 0.5, (6, 4)).astype(np.float32),
        "dense.bias": np.zeros(6, np.float32),
        "LayerNorm.weight": np.ones(6, np.float32),
        "LayerNorm.bias": np.zeros(6, np.float32),
    }


def decays(names, weight_decay: float = 0.01) -> list[float]:
    """Google's exclusions, written out: no decay on biases and LayerNorm."""
    return [0.0 if name.endswith("bias") or "LayerNorm" in name else weight_decay for name in names]


def gradient_stream(initial: dict[str, np.ndarray], steps: int, seed: int = 1):
    """Gradients of every magnitude: a per-step scale from 1e-4 (where epsilon matters) to about 10."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        scale = 10.0 ** rng.uniform(-4, 1)
        yield {name: (scale * rng.normal(size=value.shape)).astype(np.float32) for name, value in initial.items()}


def reference_for(name: str, bias_correction: bool, initial: dict[str, np.ndarray], max_grad_norm: float | None):
    """The source's rule; `max_grad_norm`: the clipping before the step (apex clips inside FusedLAMB)."""
    names, values = list(initial), list(initial.values())
    if name == "adamw":
        reference = AdamWeightDecay(values, [bool(decay) for decay in decays(names)], bias_correction=bias_correction)
        if max_grad_norm is None:
            return reference, reference.step
        return reference, lambda grads, lr: reference.step(clip_by_global_norm(grads, max_grad_norm), lr)
    reference = FusedLamb(values, decays(names), max_grad_norm=max_grad_norm, use_nvlamb=name == "nvlamb")
    return reference, reference.step


def assert_matches(model: nn.Module, reference, names, step: int, rtol: float = 1e-5) -> None:
    parameters = dict(model.named_parameters())
    for name, expected in zip(names, reference.params):
        np.testing.assert_allclose(
            parameters[name].detach().numpy(), expected, rtol=rtol, atol=1e-7, err_msg=f"{name} after step {step + 1}"
        )


@pytest.mark.parametrize("bias_correction, expected", [(False, 0.6838), (True, 0.9)])
def test_one_step_of_each_adam_rule(bias_correction, expected):
    # p = 1, g = 0.5, lr 0.1, no decay. Google: m = 0.05, v = 0.00025, p - 0.1 x 0.05 / (0.0158 + 1e-6) = 0.6838;
    # with bias correction the first step is lr x sign(g): 0.9.
    model = nn.Linear(1, 1, bias=False)
    nn.init.ones_(model.weight)
    model.weight.grad = torch.tensor([[0.5]])
    optim.build_optimizer(model, "adamw", 0.1, weight_decay=0.0, adam_bias_correction=bias_correction).step()
    assert model.weight.item() == pytest.approx(expected, abs=5e-5)


@pytest.mark.parametrize("name, bias_correction", RULES)
def test_each_rule_follows_its_source_step_by_step(name, bias_correction):
    initial = initial_values()
    model = FedGradients(initial)
    optimizer = optim.build_optimizer(model, name, 1.0, adam_bias_correction=bias_correction)
    reference, reference_step = reference_for(name, bias_correction, initial, max_grad_norm=None)
    parameters = dict(model.named_parameters())
    peak = 1e-2 if name == "adamw" else 5e-2
    for step, grads in enumerate(gradient_stream(initial, 60)):
        lr = peak * optim.warmup_decay_factor(step, 60, 6)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for parameter_name, grad in grads.items():
            parameters[parameter_name].grad = torch.from_numpy(grad.copy())
        optimizer.step()
        reference_step(list(grads.values()), lr)
        assert_matches(model, reference, list(initial), step)
    # the rules do differ on these tensors: a rule swapped for another would fail
    assert not np.allclose(parameters["LayerNorm.weight"].detach().numpy(), 1.0, atol=1e-3)


def compile_lamb_with(monkeypatch, backend: str) -> None:
    """The fused LAMB compiled with `backend`, in this test only (a cache of its own, dynamo's state reset)."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=backend))
    monkeypatch.setattr(optim, "compiled_lamb_update", functools.cache(optim.compiled_lamb_update.__wrapped__))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


@pytest.mark.parametrize(
    "name, bias_correction, fused",
    [(*rule, None) for rule in RULES] + [("adamw", False, True), ("lamb", False, True), ("nvlamb", False, True)],
)
def test_train_step_clips_then_steps_as_the_source(name, bias_correction, fused, monkeypatch):
    """The real step: TrainStep's clipping at 1.0 (Google's and apex's formula), the optimizer, the schedule; also
    with the fused rules a GPU runs, forced on the CPU, which take the clipping into their own pass (torch's AdamW
    does so on the CPU too). The fused LAMB is traced as a run traces it, without inductor's C++ code generation
    (test_fused_lamb_is_the_eager_rule_and_compiles_once_per_group runs that), which cost each of the two fused
    LAMB cases here about 10 CPU-seconds on an empty inductor cache."""
    if fused and name != "adamw":
        compile_lamb_with(monkeypatch, "aot_eager_decomp_partition")
    initial = initial_values(seed=2)
    model = FedGradients(initial)
    step = TrainStep(
        model,
        TrainConfig(
            num_train_steps=60,
            learning_rate=1e-2 if name == "adamw" else 5e-2,
            optimizer=name,
            adam_bias_correction=bias_correction,
        ),
    )
    if fused is not None:
        step.optimizer.fused = fused
    reference, reference_step = reference_for(name, bias_correction, initial, max_grad_norm=1.0)
    clipped = 0
    for index, grads in enumerate(gradient_stream(initial, 60, seed=3)):
        result = step(iter([{key: torch.from_numpy(grad) for key, grad in grads.items()}]))
        norm = global_norm(list(grads.values()))
        assert result.grad_norm.item() == pytest.approx(norm, rel=1e-6)
        clipped += norm > 1.0
        reference_step(list(grads.values()), result.learning_rate)
        assert_matches(model, reference, list(initial), index)
    assert 10 <= clipped <= 50  # clipping engaged on some steps, not on others


@pytest.mark.parametrize("name, bias_correction", RULES)
def test_state_dict_round_trip_continues_bit_identically(name, bias_correction):
    initial = initial_values()
    model = FedGradients(initial)
    optimizer = optim.build_optimizer(model, name, 1e-2, adam_bias_correction=bias_correction)
    grads = list(gradient_stream(initial, 20))

    def run(model, optimizer, stream):
        parameters = dict(model.named_parameters())
        for fed in stream:
            for key, grad in fed.items():
                parameters[key].grad = torch.from_numpy(grad.copy())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    run(model, optimizer, grads[:10])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    twin = FedGradients(initial)
    twin.load_state_dict(saved["model"])
    twin_optimizer = optim.build_optimizer(twin, name, 1e-2, adam_bias_correction=bias_correction)
    twin_optimizer.load_state_dict(saved["optimizer"])
    run(model, optimizer, grads[10:])
    run(twin, twin_optimizer, grads[10:])
    for (key, parameter), twin_parameter in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(parameter, twin_parameter), key
    assert {int(state["step"]) for state in twin_optimizer.state.values()} == {20}


def test_train_step_follows_googles_own_trajectory():
    """300 steps of Google's create_optimizer (AdamWeightDecayOptimizer, warm-up + linear decay, clipping at 1.0),
    written by TensorFlow: the same gradients through bertbench's TrainStep give Google's weights, as closely as the
    float64 transcription of Google's rule does (the float32 rounding of Google's own run), and Google's learning
    rates, with the multi-tensor step and with the fused one a GPU runs; with bias correction they do not."""
    google = google_trajectory()
    assert list(google.initial) == ["dense.weight", "dense.bias", "LayerNorm.weight", "LayerNorm.bias"]
    assert (google.num_train_steps, google.init_lr, google.num_warmup_steps) == (300, 0.01, 30)
    steps = google.num_train_steps

    def largest_difference(weights_after_each_step) -> float:
        return max(
            float(np.max(np.abs(np.asarray(weights[name]) - google.params[t][name])))
            for t, weights in enumerate(weights_after_each_step)
            for name in google.initial
        )

    def bertbench(bias_correction: bool, fused: bool | None = None):
        model = FedGradients(google.initial)
        train = TrainStep(
            model,
            TrainConfig(
                num_train_steps=steps, learning_rate=0.01, warmup_proportion=0.1, adam_bias_correction=bias_correction
            ),
        )
        if fused is not None:  # the one-pass kernel a GPU runs, here on the CPU
            train.optimizer.fused = fused
        for t in range(steps):
            result = train(iter([{name: torch.from_numpy(grad) for name, grad in google.grads[t].items()}]))
            # TF computes the schedule in float32
            assert result.learning_rate == pytest.approx(float(google.learning_rates[t]), rel=1e-5, abs=1e-12)
            yield {name: parameter.detach().numpy().copy() for name, parameter in model.named_parameters()}

    def transcription():
        reference = AdamWeightDecay(list(google.initial.values()), [True, False, False, False])
        for t in range(steps):
            reference.step(clip_by_global_norm(list(google.grads[t].values()), 1.0), float(google.learning_rates[t]))
            yield dict(zip(google.initial, reference.params))

    googles_rounding = largest_difference(transcription())
    assert 0 < googles_rounding < 1e-5  # weights of about 1, 300 float32 steps
    assert largest_difference(bertbench(bias_correction=False)) <= 2 * googles_rounding
    assert largest_difference(bertbench(bias_correction=False, fused=True)) <= 2 * googles_rounding
    assert largest_difference(bertbench(bias_correction=True)) > 100 * googles_rounding


def test_clipping_is_googles_and_returns_the_norm_before_it():
    first, second = nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2))
    first.grad, second.grad = torch.tensor([3.0, 0.0, 0.0]), torch.tensor([0.0, 4.0])
    assert optim.clip_by_global_norm([first, second], 1.0).item() == 5.0
    # g x 1 / max(5, 1) exactly; torch's clip_grad_norm_ divides by 5 + 1e-6
    assert torch.equal(first.grad, torch.tensor([3.0, 0.0, 0.0]) * torch.tensor(0.2))
    assert torch.equal(second.grad, torch.tensor([0.0, 4.0]) * torch.tensor(0.2))
    small = torch.tensor([0.3, -0.4])
    first.grad, second.grad = None, small.clone()
    assert optim.clip_by_global_norm([first, second], 1.0).item() == pytest.approx(0.5)
    assert torch.equal(second.grad, small)  # below the threshold: untouched


def test_lamb_step_matches_hand_computation():
    weight = nn.Parameter(torch.tensor([3.0, 4.0]))  # norm 5
    weight.grad = torch.tensor([0.5, -1.0])
    lamb = optim.Lamb([weight], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    lamb.step()
    # first step: bias-corrected m = g, v = g^2, so the Adam direction is sign(g) (up to eps)
    direction = torch.tensor([0.5, -1.0]) / (torch.tensor([0.5, 1.0]) + 1e-6)
    update = direction + 0.01 * torch.tensor([3.0, 4.0])
    trust = 5.0 / update.norm()
    torch.testing.assert_close(weight.detach(), torch.tensor([3.0, 4.0]) - 0.1 * trust * update)


@pytest.mark.parametrize("use_nvlamb", [False, True])
def test_undecayed_tensors_take_a_plain_adam_step_unless_nvlamb(use_nvlamb):
    gamma = nn.Parameter(torch.tensor([3.0, 4.0]))  # a LayerNorm weight: norm 5, no decay
    gamma.grad = torch.tensor([0.5, -1.0])
    optim.Lamb([gamma], lr=0.01, weight_decay=0.0, use_nvlamb=use_nvlamb).step()
    update = torch.tensor([1.0, -1.0])  # sign(g), up to eps
    ratio = 5.0 / math.sqrt(2) if use_nvlamb else 1.0
    torch.testing.assert_close(gamma.detach(), torch.tensor([3.0, 4.0]) - 0.01 * ratio * update, atol=1e-6, rtol=0)


def test_lamb_zero_weights_take_a_plain_adam_step():
    bias = nn.Parameter(torch.zeros(3))
    bias.grad = torch.tensor([1.0, -2.0, 0.5])
    optim.Lamb([bias], lr=0.01, use_nvlamb=True).step()  # a zero norm falls back to lr, even with the trust ratio
    torch.testing.assert_close(bias.detach(), -0.01 * torch.sign(torch.tensor([1.0, -2.0, 0.5])), atol=1e-6, rtol=0)


def test_weight_decay_skips_bias_and_layer_norm():
    model = modeling.BertForSequenceClassification(tiny_config(), num_labels=2)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed, undecayed = optim.parameter_groups(model, 0.01)
    assert decayed["weight_decay"] == 0.01 and undecayed["weight_decay"] == 0.0
    assert all(not names[id(p)].endswith("bias") and "LayerNorm" not in names[id(p)] for p in decayed["params"])
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in undecayed["params"])
    assert len(decayed["params"]) + len(undecayed["params"]) == len(list(model.parameters()))


def test_schedule_is_googles_warmup_then_decay_over_the_whole_run():
    def factor(step, **kw):
        return optim.warmup_decay_factor(step, num_train_steps=100, num_warmup_steps=10, **kw)

    assert [factor(step) for step in (0, 5, 9)] == [0.0, 0.5, 0.9]
    assert factor(10) == pytest.approx(0.9)  # decay counts from step 0, so it starts below the peak
    assert factor(50) == pytest.approx(0.5) and factor(100) == 0.0 and factor(150) == 0.0
    assert factor(50, decay="poly", power=0.5) == pytest.approx(math.sqrt(0.5))
    with pytest.raises(ValueError, match="unknown decay"):
        factor(5, decay="cosine")


def test_schedule_drives_the_optimizer_learning_rate():
    parameter = nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    schedule = optim.warmup_decay_schedule(optimizer, num_train_steps=20, warmup_proportion=0.25)
    rates = []
    for _ in range(20):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[:6] == pytest.approx([0.0, 0.4, 0.8, 1.2, 1.6, 2.0 * (1 - 5 / 20)])
    assert rates[-1] == pytest.approx(2.0 * (1 - 19 / 20))
    with pytest.raises(ValueError, match="warmup_proportion"):
        optim.warmup_decay_schedule(optimizer, 10, warmup_proportion=1.5)


def rates(schedule_args, steps, lr=1e-3):
    """The learning rate of each of `steps` optimizer steps under warmup_decay_schedule(**schedule_args)."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(2))], lr=lr)
    schedule = optim.warmup_decay_schedule(optimizer, num_train_steps=steps, **schedule_args)
    seen = []
    for _ in range(steps + 1):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return seen


def test_hfs_schedule_decays_from_the_peak_at_the_warmup_end_as_hf_trainers_get_scheduler():
    """HF's get_linear_schedule_with_warmup and get_polynomial_decay_schedule_with_warmup (lr_end 1e-7, power 1),
    their formulas evaluated by hand for 10 steps, 2 of warm-up."""
    linear = rates({"warmup_proportion": 0.2, "schedule": "hf"}, 10)
    assert linear == pytest.approx([0.0, 5e-4, 1e-3, 8.75e-4, 7.5e-4, 6.25e-4, 5e-4, 3.75e-4, 2.5e-4, 1.25e-4, 0.0])
    poly = rates({"warmup_proportion": 0.2, "schedule": "hf", "decay": "poly"}, 10)
    assert poly[:3] == pytest.approx([0.0, 5e-4, 1e-3])
    assert poly[6] == pytest.approx((1e-3 - 1e-7) * 0.5 + 1e-7) and poly[10] == pytest.approx(1e-7)
    google = rates({"warmup_proportion": 0.2}, 10)
    assert google[2] == pytest.approx(8e-4)  # Google's decay counts from step 0
    # HF rounds the warm-up up, math.ceil(100 * 0.07) = 8 in floating point; Google's rounds down to 7
    assert [rates({"warmup_proportion": 0.07, "schedule": schedule}, 100)[7] for schedule in ("hf", "google")] == (
        pytest.approx([1e-3 * 7 / 8, 1e-3 * (1 - 7 / 100)])
    )
    # a warm-up given in steps is that many, every step of the run in warm-up included
    assert rates({"warmup_steps": 10, "schedule": "hf", "decay": "poly"}, 10)[9:] == pytest.approx([9e-4, 1e-7])


def test_the_optimizer_takes_the_configs_betas_and_epsilon():
    model = modeling.BertForSequenceClassification(tiny_config(), num_labels=2)
    config = TrainConfig(num_train_steps=2, adam_beta1=0.8, adam_beta2=0.98, adam_epsilon=1e-8)
    for group in TrainStep(model, config).optimizer.param_groups:
        assert (group["betas"], group["eps"]) == ((0.8, 0.98), 1e-8)


@pytest.mark.parametrize("name, bias_correction", RULES)
def test_each_rule_trains_a_tiny_bert(name, bias_correction):
    torch.manual_seed(0)
    model = modeling.BertForSequenceClassification(
        tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), num_labels=2
    )
    optimizer = optim.build_optimizer(
        model, name, learning_rate=1e-3 if name == "adamw" else 5e-2, adam_bias_correction=bias_correction
    )
    input_ids = torch.randint(5, 100, (8, 12))
    labels = torch.tensor([0, 1] * 4)
    first = model(input_ids, labels=labels).loss.item()
    for _ in range(30):
        model(input_ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert model(input_ids, labels=labels).loss.item() < 0.5 * first


def test_bias_corrected_adamw_is_torchs_fused_and_unknown_names_fail():
    model = nn.Linear(3, 3)
    assert optim.build_optimizer(model, "adamw", 1e-3, adam_bias_correction=True).defaults["fused"] is True
    assert type(optim.build_optimizer(model, "adamw", 1e-3)) is optim.AdamWeightDecay
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        optim.build_optimizer(model, "sgd", 1e-3)
    with pytest.raises(ValueError, match="invalid LAMB"):
        optim.Lamb(model.parameters(), lr=-1.0)


# lamb through inductor, as a run compiles it; nvlamb, whose difference is the trust ratio on every tensor (Python the
# tracing sees), through inductor's decompositions and partitioner without its C++ code generation: inductor's code
# for the same foreach ops is lamb's. On a machine that never compiled (empty temporary directory) lamb's case costs
# about 17 CPU-seconds, most of them inductor's per-machine checks of the CPU's vector instructions and its
# precompiled header: with one graph instead of three it cost the same.
@pytest.mark.parametrize("name, backend", [("lamb", "inductor"), ("nvlamb", "aot_eager_decomp_partition")])
def test_fused_lamb_is_the_eager_rule_and_compiles_once_per_group(name, backend, monkeypatch):
    """The compiled LAMB a GPU runs, forced on the CPU, against the eager rule: equal up to float rounding after six
    steps of both groups, with the clipping folded into the step (clip_and_step) and a parameter whose gradient is
    missing every other step; the learning rate and step count change every step and compile nothing new."""
    compile_lamb_with(monkeypatch, backend)
    torch.manual_seed(0)
    # A model's kinds of tensor in both groups (an embedding and a kernel decayed, a bias and LayerNorm not): inductor
    # compiles each group into one kernel whose code, and compile time, grow with the tensors it updates (25 in a
    # BERT of one layer took 23 CPU-seconds on an empty inductor cache, these 5 take 12, the precompiled header built).
    model = FedGradients(initial_values())
    twins = {fused: copy.deepcopy(model) for fused in (False, True)}
    optimizers = {fused: optim.build_optimizer(twins[fused], name, 1e-2, fused=fused) for fused in twins}
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    for step in range(6):
        grads = {key: (step + 1) * torch.randn_like(parameter) for key, parameter in model.named_parameters()}
        for fused, twin in twins.items():
            for key, parameter in twin.named_parameters():
                parameter.grad = None if key == "dense.bias" and step % 2 else grads[key].clone()
            for group in optimizers[fused].param_groups:
                group["lr"] = 1e-2 * (step + 1)
            assert optim.clip_and_step(optimizers[fused], twin.parameters(), 1.0, scaler).item() > 1.0  # clipped
    eager, fused = (dict(twins[key].named_parameters()) for key in (False, True))
    eager_state, fused_state = (optimizers[key].state_dict()["state"] for key in (False, True))
    for key in eager:
        assert not torch.equal(eager[key], model.get_parameter(key)), key
        torch.testing.assert_close(fused[key], eager[key], rtol=1e-6, atol=1e-7, msg=key)
    for index in eager_state:
        assert fused_state[index]["step"] == eager_state[index]["step"]
        for moment in ("exp_avg", "exp_avg_sq"):  # m cancels towards 0: rounding relative to the largest entry
            expected = eager_state[index][moment]
            torch.testing.assert_close(
                fused_state[index][moment], expected, rtol=0, atol=1e-6 * expected.abs().max().item()
            )
    # a graph for each group, and one for the undecayed group a tensor short (the missing gradient); none per step
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 3


def test_fused_lamb_that_cannot_compile_steps_eagerly_clipped_and_says_so(monkeypatch):
    """Inductor failing on a machine (no working Triton, a compiler error) must not stop a run: the step that found
    it takes the eager rule, with the clipping the fused pass would have folded in, and warns once."""

    def failing():
        def compiled(*args):
            raise torch._dynamo.exc.BackendCompilerFailed(lambda *a: None, RuntimeError("triton missing"), None)

        return compiled

    monkeypatch.setattr(optim, "compiled_lamb_update", failing)
    torch.manual_seed(0)
    model = modeling.BertForSequenceClassification(tiny_config(), num_labels=2)
    twins = {fused: copy.deepcopy(model) for fused in (False, True)}
    optimizers = {fused: optim.build_optimizer(twins[fused], "lamb", 1e-2, fused=fused) for fused in twins}
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    for step in range(2):
        grads = {key: 5 * torch.randn_like(parameter) for key, parameter in model.named_parameters()}
        for fused, twin in twins.items():
            for key, parameter in twin.named_parameters():
                parameter.grad = grads[key].clone()
            if fused and step == 0:
                with pytest.warns(RuntimeWarning, match="fused LAMB could not be compiled here .*triton missing"):
                    optim.clip_and_step(optimizers[fused], twin.parameters(), 1.0, scaler)
            else:
                optim.clip_and_step(optimizers[fused], twin.parameters(), 1.0, scaler)
    assert optimizers[True].fused is False
    for (key, eager), (_, fallen_back) in zip(twins[False].named_parameters(), twins[True].named_parameters()):
        assert not torch.equal(eager, model.get_parameter(key)), key
        # clipped by dividing by the fused pass's grad_scale, where the eager clip multiplies by its inverse
        torch.testing.assert_close(fallen_back, eager, rtol=1e-6, atol=1e-7, msg=key)
