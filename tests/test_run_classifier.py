"""run_classifier end to end on the built-in task written in GLUE's real layouts: Google's flags, training that
learns, results files, resuming after SIGKILL/SIGTERM, and one-line errors for bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import TINY_BERT, write_bert_dir

from bertbench import cli
from bertbench.model.factory import MODELINGS
from bertbench.runners.classifier import SPEC, main
from bertbench.runners.config import parse_config
from bertbench.tasks.synthetic import vocabulary, write_glue_task
from bertbench.training.checkpoint import list_checkpoints, load_checkpoint

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "tf1_tiny")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """glue/<task>/ for MRPC, MNLI and STS-B, and bert/ with the task's vocab.txt and a tiny bert_config.json."""
    root = tmp_path_factory.mktemp("classifier")
    for task in ("MRPC", "MNLI", "STS-B"):
        write_glue_task(root / "glue", task, train=512, dev=96, test=40)
    write_bert_dir(root / "bert")
    return root


def flags(data, out, task="MRPC", *extra):
    return [
        f"--task_name={task}",
        f"--data_dir={data / 'glue' / task}",
        f"--vocab_file={data / 'bert' / 'vocab.txt'}",
        f"--bert_config_file={data / 'bert' / 'bert_config.json'}",
        "--max_seq_length=32",
        "--train_batch_size=16",
        "--learning_rate=1e-3",
        "--log_step_count_steps=1000",
        f"--output_dir={out}",
    ] + list(extra)


def read_results(out):
    with open(out / "eval_results.json") as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def mrpc_run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("mrpc") / "run"
    assert main(flags(data, out, "MRPC", "--do_train=true", "--do_eval=true", "--do_predict=true")) == 0
    return out


def test_mrpc_learns_and_writes_every_result(mrpc_run):
    results = read_results(mrpc_run)
    assert results["task"] == "MRPC" and results["global_step"] == 96  # int(512 / 16 * 3)
    assert results["dev_acc"] >= 0.9 and {"dev_f1", "dev_acc_and_f1", "dev_loss"} <= set(results)
    lines = (mrpc_run / "eval_results.txt").read_text().splitlines()
    assert "dev_acc = " + str(results["dev_acc"]) in lines and lines == sorted(lines)
    submission = (mrpc_run / "MRPC.tsv").read_text().splitlines()
    assert submission[0] == "index\tprediction" and len(submission) == 41
    assert {line.split("\t")[1] for line in submission[1:]} <= {"0", "1"}
    assert len((mrpc_run / "test_results.tsv").read_text().splitlines()) == 40  # Google's file, beside it
    assert {"eval_accuracy = " + str(results["dev_acc"]), "global_step = 96"} <= set(lines)  # Google's keys too
    train = json.loads((mrpc_run / "train_results.json").read_text())
    assert train["sentences"] == 96 * 16 and train["steady_sentences_per_second"] > 0
    assert train["sentences_per_20_minutes"] == pytest.approx(train["steady_sentences_per_second"] * 1200)
    record = json.loads((mrpc_run / "bertbench_run.json").read_text())
    assert record["runner"] == "run_classifier" and record["args"]["task_name"] == "MRPC"
    assert record["bert_config"]["hidden_size"] == 32 and "output_dir" not in record["args"]
    # the update rule, in the record (by flag) and the results: Google's AdamW by default
    assert (record["args"]["optimizer_type"], record["args"]["adam_bias_correction"]) == ("adam", False)
    assert (train["optimizer"], train["adam_bias_correction"]) == ("adamw", False)
    assert [step for step, _ in list_checkpoints(mrpc_run)] == [96]


def test_eval_only_takes_the_recorded_flags(mrpc_run, capsys):
    before = read_results(mrpc_run)
    os.remove(mrpc_run / "eval_results.json")
    assert main(["--do_eval", f"--output_dir={mrpc_run}", "--eval_batch_size=64"]) == 0
    assert read_results(mrpc_run)["dev_acc"] == before["dev_acc"]
    assert "dev_acc = " in capsys.readouterr().out


def test_conflicting_flag_is_refused_and_nothing_changes(mrpc_run, error_line):
    record = (mrpc_run / "bertbench_run.json").read_bytes()
    checkpoint = list_checkpoints(mrpc_run)[-1][1]
    weights = open(checkpoint, "rb").read()
    assert main(["--do_train", f"--output_dir={mrpc_run}", "--learning_rate=3e-5"]) == 2
    line = error_line()
    assert "bertbench_run.json" in line and "--learning_rate=0.001" in line and "3e-05" in line
    assert (mrpc_run / "bertbench_run.json").read_bytes() == record and open(checkpoint, "rb").read() == weights


def test_mnli_scores_both_dev_sets_and_writes_both_submissions(data, tmp_path):
    out = tmp_path / "mnli"
    assert main(flags(data, out, "MNLI", "--do_train", "--do_eval", "--do_predict", "--num_train_epochs=2")) == 0
    results = read_results(out)
    assert results["dev_matched_acc"] > 0.6 and results["dev_mismatched_acc"] > 0.6
    assert results["dev_matched_examples"] == results["dev_mismatched_examples"] == 96
    for name in ("MNLI-m.tsv", "MNLI-mm.tsv"):
        rows = (out / name).read_text().splitlines()[1:]
        assert len(rows) == 40 and {row.split("\t")[1] for row in rows} <= {"contradiction", "entailment", "neutral"}

    # AX, the diagnostic, is predicted by an MNLI model: here the run directory just trained.
    ax = data / "glue" / "AX"
    ax.mkdir(exist_ok=True)
    (ax / "diagnostic.tsv").write_text("index\tsentence1\tsentence2\n0\tthe happy cat sees .\tthe sad dog sees .\n")
    assert main(flags(data, tmp_path / "ax", "AX", "--do_predict", f"--init_checkpoint={out}")) == 0
    assert (tmp_path / "ax" / "AX.tsv").read_text().splitlines()[1].split("\t")[0] == "0"


@pytest.mark.slow
def test_stsb_regression_correlates(data, tmp_path):
    out = tmp_path / "stsb"
    # 4 epochs (128 steps): Pearson and Spearman 0.95-0.99 over seeds 1, 3, 7 and 42 (0.88 after 2 epochs, about 0
    # untrained)
    assert main(flags(data, out, "STS-B", "--do_train", "--do_eval", "--num_train_epochs=4")) == 0
    results = read_results(out)
    assert results["dev_pearson"] > 0.8 and results["dev_spearmanr"] > 0.8


@pytest.fixture(scope="module")
def modeling_runs(data, tmp_path_factory):
    """A short train, eval and predict run with each modeling module (recompute: the full policy), and the
    baseline on the padded path (--unpad=false)."""
    runs = {}
    for name, extra in [*((modeling, ()) for modeling in MODELINGS), ("padded", ("--unpad=false",))]:
        out = tmp_path_factory.mktemp(name) / "run"
        modeling = "baseline" if name == "padded" else name
        assert (
            main(
                flags(
                    data,
                    out,
                    "MRPC",
                    "--do_train",
                    "--do_eval",
                    "--do_predict",
                    "--num_train_epochs=0.5",
                    f"--modeling={modeling}",
                    "--recompute-policy=full",
                    *extra,
                )
            )
            == 0
        )
        runs[name] = out
    return runs


@pytest.mark.parametrize("modeling", MODELINGS)
def test_each_modeling_module_trains_evaluates_and_predicts(modeling_runs, modeling):
    out = modeling_runs[modeling]
    train = json.loads((out / "train_results.json").read_text())
    assert train["modeling"] == modeling and train["recompute_policy"] == ("full" if modeling == "recompute" else None)
    assert read_results(out)["global_step"] == train["global_step"] == 16  # int(512 / 16 * 0.5)
    assert len((out / "MRPC.tsv").read_text().splitlines()) == 41


def test_train_results_name_the_path_and_count_real_tokens(modeling_runs):
    """The built-in task's pairs are shorter than --max_seq_length=32: its batches run unpadded by default, padded
    with --unpad=false, and both runs report the same padding share and real tokens per sentence, the path's reason
    and why no CUDA graphs ran."""
    unpadded, padded = (
        json.loads((modeling_runs[name] / "train_results.json").read_text()) for name in ("baseline", "padded")
    )
    assert (unpadded["path"], padded["path"]) == ("unpadded/auto", "padded")
    assert unpadded["path_reason"].startswith("the fastest measured on a CPU: per-sequence attention")
    assert padded["path_reason"].startswith("--unpad=false")
    assert unpadded["execution"] == {
        "cuda_graphs": None,
        "cuda_graphs_off": "CUDA graphs need a CUDA GPU (this is cpu)",
    }
    assert unpadded["padding_fraction"] == padded["padding_fraction"] and 0.2 < padded["padding_fraction"] < 0.8
    for train in (unpadded, padded):
        real_per_sentence = train["real_tokens_per_second"] / train["sentences_per_second"]
        assert real_per_sentence == pytest.approx((1 - train["padding_fraction"]) * 32, rel=1e-9)
        assert train["steady_real_tokens_per_second"] > 0
    assert read_results(modeling_runs["padded"])["dev_acc"] == pytest.approx(
        read_results(modeling_runs["baseline"])["dev_acc"], abs=0.05
    )


def test_a_resumed_training_keeps_its_path(modeling_runs, error_line):
    out = modeling_runs["padded"]
    before = sorted(os.listdir(out))
    assert main(["--do_train", "--unpad=true", f"--output_dir={out}"]) == 2
    assert "this run was made with --unpad=False" in error_line()
    assert sorted(os.listdir(out)) == before


def test_recompute_module_ends_with_the_baselines_weights(modeling_runs):
    final = {
        modeling: load_checkpoint(list_checkpoints(out)[-1][1])["model"]
        for modeling, out in modeling_runs.items()
        if modeling in MODELINGS
    }
    for name, tensor in final["baseline"].items():
        torch.testing.assert_close(final["recompute"][name], tensor, rtol=1e-5, atol=1e-6)


def test_time_budget_stops_training_then_evaluates(data, tmp_path, capsys):
    out = tmp_path / "budget"
    # 200 epochs are 6,400 steps: far more than half a second holds on any machine.
    assert (
        main(flags(data, out, "MRPC", "--do_train", "--do_eval", "--num_train_epochs=200", "--max_train_seconds=0.5"))
        == 0
    )
    train = json.loads((out / "train_results.json").read_text())
    assert train["budget_exhausted"] and train["interrupted_by"] is None and 0 < train["global_step"] < 6400
    results = read_results(out)  # evaluation ran, on the model of the step the budget stopped at
    assert results["global_step"] == train["global_step"] and 0 <= results["dev_acc"] <= 1
    assert [step for step, _ in list_checkpoints(out)] == [train["global_step"]]
    assert "max_train_seconds" not in json.loads((out / "bertbench_run.json").read_text())["args"]
    assert "time budget of 0.5 s reached at step" in capsys.readouterr().out


def test_absl_boolean_spellings_and_nvidias_names(tmp_path):
    given = [
        "--output_dir",
        str(tmp_path),
        "--vocab_file=v",
        "--bert_config_file=c",
        "--task_name=MRPC",
        "--data_dir=d",
    ]
    command, _ = parse_config(
        SPEC, given + ["--do_train", "--do_eval=false", "--nodo_lower_case", "--amp", "--horovod"]
    )
    settings = command.task
    assert settings.do_train and not settings.do_eval and not settings.do_lower_case and settings.horovod
    assert command.train.precision == "fp16" and command.run.save_checkpoints_secs == 1200
    command, _ = parse_config(SPEC, given + ["--do_eval", "--precision=bf16", "--no_sync_gradients"])
    assert command.train is None and not command.task.do_train  # an evaluation: nothing to train
    assert command.args["precision"] == "bf16" and not command.args["sync_gradients"]  # recorded as given


def test_init_from_a_tf1_checkpoint(data, tmp_path, capsys):
    """Google's own files: the TF1 fixture's vocab, config and checkpoint, on the built-in MRPC files."""
    out = tmp_path / "tf1"
    assert (
        main(
            flags(data, out, "MRPC", "--do_train", "--do_eval", "--num_train_epochs=0.25")
            + [
                f"--vocab_file={FIXTURES}/vocab.txt",
                f"--bert_config_file={FIXTURES}/bert_config.json",
                f"--init_checkpoint={FIXTURES}/bert_model.ckpt",
            ]
        )
        == 0
    )
    assert "loaded" in capsys.readouterr().out and read_results(out)["global_step"] == 8


def test_init_from_an_hf_directory(data, tmp_path, capsys):
    from bertbench.model.config import BertConfig
    from bertbench.model.factory import build_model
    from bertbench.weights.hf import save_hf_directory

    config = BertConfig.from_json_file(data / "bert" / "bert_config.json")
    torch.manual_seed(1)
    pretrained = build_model("pretraining", config)
    save_hf_directory(pretrained, config, tmp_path / "hf")
    out = tmp_path / "out"
    assert main(flags(data, out, "MRPC", "--do_eval", f"--init_checkpoint={tmp_path / 'hf'}")) == 0
    assert (
        f"warm start from {tmp_path / 'hf'} (HF directory): loaded 37 of 37 encoder weights and bert.pooler (2 weights); "
        "new, from random values: classifier (2 weights); not used: cls.predictions, cls.seq_relationship (7 weights)"
    ) in capsys.readouterr().out
    assert read_results(out)["global_step"] == 0 and not list_checkpoints(out)


def test_classify_subcommand(data, tmp_path):
    assert cli.main(["classify"] + flags(data, tmp_path / "cli", "MRPC", "--do_train", "--num_train_epochs=0.25")) == 0
    assert list_checkpoints(tmp_path / "cli")


# ---- bad input: one line naming the file, exit 2, nothing overwritten ---------------------------------------------


def test_missing_glue_file(data, tmp_path, error_line):
    (tmp_path / "empty").mkdir()
    assert main(flags(data, tmp_path / "out", "MRPC", "--do_train") + [f"--data_dir={tmp_path / 'empty'}"]) == 2
    assert "empty/train.tsv: no such file" in error_line()


def test_unknown_task(data, tmp_path, error_line):
    assert main(flags(data, tmp_path / "out", "MRPCC", "--do_train")) == 2
    assert "unknown GLUE task 'MRPCC'" in error_line()


def test_label_outside_the_tasks_labels(data, tmp_path, error_line):
    task = tmp_path / "MRPC"
    shutil.copytree(data / "glue" / "MRPC", task)
    lines = (task / "train.tsv").read_text().splitlines()
    lines[3] = "2" + lines[3][1:]
    (task / "train.tsv").write_text("\n".join(lines) + "\n")
    assert main(flags(data, tmp_path / "out", "MRPC", "--do_train") + [f"--data_dir={task}"]) == 2
    assert "train.tsv:4: unknown label '2' for MRPC" in error_line()


def test_vocab_larger_than_the_embeddings(data, tmp_path, error_line):
    config = dict(TINY_BERT, vocab_size=20)
    (tmp_path / "bert_config.json").write_text(json.dumps(config))
    assert (
        main(
            flags(data, tmp_path / "out", "MRPC", "--do_train")
            + [f"--bert_config_file={tmp_path / 'bert_config.json'}"]
        )
        == 2
    )
    line = error_line()
    assert f"vocab.txt: {len(vocabulary())} tokens" in line and "vocab_size 20" in line


def test_run_directory_of_another_model(mrpc_run, data, tmp_path, error_line):
    (tmp_path / "bert_config.json").write_text(json.dumps(dict(TINY_BERT, hidden_size=64, intermediate_size=128)))
    record = (mrpc_run / "bertbench_run.json").read_bytes()
    assert main(["--do_train", f"--output_dir={mrpc_run}", f"--bert_config_file={tmp_path / 'bert_config.json'}"]) == 2
    line = error_line()
    assert "bertbench_run.json" in line and "hidden_size=32" in line
    assert (mrpc_run / "bertbench_run.json").read_bytes() == record


def test_corrupt_checkpoint(data, tmp_path, error_line):
    out = tmp_path / "out"
    assert main(flags(data, out, "MRPC", "--do_train", "--num_train_epochs=0.25")) == 0
    path = list_checkpoints(out)[-1][1]
    with open(path, "r+b") as handle:
        handle.truncate(2000)
    damaged = open(path, "rb").read()
    assert main(flags(data, out, "MRPC", "--do_train", "--num_train_epochs=0.25")) == 2
    assert os.path.basename(path) in error_line()
    assert open(path, "rb").read() == damaged and len(list_checkpoints(out)) == 1


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--max_seq_length=128"], "max_position_embeddings is 64"),
        (["--init_checkpoint=/nonexistent/bert_model.ckpt"], "/nonexistent/bert_model.ckpt"),
        (["--do_train=false"], "at least one of --do_train, --do_eval or --do_predict"),
        (
            ["--precision=bf16", "--amp"],
            "--precision=bf16 and --amp=true contradict each other: precision bf16 or fp16",
        ),
        (["--num_train_epochs=0.01"], "make no full step"),
    ],
)
def test_bad_flags(data, tmp_path, extra, message, error_line):
    assert main(flags(data, tmp_path / "out", "MRPC", "--do_train") + extra) == 2
    assert message in error_line()
    assert not list_checkpoints(tmp_path / "out")


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--train_batch_size=0", "0"),
        ("--max_train_samples=-5", "-5"),
        ("--num_train_epochs=0", "0.0"),
        ("--max_train_seconds=0", "0.0"),
    ],
)
def test_non_positive_sizes_are_usage_errors(data, tmp_path, error_line, flag, value):
    # One line naming the flag (no usage block), exit status 2, nothing written.
    assert main(flags(data, tmp_path / "out", "MRPC", "--do_train", flag)) == 2
    assert error_line() == f"run_classifier: error: {flag.split('=')[0]} must be positive, got {value}"
    assert not (tmp_path / "out").exists()


def test_eval_with_nothing_to_evaluate(data, tmp_path, error_line):
    assert main(flags(data, tmp_path / "out", "MRPC", "--do_eval")) == 2
    assert "no checkpoint to evaluate and no --init_checkpoint" in error_line()


# ---- real processes: SIGKILL and SIGTERM ---------------------------------------------------------------------------

STEPS = 96  # mrpc_run's training: 3 epochs of 32 batches


def arguments(data, out):
    """mrpc_run's training (the same weights at every step), saved every 10 steps."""
    return flags(data, out, "MRPC", "--do_train", "--save_checkpoints_steps=10", "--log_step_count_steps=10")


def command(data, out):
    return [sys.executable, "-m", "bertbench.runners.classifier", *arguments(data, out)]


def start_and_wait_for_a_checkpoint(data, out, after_step=0):
    """Start the command and wait for a checkpoint past `after_step`."""
    process = subprocess.Popen(command(data, out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not list_checkpoints(out) or list_checkpoints(out)[-1][0] <= after_step:
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return process


def final_weights(out):
    return load_checkpoint(list_checkpoints(out)[-1][1])["model"]


def assert_same_weights(first, second):
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.slow
def test_sigkill_then_sigterm_then_the_same_command_ends_with_the_uninterrupted_weights(data, tmp_path, mrpc_run):
    """One run, stopped twice as clusters stop jobs: SIGKILL (a node lost, an OOM killer) leaves the last
    checkpoint; SIGTERM (scancel, qdel, a time limit) saves at the step boundary and exits 143. Each time the same
    command resumes, and the run ends with the weights of a run never stopped: mrpc_run's (the same training, in this
    process: one thread, as the tests' subprocesses have)."""
    out = tmp_path / "stopped"
    process = start_and_wait_for_a_checkpoint(data, out)
    process.kill()
    assert process.wait() == -signal.SIGKILL
    ((killed_at, _),) = list_checkpoints(out)
    assert 0 < killed_at < STEPS

    process = start_and_wait_for_a_checkpoint(data, out, after_step=killed_at)
    process.send_signal(signal.SIGTERM)
    output = process.communicate()[0]
    assert process.returncode == 128 + signal.SIGTERM, output
    assert f"resumed from {out}/ckpt-{killed_at:09d}.pt (step {killed_at}" in output
    assert "stopped by SIGTERM at step" in output and "Traceback" not in output
    train = json.loads((out / "train_results.json").read_text())
    assert train["interrupted_by"] == "SIGTERM" and killed_at < train["global_step"] == list_checkpoints(out)[-1][0]
    assert train["global_step"] < STEPS

    assert main(arguments(data, out)) == 0
    assert_same_weights(final_weights(out), final_weights(mrpc_run))
    steps = [json.loads(line)["step"] for line in open(out / "metrics.jsonl")]
    assert steps == sorted(set(steps))  # the killed run's steps after its checkpoint are not logged twice


def test_a_malformed_flag_is_one_line_with_status_2(data, tmp_path, error_line):
    assert main(flags(data, tmp_path / "out", "MRPC", "--do_train", "--train_batch_size=many")) == 2
    assert error_line() == "run_classifier: error: argument --train_batch_size: invalid int value: 'many'"
    assert not (tmp_path / "out").exists()
