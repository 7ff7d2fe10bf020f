"""Fine-tune and score BERT on a GLUE task with Google's run_classifier.py flags (also `bertbench classify`).

    python -m bertbench.run_classifier --task_name=MRPC --do_train=true --do_eval=true \\
        --data_dir=$GLUE_DIR/MRPC --vocab_file=$BERT_DIR/vocab.txt --bert_config_file=$BERT_DIR/bert_config.json \\
        --init_checkpoint=$BERT_DIR/bert_model.ckpt --max_seq_length=128 --train_batch_size=32 \\
        --learning_rate=2e-5 --num_train_epochs=3.0 --output_dir=/tmp/mrpc_output/

Writes to output_dir: checkpoints (ckpt-<step>.pt), metrics.jsonl, train_results.json, eval_results.txt and
eval_results.json (every dev set: MNLI matched and mismatched), and with --do_predict the GLUE submission files.
Under torchrun every process trains its share of each batch and scores its share of the dev set; rank 0 writes.
With --no_sync_gradients the processes train apart and the one with the best main metric on the (first) dev set
is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from bertbench import runner
from bertbench.distributed import job_from_environment
from bertbench.tasks.glue import GlueDataError, compute_metrics, encode_examples, get_processor, \
    submission_file_name, write_submission

PROGRAM = "run_classifier"
# GLUE's flags that also define the weights of a run (runner.RUN_DEFINING has the common ones).
RUN_DEFINING = runner.RUN_DEFINING + ("task_name",)


def build_parser(prog: str = PROGRAM) -> runner.FlagParser:
    parser = runner.FlagParser(prog=prog, description=__doc__.splitlines()[0])
    glue = parser.add_argument_group("GLUE")
    parser.flag(glue, "task_name", None, "CoLA, SST-2, MRPC, STS-B, QQP, MNLI, QNLI, RTE, WNLI or AX "
                                         "(prediction only, with an MNLI model as --init_checkpoint).")
    parser.flag(glue, "data_dir", None, "The task's directory of the GLUE download (glue_data/MRPC).")
    parser.bool_flag(glue, "do_eval", False, "Score the dev set(s) and write eval_results.txt/.json.")
    parser.flag(glue, "eval_batch_size", 8, "Sequences per evaluation batch.", type=int)
    runner.add_common_flags(parser, default_learning_rate=5e-5)
    return parser


def run(args: argparse.Namespace, record: runner.RunRecord | None) -> int:
    if not (args.do_train or args.do_eval or args.do_predict):
        raise runner.UsageError("at least one of --do_train, --do_eval or --do_predict must be true")
    for name in ("task_name", "data_dir"):
        if getattr(args, name) is None:
            raise runner.UsageError(f"--{name} is required")
    try:
        processor = get_processor(args.task_name)
    except ValueError as error:
        raise runner.UsageError(str(error)) from None
    runner.check_independent_workers(args, needs="do_eval")
    config, tokenizer = runner.load_config_and_tokenizer(args)
    with job_from_environment(args.device) as dist:
        runner.check_record(record, config, args, dist)
        log = (lambda line: print(line, flush=True)) if dist.is_main else (lambda line: None)
        model, start = runner.build_model(args, "classification", config, dist, log, num_labels=processor.num_labels)

        train_steps, train_features = None, None
        if args.do_train:
            examples = processor.train_examples(args.data_dir)[:args.max_train_samples]
            train_features = encode_examples(examples, tokenizer, processor, args.max_seq_length)
            train_steps = runner.num_train_steps(len(examples), args, dist)
        # Read before training: a bad dev file must not surface after hours of it.
        dev_sets = {name: encode_examples(examples, tokenizer, processor, args.max_seq_length)
                    for name, examples in processor.dev_sets(args.data_dir).items()} if args.do_eval else {}
        estimator = runner.build_estimator(args, model, dist, train_steps)

        if args.do_train:
            status = runner.train_and_report(estimator, args, record, PROGRAM, config, dist, train_features,
                                             f"{processor.name}: {len(train_features['labels'])} examples", log,
                                             start, worker_score(args, processor, estimator, dev_sets))
            if status is not None:
                return status
        else:
            runner.restore_for_inference(estimator, start)

        if args.do_eval:
            evaluate(args, processor, estimator, dev_sets, dist.is_main, log)
        if args.do_predict:
            predict(args, processor, tokenizer, estimator, dist.is_main, log)
        return 0


def worker_score(args, processor, estimator, dev_sets) -> runner.WorkerScore | None:
    """The task's main metric on its first dev set (MNLI: matched), for choosing among independent workers."""
    if not dev_sets:
        return None
    set_name, features = next(iter(dev_sets.items()))

    def score() -> float:
        logits = estimator.predict(features, args.eval_batch_size)["logits"]
        return compute_metrics(processor, logits, features["labels"])[processor.main_metric]
    return runner.WorkerScore(f"{set_name}_{processor.main_metric}", score)


def evaluate(args, processor, estimator, dev_sets, is_main: bool, log) -> dict[str, float]:
    """Every dev set of the task; results keyed `<dev set>_<metric>` (dev_acc, dev_matched_acc, ...)."""
    results: dict[str, float] = {"global_step": estimator.global_step}
    for set_name, features in dev_sets.items():
        labels = features["labels"]
        scores = estimator.evaluate(features, args.eval_batch_size,
                                    metric_fn=lambda outputs: compute_metrics(processor, outputs["logits"], labels))
        results.update({f"{set_name}_{key}": value for key, value in scores.items() if key != "global_step"})
        results[f"{set_name}_examples"] = len(labels)
    runner.report_eval(args.output_dir, f"{processor.name}, step {estimator.global_step}", results,
                       {"task": processor.name}, is_main, log)
    return results


def predict(args, processor, tokenizer, estimator, is_main: bool, log) -> list[str]:
    """The GLUE leaderboard file of every test set (MNLI-m.tsv and MNLI-mm.tsv for MNLI)."""
    written = []
    for set_name, examples in processor.test_sets(args.data_dir).items():
        features = encode_examples(examples, tokenizer, processor, args.max_seq_length)
        del features["labels"]  # test sets are unlabelled
        logits = estimator.predict(features, args.predict_batch_size)["logits"]
        path = os.path.join(args.output_dir, submission_file_name(processor, set_name))
        if is_main:
            os.makedirs(args.output_dir, exist_ok=True)
            write_submission(path, processor, [example.guid for example in examples], logits)
            log(f"predictions for {len(examples)} {set_name} examples written to {path}")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    return runner.run_main(prog, build_parser(prog), argv, PROGRAM, RUN_DEFINING, run, extra_errors=(GlueDataError,))


if __name__ == "__main__":
    sys.exit(main())
