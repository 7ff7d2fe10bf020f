"""Pre-train BERT (masked LM + next sentence) on hdf5 shards in NVIDIA's layout (also `bertbench pretrain`).

Google's run_pretraining.py flags, with NVIDIA's and MLPerf's names where they have one:

    python -m bertbench.run_pretraining --input_dir=$DATA/hdf5_seq128 --bert_config_file=bert_config.json \\
        --output_dir=results/phase1 --do_train --max_seq_length=128 --max_predictions_per_seq=20 \\
        --train_batch_size=64 --num_accumulation_steps=4 --num_train_steps=7038 --warmup_proportion=0.2843 \\
        --learning_rate=6e-3 --optimizer_type=lamb --precision=bf16
    python -m bertbench.run_pretraining --phase2 --init_checkpoint=results/phase1 --input_dir=$DATA/hdf5_seq512 \\
        --output_dir=results/phase2 --do_train --max_seq_length=512 --max_predictions_per_seq=80 \\
        --num_train_steps=1563 --warmup_proportion=0.128 --learning_rate=4e-3 ...

Phase 2 starts from phase 1's last checkpoint: its weights, LAMB moments and step count (its checkpoints and logs go
on from phase 1's last step), with its own warm-up and polynomial decay over its --num_train_steps, as NVIDIA's
phase 2 does. With --eval_dir the model is scored on those shards (masked-LM accuracy over the masked tokens and
next-sentence accuracy); with --eval_iter_samples during training as well, and --target_mlm_accuracy stops the run
once reached and reports the time to train (MLPerf BERT's target is 0.720).

Writes to output_dir: checkpoints, metrics.jsonl, evals.jsonl (every evaluation), train_results.json,
eval_results.txt/.json. Under torchrun each process reads whole shards of its own (at least one per process).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence

from bertbench import runner
from bertbench.checkpoint import checkpoint_step, latest_checkpoint
from bertbench.distributed import Distributed, job_from_environment
from bertbench.estimator import Estimator, PeriodicEvaluation
from bertbench.train_state import CONTINUE, RunStart
from bertbench.progress import MetricsLog
from bertbench.tasks.pretraining import (PretrainingBatches, ShardError, ShardLimits, accuracies, check_layout,
                                         find_shards, parse_length_bins, prediction_counts, read_eval_set)

PROGRAM = "run_pretraining"
# MLPerf BERT's quality target: masked-LM accuracy on its 10,000 eval sequences.
MLPERF_TARGET_MLM_ACCURACY = 0.720
# Flags whose value defines the trained weights, beyond runner.RUN_DEFINING.
RUN_DEFINING = runner.RUN_DEFINING + ("max_predictions_per_seq", "num_train_steps", "num_warmup_steps", "phase2",
                                      "phase1_end_step", "length_bins", "poly_power")
# Common flags that mean nothing here: no tokenizer (shards hold ids), no epochs (steps), no independent workers.
OMITTED = ("vocab_file", "do_lower_case", "do_predict", "predict_batch_size", "num_train_epochs",
           "max_train_samples", "sync_gradients")


def build_parser(prog: str = PROGRAM) -> runner.FlagParser:
    # NVIDIA's pre-training recipe: LAMB, polynomial decay.
    parser = runner.FlagParser(prog=prog, description=__doc__.splitlines()[0], omit=OMITTED,
                               default_overrides={"optimizer_type": "lamb", "decay": "poly"})
    data = parser.add_argument_group("pre-training data")
    parser.flag(data, "input_dir", None, "Training shards: a directory (every .hdf5/.h5 under it, NVIDIA's "
                                         "--input_dir), a file, or comma-separated files and glob patterns "
                                         "(Google's --input_file).", aliases=("input_file",))
    parser.flag(data, "max_predictions_per_seq", 20, "Masked positions per sequence the shards were made with "
                                                     "(20 at 128 tokens, 80 at 512).", type=int)
    parser.flag(data, "length_bins", None, "Draw each batch from one length bin and cut it to the bin's edge, e.g. "
                                           "128,256,384,512 (the last must be --max_seq_length): less padding.")
    phases = parser.add_argument_group("phases and schedule")
    parser.flag(phases, "num_train_steps", None, "Optimizer steps of this phase (NVIDIA's --max_steps).", type=int,
                aliases=("max_steps",))
    parser.flag(phases, "num_warmup_steps", None, "Warm-up steps (Google's); overrides --warmup_proportion.",
                type=int)
    parser.flag(phases, "poly_power", 0.5, "Power of the polynomial decay after warm-up (NVIDIA's 0.5; 1 is "
                                           "Google's linear decay).", type=float)
    parser.bool_flag(phases, "phase2", False, "Continue from phase 1: --init_checkpoint is its run directory or "
                                              "checkpoint, whose weights, optimizer moments and step count this run "
                                              "starts from; warm-up and decay start anew.")
    parser.flag(phases, "phase1_end_step", None, "The step phase 1 ended at (NVIDIA's flag): checked against the "
                                                 "checkpoint, which says it anyway.", type=int)
    evaluation = parser.add_argument_group("evaluation (MLPerf's names)")
    parser.bool_flag(evaluation, "do_eval", False, "Score --eval_dir after training (or the run's checkpoint "
                                                   "without --do_train).")
    parser.flag(evaluation, "eval_dir", None, "Evaluation shards (same forms as --input_dir).")
    parser.flag(evaluation, "eval_batch_size", 32, "Sequences per evaluation batch.", type=int)
    parser.flag(evaluation, "num_eval_examples", None, "Score the first N eval sequences only (MLPerf: 10000).",
                type=int)
    parser.flag(evaluation, "eval_iter_samples", None, "Also evaluate during training, every this many training "
                                                       "sequences (rounded up to whole steps).", type=int)
    parser.flag(evaluation, "eval_iter_start_samples", None, "First evaluation after this many training sequences "
                                                             "(default: --eval_iter_samples).", type=int)
    parser.flag(evaluation, "target_mlm_accuracy", None, f"Stop training once masked-LM accuracy reaches this and "
                                                         f"report the time to train (MLPerf: "
                                                         f"{MLPERF_TARGET_MLM_ACCURACY}).", type=float)
    runner.add_common_flags(parser, default_learning_rate=5e-5)
    return parser


def check_flags(args: argparse.Namespace) -> None:
    if not (args.do_train or args.do_eval):
        raise runner.UsageError("at least one of --do_train or --do_eval must be true")
    if args.do_train and not args.input_dir:
        raise runner.UsageError("--do_train needs --input_dir (or --input_file): the training shards")
    if args.do_train and args.num_train_steps is None:
        raise runner.UsageError("--do_train needs --num_train_steps (or --max_steps)")
    if (args.do_eval or args.eval_iter_samples or args.target_mlm_accuracy) and not args.eval_dir:
        raise runner.UsageError("evaluation needs --eval_dir: the evaluation shards")
    if args.target_mlm_accuracy is not None and not args.eval_iter_samples:
        raise runner.UsageError("--target_mlm_accuracy is checked at the evaluations during training: give "
                                "--eval_iter_samples")
    if args.phase2 and not args.init_checkpoint:
        raise runner.UsageError("--phase2 needs --init_checkpoint: phase 1's run directory or checkpoint")
    for name in ("max_predictions_per_seq", "num_train_steps", "num_eval_examples", "eval_iter_samples",
                 "eval_iter_start_samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise runner.UsageError(f"--{name} must be positive, got {value}")
    if args.num_warmup_steps is not None and not 0 <= args.num_warmup_steps <= (args.num_train_steps or 0):
        raise runner.UsageError(f"--num_warmup_steps must be 0..--num_train_steps, got {args.num_warmup_steps}")
    if args.target_mlm_accuracy is not None and not 0 < args.target_mlm_accuracy <= 1:
        raise runner.UsageError(f"--target_mlm_accuracy must be in (0, 1], got {args.target_mlm_accuracy}")
    if args.max_predictions_per_seq >= args.max_seq_length:
        raise runner.UsageError(f"--max_predictions_per_seq {args.max_predictions_per_seq} must be less than "
                                f"--max_seq_length {args.max_seq_length}")


class MlmEvaluation:
    """Scores the eval set, logs and records each evaluation, and tells when the target is met."""

    def __init__(self, args: argparse.Namespace, estimator: Estimator, features, dist: Distributed, log):
        self.args, self.estimator, self.features, self.log = args, estimator, features, log
        self.global_batch = args.train_batch_size * args.num_accumulation_steps * dist.world_size
        # Evaluations during training are logged; a resumed run keeps those up to its checkpoint.
        resumed = latest_checkpoint(args.output_dir)
        self.history = MetricsLog(os.path.join(args.output_dir, "evals.jsonl"),
                                  checkpoint_step(resumed) if resumed else None) \
            if dist.is_main and args.do_train and args.eval_iter_samples else None
        # Time to train runs from here (the model built, every shard checked) to the evaluation that meets the target.
        self.started = time.perf_counter()
        self.last: tuple[int, dict] | None = None  # the step of the last evaluation and its scores
        self.reached: dict | None = None

    def score(self) -> dict:
        """Loss, accuracies and counts of the model as it is now (at estimator.global_step)."""
        if self.last is not None and self.last[0] == self.estimator.global_step:
            return self.last[1]
        results = self.estimator.evaluate(self.features, self.args.eval_batch_size, metric_fn=accuracies,
                                          outputs=prediction_counts)
        del results["global_step"]
        results["eval_sequences"] = len(self.features["input_ids"])
        self.last = (self.estimator.global_step, results)
        return results

    def __call__(self, step: int) -> bool:
        results = self.score()
        elapsed = time.perf_counter() - self.started
        record = {"step": step, "training_sequences": step * self.global_batch, "seconds": round(elapsed, 3),
                  **results}
        if self.history is not None:
            self.history.write(record)
        self.log(f"eval at step {step}: masked-LM accuracy {results['masked_lm_accuracy']:.4f}, next-sentence "
                 f"accuracy {results['next_sentence_accuracy']:.4f}, loss {results['loss']:.4f}")
        target = self.args.target_mlm_accuracy
        if target is not None and self.reached is None and results["masked_lm_accuracy"] >= target:
            self.reached = record
            self.log(f"target masked-LM accuracy {target} reached at step {step} after {elapsed:.1f} s")
            return True
        return False

    def summary(self) -> dict:
        target = self.args.target_mlm_accuracy
        if target is None:
            return {}
        reached = self.reached
        return {"target_mlm_accuracy": target, "target_reached": reached is not None,
                "time_to_train_seconds": reached["seconds"] if reached else None,
                "steps_to_target": reached["step"] if reached else None,
                "sequences_to_target": reached["training_sequences"] if reached else None}


def phase_start_step(args: argparse.Namespace, start: RunStart) -> int:
    """The step this phase's schedule starts at: 0, or where phase 1 ended. A phase 2 that continues phase 1 records
    it (checked against --phase1_end_step when given); a phase 2 that resumes reads it from its run record."""
    if not (args.phase2 and args.do_train):
        return 0
    if start.kind == CONTINUE:
        if args.phase1_end_step is not None and args.phase1_end_step != start.step:
            raise runner.UsageError(f"{start.checkpoint}: phase 1 ended at step {start.step}, not --phase1_end_step "
                                    f"{args.phase1_end_step}")
        args.phase1_end_step = start.step  # recorded, so that a resumed phase 2 keeps its step count
    return args.phase1_end_step


def evaluation_schedule(args: argparse.Namespace, evaluation: MlmEvaluation, start_step: int
                        ) -> PeriodicEvaluation | None:
    if not args.eval_iter_samples:
        return None
    every = math.ceil(args.eval_iter_samples / evaluation.global_batch)
    first = math.ceil((args.eval_iter_start_samples or args.eval_iter_samples) / evaluation.global_batch)
    return PeriodicEvaluation(every_steps=every, run=evaluation, first_step=start_step + first)


def run(args: argparse.Namespace, record: runner.RunRecord | None) -> int:
    check_flags(args)
    config = runner.load_config(args)
    try:
        bins = parse_length_bins(args.length_bins, args.max_seq_length)
    except ValueError as error:
        raise runner.UsageError(str(error)) from None
    limits = ShardLimits(args.max_seq_length, args.max_predictions_per_seq, config.vocab_size,
                         config.type_vocab_size)
    # Every shard's layout and the whole eval set are checked before the model is built: a bad file must not
    # surface hours into a run.
    train_files = find_shards(args.input_dir) if args.do_train else []
    train_sequences = sum(check_layout(path, limits) for path in train_files)
    eval_features = read_eval_set(find_shards(args.eval_dir), limits, args.num_eval_examples) \
        if args.eval_dir else None
    if args.num_warmup_steps is not None:
        args.warmup_proportion = args.num_warmup_steps / args.num_train_steps

    with job_from_environment(args.device) as dist:
        runner.check_record(record, config, args, dist)
        log = (lambda line: print(line, flush=True)) if dist.is_main else (lambda line: None)
        # Phase 2's weights come with the rest of phase 1's state, through Estimator.train.
        model, start = runner.build_model(args, "pretraining", config, dist, log,
                                          continue_phase=args.phase2 and args.do_train)
        start_step = phase_start_step(args, start)
        estimator = runner.build_estimator(args, model, dist,
                                           start_step + args.num_train_steps if args.do_train else None)
        evaluation = MlmEvaluation(args, estimator, eval_features, dist, log) if eval_features is not None else None
        if args.do_train:
            status = train(args, record, config, dist, estimator, train_files, train_sequences, limits, bins,
                           start, start_step, evaluation, log)
            if status is not None:
                return status
        else:
            runner.restore_for_inference(estimator, start)
        if args.do_eval:  # the evaluation at the last step, if one ran there
            results = {"global_step": estimator.global_step, **evaluation.score()}
            runner.report_eval(args.output_dir, f"pre-training, step {estimator.global_step}", results,
                               {"eval_dir": args.eval_dir}, dist.is_main, log)
        return 0


def train(args, record, config, dist, estimator: Estimator, files, sequences: int, limits, bins, start: RunStart,
          start_step: int, evaluation: MlmEvaluation | None, log) -> int | None:
    """Train on the shards (resuming the run, or continuing phase 1) and write train_results.json."""
    runner.write_record(record, PROGRAM, args, config, dist)
    batches = PretrainingBatches(files, args.train_batch_size, args.seed, limits, dist.rank, dist.world_size, bins)
    periodic = evaluation_schedule(args, evaluation, start_step) if evaluation is not None else None
    log(f"***** Pre-training{' phase 2 from ' + start.checkpoint if start.kind == CONTINUE else ''}: {len(files)} shards, "
        f"{sequences:,} sequences of {args.max_seq_length} tokens, steps {start_step} to "
        f"{estimator.train_config.num_train_steps}, batch {args.train_batch_size} x {args.num_accumulation_steps} "
        f"x {dist.world_size} processes, {args.optimizer_type}, {args.modeling} model, "
        f"{runner.resolve_precision(args)} on {dist.device}"
        + (f", length bins {args.length_bins}" if bins else "") + " *****")
    try:
        result = estimator.train(batches, start, evaluation=periodic)
    finally:
        batches.close()
    extra = {"learning_rate": estimator.train_config.learning_rate, "max_predictions_per_seq":
             args.max_predictions_per_seq, "phase2": args.phase2, "schedule_start_step": start_step,
             "training_shards": len(files), "training_sequences": sequences, "length_bins": args.length_bins,
             "sequences_left_out_in_partial_batches": sum(dist.all_gather_object(batches.dropped)),
             **(evaluation.summary() if evaluation is not None else {})}
    runner.report_training(result, args, dist, log, extra)
    if result.padding_fraction is not None:
        log(f"  padding: {result.padding_fraction:.1%} of the tokens trained")
    return runner.interrupted_status(result)


def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    return runner.run_main(prog, build_parser(prog), argv, PROGRAM, RUN_DEFINING, run, extra_errors=(ShardError,))


if __name__ == "__main__":
    sys.exit(main())
