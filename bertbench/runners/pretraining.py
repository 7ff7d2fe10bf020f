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
eval_results.txt/.json, and TensorBoard's event files (every evaluation's in eval/). Under torchrun each process
reads whole shards of its own (at least one per process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence

from bertbench.common.errors import UsageError
from bertbench.common.flags import setting
from bertbench.common.run_files import EVALS, RUN_RECORD
from bertbench.runners.config import RunnerConfig, RunnerSettings
from bertbench.runners.results import JsonSummary, report_eval, report_training
from bertbench.runners.run_directory import RunRecord
from bertbench.runners.skeleton import TaskData, TaskRunner, TrainingPlan
from bertbench.tasks.pretraining import (
    PretrainingBatches,
    ShardError,
    ShardLimits,
    accuracies,
    check_layout,
    check_shard,
    find_shards,
    parse_length_bins,
    prediction_counts,
    read_eval_set,
)
from bertbench.training.distributed import Distributed
from bertbench.training.events import EventLog, eval_events_dir, eval_scalars
from bertbench.training.loop import Estimator, PeriodicEvaluation
from bertbench.training.metrics import MetricsLog
from bertbench.training.state import CONTINUE, RunStart, logs_kept_through
from bertbench.training.stats import TrainResult

PROGRAM = "run_pretraining"
# MLPerf BERT's quality target: masked-LM accuracy on its 10,000 eval sequences.
MLPERF_TARGET_MLM_ACCURACY = 0.720
GOOGLE_MAX_EVAL_STEPS = 100  # Google's --max_eval_steps default: batches scored of --input_file


@dataclasses.dataclass(frozen=True)
class PretrainingSettings(RunnerSettings):
    """Pre-training: shards, phases and evaluation (Google's, NVIDIA's and MLPerf's flags)."""

    input_dir: str | None = setting(
        "Training shards: a directory (every .hdf5/.h5 under it, NVIDIA's --input_dir), a "
        "file, or comma-separated files and glob patterns (Google's --input_file).",
        None,
        aliases=("input_file",),
    )
    max_predictions_per_seq: int = setting(
        "Masked positions per sequence the shards were made with (20 at 128 tokens, 80 at 512).",
        20,
        positive=True,
        defines_run=True,
    )
    length_bins: str | None = setting(
        "Draw each batch from one length bin and cut it to the bin's edge, e.g. "
        "128,256,384,512 (the last must be --max_seq_length): less padding.",
        None,
        defines_run=True,
    )
    num_train_steps: int | None = setting(
        "Optimizer steps of this phase (NVIDIA's --max_steps).",
        None,
        aliases=("max_steps",),
        positive=True,
        defines_run=True,
    )
    num_warmup_steps: int | None = setting(
        "Warm-up steps (Google's); overrides --warmup_proportion.", None, defines_run=True
    )
    phase2: bool = setting(
        "Continue from phase 1: its weights, optimizer moments and step count, from --init_checkpoint (its run "
        "directory or checkpoint) or, given phase 1's own --output_dir (NVIDIA's way), in place, phase 1's results "
        "kept as phase1_*; warm-up and decay start anew.",
        False,
        defines_run=True,
    )
    phase1_end_step: int | None = setting(
        "The step phase 1 ended at (NVIDIA's flag): checked against the checkpoint "
        "(or a resumed phase 2's record), which says it anyway.",
        None,
    )
    do_eval: bool = setting(
        "Score --eval_dir after training (or the run's checkpoint without --do_train).", False, per_command=True
    )
    eval_dir: str | None = setting(
        "Evaluation shards (same forms as --input_dir). Without it, --do_eval scores "
        "the training shards, as Google's run_pretraining does (its first "
        "--max_eval_steps batches).",
        None,
    )
    eval_batch_size: int = setting("Sequences per evaluation batch.", 32, positive=True)
    num_eval_examples: int | None = setting(
        "Score the first N eval sequences only (MLPerf: 10000).", None, positive=True
    )
    max_eval_steps: int | None = setting(
        "Score the first N eval batches only (Google's flag; default "
        f"{GOOGLE_MAX_EVAL_STEPS} when --do_eval scores the training shards).",
        None,
        positive=True,
    )
    eval_iter_samples: int | None = setting(
        "Also evaluate during training, every this many training sequences (rounded up to whole steps).",
        None,
        positive=True,
    )
    eval_iter_start_samples: int | None = setting(
        "First evaluation after this many training sequences (default: --eval_iter_samples).", None, positive=True
    )
    target_mlm_accuracy: float | None = setting(
        "Stop training once masked-LM accuracy reaches this and report the "
        f"time to train (MLPerf: {MLPERF_TARGET_MLM_ACCURACY}).",
        None,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.do_train or self.do_eval):
            raise UsageError("at least one of --do_train or --do_eval must be true")
        if self.do_train and not self.input_dir:
            raise UsageError("--do_train needs --input_dir (or --input_file): the training shards")
        if self.do_train and self.num_train_steps is None:
            raise UsageError("--do_train needs --num_train_steps (or --max_steps)")
        if (self.eval_iter_samples or self.target_mlm_accuracy) and not self.eval_dir:
            raise UsageError("evaluation during training needs --eval_dir: the evaluation shards")
        if self.do_eval and not (self.eval_dir or self.input_dir):
            raise UsageError(
                "--do_eval needs --eval_dir, or --input_file (Google's run_pretraining scores its training shards)"
            )
        if self.target_mlm_accuracy is not None and not self.eval_iter_samples:
            raise UsageError(
                "--target_mlm_accuracy is checked at the evaluations during training: give --eval_iter_samples"
            )
        if self.phase2 and not self.init_checkpoint:
            raise UsageError(
                "--phase2 needs phase 1: --init_checkpoint=its run directory or checkpoint, or phase 1's own "
                "--output_dir to go on in"
            )
        if self.num_warmup_steps is not None and not 0 <= self.num_warmup_steps <= (self.num_train_steps or 0):
            raise UsageError(f"--num_warmup_steps must be 0..--num_train_steps, got {self.num_warmup_steps}")
        if self.target_mlm_accuracy is not None and not 0 < self.target_mlm_accuracy <= 1:
            raise UsageError(f"--target_mlm_accuracy must be in (0, 1], got {self.target_mlm_accuracy}")
        if self.max_predictions_per_seq >= self.max_seq_length:
            raise UsageError(
                f"--max_predictions_per_seq {self.max_predictions_per_seq} must be less than "
                f"--max_seq_length {self.max_seq_length}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainingData(TaskData):
    """The training stream (with --do_train) and the evaluation set, checked before anything is written; `scores`
    keeps the last evaluation by its step, so the final one is not scored twice."""

    batches: PretrainingBatches | None
    shards: int
    eval_features: dict | None
    scores: dict[int, dict] = dataclasses.field(default_factory=dict)


def score(settings: PretrainingSettings, estimator: Estimator, data: PretrainingData) -> dict:
    """Loss, accuracies and counts of the model as it is now (at estimator.global_step), each step scored once."""
    step = estimator.global_step
    if step not in data.scores:
        results = estimator.evaluate(
            data.eval_features, settings.eval_batch_size, metric_fn=accuracies, outputs=prediction_counts
        )
        del results["global_step"]
        results["eval_sequences"] = len(data.eval_features["input_ids"])
        data.scores.clear()
        data.scores[step] = results
    return data.scores[step]


class MlmEvaluation:
    """Scores the eval set during training, logs and records each evaluation (evals.jsonl, and the eval/ event files
    with --report_to tensorboard), and tells when the target is met."""

    def __init__(
        self,
        config: RunnerConfig,
        estimator: Estimator,
        data: PretrainingData,
        dist: Distributed,
        log,
        resume_step: int | None,
    ):
        self.settings, self.estimator, self.data, self.log = config.task, estimator, data, log
        self.global_batch = config.global_batch(dist.world_size)
        # Evaluations during training are logged; a resumed run keeps those up to its checkpoint (its events too:
        # the training log keeps those of eval/ up to it).
        logged = dist.is_main and self.settings.eval_iter_samples
        self.history = MetricsLog(os.path.join(config.run.model_dir, EVALS), resume_step, log) if logged else None
        self.events = (
            EventLog(eval_events_dir(config.run.events_dir), 0 if resume_step is None else resume_step + 1)
            if logged and config.run.reports_to_tensorboard
            else None
        )
        # Time to train runs from here (the model built, every shard checked) to the evaluation that meets the target.
        self.started = time.perf_counter()
        self.reached: dict | None = None

    def __call__(self, step: int) -> bool:
        results = score(self.settings, self.estimator, self.data)
        elapsed = time.perf_counter() - self.started
        record = {"step": step, "training_sequences": step * self.global_batch, "seconds": round(elapsed, 3), **results}
        if self.history is not None:
            self.history.write(record)
        if self.events is not None:
            self.events.write(step, eval_scalars(results))
        self.log(
            f"eval at step {step}: masked-LM accuracy {results['masked_lm_accuracy']:.4f}, next-sentence "
            f"accuracy {results['next_sentence_accuracy']:.4f}, loss {results['loss']:.4f}"
        )
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
        return {
            "target_mlm_accuracy": target,
            "target_reached": reached is not None,
            "time_to_train_seconds": reached["seconds"] if reached else None,
            "steps_to_target": reached["step"] if reached else None,
            "sequences_to_target": reached["training_sequences"] if reached else None,
        }

    def schedule(self, start_step: int) -> PeriodicEvaluation | None:
        """Every --eval_iter_samples training sequences (rounded up to whole steps) from this phase's start."""
        settings = self.settings
        if not settings.eval_iter_samples:
            return None
        every = math.ceil(settings.eval_iter_samples / self.global_batch)
        first = math.ceil((settings.eval_iter_start_samples or settings.eval_iter_samples) / self.global_batch)
        return PeriodicEvaluation(every_steps=every, run=self, first_step=start_step + first)


def phase_start_step(settings: PretrainingSettings, start: RunStart, record: RunRecord | None) -> int:
    """The step this phase's schedule starts at: 0, or where phase 1 ended: for a phase 2 that continues phase 1,
    its checkpoint's step; for one that resumes, the step its run record derived (or --phase1_end_step). Given,
    --phase1_end_step must agree."""
    if not (settings.phase2 and settings.do_train):
        return 0
    ended = start.step if start.kind == CONTINUE else record.derived.get("phase1_end_step") if record else None
    given = settings.phase1_end_step
    if ended is None and given is None:
        raise UsageError(
            f"{start.checkpoint}: a phase 2 run whose {RUN_RECORD} does not say where phase 1 ended; "
            "give --phase1_end_step"
        )
    if ended is not None and given is not None and given != ended:
        raise UsageError(f"{start.checkpoint}: phase 1 ended at step {ended}, not --phase1_end_step {given}")
    return given if ended is None else ended


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
        raise ShardError(
            f"{largest}: {sizes[largest]} sequences, the most of any training shard, fewer than "
            f"--train_batch_size {batch_size}: a batch is drawn from one shard; give a smaller "
            "--train_batch_size or larger shards"
        )


def check_shard_values(files: Sequence[str], limits: ShardLimits, dist: Distributed, log) -> None:
    """Every training shard's values (ids in the vocabulary, masked positions inside their sequences, ...), read
    once before anything is written, each process a share of the shards; the first bad one, on any process, is a
    ShardError on every process."""
    if not files:
        return
    started = time.perf_counter()
    problem = None
    for path in files[dist.rank :: dist.world_size]:
        try:
            check_shard(path, limits)
        except ShardError as error:
            problem = str(error)
            break
    problem = next((found for found in dist.all_gather_object(problem) if found), None)
    if problem:
        raise ShardError(problem)
    log(f"checked the values of {len(files)} training shard(s) in {time.perf_counter() - started:.1f} s")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PretrainingRunner(TaskRunner):
    """run_pretraining in the runners' skeleton (runners.skeleton.run_task): its data are shards streamed per rank
    rather than features in memory, it has no tokenizer, a phase 2 continues phase 1, and it evaluates during
    training and stops at a target."""

    def read(
        self, config: RunnerConfig, bert_config, tokenizer, dist: Distributed, log, cleanup: contextlib.ExitStack
    ) -> PretrainingData:
        """Every shard's layout and values and the whole eval set, checked before the model is built: a bad file
        must not surface hours into a run. The training stream is made here too: it checks that every process has
        a shard."""
        settings = config.task
        try:
            bins = parse_length_bins(settings.length_bins, settings.max_seq_length)
        except ValueError as error:
            raise UsageError(str(error)) from None
        limits = ShardLimits(
            settings.max_seq_length,
            settings.max_predictions_per_seq,
            bert_config.vocab_size,
            bert_config.type_vocab_size,
        )
        train_files = find_shards(settings.input_dir) if settings.do_train else []
        train_sizes = {path: check_layout(path, limits) for path in train_files}
        check_full_batch(train_sizes, settings.train_batch_size)
        eval_dir, eval_limit = eval_set(settings)
        eval_features = read_eval_set(find_shards(eval_dir), limits, eval_limit) if eval_dir else None
        if eval_dir != settings.eval_dir:
            log(
                f"note: --do_eval without --eval_dir scores the training shards ({eval_dir}), as Google's "
                f"run_pretraining does: their first {eval_limit} sequences"
            )
        check_shard_values(train_files, limits, dist, log)
        batches = None
        if settings.do_train:
            batches = PretrainingBatches(
                train_files, settings.train_batch_size, config.run.seed, limits, dist.rank, dist.world_size, bins
            )
            cleanup.callback(batches.close)
        return PretrainingData(
            num_train_sequences=sum(train_sizes.values()),
            batches=batches,
            shards=len(train_files),
            eval_features=eval_features,
        )

    def continues_phase(self, config: RunnerConfig) -> bool:
        return config.task.phase2  # its weights come with the rest of phase 1's state, through Estimator.train

    def earlier_phase_end(self, config: RunnerConfig, record: RunRecord | None) -> float | None:
        """Phase 2 in phase 1's own directory (NVIDIA's way): as it starts, every checkpoint there is phase 1's;
        resumed, those up to the step its record says phase 1 ended at."""
        if not config.task.phase2:
            return None
        if config.new_phase:
            return math.inf
        return record.derived.get("phase1_end_step") if record is not None else None

    def plan(
        self, config: RunnerConfig, data: PretrainingData, start: RunStart, record: RunRecord | None, dist: Distributed
    ) -> TrainingPlan:
        """This phase's steps, from where it starts; a warm-up given in steps is its share of them. A phase 2's
        start is recorded, so that resuming it keeps its step count without phase 1's directory."""
        settings = config.task
        start_step = phase_start_step(settings, start, record)
        warmup = (
            {}
            if settings.num_warmup_steps is None
            else {"warmup_proportion": settings.num_warmup_steps / settings.num_train_steps}
        )
        return TrainingPlan(
            start_step + settings.num_train_steps, warmup, {"phase1_end_step": start_step} if settings.phase2 else None
        )

    def train(
        self,
        config: RunnerConfig,
        estimator: Estimator,
        data: PretrainingData,
        start: RunStart,
        plan: TrainingPlan,
        dist: Distributed,
        log,
        summary: JsonSummary,
    ) -> TrainResult:
        """Train on the shards (resuming the run, or continuing phase 1) and write train_results.json; the figures
        NVIDIA's run_pretraining logs go to `summary`."""
        settings, train, batches = config.task, estimator.train_config, data.batches
        start_step = plan.num_train_steps - settings.num_train_steps
        evaluation = (
            MlmEvaluation(config, estimator, data, dist, log, logs_kept_through(start, config.run.model_dir))
            if data.eval_features is not None
            else None
        )
        log(
            f"***** Pre-training{' phase 2 from ' + start.checkpoint if start.kind == CONTINUE else ''}: "
            f"{data.shards} shards, {data.num_train_sequences:,} sequences of {settings.max_seq_length} tokens, "
            f"steps {start_step} to {train.num_train_steps}, batch {settings.train_batch_size} x "
            f"{train.gradient_accumulation_steps} x {dist.world_size} processes, {train.optimizer}, "
            f"{config.model.modeling} model, {train.precision} on {dist.device}"
            + (f", length bins {settings.length_bins}" if batches.length_bins else "")
            + " *****"
        )
        result = estimator.train(batches, start, evaluation=evaluation.schedule(start_step) if evaluation else None)
        extra = {
            "max_predictions_per_seq": settings.max_predictions_per_seq,
            "phase2": settings.phase2,
            "schedule_start_step": start_step,
            "training_shards": data.shards,
            "training_sequences": data.num_train_sequences,
            "length_bins": settings.length_bins,
            "sequences_left_out_in_partial_batches": sum(dist.all_gather_object(batches.dropped)),
            **(evaluation.summary() if evaluation is not None else {}),
        }
        report_training(result, config, estimator, dist, log, extra)
        if result.padding_fraction is not None:
            log(f"  padding: {result.padding_fraction:.1%} of the tokens trained")
        if result.steps:  # NVIDIA's raw time and rate leave out the start-up steps; here also saves and evaluations
            summary.log(
                [],
                {
                    "e2e_train_time": summary.elapsed(),
                    "training_sequences_per_second": result.steady_sentences_per_second or result.sentences_per_second,
                    "final_loss": result.final_loss,
                    "raw_train_time": result.seconds - result.checkpoint_seconds - result.evaluation_seconds,
                },
            )
        return result

    def infer(
        self, config: RunnerConfig, estimator: Estimator, data: PretrainingData, dist: Distributed, log
    ) -> dict[str, float]:
        """--do_eval: the evaluation at the last step (reused if one ran there during training)."""
        settings = config.task
        if settings.do_eval:
            results = {"global_step": estimator.global_step, **score(settings, estimator, data)}
            report_eval(
                config.run,
                f"pre-training, step {estimator.global_step}",
                results,
                {"eval_dir": settings.eval_dir or settings.input_dir},
                dist.is_main,
                log,
            )
        return {}


# NVIDIA's pre-training recipe: LAMB, polynomial decay with power 0.5. No independent workers: nothing chooses one.
SPEC = PretrainingRunner(
    name=PROGRAM,
    description=__doc__.splitlines()[0],
    settings=PretrainingSettings,
    omit=("sync_gradients",),
    defaults={"optimizer_type": "lamb", "optimizer": "lamb", "decay": "poly", "poly_power": 0.5},
    input_errors=(ShardError,),
    model_task="pretraining",
    phase_flag="phase2",
)


def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    return SPEC.main(argv, prog)


if __name__ == "__main__":
    sys.exit(main())
