"""RunConfig + Estimator: the training loop, shaped like tf.estimator, for any model whose forward returns `.loss`.

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

import dataclasses
import logging
import math
import os
import random
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from bertbench import optim
from bertbench.devices import peak_memory_bytes, synchronize
from bertbench.checkpoint import (CheckpointError, SaveTrigger, checkpoint_path, latest_checkpoint, list_checkpoints,
                                  load_checkpoint, prune_checkpoints, save_checkpoint, worker_dir)
from bertbench.distributed import Distributed
from bertbench.progress import MetricsLog, ProgressDisplay

logger = logging.getLogger(__name__)

PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass
class RunConfig:
    """Where a run keeps its checkpoints and how often it writes them (tf.estimator.RunConfig's names)."""

    model_dir: str = field(metadata={"help": "Directory of the run's checkpoints and logs; a run started on a "
                                             "directory holding a checkpoint resumes from it."})
    save_checkpoints_secs: float | None = field(default=1200, metadata={
        "help": "Save a checkpoint every this many seconds of wall-clock time (None: not on a timer)."})
    save_checkpoints_steps: int | None = field(default=None, metadata={
        "help": "Save a checkpoint every this many steps (None: not by steps). Either, both or neither."})
    keep_checkpoint_max: int = field(default=1, metadata={"help": "Checkpoints kept; older ones are deleted once "
                                                                  "a newer one is completely written."})
    log_step_count_steps: int = field(default=100, metadata={"help": "Log loss and throughput every this many "
                                                                     "steps (to the console and metrics.jsonl)."})
    seed: int = field(default=42, metadata={"help": "Seed of the data order and of dropout."})

    def __post_init__(self) -> None:
        if self.save_checkpoints_secs is not None and self.save_checkpoints_secs <= 0:
            raise ValueError(f"save_checkpoints_secs must be positive, got {self.save_checkpoints_secs}")
        if self.save_checkpoints_steps is not None and self.save_checkpoints_steps < 1:
            raise ValueError(f"save_checkpoints_steps must be at least 1, got {self.save_checkpoints_steps}")
        if self.keep_checkpoint_max < 1:
            raise ValueError(f"keep_checkpoint_max must be at least 1, got {self.keep_checkpoint_max}")
        if self.log_step_count_steps < 1:
            raise ValueError(f"log_step_count_steps must be at least 1, got {self.log_step_count_steps}")


@dataclass
class TrainConfig:
    """The optimisation: steps, optimizer, schedule, precision."""

    num_train_steps: int = field(metadata={"help": "Optimizer steps of the whole run (a resumed run continues "
                                                   "to the same number)."})
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate."})
    warmup_proportion: float = field(default=0.1, metadata={"help": "Share of the steps in linear warm-up."})
    decay: str = field(default="linear", metadata={"help": "After warm-up: linear or poly(nomial) decay to 0."})
    decay_power: float = field(default=1.0, metadata={"help": "Power of the polynomial decay."})
    optimizer: str = field(default="adamw", metadata={"help": "adamw or lamb."})
    weight_decay: float = field(default=0.01, metadata={"help": "Decoupled weight decay (not on biases and "
                                                                "LayerNorm)."})
    gradient_accumulation_steps: int = field(default=1, metadata={
        "help": "Micro-batches per optimizer step; the step's batch is their sum."})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "Clip the global gradient norm to this "
                                                                       "(Google's 1.0); None: no clipping."})
    precision: str = field(default="fp32", metadata={"help": "fp32, fp16 (autocast + dynamic loss scaling) or "
                                                             "bf16 (autocast)."})
    compile: bool = field(default=False, metadata={"help": "Run the training forward/backward through "
                                                           "torch.compile (the original --use_xla)."})
    excluded_steps: int = field(default=10, metadata={
        "help": "Steps at the start of each run left out of the steady-state throughput (start-up, compilation)."})
    sync_gradients: bool = field(default=True, metadata={
        "help": "Under torchrun, all-reduce the gradients (data parallel). False: independent workers, each "
                "training its own copy on its shard of the data with no communication of gradients."})
    max_train_seconds: float | None = field(default=None, metadata={
        "help": "Stop training after this many seconds of training-loop wall-clock time in this invocation "
                "(checkpoint saves included), save a checkpoint, and go on to evaluation (a fixed-time budget, the "
                "original suite's 20-minute comparison). The learning-rate schedule stays that of num_train_steps: "
                "the budget only cuts the run short. None: train to num_train_steps."})

    def __post_init__(self) -> None:
        if self.num_train_steps < 1:
            raise ValueError(f"num_train_steps must be at least 1, got {self.num_train_steps}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        if self.gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be at least 1, got {self.gradient_accumulation_steps}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be positive, got {self.max_grad_norm}")
        if self.optimizer not in optim.OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(optim.OPTIMIZERS)}")
        if self.decay not in optim.DECAYS:
            raise ValueError(f"unknown decay {self.decay!r}; choose one of {', '.join(optim.DECAYS)}")
        if not self.sync_gradients and self.precision == "fp16":
            raise ValueError("independent workers need fp32 or bf16: fp16 loss scaling skips overflowing steps on "
                             "each worker separately, and the workers must stay at the same step")
        if self.max_train_seconds is not None and self.max_train_seconds <= 0:
            raise ValueError(f"max_train_seconds must be positive, got {self.max_train_seconds}")
        if self.learning_rate <= 0 or not 0 <= self.warmup_proportion <= 1 or self.excluded_steps < 0:
            raise ValueError(f"invalid learning_rate {self.learning_rate}, warmup_proportion "
                             f"{self.warmup_proportion} or excluded_steps {self.excluded_steps}")


class ShuffledBatches:
    """An endless stream of training batches from in-memory features, resumable at any batch.

    The order is one seeded permutation per epoch, the epochs laid end to end and cut into global batches of
    `batch_size * world_size` (TF's shuffle, repeat, batch with drop_remainder: every batch full, every example
    seen once per epoch). Rank r takes the r-th slice of each global batch. The state is the number of examples
    consumed, so a resumed stream continues with the very next batch.
    """

    def __init__(self, features: Mapping[str, torch.Tensor], batch_size: int, seed: int, rank: int = 0,
                 world_size: int = 1):
        counts = {len(tensor) for tensor in features.values()}
        if len(counts) != 1 or not counts.pop():
            raise ValueError("features must be tensors of one non-zero length")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.features = dict(features)
        self.num_examples = len(next(iter(features.values())))
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.consumed = 0
        self._orders: dict[int, torch.Tensor] = {}

    @property
    def epoch(self) -> float:
        """Epochs consumed so far, fractional."""
        return self.consumed / self.num_examples

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._orders:
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._orders = {e: order for e, order in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = torch.randperm(self.num_examples, generator=generator)
        return self._orders[epoch]

    def _indices(self, start: int, count: int) -> torch.Tensor:
        pieces = []
        while count:
            epoch, offset = divmod(start, self.num_examples)
            take = min(count, self.num_examples - offset)
            pieces.append(self._order(epoch)[offset:offset + take])
            start, count = start + take, count - take
        return torch.cat(pieces)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        start = self.consumed + self.rank * self.batch_size
        index = self._indices(start, self.batch_size)
        self.consumed += self.batch_size * self.world_size
        return {name: tensor[index] for name, tensor in self.features.items()}

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed, "num_examples": self.num_examples, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        for key in ("num_examples", "seed"):
            if state[key] != getattr(self, key):
                raise ValueError(f"the data order was saved with {key} {state[key]}, this run has "
                                 f"{getattr(self, key)}")
        self.consumed = state["consumed"]


# What predict/evaluate collect: output field names, or a function (model output, batch) -> {name: tensor}.
Outputs = Sequence[str] | Callable[[Any, Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]


class TrainBatches(Protocol):
    """What `Estimator.train` reads batches from: an endless iterator whose position a checkpoint saves and a
    resumed run restores (ShuffledBatches; tasks.pretraining.PretrainingBatches reads shard files)."""

    epoch: float

    def __next__(self) -> dict[str, torch.Tensor]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


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


@dataclass
class TrainResult:
    """What one call of `train` did. Throughput counts every sequence of every rank."""

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
    skipped_steps: int  # fp16 steps skipped for inf/NaN gradients, in the whole run
    final_loss: float | None  # mean loss of the last logged window
    last_checkpoint: str | None
    epoch: float

    @property
    def sentences_per_20_minutes(self) -> float | None:
        """The original suite's comparison figure: sentences a run processes in 20 minutes at the steady rate."""
        rate = self.steady_sentences_per_second
        return None if rate is None else rate * 1200


class TrainingDivergedError(RuntimeError):
    """The loss became inf or NaN (fp32/bf16), or fp16 kept overflowing however small the loss scale."""


# fp16 overflows this many steps in a row means the loss scale cannot save the run: stop rather than spin.
MAX_CONSECUTIVE_SKIPPED_STEPS = 64


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states, in types the safe (weights_only) loader reads."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(),
            "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class _StopSignals:
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

    def __enter__(self) -> "_StopSignals":
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
        self._step_lr = 0.0  # learning rate of the last optimizer step, for the logs
        # False once independent workers have trained apart: inference must then not be split across ranks.
        self._same_weights_on_every_rank = True
        self._schedule_start_step = 0  # the step this run's warm-up began at (an earlier phase's last step)
        self._log = log if log is not None else (lambda line: print(line, flush=True))

    def log(self, line: str) -> None:
        if self.dist.is_main:
            self._log(line)

    @property
    def independent_workers(self) -> bool:
        """Several processes training without all-reduce (TrainConfig.sync_gradients False)."""
        return self.dist.enabled and self.train_config is not None and not self.train_config.sync_gradients

    def _checkpoint_dir(self) -> str:
        """Where this process saves and resumes training: the model dir, or its own worker-<rank>/ in it."""
        model_dir = self.run_config.model_dir
        return worker_dir(model_dir, self.dist.rank) if self.independent_workers else model_dir

    def _autocast(self):
        precision = self.train_config.precision if self.train_config else "fp32"
        if precision == "fp32":
            return nullcontext()
        dtype = torch.float16 if precision == "fp16" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype)

    # ---- checkpoints -------------------------------------------------------------------------------------------

    def restore(self, path: str | None = None) -> str | None:
        """Load the weights (only) of checkpoint `path`, or of the newest one in model_dir; None if there is none."""
        path = path or latest_checkpoint(self.run_config.model_dir)
        if path is None:
            return None
        state = load_checkpoint(path)
        self._load_weights(path, state)
        self.global_step = state["step"]
        return path

    def _load_weights(self, path: str, state: Mapping[str, Any]) -> None:
        try:
            self.model.load_state_dict(state["model"])
        except KeyError:
            raise CheckpointError(f"{path}: no 'model' entry") from None
        except RuntimeError as error:
            detail = " ".join(str(error).split())
            raise CheckpointError(f"{path}: its weights do not fit this model ({detail[:300]})") from None

    def _resume(self, optimizer, scaler, batches: TrainBatches, continue_from: str | None
                ) -> tuple[Any, str | None, float, int]:
        """Restore the newest checkpoint's whole state, or else start from `continue_from` (see `train`), or afresh;
        (the LR schedule, the checkpoint resumed or None, seconds taken, skipped fp16 steps)."""
        started = time.perf_counter()
        path = self._resume_path()
        if path is None:
            seed_everything(self.run_config.seed + self.dist.rank)
            start = self._continue(optimizer, continue_from) if continue_from else 0
            return self._schedule(optimizer, start), None, 0.0, 0
        state = load_checkpoint(path)
        self._load_weights(path, state)
        schedule = self._schedule(optimizer, state.get("schedule_start_step", 0))
        try:
            optimizer.load_state_dict(state["optimizer"])
            schedule.load_state_dict(state["schedule"])
            scaler.load_state_dict(state["scaler"])
            data = state["data"]
            if isinstance(data, list):  # every rank's position; a list of one from an independent worker
                data = data[self.dist.rank] if len(data) == self.dist.world_size else data[0]
            batches.load_state_dict(data)
            rng_states, step, skipped = state["rng"], state["step"], state["skipped_steps"]
        except KeyError as error:
            raise CheckpointError(f"{path}: no {error.args[0]!r} entry; not a training checkpoint of this "
                                  f"bertbench version") from None
        except ValueError as error:
            raise CheckpointError(f"{path}: does not fit this run: {error}") from None
        if self.independent_workers:
            set_rng_state(rng_states[0])  # each worker's file holds its own
        elif len(rng_states) == self.dist.world_size:
            set_rng_state(rng_states[self.dist.rank])
        else:  # the weights and data position still resume exactly; dropout draws cannot
            self.log(f"warning: {path} was written by {len(rng_states)} processes, this run has "
                     f"{self.dist.world_size}: dropout random streams restart from the seed")
            seed_everything(self.run_config.seed + self.dist.rank + step)
        self.global_step = step
        return schedule, path, time.perf_counter() - started, skipped

    def _schedule(self, optimizer, start_step: int):
        """Warm-up and decay over the steps from `start_step` (0, or the step an earlier phase ended at) to
        num_train_steps."""
        config = self.train_config
        self._schedule_start_step = start_step
        return optim.warmup_decay_schedule(optimizer, config.num_train_steps - start_step, config.warmup_proportion,
                                           config.decay, config.decay_power)

    def _continue(self, optimizer, source: str) -> int:
        """Start from an earlier phase's checkpoint (a file, or the newest in a run directory): its weights, its
        step count and, when it was trained with the same optimizer, the optimizer's moments; this run's learning
        rate and weight decay replace that phase's (NVIDIA's phase 2). Returns the step it ended at."""
        path = latest_checkpoint(source) if os.path.isdir(source) else source
        if path is None:
            raise CheckpointError(f"{source}: no checkpoint (ckpt-<step>.pt) to continue from")
        state = load_checkpoint(path)
        self._load_weights(path, state)
        step = int(state.get("step", 0))
        if step >= self.train_config.num_train_steps:
            raise CheckpointError(f"{path}: that run ended at step {step}; this one must go past it, but "
                                  f"num_train_steps is {self.train_config.num_train_steps}")
        earlier = state.get("train_config", {}).get("optimizer")
        if "optimizer" in state and earlier == self.train_config.optimizer:
            settings = [{key: value for key, value in group.items() if key != "params"}
                        for group in optimizer.param_groups]
            try:
                optimizer.load_state_dict(state["optimizer"])
            except (ValueError, KeyError) as error:
                raise CheckpointError(f"{path}: its optimizer state does not fit this model ({error})") from None
            for group, fresh in zip(optimizer.param_groups, settings):
                group.pop("initial_lr", None)
                group.update(fresh)
        else:
            self.log(f"warning: {path} holds no {self.train_config.optimizer} state (it was trained with "
                     f"{earlier or 'no saved optimizer'}): the optimizer's moments start from zero")
        self.global_step = step
        return step

    def _resume_path(self) -> str | None:
        """The checkpoint to resume from. Independent workers take the newest step that every worker saved: a
        worker killed while the others were saving may lack the newest, and they must go on from the same step."""
        if not self.independent_workers:
            return latest_checkpoint(self.run_config.model_dir)
        saved = self.dist.all_gather_object([step for step, _ in list_checkpoints(self._checkpoint_dir())])
        common = set(saved[0]).intersection(*saved[1:])
        if not common:
            if any(saved):
                self.log(f"warning: the workers' checkpoints in {self.run_config.model_dir}/worker-*/ have no step "
                         "in common (a worker stopped before its first save): starting from the beginning")
            return None
        return checkpoint_path(self._checkpoint_dir(), max(common))

    def _save(self, optimizer, schedule, scaler, batches: TrainBatches, skipped: int) -> str | None:
        independent = self.independent_workers
        # Data parallel: rank 0 writes the one checkpoint, holding every rank's random streams and data position
        # (ranks reading their own shards are at different places). Independent workers: each writes its own, and
        # old ones go only once all have written (see _resume_path).
        own = (rng_state(), batches.state_dict())
        gathered = [own] if independent else self.dist.all_gather_object(own)
        if not (independent or self.dist.is_main):
            return None
        state = {"model": self.model.state_dict(), "optimizer": optimizer.state_dict(),
                 "schedule": schedule.state_dict(), "schedule_start_step": self._schedule_start_step,
                 "scaler": scaler.state_dict(), "data": [data for _, data in gathered],
                 "epoch": batches.epoch, "rng": [rng for rng, _ in gathered], "skipped_steps": skipped,
                 "train_config": dataclasses.asdict(self.train_config)}
        if not independent:
            return save_checkpoint(self.run_config.model_dir, self.global_step, state,
                                   self.run_config.keep_checkpoint_max)
        path = save_checkpoint(self._checkpoint_dir(), self.global_step, state, keep_max=None)
        self.dist.barrier()
        prune_checkpoints(self._checkpoint_dir(), self.run_config.keep_checkpoint_max)
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

    def _training_model(self) -> nn.Module:
        model = self.model
        if self.dist.enabled and self.train_config.sync_gradients:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            model = nn.parallel.DistributedDataParallel(model, device_ids=device_ids)
        if self.train_config.compile:
            model = torch.compile(model)
        return model

    def train(self, batches: TrainBatches, continue_from: str | None = None,
              evaluation: PeriodicEvaluation | None = None) -> TrainResult:
        """Train to `train_config.num_train_steps`, resuming from model_dir's newest checkpoint if any.

        continue_from: when model_dir holds no checkpoint, start from this checkpoint of an earlier phase (its
        weights, optimizer moments and step count) with the warm-up and decay starting anew at its step, as NVIDIA's
        phase 2 continues phase 1. evaluation: evaluate during training, and stop when it says so (a target met).
        """
        if self.train_config is None:
            raise ValueError("train needs a TrainConfig")
        config, run = self.train_config, self.run_config
        optimizer = optim.build_optimizer(self.model, config.optimizer, config.learning_rate, config.weight_decay)
        scaler = torch.amp.GradScaler(self.device.type, enabled=config.precision == "fp16")
        schedule, resumed_from, restore_seconds, skipped = self._resume(optimizer, scaler, batches, continue_from)
        if self.independent_workers:
            self._same_weights_on_every_rank = False
        if resumed_from:
            self.log(f"resumed from {resumed_from} (step {self.global_step}, epoch {batches.epoch:.2f}) in "
                     f"{restore_seconds:.2f} s")
        model = self._training_model()
        self.model.train()
        if self.dist.is_main:
            os.makedirs(run.model_dir, exist_ok=True)
        metrics = MetricsLog(f"{run.model_dir}/metrics.jsonl", self.global_step if resumed_from else None) \
            if self.dist.is_main else None
        display = ProgressDisplay(config.num_train_steps, enabled=None if self.dist.is_main else False)
        trigger = SaveTrigger(run.save_checkpoints_secs, run.save_checkpoints_steps)
        trigger.start(self.global_step)
        loop = _LoopStats(self, batches, config)
        last_checkpoint = resumed_from
        out_of_time = target_reached = False
        with _StopSignals() as signals:
            while self.global_step < config.num_train_steps:
                loss, grad_norm, was_skipped = self._train_step(model, batches, optimizer, schedule, scaler, loop)
                skipped += was_skipped
                loop.after_step(loss, grad_norm, was_skipped)
                if loop.consecutive_skipped >= MAX_CONSECUTIVE_SKIPPED_STEPS:
                    raise TrainingDivergedError(f"{loop.consecutive_skipped} fp16 steps in a row overflowed (loss "
                                                f"scale now {scaler.get_scale():g}); the last checkpoint is "
                                                f"{last_checkpoint}")
                finished = self.global_step >= config.num_train_steps
                if evaluation is not None and not was_skipped and evaluation.due(self.global_step, finished):
                    with loop.pause(save=False):
                        target_reached = evaluation.run(self.global_step)
                # Every rank's clock differs a little: OR-ing the decision makes all ranks stop at the same step.
                stop, save_due, out_of_time = self.dist.any(signals.received is not None,
                                                            trigger.should_save(self.global_step),
                                                            loop.budget_spent())
                if not was_skipped and self.global_step % run.log_step_count_steps == 0:
                    self._report(loop.take_window(), metrics, display, scaler, batches, skipped,
                                 last_checkpoint)
                elif display.due():
                    display.draw(self.global_step, loop.peek_loss(), loop.window_rate(),
                                 loop.eta(self.global_step))
                if finished or stop or save_due or out_of_time or target_reached:
                    loop.check_finite(self.global_step, last_checkpoint)
                    with loop.pause():
                        last_checkpoint = self._save(optimizer, schedule, scaler, batches, skipped) or last_checkpoint
                    trigger.saved(self.global_step)
                if stop or out_of_time or target_reached:
                    break
        display.clear()
        unfinished = self.global_step < config.num_train_steps
        interrupted = signals.received if unfinished else None
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
        return loop.result(resumed_from, restore_seconds, interrupted, budget_exhausted, target_reached, skipped,
                           last_checkpoint)

    def _train_step(self, model: nn.Module, batches: TrainBatches, optimizer, schedule, scaler,
                    loop: "_LoopStats") -> tuple[torch.Tensor, torch.Tensor | None, bool]:
        """One optimizer step over gradient_accumulation_steps micro-batches: (mean loss, grad norm, skipped)."""
        accumulation = self.train_config.gradient_accumulation_steps
        total_loss = torch.zeros((), device=self.device)
        for micro_step in range(accumulation):
            batch = next(batches)
            loop.count_batch(batch)
            batch = {name: tensor.to(self.device, non_blocking=True) for name, tensor in batch.items()}
            # Gradients are all-reduced once per optimizer step, on the last micro-batch, not on every one.
            defer_sync = micro_step < accumulation - 1
            with model.no_sync() if defer_sync and hasattr(model, "no_sync") else nullcontext():
                with self._autocast():
                    loss = model(**batch).loss / accumulation
                scaler.scale(loss).backward()
            total_loss += loss.detach()
        grad_norm = None
        if self.train_config.max_grad_norm is not None:
            scaler.unscale_(optimizer)
            grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.train_config.max_grad_norm)
        scale_before = scaler.get_scale() if scaler.is_enabled() else None
        self._step_lr = optimizer.param_groups[0]["lr"]
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        skipped = scaler.is_enabled() and scaler.get_scale() < scale_before
        if not skipped:
            schedule.step()
            self.global_step += 1
        return total_loss, grad_norm, skipped

    def _report(self, window: dict[str, Any], metrics: MetricsLog | None, display: ProgressDisplay, scaler,
                batches: TrainBatches, skipped: int, last_checkpoint: str | None) -> None:
        if not math.isfinite(window["loss"]) and self.train_config.precision != "fp16":
            raise TrainingDivergedError(f"loss is {window['loss']} at step {self.global_step}; the last checkpoint "
                                        f"is {last_checkpoint}")
        record = {"step": self.global_step, "epoch": round(batches.epoch, 4), **window,
                  "lr": self._step_lr, "skipped_steps": skipped,
                  "loss_scale": scaler.get_scale() if scaler.is_enabled() else None,
                  "memory_bytes": peak_memory_bytes(self.device)}
        if metrics is not None:
            metrics.write(record)
        display.clear()
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
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for start in range(shard.start, shard.stop, batch_size):
                    stop = min(start + batch_size, shard.stop)
                    batch = {name: tensor[start:stop].to(self.device) for name, tensor in features.items()}
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


class _LoopStats:
    """Counts and clocks of the training loop: per-log-window figures, and the run's steady-state throughput."""

    def __init__(self, estimator: Estimator, batches: TrainBatches, config: TrainConfig):
        self.estimator, self.batches = estimator, batches
        self.device, self.world_size = estimator.device, estimator.dist.world_size
        self.start_step = estimator.global_step
        self.exclude = min(config.excluded_steps, (config.num_train_steps - self.start_step) // 2)
        self.started = self.window_started = time.perf_counter()
        self.steady_started: float | None = None
        self.steady_start_sentences = 0
        self.steps = 0
        self.totals: Counter[str] = Counter()  # sentences, tokens (padding included), real_tokens
        self.window: Counter[str] = Counter()  # the same since the last log line
        self.window_loss = torch.zeros((), device=self.device)
        self.window_counted = 0
        self.last_grad_norm: torch.Tensor | None = None
        self.consecutive_skipped = 0
        self.saves, self.save_seconds, self.steady_save_seconds = 0, 0.0, 0.0
        self.evaluation_seconds = 0.0
        self.last_loss: float | None = None

    def count_batch(self, batch: Mapping[str, torch.Tensor]) -> None:
        input_ids, mask = batch.get("input_ids"), batch.get("attention_mask")
        tokens = input_ids.numel() if input_ids is not None else 0
        # Every rank trains a batch of the same shape; real tokens are this rank's, scaled alike.
        counts = {"sentences": len(next(iter(batch.values()))), "tokens": tokens,
                  "real_tokens": int(mask.sum()) if mask is not None else tokens}
        counts = {name: value * self.world_size for name, value in counts.items()}
        self.totals.update(counts)
        self.window.update(counts)

    def after_step(self, loss: torch.Tensor, grad_norm: torch.Tensor | None, skipped: bool) -> None:
        self.steps += 1
        self.consecutive_skipped = self.consecutive_skipped + 1 if skipped else 0
        if not skipped:
            self.window_loss += loss
            self.window_counted += 1
            self.last_grad_norm = grad_norm
        if self.steps == self.exclude and self.steady_started is None:
            synchronize(self.device)
            self.steady_started, self.steady_start_sentences = time.perf_counter(), self.totals["sentences"]

    def peek_loss(self) -> float:
        return (self.window_loss / max(1, self.window_counted)).item()

    def window_rate(self) -> float:
        return self.window["sentences"] / max(1e-9, time.perf_counter() - self.window_started)

    def budget_spent(self) -> bool:
        """Whether this invocation's training loop (checkpoint saves included) has used up max_train_seconds."""
        budget = self.estimator.train_config.max_train_seconds
        return budget is not None and time.perf_counter() - self.started >= budget

    def eta(self, step: int) -> float:
        done = step - self.start_step
        total = self.estimator.train_config.num_train_steps - self.start_step
        elapsed = time.perf_counter() - self.started
        eta = elapsed / done * (total - done) if done else 0.0
        budget = self.estimator.train_config.max_train_seconds
        return eta if budget is None else min(eta, max(0.0, budget - elapsed))

    def mean_loss(self) -> float:
        """The window's mean loss over every rank (each measured its own share of the batches)."""
        return self.estimator.dist.mean(self.peek_loss())

    def take_window(self) -> dict[str, Any]:
        elapsed = max(1e-9, time.perf_counter() - self.window_started)
        loss = self.mean_loss() if self.window_counted else math.nan
        window = {"loss": loss, "grad_norm": None if self.last_grad_norm is None else self.last_grad_norm.item(),
                  "seq_per_s": self.window["sentences"] / elapsed, "tokens_per_s": self.window["tokens"] / elapsed,
                  "real_tokens_per_s": self.window["real_tokens"] / elapsed,
                  "elapsed_s": round(time.perf_counter() - self.started, 3)}
        self.last_loss = loss
        self.window_loss.zero_()
        self.window_counted = 0
        self.window.clear()
        self.window_started = time.perf_counter()
        return window

    def check_finite(self, step: int, last_checkpoint: str | None) -> None:
        """Never save weights trained on a non-finite loss over a good checkpoint (fp16 skips such steps)."""
        loss = self.mean_loss() if self.window_counted else 0.0
        if not math.isfinite(loss):
            raise TrainingDivergedError(f"loss is {loss} before step {step}; not saving over the last checkpoint "
                                        f"{last_checkpoint}")

    @contextmanager
    def pause(self, save: bool = True) -> Iterator[None]:
        """Time a checkpoint save (or an evaluation), so the steady throughput can leave it out."""
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        if save:
            self.saves += 1
            self.save_seconds += seconds
        else:
            self.evaluation_seconds += seconds
        if self.steady_started is not None:
            self.steady_save_seconds += seconds

    def result(self, resumed_from: str | None, restore_seconds: float, interrupted: str | None,
               budget_exhausted: bool, target_reached: bool, skipped: int, last_checkpoint: str | None
               ) -> TrainResult:
        synchronize(self.device)
        now = time.perf_counter()
        seconds = now - self.started
        steady_rate, steady_steps = None, 0
        if self.steady_started is not None and self.steps > self.exclude:
            steady_seconds = now - self.steady_started - self.steady_save_seconds
            steady_rate = (self.totals["sentences"] - self.steady_start_sentences) / max(1e-9, steady_seconds)
            steady_steps = self.steps - self.exclude
        if self.window_counted:
            self.last_loss = self.mean_loss()
        estimator = self.estimator
        return TrainResult(
            global_step=estimator.global_step, resumed_from=resumed_from, restore_seconds=restore_seconds,
            interrupted_by=interrupted, budget_exhausted=budget_exhausted, target_reached=target_reached,
            steps=estimator.global_step - self.start_step, sentences=self.totals["sentences"], seconds=seconds,
            sentences_per_second=self.totals["sentences"] / max(1e-9, seconds),
            steady_sentences_per_second=steady_rate, steady_steps=steady_steps, checkpoint_saves=self.saves,
            checkpoint_seconds=self.save_seconds, evaluation_seconds=self.evaluation_seconds,
            padding_fraction=1 - self.totals["real_tokens"] / self.totals["tokens"] if self.totals["tokens"] else None,
            skipped_steps=skipped, final_loss=self.last_loss,
            last_checkpoint=last_checkpoint, epoch=self.batches.epoch)
