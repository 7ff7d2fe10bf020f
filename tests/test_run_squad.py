"""run_squad end to end on the built-in SQuAD-format data: Google's flags, training that learns (v2.0 with
unanswerable questions), the three prediction files, official scoring, both modeling modules, and one-line errors
for bad input that leave earlier results alone."""

import dataclasses
import json
import os

import pytest
import torch
from helpers import snapshot

from bertbench import cli
from bertbench.model.config import BertConfig
from bertbench.model.factory import MODELINGS
from bertbench.runners.config import parse_config
from bertbench.runners.squad import SPEC, main
from bertbench.tasks.squad import evaluate as evaluate_squad
from bertbench.tasks.synthetic import vocabulary, write_squad, write_vocab
from bertbench.training.checkpoint import list_checkpoints, load_checkpoint

# The v2 run's model. Weights drawn 5 times wider than BERT's 0.02: at 0.02 a model trained from scratch starts
# with attention nearly uniform, and finding the question's animal in the context took it from a few hundred steps
# to more than the run has, by the seed (--seed 1 and 2 stayed at "no answer" everywhere); at 0.1 every seed tried
# (1-10, 42) scored 100 in 1.5 epochs, and all but one passed in 1 epoch.
MODEL = {
    "vocab_size": len(vocabulary()),
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 512,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
    "initializer_range": 0.1,
}
TINY = {
    **MODEL,
    "hidden_size": 32,
    "intermediate_size": 64,
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "initializer_range": 0.02,  # BERT's
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """squad/v1.1 and squad/v2.0 in SQuAD's file names, and bert/ with vocab.txt and two model configs."""
    root = tmp_path_factory.mktemp("squad")
    write_squad(root / "squad" / "v2.0", "2.0", train=600, dev=100)
    write_squad(root / "squad" / "v1.1", "1.1", train=40, dev=20)
    (root / "bert").mkdir()
    write_vocab(root / "bert")
    for name, values in (("bert_config.json", MODEL), ("tiny_config.json", TINY)):
        (root / "bert" / name).write_text(json.dumps(dataclasses.asdict(BertConfig(**values))))
    return root


def flags(data, out, version="2.0", config="bert_config.json", *extra):
    squad = data / "squad" / f"v{version}"
    return [
        f"--train_file={squad / f'train-v{version}.json'}",
        f"--predict_file={squad / f'dev-v{version}.json'}",
        f"--vocab_file={data / 'bert' / 'vocab.txt'}",
        f"--bert_config_file={data / 'bert' / config}",
        f"--version_2_with_negative={version == '2.0'}",
        "--max_seq_length=48",
        "--doc_stride=16",
        "--max_query_length=16",
        "--train_batch_size=32",
        "--learning_rate=6e-4",
        "--log_step_count_steps=1000",
        "--save_checkpoints_secs=0",
        f"--output_dir={out}",
        *extra,
    ]


def read(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def v2_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("v2") / "run"
    # batch 16 for 1.5 epochs (212 steps); the demo's half of the steps in warm-up (Google's AdamW takes steps
    # several times larger than bias-corrected Adam's at first)
    assert (
        main(
            flags(
                data,
                out,
                "2.0",
                "bert_config.json",
                "--do_train",
                "--do_predict",
                "--num_train_epochs=1.5",
                "--train_batch_size=16",
                "--warmup_proportion=0.5",
            )
        )
        == 0
    )
    return out


@pytest.mark.slow
def test_v2_learns_well_beyond_no_answer_everywhere(v2_run):
    results = read(v2_run / "eval_results.json")
    assert results["total"] == results["questions"] == 300 and results["windows"] > 300  # long contexts split
    no_answer_everywhere = 100 * results["NoAns_total"] / results["total"]
    assert 20 < no_answer_everywhere < 45
    assert results["exact"] >= 90 and results["f1"] >= 90, results
    assert results["HasAns_exact"] >= 85 and results["NoAns_exact"] >= 85
    assert {"best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"} <= set(results)
    lines = (v2_run / "eval_results.txt").read_text().splitlines()
    assert f"exact = {results['exact']}" in lines
    record = read(v2_run / "bertbench_run.json")
    assert record["runner"] == "run_squad" and record["args"]["doc_stride"] == 16


@pytest.mark.slow
def test_prediction_files_cover_every_question(v2_run, data):
    dev = read(data / "squad" / "v2.0" / "dev-v2.0.json")
    ids = {qa["id"] for article in dev["data"] for paragraph in article["paragraphs"] for qa in paragraph["qas"]}
    predictions, nbest, odds = (
        read(v2_run / name) for name in ("predictions.json", "nbest_predictions.json", "null_odds.json")
    )
    assert set(predictions) == set(nbest) == set(odds) == ids
    contexts = {
        qa["id"]: paragraph["context"]
        for article in dev["data"]
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }
    for question_id, answer in predictions.items():
        assert answer == "" or answer in contexts[question_id]  # text of the context itself
        entries = nbest[question_id]
        assert sum(entry["probability"] for entry in entries) == pytest.approx(1.0)
        assert len(entries) <= 21 and "" in [entry["text"] for entry in entries]
        assert (answer == "") == (odds[question_id] > 0.0)  # --null_score_diff_threshold 0.0


def test_eval_results_match_the_scoring_command(v2_run, data, capsys):
    dev = data / "squad" / "v2.0" / "dev-v2.0.json"
    assert (
        cli.main(
            [
                "evaluate-squad",
                str(dev),
                str(v2_run / "predictions.json"),
                "-n",
                str(v2_run / "null_odds.json"),
                "-t",
                "0.0",
            ]
        )
        == 0
    )
    figures = json.loads(capsys.readouterr().out)
    results = read(v2_run / "eval_results.json")
    assert figures == {key: results[key] for key in figures}
    assert evaluate_squad.main([str(dev), str(v2_run / "predictions.json")]) == 0  # without the odds: same answers
    assert json.loads(capsys.readouterr().out)["exact"] == results["exact"]


def test_predict_again_from_the_run_directory(v2_run, tmp_path):
    before = (v2_run / "predictions.json").read_text()
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("bertbench_run.json", *(os.path.basename(path) for _, path in list_checkpoints(v2_run))):
        (copy / name).write_bytes((v2_run / name).read_bytes())
    assert main(["--do_predict", f"--output_dir={copy}"]) == 0  # every other flag from the record
    assert (copy / "predictions.json").read_text() == before


@pytest.fixture(scope="module")
def modeling_runs(data, tmp_path_factory):
    """A short train and predict run on the v1.1 files with each modeling module (recompute: selective)."""
    runs = {}
    for modeling in MODELINGS:
        out = tmp_path_factory.mktemp(modeling) / "run"
        assert (
            main(
                flags(
                    data,
                    out,
                    "1.1",
                    "tiny_config.json",
                    "--do_train",
                    "--do_predict",
                    "--num_train_epochs=1",
                    f"--modeling={modeling}",
                    "--recompute-policy=selective",
                )
            )
            == 0
        )
        runs[modeling] = out
    return runs


@pytest.mark.parametrize("modeling", MODELINGS)
def test_each_modeling_module_trains_and_predicts(modeling_runs, modeling):
    out = modeling_runs[modeling]
    train = read(out / "train_results.json")
    assert train["modeling"] == modeling and train["recompute_policy"] == (
        "selective" if modeling == "recompute" else None
    )
    results = read(out / "eval_results.json")
    assert results["global_step"] == train["global_step"] > 0 and results["questions"] == 60


def test_v1_writes_no_null_odds_and_scores_v1_figures(modeling_runs):
    out = modeling_runs["baseline"]  # the v1.1 files, trained and predicted with the default modeling
    assert not (out / "null_odds.json").exists()
    results = read(out / "eval_results.json")
    assert {"exact_match", "f1", "global_step"} <= set(results) and "HasAns_exact" not in results
    assert all(answer for answer in read(out / "predictions.json").values())  # v1.1 always answers


def test_recompute_module_ends_with_the_baselines_weights(modeling_runs):
    weights = {}
    for modeling, out in modeling_runs.items():
        ((_, path),) = list_checkpoints(out)
        weights[modeling] = load_checkpoint(path)["model"]
    assert all(torch.equal(weights["baseline"][name], weights["recompute"][name]) for name in weights["baseline"])
    predictions = {modeling: (out / "predictions.json").read_text() for modeling, out in modeling_runs.items()}
    assert predictions["baseline"] == predictions["recompute"]


def test_google_defaults_and_squad_subcommand(data, tmp_path):
    command, _ = parse_config(
        SPEC,
        [
            f"--output_dir={tmp_path}",
            "--vocab_file=v",
            "--bert_config_file=c",
            "--do_predict",
            "--predict_file=p",
            "--do_train",
            "--train_file=t",
        ],
    )
    settings = command.task
    assert (
        settings.max_seq_length,
        settings.doc_stride,
        settings.max_query_length,
        settings.n_best_size,
        settings.max_answer_length,
        settings.version_2_with_negative,
        settings.null_score_diff_threshold,
        command.train.learning_rate,
        settings.predict_batch_size,
    ) == (384, 128, 64, 20, 30, False, 0.0, 5e-5, 8)
    out = tmp_path / "run"
    assert (
        cli.main(
            [
                "squad",
                *flags(
                    data,
                    out,
                    "1.1",
                    "tiny_config.json",
                    "--do_train",
                    "--do_predict",
                    "--num_train_epochs=1",
                    "--max_train_samples=32",
                ),
            ]
        )
        == 0
    )
    assert read(out / "train_results.json")["global_step"] == 1  # 32 questions make at least 32 windows


def bad_file(tmp_path, mutate):
    """A copy of a small valid training file with one question changed by mutate(paragraph, qa)."""
    data = {
        "version": "1.1",
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": "the calm owl sees the sad fox .",
                        "qas": [
                            {
                                "id": "good-1",
                                "question": "where is the calm owl ?",
                                "answers": [{"text": "calm owl", "answer_start": 4}],
                            },
                            {
                                "id": "bad-2",
                                "question": "where is the sad fox ?",
                                "answers": [{"text": "sad fox", "answer_start": 22}],
                            },
                        ],
                    }
                ],
            }
        ],
    }
    paragraph = data["data"][0]["paragraphs"][0]
    mutate(paragraph, paragraph["qas"][1])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda paragraph, qa: qa["answers"][0].update(answer_start=21),
            "question bad-2: answer_start 21 points at ' sad fo' in the context, not at the answer text 'sad fox'",
        ),
        (lambda paragraph, qa: paragraph.update(context=" "), "the paragraph of question good-1: empty context"),
        (lambda paragraph, qa: qa.pop("question"), "question bad-2 has no 'question' field"),
        (lambda paragraph, qa: qa["answers"][0].pop("text"), "an answer of question bad-2 has no 'text' field"),
        (
            lambda paragraph, qa: qa.update(is_impossible=True, answers=[]),
            "question bad-2: is unanswerable (is_impossible), a SQuAD v2.0 question; train on this file with "
            "--version_2_with_negative",
        ),
    ],
)
def test_bad_training_file_names_the_question_and_leaves_results_alone(data, tmp_path, mutate, message, error_line):
    path = bad_file(tmp_path, mutate)
    out = tmp_path / "run"
    out.mkdir()
    (out / "predictions.json").write_text('{"earlier": "results"}')
    assert main(flags(data, out, "1.1", "tiny_config.json", "--do_train", "--do_predict", f"--train_file={path}")) == 2
    assert error_line() == f"run_squad: error: {path}: {message}"
    assert os.listdir(out) == ["predictions.json"]
    assert (out / "predictions.json").read_text() == '{"earlier": "results"}'


def test_bad_predict_file_fails_before_training_and_overwrites_nothing(v2_run, data, tmp_path, capsys, error_line):
    broken = tmp_path / "dev.json"
    broken.write_text('{"version": "v2.0", "data": [{"paragraphs": [')
    before = snapshot(v2_run)
    assert main(["--do_predict", f"--predict_file={broken}", f"--output_dir={v2_run}"]) == 2
    assert error_line().startswith(f"run_squad: error: {broken}: not JSON")
    assert snapshot(v2_run) == before
    out = tmp_path / "fresh"
    assert (
        main(flags(data, out, "1.1", "tiny_config.json", "--do_train", "--do_predict", f"--predict_file={broken}")) == 2
    )
    capsys.readouterr()
    assert not out.exists()  # no record, no checkpoint: nothing was trained


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--do_train", "--train_file="], "--do_train needs --train_file"),
        (["--do_predict", "--predict_file="], "--do_predict needs --predict_file"),
        (["--nodo_train"], "at least one of --do_train or --do_predict"),
        (["--do_train", "--doc_stride=0"], "--doc_stride must be positive, got 0"),
        (["--do_train", "--max_query_length=45"], "--max_seq_length 48 must exceed --max_query_length 45 + 3"),
        (["--do_train", "--max_seq_length=128"], "max_position_embeddings is 64"),
    ],
)
def test_bad_flags(data, tmp_path, extra, message, error_line):
    assert main(flags(data, tmp_path / "run", "1.1", "tiny_config.json", *extra)) == 2
    line = error_line()
    assert line.startswith("run_squad: error: ") and message in line


def test_v2_file_without_the_flag_says_which_flag(data, tmp_path, error_line):
    arguments = flags(
        data, tmp_path / "run", "2.0", "tiny_config.json", "--do_train", "--version_2_with_negative=false"
    )
    assert main(arguments) == 2
    assert "train on this file with --version_2_with_negative" in error_line()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_bf16_trains_and_predicts(data, tmp_path, device):
    out = tmp_path / "run"
    assert (
        main(
            flags(
                data,
                out,
                "2.0",
                "tiny_config.json",
                "--do_train",
                "--do_predict",
                "--num_train_epochs=1",
                "--max_train_samples=64",
                "--precision=bf16",
                f"--device={device}",
            )
        )
        == 0
    )
    train = read(out / "train_results.json")
    assert train["precision"] == "bf16" and train["device"].startswith(device)
    assert len(read(out / "null_odds.json")) == read(out / "eval_results.json")["total"] == 300
