"""TensorBoard's event files as TensorBoard's own loader reads them: a classifier run's curve is metrics.jsonl step
for step and its evaluation is in eval/, run_pretraining's evaluations during training too; a stopped or killed and
resumed run draws each step once, as the uninterrupted run; an evaluation scored again replaces its point;
--report_to=none writes none, another of HF's integrations is refused in one line, and --logging_dir is one run's."""

import importlib.util
import shutil

import numpy as np
import pytest
import torch
from helpers import (
    Killed,
    KilledAt,
    SignalAfter,
    classifier_flags,
    flip_byte,
    read_json,
    scalars,
    snapshot,
    tiny_config,
    write_bert_dir,
    write_nvidia_shard,
)
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from bertbench.common.tf_wire import frame_record
from bertbench.model.factory import build_model
from bertbench.model.flops import train_flops
from bertbench.runners import classifier, pretraining
from bertbench.tasks.synthetic import write_glue_task
from bertbench.training import loop
from bertbench.training.batches import ShuffledBatches
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.training.events import EventLog, event, keep_events
from bertbench.training.metrics import read_log, read_metrics

# metrics.jsonl's fields and their tags (docs/training.md#tensorboard).
TAGS = {
    "loss": "loss",
    "steps_per_s": "global_step/sec",
    "seq_per_s": "examples/sec",
    "lr": "lr",
    "tokens_per_s": "tokens_per_s",
    "real_tokens_per_s": "real_tokens_per_s",
    "grad_norm": "grad_norm",
    "loss_scale": "loss_scale",
    "model_tflops_per_s": "model_tflops_per_s",
    "mfu": "mfu",
}


def float32(value) -> float:
    """What a value becomes as a summary's simple_value."""
    return float(np.float32(value))


def event_files(directory):
    return sorted(directory.rglob("events.out.tfevents.*"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("tensorboard")
    write_glue_task(root / "glue", "MRPC", train=64, dev=32, test=16)
    write_bert_dir(root / "bert")
    return root


@pytest.fixture(scope="module")
def finished_run(data, tmp_path_factory):
    """A classifier run trained 16 steps, logged every 2, and evaluated."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert (
        classifier.main(
            classifier_flags(data, out, "--do_train", "--do_eval", "--num_train_epochs=1", batch=4, log_every=2)
        )
        == 0
    )
    return out


def test_a_classifier_run_draws_metrics_jsonl_step_for_step_and_its_evaluation_in_eval(finished_run):
    records = read_metrics(finished_run)
    assert [record["step"] for record in records] == list(range(2, 17, 2))
    expected = {
        tag: [(record["step"], float32(record[key])) for record in records if record[key] is not None]
        for key, tag in TAGS.items()
    }
    assert scalars(finished_run) == {tag: points for tag, points in expected.items() if points}
    assert {"loss", "global_step/sec", "examples/sec", "lr", "grad_norm", "model_tflops_per_s"} <= set(expected)
    assert not expected["mfu"] and not expected["loss_scale"]  # no peak known on a CPU; fp32 scales no loss
    results = read_json(finished_run / "eval_results.json")
    assert results["global_step"] == 16
    figures = {key: value for key, value in results.items() if key not in ("task", "global_step")}
    assert {"dev_acc", "dev_f1", "dev_loss", "eval_accuracy", "eval_loss"} <= set(figures)
    assert scalars(finished_run / "eval") == {key: [(16, float32(value))] for key, value in figures.items()}


def test_an_evaluation_scored_again_replaces_its_point_and_leaves_the_curve(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    curve = {path.name: path.read_bytes() for path in event_files(run) if path.parent == run}
    for _ in range(2):  # eval.sh run twice
        assert classifier.main([f"--output_dir={run}", "--do_eval"]) == 0
    assert {tag: [step for step, _ in points] for tag, points in scalars(run / "eval").items()} == {
        tag: [16] for tag in scalars(finished_run / "eval")
    }
    assert {path.name: path.read_bytes() for path in event_files(run) if path.parent == run} == curve


def test_report_to_none_writes_no_event_file_and_the_run_keeps_it(data, tmp_path):
    out = tmp_path / "run"
    assert classifier.main(classifier_flags(data, out, "--do_train", "--do_eval", "--report_to=none")) == 0
    assert classifier.main([f"--output_dir={out}", "--do_eval"]) == 0  # the run's record says none
    assert (out / "metrics.jsonl").is_file() and (out / "eval_results.json").is_file()
    assert event_files(out) == []


def installed(module):
    return "installed" if importlib.util.find_spec(module) is not None else "not installed"


@pytest.mark.parametrize(
    "value, message",
    [
        *(
            (
                name,
                f"--report_to {name}: bertbench has no {name} integration ({module} is {installed(module)} here); "
                "every figure is in metrics.jsonl and eval_results.json, and --report_to tensorboard (the default) "
                "writes them as TensorBoard event files",
            )
            for name, module in (("wandb", "wandb"), ("mlflow", "mlflow"), ("flyte", "flytekit"))
        ),
        (
            "tensorbord",
            "--report_to 'tensorbord' is not a value: give tensorboard (the default: TensorBoard event files), all "
            "(every integration bertbench has: tensorboard) or none",
        ),
        ("none,tensorboard", "--report_to none,tensorboard: none means no integration, so it stands alone"),
    ],
)
def test_a_report_to_value_bertbench_has_not_is_one_line_and_changes_nothing(
    data, finished_run, tmp_path, error_line, value, message
):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(tmp_path)
    assert classifier.main(classifier_flags(data, tmp_path / "new", "--do_train", f"--report_to={value}")) == 2
    assert error_line() == f"run_classifier: error: {message}"
    assert classifier.main([f"--output_dir={run}", "--do_eval", f"--report_to={value}"]) == 2
    assert error_line() == f"run_classifier: error: {message}"
    assert snapshot(tmp_path) == before


def test_logging_dir_takes_the_events_and_a_new_run_may_not_share_it(data, tmp_path, error_line):
    board = tmp_path / "board"
    first = classifier_flags(
        data,
        tmp_path / "first",
        "--do_train",
        "--do_eval",
        "--num_train_epochs=2",
        f"--logging_dir={board}",
        log_every=4,
    )
    assert classifier.main(first) == 0
    assert [step for step, _ in scalars(board)["loss"]] == [4, 8]
    assert [step for step, _ in scalars(board / "eval")["dev_acc"]] == [8]
    assert event_files(tmp_path / "first") == []
    before = snapshot(tmp_path)
    assert classifier.main(classifier_flags(data, tmp_path / "second", "--do_train", f"--logging_dir={board}")) == 2
    assert error_line() == (
        f"run_classifier: error: --logging_dir {board}: holds the TensorBoard events of another run "
        f"({next(board.glob('events.out.tfevents.*'))}); give this run a logging directory of its own"
    )
    assert (
        classifier.main(classifier_flags(data, tmp_path / "second", f"--logging_dir={data / 'bert' / 'vocab.txt'}"))
        == 2
    )
    assert "is a file; give the directory of the event files" in error_line()
    assert snapshot(tmp_path) == before


# ---- resuming, in the loop --------------------------------------------------------------------------------------


def features(count=48, seq=12):
    """Full-length sequences (no padding) whose label is in their first token."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 100, (count, seq), generator=generator)
    return {
        "input_ids": input_ids,
        "token_type_ids": torch.zeros_like(input_ids),
        "attention_mask": torch.ones_like(input_ids),
        "labels": (input_ids[:, 1] > 50).long(),
    }


def estimator(model_dir, steps=20, **run):
    torch.manual_seed(0)
    model = build_model("classification", tiny_config(hidden_size=32, intermediate_size=64), num_labels=2)
    run_config = RunConfig(str(model_dir), **{"save_checkpoints_secs": None, "log_step_count_steps": 4, **run})
    return loop.Estimator(
        model, run_config, TrainConfig(num_train_steps=steps, learning_rate=1e-3), log=lambda line: None
    )


@pytest.mark.parametrize("stop", ["SIGTERM at step 7", "killed at step 14"])
def test_a_resumed_run_draws_each_step_once_as_the_uninterrupted_run(tmp_path, stop):
    """Log every 4 steps, save every 5: the stopped run logged step 7 (off the interval, the stop's own save), the
    killed one step 12 after its checkpoint of step 10, and a record cut short by the kill; the resumed run logs
    them again. A TensorBoard that read the files before the resume drops the stale points too."""
    run = {"save_checkpoints_steps": 5, "keep_checkpoint_max": 3}
    estimator(tmp_path / "whole", **run).train(ShuffledBatches(features(), 8, seed=0))
    interrupted = estimator(tmp_path / "part", **run)
    if stop.startswith("SIGTERM"):
        interrupted.model = SignalAfter(interrupted.model, call=7)
        assert interrupted.train(ShuffledBatches(features(), 8, seed=0)).global_step == 7
        assert [step for step, _ in scalars(tmp_path / "part")["loss"]] == [4, 7]
    else:
        interrupted.model = KilledAt(interrupted.model, call=14)
        with pytest.raises(Killed):
            interrupted.train(ShuffledBatches(features(), 8, seed=0))
        assert [step for step, _ in scalars(tmp_path / "part")["loss"]] == [4, 8, 12]
        (path,) = event_files(tmp_path / "part")
        with open(path, "ab") as handle:
            handle.write(frame_record(event(13, 0.0, {"loss": 1.0}))[:-9])  # an append the kill cut short
    watching = EventAccumulator(str(tmp_path / "part"))  # a TensorBoard open on the run before it resumes
    watching.Reload()
    resumed = estimator(tmp_path / "part", **run).train(ShuffledBatches(features(), 8, seed=0))
    watching.Reload()
    assert [each.step for each in watching.Scalars("loss")] == [4, 8, 12, 16, 20]
    assert resumed.resumed_from.endswith("7.pt" if "7" in stop else "10.pt")
    whole, part = scalars(tmp_path / "whole"), scalars(tmp_path / "part")
    assert part.keys() == whole.keys()
    assert all([step for step, _ in points] == [4, 8, 12, 16, 20] for points in part.values())
    assert all(part[tag] == whole[tag] for tag in ("loss", "lr", "grad_norm"))  # every value, exactly


def test_a_damaged_event_is_dropped_with_a_warning_naming_the_file(tmp_path):
    log = EventLog(str(tmp_path), 0)
    for step in (1, 2, 3):
        log.write(step, {"loss": float(step)})
    size = len(open(log.path, "rb").read())
    third = size - len(frame_record(event(3, 0.0, {"loss": 3.0})))  # where step 3's record starts
    flip_byte(log.path, third + 20)  # inside its data, which then fails its CRC
    lines = []
    keep_events(str(tmp_path), 10, lines.append)
    assert lines == [f"warning: {log.path}: the record(s) at byte {third} are damaged; dropped from the events"]
    assert scalars(tmp_path) == {"loss": [(1, 1.0), (2, 2.0)]}


def test_mfu_is_the_model_flops_over_the_peak_where_the_peak_is_known(tmp_path, monkeypatch):
    """A 1 GFLOP/s data sheet for this CPU: MFU is the window's model FLOP/s over it; the model FLOP/s over the
    sequences/s is the FLOPs of one 12-token sequence's training step."""
    monkeypatch.setattr(loop, "data_sheet_peak_flops", lambda device, precision: (1e9, "a data sheet"))
    trainer = estimator(tmp_path, steps=8)
    trainer.train(ShuffledBatches(features(), 8, seed=0))
    records = read_metrics(tmp_path)
    per_sequence = train_flops(trainer.model.config, "finetuning", 12)
    assert all(
        record["model_tflops_per_s"] * 1e12 / record["seq_per_s"] == pytest.approx(per_sequence, rel=1e-9)
        for record in records
    )
    assert [record["mfu"] for record in records] == [
        pytest.approx(record["model_tflops_per_s"] * 1e3, rel=1e-12) for record in records
    ]
    assert scalars(tmp_path)["mfu"] == [(record["step"], float32(record["mfu"])) for record in records]


# ---- run_pretraining -----------------------------------------------------------------------------------------------


def test_run_pretrainings_evaluations_during_training_are_drawn_in_eval_each_step_once(tmp_path):
    (tmp_path / "train").mkdir()
    for index in range(2):
        write_nvidia_shard(tmp_path / "train" / f"part_{index}.hdf5", count=24, seed=index)
    write_nvidia_shard(tmp_path / "eval.hdf5", count=16, seed=9)
    write_bert_dir(tmp_path / "bert")
    out = tmp_path / "run"
    command = [
        f"--input_dir={tmp_path / 'train'}",
        f"--eval_dir={tmp_path / 'eval.hdf5'}",
        f"--bert_config_file={tmp_path / 'bert' / 'bert_config.json'}",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--train_batch_size=8",
        "--num_train_steps=6",
        "--eval_iter_samples=16",
        "--log_step_count_steps=2",
        "--save_checkpoints_secs=0",
        "--do_train",
        "--do_eval",
        f"--output_dir={out}",
    ]
    assert pretraining.main(command) == 0
    evaluations = read_log(out / "evals.jsonl")
    assert [record["step"] for record in evaluations] == [2, 4, 6]
    drawn = scalars(out / "eval")
    for key in ("masked_lm_accuracy", "next_sentence_accuracy", "loss"):
        assert drawn[key] == [(record["step"], float32(record[key])) for record in evaluations]
    final = read_json(out / "eval_results.json")  # --do_eval's, at the last step: the point of step 6, once
    assert drawn["masked_lm_accuracy"][-1] == (6, float32(final["masked_lm_accuracy"]))
    assert [step for step, _ in scalars(out)["loss"]] == [2, 4, 6]
