"""NVIDIA's PyTorch BERT and Google's BERT commands, as their scripts and READMEs spell them, run here as they are,
on tiny data, and write the files their users look for: NVIDIA's dllogger summary (--json-summary), Google's
test_results.tsv and eval_results.txt keys. Their flags that mean nothing here are accepted with a note saying why;
a value that cannot be honoured (--use_tpu=true) is one line, exit status 2, nothing written."""

import json
import os

import pytest
import torch
from helpers import runner_command

from bertbench.runners import classifier as run_classifier
from bertbench.runners import pretraining as run_pretraining
from bertbench.runners import squad as run_squad
from bertbench.runners.config import parse_config
from bertbench.tasks import create_pretraining_data


def dllogger_records(path):
    """The records of a dllogger JSON-lines file, read as NVIDIA's tooling reads them: `DLLL ` + one JSON object per
    line."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            assert line.startswith("DLLL "), line
            records.append(json.loads(line[len("DLLL ") :]))
    return records


def final_figures(path):
    """What dllogger's step=() records hold, merged: the final figures."""
    records = dllogger_records(path)
    for record in records:
        assert {"timestamp", "datetime", "elapsedtime", "type"} <= set(record)
        float(record["timestamp"]), float(record["elapsedtime"])
    assert any(record["type"] == "LOG" and record["step"] == "PARAMETER" for record in records)
    figures = {}
    for record in records:
        if record["type"] == "LOG" and record["step"] == []:
            figures.update(record["data"])
    return figures


def nvidia(runner_name, inputs, out, *extra):
    """NVIDIA's spelling of runner_command's inputs: --config_file, --gradient_accumulation_steps with the batch of
    one optimizer step, --fp16, and its flags that mean nothing here."""
    main, argv = runner_command(runner_name, inputs, out)
    argv = [
        f"--config_file={inputs / 'bert' / 'bert_config.json'}" if flag.startswith("--bert_config_file=") else flag
        for flag in argv
        if flag != "--train_batch_size=8"
    ]
    return main, [
        *argv,
        "--train_batch_size=16",
        "--gradient_accumulation_steps=2",
        "--fp16",
        "--local_rank=-1",
        "--seed=1",
        "--log_freq=1000",
        "--disable_progress_bar",
        *extra,
    ]


def test_nvidia_run_squad_command_runs_and_writes_its_summary(runner_inputs, tmp_path, capsys):
    squad = runner_inputs / "squad"
    main, argv = nvidia(
        "squad",
        runner_inputs,
        tmp_path / "run",
        "--bert_model=bert-large-uncased",
        "--do_predict",
        f"--predict_file={squad / 'dev-v1.1.json'}",
        "--do_eval",
        f"--eval_script={squad / 'evaluate-v1.1.py'}",
        "--skip_cache",
        f"--cache_dir={tmp_path}",
        "--disable-progress-bar",
        "--max_steps=-1.0",
        "--predict_batch_size=8",
        "--do_lower_case",
        "--json-summary",
        str(tmp_path / "results" / "dllogger.json"),
    )
    assert main(argv) == 0
    output = capsys.readouterr().out
    for flag in ("bert_model", "local_rank", "skip_cache", "cache_dir", "eval_script", "disable_progress_bar"):
        assert f"note: --{flag} is ignored: " in output
    assert "micro-batches of 8 sequences" in output
    train = json.loads((tmp_path / "run" / "train_results.json").read_text())
    assert (train["train_batch_size"], train["num_accumulation_steps"]) == (8, 2)  # fp16 runs as fp32 on a CPU
    assert json.loads((tmp_path / "run" / "bertbench_run.json").read_text())["args"]["amp"] is True
    assert (tmp_path / "run" / "predictions.json").is_file()
    figures = final_figures(tmp_path / "results" / "dllogger.json")
    assert set(figures) == {
        "e2e_train_time",
        "training_sequences_per_second",
        "final_loss",
        "e2e_inference_time",
        "inference_sequences_per_second",
        "exact_match",
        "F1",
    }
    scores = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert (figures["exact_match"], figures["F1"]) == (scores["exact_match"], scores["f1"])
    # a warm start that only predicts reports the step its checkpoint was saved at, not 0
    assert (
        main(
            [
                *argv[: argv.index("--do_train")],
                f"--output_dir={tmp_path / 'predict'}",
                f"--init_checkpoint={tmp_path / 'run'}",
                "--nodo_train",
                "--do_predict",
                f"--predict_file={squad / 'dev-v1.1.json'}",
            ]
        )
        == 0
    )
    predicted = json.loads((tmp_path / "predict" / "eval_results.json").read_text())
    assert predicted["global_step"] == scores["global_step"] > 0


def test_nvidia_run_pretraining_command_runs_and_writes_its_summary(runner_inputs, tmp_path, capsys):
    main, argv = nvidia(
        "pretraining",
        runner_inputs,
        tmp_path / "run",
        "--max_steps=2",
        "--num_steps_per_checkpoint=200",
        f"--vocab_file={runner_inputs / 'bert' / 'vocab.txt'}",
        "--allreduce_post_accumulation",
        "--allreduce_post_accumulation_fp16",
        "--resume_from_checkpoint",
        "--num_workers=4",
        "--phase1_end_step=7038",
        "--json-summary",
        str(tmp_path / "dllogger.json"),
    )
    argv.remove("--num_train_steps=2")
    assert main(argv) == 0
    output = capsys.readouterr().out
    assert (
        "note: --allreduce_post_accumulation is ignored: DDP all-reduces the gradients once per optimizer step"
        in output
    )
    figures = final_figures(tmp_path / "dllogger.json")
    assert set(figures) == {"e2e_train_time", "training_sequences_per_second", "final_loss", "raw_train_time"}
    assert figures["e2e_train_time"] >= figures["raw_train_time"] > 0


def test_nvidia_run_glue_and_google_run_classifier_write_what_their_users_read(runner_inputs, tmp_path, capsys):
    glue = runner_inputs / "glue" / "MRPC"
    main, argv = nvidia(
        "classifier",
        runner_inputs,
        tmp_path / "run",
        "--task_name=mrpc",
        "--do_eval",
        "--do_predict",
        "--eval_batch_size=8",
        "--bert_model",
        "bert-large-uncased",
        "--max_steps",
        "-1.0",
        "--json-summary",
        str(tmp_path / "dllogger.json"),
        # Google's TPU flags, asking for no TPU
        "--use_tpu=False",
        "--tpu_name=",
        "--num_tpu_cores=8",
        "--iterations_per_loop=1000",
    )
    assert main(argv) == 0
    assert "note: --use_tpu is ignored: there is no TPU here" in capsys.readouterr().out
    figures = final_figures(tmp_path / "dllogger.json")
    assert {"e2e_train_time", "training_sequences_per_second", "e2e_inference_time", "exact_match", "F1"} <= set(
        figures
    )
    lines = dict(line.split(" = ") for line in (tmp_path / "run" / "eval_results.txt").read_text().splitlines())
    assert {"eval_accuracy", "eval_loss", "global_step", "loss", "dev_acc"} <= set(lines)
    assert float(lines["eval_accuracy"]) == float(lines["dev_acc"]) == pytest.approx(figures["exact_match"])
    probabilities = (tmp_path / "run" / "test_results.tsv").read_text().splitlines()
    test_rows = (glue / "test.tsv").read_text().splitlines()[1:]
    assert len(probabilities) == len(test_rows)
    for row in probabilities:
        values = [float(value) for value in row.split("\t")]
        assert len(values) == 2 and sum(values) == pytest.approx(1, abs=1e-5)


def test_google_run_pretraining_do_eval_scores_the_input_file(runner_inputs, tmp_path, capsys):
    main, argv = runner_command(
        "pretraining",
        runner_inputs,
        tmp_path / "run",
        "--do_eval",
        "--use_tpu=false",
        "--max_eval_steps=2",
        "--eval_batch_size=8",
    )
    argv = [flag.replace("--input_dir=", "--input_file=") for flag in argv]
    assert main(argv) == 0
    assert "scores the training shards" in capsys.readouterr().out
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert results["eval_sequences"] == 16 and "masked_lm_accuracy" in results
    # Google's eval_results.txt keys, each with the value of its own definition (a mean over the masked tokens, a
    # mean over the sequences), and the total loss as the mean of the batches' losses.
    google = dict(line.split(" = ") for line in (tmp_path / "run" / "eval_results.txt").read_text().splitlines())
    google_keys = ("global_step", "loss", "masked_lm_accuracy", "masked_lm_loss", "next_sentence_accuracy")
    assert set(google_keys + ("next_sentence_loss",)) <= set(google)
    assert float(google["masked_lm_loss"]) > 0 and float(google["next_sentence_loss"]) > 0


def test_masked_lm_and_next_sentence_losses_are_googles_means():
    """A batch of two sequences, 3 and 1 masked tokens: the masked-LM loss is the mean over the 4 tokens (not over
    the sequences' means), the next-sentence loss the mean over the 2 sequences."""
    from types import SimpleNamespace

    import torch.nn.functional as F

    from bertbench.model.config import IGNORE_INDEX
    from bertbench.tasks.pretraining import accuracies, prediction_counts

    torch.manual_seed(0)
    mlm_logits, nsp_logits = torch.randn(2, 3, 10), torch.randn(2, 2)
    labels = torch.tensor([[1, 2, 3], [4, IGNORE_INDEX, IGNORE_INDEX]])
    batch = {"masked_lm_labels": labels, "next_sentence_labels": torch.tensor([0, 1])}
    scores = accuracies(prediction_counts(SimpleNamespace(mlm_logits=mlm_logits, nsp_logits=nsp_logits), batch))
    token_losses = [
        F.cross_entropy(mlm_logits[row, column][None], labels[row, column][None])
        for row, column in ((0, 0), (0, 1), (0, 2), (1, 0))
    ]
    assert scores["masked_lm_loss"] == pytest.approx(float(sum(token_losses) / 4), rel=1e-6)
    assert scores["next_sentence_loss"] == pytest.approx(
        float(F.cross_entropy(nsp_logits, torch.tensor([0, 1]))), rel=1e-6
    )


@pytest.mark.parametrize(
    "runner_name, extra, message",
    [
        ("classifier", ["--use_tpu=True"], "--use_tpu=true: bertbench runs on CPUs and CUDA GPUs, not TPUs"),
        ("pretraining", ["--steps_this_run=1"], "--steps_this_run=1: bertbench stops a run part-way by time"),
        (
            "squad",
            ["--train_batch_size=12", "--gradient_accumulation_steps=8"],
            "--train_batch_size 12 is the batch of one optimizer step",
        ),
    ],
)
def test_foreign_values_that_cannot_be_honoured_are_one_line(
    runner_inputs, tmp_path, error_line, runner_name, extra, message
):
    main, argv = runner_command(runner_name, runner_inputs, tmp_path / "run", *extra)
    assert main(argv) == 2
    assert message in error_line()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["tf_examples.tfrecord", "shard.TF_RECORD", "x.tfrecords"])
def test_create_pretraining_data_refuses_a_tfrecord_name(runner_inputs, tmp_path, error_line, name):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here.\nAnother one.\n\nA second document.\nIts end.\n")
    assert (
        create_pretraining_data.main(
            [
                f"--input_file={corpus}",
                f"--output_file={tmp_path / name}",
                f"--vocab_file={runner_inputs / 'bert' / 'vocab.txt'}",
            ]
        )
        == 2
    )
    line = error_line()
    assert f"--output_file={tmp_path / name}" in line and "HDF5" in line and ".hdf5" in line
    assert sorted(os.listdir(tmp_path)) == ["corpus.txt"]


def test_every_nvidia_flag_maps_to_a_field_or_a_note(tmp_path):
    """The flags of NVIDIA's run_squad.py, run_glue.py and run_pretraining.py that bertbench lacked: each sets the
    field it means or is ignored with a note (no file is read: the command is only parsed)."""
    common = [
        "--config_file=c.json",
        f"--output_dir={tmp_path}",
        "--do_train",
        "--fp16",
        "--seed=7",
        "--num_steps_per_checkpoint=50",
        "--log_freq=5",
        "--local_rank=0",
        "--json-summary=s.json",
        "--bert_model=bert-base-uncased",
    ]
    squad, _ = parse_config(
        run_squad.SPEC,
        [
            *common,
            "--vocab_file=v",
            "--train_file=t",
            "--do_predict",
            "--predict_file=p",
            "--do_eval",
            "--eval_script=e.py",
            "--max_steps=30",
            "--skip_cache",
            "--cache_dir=c",
        ],
    )
    glue, _ = parse_config(
        run_classifier.SPEC, [*common, "--vocab_file=v", "--task_name=sst-2", "--data_dir=d", "--max_steps", "-1.0"]
    )
    pretraining, _ = parse_config(
        run_pretraining.SPEC,
        [
            *common,
            "--vocab_file=v",
            "--input_dir=i",
            "--max_steps=10",
            "--phase2",
            "--init_checkpoint=p1",
            "--phase1_end_step=7038",
            "--resume_from_checkpoint",
            "--allreduce_post_accumulation",
            "--steps_this_run=-1",
            "--disable_progress_bar",
            "--train_batch_size=64",
            "--gradient_accumulation_steps=4",
        ],
    )
    for command in (squad, glue, pretraining):
        assert command.task.bert_config_file == "c.json" and command.task.json_summary == "s.json"
        assert (command.run.seed, command.run.save_checkpoints_steps, command.run.log_step_count_steps) == (7, 50, 5)
        assert command.train.precision == "fp16"
        assert {"--local_rank is ignored", "--bert_model is ignored"} <= {note.split(":")[0] for note in command.notes}
    assert squad.task.do_eval and squad.task.max_steps == 30 and glue.task.max_steps == -1
    assert (pretraining.task.num_train_steps, pretraining.task.train_batch_size) == (10, 16)
    assert pretraining.train.gradient_accumulation_steps == 4


def test_nvidias_remaining_switches_set_their_meaning_or_are_noted(tmp_path):
    """--no_cuda and --checkpoint_activations mean bertbench flags; the debugging, profiling and fusion switches of
    NVIDIA's scripts mean nothing here and are noted."""
    squad, _ = parse_config(
        run_squad.SPEC,
        [
            "--bert_config_file=c.json",
            f"--output_dir={tmp_path}",
            "--vocab_file=v",
            "--train_file=t",
            "--do_train",
            "--no_cuda",
            "--checkpoint_activations",
            "--server_ip=1.2.3.4",
            "--server_port=5678",
            "--profile",
            "--disable_jit_fusions",
        ],
    )
    assert squad.task.device == "cpu"
    assert (squad.model.modeling, squad.model.recompute_policy) == ("recompute", "full")
    noted = {note.split(" is ignored")[0] for note in squad.notes}
    assert {"--server_ip", "--server_port", "--profile", "--disable_jit_fusions"} <= noted
    pretraining, _ = parse_config(
        run_pretraining.SPEC,
        [
            "--bert_config_file=c.json",
            f"--output_dir={tmp_path / 'p'}",
            "--input_dir=i",
            "--do_train",
            "--num_train_steps=5",
            "--resume_phase2",
            "--no_dense_sequence_output",
        ],
    )
    assert {"--resume_phase2", "--no_dense_sequence_output"} <= {
        note.split(" is ignored")[0] for note in pretraining.notes
    }
