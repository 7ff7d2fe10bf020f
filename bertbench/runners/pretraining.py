"""Pre-train BERT (masked LM + next sentence) on hdf5 shards in NVIDIA's layout (also `bertbench pretrain`).

Google's run_pretraining.py flags, with NVIDIA's and MLPerf's names where they have one:

    python -m bertbench.runners.pretraining --input_dir=$DATA/hdf5_seq128 --bert_config_file=bert_config.json \\
        --output_dir=results/phase1 --do_train --max_seq_length=128 --max_predictions_per_seq=20 \\
        --train_batch_size=64 --num_accumulation_steps=4 --num_train_steps=7038 --warmup_proportion=0.2843 \\
        --learning_rate=6e-3 --optimizer_type=lamb --precision=bf16
    python -m bertbench.runners.pretraining --phase2 --init_checkpoint=results/phase1 --input_dir=$DATA/hdf5_seq512 \\
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

import dataclasses
import datetime
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence

from bertbench.runners import command as runner
from bertbench.training.distributed import Distributed, job_from_environment
from bertbench.training.loop import Estimator, PeriodicEvaluation
from bertbench.common.flags import setting
from bertbench.training.progress import MetricsLog
from bertbench.tasks.pretraining import (PretrainingBatches, ShardError, ShardLimits, accuracies, check_layout,
                                         check_shard, find_shards, parse_length_bins, prediction_counts,
                                         read_eval_set)
from bertbench.training.state import CONTINUE, RESUME, RunStart

PROGRAM = "run_pretraining"
# MLPerf BERT's quality target: masked-LM accuracy on its 10,000 eval sequences.
MLPERF_TARGET_MLM_ACCURACY = 0.720
GOOGLE_MAX_EVAL_STEPS = 100  # Google's --max_eval_steps default: batches scored of --input_file


@dataclasses.dataclass(frozen=True)
class PretrainingSettings(runner.RunnerSettings):
    """Pre-training: shards, phases and evaluation (Google's, NVIDIA's and MLPerf's flags)."""

    input_dir: str | None = setting("Training shards: a directory (every .hdf5/.h5 under it, NVIDIA's --input_dir), a "
                                    "file, or comma-separated files and glob patterns (Google's --input_file).", None,
                                    aliases=("input_file",))
    max_predictions_per_seq: int = setting("Masked positions per sequence the shards were made with (20 at 128 "
                                           "tokens, 80 at 512).", 20, positive=True, defines_run=True)
    length_bins: str | None = setting("Draw each batch from one length bin and cut it to the bin's edge, e.g. "
                                      "128,256,384,512 (the last must be --max_seq_length): less padding.", None,
                                      defines_run=True)
    num_train_steps: int | None = setting("Optimizer steps of this phase (NVIDIA's --max_steps).", None,
                                          aliases=("max_steps",), positive=True, defines_run=True)
    num_warmup_steps: int | None = setting("Warm-up steps (Google's); overrides --warmup_proportion.", None,
                                           defines_run=True)
    phase2: bool = setting("Continue from phase 1: --init_checkpoint is its run directory or checkpoint, whose "
                           "weights, optimizer moments and step count this run starts from; warm-up and decay start "
                           "anew.", False, defines_run=True)
    phase1_end_step: int | None = setting("The step phase 1 ended at (NVIDIA's flag): checked against the checkpoint "
                                          "(or a resumed phase 2's record), which says it anyway.", None)
    do_eval: bool = setting("Score --eval_dir after training (or the run's checkpoint without --do_train).", False,
                            per_command=True)
    eval_dir: str | None = setting("Evaluation shards (same forms as --input_dir). Without it, --do_eval scores "
                                   "the training shards, as Google's run_pretraining does (its first "
                                   "--max_eval_steps batches).", None)
    eval_batch_size: int = setting("Sequences per evaluation batch.", 32, positive=True)
    num_eval_examples: int | None = setting("Score the first N eval sequences only (MLPerf: 10000).", None,
                                            positive=True)
    max_eval_steps: int | None = setting("Score the first N eval batches only (Google's flag; default "
                                         f"{GOOGLE_MAX_EVAL_STEPS} when --do_eval scores the training shards).", None,
                                         positive=True)
    eval_iter_samples: int | None = setting("Also evaluate during training, every this many training sequences "
                                            "(rounded up to whole steps).", None, positive=True)
    eval_iter_start_samples: int | None = setting("First evaluation after this many training sequences (default: "
                                                  "--eval_iter_samples).", None, positive=True)
    target_mlm_accuracy: float | None = setting("Stop training once masked-LM accuracy reaches this and report the "
                                                f"time to train (MLPerf: {MLPERF_TARGET_MLM_ACCURACY}).", None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.do_train or self.do_eval):
            raise runner.UsageError("at least one of --do_train or --do_eval must be true")
        if self.do_train and not self.input_dir:
            raise runner.UsageError("--do_train needs --input_dir (or --input_file): the training shards")
        if self.do_train and self.num_train_steps is None:
            raise runner.UsageError("--do_train needs --num_train_steps (or --max_steps)")
        if (self.eval_iter_samples or self.target_mlm_accuracy) and not self.eval_dir:
            raise runner.UsageError("evaluation during training needs --eval_dir: the evaluation shards")
        if self.do_eval and not (self.eval_dir or self.input_dir):
            raise runner.UsageError("--do_eval needs --eval_dir, or --input_file (Google's run_pretraining scores "
                                    "its training shards)")
        if self.target_mlm_accuracy is not None and not self.eval_iter_samples:
            raise runner.UsageError("--target_mlm_accuracy is checked at the evaluations during training: give "
                                    "--eval_iter_samples")
        if self.phase2 and not self.init_checkpoint:
            raise runner.UsageError("--phase2 needs --init_checkpoint: phase 1's run directory or checkpoint")
        if self.num_warmup_steps is not None and not 0 <= self.num_warmup_steps <= (self.num_train_steps or 0):
            raise runner.UsageError(f"--num_warmup_steps must be 0..--num_train_steps, got {self.num_warmup_steps}")
        if self.target_mlm_accuracy is not None and not 0 < self.target_mlm_accuracy <= 1:
            raise runner.UsageError(f"--target_mlm_accuracy must be in (0, 1], got {self.target_mlm_accuracy}")
        if self.max_predictions_per_seq >= self.max_seq_length:
            raise runner.UsageError(f"--max_predictions_per_seq {self.max_predictions_per_seq} must be less than "
                                    f"--max_seq_length {self.max_seq_length}")




class MlmEvaluation:
    """Scores the eval set, logs and records each evaluation, and tells when the target is met."""

    def __init__(self, command: runner.Command, estimator: Estimator, features, dist: Distributed, log,
                 resume_step: int | None):
        self.settings, self.estimator, self.features, self.log = command.settings, estimator, features, log
        self.global_batch = \
            command.settings.train_batch_size * command.train["gradient_accumulation_steps"] * dist.world_size
        # Evaluations during training are logged; a resumed run keeps those up to its checkpoint.
        self.history = MetricsLog(os.path.join(command.run.model_dir, "evals.jsonl"), resume_step, log) \
            if dist.is_main and self.settings.do_train and self.settings.eval_iter_samples else None
        # Time to train runs from here (the model built, every shard checked) to the evaluation that meets the target.
        self.started = time.perf_counter()
        self.last: tuple[int, dict] | None = None  # the step of the last evaluation and its scores
        self.reached: dict | None = None

    def score(self) -> dict:
        """Loss, accuracies and counts of the model as it is now (at estimator.global_step)."""
        if self.last is not None and self.last[0] == self.estimator.global_step:
            return self.last[1]
        results = self.estimator.evaluate(self.features, self.settings.eval_batch_size, metric_fn=accuracies,
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
        target = self.settings.target_mlm_accuracy
        if target is not None and self.reached is None and results["masked_lm_accuracy"] >= target:
            self.reached = record
            self.log(f"target masked-LM accuracy {target} reached at step {step} after {elapsed:.1f} s")
            return True
        return False

    def summary(self) -> dict:
        target = self.settings.target_mlm_accuracy
        if target is None:
            return {}
        reached = self.reached
        return {"target_mlm_accuracy": target, "target_reached": reached is not None,
                "time_to_train_seconds": reached["seconds"] if reached else None,
                "steps_to_target": reached["step"] if reached else None,
                "sequences_to_target": reached["training_sequences"] if reached else None}


def phase_start_step(settings: PretrainingSettings, start: RunStart, record: runner.RunRecord | None) -> int:
    """The step this phase's schedule starts at: 0, or where phase 1 ended: for a phase 2 that continues phase 1,
    its checkpoint's step; for one that resumes, the step its run record derived (or --phase1_end_step). Given,
    --phase1_end_step must agree."""
    if not (settings.phase2 and settings.do_train):
        return 0
    ended = start.step if start.kind == CONTINUE else record.derived.get("phase1_end_step") if record else None
    given = settings.phase1_end_step
    if ended is None and given is None:
        raise runner.UsageError(f"{start.checkpoint}: a phase 2 run whose {runner.RUN_RECORD} does not say where phase "
                                "1 ended; give --phase1_end_step")
    if ended is not None and given is not None and given != ended:
        raise runner.UsageError(f"{start.checkpoint}: phase 1 ended at step {ended}, not --phase1_end_step {given}")
    return given if ended is None else ended


def evaluation_schedule(settings: PretrainingSettings, evaluation: MlmEvaluation, start_step: int
                        ) -> PeriodicEvaluation | None:
    if not settings.eval_iter_samples:
        return None
    every = math.ceil(settings.eval_iter_samples / evaluation.global_batch)
    first = math.ceil((settings.eval_iter_start_samples or settings.eval_iter_samples) / evaluation.global_batch)
    return PeriodicEvaluation(every_steps=every, run=evaluation, first_step=start_step + first)


# Pre-training keeps its own run() beside runner.fine_tune, on the same parts (parse, record, build_model,
# build_estimator, report_training): its data are shards streamed per rank rather than features in memory, it has no
# tokenizer, a phase 2 continues phase 1, and it evaluates during training and stops at a target. Hooks for each of
# those in the fine-tuning skeleton would make that skeleton harder to read than this function.
def run(command: runner.Command, record: runner.RunRecord | None) -> int:
    settings = command.settings
    summary = runner.JsonSummary(command)  # NVIDIA's e2e_train_time runs from the command's start
    config = runner.load_config(settings)
    try:
        bins = parse_length_bins(settings.length_bins, settings.max_seq_length)
    except ValueError as error:
        raise runner.UsageError(str(error)) from None
    limits = ShardLimits(settings.max_seq_length, settings.max_predictions_per_seq, config.vocab_size,
                         config.type_vocab_size)
    # Every shard's layout and the whole eval set are checked before the model is built: a bad file must not
    # surface hours into a run.
    train_files = find_shards(settings.input_dir) if settings.do_train else []
    train_sizes = {path: check_layout(path, limits) for path in train_files}
    check_full_batch(train_sizes, settings.train_batch_size)
    eval_dir, eval_limit = eval_set(settings)
    eval_features = read_eval_set(find_shards(eval_dir), limits, eval_limit) if eval_dir else None

    with job_from_environment(settings.device) as dist:
        runner.check_record(record, config, command, dist)
        log = runner.main_process_log(dist)
        runner.log_notes(command, log)
        if eval_dir != settings.eval_dir:
            log(f"note: --do_eval without --eval_dir scores the training shards ({eval_dir}), as Google's "
                f"run_pretraining does: their first {eval_limit} sequences")
        check_shard_values(train_files, limits, dist, log)
        # Made before the run directory is touched: they check that every process has a shard.
        batches = PretrainingBatches(train_files, settings.train_batch_size, command.run.seed, limits, dist.rank,
                                     dist.world_size, bins) if settings.do_train else None
        try:
            with runner.hold_run_directory(command, record, dist, log):
                return run_in_directory(command, record, config, dist, log, batches, sum(train_sizes.values()),
                                        eval_features, summary)
        finally:
            if batches is not None:
                batches.close()


def eval_set(settings: PretrainingSettings) -> tuple[str | None, int | None]:
    """The evaluation shards and how many of their sequences to score: --eval_dir's, or (--do_eval alone) the
    training shards', Google's --max_eval_steps batches of them."""
    if settings.eval_dir:
        steps = settings.max_eval_steps
    elif settings.do_eval:
        steps = settings.max_eval_steps or GOOGLE_MAX_EVAL_STEPS
    else:
        return None, None
    limit = settings.num_eval_examples or (steps * settings.eval_batch_size if steps else None)
    return settings.eval_dir or settings.input_dir, limit


def check_full_batch(sizes: Mapping[str, int], batch_size: int) -> None:
    """A batch is drawn from one shard (PretrainingBatches): shards that all hold fewer sequences than a batch would
    stop the run at its first step."""
    largest = max(sizes, key=sizes.get, default=None)
    if largest is not None and sizes[largest] < batch_size:
        raise ShardError(f"{largest}: {sizes[largest]} sequences, the most of any training shard, fewer than "
                         f"--train_batch_size {batch_size}: a batch is drawn from one shard; give a smaller "
                         "--train_batch_size or larger shards")


def check_shard_values(files: Sequence[str], limits: ShardLimits, dist: Distributed, log) -> None:
    """Every training shard's values (ids in the vocabulary, masked positions inside their sequences, ...), read
    once before anything is written, each process a share of the shards; the first bad one, on any process, is a
    ShardError on every process."""
    if not files:
        return
    started = time.perf_counter()
    problem = None
    for path in files[dist.rank::dist.world_size]:
        try:
            check_shard(path, limits)
        except ShardError as error:
            problem = str(error)
            break
    problem = next((found for found in dist.all_gather_object(problem) if found), None)
    if problem:
        raise ShardError(problem)
    log(f"checked the values of {len(files)} training shard(s) in {time.perf_counter() - started:.1f} s")


def run_in_directory(command: runner.Command, record: runner.RunRecord | None, config, dist: Distributed, log,
                     batches: PretrainingBatches | None, train_sequences: int, eval_features,
                     summary: runner.JsonSummary) -> int:
    """run()'s part inside the run directory: where the run starts, training, the final evaluation."""
    settings = command.settings
    # Phase 2's weights come with the rest of phase 1's state, through Estimator.train.
    model, start = runner.build_model(command, "pretraining", config, dist, log,
                                      continue_phase=settings.phase2 and settings.do_train)
    start_step = phase_start_step(settings, start, record)
    # A warm-up given in steps is this phase's share of them.
    warmup = {} if settings.num_warmup_steps is None or not settings.do_train else \
        {"warmup_proportion": settings.num_warmup_steps / settings.num_train_steps}
    estimator = runner.build_estimator(command, model, dist,
                                       start_step + settings.num_train_steps if settings.do_train else None,
                                       **warmup)
    runner.remove_leftovers(command, dist, log)
    evaluation = MlmEvaluation(command, estimator, eval_features, dist, log,
                               start.step if start.kind == RESUME else None) if eval_features is not None else None
    if settings.do_train:
        # Recorded, so that a resumed phase 2 keeps its step count without phase 1's directory.
        runner.write_record(record, PROGRAM, command, config, dist,
                            {"phase1_end_step": start_step} if settings.phase2 else None)
        status = train(command, dist, estimator, batches, train_sequences, start, start_step,
                       evaluation, log, summary)
        if status is not None:
            return status
    else:
        runner.restore_for_inference(estimator, start)
    if settings.do_eval:  # the evaluation at the last step, if one ran there
        results = {"global_step": estimator.global_step, **evaluation.score()}
        runner.report_eval(command.run.model_dir, f"pre-training, step {estimator.global_step}", results,
                           {"eval_dir": settings.eval_dir or settings.input_dir}, dist.is_main, log)
    summary.write(dist.is_main)
    return 0


def train(command: runner.Command, dist: Distributed, estimator: Estimator, batches: PretrainingBatches,
          sequences: int, start: RunStart, start_step: int, evaluation: MlmEvaluation | None, log,
          summary: runner.JsonSummary) -> int | None:
    """Train on the shards (resuming the run, or continuing phase 1) and write train_results.json; the figures
    NVIDIA's run_pretraining logs go to `summary`."""
    settings, config = command.settings, estimator.train_config
    periodic = evaluation_schedule(settings, evaluation, start_step) if evaluation is not None else None
    log(f"***** Pre-training{' phase 2 from ' + start.checkpoint if start.kind == CONTINUE else ''}: "
        f"{len(batches.files)} shards, {sequences:,} sequences of {settings.max_seq_length} tokens, steps "
        f"{start_step} to {config.num_train_steps}, batch {settings.train_batch_size} x "
        f"{config.gradient_accumulation_steps} x {dist.world_size} processes, {config.optimizer}, "
        f"{command.flags.modeling} model, {config.precision} on {dist.device}"
        + (f", length bins {settings.length_bins}" if batches.length_bins else "") + " *****")
    result = estimator.train(batches, start, evaluation=periodic)
    extra = {"max_predictions_per_seq": settings.max_predictions_per_seq, "phase2": settings.phase2,
             "schedule_start_step": start_step, "training_shards": len(batches.files), "training_sequences": sequences,
             "length_bins": settings.length_bins,
             "sequences_left_out_in_partial_batches": sum(dist.all_gather_object(batches.dropped)),
             **(evaluation.summary() if evaluation is not None else {})}
    runner.report_training(result, command, estimator, dist, log, extra)
    if result.padding_fraction is not None:
        log(f"  padding: {result.padding_fraction:.1%} of the tokens trained")
    if result.steps:  # NVIDIA's raw time and rate leave out the start-up steps; here also saves and evaluations
        summary.log([], {"e2e_train_time": (datetime.datetime.now() - summary.started).total_seconds(),
                         "training_sequences_per_second": result.steady_sentences_per_second
                         or result.sentences_per_second, "final_loss": result.final_loss,
                         "raw_train_time": result.seconds - result.checkpoint_seconds - result.evaluation_seconds})
    return runner.interrupted_status(result)


# NVIDIA's pre-training recipe: LAMB, polynomial decay with power 0.5. No independent workers: nothing chooses one.
SPEC = runner.RunnerSpec(name=PROGRAM, description=__doc__.splitlines()[0], settings=PretrainingSettings,
                         omit=("sync_gradients",), defaults={"optimizer_type": "lamb", "decay": "poly",
                                                             "poly_power": 0.5},
                         input_errors=(ShardError,), run=run)


def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    return runner.run_main(SPEC, argv, prog)


if __name__ == "__main__":
    sys.exit(main())
