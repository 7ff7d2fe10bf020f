"""Optimizers and schedules against hand-computed values."""

import math

import pytest
import torch
from torch import nn

from bertbench import modeling, optim
from conftest import tiny_config


def test_weight_decay_skips_bias_and_layer_norm():
    model = modeling.BertForSequenceClassification(tiny_config(), num_labels=2)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed, undecayed = optim.parameter_groups(model, 0.01)
    assert decayed["weight_decay"] == 0.01 and undecayed["weight_decay"] == 0.0
    assert all(not names[id(p)].endswith("bias") and "LayerNorm" not in names[id(p)] for p in decayed["params"])
    assert all(names[id(p)].endswith("bias") or "LayerNorm" in names[id(p)] for p in undecayed["params"])
    assert len(decayed["params"]) + len(undecayed["params"]) == len(list(model.parameters()))


def test_schedule_is_googles_warmup_then_decay_over_the_whole_run():
    factor = lambda step, **kw: optim.warmup_decay_factor(step, num_train_steps=100, num_warmup_steps=10, **kw)
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


def test_lamb_zero_weights_take_a_plain_adam_step():
    bias = nn.Parameter(torch.zeros(3))
    bias.grad = torch.tensor([1.0, -2.0, 0.5])
    optim.Lamb([bias], lr=0.01, weight_decay=0.0).step()
    torch.testing.assert_close(bias.detach(), -0.01 * torch.sign(torch.tensor([1.0, -2.0, 0.5])), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", optim.OPTIMIZERS)
def test_optimizers_train_a_tiny_bert(name):
    torch.manual_seed(0)
    model = modeling.BertForSequenceClassification(tiny_config(hidden_dropout_prob=0.0,
                                                               attention_probs_dropout_prob=0.0), num_labels=2)
    optimizer = optim.build_optimizer(model, name, learning_rate=1e-3 if name == "adamw" else 5e-2)
    input_ids = torch.randint(5, 100, (8, 12))
    labels = torch.tensor([0, 1] * 4)
    first = model(input_ids, labels=labels).loss.item()
    for _ in range(30):
        model(input_ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert model(input_ids, labels=labels).loss.item() < 0.5 * first


def test_adamw_is_fused_on_cpu_and_unknown_names_fail():
    model = nn.Linear(3, 3)
    assert optim.build_optimizer(model, "adamw", 1e-3).defaults["fused"] is True
    with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
        optim.build_optimizer(model, "sgd", 1e-3)
    with pytest.raises(ValueError, match="invalid LAMB"):
        optim.Lamb(model.parameters(), lr=-1.0)
