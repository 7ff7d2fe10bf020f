"""Fine-tune and score BERT on a GLUE task with Google's run_classifier.py flags (also `bertbench classify`).

    python -m bertbench.run_classifier --task_name=MRPC --do_train=true --do_eval=true \\
        --data_dir=$GLUE_DIR/MRPC --vocab_file=$BERT_DIR/vocab.txt --bert_config_file=$BERT_DIR/bert_config.json \\
        --init_checkpoint=$BERT_DIR/bert_model.ckpt --max_seq_length=128 --train_batch_size=32 \\
        --learning_rate=2e-5 --num_train_epochs=3.0 --output_dir=/tmp/mrpc_output/

HF's run_glue.py command runs too (`python -m bertbench.run_glue`), on GLUE's tsv files (--data_dir) or on its own
csv/JSON-lines files (--train_file, --validation_file, --test_file; tasks.glue.read_file_task).

Writes to output_dir: checkpoints (ckpt-<step>.pt), metrics.jsonl, train_results.json, eval_results.txt and
eval_results.json (every dev set: MNLI matched and mismatched; Google's and HF's keys too) and all_results.json,
and with --do_predict the GLUE submission files (HF's files: predict_results_<task>.txt).
Under torchrun every process trains its share of each batch and scores its share of the dev set; rank 0 writes.
With --no_sync_gradients the processes train apart and the one with the best main metric on the (first) dev set
is kept.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence

import torch

from bertbench.common.durable import write_atomically
from bertbench.common.errors import UsageError
from bertbench.common.flags import setting
from bertbench.common.run_files import GOOGLE_TEST_RESULTS
from bertbench.runners.config import FineTuningSettings
from bertbench.runners.results import report_eval
from bertbench.runners.skeleton import FineTuningData, FineTuningRunner, WorkerScore
from bertbench.tasks.glue import (
    GlueDataError,
    InputExample,
    Task,
    compute_metrics,
    encode_examples,
    get_processor,
    glue_task,
    hf_metrics,
    submission_file_name,
    write_submission,
)
from bertbench.tasks.tokenization import BertTokenizer

PROGRAM = "run_classifier"


@dataclasses.dataclass(frozen=True)
class GlueSettings(FineTuningSettings):
    """GLUE: the task and its files, the model, sizes and processes (Google's run_classifier flags)."""

    task_name: str | None = setting(
        "CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI or AX (prediction only, "
        "with an MNLI model as --init_checkpoint), in any case (HF's mrpc, sst2, stsb, ...). With HF's "
        "--train_file: optional, the task whose metric scores the files.",
        None,
        defines_run=True,
    )
    data_dir: str | None = setting("The task's directory of the GLUE download (glue_data/MRPC).", None)
    do_eval: bool = setting("Score the dev set(s) and write eval_results.txt/.json.", False, per_command=True)
    eval_batch_size: int = setting("Sequences per evaluation batch.", 8, positive=True)
    train_file: str | None = setting(
        "HF run_glue's own data instead of --data_dir: a csv or JSON-lines file of training examples, a 'label' "
        "column and one or two text columns; its labels, sorted, are the classes (floats: a regression).",
        None,
        defines_run=True,
    )
    validation_file: str | None = setting(
        "With --train_file: the csv or JSON-lines file --do_eval scores, laid out as the training file.", None
    )
    test_file: str | None = setting(
        "With --train_file: the csv or JSON-lines file --do_predict predicts (labels not needed), into HF's "
        "predict_results_<task>.txt.",
        None,
    )

    def missing_inputs(self) -> list[str]:
        if self.data_dir is not None or any((self.train_file, self.validation_file, self.test_file)):
            return []
        if self.task_name is None:
            return ["--task_name with --data_dir (or HF's --train_file)"]
        return [
            f"--data_dir or HF's --train_file (--task_name={self.task_name} needs its data here: HF's run_glue "
            "downloads GLUE, bertbench never does)"
        ]

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.do_train or self.do_eval or self.do_predict):
            raise UsageError("at least one of --do_train, --do_eval or --do_predict must be true")
        files = {"train_file": self.train_file, "validation_file": self.validation_file, "test_file": self.test_file}
        given = [f"--{name}" for name, path in files.items() if path is not None]
        if self.data_dir is not None and given:
            raise UsageError(f"--data_dir (GLUE's tsv files) or {'/'.join(given)} (HF's csv/json files): give one")
        if given and self.train_file is None:
            raise UsageError(
                f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --train_file: its labels are the "
                "classes (HF's run_glue)"
            )
        for action, name in (("do_eval", "validation_file"), ("do_predict", "test_file")):
            if self.train_file is not None and getattr(self, action) and files[name] is None:
                raise UsageError(f"--{action} with HF's --train_file needs --{name}")
        if self.task_name is None and self.data_dir is not None:
            raise UsageError("--task_name is required with --data_dir")
        try:
            if self.task_name is not None:
                get_processor(self.task_name)
        except ValueError as error:
            raise UsageError(str(error)) from None
        if self.max_seq_length < 3:
            raise UsageError(f"--max_seq_length must be at least 3 ([CLS], text and [SEP]), got {self.max_seq_length}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GlueData(FineTuningData):
    processor: Task
    tokenizer: BertTokenizer  # test sets are encoded after training
    dev_sets: Mapping[str, Mapping[str, torch.Tensor]]  # dev set name -> features (MNLI: matched, mismatched)
    test_sets: Mapping[str, list[InputExample]]  # test set name -> examples, read before training (--do_predict)


def read(settings: GlueSettings, tokenizer: BertTokenizer, log) -> GlueData:
    """Every file the command needs, test sets included: a bad file must not surface after hours of training."""
    processor = glue_task(
        settings.task_name,
        settings.train_file,
        settings.validation_file if settings.do_eval else None,
        settings.test_file if settings.do_predict else None,
    )
    train = None
    if settings.do_train:
        examples = processor.train_examples(settings.data_dir, log)[: settings.max_train_samples]
        train = encode_examples(examples, tokenizer, processor, settings.max_seq_length)
    dev_sets = (
        {
            name: encode_examples(examples[: settings.max_eval_samples], tokenizer, processor, settings.max_seq_length)
            for name, examples in processor.dev_sets(settings.data_dir, log).items()
        }
        if settings.do_eval
        else {}
    )
    test_sets = (
        {
            name: examples[: settings.max_predict_samples]
            for name, examples in processor.test_sets(settings.data_dir, log).items()
        }
        if settings.do_predict
        else {}
    )
    return GlueData(
        train=train,
        num_train_sequences=len(train["labels"]) if train else 0,
        description=f"{processor.name}: {len(train['labels'])} examples" if train else "",
        head_kwargs={"num_labels": processor.num_labels},
        processor=processor,
        tokenizer=tokenizer,
        dev_sets=dev_sets,
        test_sets=test_sets,
    )


def worker_score(settings: GlueSettings, data: GlueData) -> WorkerScore:
    """The task's main metric on its first dev set (MNLI: matched), for choosing among independent workers."""
    set_name, features = next(iter(data.dev_sets.items()))
    processor = data.processor
    if processor.main_metric == "mse":
        raise UsageError(
            "--no_sync_gradients keeps the worker with the best dev metric, and a regression without --task_name "
            "is scored by its error alone: give --task_name=stsb (Pearson and Spearman)"
        )

    def score(estimator) -> float:
        logits = estimator.predict(features, settings.eval_batch_size)["logits"]
        return compute_metrics(processor, logits, features["labels"])[processor.main_metric]

    return WorkerScore(f"{set_name}_{processor.main_metric}", score)


def infer(settings: GlueSettings, estimator, data: GlueData, is_main: bool, log) -> dict[str, float]:
    """Evaluate and predict; returns what NVIDIA's run_glue logs of them (its exact_match is the accuracy)."""
    figures = {}
    if settings.do_eval:
        started = time.perf_counter()
        results = evaluate(settings, estimator, data, is_main, log)
        seconds = time.perf_counter() - started
        first = next(iter(data.dev_sets))
        figures = {
            "e2e_inference_time": seconds,
            "inference_sequences_per_second": sum(len(features["labels"]) for features in data.dev_sets.values())
            / max(seconds, 1e-9),
            **{
                name: results[f"{first}_{key}"]
                for name, key in (("exact_match", "acc"), ("F1", "f1"))
                if f"{first}_{key}" in results
            },
        }
    if settings.do_predict:
        predict(settings, estimator, data, is_main, log)
    return figures


def evaluate(settings: GlueSettings, estimator, data: GlueData, is_main: bool, log) -> dict[str, float]:
    """Every dev set of the task; results keyed `<dev set>_<metric>` (dev_acc, dev_matched_acc, ...), with Google's
    keys of the first dev set and HF run_glue's of each (eval_accuracy, ...; MNLI mismatched's eval_accuracy_mm)."""
    processor = data.processor
    results: dict[str, float] = {"global_step": estimator.global_step}
    for index, (set_name, features) in enumerate(data.dev_sets.items()):
        labels = features["labels"]
        scores = estimator.evaluate(
            features,
            settings.eval_batch_size,
            metric_fn=lambda outputs: compute_metrics(processor, outputs["logits"], labels),
        )
        results.update({f"{set_name}_{key}": value for key, value in scores.items() if key != "global_step"})
        results[f"{set_name}_examples"] = len(labels)
        if index == 0:  # Google's keys too, of the first dev set (the only one Google scores)
            results["loss"] = scores["loss"]
        hf = {**hf_metrics(scores), "loss": scores["loss"], "samples": len(labels)}
        results.update({f"eval_{key}{'_mm' if index else ''}": value for key, value in hf.items()})
    report_eval(
        estimator.run_config,
        f"{processor.name}, step {estimator.global_step}",
        results,
        {"task": processor.name},
        is_main,
        log,
    )
    return results


def predict(settings: GlueSettings, estimator, data: GlueData, is_main: bool, log) -> list[str]:
    """The GLUE leaderboard file of every test set (MNLI-m.tsv and MNLI-mm.tsv for MNLI), and Google's
    test_results.tsv of the first (the one Google predicts): a line per example, its class probabilities
    tab-separated (STS-B: its score), no header."""
    processor, output_dir = data.processor, estimator.run_config.model_dir
    written = []
    for set_name, examples in data.test_sets.items():
        features = encode_examples(examples, data.tokenizer, processor, settings.max_seq_length)
        del features["labels"]  # test sets are unlabelled
        logits = estimator.predict(features, settings.predict_batch_size)["logits"]
        path = os.path.join(output_dir, submission_file_name(processor, set_name))
        if is_main:
            os.makedirs(output_dir, exist_ok=True)
            write_submission(path, processor, [example.guid for example in examples], logits)
            log(f"predictions for {len(examples)} {set_name} examples written to {path}")
            if not written:
                google = os.path.join(output_dir, GOOGLE_TEST_RESULTS)
                values = logits.float() if processor.is_regression else torch.softmax(logits.float(), dim=-1)
                write_atomically(
                    google,
                    "".join(
                        "\t".join(str(value) for value in row) + "\n"
                        for row in values.reshape(len(examples), -1).numpy()
                    ),
                )
                log(f"class probabilities written to {google} (Google's file)")
        written.append(path)
    return written


SPEC = FineTuningRunner(
    name=PROGRAM,
    description=__doc__.splitlines()[0],
    settings=GlueSettings,
    input_errors=(GlueDataError,),
    model_task="classification",
    scored_by="do_eval",
    read_files=read,
    dev_score=worker_score,
    evaluate=infer,
)


def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    return SPEC.main(argv, prog)


if __name__ == "__main__":
    sys.exit(main())
