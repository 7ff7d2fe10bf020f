"""TrainStep's fp16 loss scaling, one step at a time: a step whose gradients overflow changes nothing but the loss
scale (no update, no optimizer state, the schedule stays), and the next step updates and moves the schedule on."""

import pytest
import torch
from helpers import Overflowing, tiny_batch, tiny_config

from bertbench.model.factory import build_model
from bertbench.training.config import TrainConfig
from bertbench.training.step import TrainStep


@pytest.mark.parametrize("adam_bias_correction", [False, True])
def test_an_overflowing_fp16_step_changes_nothing_but_the_loss_scale(adam_bias_correction):
    torch.manual_seed(0)
    config = tiny_config(num_hidden_layers=1, hidden_size=32, intermediate_size=64)
    model = build_model("classification", config, num_labels=2)
    input_ids, token_type_ids, attention_mask = tiny_batch(config, batch=4, seq=16)
    data = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "labels": torch.tensor([0, 1, 1, 0]),
    }
    # No warm-up, linear decay over 10 steps: the learning rate of step k is 1e-3 x (1 - k/10).
    step = TrainStep(
        Overflowing(model, at_call=1),
        TrainConfig(
            num_train_steps=10,
            precision="fp16",
            learning_rate=1e-3,
            warmup_proportion=0.0,
            adam_bias_correction=adam_bias_correction,
        ),
    )
    initial = {name: tensor.clone() for name, tensor in model.state_dict().items()}

    skipped = step(iter([data]))
    assert skipped.skipped and skipped.learning_rate == 1e-3
    assert all(torch.equal(tensor, initial[name]) for name, tensor in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    # torch's fused AdamW (bias-corrected) sets its state up, but neither counts the step nor moves the moments;
    # Google's rule is not called
    assert all(
        int(state["step"]) == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()
        for state in step.optimizer.state.values()
    )
    assert step.schedule.last_epoch == 0 and step.optimizer.param_groups[0]["lr"] == 1e-3
    assert step.scaler.get_scale() == 2.0**16 * 0.5  # GradScaler's initial scale, backed off once

    taken = step(iter([data]))
    assert not taken.skipped and taken.learning_rate == 1e-3 and torch.isfinite(taken.loss)
    assert any(not torch.equal(tensor, initial[name]) for name, tensor in model.state_dict().items())
    assert {int(state["step"]) for state in step.optimizer.state.values()} == {1}
    assert step.schedule.last_epoch == 1 and step.optimizer.param_groups[0]["lr"] == pytest.approx(9e-4)
    assert step.scaler.get_scale() == 2.0**15  # grows only after 2000 good steps
