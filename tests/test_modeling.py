"""The baseline model against HF transformers' BERT with the same weights, in fp32 on the CPU.

Each parity test runs both paths: the padded one (unpad=False) is compared everywhere, as HF computes it; the
unpadded one (the default for a batch with padding) does not compute the padding's states, so it is compared at the
real positions and on what only depends on them (pooled output, losses), and its padding is checked to be what the
path documents (zeros in the sequence output, no probability in the SQuAD span softmax)."""

import dataclasses
import json

import pytest
import torch
from helpers import is_the_packing_skip, tiny_batch, tiny_config
from torch._dynamo.utils import counters

from bertbench.model import modeling
from bertbench.model.config import BertConfig, ConfigError

transformers = pytest.importorskip("transformers")


def hf_twin(ours: torch.nn.Module, hf_class, config: BertConfig):
    """The HF model with our weights (same state-dict names), in eval mode."""
    hf_config = transformers.BertConfig(**config.to_hf_dict())
    hf_config._attn_implementation = "eager"
    reference = hf_class(hf_config)
    missing, unexpected = reference.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert all("position_ids" in key or "token_type_ids" in key for key in missing), missing
    return reference.eval()


def assert_close_to_fp64(ours32, hf32, hf64, name):
    """Our fp32 error against the fp64 reference must be of the order of HF's own fp32 error."""
    reference_error = (hf32.double() - hf64).abs().max().item()
    our_error = (ours32.double() - hf64).abs().max().item()
    assert our_error <= 4 * reference_error + 1e-6, f"{name}: error {our_error:.3g} vs HF fp32 {reference_error:.3g}"


def hf_references(ours, hf_class, config, batch):
    """Outputs of the HF twin in fp32 and fp64 on the same batch."""
    input_ids, token_type_ids, attention_mask = batch
    kwargs = dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    with torch.no_grad():
        return (hf_twin(ours, hf_class, config)(**kwargs), hf_twin(ours, hf_class, config).double()(**kwargs))


PATHS = pytest.mark.parametrize("unpad", [False, True], ids=["padded", "unpadded"])


def real_positions(attention_mask, unpad):
    """What a parity test compares of a [batch, seq, ...] output: every position on the padded path, the real tokens
    on the unpadded one."""
    return attention_mask.bool() if unpad else torch.ones_like(attention_mask, dtype=torch.bool)


@PATHS
def test_encoder_matches_hf_bert_model(config, unpad):
    torch.manual_seed(0)
    ours = modeling.set_unpadding(modeling.BertModel(config), unpad).eval()
    batch = tiny_batch(config)
    real = real_positions(batch[2], unpad)
    ref32, ref64 = hf_references(ours, transformers.BertModel, config, batch)
    with torch.no_grad():
        out = ours(*batch)
    assert (out.packing is not None) == unpad
    assert_close_to_fp64(
        out.sequence_output[real], ref32.last_hidden_state[real], ref64.last_hidden_state[real], "sequence_output"
    )
    assert_close_to_fp64(out.pooled_output, ref32.pooler_output, ref64.pooler_output, "pooled_output")
    if unpad:  # the padding's states are not computed: zeros, as BertModelOutput says
        assert torch.equal(out.sequence_output[~real], torch.zeros_like(out.sequence_output[~real]))


@PATHS
def test_pretraining_heads_match_hf(config, unpad):
    torch.manual_seed(1)
    ours = modeling.set_unpadding(modeling.BertForPreTraining(config), unpad).eval()
    input_ids, token_type_ids, attention_mask = batch = tiny_batch(config)
    real = real_positions(attention_mask, unpad)
    ref32, ref64 = hf_references(ours, transformers.BertForPreTraining, config, batch)
    positions = torch.tensor([[1, 5, 7], [2, 3, 0], [4, 8, 9]])
    labels = torch.tensor([[11, 12, 13], [14, 15, -100], [16, 17, 18]])
    nsp_labels = torch.tensor([0, 1, 0])
    with torch.no_grad():
        out = ours(
            input_ids,
            token_type_ids,
            attention_mask,
            masked_lm_positions=positions,
            masked_lm_labels=labels,
            next_sentence_labels=nsp_labels,
        )
        full = ours(input_ids, token_type_ids, attention_mask)
    rows = torch.arange(3)[:, None]
    assert out.mlm_logits.shape == (3, 3, config.vocab_size)
    assert_close_to_fp64(
        out.mlm_logits,
        ref32.prediction_logits[rows, positions],
        ref64.prediction_logits[rows, positions],
        "mlm_logits at positions",
    )
    assert attention_mask.bool()[rows, positions].all()  # the predicted positions are real tokens
    assert_close_to_fp64(
        full.mlm_logits[real], ref32.prediction_logits[real], ref64.prediction_logits[real], "mlm_logits"
    )
    assert_close_to_fp64(out.nsp_logits, ref32.seq_relationship_logits, ref64.seq_relationship_logits, "nsp")
    # Google's loss: mean NLL over the real masked positions plus mean NSP NLL.
    mlm_nll = torch.nn.functional.cross_entropy(
        ref64.prediction_logits[rows, positions].flatten(0, 1), labels.flatten(), ignore_index=-100
    )
    nsp_nll = torch.nn.functional.cross_entropy(ref64.seq_relationship_logits, nsp_labels)
    assert out.loss.item() == pytest.approx((mlm_nll + nsp_nll).item(), rel=1e-5)


def test_mlm_decoder_is_tied_to_word_embeddings(config):
    model = modeling.BertForPreTraining(config)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


@PATHS
def test_classifier_and_regressor_match_hf(config, unpad):
    """The pooled [CLS] vector depends on the real tokens only: the same logits and loss on both paths."""
    torch.manual_seed(2)
    input_ids, token_type_ids, attention_mask = tiny_batch(config)
    for num_labels, labels in ((3, torch.tensor([0, 2, 1])), (1, torch.tensor([0.5, 3.2, 4.9]))):
        ours = modeling.BertForSequenceClassification(config, num_labels=num_labels)
        ours = modeling.set_unpadding(ours, unpad).eval()
        hf_config = transformers.BertConfig(**config.to_hf_dict(), num_labels=num_labels)
        hf_config._attn_implementation = "eager"
        reference = transformers.BertForSequenceClassification(hf_config).eval()
        reference.load_state_dict(ours.state_dict(), strict=False)
        with torch.no_grad():
            out = ours(input_ids, token_type_ids, attention_mask, labels=labels)
            ref = reference(
                input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels
            )
        torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-6)
        assert out.logits.shape == (3, num_labels)


def span_loss_over_real_tokens(start_logits, end_logits, attention_mask, starts, ends):
    """The SQuAD loss with each sequence's span softmax over its real tokens only, one sequence at a time."""
    losses = []
    for row, length in enumerate(attention_mask.sum(1).tolist()):
        assert attention_mask[row, :length].all()  # right padding: the real tokens come first
        for logits, target in ((start_logits, starts), (end_logits, ends)):
            losses.append(torch.nn.functional.cross_entropy(logits[row, None, :length], target[row, None]))
    return torch.stack(losses).view(-1, 2).sum(1).mean() / 2


@PATHS
def test_question_answering_matches_hf(config, unpad):
    """The padded path is HF's (and Google's): the span softmax spans the padding too. The unpadded path has the same
    logits at the real tokens, the lowest float at the padding, and so the loss of a softmax over the real tokens."""
    torch.manual_seed(3)
    ours = modeling.set_unpadding(modeling.BertForQuestionAnswering(config), unpad).eval()
    hf_config = transformers.BertConfig(**config.to_hf_dict())
    hf_config._attn_implementation = "eager"
    reference = transformers.BertForQuestionAnswering(hf_config).eval()
    reference.load_state_dict(ours.state_dict(), strict=False)
    input_ids, token_type_ids, attention_mask = tiny_batch(config)
    real = real_positions(attention_mask, unpad)
    starts, ends = torch.tensor([1, 4, 0]), torch.tensor([3, 6, 0])
    with torch.no_grad():
        out = ours(input_ids, token_type_ids, attention_mask, start_positions=starts, end_positions=ends)
        ref = reference(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            start_positions=starts,
            end_positions=ends,
        )
    torch.testing.assert_close(out.start_logits[real], ref.start_logits[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.end_logits[real], ref.end_logits[real], rtol=1e-5, atol=1e-5)
    if not unpad:
        torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-6)
        return
    lowest = torch.finfo(torch.float32).min
    assert (out.start_logits[~real] == lowest).all() and (out.end_logits[~real] == lowest).all()
    expected = span_loss_over_real_tokens(ref.start_logits, ref.end_logits, attention_mask, starts, ends)
    torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-6)
    assert abs(out.loss.item() - ref.loss.item()) > 1e-3  # the padding's probability is what differs from HF's loss


@PATHS
def test_padding_does_not_change_real_tokens(config, unpad):
    """Extra padded positions must not leak into the outputs of the real tokens."""
    model = modeling.set_unpadding(modeling.BertModel(config), unpad).eval()
    input_ids, token_type_ids, _ = tiny_batch(config, batch=1, seq=10)
    padded_ids = torch.cat([input_ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    padded_types = torch.cat([token_type_ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(1, 10), torch.zeros(1, 6)], dim=1).long()
    with torch.no_grad():
        short = model(input_ids, token_type_ids).sequence_output
        long = model(padded_ids, padded_types, mask).sequence_output[:, :10]
    torch.testing.assert_close(short, long, rtol=1e-5, atol=1e-5)


def test_gelu_is_exact_erf_and_layernorm_eps(config):
    model = modeling.BertModel(config)
    activation = model.encoder.layer[0].intermediate.activation
    x = torch.tensor([-3.0, -0.5, 0.0, 0.7, 2.0])
    torch.testing.assert_close(activation(x), x * 0.5 * (1 + torch.erf(x / 2**0.5)))
    assert model.embeddings.LayerNorm.eps == 1e-12


def test_sequence_longer_than_positions_is_refused(config):
    model = modeling.BertModel(config)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.zeros(1, config.max_position_embeddings + 1, dtype=torch.long))


GOOGLE_BASE = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "num_attention_heads": 12,
    "num_hidden_layers": 12,
    "type_vocab_size": 2,
    "vocab_size": 30522,
}


def test_config_reads_google_and_hf_files(tmp_path):
    google = tmp_path / "bert_config.json"
    google.write_text(json.dumps(GOOGLE_BASE))
    config = BertConfig.from_json_file(google)
    assert (config.hidden_size, config.num_hidden_layers, config.layer_norm_eps) == (768, 12, 1e-12)
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    transformers.BertConfig(**GOOGLE_BASE).to_json_file(hf_dir / "config.json")
    assert BertConfig.from_json_file(hf_dir) == config  # a directory means its config.json
    round_trip = tmp_path / "round_trip.json"
    config.to_json_file(round_trip)
    assert BertConfig.from_json_file(round_trip) == config
    assert transformers.BertConfig.from_json_file(round_trip).hidden_size == 768


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_sizes": 768}, "unknown key 'hidden_sizes'"),
        ({"num_hidden_layers": None}, "missing key 'num_hidden_layers'"),
        ({"hidden_act": "gelu_fast"}, "hidden_act"),
        ({"hidden_size": 100}, "hidden_size: 100 is not a multiple"),
        ({"vocab_size": -1}, "vocab_size"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
    ],
)
def test_config_errors_name_the_file_and_key(tmp_path, change, message):
    values = dict(GOOGLE_BASE)
    for key, value in change.items():
        if value is None:
            values.pop(key)
        else:
            values[key] = value
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(values))
    with pytest.raises(ConfigError, match=message) as error:
        BertConfig.from_json_file(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_config_rejects_non_bert_hf_model_and_bad_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**GOOGLE_BASE, "model_type": "roberta"}))
    with pytest.raises(ConfigError, match="model_type"):
        BertConfig.from_json_file(path)
    path.write_text('{"vocab_size": 10,')
    with pytest.raises(ConfigError, match="not JSON"):
        BertConfig.from_json_file(path)
    with pytest.raises(ConfigError, match="no such file"):
        BertConfig.from_json_file(tmp_path / "absent.json")


def test_tiny_config_defaults_are_google_base():
    config = tiny_config()
    assert config.hidden_act == "gelu" and config.attention_probs_dropout_prob == 0.1


def test_unpadded_batches_skip_the_mask():
    assert modeling.sdpa_padding_mask(None) is None
    assert modeling.sdpa_padding_mask(torch.ones(2, 5, dtype=torch.long)) is None
    mask = modeling.sdpa_padding_mask(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == torch.bool and mask.sum() == 5


@PATHS
def test_the_forward_compiles_to_one_graph_with_the_eager_output(config, unpad):
    """The padding check reads a value, which would split the compiled graph (and sync a GPU) at every call: under
    torch.compile the mask is always applied, which gives the same output. The padded path is one graph; the
    unpadded one breaks at the packing (its sizes are the mask's values) and nowhere else. One block: a break in a
    block's code shows in the first."""
    one_block = dataclasses.replace(config, num_hidden_layers=1)
    model = modeling.set_unpadding(modeling.BertForSequenceClassification(one_block, num_labels=2), unpad).eval()
    input_ids, token_type_ids, attention_mask = tiny_batch(one_block)
    graphs = []

    def eagerly(graph, example_inputs):  # dynamo's graph run eagerly: tracing is what is tested here
        graphs.append(graph)
        return graph.forward

    torch._dynamo.reset()  # as explain does: no earlier test's traces of forward, nor its recompile count
    compiled = torch.compile(model, backend=eagerly)
    counters.clear()
    for mask in (attention_mask, torch.ones_like(attention_mask)):
        torch.testing.assert_close(
            compiled(input_ids, token_type_ids, mask).logits,
            model(input_ids, token_type_ids, mask).logits,
            rtol=1e-5,
            atol=1e-6,
        )
        if mask is not attention_mask:
            continue
        # The padded batch's graphs and breaks, as torch._dynamo.explain counts them, in the one trace.
        reasons = list(counters["graph_break"])
        if unpad:
            assert len(reasons) == 1 and is_the_packing_skip(reasons[0]), reasons
            # Before the packing; the rest of BertModel.forward; the rest of the caller, which the nested break splits.
            assert len(graphs) <= 3, len(graphs)
        else:
            assert (len(graphs), reasons) == (1, []), reasons
