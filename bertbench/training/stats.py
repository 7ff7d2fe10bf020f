"""Counts and clocks of the training loop: the log windows' figures and the run's steady-state throughput.

The steady throughput leaves out the first `excluded_steps` steps (start-up, compilation) and the time spent saving
checkpoints and evaluating during training after them. The clock is injectable, so the arithmetic is tested with a
fake one.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from bertbench.training.devices import synchronize


@dataclass
class TrainResult:
    """What one call of `Estimator.train` did. Throughput counts every sequence of every rank."""

    global_step: int
    resumed_from: str | None  # the checkpoint this run continued from
    restore_seconds: float  # reading it and restoring every state
    interrupted_by: str | None  # "SIGTERM" / "SIGINT" when a signal stopped the run early
    budget_exhausted: bool  # max_train_seconds stopped the run before num_train_steps (not an interruption)
    target_reached: bool  # a PeriodicEvaluation stopped the run (its target met)
    steps: int  # optimizer steps done in this call
    sentences: int  # sequences trained in this call (skipped fp16 steps included: they were computed)
    seconds: float  # wall-clock time of the training loop, checkpoints included
    sentences_per_second: float  # sentences / seconds
    steady_sentences_per_second: float | None  # without the first excluded steps and without checkpoint saves
    steady_steps: int  # steps the steady figure covers
    checkpoint_saves: int
    checkpoint_seconds: float
    evaluation_seconds: float  # evaluations during training (left out of the steady throughput, as saves are)
    padding_fraction: float | None  # share of the trained tokens that were padding
    real_tokens_per_second: float | None  # tokens that were not padding / seconds
    steady_real_tokens_per_second: float | None  # the same over the steady steps
    skipped_steps: int  # fp16 steps skipped for inf/NaN gradients, in the whole run
    final_loss: float | None  # mean loss of this call's last trained step's window (LoopStats.last_window_loss)
    last_checkpoint: str | None
    epoch: float
    # Every segment of the run that trained: the earlier invocations' (from the checkpoint resumed) and this one's.
    segments: list[dict[str, Any]] = field(default_factory=list)
    execution: dict[str, Any] = field(default_factory=dict)  # how the steps ran (TrainStep.execution)
    # This call's first step, from the loop's start: what a run pays once (torch.compile's compilation, CUDA graph
    # captures, the first batch read) shows as its excess over the steady step.
    first_step_seconds: float | None = None

    @property
    def sentences_per_20_minutes(self) -> float | None:
        """The original suite's comparison figure: sentences a run processes in 20 minutes at the steady rate."""
        rate = self.steady_sentences_per_second
        return None if rate is None else rate * 1200


class LoopStats:
    """Counts batches, steps, saves and evaluations of one `train` call, and times them."""

    def __init__(
        self,
        *,
        start_step: int,
        num_train_steps: int,
        excluded_steps: int,
        max_train_seconds: float | None,
        world_size: int = 1,
        device: torch.device | str = "cpu",
        mean_over_ranks: Callable[[float], float] = lambda value: value,
        clock: Callable[[], float] = time.perf_counter,
        model_flops: Callable[[Mapping[str, torch.Tensor]], int] | None = None,
    ):
        self.start_step, self.num_train_steps = start_step, num_train_steps
        self.model_flops = model_flops  # of a batch, when the model says (model.flops)
        self.max_train_seconds, self.world_size, self.device = max_train_seconds, world_size, torch.device(device)
        self.mean_over_ranks, self.clock = mean_over_ranks, clock
        self.exclude = min(excluded_steps, (num_train_steps - start_step) // 2)
        self.started = self.window_started = clock()
        self.steady_started: float | None = None
        self.steady_start = Counter()  # the totals when the steady part began
        self.steps = 0
        self.totals: Counter[str] = Counter()  # sentences, tokens (padding included), real_tokens, model_flops
        self.window: Counter[str] = Counter()  # the same since the last log line, and its optimizer steps
        self.window_loss = torch.zeros((), device=self.device)
        self.window_counted = 0
        self.last_grad_norm: torch.Tensor | None = None
        self.consecutive_skipped = 0
        self.saves, self.save_seconds, self.steady_pause_seconds = 0, 0.0, 0.0
        self.evaluation_seconds = 0.0
        self.last_loss: float | None = None
        self.first_step_seconds: float | None = None

    def counted(self, batches: Iterator[Mapping[str, torch.Tensor]]) -> CountedBatches:
        """`batches`, counting each batch taken from it."""
        return CountedBatches(batches, self.count_batch)

    def count_batch(self, batch: Mapping[str, torch.Tensor]) -> None:
        input_ids, mask = batch.get("input_ids"), batch.get("attention_mask")
        tokens = input_ids.numel() if input_ids is not None else 0
        # Every rank trains a batch of the same shape; real tokens are this rank's, scaled alike.
        counts = {
            "sentences": len(next(iter(batch.values()))),
            "tokens": tokens,
            "real_tokens": int(mask.sum()) if mask is not None else tokens,
            "model_flops": self.model_flops(batch) if self.model_flops is not None else 0,
        }
        counts = {name: value * self.world_size for name, value in counts.items()}
        self.totals.update(counts)
        self.window.update(counts)

    def after_step(self, loss: torch.Tensor, grad_norm: torch.Tensor | None, skipped: bool) -> None:
        self.steps += 1
        if self.steps == 1:
            synchronize(self.device)
            self.first_step_seconds = self.clock() - self.started
        self.consecutive_skipped = self.consecutive_skipped + 1 if skipped else 0
        if not skipped:
            self.window_loss += loss
            self.window_counted += 1
            self.window["steps"] += 1
            self.last_grad_norm = grad_norm
        if self.steps == self.exclude and self.steady_started is None:
            synchronize(self.device)
            self.steady_started, self.steady_start = self.clock(), Counter(self.totals)

    def peek_loss(self) -> float:
        return (self.window_loss / max(1, self.window_counted)).item()

    def window_rate(self) -> float:
        return self.window["sentences"] / max(1e-9, self.clock() - self.window_started)

    def budget_spent(self) -> bool:
        """Whether this invocation's training loop (checkpoint saves included) has used up max_train_seconds."""
        return self.max_train_seconds is not None and self.clock() - self.started >= self.max_train_seconds

    def eta(self, step: int) -> float:
        done = step - self.start_step
        total = self.num_train_steps - self.start_step
        elapsed = self.clock() - self.started
        eta = elapsed / done * (total - done) if done else 0.0
        budget = self.max_train_seconds
        return eta if budget is None else min(eta, max(0.0, budget - elapsed))

    def mean_loss(self) -> float:
        """The window's mean loss over every rank (each measured its own share of the batches)."""
        return self.mean_over_ranks(self.peek_loss())

    def window_state(self) -> dict[str, Any]:
        """The open window's loss figures, for a checkpoint: a run resumed from it logs the window an uninterrupted
        run logs. The float32 sum travels exactly as a Python float."""
        return {"loss_sum": self.window_loss.item(), "steps": self.window_counted}

    def resume_window(self, state: dict[str, Any]) -> None:
        """Go on with the window a checkpoint saved (window_state). Its sentence counts are not restored: this
        invocation's rates count only what it trained in its own time."""
        self.window_loss.fill_(state["loss_sum"])
        self.window_counted = state["steps"]

    def take_window(self, close: bool = True) -> dict[str, Any]:
        """The window's figures; `close=False` (a stop between log steps) leaves it open, so that the checkpoint
        saved next holds it."""
        now = self.clock()
        elapsed = max(1e-9, now - self.window_started)
        loss = self.mean_loss() if self.window_counted else math.nan
        window = {
            "loss": loss,
            "grad_norm": None if self.last_grad_norm is None else self.last_grad_norm.item(),
            "seq_per_s": self.window["sentences"] / elapsed,
            "tokens_per_s": self.window["tokens"] / elapsed,
            "real_tokens_per_s": self.window["real_tokens"] / elapsed,
            "steps_per_s": self.window["steps"] / elapsed,
            "model_tflops_per_s": self.window["model_flops"] / elapsed / 1e12 if self.model_flops is not None else None,
            "elapsed_s": round(now - self.started, 3),
        }
        self.last_loss = loss
        if not close:
            return window
        self.window_loss.zero_()
        self.window_counted = 0
        self.window.clear()
        self.window_started = self.clock()
        return window

    def last_window_loss(self) -> float | None:
        """The mean loss of the last trained step's window: the open window's so far (a stop or a save between log
        steps), else the last one logged; None before any step. Every rank calls it: the mean is over the ranks."""
        return self.mean_loss() if self.window_counted else self.last_loss

    def finite_loss(self) -> float:
        """The window's loss so far (0 when no step counted), for the check before a save."""
        return self.mean_loss() if self.window_counted else 0.0

    @contextmanager
    def pause(self, save: bool = True) -> Iterator[None]:
        """Time a checkpoint save (or an evaluation), so the steady throughput can leave it out."""
        started = self.clock()
        yield
        seconds = self.clock() - started
        if save:
            self.saves += 1
            self.save_seconds += seconds
        else:
            self.evaluation_seconds += seconds
        if self.steady_started is not None:
            self.steady_pause_seconds += seconds

    def segment(self, global_step: int, ended: str | None) -> dict[str, Any]:
        """This invocation's figures so far, as train_results.json's `segments` list them: steps start_step to
        global_step, how the segment `ended` (None while it runs: a segment read back from a checkpoint with None
        was lost after that save, and its later steps were trained again), its last window's loss and its first
        step's seconds."""
        synchronize(self.device)
        now = self.clock()
        seconds = now - self.started
        steady_rate = steady_real_rate = None
        steady_steps, steady_seconds = 0, 0.0
        if self.steady_started is not None and self.steps > self.exclude:
            steady_seconds = max(1e-9, now - self.steady_started - self.steady_pause_seconds)
            steady = self.totals - self.steady_start
            steady_rate, steady_real_rate = steady["sentences"] / steady_seconds, steady["real_tokens"] / steady_seconds
            steady_steps = self.steps - self.exclude
        return {
            "start_step": self.start_step,
            "end_step": global_step,
            "steps": global_step - self.start_step,
            "sentences": self.totals["sentences"],
            "seconds": seconds,
            "sentences_per_second": self.totals["sentences"] / max(1e-9, seconds),
            "steady_sentences_per_second": steady_rate,
            "steady_steps": steady_steps,
            "tokens": self.totals["tokens"],
            "real_tokens": self.totals["real_tokens"],
            "steady_real_tokens_per_second": steady_real_rate,
            "steady_seconds": steady_seconds,
            "checkpoint_saves": self.saves,
            "checkpoint_seconds": self.save_seconds,
            "evaluation_seconds": self.evaluation_seconds,
            "final_loss": self.last_window_loss(),
            "first_step_seconds": self.first_step_seconds,
            "world_size": self.world_size,
            "ended": ended,
        }

    def result(
        self,
        *,
        global_step: int,
        epoch: float,
        resumed_from: str | None,
        restore_seconds: float,
        interrupted: str | None,
        budget_exhausted: bool,
        target_reached: bool,
        skipped: int,
        last_checkpoint: str | None,
        segments: list[dict[str, Any]] = (),
        execution: dict[str, Any] | None = None,
    ) -> TrainResult:
        """This invocation's figures; `segments`: the run's, as its last checkpoint holds them."""
        this = self.segment(global_step, ended=None)
        return TrainResult(
            global_step=global_step,
            resumed_from=resumed_from,
            restore_seconds=restore_seconds,
            interrupted_by=interrupted,
            budget_exhausted=budget_exhausted,
            target_reached=target_reached,
            steps=this["steps"],
            sentences=this["sentences"],
            seconds=this["seconds"],
            sentences_per_second=this["sentences_per_second"],
            steady_sentences_per_second=this["steady_sentences_per_second"],
            steady_steps=this["steady_steps"],
            checkpoint_saves=self.saves,
            checkpoint_seconds=self.save_seconds,
            evaluation_seconds=self.evaluation_seconds,
            padding_fraction=1 - self.totals["real_tokens"] / self.totals["tokens"] if self.totals["tokens"] else None,
            real_tokens_per_second=this["real_tokens"] / max(1e-9, this["seconds"]) if this["steps"] else None,
            steady_real_tokens_per_second=this["steady_real_tokens_per_second"],
            skipped_steps=skipped,
            final_loss=this["final_loss"],
            last_checkpoint=last_checkpoint,
            epoch=epoch,
            segments=list(segments),
            execution=dict(execution or {}),
            first_step_seconds=self.first_step_seconds,
        )


def run_totals(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """The whole run's figures over its segments (every invocation that trained): steps, sentences and seconds
    added up, the rates over those sums (the steady rate over the segments' steady parts), the loss of the run's
    last window and the seconds of its first step. A figure some segment lacks (one saved before bertbench kept
    it) is None rather than a part of the run's."""
    total = {
        name: sum(segment[name] for segment in segments)
        for name in (
            "steps",
            "sentences",
            "seconds",
            "steady_steps",
            "steady_seconds",
            "checkpoint_saves",
            "checkpoint_seconds",
        )
    }
    steady_sentences = sum(
        segment["steady_sentences_per_second"] * segment["steady_seconds"]
        for segment in segments
        if segment["steady_sentences_per_second"] is not None
    )
    # Segments saved before real tokens were counted have none: then the run has no real-token figures.
    counted = all("real_tokens" in segment for segment in segments)
    tokens, real_tokens = (
        sum(segment[name] for segment in segments) if counted else None for name in ("tokens", "real_tokens")
    )
    steady_real = (
        sum(
            segment["steady_real_tokens_per_second"] * segment["steady_seconds"]
            for segment in segments
            if segment["steady_sentences_per_second"] is not None
        )
        if counted
        else None
    )
    evaluations = [segment.get("evaluation_seconds") for segment in segments]
    return {
        "final_loss": segments[-1].get("final_loss"),
        "first_step_seconds": segments[0].get("first_step_seconds"),
        "evaluation_seconds": None if None in evaluations else sum(evaluations),
        "real_tokens_per_second": real_tokens / total["seconds"] if counted and total["seconds"] else None,
        "steady_real_tokens_per_second": steady_real / total["steady_seconds"]
        if counted and total["steady_steps"]
        else None,
        "padding_fraction": 1 - real_tokens / tokens if counted and tokens else None,
        "steps": total["steps"],
        "sentences": total["sentences"],
        "seconds": total["seconds"],
        "sentences_per_second": total["sentences"] / total["seconds"] if total["seconds"] else None,
        "steady_sentences_per_second": steady_sentences / total["steady_seconds"] if total["steady_steps"] else None,
        "steady_steps": total["steady_steps"],
        "checkpoint_saves": total["checkpoint_saves"],
        "checkpoint_seconds": total["checkpoint_seconds"],
    }


class CountedBatches:
    """An iterator over another's batches that reports each one it hands out."""

    def __init__(
        self, batches: Iterator[Mapping[str, torch.Tensor]], count: Callable[[Mapping[str, torch.Tensor]], None]
    ):
        self.batches, self.count = batches, count

    def __iter__(self) -> CountedBatches:
        return self

    def __next__(self) -> Mapping[str, torch.Tensor]:
        batch = next(self.batches)
        self.count(batch)
        return batch
