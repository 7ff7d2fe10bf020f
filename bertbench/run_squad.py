"""Fine-tune BERT on SQuAD v1.1 or v2.0 and predict answers, with Google's run_squad.py flags (also `bertbench squad`).

    python -m bertbench.run_squad --do_train=true --do_predict=true \\
        --train_file=$SQUAD_DIR/train-v1.1.json --predict_file=$SQUAD_DIR/dev-v1.1.json \\
        --vocab_file=$BERT_DIR/vocab.txt --bert_config_file=$BERT_DIR/bert_config.json \\
        --init_checkpoint=$BERT_DIR/bert_model.ckpt --max_seq_length=384 --doc_stride=128 \\
        --train_batch_size=12 --learning_rate=3e-5 --num_train_epochs=2.0 --output_dir=/tmp/squad_base/

Writes to output_dir: checkpoints (ckpt-<step>.pt), metrics.jsonl, train_results.json, and with --do_predict
predictions.json, nbest_predictions.json, null_odds.json (v2.0), and, when the predict file has answers (a dev
file), eval_results.json/.txt with the official exact match and F1. An epoch is one pass over the training windows
(a long context gives several). Under torchrun every process trains its share of each batch and predicts its share
of the windows; rank 0 writes. With --no_sync_gradients the processes train apart and the one whose predictions
score the best F1 on the predict file (a dev file, with answers) is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence

from bertbench import runner
from bertbench.distributed import job_from_environment
from bertbench.estimator import Estimator
from bertbench.tasks.squad import (ScoredQuestion, SquadDataError, SquadExample, SquadFeatures, SquadPredictions,
                                   convert_examples, evaluate, postprocess, read_examples, read_questions)
from bertbench.tokenization import BertTokenizer

PROGRAM = "run_squad"
# SQuAD's flags that also define the weights of a run (runner.RUN_DEFINING has the common ones).
RUN_DEFINING = runner.RUN_DEFINING + ("doc_stride", "max_query_length", "version_2_with_negative")


def build_parser(prog: str = PROGRAM) -> runner.FlagParser:
    parser = runner.FlagParser(prog=prog, description=__doc__.splitlines()[0])
    squad = parser.add_argument_group("SQuAD")
    parser.flag(squad, "train_file", None, "SQuAD JSON to train on (train-v1.1.json, train-v2.0.json).")
    parser.flag(squad, "predict_file", None, "SQuAD JSON to predict (dev-v1.1.json); scored when it has answers.")
    parser.flag(squad, "doc_stride", 128, "Tokens between the starts of a long context's windows.", type=int)
    parser.flag(squad, "max_query_length", 64, "Question tokens kept; longer questions are cut.", type=int)
    parser.flag(squad, "n_best_size", 20, "Best start and end logits paired per window, and n-best answers kept.",
                type=int)
    parser.flag(squad, "max_answer_length", 30, "Longest answer, in tokens.", type=int)
    parser.bool_flag(squad, "version_2_with_negative", False, "SQuAD v2.0: questions may have no answer.")
    parser.flag(squad, "null_score_diff_threshold", 0.0, "v2.0: answer \"\" when the no-answer score beats the "
                                                         "best span's by more than this.", type=float)
    runner.add_common_flags(parser, default_learning_rate=5e-5, default_max_seq_length=384)
    return parser


def check_flags(args: argparse.Namespace) -> None:
    if not (args.do_train or args.do_predict):
        raise runner.UsageError("at least one of --do_train or --do_predict must be true")
    for action, name in (("do_train", "train_file"), ("do_predict", "predict_file")):
        if getattr(args, action) and not getattr(args, name):
            raise runner.UsageError(f"--{action} needs --{name}")
    for name in ("doc_stride", "max_query_length", "n_best_size", "max_answer_length"):
        if getattr(args, name) < 1:
            raise runner.UsageError(f"--{name} must be positive, got {getattr(args, name)}")
    runner.check_independent_workers(args, needs="do_predict")
    if args.max_seq_length <= args.max_query_length + 3:
        raise runner.UsageError(f"--max_seq_length {args.max_seq_length} must exceed --max_query_length "
                                f"{args.max_query_length} + 3 ([CLS], [SEP], [SEP]) to leave room for the context")


def make_features(path: str, examples: list[SquadExample], tokenizer: BertTokenizer, args: argparse.Namespace,
                  training: bool, log: Callable[[str], None]) -> SquadFeatures:
    started = time.perf_counter()
    try:
        features = convert_examples(examples, tokenizer, args.max_seq_length, args.doc_stride, args.max_query_length,
                                    training)
    except SquadDataError as error:
        raise SquadDataError(f"{path}: {error}") from None
    seconds = time.perf_counter() - started
    log(f"{path}: {len(examples)} questions -> {len(features)} windows of {args.max_seq_length} tokens in "
        f"{seconds:.2f} s ({len(features) / max(seconds, 1e-9):,.0f} windows/s)")
    return features


def run(args: argparse.Namespace, record: runner.RunRecord | None) -> int:
    check_flags(args)
    config, tokenizer = runner.load_config_and_tokenizer(args)
    with job_from_environment(args.device) as dist:
        log = (lambda line: print(line, flush=True)) if dist.is_main else (lambda line: None)
        # Both files are read and featurized first: a bad predict file must not surface after hours of training.
        train_examples = train_features = predict_examples = predict_features = None
        if args.do_train:
            train_examples = read_examples(args.train_file, training=True,
                                           version_2=args.version_2_with_negative)[:args.max_train_samples]
            train_features = make_features(args.train_file, train_examples, tokenizer, args, True, log)
        if args.do_predict:
            predict_examples = read_examples(args.predict_file, training=False,
                                             version_2=args.version_2_with_negative)
            predict_features = make_features(args.predict_file, predict_examples, tokenizer, args, False, log)
            questions, file_is_version_2 = read_questions(args.predict_file)
            if args.do_train and not args.sync_gradients and not any(question.has_answer for question in questions):
                raise runner.UsageError(f"{args.predict_file}: no answers to score, so --no_sync_gradients cannot "
                                        "choose a worker; predict a dev file")
        runner.check_record(record, config, args, dist)
        model, start = runner.build_model(args, "question_answering", config, dist, log)
        train_steps = runner.num_train_steps(len(train_features), args, dist) if args.do_train else None
        estimator = runner.build_estimator(args, model, dist, train_steps)

        if args.do_train:
            version = "v2.0" if args.version_2_with_negative else "v1.1"

            def worker_f1() -> float:
                predictions = answer(args, predict_examples, predict_features, estimator)
                return official_scores(args, questions, file_is_version_2, predictions, log=lambda line: None)["f1"]
            status = runner.train_and_report(
                estimator, args, record, PROGRAM, config, dist, train_features.inputs,
                f"SQuAD {version}: {len(train_examples)} questions in {len(train_features)} windows", log, start,
                runner.WorkerScore("f1", worker_f1) if args.do_predict else None)
            if status is not None:
                return status
        else:
            runner.restore_for_inference(estimator, start)

        if args.do_predict:
            predict(args, predict_examples, predict_features, questions, file_is_version_2, estimator,
                    dist.is_main, log)
        return 0


def answer(args: argparse.Namespace, examples: list[SquadExample], features: SquadFeatures, estimator: Estimator,
           log: Callable[[str], None] = lambda line: None) -> SquadPredictions:
    """The model's answer (and n-best list, and v2.0 null odds) to every question."""
    started = time.perf_counter()
    logits = estimator.predict(features.inputs, args.predict_batch_size, outputs=("start_logits", "end_logits"))
    predicted = time.perf_counter()
    predictions = postprocess(examples, features, logits["start_logits"].numpy(), logits["end_logits"].numpy(),
                              args.n_best_size, args.max_answer_length, args.version_2_with_negative,
                              args.null_score_diff_threshold)
    log(f"predicted {len(examples)} questions ({len(features)} windows) in {predicted - started:.2f} s "
        f"({len(features) / max(predicted - started, 1e-9):,.1f} windows/s), answers chosen in "
        f"{time.perf_counter() - predicted:.2f} s")
    return predictions


def official_scores(args: argparse.Namespace, questions: list[ScoredQuestion], file_is_version_2: bool,
                    predictions: SquadPredictions, log: Callable[[str], None]) -> dict[str, float]:
    return evaluate(questions, predictions.answers, file_is_version_2, predictions.null_odds,
                    args.null_score_diff_threshold, warn=log)


def predict(args: argparse.Namespace, examples: list[SquadExample], features: SquadFeatures,
            questions: list[ScoredQuestion], file_is_version_2: bool, estimator: Estimator, is_main: bool,
            log: Callable[[str], None]) -> dict[str, float] | None:
    """Write predictions.json, nbest_predictions.json and (v2.0) null_odds.json; score them when the predict file
    (read as `questions`) has answers. Returns the figures, or None for a file without answers."""
    predictions = answer(args, examples, features, estimator, log)
    outputs = {"predictions.json": predictions.answers, "nbest_predictions.json": predictions.nbest}
    if predictions.null_odds is not None:
        outputs["null_odds.json"] = predictions.null_odds
    if is_main:
        os.makedirs(args.output_dir, exist_ok=True)
        for name, content in outputs.items():
            runner.write_json(os.path.join(args.output_dir, name), content)
        log(f"{', '.join(outputs)} written to {args.output_dir}")

    if not any(question.has_answer for question in questions):
        return None
    figures = official_scores(args, questions, file_is_version_2, predictions, log)
    results = {**figures, "global_step": estimator.global_step, "questions": len(examples),
               "windows": len(features)}
    runner.report_eval(args.output_dir, f"{os.path.basename(args.predict_file)}, step {estimator.global_step}",
                       results, {"predict_file": args.predict_file}, is_main, log)
    return results


def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    return runner.run_main(prog, build_parser(prog), argv, PROGRAM, RUN_DEFINING, run, extra_errors=(SquadDataError,))


if __name__ == "__main__":
    sys.exit(main())
