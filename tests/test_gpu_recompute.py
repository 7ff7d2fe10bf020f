"""The selective recompute policy on a CUDA GPU (skipped without one), where its trade is made: flash or
memory-efficient attention keeps no score matrix, so the policy recomputes GELU only. Gradients match the baseline's
under bf16 autocast with dropout on, on the padded path (SDPA) and on packed rows (bertbench::varlen_attention's
flash kernel), and the saved bytes sit between full's and the baseline's: the baseline's less each GELU output."""

import pytest
import torch
from helpers import tiny_batch, tiny_config

from bertbench.model.factory import build_model
from bertbench.model.saved_activations import saved_activation_bytes

pytestmark = pytest.mark.gpu
CONFIG = tiny_config(num_hidden_layers=4)  # head_dim 16, which flash attention takes; Google's dropout 0.1


def bf16_step(policy, unpad, seed=7):
    """One forward+backward under bf16 autocast with dropout on: loss, gradients, saved bytes, the batch's mask."""
    torch.manual_seed(0)
    modeling_name = "baseline" if policy == "baseline" else "recompute"
    model = (
        build_model(
            "classification",
            CONFIG,
            modeling_name,
            "full" if policy == "baseline" else policy,
            unpad=unpad,
            attention_kernel="varlen" if unpad else None,
            num_labels=2,
        )
        .cuda()
        .train()
    )
    input_ids, token_type_ids, attention_mask = (t.cuda() for t in tiny_batch(CONFIG, batch=4, seq=32))
    labels = torch.tensor([0, 1, 1, 0], device="cuda")
    torch.manual_seed(seed)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, saved = saved_activation_bytes(
            lambda: model(input_ids, token_type_ids, attention_mask, labels=labels), model
        )
    out.loss.backward()
    return out.loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}, saved, attention_mask


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "varlen"])
def test_selective_matches_the_baseline_and_keeps_less_than_it_more_than_full(unpad):
    base_loss, base_grads, base_saved, mask = bf16_step("baseline", unpad)
    loss, grads, saved, _ = bf16_step("selective", unpad)
    _, other_grads, _, _ = bf16_step("baseline", unpad, seed=8)
    full_saved = bf16_step("full", unpad)[2]
    assert torch.equal(loss, base_loss)
    for name in grads:  # the attention kernels' backward may add in another order: compare with another seed's
        error = (grads[name] - base_grads[name]).norm() / base_grads[name].norm()
        other = (other_grads[name] - base_grads[name]).norm() / base_grads[name].norm()
        assert error < 1e-2 and other > 10 * error, (name, error, other)
    tokens = int(mask.sum()) if unpad else mask.numel()
    gelu_outputs = CONFIG.num_hidden_layers * tokens * CONFIG.intermediate_size * 2
    assert full_saved < saved < base_saved
    assert base_saved - saved == gelu_outputs, (base_saved, saved, gelu_outputs)
