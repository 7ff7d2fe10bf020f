"""HF's example-script commands (run_glue.py, run_qa.py and TrainingArguments' flags) run here as they are, under
`python -m bertbench.run_glue` and `run_qa`, on a local HF directory: GLUE's tsv files or HF's own csv/JSON-lines
files, SQuAD's nested or HF's flattened JSON. An HF command (one that gives --model_name_or_path) trains with HF
Trainer's defaults for what it leaves out; --gradient_accumulation_steps has HF's meaning beside
--per_device_train_batch_size; HF's result keys and files are written. What cannot be honoured (a hub id, a dataset
to download, evaluation during training, ...) is one line, exit status 2, the output directory as it was; flags that
mean nothing here are noted."""

import csv
import json
import runpy
import sys

import pytest
import torch
from helpers import TINY_BERT, read_json, snapshot, write_bert_dir

from bertbench import export, run_glue, run_qa
from bertbench.example_data import write_hf_glue_files
from bertbench.model.config import BertConfig
from bertbench.model.factory import build_model
from bertbench.runners import classifier as run_classifier
from bertbench.runners import squad as run_squad
from bertbench.runners.config import parse_config
from bertbench.tasks.squad.reading import read_examples
from bertbench.tasks.squad.scoring import read_questions
from bertbench.tasks.synthetic import write_glue_task, write_squad
from bertbench.weights.hf import save_hf_directory


def flattened(nested: dict) -> dict:
    """A SQuAD file as HF datasets' flattened records, what HF's run_qa.py reads."""
    return {
        "data": [
            {
                "id": qa["id"],
                "title": article["title"],
                "context": paragraph["context"],
                "question": qa["question"],
                "answers": {
                    "text": [answer["text"] for answer in qa["answers"]],
                    "answer_start": [answer["answer_start"] for answer in qa["answers"]],
                },
            }
            for article in nested["data"]
            for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]
        ]
    }


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A tiny model as an HF directory (hf/, with its vocabulary), MRPC as GLUE's tsv (glue/MRPC/) and as HF's csv
    and json files (files/), a regression in HF's csv (regression/: the pairs scored 0.5 to 4.5), SQuAD v1.1 nested
    (squad/) and flattened (squad/flat-dev.json)."""
    root = tmp_path_factory.mktemp("hf_inputs")
    write_bert_dir(root / "bert")
    config = BertConfig(**TINY_BERT)
    torch.manual_seed(0)
    save_hf_directory(build_model("pretraining", config), config, root / "hf", vocab_file=root / "bert" / "vocab.txt")
    mrpc = write_glue_task(root / "glue", "MRPC", train=64, dev=16, test=8)
    write_hf_glue_files(mrpc, root / "files")
    (root / "regression").mkdir()
    for split in ("train", "validation", "test"):
        with open(root / "files" / f"{split}.csv", newline="") as source:
            rows = list(csv.DictReader(source))
        for index, row in enumerate(rows):
            if "label" in row:
                row["label"] = str(0.5 + 3 * int(row["label"]) + index % 3 / 2)
        with open(root / "regression" / f"{split}.csv", "w", newline="") as target:
            writer = csv.DictWriter(target, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    write_squad(root / "squad", "1.1", train=8, dev=2)
    (root / "squad" / "flat-dev.json").write_text(json.dumps(flattened(read_json(root / "squad" / "dev-v1.1.json"))))
    return root


def run_glue_flags(inputs, out, *extra):
    """HF's run_glue command, as its README spells one, small."""
    return [
        f"--model_name_or_path={inputs / 'hf'}",
        "--do_train",
        "--max_seq_length=32",
        "--per_device_train_batch_size=8",
        "--learning_rate=2e-5",
        "--num_train_epochs=1",
        "--logging_steps=1000",
        f"--output_dir={out}",
        *extra,
    ]


def files(inputs, kind, extension, *splits):
    names = {"train": "train_file", "validation": "validation_file", "test": "test_file"}
    return [f"--{names[split]}={inputs / kind / f'{split}.{extension}'}" for split in splits]


def predictions(path):
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction"
    return [line.split("\t") for line in lines[1:]]


def test_run_glue_on_glue_tsv_trains_with_hf_trainer_defaults_and_writes_hf_keys(inputs, tmp_path, capsys):
    out = tmp_path / "run"
    argv = run_glue_flags(inputs, out, "--task_name=mrpc", f"--data_dir={inputs / 'glue' / 'MRPC'}", "--do_eval")
    assert run_glue.main(argv) == 0
    output = capsys.readouterr().out
    assert (
        "note: HF Trainer's defaults for what this HF command (--model_name_or_path) leaves out: "
        "--adam_bias_correction --adam_epsilon=1e-08 --weight_decay=0.0 --warmup_proportion=0.0 --schedule=hf"
    ) in output
    train = read_json(out / "train_results.json")
    assert (train["train_batch_size"], train["adam_bias_correction"]) == (8, True)
    args = read_json(out / "bertbench_run.json")["args"]
    assert (args["adam_epsilon"], args["weight_decay"], args["warmup_proportion"], args["schedule"]) == (
        1e-8,
        0.0,
        0.0,
        "hf",
    )
    results = read_json(out / "eval_results.json")
    assert results["eval_accuracy"] == results["dev_acc"] and results["eval_f1"] == results["dev_f1"]
    assert results["eval_combined_score"] == pytest.approx(results["dev_acc_and_f1"])
    assert (results["eval_samples"], results["eval_loss"]) == (16, results["dev_loss"])
    assert read_json(out / "all_results.json") == {
        key: value for key, value in results.items() if key.startswith("eval_")
    }
    # a later evaluation without the HF flags is the same run: the record keeps its settings
    assert run_classifier.main([f"--output_dir={out}", "--do_eval"]) == 0
    assert "HF Trainer's defaults" not in capsys.readouterr().out


def test_a_google_command_keeps_googles_defaults(tmp_path):
    command, _ = parse_config(
        run_classifier.SPEC,
        [
            "--task_name=MRPC",
            "--data_dir=d",
            "--vocab_file=v",
            "--bert_config_file=c",
            "--do_train",
            f"--output_dir={tmp_path}",
        ],
    )
    train = command.train
    assert (train.adam_bias_correction, train.adam_epsilon, train.weight_decay, train.warmup_proportion) == (
        False,
        1e-6,
        0.01,
        0.1,
    )
    assert (train.schedule, command.task.train_batch_size, command.notes) == ("google", 32, ())


def test_an_hf_command_states_what_it_wants_and_gets_it(inputs, tmp_path):
    """A flag the command gives wins over HF's default for its field, under any of the field's names."""
    argv = [
        f"--model_name_or_path={inputs / 'hf'}",
        "--do_train",
        "--task_name=mrpc",
        "--data_dir=d",
        "--weight_decay=0.01",
        "--optim=adamw_torch",
        "--train_batch_size=16",
        "--warmup_steps=3",
        f"--output_dir={tmp_path}",
    ]
    command, _ = parse_config(run_classifier.SPEC, argv)
    train = command.train
    assert (train.weight_decay, train.adam_epsilon, train.adam_bias_correction, command.task.train_batch_size) == (
        0.01,
        1e-8,
        True,
        16,
    )
    (note,) = [note for note in command.notes if "HF Trainer's defaults" in note]
    assert "--weight_decay" not in note and "--adam_bias_correction" not in note and "batch" not in note
    assert command.train_config(1, 10, "cpu")[0].warmup_steps == 3


@pytest.mark.parametrize(
    "extra, micro_batch, accumulation, note",
    [
        (
            ["--per_device_train_batch_size=4", "--gradient_accumulation_steps=2"],
            4,
            2,
            "(HF's meaning): 2 micro-batches of 4",
        ),
        (["--train_batch_size=8", "--gradient_accumulation_steps=2"], 4, 2, "(NVIDIA's meaning): micro-batches of 4"),
        (["--train_batch_size=8", "--num_accumulation_steps=2"], 8, 2, None),  # Google's
        (["--model_name_or_path=.", "--gradient_accumulation_steps=2"], 8, 2, "(HF's meaning): 2 micro-batches of 8"),
    ],
)
def test_gradient_accumulation_steps_has_hfs_meaning_beside_per_device_batches(
    tmp_path, extra, micro_batch, accumulation, note
):
    command, _ = parse_config(
        run_squad.SPEC,
        ["--train_file=t", "--vocab_file=v", "--bert_config_file=c", "--do_train", f"--output_dir={tmp_path}", *extra],
    )
    assert (command.task.train_batch_size, command.train.gradient_accumulation_steps) == (micro_batch, accumulation)
    assert (
        any(note in line for line in command.notes) if note else not [line for line in command.notes if "batch" in line]
    )


@pytest.mark.parametrize("extension", ["csv", "json"])
def test_run_glue_on_hf_classification_files(inputs, tmp_path, extension):
    out = tmp_path / "run"
    argv = run_glue_flags(
        inputs, out, *files(inputs, "files", extension, "train", "validation", "test"), "--do_eval", "--do_predict"
    )
    assert run_glue.main(argv) == 0
    results = read_json(out / "eval_results.json")
    assert {"eval_accuracy", "eval_loss", "eval_samples"} <= set(results) and "eval_f1" not in results  # HF: accuracy
    predicted = predictions(out / "predict_results_None.txt")  # HF's name without --task_name
    assert [index for index, _ in predicted] == [str(index) for index in range(8)]
    assert {label for _, label in predicted} <= {"0", "1"}


def test_run_glue_with_a_task_name_scores_hf_files_with_the_tasks_metric(inputs, tmp_path):
    out = tmp_path / "run"
    argv = run_glue_flags(
        inputs,
        out,
        "--task_name=mrpc",
        *files(inputs, "files", "json", "train", "validation", "test"),
        "--do_eval",
        "--do_predict",
        "--max_eval_samples=10",
        "--max_predict_samples=5",
    )
    assert run_glue.main(argv) == 0
    results = read_json(out / "eval_results.json")
    assert {"eval_accuracy", "eval_f1", "eval_combined_score"} <= set(results) and results["eval_samples"] == 10
    assert len(predictions(out / "predict_results_mrpc.txt")) == 5
    exported = tmp_path / "exported"
    assert export.main([str(out), str(exported)]) == 0
    assert read_json(exported / "config.json")["id2label"] == {"0": "0", "1": "1"}  # the file's labels, sorted


def test_run_glue_on_a_regression_file_and_as_stsb(inputs, tmp_path):
    out = tmp_path / "run"
    argv = run_glue_flags(
        inputs, out, *files(inputs, "regression", "csv", "train", "validation", "test"), "--do_eval", "--do_predict"
    )
    assert run_glue.main(argv) == 0
    results = read_json(out / "eval_results.json")
    assert "eval_mse" in results and "eval_accuracy" not in results
    for _, score in predictions(out / "predict_results_None.txt"):
        assert len(score.split(".")[1]) == 3  # HF's {:3.3f}, not clipped to STS-B's range
    out = tmp_path / "stsb"
    assert (
        run_glue.main(
            run_glue_flags(
                inputs, out, "--task_name=stsb", *files(inputs, "regression", "csv", "train", "validation"), "--do_eval"
            )
        )
        == 0
    )
    assert {"eval_pearson", "eval_spearmanr", "eval_combined_score"} <= set(read_json(out / "eval_results.json"))


def test_run_qa_scores_the_validation_file_flattened_or_nested(inputs, tmp_path):
    nested, flat = inputs / "squad" / "dev-v1.1.json", inputs / "squad" / "flat-dev.json"
    assert read_examples(flat, training=False, version_2=False) == read_examples(
        nested, training=False, version_2=False
    )
    assert read_questions(flat) == read_questions(nested)
    out = tmp_path / "run"
    argv = [
        f"--model_name_or_path={inputs / 'hf'}",
        f"--train_file={inputs / 'squad' / 'train-v1.1.json'}",
        f"--validation_file={flat}",
        "--do_train",
        "--do_eval",
        "--per_device_train_batch_size=4",
        "--per_device_eval_batch_size=4",
        "--max_seq_length=48",
        "--doc_stride=16",
        "--max_query_length=16",
        "--max_eval_samples=4",
        "--num_train_epochs=1",
        f"--output_dir={out}",
    ]
    assert run_qa.main(argv) == 0
    assert len(read_json(out / "predictions.json")) == 4
    results = read_json(out / "all_results.json")
    assert set(results) == {"eval_exact_match", "eval_f1", "eval_samples"}
    assert results["eval_f1"] == read_json(out / "eval_results.json")["f1"]


def test_run_qa_test_file_is_predicted_by_do_predict(tmp_path):
    command, _ = parse_config(
        run_squad.SPEC,
        [
            "--train_file=t",
            "--test_file=test.json",
            "--vocab_file=v",
            "--bert_config_file=c",
            "--do_predict",
            f"--output_dir={tmp_path}",
        ],
    )
    assert (command.task.predict_file, command.task.do_predict, command.task.do_eval) == ("test.json", True, False)


@pytest.mark.parametrize(
    "command, extra, message",
    [
        (
            "glue",
            ["--model_name_or_path=bert-base-uncased"],
            "--model_name_or_path=bert-base-uncased: no such file or directory, and bertbench never downloads; if it is a hub model id, download it once (huggingface-cli download bert-base-uncased --local-dir bert-base-uncased)",
        ),
        (
            "glue",
            ["--task_name=mrpc"],
            "--data_dir or HF's --train_file (--task_name=mrpc needs its data here: HF's run_glue downloads GLUE, "
            "bertbench never does) is required",
        ),
        ("glue", ["--validation_file=v.csv", "--do_eval"], "--validation_file needs --train_file"),
        (
            "glue",
            ["--train_file=t.csv", "--data_dir=d"],
            "--data_dir (GLUE's tsv files) or --train_file (HF's csv/json files): give one",
        ),
        ("glue", ["--train_file=t.csv", "--do_predict"], "--do_predict with HF's --train_file needs --test_file"),
        (
            "glue",
            ["--dataset_name=glue", "--dataset_config_name=mrpc"],
            "--dataset_name=glue: bertbench never downloads a dataset",
        ),
        ("glue", ["--push_to_hub"], "--push_to_hub=true: bertbench never uploads"),
        ("glue", ["--eval_strategy=epoch"], "--eval_strategy=epoch: bertbench evaluates once, after training"),
        ("glue", ["--evaluation_strategy=steps"], "--evaluation_strategy=steps: bertbench evaluates once"),
        ("glue", ["--save_strategy=epoch"], "--save_strategy=epoch: bertbench saves by steps and seconds"),
        ("glue", ["--load_best_model_at_end=true"], "--load_best_model_at_end=true: bertbench evaluates once"),
        (
            "glue",
            ["--label_smoothing_factor=0.1"],
            "--label_smoothing_factor=0.1: bertbench trains with plain cross-entropy",
        ),
        ("glue", ["--optim=adafactor"], "argument --optim: invalid choice: 'adafactor'"),
        ("glue", ["--lr_scheduler_type=cosine"], "argument --lr_scheduler_type: invalid choice: 'cosine'"),
        ("glue", ["--bf16", "--fp16"], "contradict each other"),
        (
            "qa",
            ["--validation_file=v.json", "--test_file=t.json", "--do_eval", "--do_predict"],
            "bertbench predicts one file per command",
        ),
        ("qa", ["--validation_file=v.json", "--do_predict"], "--do_predict with HF's files needs --test_file"),
        ("qa", ["--test_file=t.json", "--do_eval"], "--do_eval with HF's files needs --validation_file"),
        (
            "qa",
            ["--test_file=t.json", "--predict_file=p.json", "--do_predict"],
            "--predict_file (Google's) or HF's --validation_file/--test_file: give one",
        ),
    ],
)
def test_what_cannot_be_honoured_is_one_line(inputs, tmp_path, error_line, command, extra, message):
    out = tmp_path / "run"
    main, own = (
        (run_glue.main, [])
        if command == "glue"
        else (run_qa.main, [f"--train_file={inputs / 'squad' / 'train-v1.1.json'}"])
    )
    model = (
        []
        if any(flag.startswith("--model_name_or_path") for flag in extra)
        else [f"--model_name_or_path={inputs / 'hf'}"]
    )
    assert main([*model, *own, "--do_train", f"--output_dir={out}", *extra]) == 2
    assert message in error_line()
    assert not out.exists()


def test_overwrite_output_dir_is_refused_on_a_run_and_noted_otherwise(inputs, tmp_path, capsys, error_line):
    out = tmp_path / "run"
    argv = run_glue_flags(
        inputs, out, *files(inputs, "files", "csv", "train"), "--overwrite_output_dir", "--max_train_samples=8"
    )
    assert run_glue.main(argv) == 0
    assert "note: --overwrite_output_dir is ignored: bertbench deletes nothing" in capsys.readouterr().out
    before = snapshot(out)
    assert run_glue.main(argv) == 2
    assert f"--overwrite_output_dir: {out} holds a run, and bertbench never deletes one" in error_line()
    assert snapshot(out) == before


@pytest.mark.parametrize(
    "extra",
    [
        ["--cache_dir=c", "--overwrite_cache", "--preprocessing_num_workers=4", "--dataloader_num_workers=2"],
        ["--use_fast_tokenizer=false", "--pad_to_max_length", "--disable_tqdm", "--run_name=mrpc"],
        ["--model_revision=main", "--token=t", "--use_auth_token", "--trust_remote_code"],
        ["--eval_strategy=no", "--evaluation_strategy=no", "--save_strategy=steps", "--push_to_hub=false"],
        ["--load_best_model_at_end=false", "--label_smoothing_factor=0", "--overwrite_output_dir"],
    ],
)
def test_flags_that_mean_nothing_here_are_noted(tmp_path, extra):
    command, _ = parse_config(
        run_squad.SPEC,
        ["--train_file=t", "--vocab_file=v", "--bert_config_file=c", "--do_train", f"--output_dir={tmp_path}", *extra],
    )
    noted = {note.split(" is ignored: ")[0] for note in command.notes}
    assert {flag.split("=")[0] for flag in extra} <= noted


def test_the_shims_are_the_runners_under_hfs_and_nvidias_names(monkeypatch, capsys):
    assert (run_glue.main, run_qa.main) == (run_classifier.main, run_squad.main)
    # `python -m bertbench.run_qa --help`: the module's file run as __main__, here (a new Python's imports would cost
    # 2 CPU-seconds)
    monkeypatch.setattr(sys, "argv", ["run_qa.py", "--help"])
    with pytest.raises(SystemExit) as exited:
        runpy.run_path(run_qa.__file__, run_name="__main__")
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "--validation_file" in shown and "--per_device_train_batch_size" in shown
