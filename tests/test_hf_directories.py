"""HF users in and out from the command line: `bertbench export` of a run loads in transformers offline and gives
bertbench's dev logits and token ids; a transformers 5 directory (tokenizer.json, no vocab.txt) is all a runner
needs as --init_checkpoint; flags that contradict it are refused in one line."""

import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from helpers import classifier_flags, write_bert_dir

from bertbench import export
from bertbench.model.config import BertConfig
from bertbench.model.factory import build_model
from bertbench.runners.classifier import SPEC
from bertbench.runners.classifier import main as classify
from bertbench.runners.config import parse_config
from bertbench.runners.pretraining import SPEC as PRETRAINING_SPEC
from bertbench.tasks.glue import encode_examples, get_processor
from bertbench.tasks.synthetic import write_glue_task
from bertbench.tasks.tokenization import BertTokenizer, VocabError, load_vocab
from bertbench.training.checkpoint import latest_checkpoint
from bertbench.weights.pretrained import load_pretrained

FIXTURE = Path(__file__).parent / "fixtures" / "tf1_tiny"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """glue/MRPC, bert/ (vocab.txt, TINY_BERT), run/: a classifier trained 4 steps, and hf/: that run exported."""
    root = tmp_path_factory.mktemp("hf")
    write_glue_task(root / "glue", "MRPC", train=64, dev=16, test=4)
    write_bert_dir(root / "bert")
    assert (
        classify(
            task_flags(root, root / "run")
            + [
                f"--vocab_file={root / 'bert' / 'vocab.txt'}",
                f"--bert_config_file={root / 'bert' / 'bert_config.json'}",
                "--do_train",
                "--do_eval",
            ]
        )
        == 0
    )
    assert export.main([str(root / "run"), str(root / "hf")]) == 0
    return root


def task_flags(root, out):
    return classifier_flags(root, out, "--num_train_epochs=1", "--device=cpu", bert=False)


@pytest.fixture(scope="module")
def transformers5_dir(root):
    """The export saved again by transformers 5 itself: config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json, and no vocab.txt."""
    out = root / "hf5"
    transformers.AutoModelForSequenceClassification.from_pretrained(root / "hf").save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(root / "hf").save_pretrained(out)
    assert not (out / "vocab.txt").exists() and (out / "tokenizer.json").exists()
    return out


def one_line_error(capsys, program):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{program}: error: "), err
    return err


def test_export_of_a_run_loads_offline_and_reproduces_bertbench(root, capsys):
    hf = root / "hf"
    assert sorted(os.listdir(hf)) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "0", "1": "1"} and config["problem_type"] == "single_label_classification"
    assert json.loads((hf / "tokenizer_config.json").read_text())["do_lower_case"] is True
    model = transformers.AutoModelForSequenceClassification.from_pretrained(hf, local_files_only=True).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(hf, local_files_only=True)

    processor = get_processor("MRPC")
    examples = processor.dev_sets(root / "glue" / "MRPC")["dev"]
    tokenizer = BertTokenizer.from_vocab_file(root / "bert" / "vocab.txt")
    features = encode_examples(examples, tokenizer, processor, 64)  # no example is cut at 64 tokens
    hf_ids = hf_tokenizer(
        [e.text_a for e in examples],
        [e.text_b for e in examples],
        padding="max_length",
        max_length=64,
        return_tensors="pt",
    )
    for name in ("input_ids", "token_type_ids", "attention_mask"):
        assert torch.equal(hf_ids[name], features[name]), name

    ours = build_model("classification", BertConfig.from_json_file(root / "bert" / "bert_config.json"), num_labels=2)
    load_pretrained(ours, latest_checkpoint(root / "run"))
    inputs = {name: features[name] for name in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        expected, got = ours.eval()(**inputs).logits, model(**inputs).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


def test_export_of_a_checkpoint_file_and_of_a_tf_checkpoint(root, tmp_path, capsys):
    out = tmp_path / "from_file"
    assert export.main([latest_checkpoint(root / "run"), str(out)]) == 0
    assert (out / "model.safetensors").read_bytes() == (root / "hf" / "model.safetensors").read_bytes()
    tf_out = tmp_path / "from_tf"
    assert (
        export.main(
            [
                str(FIXTURE / "bert_model.ckpt"),
                str(tf_out),
                "--bert_config_file",
                str(FIXTURE / "bert_config.json"),
                "--vocab_file",
                str(FIXTURE / "vocab.txt"),
                "--nodo_lower_case",
            ]
        )
        == 0
    )
    assert "BertForPreTraining" in capsys.readouterr().out
    model, info = transformers.AutoModelForPreTraining.from_pretrained(tf_out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert transformers.AutoTokenizer.from_pretrained(tf_out).do_lower_case is False


@pytest.mark.parametrize(
    "args, message",
    [
        (["{fixture}/bert_model.ckpt", "{tmp}/out"], "--bert_config_file: "),
        (
            ["{tmp}/nowhere", "{tmp}/out", "--bert_config_file", "{fixture}/bert_config.json"],
            "{tmp}/nowhere: no such file or directory",
        ),
        (
            ["{run}/model.ckpt-8", "{tmp}/out"],
            "{run}/model.ckpt-8: no such file or directory; {run} is a bertbench run",
        ),
        (["{run}", "{tmp}/out", "--nodo_lower_case"], "--do_lower_case=false contradicts"),
        (["{run}", "{tmp}/out", "--bert_config_file", "{fixture}/bert_config.json"], "describes another model"),
        (["{run}", "{hf}"], "exists and is not empty"),
    ],
)
def test_export_refusals_are_one_line_and_write_nothing(root, tmp_path, capsys, args, message):
    values = {"fixture": FIXTURE, "tmp": tmp_path, "run": root / "run", "hf": root / "hf"}
    before = sorted(os.listdir(root / "hf"))
    assert export.main([arg.format(**values) for arg in args]) == 2
    assert message.format(**values) in one_line_error(capsys, "bertbench export")
    assert not (tmp_path / "out").exists() and sorted(os.listdir(root / "hf")) == before


def test_a_transformers5_directory_is_all_a_runner_needs(root, transformers5_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    assert classify(task_flags(root, out) + [f"--init_checkpoint={transformers5_dir}", "--do_eval"]) == 0
    printed = capsys.readouterr().out
    assert (
        f"note: --bert_config_file={transformers5_dir / 'config.json'}, --vocab_file="
        f"{transformers5_dir / 'tokenizer.json'}, --do_lower_case=true (from "
        f"{transformers5_dir / 'tokenizer_config.json'}), taken from {transformers5_dir}"
    ) in printed
    original = json.loads((root / "run" / "eval_results.json").read_text())
    scores = json.loads((out / "eval_results.json").read_text())
    assert scores["dev_acc"] == original["dev_acc"]
    assert scores["dev_loss"] == pytest.approx(original["dev_loss"], abs=1e-6)


def test_agreeing_flags_are_kept_and_contradicting_ones_refused(root, transformers5_dir, tmp_path, capsys):
    base = [
        "--task_name=MRPC",
        f"--data_dir={root}",
        f"--init_checkpoint={transformers5_dir}",
        "--do_eval",
        f"--output_dir={tmp_path / 'x'}",
    ]
    command, _ = parse_config(SPEC, base + [f"--vocab_file={root / 'bert' / 'vocab.txt'}", "--do_lower_case"])
    assert command.task.vocab_file == str(root / "bert" / "vocab.txt") and command.task.do_lower_case
    for flag, message in [
        (
            "--nodo_lower_case",
            "--do_lower_case=false contradicts "
            f"{transformers5_dir / 'tokenizer_config.json'}, which says do_lower_case=true",
        ),
        (f"--bert_config_file={FIXTURE / 'bert_config.json'}", "describes another model than"),
        (f"--vocab_file={FIXTURE / 'vocab.txt'}", "is another vocabulary than"),
    ]:
        assert classify(base + [flag]) == 2
        assert message in one_line_error(capsys, "run_classifier")
    assert not (tmp_path / "x").exists()
    pretraining, _ = parse_config(
        PRETRAINING_SPEC,
        [
            f"--init_checkpoint={root / 'hf'}",
            "--do_train",
            "--num_train_steps=1",
            f"--input_dir={root}",
            f"--output_dir={tmp_path / 'p'}",
        ],
    )
    assert pretraining.task.bert_config_file == str(root / "hf" / "config.json")


def test_tokenizer_json_is_a_vocabulary(root, transformers5_dir, tmp_path, capsys):
    vocab = load_vocab(root / "bert" / "vocab.txt")
    assert load_vocab(transformers5_dir / "tokenizer.json") == vocab == load_vocab(transformers5_dir)
    bpe = tmp_path / "tokenizer.json"
    bpe.write_text(json.dumps({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}))
    with pytest.raises(VocabError, match=r"tokenizer.json: model.type is 'BPE', not 'WordPiece'"):
        load_vocab(bpe)
    braces = tmp_path / "vocab.txt"  # a vocab.txt whose first token is "{" is still a vocab.txt
    braces.write_text("{\n" + "".join(f"{token}\n" for token in vocab))
    assert load_vocab(braces)["{"] == 0 and len(load_vocab(braces)) == len(vocab) + 1
    assert (
        classify(
            task_flags(root, tmp_path / "run")
            + [
                f"--vocab_file={bpe}",
                "--do_eval",
                f"--bert_config_file={root / 'bert' / 'bert_config.json'}",
                f"--init_checkpoint={root / 'hf'}",
            ]
        )
        == 2
    )
    assert "model.type is 'BPE'" in one_line_error(capsys, "run_classifier")
