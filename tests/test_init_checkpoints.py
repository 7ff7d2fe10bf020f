"""Every checkpoint a BERT user holds is a warm start: Google's TF1 checkpoints, HF directories and weights files
(sharded too), NVIDIA DeepLearningExamples' `{'model': ...}` files with their names and pickled objects, state dicts
saved from DDP or torch.compile wrappers, bertbench runs and their checkpoints. Each loads every encoder weight,
exactly; the load report says what it did in counts. A run directory is a self-contained --init_checkpoint: its
record says the model config, vocabulary and lower-casing. (What is refused is in test_malformed_inputs' corpus.)"""

import json
import os
from pathlib import Path

import pytest
import torch
from helpers import TINY_BERT, runner_command, snapshot

from bertbench.example_data import tf_variables
from bertbench.model.config import BertConfig
from bertbench.model.factory import build_model
from bertbench.runners import classifier as run_classifier
from bertbench.runners import squad as run_squad
from bertbench.training.checkpoint import save_checkpoint
from bertbench.weights.hf import save_hf_directory, save_hf_weights_file
from bertbench.weights.pretrained import load_pretrained, load_state_dict, nvidia_checkpoint
from bertbench.weights.tf_checkpoint import write_tf_checkpoint

CONFIG = BertConfig(**TINY_BERT)
ENCODER_WEIGHTS = 5 + 16 * CONFIG.num_hidden_layers  # embeddings (3 tables, a LayerNorm) and 16 per layer


class WritesAFileWhenUnpickled:
    """A pickled object whose loading would create `path`: the reader must never run a checkpoint's code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (str(self.path),))


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The reference pre-training model's weights in every format: name -> path (and "reference": its state)."""
    root = tmp_path_factory.mktemp("sources")
    torch.manual_seed(3)
    model = build_model("pretraining", CONFIG)
    state = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    plain = {name: tensor for name, tensor in state.items() if not name.startswith("cls.predictions.decoder.")}
    paths = {"reference": state}

    tf = root / "google" / "bert_model.ckpt"
    tf.parent.mkdir()
    write_tf_checkpoint(str(tf), tf_variables(model, CONFIG))
    (tf.parent / "checkpoint").write_text('model_checkpoint_path: "bert_model.ckpt"\n')
    Path(f"{tf}.meta").write_bytes(b"")  # TF1's graph beside the checkpoint: a name users give too
    paths.update(
        {"tf1-prefix": tf, "tf1-index": Path(f"{tf}.index"), "tf1-meta": Path(f"{tf}.meta"), "tf1-directory": tf.parent}
    )

    save_hf_directory(model, CONFIG, root / "hf-safetensors")
    save_hf_directory(model, CONFIG, root / "hf-bin", safe_serialization=False)
    save_hf_weights_file(model, CONFIG, root / "converted" / "pytorch_model.bin")
    paths.update(
        {
            "hf-directory": root / "hf-safetensors",
            "hf-directory-bin": root / "hf-bin",
            "hf-safetensors-file": root / "hf-safetensors" / "model.safetensors",
            "hf-bin-file-of-the-conversion-script": root / "converted" / "pytorch_model.bin",
        }
    )
    from safetensors.torch import save_file

    sharded = root / "sharded"
    sharded.mkdir()
    names = sorted(plain)
    shards = {"model-00001-of-00002.safetensors": names[:20], "model-00002-of-00002.safetensors": names[20:]}
    for shard, shard_names in shards.items():
        save_file({name: plain[name].contiguous() for name in shard_names}, sharded / shard)
    index = {
        "metadata": {},
        "weight_map": {name: shard for shard, shard_names in shards.items() for name in shard_names},
    }
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    paths["hf-sharded-index"] = sharded / "model.safetensors.index.json"

    nvidia = root / "ckpt_8601.pt"  # run_pretraining.py's checkpoint mid-run, its data loader pickled with it
    torch.save(
        {
            **nvidia_checkpoint(plain),
            "master params": [tensor.float() for tensor in plain.values()],
            "data_loader": torch.utils.data.DataLoader(list(range(8)), batch_size=2),
            "sampler_state": WritesAFileWhenUnpickled(root / "code-ran"),
        },
        nvidia,
    )
    torch.save({"model": plain}, root / "pytorch_model_squad.bin")  # run_squad.py's saved model
    torch.save({f"module.{name}": tensor for name, tensor in plain.items()}, root / "ddp.pt")
    torch.save({f"_orig_mod.{name}": tensor for name, tensor in plain.items()}, root / "compiled.pt")
    torch.save({"state_dict": plain, "epoch": 3}, root / "lightning.ckpt")
    run = root / "run"
    save_checkpoint(run, 12, {"model": state})
    paths.update(
        {
            "nvidia-pretraining-checkpoint": nvidia,
            "nvidia-run-squad-model": root / "pytorch_model_squad.bin",
            "ddp-state-dict": root / "ddp.pt",
            "torch-compile-state-dict": root / "compiled.pt",
            "lightning-state-dict": root / "lightning.ckpt",
            "bertbench-run": run,
            "bertbench-checkpoint": run / "ckpt-000000012.pt",
        }
    )
    return paths


FORMATS = [
    ("tf1-prefix", "Google's TF1 checkpoint"),
    ("tf1-index", "Google's TF1 checkpoint"),
    ("tf1-meta", "Google's TF1 checkpoint"),
    ("tf1-directory", "Google's TF1 checkpoint"),
    ("hf-directory", "HF directory"),
    ("hf-directory-bin", "HF directory"),
    ("hf-safetensors-file", "HF weights file"),
    ("hf-bin-file-of-the-conversion-script", "HF weights file"),
    ("hf-sharded-index", "sharded HF weights"),
    ("nvidia-pretraining-checkpoint", "NVIDIA's checkpoint: its 'model' entry; not read: data_loader, epoch, files"),
    ("nvidia-run-squad-model", "torch.save file: its 'model' entry"),
    ("ddp-state-dict", "torch.save file"),
    ("torch-compile-state-dict", "torch.save file"),
    ("lightning-state-dict", "torch.save file: its 'state_dict' entry; not read: epoch"),
    ("bertbench-run", "bertbench run: its newest checkpoint ckpt-000000012.pt"),
    ("bertbench-checkpoint", "bertbench checkpoint"),
]


@pytest.mark.parametrize("name, described", FORMATS, ids=[name for name, _ in FORMATS])
def test_every_format_loads_every_encoder_weight_exactly(sources, name, described):
    model = build_model("classification", CONFIG, num_labels=3)
    report = load_pretrained(model, sources[name], CONFIG)
    weights = model.state_dict()
    reference = sources["reference"]
    assert all(torch.equal(weights[key], reference[key]) for key in reference if key.startswith("bert."))
    assert report.missing == [] and report.encoder == ENCODER_WEIGHTS
    assert report.new == ["classifier.weight", "classifier.bias"]
    assert all(key.startswith("cls.") for key in report.unused)
    assert report.described.startswith(described)
    assert str(report).startswith(
        f"warm start from {sources[name]} ({report.described}): loaded {ENCODER_WEIGHTS} of {ENCODER_WEIGHTS} encoder "
        "weights and bert.pooler (2 weights); new, from random values: classifier (2 weights); not used: "
        "cls.predictions, cls.seq_relationship"
    )


def test_evaluation_from_a_checkpoint_reports_the_step_it_was_saved_at(sources):
    steps = {
        name: load_pretrained(build_model("pretraining", CONFIG), sources[name], CONFIG).step
        for name in sources
        if name != "reference"
    }
    assert steps["nvidia-pretraining-checkpoint"] == 8601 and steps["bertbench-run"] == 12
    assert steps["hf-directory"] is None and steps["ddp-state-dict"] is None


def test_the_names_a_wrapper_or_nvidia_gave_are_said_in_the_report(sources):
    said = {
        name: str(load_pretrained(build_model("pretraining", CONFIG), sources[name], CONFIG))
        for name in ("nvidia-pretraining-checkpoint", "ddp-state-dict", "torch-compile-state-dict", "hf-directory")
    }
    assert said["nvidia-pretraining-checkpoint"].endswith("names read as NVIDIA's dense_act names (HF's dense)")
    assert said["ddp-state-dict"].endswith("names read as a DDP wrapper (module.)")
    assert said["torch-compile-state-dict"].endswith("names read as torch.compile (_orig_mod.)")
    assert "names read as" not in said["hf-directory"] and "new, from random" not in said["hf-directory"]


def test_a_checkpoints_pickled_objects_are_never_run(sources):
    model = build_model("pretraining", CONFIG)
    load_pretrained(model, sources["nvidia-pretraining-checkpoint"], CONFIG)
    assert not (sources["nvidia-pretraining-checkpoint"].parent / "code-ran").exists()
    assert torch.equal(
        model.cls.predictions.transform.dense.weight, sources["reference"]["cls.predictions.transform.dense.weight"]
    )


@pytest.mark.parametrize("runner", ["classifier", "squad"])
def test_nvidias_checkpoint_warm_starts_the_runners(sources, runner_inputs, tmp_path, capsys, runner):
    """Before: NVIDIA's checkpoint loaded no weight, and the run trained from random values and exited 0."""
    main, argv = runner_command(runner, runner_inputs, tmp_path / "run")
    assert main([*argv, f"--init_checkpoint={sources['nvidia-pretraining-checkpoint']}"]) == 0
    out = capsys.readouterr().out
    assert f"warm start from {sources['nvidia-pretraining-checkpoint']} (NVIDIA's checkpoint" in out
    assert f"loaded {ENCODER_WEIGHTS} of {ENCODER_WEIGHTS} encoder weights" in out


def test_a_partial_checkpoint_trains_only_when_the_flag_says_so(sources, runner_inputs, tmp_path, capsys):
    state = torch.load(sources["ddp-state-dict"], weights_only=True)
    partial = tmp_path / "partial.pt"
    torch.save({name: tensor for name, tensor in state.items() if ".layer.1." not in name}, partial)
    main, argv = runner_command("classifier", runner_inputs, tmp_path / "run", f"--init_checkpoint={partial}")
    assert main(argv) == 2
    assert snapshot(tmp_path / "run") is None
    assert "16 of the model's 37 encoder weights are not in it (bert.encoder.layer.1)" in capsys.readouterr().err
    assert main([*argv, "--allow_partial_init_checkpoint"]) == 0
    out = capsys.readouterr().out
    assert "loaded 21 of 37 encoder weights" in out
    assert "MISSING, from random values: bert.encoder.layer.1 (16 weights)" in out


@pytest.fixture(scope="module")
def finished_classifier(runner_inputs, tmp_path_factory):
    run = tmp_path_factory.mktemp("finished") / "mrpc"
    main, argv = runner_command("classifier", runner_inputs, run)
    assert main(argv) == 0
    return run


@pytest.mark.parametrize("checkpoint", ["run directory", "its checkpoint file"])
def test_a_run_is_a_self_contained_init_checkpoint(finished_classifier, runner_inputs, tmp_path, capsys, checkpoint):
    """Before: a finished run directory as --init_checkpoint of a --do_predict run asked for --bert_config_file."""
    init = finished_classifier if checkpoint == "run directory" else next(finished_classifier.glob("ckpt-*.pt"))
    glue = runner_inputs / "glue" / "MRPC"
    predict = [
        "--task_name=MRPC",
        f"--data_dir={glue}",
        "--do_predict",
        f"--init_checkpoint={init}",
        "--max_seq_length=32",
    ]
    assert run_classifier.main([*predict, f"--output_dir={tmp_path / 'glue'}"]) == 0
    out = capsys.readouterr().out
    record = finished_classifier / "bertbench_run.json"
    assert (
        f"note: --bert_config_file={record}, --vocab_file={runner_inputs / 'bert' / 'vocab.txt'}, "
        f"--do_lower_case=true (from {record}), taken from {init}"
    ) in out
    assert "encoder weights and bert.pooler, classifier (4 weights)" in out  # the fine-tuned head too
    assert (tmp_path / "glue" / "MRPC.tsv").is_file()
    squad = [
        "--do_predict",
        f"--predict_file={runner_inputs / 'squad' / 'dev-v1.1.json'}",
        f"--init_checkpoint={init}",
        "--max_seq_length=32",
        "--max_query_length=8",
        "--doc_stride=8",
        f"--output_dir={tmp_path / 'squad'}",
    ]
    assert run_squad.main(squad) == 0
    assert (tmp_path / "squad" / "predictions.json").is_file()


def test_a_flag_that_contradicts_the_runs_record_is_refused(finished_classifier, runner_inputs, tmp_path, capsys):
    other = tmp_path / "bert_config.json"
    other.write_text(json.dumps({**TINY_BERT, "intermediate_size": 128}))
    argv = [
        "--task_name=MRPC",
        f"--data_dir={runner_inputs / 'glue' / 'MRPC'}",
        "--do_predict",
        f"--init_checkpoint={finished_classifier}",
        f"--bert_config_file={other}",
        f"--output_dir={tmp_path / 'out'}",
    ]
    assert run_classifier.main(argv) == 2
    assert (
        f"--bert_config_file={other} describes another model than {finished_classifier / 'bertbench_run.json'}"
        in capsys.readouterr().err
    )
    assert snapshot(tmp_path / "out") is None


def test_export_takes_every_format_too(sources, tmp_path, capsys):
    """`bertbench export` of NVIDIA's checkpoint: an HF directory with its weights under HF's names (that
    transformers loads what export writes is test_hf_directories')."""
    from bertbench import export

    config_file = tmp_path / "bert_config.json"
    config_file.write_text(json.dumps(TINY_BERT))
    out = tmp_path / "hf"
    assert (
        export.main([str(sources["nvidia-pretraining-checkpoint"]), str(out), "--bert_config_file", str(config_file)])
        == 0
    )
    assert "NVIDIA's checkpoint: its 'model' entry" in capsys.readouterr().out
    exported, reference = load_state_dict(out), sources["reference"]
    assert json.loads((out / "config.json").read_text())["architectures"] == ["BertForPreTraining"]
    assert set(exported) == {name for name in reference if not name.startswith("cls.predictions.decoder.")}
    assert all(torch.equal(tensor, reference[name]) for name, tensor in exported.items())


def test_export_refuses_a_checkpoint_missing_encoder_weights(sources, tmp_path, error_line):
    """What a warm start refuses, export refuses too: no HF directory of a model with layers of random values."""
    from bertbench import export

    state = torch.load(sources["ddp-state-dict"], weights_only=True)
    partial = tmp_path / "partial.pt"
    torch.save({name: tensor for name, tensor in state.items() if ".layer.1." not in name}, partial)
    config_file = tmp_path / "bert_config.json"
    config_file.write_text(json.dumps(TINY_BERT))
    assert export.main([str(partial), str(tmp_path / "hf"), "--bert_config_file", str(config_file)]) == 2
    assert error_line() == (
        f"bertbench export: error: {partial}: 16 of the model's 37 encoder weights are not in it (bert.encoder.layer.1)"
    )
    assert not (tmp_path / "hf").exists()
