"""Where a run starts, and the state that a checkpoint carries between invocations.

`decide_start` is the one place that answers "where does this run start?": afresh, resuming its own newest checkpoint,
warm-started from --init_checkpoint, continuing an earlier phase's checkpoint, or (for evaluation and prediction)
restoring the run's checkpoint. Runners call it once and hand the answer to the Estimator.

`TrainingCheckpoints` saves and loads the stateful parts of training as one checkpoint: the model, the step's
optimizer, schedule and loss scaler, the data stream's position and the random generators of every rank. Under DDP
rank 0 writes one file holding every rank's data position and RNG state; independent workers each write their own in
worker-<rank>/, and old ones are pruned only once every worker has written (see decide_start).
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from bertbench.training import optim
from bertbench.training.batches import TrainBatches
from bertbench.training.checkpoint import (
    CheckpointError,
    checkpoint_path,
    checkpoint_step,
    list_checkpoints,
    load_checkpoint,
    newest_intact_checkpoint,
    prune_checkpoints,
    save_checkpoint,
    verify_checkpoint,
    worker_dir,
)
from bertbench.training.config import TrainConfig
from bertbench.training.distributed import Distributed
from bertbench.training.step import TrainStep

FRESH, RESUME, WARM_START, CONTINUE, RESTORE = "fresh", "resume", "warm_start", "continue", "restore"


@dataclass(frozen=True)
class RunStart:
    """How a run starts. `checkpoint`: the file resumed, continued or restored, or the --init_checkpoint a warm
    start reads; `step`: the global step the run starts at."""

    kind: str
    checkpoint: str | None = None
    step: int = 0


def trains_independently(train_config: TrainConfig | None, dist: Distributed) -> bool:
    """Whether this job's processes train as independent workers: several of them, without all-reduce
    (TrainConfig.sync_gradients False), each with its own checkpoints in worker-<rank>/."""
    return dist.enabled and train_config is not None and not train_config.sync_gradients


def decide_start(
    model_dir: str,
    *,
    training: bool,
    init_checkpoint: str | None = None,
    continue_phase: bool = False,
    earlier_phase_end: float | None = None,
    dist: Distributed | None = None,
    independent_workers: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> RunStart:
    """Training: resume the run's newest checkpoint (independent workers: the newest step every worker saved); else
    continue the earlier phase in init_checkpoint (`continue_phase`), warm-start from init_checkpoint, or start
    afresh. A phase may go on in the earlier phase's own directory (NVIDIA's phase 2): model_dir's checkpoints up to
    step `earlier_phase_end` are that phase's, continued from, not resumed. Evaluation/prediction: restore the run's
    newest checkpoint, else warm-start from init_checkpoint; with neither there is nothing to score, a
    CheckpointError."""
    if training:
        path = (
            _resume_path(model_dir, dist or Distributed(), log)
            if independent_workers
            else newest_intact_checkpoint(model_dir, log)
        )
        earlier = path is not None and earlier_phase_end is not None and checkpoint_step(path) <= earlier_phase_end
        if path is not None and not earlier:
            return RunStart(RESUME, path, checkpoint_step(path))
        if continue_phase:
            if earlier:
                return RunStart(CONTINUE, path, checkpoint_step(path))  # verified by newest_intact_checkpoint
            if not init_checkpoint:
                raise CheckpointError("continuing an earlier phase needs its checkpoint or run directory")
            given_file = not os.path.isdir(init_checkpoint)
            path = init_checkpoint if given_file else newest_intact_checkpoint(init_checkpoint, log)
            step = checkpoint_step(path) if path and os.path.isfile(path) else None
            if step is None:
                raise CheckpointError(
                    f"{init_checkpoint}: no bertbench checkpoint (ckpt-<step>.pt) of the earlier phase to continue from"
                )
            if given_file:  # a directory's newest intact one is verified already
                verify_checkpoint(path)
            return RunStart(CONTINUE, path, step)
        return RunStart(WARM_START, init_checkpoint) if init_checkpoint else RunStart(FRESH)
    path = newest_intact_checkpoint(model_dir, log)
    if path is not None:
        return RunStart(RESTORE, path, checkpoint_step(path))
    if init_checkpoint:
        return RunStart(WARM_START, init_checkpoint)
    raise CheckpointError(f"{model_dir}: no checkpoint to evaluate and no --init_checkpoint")


def _resume_path(model_dir: str, dist: Distributed, log: Callable[[str], None]) -> str | None:
    """Independent workers resume the newest step that every worker saved intact: a worker killed while the others
    were saving may lack the newest, and they must go on from the same step."""
    own_dir = worker_dir(model_dir, dist.rank)
    saved = dist.all_gather_object([step for step, _ in list_checkpoints(own_dir)])
    common = set(saved[0]).intersection(*saved[1:])
    if not common:
        if any(saved):
            log(
                f"warning: the workers' checkpoints in {model_dir}/worker-*/ have no step in common (a worker "
                "stopped before its first save): starting from the beginning"
            )
        return None
    intact = newest_intact_checkpoint(own_dir, log, [(step, checkpoint_path(own_dir, step)) for step in sorted(common)])
    return checkpoint_path(own_dir, min(dist.all_gather_object(checkpoint_step(intact))))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states, in types the safe (weights_only) loader reads."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    numpy_state = state["numpy"]
    np.random.set_state(
        (
            numpy_state["kind"],
            numpy_state["keys"].numpy().astype(np.uint32),
            numpy_state["position"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_weights(model: nn.Module, path: str, state: Mapping[str, Any]) -> None:
    """A checkpoint's weights into `model`; a checkpoint of another model is a CheckpointError naming the file."""
    try:
        model.load_state_dict(state["model"])
    except KeyError:
        raise CheckpointError(f"{path}: no 'model' entry") from None
    except RuntimeError as error:
        detail = " ".join(str(error).split())
        raise CheckpointError(f"{path}: its weights do not fit this model ({detail[:300]})") from None


@dataclass
class Restored:
    """What a restored training state says about the run: its step and fp16 steps skipped so far."""

    step: int
    skipped_steps: int
    # This rank's open log window at the save (train_stats.LoopStats.window_state), None when the checkpoint holds
    # none of this rank's (an older checkpoint, another number of processes).
    log_window: dict[str, Any] | None = None


class TrainingCheckpoints:
    """Saves and restores the stateful parts of a training run (see the module's doc)."""

    def __init__(
        self,
        model_dir: str,
        keep_max: int,
        model: nn.Module,
        step: TrainStep,
        batches: TrainBatches,
        dist: Distributed,
        independent_workers: bool,
        log: Callable[[str], None],
    ):
        self.model_dir, self.keep_max = model_dir, keep_max
        self.model, self.step, self.batches, self.dist = model, step, batches, dist
        self.independent_workers, self.log = independent_workers, log
        self.directory = worker_dir(model_dir, dist.rank) if independent_workers else model_dir

    def save(
        self,
        global_step: int,
        skipped_steps: int,
        segments: list[dict[str, Any]] = (),
        log_window: dict[str, Any] | None = None,
    ) -> str | None:
        """Write the checkpoint of `global_step` (every rank calls this) with the run's figures so far (`segments`,
        see train_stats.LoopStats.segment) and this rank's open log window; the path written, None on other ranks."""
        own = (rng_state(), self.batches.state_dict(), log_window)
        gathered = [own] if self.independent_workers else self.dist.all_gather_object(own)
        if not (self.independent_workers or self.dist.is_main):
            return None
        state = {
            "model": self.model.state_dict(),
            **self.step.state_dict(),
            "data": [data for _, data, _ in gathered],
            "epoch": self.batches.epoch,
            "rng": [rng for rng, _, _ in gathered],
            "log_window": [window for _, _, window in gathered],
            "skipped_steps": skipped_steps,
            "segments": list(segments),
            "train_config": dataclasses.asdict(self.step.config),
        }
        if not self.independent_workers:
            return save_checkpoint(self.model_dir, global_step, state, self.keep_max)
        path = save_checkpoint(self.directory, global_step, state, keep_max=None)
        self.dist.barrier()
        prune_checkpoints(self.directory, self.keep_max, global_step)
        return path

    def prune(self, resumed_step: int) -> None:
        """Keep the newest keep_max checkpoints up to the one resumed at `resumed_step`: what the last save does, for
        a run killed after that save but before its prune (the run is at its last step, so no save of its own comes
        again)."""
        if self.independent_workers or self.dist.is_main:
            prune_checkpoints(self.directory, self.keep_max, resumed_step)

    def restore(self, path: str, state: Mapping[str, Any], seed: int) -> Restored:
        """Every part from `state` (read from `path`): the run continues exactly where it was saved."""
        self._check_rule(path, state.get("train_config"))
        load_weights(self.model, path, state)
        try:
            self.step.load_state_dict(state)
            data = state["data"]
            if isinstance(data, list):  # every rank's position; a list of one from an independent worker
                data = data[self.dist.rank] if len(data) == self.dist.world_size else data[0]
            self.batches.load_state_dict(data)
            rng_states, step, skipped = state["rng"], state["step"], state["skipped_steps"]
        except KeyError as error:
            raise CheckpointError(
                f"{path}: no {error.args[0]!r} entry; not a training checkpoint of this bertbench version"
            ) from None
        except ValueError as error:
            raise CheckpointError(f"{path}: does not fit this run: {error}") from None
        if self.independent_workers:
            set_rng_state(rng_states[0])  # each worker's file holds its own
        elif len(rng_states) == self.dist.world_size:
            set_rng_state(rng_states[self.dist.rank])
        else:  # the weights and data position still resume exactly; dropout draws cannot
            self.log(
                f"warning: {path} was written by {len(rng_states)} processes, this run has "
                f"{self.dist.world_size}: dropout random streams restart from the seed"
            )
            seed_everything(seed + self.dist.rank + step)
        windows = state.get("log_window") or []
        window = (
            windows[0]
            if self.independent_workers and windows
            else windows[self.dist.rank]
            if len(windows) == self.dist.world_size
            else None
        )
        return Restored(step, skipped, window)

    def _check_rule(self, path: str, recorded: Mapping[str, Any] | None) -> None:
        """A resumed run goes on with the optimizer rule it was trained with; a checkpoint written before bertbench
        had adam_bias_correction was trained with optim.legacy_rule's."""
        if recorded is None:
            return
        config = self.step.config
        was, now = optim.rule(*optim.recorded_rule(recorded)), optim.rule(config.optimizer, config.adam_bias_correction)
        if was != now:
            raise CheckpointError(
                f"{path}: was trained with {was}; resuming it with {now} would change the update "
                "rule mid-run: give the optimizer and adam_bias_correction it was trained with"
            )

    def continue_phase(self, path: str, state: Mapping[str, Any]) -> int:
        """Start from an earlier phase's checkpoint: its weights, its step count and, when it was trained with the
        same optimizer, the optimizer's moments; this run's learning rate and weight decay replace that phase's
        (NVIDIA's phase 2). Returns the step it ended at."""
        load_weights(self.model, path, state)
        step = int(state.get("step", 0))
        config = self.step.config
        now = (config.optimizer, config.adam_bias_correction)
        earlier = optim.recorded_rule(state["train_config"]) if "train_config" in state else None
        # The moments go on where the earlier phase's optimizer keeps them in the same form (lamb and nvlamb do).
        if (
            "optimizer" in state
            and earlier is not None
            and optim.optimizer_class(*earlier) is optim.optimizer_class(*now)
        ):
            try:
                self.step.load_optimizer_moments(state["optimizer"])
            except (ValueError, KeyError) as error:
                raise CheckpointError(f"{path}: its optimizer state does not fit this model ({error})") from None
        else:
            self.log(
                f"warning: {path} holds no state of {optim.rule(*now)} (it was trained with "
                f"{optim.rule(*earlier) if earlier else 'no saved optimizer'}): the optimizer's moments start "
                "from zero"
            )
        return step


def logs_kept_through(start: RunStart, model_dir: str) -> int | None:
    """The step up to which a run's logs in model_dir (metrics.jsonl, evals.jsonl, event files) are its history and
    are kept: a resumed run's checkpoint step, or the step an earlier phase ended at when the run goes on in that
    phase's directory; None for a run that starts its logs afresh."""
    if start.kind == RESUME:
        return start.step
    continued_here = (
        start.kind == CONTINUE
        and os.path.isdir(model_dir)
        and os.path.samefile(os.path.dirname(os.path.abspath(start.checkpoint)), model_dir)
    )
    return start.step if continued_here else None


def read_training_state(start: RunStart) -> dict[str, Any] | None:
    """The checkpoint a resumed or continued run reads (once), None for a run that starts without one."""
    if start.kind not in (RESUME, CONTINUE):
        return None
    return load_checkpoint(start.checkpoint, verify=False)  # decide_start has just verified it
