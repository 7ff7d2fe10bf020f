"""Estimator: the training loop, shaped like tf.estimator, for any model whose forward returns `.loss`.

The Estimator is the interface (train / evaluate / predict, restore, keep_best_worker); each part of a `train` call has
its own name here: restore_training (where it starts: a fresh run, a resumed one, an earlier phase continued),
TrainingLoop (the steps and when they stop), TrainingLog (metrics.jsonl records, TensorBoard's events, log lines and the
progress bar) and CheckpointSaving (when it saves and what a save carries). The step is training.step.TrainStep, where a
run starts is training.state.decide_start, the checkpointed state is training.state.TrainingCheckpoints, the figures are
training.stats.LoopStats', the signal handlers common.signals.StopSignals, and evaluate / predict run
training.inference.run_inference.

- `train` resumes from the newest checkpoint in `model_dir` when there is one (as tf.estimator does), saves on a
  wall-clock timer and/or every N steps, and on SIGTERM/SIGINT saves at the next step boundary and returns; with a
  time budget (`max_train_seconds`) it saves and returns once the budget is spent.
- A checkpoint holds all that an exact resume needs: weights, optimizer, LR schedule, loss scaler, step, position in
  the data order and every RNG state (of every rank). On the CPU a resumed run ends with bit-identical weights.
- Precision fp32, fp16 (autocast + dynamic loss scaling; a step whose gradients overflow is skipped, counted and
  logged, and does not advance the step, as in NVIDIA's BERT), bf16 (autocast); `compile` is torch.compile.
- Gradient accumulation, global-norm clipping, AdamW or LAMB, warm-up then linear or polynomial decay.
- Under torchrun: DistributedDataParallel (gradients all-reduced once per optimizer step), or independent workers
  (`sync_gradients=False`: no all-reduce, each rank trains its own copy on its shard, its own checkpoints in
  worker-<rank>/; `keep_best_worker` then keeps the best). Logged losses are means over the ranks.
- `evaluate` / `predict` run the model over in-memory features in order; under torchrun each rank takes a
  contiguous shard and the outputs are gathered, so every example counts exactly once.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from bertbench.common import run_files
from bertbench.common.signals import StopSignals
from bertbench.model.config import BertConfig
from bertbench.model.flops import batch_train_flops
from bertbench.training.batches import TrainBatches
from bertbench.training.checkpoint import (
    CheckpointError,
    SaveTrigger,
    checkpoint_step,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.training.devices import data_sheet_peak_flops, peak_memory_bytes
from bertbench.training.distributed import Distributed
from bertbench.training.events import EventLog, eval_events_dir, keep_events, training_scalars
from bertbench.training.inference import Outputs, run_inference
from bertbench.training.metrics import MetricsLog
from bertbench.training.progress import ProgressDisplay
from bertbench.training.progress import log as log_line
from bertbench.training.state import (
    CONTINUE,
    RESUME,
    RunStart,
    TrainingCheckpoints,
    decide_start,
    load_weights,
    logs_kept_through,
    read_training_state,
    seed_everything,
    trains_independently,
)
from bertbench.training.stats import LoopStats, TrainResult
from bertbench.training.step import TrainStep


@dataclass
class PeriodicEvaluation:
    """Evaluation during training (MLPerf's way): `run(step)` every `every_steps` optimizer steps from
    `first_step` on, and at the last step; it returns True to stop training there (a target met)."""

    every_steps: int
    run: Callable[[int], bool]
    first_step: int | None = None  # default: every_steps

    def __post_init__(self) -> None:
        if self.every_steps < 1:
            raise ValueError(f"every_steps must be at least 1, got {self.every_steps}")

    def due(self, step: int, finished: bool) -> bool:
        first = self.every_steps if self.first_step is None else self.first_step
        return finished or (step >= first and (step - first) % self.every_steps == 0)


class TrainingDivergedError(RuntimeError):
    """The loss became inf or NaN (fp32/bf16), or fp16 kept overflowing however small the loss scale."""


# fp16 overflows this many steps in a row means the loss scale cannot save the run: stop rather than spin.
MAX_CONSECUTIVE_SKIPPED_STEPS = 64


class Estimator:
    """Trains, evaluates and predicts with `model`: model(**batch) returns an object with `.loss` (when the batch
    holds labels) and the output fields `predict` collects (`logits`, `start_logits`, ...)."""

    def __init__(
        self,
        model: nn.Module,
        run_config: RunConfig,
        train_config: TrainConfig | None = None,
        dist: Distributed | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.dist = dist or Distributed()
        self.device = self.dist.device
        self.model = model.to(self.device)
        self.run_config, self.train_config = run_config, train_config
        self.global_step = 0  # the loop advances it step by step: an evaluation during training reads it
        # False once independent workers have trained apart: inference must then not be split across ranks.
        self._same_weights_on_every_rank = True
        self._log = log if log is not None else log_line

    def log(self, line: str) -> None:
        if self.dist.is_main:
            self._log(line)

    @property
    def independent_workers(self) -> bool:
        """Several processes training without all-reduce (TrainConfig.sync_gradients False)."""
        return trains_independently(self.train_config, self.dist)

    @property
    def model_flops(self) -> Callable[[Mapping[str, torch.Tensor]], int] | None:
        """Model FLOPs of training on a batch (model.flops), for a model with a BERT config; None for another."""
        config = getattr(self.model, "config", None)
        return functools.partial(batch_train_flops, config) if isinstance(config, BertConfig) else None

    @property
    def precision(self) -> str:
        """What the forwards compute in: the training config's precision, fp32 without one."""
        return self.train_config.precision if self.train_config else "fp32"

    def decide_start(
        self, init_checkpoint: str | None = None, continue_phase: bool = False, training: bool = True
    ) -> RunStart:
        """Where this run starts (see training.state.decide_start), for this model directory and process group."""
        return decide_start(
            self.run_config.model_dir,
            training=training,
            init_checkpoint=init_checkpoint,
            continue_phase=continue_phase,
            dist=self.dist,
            independent_workers=training and self.independent_workers,
            log=self.log,
        )

    def restore(self, path: str | None = None, verify: bool = True) -> str | None:
        """Load the weights (only) of checkpoint `path`, or of the newest one in model_dir; None if there is none.
        `verify=False` for a file decide_start has just verified."""
        path = path or latest_checkpoint(self.run_config.model_dir)
        if path is None:
            return None
        state = load_checkpoint(path, verify=verify)
        load_weights(self.model, path, state)
        self.global_step = state["step"]
        return path

    def keep_best_worker(self, score: Callable[[], float]) -> tuple[int, list[float]]:
        """After independent workers have trained: every rank scores its own model with `score()` (higher is
        better, NaN worst; e.g. its dev accuracy), the best rank's weights (the lowest rank on a tie) replace every
        rank's, and rank 0 saves them as model_dir's checkpoint of this step, the one evaluation and `restore` read.
        Returns (best rank, every rank's score)."""
        scores = [float(value) for value in self.dist.all_gather_object(float(score()))]
        ranking = [-math.inf if math.isnan(score) else score for score in scores]
        best = max(range(len(scores)), key=lambda rank: (ranking[rank], -rank))
        self.dist.broadcast_module(self.model, best)
        self._same_weights_on_every_rank = True
        if self.dist.is_main:
            save_checkpoint(
                self.run_config.model_dir,
                self.global_step,
                {"model": self.model.state_dict(), "selected_worker": best, "worker_scores": scores},
                self.run_config.keep_checkpoint_max,
            )
        self.dist.barrier()
        return best, scores

    def train(
        self, batches: TrainBatches, start: RunStart | None = None, evaluation: PeriodicEvaluation | None = None
    ) -> TrainResult:
        """Train to `train_config.num_train_steps` from `start` (default: decide_start(), which resumes model_dir's
        newest checkpoint if any). A CONTINUE start takes an earlier phase's weights, optimizer moments and step
        count, with the warm-up and decay starting anew at its step, as NVIDIA's phase 2 continues phase 1.
        evaluation: evaluate during training, and stop when it says so (a target met)."""
        if self.train_config is None or self.train_config.num_train_steps is None:
            raise ValueError("train needs a TrainConfig with its num_train_steps")
        start = start or self.decide_start()
        step, checkpoints, begun = restore_training(
            start,
            self.model,
            self.train_config,
            self.run_config,
            batches,
            self.dist,
            self.independent_workers,
            self.log,
        )
        self.global_step = begun.step
        if self.independent_workers:
            self._same_weights_on_every_rank = False
        return TrainingLoop(self, step, checkpoints, batches, evaluation, begun).run()

    def predict(
        self, features: Mapping[str, torch.Tensor], batch_size: int, outputs: Outputs = ("logits",)
    ) -> dict[str, torch.Tensor]:
        """The model's `outputs` for every example, in order, as float32 CPU tensors, on every rank; `outputs` may
        instead be a function (model output, batch) -> {name: per-example tensor}, collected as it returns them
        (to keep a per-example figure instead of large logits)."""
        return self._infer(features, batch_size, outputs, with_loss=False)[0]

    def evaluate(
        self,
        features: Mapping[str, torch.Tensor],
        batch_size: int,
        metric_fn: Callable[[dict[str, torch.Tensor]], dict[str, float]] | None = None,
        outputs: Outputs = ("logits",),
    ) -> dict[str, float]:
        """{"loss": mean loss, "global_step": ..., **metric_fn(outputs)} over labelled `features`."""
        predictions, loss = self._infer(features, batch_size, outputs, with_loss=True)
        result = {"loss": loss, "global_step": self.global_step}
        if metric_fn is not None:
            result.update(metric_fn(predictions))
        return result

    def _infer(
        self, features: Mapping[str, torch.Tensor], batch_size: int, outputs: Outputs, with_loss: bool
    ) -> tuple[dict[str, torch.Tensor], float | None]:
        # With the same weights everywhere, each rank computes a contiguous shard; after independent training
        # each rank must see every example through its own model.
        return run_inference(
            self.model,
            features,
            batch_size,
            outputs,
            with_loss=with_loss,
            dist=self.dist,
            device=self.device,
            precision=self.precision,
            sharded=self.dist.enabled and self._same_weights_on_every_rank,
        )


@dataclass
class TrainingStart:
    """Where a `train` call's loop begins: its step, and what a resumed run brings from its checkpoint."""

    step: int
    skipped_steps: int = 0  # fp16 steps skipped so far in the run
    resumed_from: str | None = None  # the checkpoint resumed (RESUME starts only)
    restore_seconds: float = 0.0  # reading and restoring it
    segments: list[dict[str, Any]] = field(default_factory=list)  # the earlier invocations' figures
    log_window: dict[str, Any] | None = None  # the log window open when it was saved
    keeps_logs: bool = False  # the run's logs up to `step` are its history (a resume, a phase going on in place)


def restore_training(
    start: RunStart,
    model: nn.Module,
    config: TrainConfig,
    run: RunConfig,
    batches: TrainBatches,
    dist: Distributed,
    independent_workers: bool,
    log: Callable[[str], None],
) -> tuple[TrainStep, TrainingCheckpoints, TrainingStart]:
    """The step and checkpoints of a `train` call, with every state `start` brings restored: a RESUME start's whole
    training state (weights, optimizer, schedule, data position, RNGs, figures), a CONTINUE start's weights,
    optimizer moments and step count (an earlier phase's), nothing but the seed for a fresh run."""
    if start.kind == CONTINUE and start.step >= config.num_train_steps:
        raise CheckpointError(
            f"{start.checkpoint}: that run ended at step {start.step}; this one must go past "
            f"it, but num_train_steps is {config.num_train_steps}"
        )
    started = time.perf_counter()
    state = read_training_state(start)
    reading_seconds = time.perf_counter() - started  # the restore's time: reading and restoring, not building
    schedule_start = (
        state.get("schedule_start_step", 0) if start.kind == RESUME else start.step if start.kind == CONTINUE else 0
    )
    step = TrainStep(model, config, dist, schedule_start)
    checkpoints = TrainingCheckpoints(
        run.model_dir, run.keep_checkpoint_max, model, step, batches, dist, independent_workers, log
    )
    if start.kind != RESUME:
        seed_everything(run.seed + dist.rank)
        begun = TrainingStart(
            checkpoints.continue_phase(start.checkpoint, state) if start.kind == CONTINUE else 0,
            keeps_logs=logs_kept_through(start, run.model_dir) is not None,
        )
        return step, checkpoints, begun
    segments = list(state.get("segments", []))  # the earlier invocations' figures, up to this checkpoint
    started = time.perf_counter()
    restored = checkpoints.restore(start.checkpoint, state, run.seed)
    begun = TrainingStart(
        restored.step,
        restored.skipped_steps,
        start.checkpoint,
        reading_seconds + time.perf_counter() - started,
        segments,
        restored.log_window,
        keeps_logs=True,
    )
    log(
        f"resumed from {begun.resumed_from} (step {begun.step}, epoch {batches.epoch:.2f}) in "
        f"{begun.restore_seconds:.2f} s"
    )
    if begun.step >= config.num_train_steps:
        checkpoints.prune(begun.step)
    return step, checkpoints, begun


class TrainingLoop:
    """One `train` call's steps, until num_train_steps, a stop signal (saved at the step boundary), the time budget
    or a target met; an evaluation when due, a log window on the log steps (TrainingLog), a checkpoint on the timer
    and at the end (CheckpointSaving). It advances the estimator's global_step, and says how the call ended."""

    def __init__(
        self,
        estimator: Estimator,
        step: TrainStep,
        checkpoints: TrainingCheckpoints,
        batches: TrainBatches,
        evaluation: PeriodicEvaluation | None,
        begun: TrainingStart,
    ):
        self.estimator, self.step, self.batches, self.evaluation = estimator, step, batches, evaluation
        self.begun = begun
        config, run, dist = estimator.train_config, estimator.run_config, estimator.dist
        self.config, self.skipped = config, begun.skipped_steps
        estimator.model.train()
        if dist.is_main:
            os.makedirs(run.model_dir, exist_ok=True)
        self.log = TrainingLog(run, config, estimator.global_step, begun, dist, estimator.device, estimator.log)
        self.saving = CheckpointSaving(checkpoints, run, estimator.global_step, begun.resumed_from, begun.segments)
        self.stats = LoopStats(
            start_step=estimator.global_step,
            num_train_steps=config.num_train_steps,
            excluded_steps=config.excluded_steps,
            max_train_seconds=config.max_train_seconds,
            world_size=dist.world_size,
            device=estimator.device,
            mean_over_ranks=dist.mean,
            model_flops=estimator.model_flops,
        )
        if begun.log_window:
            self.stats.resume_window(begun.log_window)
        self.compiling = config.compile and estimator.global_step < config.num_train_steps
        if self.compiling and estimator.device.type == "cpu":
            estimator.log(
                "note: torch.compile on a CPU takes minutes before the first step, and on this project's "
                "CPU it made training no faster (docs/results/cpu-2core/compile); --use_xla=false trains "
                "eagerly"
            )

    def run(self) -> TrainResult:
        estimator, config, stats = self.estimator, self.config, self.stats
        counted = stats.counted(self.batches)
        out_of_time = target_reached = False
        with StopSignals() as signals:
            while estimator.global_step < config.num_train_steps:
                outcome = self._take_step(counted)
                finished = estimator.global_step >= config.num_train_steps
                if (
                    self.evaluation is not None
                    and not outcome.skipped
                    and self.evaluation.due(estimator.global_step, finished)
                ):
                    with stats.pause(save=False):
                        target_reached = self.evaluation.run(estimator.global_step)
                # Ranks must stop and save at the same step: each decision is OR-ed over them. The time budget is
                # rank 0's clock alone, the one that times the run's figures, so a run the budget ended never
                # reports fewer train seconds than the budget (another rank's loop may have started earlier).
                stop, save_due, out_of_time = estimator.dist.any(
                    signals.received is not None,
                    self.saving.due(estimator.global_step),
                    estimator.dist.is_main and stats.budget_spent(),
                )
                # The last step is logged too, so a run shorter than log_step_count_steps has its line.
                ending = finished or stop or out_of_time or target_reached
                on_interval = estimator.global_step % estimator.run_config.log_step_count_steps == 0
                if not outcome.skipped and (on_interval or ending):
                    # A window cut short by a stop stays open, for the checkpoint: a resumed run's log then reads
                    # as the uninterrupted run's.
                    self.log.report(
                        estimator.global_step,
                        stats.take_window(close=on_interval or finished),
                        outcome.learning_rate,
                        self.step,
                        self.batches.epoch,
                        self.skipped,
                        self.saving.last_checkpoint,
                    )
                else:
                    self.log.progress(estimator.global_step, stats)
                if ending or save_due:
                    # The last save says how this segment ended.
                    ended = (
                        "finished"
                        if finished
                        else signals.received
                        if stop
                        else "target reached"
                        if target_reached
                        else "time budget"
                        if out_of_time
                        else None
                    )
                    self.saving.save(estimator.global_step, self.skipped, stats, ended)
                if stop or out_of_time or target_reached:
                    break
        self.log.close()
        # A signal in the last step (or during its save) stops the command too: saved, it ends with 143 like any other.
        interrupted = signals.received
        budget_exhausted = estimator.global_step < config.num_train_steps and out_of_time and not interrupted
        self._say_how_it_ended(interrupted, budget_exhausted, target_reached)
        return stats.result(
            global_step=estimator.global_step,
            epoch=self.batches.epoch,
            resumed_from=self.begun.resumed_from,
            restore_seconds=self.begun.restore_seconds,
            interrupted=interrupted,
            budget_exhausted=budget_exhausted,
            target_reached=target_reached,
            skipped=self.skipped,
            last_checkpoint=self.saving.last_checkpoint,
            segments=self.saving.segments,
            execution=self.step.execution(),
        )

    def _take_step(self, counted):
        """One optimizer step (or an fp16 step skipped for overflow), counted; the first one's compilation told."""
        estimator = self.estimator
        if self.compiling:
            estimator.log(f"step {estimator.global_step + 1}: compiling the model (torch.compile) ...")
            compile_started = time.perf_counter()
        outcome = self.step(counted)
        if self.compiling:
            estimator.log(
                f"step {estimator.global_step + 1}: compiled and trained in "
                f"{time.perf_counter() - compile_started:.1f} s"
            )
            self.compiling = False
        self.skipped += outcome.skipped
        estimator.global_step += not outcome.skipped
        self.stats.after_step(outcome.loss, outcome.grad_norm, outcome.skipped)
        if self.stats.consecutive_skipped >= MAX_CONSECUTIVE_SKIPPED_STEPS:
            raise TrainingDivergedError(
                f"{self.stats.consecutive_skipped} fp16 steps in a row overflowed (loss "
                f"scale now {self.step.scaler.get_scale():g}); the last checkpoint is "
                f"{self.saving.last_checkpoint}"
            )
        return outcome

    def _say_how_it_ended(self, interrupted: str | None, budget_exhausted: bool, target_reached: bool) -> None:
        global_step, num_train_steps = self.estimator.global_step, self.config.num_train_steps
        last_checkpoint, log = self.saving.last_checkpoint, self.estimator.log
        if target_reached and global_step < num_train_steps:
            log(
                f"target reached at step {global_step}/{num_train_steps}: training stops, the model saved as "
                f"{last_checkpoint}"
            )
        if interrupted:
            log(
                f"stopped by {interrupted} at step {global_step}; the checkpoint {last_checkpoint} resumes it: run the "
                "same command again"
            )
        elif budget_exhausted:
            log(
                f"time budget of {self.config.max_train_seconds:g} s reached at step {global_step}/{num_train_steps}: "
                f"training stops with the model of step {global_step}, saved as {last_checkpoint}"
            )


class TrainingLog:
    """What a `train` call tells, on the main rank: a metrics.jsonl record, its scalars in TensorBoard's event file
    (RunConfig.report_to) and a log line per log window, and the progress bar between them. A resumed run's
    metrics.jsonl and event files (training's, and the evaluations' in eval/) keep what came up to its checkpoint;
    a fresh run's start afresh. MFU is the model FLOP/s over the devices' data-sheet peak: on a known GPU only."""

    def __init__(
        self,
        run: RunConfig,
        config: TrainConfig,
        global_step: int,
        begun: TrainingStart,
        dist: Distributed,
        device: torch.device,
        log: Callable[[str], None],
    ):
        self.config, self.device, self.log = config, device, log
        # A checkpoint saved between log steps holds the open window; a record its stop wrote at that step closed
        # the window early and goes, for the resumed run logs the whole window at the next log step.
        keep_through = global_step - 1 if begun.log_window and begun.log_window["steps"] else global_step
        resumed = begun.keeps_logs  # a resume, or a phase going on in its earlier phase's directory
        self.metrics = (
            MetricsLog(os.path.join(run.model_dir, run_files.METRICS), keep_through if resumed else None, log)
            if dist.is_main
            else None
        )
        self.events = None
        if dist.is_main and run.reports_to_tensorboard:
            keep_events(run.events_dir, keep_through if resumed else None, log)
            keep_events(eval_events_dir(run.events_dir), global_step if resumed else None, log)
            self.events = EventLog(run.events_dir, keep_through + 1 if resumed else 0)
        peak = data_sheet_peak_flops(device, config.precision)
        self.peak_flops = None if peak is None else peak[0] * dist.world_size
        self.display = ProgressDisplay(config.num_train_steps, global_step, enabled=None if dist.is_main else False)

    def report(
        self,
        global_step: int,
        window: dict[str, Any],
        learning_rate: float,
        step: TrainStep,
        epoch: float,
        skipped: int,
        last_checkpoint: str | None,
    ) -> None:
        """A log window's record and line; a non-finite loss outside fp16 (whose scaler skips such steps) is a
        diverged run."""
        if not math.isfinite(window["loss"]) and self.config.precision != "fp16":
            raise TrainingDivergedError(
                f"loss is {window['loss']} at step {global_step}; the last checkpoint is {last_checkpoint}"
            )
        record = {
            "step": global_step,
            "epoch": round(epoch, 4),
            **window,
            "lr": learning_rate,
            "mfu": (
                window["model_tflops_per_s"] * 1e12 / self.peak_flops
                if self.peak_flops and window["model_tflops_per_s"] is not None
                else None
            ),
            "skipped_steps": skipped,
            "loss_scale": step.scaler.get_scale() if step.scaler.is_enabled() else None,
            "memory_bytes": peak_memory_bytes(self.device),
            # The run's newest checkpoint at this step: a log that names one is history a checkpoint holds.
            "checkpoint_step": None if last_checkpoint is None else checkpoint_step(last_checkpoint),
        }
        if self.metrics is not None:
            self.metrics.write(record)
        if self.events is not None:
            self.events.write(global_step, training_scalars(record))
        tflops, mfu = window["model_tflops_per_s"], record["mfu"]
        self.log(
            f"step {global_step}/{self.config.num_train_steps}  loss {window['loss']:.4f}  "
            f"lr {record['lr']:.3g}  {window['seq_per_s']:.1f} seq/s  {window['tokens_per_s']:.0f} tokens/s"
            + (f"  {tflops:.3g} TFLOP/s" if tflops is not None else "")
            + (f"  MFU {mfu:.1%}" if mfu is not None else "")
            + (f"  skipped {skipped}" if skipped else "")
        )

    def progress(self, global_step: int, stats: LoopStats) -> None:
        """The progress bar, redrawn when due."""
        if self.display.due():
            self.display.draw(global_step, stats.peek_loss(), stats.window_rate(), stats.eta(global_step))

    def close(self) -> None:
        self.display.close()


class CheckpointSaving:
    """When a `train` call saves (SaveTrigger: every save_checkpoints_secs and/or save_checkpoints_steps, and when
    the loop ends), what a save carries besides the training state (the run's figures so far, as segments, so a run
    killed later keeps them; the open log window), and the newest checkpoint written. Weights trained on a
    non-finite loss are never saved over good ones."""

    def __init__(
        self,
        checkpoints: TrainingCheckpoints,
        run: RunConfig,
        global_step: int,
        last_checkpoint: str | None,
        earlier_segments: list[dict[str, Any]],
    ):
        self.checkpoints, self.last_checkpoint = checkpoints, last_checkpoint
        self.earlier_segments = self.segments = earlier_segments
        self.trigger = SaveTrigger(run.save_checkpoints_secs, run.save_checkpoints_steps)
        self.trigger.start(global_step)

    def due(self, global_step: int) -> bool:
        return self.trigger.should_save(global_step)

    def save(self, global_step: int, skipped: int, stats: LoopStats, ended: str | None) -> None:
        """Save the checkpoint of `global_step`, its time left out of the steady throughput; `ended` says how this
        invocation ended (None while it goes on)."""
        loss = stats.finite_loss()
        if not math.isfinite(loss):
            raise TrainingDivergedError(
                f"loss is {loss} before step {global_step}; not saving over the last checkpoint {self.last_checkpoint}"
            )
        self.segments = [*self.earlier_segments, stats.segment(global_step, ended)]
        with stats.pause():
            self.last_checkpoint = (
                self.checkpoints.save(global_step, skipped, self.segments, stats.window_state()) or self.last_checkpoint
            )
        self.trigger.saved(global_step)
