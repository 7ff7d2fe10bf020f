"""The unpadded path (bertbench.model.packing, bertbench.model.attention) against the padded one: the same maths on the real
tokens for every head and every attention kernel, a mask of any shape, bucketed rows, which path a batch takes,
weights and state dicts shared by both paths, recompute on packed rows, the flags that choose the path, and the
FLOPs the padding no longer costs."""

import copy
import functools
import math

import pytest
import torch
from helpers import (
    HEAD_KWARGS,
    POLICIES,
    SAVED_LIMITS,
    SEQ,
    assert_close_to_fp64,
    classifier_flags,
    forward_backward,
    lengths_mask,
    make,
    parse_model_flags,
    tiny_batch,
    tiny_config,
    varied_batch,
    write_bert_dir,
)
from torch.utils.flop_counter import FlopCounterMode

from bertbench.model import attention, modeling
from bertbench.model.factory import TASKS, build_model
from bertbench.model.packing import Packer, Packing, bucket_rows, filler_slots
from bertbench.model.saved_activations import saved_activation_bytes

KERNELS = attention.ATTENTION_KERNELS
NO_DROPOUT = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
LENGTHS = (12, 1, 7, 4)  # a full-length sequence, a one-token one and two between


def assert_paths_agree(task, kernel, batch, config=NO_DROPOUT):
    """The unpadded path with `kernel` against the padded path in fp32 and fp64, same weights, dropout off."""
    torch.manual_seed(0)
    ours = build_model(task, config, unpad=True, attention_kernel=kernel, **HEAD_KWARGS.get(task, {}))
    padded = modeling.set_unpadding(copy.deepcopy(ours), False)
    fp64 = copy.deepcopy(padded).double()
    with torch.no_grad():  # the unpadded model does run unpadded, with this kernel
        bert = ours if task == "encoder" else ours.bert
        assert bert(*batch).packing.kernel == resolved(kernel, bert(*batch).packing)
    got = forward_backward(ours, task, batch)
    expected32, expected64 = forward_backward(padded, task, batch), forward_backward(fp64, task, batch)
    assert got.keys() == expected64.keys()
    for name in got:
        assert_close_to_fp64(got[name], expected32[name], expected64[name], name)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("task", list(TASKS))
def test_same_outputs_and_gradients_as_the_padded_path(task, kernel):
    """Real tokens attend to real tokens only on both paths, so what the heads compute from them, and every
    parameter's gradient, are the padded path's, whichever kernel runs the attention; the padding's states, which
    the unpadded path does not compute, are zeros."""
    config = NO_DROPOUT
    batch = varied_batch(config, lengths_mask(LENGTHS))
    assert_paths_agree(task, kernel, batch)
    if task == "encoder":
        torch.manual_seed(0)
        model = build_model("encoder", config, attention_kernel=kernel).eval()
        with torch.no_grad():
            padding = model(*batch).sequence_output[~batch[2].bool()]
        assert padding.numel() and torch.equal(padding, torch.zeros_like(padding))


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_kernel_applies_attention_dropout_in_training_only(kernel):
    """The kernels get the attention dropout (the comparisons above run without it): with only attention dropout on,
    training changes the real tokens' outputs, evaluation gives the padded path's."""
    config = tiny_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5)
    batch = varied_batch(config, lengths_mask(LENGTHS))
    real = batch[2].bool()
    torch.manual_seed(0)
    model = build_model("encoder", config, attention_kernel=kernel)
    padded = modeling.set_unpadding(copy.deepcopy(model), False).eval()
    with torch.no_grad():
        expected = padded(*batch).sequence_output[real]
        torch.testing.assert_close(model.eval()(*batch).sequence_output[real], expected, rtol=1e-5, atol=1e-5)
        trained = model.train()(*batch).sequence_output[real]
    assert (trained - expected).abs().max() > 1e-2


HOLES = torch.tensor(
    [
        [1, 1, 0, 1, 0, 1, 1, 0, 0, 1, 0, 0],  # holes
        [0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # padding first
        [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],  # full
        [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    ]
)  # one token, the last


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_mask_with_holes_gives_the_padded_paths_real_outputs(kernel):
    """Real tokens are found in the mask, not assumed to come first: a token keeps the position (embedding) of its
    column, and attends to its own sequence's real tokens, wherever they are."""
    assert_paths_agree("encoder", kernel, varied_batch(NO_DROPOUT, HOLES))


def test_the_packing_of_a_mask_with_holes():
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    packing = Packing.of_mask(mask, "per-sequence")
    assert packing.tokens == packing.rows == 10
    assert packing.indices.tolist() == [0, 1, 3, 6, 7, 10, 11, 12, 13, 14]
    assert packing.positions.tolist() == [0, 1, 3, 1, 2, 0, 1, 2, 3, 4]
    assert packing.cu_seqlens.tolist() == [0, 3, 5, 10] and packing.cu_seqlens.dtype == torch.int32
    assert (packing.lengths, packing.max_seqlen, packing.width) == ((3, 2, 5), 5, 5)
    padded = torch.randn(3, 5, 2)
    packed = packing.pack(padded)
    assert torch.equal(packed, padded[mask.bool()])
    assert torch.equal(packing.unpack(packed), padded * mask[..., None])
    narrow = Packing.of_mask(torch.tensor([[1, 0, 1, 0, 0], [0, 1, 0, 0, 0]]), "masked")
    assert narrow.width == 3 and narrow.narrow_indices().tolist() == [0, 2, 4]
    assert narrow.sequence_ids().tolist() == [0, 0, 1]


def test_bucketed_rows_are_few_sizes_with_filler_sequences_that_nothing_reads():
    """Bucketing (for CUDA graphs) rounds the rows up to one of 8 sizes per doubling; the filler rows form
    sequences of at most the batch's length, in a fixed number of slots per bucket, read a row of zeros and go back
    to no position of the batch."""
    assert [bucket_rows(tokens) for tokens in (1, 8, 9, 100, 127, 128, 129, 1000, 1025, 2100)] == [
        8,
        8,
        16,
        104,
        128,
        128,
        144,
        1024,
        1152,
        2304,
    ]
    assert all(tokens <= bucket_rows(tokens) < tokens * 9 / 8 + 8 for tokens in range(1, 5000))
    mask = lengths_mask((12, 1, 7, 4))  # 24 tokens: bucket 24; 25 to 30 in bucket 32
    mask[3, 4:9] = 1  # 29 tokens
    packing = Packing.of_mask(mask, "varlen", bucketed=True)
    assert (packing.tokens, packing.rows, packing.max_seqlen) == (29, 32, SEQ)
    slots = filler_slots(32, SEQ)
    assert packing.cu_seqlens.tolist() == [0, 12, 13, 20, 29] + [32] + [32] * (slots - 1)
    assert packing.indices[29:].tolist() == [4 * SEQ] * 3 and packing.positions[29:].tolist() == [0] * 3
    padded = torch.randn(4, SEQ, 3)
    packed = packing.pack(padded)
    assert torch.equal(packed[:29], padded[mask.bool()]) and torch.equal(packed[29:], torch.zeros(3, 3))
    assert torch.equal(packing.unpack(packed + 1), (padded + 1) * mask[..., None])
    long_filler = Packing.of_mask(torch.ones(16, 24, dtype=torch.long).tril(-9)[:, :24], "varlen", bucketed=True)
    filler = torch.diff(long_filler.cu_seqlens[16:]).tolist()  # the slots after the 16 sequences
    assert sum(filler) == long_filler.rows - long_filler.tokens and max(filler) <= 24


@pytest.mark.parametrize("task", list(TASKS))
def test_bucket_filler_changes_no_output_and_no_gradient(task):
    """The same batch packed with and without a bucket's filler rows, through the varlen op's CPU implementation:
    the same outputs and gradients (the filler is computed and dropped)."""
    batch = varied_batch(NO_DROPOUT, lengths_mask((12, 1, 7, 9)))  # 29 tokens in a bucket of 32
    torch.manual_seed(0)
    model = build_model(task, NO_DROPOUT, attention_kernel="varlen", **HEAD_KWARGS.get(task, {}))
    bucketed = copy.deepcopy(model)
    packer = modeling.packer_for(model, "cpu")
    assert Packer(packer.rule, bucketed=True)(batch[2]).rows == 32

    def run(net, bucket):
        rule_packer = Packer(packer.rule, bucketed=bucket)
        original = net.forward

        def forward(*args, **kwargs):
            return original(*args, packing=rule_packer(batch[2]), **kwargs)

        net.forward = forward
        return forward_backward(net, task, batch)

    got, expected = run(bucketed, True), run(model, False)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def resolved(kernel, packing):
    """The kernel a packing runs for a requested one (None: the CPU's default): auto picks by the longest sequence."""
    return attention.path_rule("cpu", 16, torch.float32, kernel).kernel_for(max(packing.lengths))


def test_the_cpu_runs_per_sequence_attention_from_64_tokens_and_masked_below():
    """The CPU's default: a call per sequence pays for itself only once the sequences' attention is large enough."""
    packer = modeling.packer_for(modeling.BertModel(tiny_config()), "cpu")

    def kernel(width):
        mask = torch.zeros(2, 80, dtype=torch.long)
        mask[0, :width], mask[1, :3] = 1, 1
        return packer(mask).kernel

    assert (kernel(63), kernel(64), kernel(80)) == ("masked", "per-sequence", "per-sequence")
    nested = modeling.set_unpadding(modeling.BertModel(tiny_config()), True, "nested")
    assert modeling.packer_for(nested, "cpu")(lengths_mask((3, 1))).kernel == "nested"


def test_path_rules_by_device_and_dtype():
    """A GPU runs flash attention's varlen kernel where it can, the masked kernel where it cannot (fp32, no flash),
    saying why; a CPU runs its measured rule; torch.compile on a CPU the masked kernel; a requested kernel runs."""
    cpu = attention.path_rule("cpu", 64, torch.float32)
    assert (cpu.kernel, cpu.min_padding_share) == ("auto", 0.1)
    assert attention.path_rule("cpu", 64, torch.float32, compiled=True).kernel == "masked"
    assert attention.path_rule("cpu", 64, torch.float32, "varlen").kernel == "varlen"
    fp32 = attention.path_rule("cuda", 64, torch.float32)
    assert fp32.kernel == "masked" and "needs fp16 or bf16 (float32 runs here)" in fp32.reason
    requested = attention.path_rule("cuda", 64, torch.float32, "varlen")
    assert requested.kernel == "masked" and requested.reason.startswith("--attention_kernel=varlen: flash")
    assert attention.flash_unavailable("cuda", torch.bfloat16, 64) is not None or torch.cuda.is_available()


def test_padding_takes_the_unpadded_path_and_unpad_false_never_does(config):
    """Only a batch with padding is packed (without padding there is nothing to save); unpad=False never packs."""
    model = modeling.BertModel(config).eval()
    input_ids, token_type_ids, attention_mask = tiny_batch(config)
    with torch.no_grad():
        assert model(input_ids, token_type_ids, torch.ones_like(attention_mask)).packing is None
        assert model(input_ids, token_type_ids).packing is None
        packing = model(input_ids, token_type_ids, attention_mask).packing
        assert packing.tokens == int(attention_mask.sum())
        assert packing.kernel == resolved(None, packing)
        modeling.set_unpadding(model, False)
        assert model(input_ids, token_type_ids, attention_mask).packing is None
        modeling.set_unpadding(model, True, KERNELS[-1])
        assert model(input_ids, token_type_ids, attention_mask).packing.kernel == KERNELS[-1]


def test_a_batch_with_little_padding_runs_padded(config):
    """Below MIN_PADDING_SHARE of padding, packing costs more than the padding it skips: such a batch runs padded,
    from that share on unpadded, with the same real outputs either way."""
    model = modeling.BertModel(config).eval()
    input_ids, token_type_ids, _ = tiny_batch(config, batch=4, seq=10)
    least = math.ceil(attention.MIN_PADDING_SHARE["cpu"] * input_ids.numel())  # the fewest padding tokens worth it
    assert 0 < least < input_ids.shape[1]
    for padding, packed in ((least - 1, False), (least, True)):
        mask = torch.ones_like(input_ids)
        mask[1, input_ids.shape[1] - padding :] = 0
        with torch.no_grad():
            out = model(input_ids, token_type_ids, mask)
            expected = modeling.set_unpadding(copy.deepcopy(model), False)(input_ids, token_type_ids, mask)
        assert (out.packing is not None) == packed, padding
        torch.testing.assert_close(
            out.sequence_output[mask.bool()], expected.sequence_output[mask.bool()], rtol=1e-5, atol=1e-5
        )


VARIANTS = [("baseline", "full")] + [("recompute", policy) for policy, _ in POLICIES]


@pytest.mark.parametrize("task", list(TASKS))
def test_state_dict_names_are_the_same_on_every_path(task):
    config = tiny_config()
    names = {
        (name, policy, unpad): list(
            build_model(task, config, name, policy, unpad=unpad, **HEAD_KWARGS.get(task, {})).state_dict()
        )
        for name, policy in VARIANTS
        for unpad in (True, False)
    }
    first = next(iter(names.values()))
    assert all(keys == first for keys in names.values()), names.keys()


def test_weights_move_between_paths():
    """A padded model's checkpoint loads into an unpadded (and recomputed) one, which then predicts what it did."""
    config = tiny_config()
    input_ids, token_type_ids, attention_mask = tiny_batch(config)
    given = {"masked_lm_positions": torch.tensor([[1, 5, 7], [2, 3, 0], [4, 8, 9]])}
    torch.manual_seed(0)
    padded = build_model("pretraining", config, unpad=False).eval()
    torch.manual_seed(1)
    unpadded = build_model("pretraining", config, "recompute", "selective", unpad=True).eval()
    with torch.no_grad():
        before = unpadded(input_ids, token_type_ids, attention_mask, **given)
        unpadded.load_state_dict(padded.state_dict())
        expected = padded(input_ids, token_type_ids, attention_mask, **given)
        got = unpadded(input_ids, token_type_ids, attention_mask, **given)
    assert not torch.allclose(before.mlm_logits, expected.mlm_logits, atol=1e-3)
    torch.testing.assert_close(got.mlm_logits, expected.mlm_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.nsp_logits, expected.nsp_logits, rtol=1e-5, atol=1e-5)


def packed_step(model, seed=7):
    """test_recompute.run_step's step without its FLOP counter, which cannot count nested tensors' attention: one
    forward+backward with dropout on; returns the loss, the gradients and the bytes saved for backward."""
    input_ids, token_type_ids, attention_mask = tiny_batch(model.config, batch=4, seq=32)
    model.train()
    torch.manual_seed(seed)
    out, saved = saved_activation_bytes(
        lambda: model(input_ids, token_type_ids, attention_mask, labels=torch.tensor([0, 1, 1, 0])), model
    )
    out.loss.backward()
    return out.loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}, saved


@functools.cache
def baseline_step(kernel):
    return packed_step(make("baseline", unpad=True, attention_kernel=kernel))


# On a CPU torch runs SDPA on nested tensors by a fallback whose strided nested tensors checkpointing cannot save:
# the runners and benches refuse recompute with the nested kernel there (test below).
@pytest.mark.parametrize("kernel", [kernel for kernel in KERNELS if kernel != "nested"])
@pytest.mark.parametrize("policy, every_k", POLICIES)
def test_recompute_on_packed_rows_is_exact_and_saves_bytes(policy, every_k, kernel):
    """Checkpointed blocks get the Packing as their mask and replay each dropout mask: loss and gradients are
    bit-identical to the baseline's on the unpadded path, and the forward keeps fewer bytes for backward."""
    base_loss, base_grads, base_saved = baseline_step(kernel)
    loss, grads, saved = packed_step(make("recompute", policy, every_k, unpad=True, attention_kernel=kernel))
    assert torch.equal(loss, base_loss)
    assert grads.keys() == base_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], base_grads[name], rtol=0, atol=0, msg=name)
    assert saved < SAVED_LIMITS[policy] * base_saved, (policy, saved, base_saved)


def test_the_recompute_batch_runs_unpadded_with_live_dropout():
    """The recompute checks above are not vacuous: their batch is packed, and another seed changes the loss."""
    model = make("baseline", unpad=True)
    with torch.no_grad():
        assert model.bert(*tiny_batch(model.config, batch=4, seq=32)).packing is not None
    assert not torch.equal(packed_step(model, seed=7)[0], packed_step(make("baseline", unpad=True), seed=8)[0])


def test_the_per_sequence_kernel_keeps_fewer_bytes_than_the_padded_path():
    """A per-token activation is kept for real tokens only, a sequence's attention scores for its own tokens: at
    most the real tokens' share of what the padded path keeps."""
    attention_mask = tiny_batch(tiny_config(), batch=4, seq=32)[2]
    share = attention_mask.sum().item() / attention_mask.numel()
    _, _, unpadded = packed_step(make("baseline", unpad=True, attention_kernel="per-sequence"))
    _, _, padded = packed_step(make("baseline", unpad=False))
    assert unpadded < share * padded, (unpadded, padded, share)


def test_recompute_with_the_nested_kernel_is_refused_on_a_cpu_before_anything_runs(tmp_path, error_line):
    from bertbench.bench import workload
    from bertbench.runners.classifier import main
    from bertbench.tasks.synthetic import write_glue_task

    write_glue_task(tmp_path / "glue", "MRPC", train=32, dev=8, test=0)
    write_bert_dir(tmp_path / "bert")
    out = tmp_path / "run"
    assert (
        main(
            classifier_flags(
                tmp_path,
                out,
                "--do_train",
                "--device=cpu",
                "--modeling=recompute",
                "--attention_kernel=nested",
                batch=None,
            )
        )
        == 2
    )
    assert "--attention_kernel=nested with --modeling=recompute needs a GPU" in error_line()
    assert not out.exists()
    with pytest.raises(workload.BenchError, match="variant full/nested: --attention_kernel=nested"):
        workload.train_step(tiny_config(), "finetuning", workload.Variant.parse("full/nested"), "fp32", 2, 8)


def test_unknown_kernels_are_refused():
    with pytest.raises(ValueError, match="unknown attention kernel 'flash'"):
        modeling.set_unpadding(modeling.BertModel(tiny_config()), True, "flash")
    with pytest.raises(ValueError, match="unknown attention kernel"):
        build_model("encoder", tiny_config(), attention_kernel="flash")


@pytest.mark.parametrize(
    "argv, unpad, kernel",
    [
        ([], True, None),
        (["--unpad"], True, None),
        (["--unpad=false"], False, None),
        (["--nounpad"], False, None),
        (["--no_unpad"], False, None),
        (["--unpad=true", "--attention_kernel", KERNELS[-1]], True, KERNELS[-1]),
    ]
    + [(["--attention_kernel", kernel], True, kernel) for kernel in KERNELS],
)
def test_unpad_flags_build_the_chosen_path(argv, unpad, kernel, config):
    args = parse_model_flags(argv)
    model = args.build("classification", config, num_labels=2)
    assert (model.bert.unpad, model.bert.attention_kernel) == (unpad, kernel)
    encoder = args.build("encoder", config).eval()
    with torch.no_grad():
        packing = encoder(*tiny_batch(config)).packing
    if unpad:
        assert packing.kernel == resolved(kernel, packing)
    else:
        assert packing is None


def test_unknown_kernel_flag_is_refused():
    with pytest.raises(SystemExit):
        parse_model_flags(["--attention_kernel", "flash"])
    with pytest.raises(SystemExit):
        parse_model_flags(["--unpad=maybe"])


BERT_TINY = tiny_config(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)


def dense_flops(config, tokens, batch):
    """FLOPs of BertModel's dense layers: per token and block, Q, K, V and the attention output (hidden x hidden) and
    the feed-forward's two (hidden x intermediate); the pooler's once per sequence. 2 FLOPs a multiply-add."""
    hidden, intermediate = config.hidden_size, config.intermediate_size
    per_token = 2 * hidden * (4 * hidden + 2 * intermediate)
    return tokens * config.num_hidden_layers * per_token + batch * 2 * hidden * hidden


def forward_flops(model, batch):
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*batch)
    return {str(op): count for op, count in counter.get_flop_counts()["Global"].items()}


# FlopCounterMode cannot count the nested kernel's attention on a CPU (it decomposes its math fallback, which fails
# on jagged sizes); its dense layers are the other kernels'.
@pytest.mark.parametrize("kernel", [kernel for kernel in KERNELS if kernel != "nested"])
def test_dense_flops_follow_the_real_tokens(kernel):
    """BERT-tiny with half its batch's tokens padding: the dense layers' matmuls cost exactly half the padded path's
    but for the pooler; with the per-sequence kernel, attention costs each sequence's own length squared."""
    lengths = (32, 16, 12, 4)  # 64 real tokens of 128
    batch = varied_batch(BERT_TINY, lengths_mask(lengths, seq=32))
    torch.manual_seed(0)
    model = build_model("encoder", BERT_TINY, attention_kernel=kernel).eval()
    unpadded = forward_flops(model, batch)
    padded = forward_flops(modeling.set_unpadding(model, False), batch)
    dense = {
        path: flops.get("aten.addmm", 0) + flops.get("aten.mm", 0)
        for path, flops in (("unpadded", unpadded), ("padded", padded))
    }
    assert dense == {"unpadded": dense_flops(BERT_TINY, 64, 4), "padded": dense_flops(BERT_TINY, 128, 4)}
    if kernel == "per-sequence":  # q k^T and the weighted sum: 2 x 2 x length^2 x hidden per sequence and block
        expected = sum(4 * length**2 * BERT_TINY.hidden_size * BERT_TINY.num_hidden_layers for length in lengths)
        assert unpadded.get("aten.bmm", 0) == expected
