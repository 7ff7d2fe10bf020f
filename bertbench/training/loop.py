"""Estimator: the training loop, shaped like tf.estimator, for any model whose forward returns `.loss`.

The loop owns only the loop: the step is train_step.TrainStep, where a run starts is train_state.decide_start, the
checkpointed state is train_state.TrainingCheckpoints, and the figures are train_stats.LoopStats'.

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

import math
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bertbench.model import modeling
from bertbench.training.batches import TrainBatches
from bertbench.training.checkpoint import (CheckpointError, SaveTrigger, checkpoint_step, latest_checkpoint, load_checkpoint,
                                  save_checkpoint)
from bertbench.training.devices import peak_memory_bytes
from bertbench.training.distributed import Distributed
from bertbench.training.progress import MetricsLog, ProgressDisplay, log as log_line
from bertbench.training.state import (CONTINUE, RESUME, RunStart, TrainingCheckpoints, decide_start, load_weights,
                                   read_training_state, seed_everything)
from bertbench.training.stats import LoopStats, TrainResult
from bertbench.training.step import TrainStep, autocast, to_device
from bertbench.training.config import PRECISION_DTYPES, RunConfig, TrainConfig

# What predict/evaluate collect: output field names, or a function (model output, batch) -> {name: tensor}.
Outputs = Sequence[str] | Callable[[Any, Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]


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


class StopSignals:
    """While active, SIGTERM/SIGINT set `received` so the loop can save and stop at the next step boundary.
    A second SIGINT raises KeyboardInterrupt at once, for a user who does not want to wait."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name
        print(f"\n{self.received} received: saving a checkpoint at the end of this step, then stopping",
              file=sys.stderr, flush=True)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


class Estimator:
    """Trains, evaluates and predicts with `model`: model(**batch) returns an object with `.loss` (when the batch
    holds labels) and the output fields `predict` collects (`logits`, `start_logits`, ...)."""

    def __init__(self, model: nn.Module, run_config: RunConfig, train_config: TrainConfig | None = None,
                 dist: Distributed | None = None, log: Callable[[str], None] | None = None):
        self.dist = dist or Distributed()
        self.device = self.dist.device
        self.model = model.to(self.device)
        self.run_config, self.train_config = run_config, train_config
        self.global_step = 0
        # False once independent workers have trained apart: inference must then not be split across ranks.
        self._same_weights_on_every_rank = True
        self._log = log if log is not None else log_line

    def log(self, line: str) -> None:
        if self.dist.is_main:
            self._log(line)

    @property
    def independent_workers(self) -> bool:
        """Several processes training without all-reduce (TrainConfig.sync_gradients False)."""
        return self.dist.enabled and self.train_config is not None and not self.train_config.sync_gradients

    @property
    def precision(self) -> str:
        """What the forwards compute in: the training config's precision, fp32 without one."""
        return self.train_config.precision if self.train_config else "fp32"

    def _autocast(self):
        return autocast(self.precision, self.device)

    def decide_start(self, init_checkpoint: str | None = None, continue_phase: bool = False,
                     training: bool = True) -> RunStart:
        """Where this run starts (see train_state.decide_start), for this model directory and process group."""
        return decide_start(self.run_config.model_dir, training=training, init_checkpoint=init_checkpoint,
                            continue_phase=continue_phase, dist=self.dist,
                            independent_workers=training and self.independent_workers, log=self.log)

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
            save_checkpoint(self.run_config.model_dir, self.global_step,
                            {"model": self.model.state_dict(), "selected_worker": best, "worker_scores": scores},
                            self.run_config.keep_checkpoint_max)
        self.dist.barrier()
        return best, scores

    # ---- training ----------------------------------------------------------------------------------------------

    def train(self, batches: TrainBatches, start: RunStart | None = None,
              evaluation: PeriodicEvaluation | None = None) -> TrainResult:
        """Train to `train_config.num_train_steps` from `start` (default: decide_start(), which resumes model_dir's
        newest checkpoint if any). A CONTINUE start takes an earlier phase's weights, optimizer moments and step
        count, with the warm-up and decay starting anew at its step, as NVIDIA's phase 2 continues phase 1.
        evaluation: evaluate during training, and stop when it says so (a target met)."""
        if self.train_config is None:
            raise ValueError("train needs a TrainConfig")
        config, run = self.train_config, self.run_config
        start = start or self.decide_start()
        if start.kind == CONTINUE and start.step >= config.num_train_steps:
            raise CheckpointError(f"{start.checkpoint}: that run ended at step {start.step}; this one must go past "
                                  f"it, but num_train_steps is {config.num_train_steps}")
        started = time.perf_counter()
        state = read_training_state(start)
        reading_seconds = time.perf_counter() - started  # the restore's time: reading and restoring, not building
        schedule_start = state.get("schedule_start_step", 0) if start.kind == RESUME else \
            start.step if start.kind == CONTINUE else 0
        step = TrainStep(self.model, config, self.dist, schedule_start)
        checkpoints = TrainingCheckpoints(run.model_dir, run.keep_checkpoint_max, self.model, step, batches,
                                          self.dist, self.independent_workers, self.log)
        skipped, resumed_from, restore_seconds, segments, log_window = 0, None, 0.0, [], None
        if start.kind == RESUME:
            segments = list(state.get("segments", []))  # the earlier invocations' figures, up to this checkpoint
            started = time.perf_counter()
            restored = checkpoints.restore(start.checkpoint, state, run.seed)
            self.global_step, skipped, resumed_from = restored.step, restored.skipped_steps, start.checkpoint
            log_window = restored.log_window
            restore_seconds = reading_seconds + time.perf_counter() - started
            self.log(f"resumed from {resumed_from} (step {self.global_step}, epoch {batches.epoch:.2f}) in "
                     f"{restore_seconds:.2f} s")
            if self.global_step >= config.num_train_steps:
                checkpoints.prune()
        else:
            seed_everything(run.seed + self.dist.rank)
            self.global_step = checkpoints.continue_phase(start.checkpoint, state) if start.kind == CONTINUE else 0
        del state  # the checkpoint's copy of every tensor: not kept through training
        if self.independent_workers:
            self._same_weights_on_every_rank = False
        return self._loop(step, checkpoints, batches, evaluation, resumed_from, restore_seconds, skipped, segments,
                          log_window)

    def _loop(self, step: TrainStep, checkpoints: TrainingCheckpoints, batches: TrainBatches,
              evaluation: PeriodicEvaluation | None, resumed_from: str | None, restore_seconds: float,
              skipped: int, earlier_segments: list[dict[str, Any]],
              log_window: dict[str, Any] | None = None) -> TrainResult:
        config, run = self.train_config, self.run_config
        self.model.train()
        if self.dist.is_main:
            os.makedirs(run.model_dir, exist_ok=True)
        # A checkpoint saved between log steps holds the open window; a record its stop wrote at that step closed
        # the window early and goes, for the resumed run logs the whole window at the next log step.
        keep_through = self.global_step - 1 if log_window and log_window["steps"] else self.global_step
        metrics = MetricsLog(f"{run.model_dir}/metrics.jsonl", keep_through if resumed_from else None, self.log) \
            if self.dist.is_main else None
        display = ProgressDisplay(config.num_train_steps, self.global_step,
                                  enabled=None if self.dist.is_main else False)
        trigger = SaveTrigger(run.save_checkpoints_secs, run.save_checkpoints_steps)
        trigger.start(self.global_step)
        stats = LoopStats(start_step=self.global_step, num_train_steps=config.num_train_steps,
                          excluded_steps=config.excluded_steps, max_train_seconds=config.max_train_seconds,
                          world_size=self.dist.world_size, device=self.device, mean_over_ranks=self.dist.mean)
        if log_window:
            stats.resume_window(log_window)
        counted = stats.counted(batches)
        last_checkpoint = resumed_from
        segments = earlier_segments
        out_of_time = target_reached = False
        compiling = config.compile and self.global_step < config.num_train_steps
        if compiling and self.device.type == "cpu":
            self.log("note: torch.compile on a CPU takes minutes before the first step, and on this project's CPU it "
                     "made training no faster (docs/results/cpu-2core/compile); --use_xla=false trains eagerly")
        with StopSignals() as signals:
            while self.global_step < config.num_train_steps:
                if compiling:
                    self.log(f"step {self.global_step + 1}: compiling the model (torch.compile) ...")
                    compile_started = time.perf_counter()
                outcome = step(counted)
                if compiling:
                    self.log(f"step {self.global_step + 1}: compiled and trained in "
                             f"{time.perf_counter() - compile_started:.1f} s")
                    compiling = False
                skipped += outcome.skipped
                self.global_step += not outcome.skipped
                stats.after_step(outcome.loss, outcome.grad_norm, outcome.skipped)
                if stats.consecutive_skipped >= MAX_CONSECUTIVE_SKIPPED_STEPS:
                    raise TrainingDivergedError(f"{stats.consecutive_skipped} fp16 steps in a row overflowed (loss "
                                                f"scale now {step.scaler.get_scale():g}); the last checkpoint is "
                                                f"{last_checkpoint}")
                finished = self.global_step >= config.num_train_steps
                if evaluation is not None and not outcome.skipped and evaluation.due(self.global_step, finished):
                    with stats.pause(save=False):
                        target_reached = evaluation.run(self.global_step)
                # Every rank's clock differs a little: OR-ing the decision makes all ranks stop at the same step.
                stop, save_due, out_of_time = self.dist.any(signals.received is not None,
                                                            trigger.should_save(self.global_step),
                                                            stats.budget_spent())
                # The last step is logged too, so a run shorter than log_step_count_steps has its line.
                ending = finished or stop or out_of_time or target_reached
                on_interval = self.global_step % run.log_step_count_steps == 0
                if not outcome.skipped and (on_interval or ending):
                    # A window cut short by a stop stays open, for the checkpoint: a resumed run's log then reads
                    # as the uninterrupted run's.
                    self._report(stats.take_window(close=on_interval or finished), outcome.learning_rate, metrics,
                                 display, step, batches, skipped, last_checkpoint)
                elif display.due():
                    display.draw(self.global_step, stats.peek_loss(), stats.window_rate(),
                                 stats.eta(self.global_step))
                if ending or save_due:
                    loss = stats.finite_loss()
                    if not math.isfinite(loss):  # never save weights trained on a non-finite loss over good ones
                        raise TrainingDivergedError(f"loss is {loss} before step {self.global_step}; not saving "
                                                    f"over the last checkpoint {last_checkpoint}")
                    # The figures so far travel in the checkpoint, so a run killed later keeps them; the last save
                    # says how this segment ended.
                    ended = "finished" if finished else signals.received if stop else \
                        "target reached" if target_reached else "time budget" if out_of_time else None
                    segments = [*earlier_segments, stats.segment(self.global_step, ended)]
                    with stats.pause():
                        last_checkpoint = checkpoints.save(self.global_step, skipped, segments,
                                                           stats.window_state()) or last_checkpoint
                    trigger.saved(self.global_step)
                if stop or out_of_time or target_reached:
                    break
        display.close()
        unfinished = self.global_step < config.num_train_steps
        # A signal in the last step (or during its save) stops the command too: saved, it ends with 143 like any other.
        interrupted = signals.received
        budget_exhausted = unfinished and out_of_time and not interrupted
        if target_reached and unfinished:
            self.log(f"target reached at step {self.global_step}/{config.num_train_steps}: training stops, the model "
                     f"saved as {last_checkpoint}")
        if interrupted:
            self.log(f"stopped by {interrupted} at step {self.global_step}; the checkpoint {last_checkpoint} "
                     "resumes it: run the same command again")
        elif budget_exhausted:
            self.log(f"time budget of {config.max_train_seconds:g} s reached at step {self.global_step}/"
                     f"{config.num_train_steps}: training stops with the model of step {self.global_step}, saved as "
                     f"{last_checkpoint}")
        return stats.result(global_step=self.global_step, epoch=batches.epoch, resumed_from=resumed_from,
                            restore_seconds=restore_seconds, interrupted=interrupted,
                            budget_exhausted=budget_exhausted, target_reached=target_reached, skipped=skipped,
                            last_checkpoint=last_checkpoint, segments=segments, execution=step.execution())

    def _report(self, window: dict[str, Any], learning_rate: float, metrics: MetricsLog | None,
                display: ProgressDisplay, step: TrainStep, batches: TrainBatches, skipped: int,
                last_checkpoint: str | None) -> None:
        if not math.isfinite(window["loss"]) and self.train_config.precision != "fp16":
            raise TrainingDivergedError(f"loss is {window['loss']} at step {self.global_step}; the last checkpoint "
                                        f"is {last_checkpoint}")
        record = {"step": self.global_step, "epoch": round(batches.epoch, 4), **window,
                  "lr": learning_rate, "skipped_steps": skipped,
                  "loss_scale": step.scaler.get_scale() if step.scaler.is_enabled() else None,
                  "memory_bytes": peak_memory_bytes(self.device),
                  # The run's newest checkpoint at this step: a log that names one is history a checkpoint holds.
                  "checkpoint_step": None if last_checkpoint is None else checkpoint_step(last_checkpoint)}
        if metrics is not None:
            metrics.write(record)
        self.log(f"step {self.global_step}/{self.train_config.num_train_steps}  loss {window['loss']:.4f}  "
                 f"lr {record['lr']:.3g}  {window['seq_per_s']:.1f} seq/s  {window['tokens_per_s']:.0f} tokens/s"
                 + (f"  skipped {skipped}" if skipped else ""))

    # ---- inference ---------------------------------------------------------------------------------------------

    def _infer(self, features: Mapping[str, torch.Tensor], batch_size: int, outputs: Outputs,
               with_loss: bool) -> tuple[dict[str, torch.Tensor], float | None]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        count = len(next(iter(features.values())))
        # With the same weights everywhere, each rank computes a contiguous shard; after independent training
        # each rank must see every example through its own model.
        sharded = self.dist.enabled and self._same_weights_on_every_rank
        shard = self.dist.shard(count) if sharded else range(count)
        if callable(outputs):
            extract = outputs
        else:
            def extract(output, batch):
                return {name: getattr(output, name).float() for name in outputs}
        collected: dict[str, list[torch.Tensor]] = defaultdict(list)
        loss_sum = 0.0
        packer = modeling.packer_for(self.model, self.device, PRECISION_DTYPES[self.precision])
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(shard.start, shard.stop, batch_size):
                    stop = min(start + batch_size, shard.stop)
                    batch = {name: tensor[start:stop] for name, tensor in features.items()}
                    if packer is not None and "attention_mask" in batch:
                        batch["packing"] = packer(batch["attention_mask"])  # on the host, from the CPU mask
                    batch = to_device(batch, self.device)
                    with self._autocast():
                        output = self.model(**batch)
                    for name, value in extract(output, batch).items():
                        collected[name].append(value.cpu())
                    if with_loss:
                        loss_sum += output.loss.float().item() * (stop - start)
        finally:
            self.model.train(was_training)
        if sharded:  # rank order is example order: concatenating the shards restores it
            shards = self.dist.all_gather_object((dict(collected), loss_sum))
            names = [name for part, _ in shards for name in part]
            collected = {name: [chunk for part, _ in shards for chunk in part.get(name, [])]
                         for name in dict.fromkeys(names)}
            loss_sum = sum(part_loss for _, part_loss in shards)
        return ({name: torch.cat(chunks) for name, chunks in collected.items()},
                loss_sum / count if with_loss else None)

    def predict(self, features: Mapping[str, torch.Tensor], batch_size: int,
                outputs: Outputs = ("logits",)) -> dict[str, torch.Tensor]:
        """The model's `outputs` for every example, in order, as float32 CPU tensors, on every rank; `outputs` may
        instead be a function (model output, batch) -> {name: per-example tensor}, collected as it returns them
        (to keep a per-example figure instead of large logits)."""
        return self._infer(features, batch_size, outputs, with_loss=False)[0]

    def evaluate(self, features: Mapping[str, torch.Tensor], batch_size: int,
                 metric_fn: Callable[[dict[str, torch.Tensor]], dict[str, float]] | None = None,
                 outputs: Outputs = ("logits",)) -> dict[str, float]:
        """{"loss": mean loss, "global_step": ..., **metric_fn(outputs)} over labelled `features`."""
        predictions, loss = self._infer(features, batch_size, outputs, with_loss=True)
        result = {"loss": loss, "global_step": self.global_step}
        if metric_fn is not None:
            result.update(metric_fn(predictions))
        return result
