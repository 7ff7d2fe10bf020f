"""Name mapping, HF directories and `bertbench convert`, checked against HF transformers' BERT loading the results."""

import dataclasses
import json
import logging
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

from bertbench.model.config import BertConfig
from bertbench.tasks.tokenization import load_vocab
from bertbench.weights import convert
from bertbench.weights.hf import save_hf_directory
from bertbench.weights.pretrained import load_pretrained, load_state_dict
from bertbench.weights.tf_checkpoint import read_tf_checkpoint
from bertbench.weights.tf_names import WeightsError, map_tf_names, tf_to_hf_state_dict

FIXTURE = Path(__file__).parent / "fixtures" / "tf1_tiny"
PRETRAINING = FIXTURE / "bert_model.ckpt"
CLASSIFIER = FIXTURE / "classifier.ckpt"
CONFIG = BertConfig.from_json_file(FIXTURE / "bert_config.json")
EXPECTED = np.load(FIXTURE / "expected_values.npz")
TRAINING_STATE = {"global_step", "loss_scale", "good_steps"}


def tf_values(prefix):
    """The checkpoint's variables as TensorFlow itself read them (not through bertbench's reader)."""
    return {key.split(":", 1)[1]: EXPECTED[key] for key in EXPECTED.files if key.startswith(prefix + ":")}


def hf_config(**overrides):
    values = json.loads((FIXTURE / "bert_config.json").read_text())
    return transformers.BertConfig(**{**values, **overrides})


def load_tf_into_hf(model, values):
    """An independent mapping in the style of transformers' old load_tf_weights_in_bert: walk attributes by name."""
    for name, value in values.items():
        parts = name.split("/")
        if parts[-1] in ("adam_m", "adam_v") or name in TRAINING_STATE:
            continue
        if name in ("output_weights", "output_bias"):  # run_classifier.py's head
            parts = ["classifier", name]
        pointer = model
        for part in parts:
            layer = re.fullmatch(r"layer_(\d+)", part)
            if layer:
                pointer = pointer.layer[int(layer.group(1))]
            elif part in ("kernel", "gamma", "output_weights"):
                pointer = pointer.weight
            elif part in ("beta", "output_bias"):
                pointer = pointer.bias
            else:
                pointer = getattr(pointer, part)
        if parts[-1].endswith("_embeddings"):
            pointer = pointer.weight
        array = torch.from_numpy(value.T.copy() if parts[-1] == "kernel" else value)
        assert pointer.shape == array.shape, name
        with torch.no_grad():
            pointer.copy_(array)
    return model


def hf_inputs():
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, CONFIG.vocab_size, (2, 12), generator=generator)
    token_type_ids = torch.cat([torch.zeros(2, 6, dtype=torch.long), torch.ones(2, 6, dtype=torch.long)], dim=1)
    attention_mask = torch.ones(2, 12, dtype=torch.long)
    attention_mask[1, 9:] = 0
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


def reference_pretraining_model():
    return load_tf_into_hf(transformers.BertForPreTraining(hf_config()), tf_values("bert_model.ckpt")).eval()


def assert_no_loading_problems(info):
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info


def assert_same_weights(model, reference):
    expected = reference.state_dict()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)


@pytest.fixture(scope="module")
def pretraining_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("converted") / "bert-tiny"
    assert (
        convert.main(
            [
                "--tf_checkpoint",
                str(PRETRAINING),
                "--bert_config_file",
                str(FIXTURE / "bert_config.json"),
                "--output_dir",
                str(out),
                "--vocab_file",
                str(FIXTURE / "vocab.txt"),
            ]
        )
        == 0
    )
    return out


def test_convert_keeps_the_old_spellings(tmp_path, pretraining_dir):
    out = tmp_path / "converted"
    assert (
        convert.main(
            [
                "--tf-checkpoint",
                str(PRETRAINING),
                "--bert-config",
                str(FIXTURE / "bert_config.json"),
                "--output",
                str(out),
                "--pytorch-bin",
            ]
        )
        == 0
    )
    assert sorted(os.listdir(out)) == ["config.json", "pytorch_model.bin"]
    expected = load_file(str(pretraining_dir / "model.safetensors"))
    converted = torch.load(out / "pytorch_model.bin", map_location="cpu", weights_only=True)
    assert converted.keys() == expected.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(converted[name], tensor, rtol=0, atol=0, msg=name)


def test_convert_with_hfs_flags_writes_one_file_as_hfs_script_does(tmp_path, capsys):
    """HF's convert_bert_original_tf_checkpoint_to_pytorch: --pytorch_dump_path F is the file F, torch.save of
    BertForPreTraining's state_dict (tied decoder names included), which HF's model loads strictly."""
    dump = tmp_path / "bert.bin"
    args = [
        "--tf_checkpoint_path",
        str(PRETRAINING),
        "--bert_config_file",
        str(FIXTURE / "bert_config.json"),
        "--pytorch_dump_path",
        str(dump),
    ]
    assert convert.main(args) == 0 and dump.is_file() and os.listdir(tmp_path) == ["bert.bin"]
    state = torch.load(dump, map_location="cpu", weights_only=True)
    model = transformers.BertForPreTraining(hf_config())
    model.load_state_dict(state, strict=True)
    assert_same_weights(model.eval(), reference_pretraining_model())
    capsys.readouterr()
    for extra, message in [
        ([], "exists (pass --overwrite"),
        (["--vocab_file", str(FIXTURE / "vocab.txt")], "--vocab_file: --pytorch_dump_path writes one"),
    ]:
        assert convert.main(args + extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert convert.main(args[:-1] + [str(tmp_path)]) == 2
    assert "is a directory, not a file to write" in capsys.readouterr().err
    assert convert.main(args + ["--overwrite"]) == 0


def test_convert_refuses_an_abbreviated_flag(tmp_path, capsys):
    status = convert.main(
        [
            "--tf_checkpoint",
            str(PRETRAINING),
            "--bert_config_file",
            str(FIXTURE / "bert_config.json"),
            "--output_dir",
            str(tmp_path / "x"),
            "--overwr",
        ]
    )
    assert status == 2
    assert "unrecognized arguments: --overwr" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_mapping_skips_slots_and_training_state_and_reports_them():
    shapes = {name: value.shape for name, value in tf_values("bert_model.ckpt").items()}
    mapping = map_tf_names(shapes, CONFIG)
    slots = {name for name in shapes if name.endswith(("/adam_m", "/adam_v"))}
    assert set(mapping.skipped) == slots | TRAINING_STATE
    assert len(mapping.names) == len(shapes) - len(slots) - len(TRAINING_STATE) == 46
    assert mapping.summary() == (
        "46 model weights; skipped 92 optimizer slots (adam_m: 46, adam_v: 46) and "
        "3 other variables (global_step, good_steps, loss_scale)"
    )


def test_other_optimizers_slots_and_counters_are_skipped():
    shapes = {name: value.shape for name, value in tf_values("classifier.ckpt").items()}
    kernel = "bert/pooler/dense/kernel"
    extra = [
        f"{kernel}/Momentum",
        f"{kernel}/lamb_m",
        f"{kernel}/lamb_v",
        f"{kernel}/LAMB",
        f"{kernel}/LAMB_1",
        "beta1_power",
        "current_loss_scale",
        "global_step",
    ]
    mapping = map_tf_names({**shapes, **{name: (1,) for name in extra}}, CONFIG)
    assert sorted(mapping.skipped) == sorted(extra)
    assert mapping.summary() == (
        "41 model weights; skipped 5 optimizer slots (LAMB: 1, LAMB_1: 1, Momentum: 1, "
        "lamb_m: 1, lamb_v: 1) and 3 other variables (beta1_power, current_loss_scale, "
        "global_step)"
    )
    assert mapping.names["output_weights"] == "classifier.weight"


def test_tf_to_hf_state_dict_names_values_and_log(caplog):
    values = read_tf_checkpoint(PRETRAINING)
    with caplog.at_level(logging.INFO, logger="bertbench.weights.tf_names"):
        state = tf_to_hf_state_dict(values, CONFIG)
    assert "skipped 92 optimizer slots" in caplog.text
    hf_names = {
        name
        for name in transformers.BertForPreTraining(hf_config()).state_dict()
        if not name.startswith("cls.predictions.decoder.")
    }
    assert set(state) == hf_names
    np.testing.assert_array_equal(
        state["bert.encoder.layer.1.intermediate.dense.weight"].numpy(),
        values["bert/encoder/layer_1/intermediate/dense/kernel"].T,
    )
    np.testing.assert_array_equal(
        state["cls.seq_relationship.weight"].numpy(), values["cls/seq_relationship/output_weights"]
    )
    np.testing.assert_array_equal(
        state["bert.embeddings.LayerNorm.weight"].numpy(), values["bert/embeddings/LayerNorm/gamma"]
    )
    assert all(tensor.is_contiguous() and tensor.dtype == torch.float32 for tensor in state.values())


def test_shape_mismatch_names_the_variable_and_both_shapes():
    wider = dataclasses.replace(CONFIG, hidden_size=64)
    with pytest.raises(
        WeightsError,
        match=r"variable bert/embeddings/LayerNorm/beta has shape \[32\], the config "
        r"implies \[64\]",
    ):
        tf_to_hf_state_dict(tf_values("bert_model.ckpt"), wider)
    with pytest.raises(
        WeightsError,
        match=r"model: bert\.embeddings\.word_embeddings\.weight has shape \[99, 32\], "
        r"the config implies \[99, 64\]",
    ):
        save_hf_directory(reference_pretraining_model(), wider, "never-written")


def test_layer_count_must_match_the_config():
    shapes = {name: value.shape for name, value in tf_values("bert_model.ckpt").items()}
    with pytest.raises(
        WeightsError,
        match=r"variable bert/encoder/layer_1/\S+ is beyond the config's "
        r"num_hidden_layers=1",
    ):
        map_tf_names(shapes, dataclasses.replace(CONFIG, num_hidden_layers=1))
    with pytest.raises(WeightsError, match=r"missing variable bert/encoder/layer_2/\S+ \(and 15 more"):
        map_tf_names(shapes, dataclasses.replace(CONFIG, num_hidden_layers=3))


def test_save_hf_directory_loads_in_transformers_with_exact_values(tmp_path):
    state = tf_to_hf_state_dict(tf_values("bert_model.ckpt"), CONFIG)
    assert save_hf_directory(state, CONFIG, tmp_path / "out", vocab_file=FIXTURE / "vocab.txt") == "BertForPreTraining"
    model, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert_no_loading_problems(info)
    assert_same_weights(model, reference_pretraining_model())
    # The encoder alone: HF ignores the pre-training heads as "unexpected", nothing may be missing.
    encoder, info = transformers.BertModel.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert all(key.startswith("cls.") for key in info["unexpected_keys"])
    assert_same_weights(encoder, reference_pretraining_model().bert)


def test_bert_model_directory_has_no_prefix_and_loads_cleanly(tmp_path):
    reference = reference_pretraining_model().bert
    assert save_hf_directory(reference, CONFIG, tmp_path / "encoder") == "BertModel"
    model, info = transformers.BertModel.from_pretrained(tmp_path / "encoder", output_loading_info=True)
    assert_no_loading_problems(info)
    assert_same_weights(model, reference)
    assert json.loads((tmp_path / "encoder" / "config.json").read_text())["architectures"] == ["BertModel"]


def test_convert_main_matches_hf_with_tf_values(pretraining_dir):
    assert (pretraining_dir / "vocab.txt").read_bytes() == (FIXTURE / "vocab.txt").read_bytes()
    assert sorted(os.listdir(pretraining_dir)) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    tokenizer = transformers.AutoTokenizer.from_pretrained(pretraining_dir, local_files_only=True)
    assert tokenizer.do_lower_case and tokenizer.vocab == load_vocab(FIXTURE / "vocab.txt")
    model, info = transformers.BertForPreTraining.from_pretrained(pretraining_dir, output_loading_info=True)
    assert_no_loading_problems(info)
    reference = reference_pretraining_model()
    with torch.no_grad():
        got, want = model.eval()(**hf_inputs()), reference(**hf_inputs())
    torch.testing.assert_close(got.prediction_logits, want.prediction_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(got.seq_relationship_logits, want.seq_relationship_logits, rtol=0, atol=1e-5)


def test_convert_classifier_checkpoint(tmp_path, capsys):
    out = tmp_path / "classifier"
    assert (
        convert.main(
            [
                "--tf-checkpoint",
                str(CLASSIFIER) + ".index",
                "--bert-config",
                str(FIXTURE / "bert_config.json"),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    assert "41 model weights; nothing skipped" in capsys.readouterr().out
    model, info = transformers.BertForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert_no_loading_problems(info)
    assert model.config.num_labels == 3
    reference = load_tf_into_hf(
        transformers.BertForSequenceClassification(hf_config(num_labels=3)), tf_values("classifier.ckpt")
    )
    assert_same_weights(model, reference)


def test_convert_refuses_to_overwrite(pretraining_dir, tmp_path, capsys):
    before = (pretraining_dir / "model.safetensors").read_bytes()
    args = [
        "--tf-checkpoint",
        str(CLASSIFIER),
        "--bert-config",
        str(FIXTURE / "bert_config.json"),
        "--output",
        str(pretraining_dir),
    ]
    assert convert.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertbench convert: error: ")
    assert "exists and is not empty" in err
    assert (pretraining_dir / "model.safetensors").read_bytes() == before
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "stale.txt").write_text("old")
    assert convert.main(args[:-1] + [str(copy), "--overwrite"]) == 0
    assert sorted(os.listdir(copy)) == ["config.json", "model.safetensors"]
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]  # no temp dirs left behind


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "the following arguments are required"),
        (
            ["--tf-checkpoint", "missing.ckpt", "--bert-config", str(FIXTURE / "bert_config.json"), "--output", "x"],
            "missing.ckpt.index: no such file",
        ),
        (
            ["--tf-checkpoint", str(PRETRAINING), "--bert-config", "nope.json", "--output", "x"],
            "nope.json: no such file",
        ),
    ],
)
def test_convert_user_errors_are_one_line(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert convert.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertbench convert: error: ") and message in err
    assert not os.path.exists(tmp_path / "x")


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    import safetensors.torch

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    with pytest.raises(OSError, match="disk full"):
        save_hf_directory(reference_pretraining_model(), CONFIG, tmp_path / "out")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("safe", [True, False])
def test_round_trip_through_safetensors_and_bin(tmp_path, safe):
    reference = reference_pretraining_model()
    save_hf_directory(reference, CONFIG, tmp_path / "out", safe_serialization=safe)
    weights = "model.safetensors" if safe else "pytorch_model.bin"
    assert sorted(os.listdir(tmp_path / "out")) == ["config.json", weights]
    state = load_state_dict(tmp_path / "out", CONFIG)
    assert not any(name.startswith("cls.predictions.decoder.") for name in state)  # tied aliases saved once
    model = transformers.BertForPreTraining(hf_config())
    report = load_pretrained(model, tmp_path / "out", CONFIG)
    assert report.missing == report.new == report.unused == []
    assert_same_weights(model, reference)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    hf_model, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "out", output_loading_info=True)
    assert_no_loading_problems(info)


def test_old_gamma_beta_names_and_sharded_safetensors(tmp_path):
    from safetensors.torch import save_file

    reference = reference_pretraining_model()
    state = {
        name: tensor.contiguous()
        for name, tensor in reference.state_dict().items()
        if not name.startswith("cls.predictions.decoder.")
    }
    old = {
        name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): tensor
        for name, tensor in state.items()
    }
    torch.save(old, tmp_path / "pytorch_model.bin")
    assert load_state_dict(tmp_path / "pytorch_model.bin").keys() == state.keys()
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[:20], "model-00002-of-00002.safetensors": names[20:]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for shard, shard_names in shards.items():
        save_file({name: state[name] for name in shard_names}, sharded / shard)
    weight_map = {name: shard for shard, shard_names in shards.items() for name in shard_names}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = load_state_dict(sharded)
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[name], state[name]) for name in names)


def test_load_pretrained_fits_prefixes_and_reports_heads(pretraining_dir):
    classifier = transformers.BertForSequenceClassification(hf_config(num_labels=3))
    report = load_pretrained(classifier, pretraining_dir)
    assert report.missing == [] and report.new == ["classifier.weight", "classifier.bias"]
    assert all(name.startswith("cls.") for name in report.unused) and len(report.unused) == 7
    assert_same_weights(classifier.bert, reference_pretraining_model().bert)

    encoder = transformers.BertModel(hf_config())
    report = load_pretrained(encoder, pretraining_dir)
    assert report.missing == report.new == [] and len(report.unused) == 7
    assert_same_weights(encoder, reference_pretraining_model().bert)


def test_load_pretrained_from_tf_checkpoint_directly():
    model = transformers.BertForPreTraining(hf_config())
    report = load_pretrained(model, PRETRAINING)  # finds bert_config.json beside the checkpoint
    assert report.missing == report.new == report.unused == []
    assert_same_weights(model, reference_pretraining_model())


def test_load_pretrained_shape_mismatch_is_an_error(pretraining_dir):
    model = transformers.BertForPreTraining(hf_config(vocab_size=100))
    with pytest.raises(
        WeightsError,
        match=r"bert\.embeddings\.word_embeddings\.weight has shape \[99, 32\], "
        r"the model expects \[100, 32\]",
    ):
        load_pretrained(model, pretraining_dir)


def test_load_pretrained_error_leaves_the_model_untouched(pretraining_dir):
    # position embeddings mismatch; the word embeddings before them in the file fit and must not be copied either
    model = transformers.BertForPreTraining(hf_config(max_position_embeddings=128))
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(WeightsError, match="position_embeddings"):
        load_pretrained(model, pretraining_dir)
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_load_state_dict_checks_the_config(pretraining_dir):
    with pytest.raises(
        WeightsError,
        match=r"model\.safetensors: bert\.embeddings\.position_embeddings\.weight has "
        r"shape \[64, 32\], the config implies \[128, 32\]",
    ):
        load_state_dict(pretraining_dir, dataclasses.replace(CONFIG, max_position_embeddings=128))
    with pytest.raises(WeightsError, match=r"fixtures: a directory with no BERT weights \(it holds google_bert, "):
        load_state_dict(FIXTURE.parent)


def test_bertbench_model_matches_hf(pretraining_dir, tmp_path):
    modeling = pytest.importorskip("bertbench.model.modeling")
    model = modeling.BertForPreTraining(CONFIG)
    report = load_pretrained(model, pretraining_dir)
    assert report.missing == report.new == report.unused == []
    reference = reference_pretraining_model()
    inputs = hf_inputs()
    positions = torch.tensor([[1, 4, 7], [2, 3, 8]])
    with torch.no_grad():
        want = reference(**inputs)
        got = model.eval()(
            inputs["input_ids"], token_type_ids=inputs["token_type_ids"], attention_mask=inputs["attention_mask"]
        )
        got_masked = model(
            inputs["input_ids"],
            token_type_ids=inputs["token_type_ids"],
            attention_mask=inputs["attention_mask"],
            masked_lm_positions=positions,
        )
    real = inputs["attention_mask"].bool()  # the padding's logits are not computed on the unpadded path
    torch.testing.assert_close(got.mlm_logits[real], want.prediction_logits[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(got.nsp_logits, want.seq_relationship_logits, rtol=0, atol=1e-5)
    gathered = torch.stack([want.prediction_logits[row, positions[row]] for row in range(2)])
    torch.testing.assert_close(got_masked.mlm_logits, gathered.reshape(got_masked.mlm_logits.shape), rtol=0, atol=1e-5)
    # And back: bertbench's model saved as an HF directory loads into transformers unchanged.
    save_hf_directory(model, CONFIG, tmp_path / "saved")
    hf_model, info = transformers.BertForPreTraining.from_pretrained(tmp_path / "saved", output_loading_info=True)
    assert_no_loading_problems(info)
    assert_same_weights(hf_model, reference)
