"""Recompute BERT against the baseline: same numbers, fewer saved bytes, exactly the FLOPs each policy implies.

These run the padded path (unpad=False), where a block sees [batch, seq, hidden] and an SDPA mask; test_unpadded.py
runs the same checks on the unpadded path, whose blocks see packed rows and a Packing, with these helpers."""

import collections

import pytest
import torch
from helpers import POLICIES, SAVED_LIMITS, make, parse_model_flags, tiny_batch, tiny_config
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from bertbench.model import modeling, recompute
from bertbench.model.factory import build_model
from bertbench.model.saved_activations import saved_activation_bytes


def run_step(model, seed=7, batch=None):
    """One forward+backward in train mode (dropout on); returns loss, grads, saved bytes and FLOPs by op."""
    config = model.config
    input_ids, token_type_ids, attention_mask = batch or tiny_batch(config, batch=4, seq=32)
    labels = torch.tensor([0, 1, 1, 0])
    model.train()
    torch.manual_seed(seed)
    with FlopCounterMode(display=False) as counter:
        out, saved = saved_activation_bytes(
            lambda: model(input_ids, token_type_ids, attention_mask, labels=labels), model
        )
        out.loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    flops = {str(op): count for op, count in counter.get_flop_counts()["Global"].items()}
    return out.loss.detach(), grads, saved, flops


def layer_forward_flops(config, unpad=False):
    """FLOPs of one block's forward in train mode on run_step's batch, measured, not derived; `unpad`: on its real
    tokens packed into rows, with the CPU's default attention kernel."""
    layer = modeling.BertLayer(config).train()
    attention_mask = tiny_batch(config, batch=4, seq=32)[2]
    if unpad:
        mask = modeling.packer_for(modeling.BertModel(config), "cpu")(attention_mask)
        hidden = torch.randn(mask.tokens, config.hidden_size, requires_grad=True)
    else:
        mask = attention_mask.bool()[:, None, None, :]
        hidden = torch.randn(4, 32, config.hidden_size, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        layer(hidden, mask)
    return sum(counter.get_flop_counts()["Global"].values())


@pytest.mark.parametrize("policy, every_k", POLICIES)
def test_same_loss_and_gradients_with_dropout(policy, every_k):
    base_loss, base_grads, _, _ = run_step(make("baseline"))
    loss, grads, _, _ = run_step(make("recompute", policy, every_k))
    assert torch.equal(loss, base_loss)
    assert grads.keys() == base_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], base_grads[name], rtol=0, atol=0, msg=name)


def test_dropout_is_live_so_mask_replay_is_tested():
    """Recompute must replay the masks: with another seed the baseline's loss changes, so equality is not free."""
    assert not torch.equal(run_step(make("baseline"), seed=7)[0], run_step(make("baseline"), seed=8)[0])


@pytest.mark.parametrize("policy, every_k", POLICIES)
def test_recompute_saves_fewer_bytes(policy, every_k):
    _, _, base_saved, _ = run_step(make("baseline"))
    _, _, saved, _ = run_step(make("recompute", policy, every_k))
    assert saved < SAVED_LIMITS[policy] * base_saved, (policy, saved, base_saved)


def test_saved_bytes_order_follows_policies():
    saved = {name: run_step(make("recompute", name, 2))[2] for name in ("full", "every-k", "selective")}
    saved["baseline"] = run_step(make("baseline"))[2]
    assert saved["full"] < saved["every-k"] < saved["baseline"]
    assert saved["full"] < saved["selective"] < saved["baseline"]


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
@pytest.mark.parametrize("policy, every_k", POLICIES)
def test_recomputed_flops_are_what_the_policy_implies(policy, every_k, unpad):
    """On either path a checkpointed block runs its forward once more, on the rows that path computes (packed rows
    on the unpadded path: recompute does not undo the unpadding); the selective policy runs no matmul and no
    attention again (test_selective_recomputes_only_the_activation says what it runs)."""
    config = tiny_config(num_hidden_layers=4)
    _, _, _, base_flops = run_step(make("baseline", config=config, unpad=unpad))
    _, _, _, flops = run_step(make("recompute", policy, every_k, config=config, unpad=unpad))
    extra = sum(flops.values()) - sum(base_flops.values())
    checkpointed = recompute.checkpointed_layers(policy, config.num_hidden_layers, every_k)
    if policy == "selective":
        assert flops == base_flops
        return
    expected = len(checkpointed) * layer_forward_flops(config, unpad=unpad)
    assert expected > 0 and extra == expected, (policy, extra, expected)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that compute something (views left out) by name."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))


def step_ops(model):
    with OpCounter() as counter:
        run_step(model)
    return counter.counts


@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
def test_selective_recomputes_only_the_activation(unpad):
    """The selective step runs the baseline's ops and one GELU more per block, nothing else: no matmul, no attention,
    no dropout, no LayerNorm is recomputed, and no op is added to the forward."""
    config = tiny_config(num_hidden_layers=4)
    base = step_ops(make("baseline", config=config, unpad=unpad))
    selective = step_ops(make("recompute", "selective", config=config, unpad=unpad))
    assert selective - base == {"aten.gelu.default": config.num_hidden_layers}
    assert base - selective == {}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])
def test_selective_keeps_the_baseline_bytes_less_each_gelu_output(unpad, precision):
    """Exactly one tensor per block is not kept: GELU's output, [tokens, intermediate] in the compute dtype (the
    counter sees what the policy keeps under its own hook too, or the bytes would drop by the dense weights' copies
    under autocast)."""
    config = tiny_config(num_hidden_layers=4)
    input_ids, token_type_ids, attention_mask = tiny_batch(config, batch=4, seq=32)
    tokens = int(attention_mask.sum()) if unpad else attention_mask.numel()
    saved = {}
    for name in ("baseline", "recompute"):
        model = make(name, "selective", config=config, unpad=unpad).train()
        torch.manual_seed(7)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out, saved[name] = saved_activation_bytes(
                lambda: model(input_ids, token_type_ids, attention_mask, labels=torch.tensor([0, 1, 1, 0])), model
            )
        out.loss.backward()
    element = 2 if precision == "bf16" else 4
    gelu_outputs = config.num_hidden_layers * tokens * config.intermediate_size * element
    assert saved["baseline"] - saved["recompute"] == gelu_outputs, (saved, gelu_outputs)


def test_checkpointed_layer_indices():
    assert recompute.checkpointed_layers("full", 4) == [0, 1, 2, 3]
    assert recompute.checkpointed_layers("every-k", 12, 4) == [0, 4, 8]
    assert recompute.checkpointed_layers("selective", 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="unknown recompute policy"):
        recompute.checkpointed_layers("some", 4)
    with pytest.raises(ValueError, match="k >= 1"):
        recompute.checkpointed_layers("every-k", 4, 0)


@pytest.mark.parametrize(
    "name", ["BertModel", "BertForPreTraining", "BertForSequenceClassification", "BertForQuestionAnswering"]
)
def test_same_interface_and_state_dict_names(name):
    config = tiny_config()
    head_kwargs = {"num_labels": 3} if name == "BertForSequenceClassification" else {}
    torch.manual_seed(0)
    baseline = getattr(modeling, name)(config, **head_kwargs)
    checkpointed = getattr(recompute, name)(config, policy="selective", **head_kwargs)
    assert isinstance(checkpointed, getattr(modeling, name))
    assert checkpointed.recompute_policy == "selective"
    assert list(baseline.state_dict()) == list(checkpointed.state_dict())
    checkpointed.load_state_dict(baseline.state_dict())  # a checkpoint of one loads in the other
    input_ids, token_type_ids, attention_mask = tiny_batch(config)
    baseline.eval(), checkpointed.eval()
    with torch.no_grad():
        first = baseline(input_ids, token_type_ids, attention_mask)
        second = checkpointed(input_ids, token_type_ids, attention_mask)
    for field in vars(first):
        if isinstance(getattr(first, field), torch.Tensor):
            assert torch.equal(getattr(first, field), getattr(second, field)), field


def test_pretraining_with_positions_same_gradients():
    config = tiny_config()
    input_ids, token_type_ids, attention_mask = tiny_batch(config, batch=2, seq=16)
    positions = torch.tensor([[1, 2, 5], [3, 4, 0]])
    labels = torch.tensor([[5, 6, 7], [8, 9, -100]])
    grads = []
    for model_name in ("baseline", "recompute"):
        torch.manual_seed(0)
        model = build_model("pretraining", config, model_name, "full").train()
        torch.manual_seed(3)
        out = model(
            input_ids,
            token_type_ids,
            attention_mask,
            masked_lm_positions=positions,
            masked_lm_labels=labels,
            next_sentence_labels=torch.tensor([0, 1]),
        )
        out.loss.backward()
        grads.append(model.bert.embeddings.word_embeddings.weight.grad)
    assert torch.equal(grads[0], grads[1])


def test_apply_twice_and_unknown_names_are_refused():
    model = make("recompute", "full")
    with pytest.raises(ValueError, match="already applied"):
        recompute.apply_recompute(model, "selective")
    with pytest.raises(ValueError, match="no BertLayer"):
        recompute.apply_recompute(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown modeling"):
        build_model("classification", tiny_config(), "v3", num_labels=2)
    with pytest.raises(ValueError, match="unknown task"):
        build_model("ner", tiny_config())


def autocast_step(model, device):
    input_ids, token_type_ids, attention_mask = (t.to(device) for t in tiny_batch(model.config, batch=4, seq=32))
    model.to(device).train()
    torch.manual_seed(5)
    with torch.autocast(device_type=device, dtype=torch.bfloat16):
        out = model(input_ids, token_type_ids, attention_mask, labels=torch.tensor([0, 1, 1, 0], device=device))
    out.loss.backward()
    return out.loss.detach(), {name: p.grad for name, p in model.named_parameters()}


def assert_recompute_matches_under_bf16(device):
    base_loss, base_grads = autocast_step(make("baseline"), device)
    assert base_loss.dtype == torch.float32  # the loss is computed in fp32 even under autocast
    for policy in ("full", "selective"):
        loss, grads = autocast_step(make("recompute", policy), device)
        assert torch.equal(loss, base_loss), policy
        for name in grads:
            torch.testing.assert_close(grads[name], base_grads[name], rtol=0, atol=0, msg=name)


def test_recompute_matches_under_bf16_autocast_on_cpu():
    assert_recompute_matches_under_bf16("cpu")


@pytest.mark.gpu
def test_recompute_matches_under_bf16_autocast_on_cuda():
    assert_recompute_matches_under_bf16("cuda")


@pytest.mark.gpu
def test_cuda_recompute_keeps_less_allocated_memory():
    """On the GPU the saving is real allocator memory, not only a count of saved tensors."""
    peaks = {}
    for name, policy in (("baseline", None), ("recompute", "full")):
        model = make(name, policy or "full", config=tiny_config(num_hidden_layers=4, hidden_size=64)).cuda().train()
        input_ids, token_type_ids, attention_mask = (t.cuda() for t in tiny_batch(model.config, batch=16, seq=64))
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        loss = model(
            input_ids, token_type_ids, attention_mask, labels=torch.zeros(16, dtype=torch.long, device="cuda")
        ).loss
        peaks[name] = torch.cuda.max_memory_allocated() - before
        loss.backward()
    assert peaks["recompute"] < peaks["baseline"]


def test_modeling_flags_build_the_chosen_module():
    baseline = parse_model_flags([]).build("classification", tiny_config(), num_labels=2)
    assert not hasattr(baseline, "recompute_policy")
    # the TF-style underscore spelling is accepted too, as the original runners' flags are
    args = parse_model_flags(["--modeling", "recompute", "--recompute_policy", "every-k", "--recompute-every", "3"])
    model = args.build("pretraining", tiny_config(num_hidden_layers=4))
    assert model.recompute_policy == "every-3"
    with pytest.raises(SystemExit):
        parse_model_flags(["--recompute-policy", "half"])
