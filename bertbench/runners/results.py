"""What a runner reports: train_results.json and the training summary, eval_results.txt/.json and the evaluation's
TensorBoard events, and NVIDIA's --json-summary file in dllogger's format."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
from collections.abc import Mapping
from typing import Any

import torch

from bertbench.common.durable import read_json, write_atomically
from bertbench.common.run_files import ALL_RESULTS, EVAL_RESULTS, EVAL_RESULTS_TEXT, TRAIN_RESULTS
from bertbench.common.signals import signal_status
from bertbench.model.factory import path_of
from bertbench.runners.config import RunnerConfig
from bertbench.runners.run_directory import Log, write_json
from bertbench.training import optim
from bertbench.training.config import RunConfig
from bertbench.training.distributed import Distributed
from bertbench.training.events import write_eval_events
from bertbench.training.loop import Estimator
from bertbench.training.stats import TrainResult, run_totals


def report_training(
    result: TrainResult,
    config: RunnerConfig,
    estimator: Estimator,
    dist: Distributed,
    log: Log,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """train_results.json and the summary NVIDIA's scripts print: sentences/s with and without the start-up. The
    figures are the whole run's, over every invocation that trained it (`segments`: each one's own), so a resumed
    or re-run command adds to them and never replaces them."""
    train, model = estimator.train_config, config.model
    if result.steps == 0 and result.resumed_from is not None:
        log(f"the run is already at its last step {result.global_step}: nothing to train, its figures are kept")
    totals = run_totals(result.segments) if result.segments else {}
    path, path_reason = path_of(estimator.model, dist.device, train.precision, train.compile)
    steady = totals.get("steady_sentences_per_second")
    summary = {
        **dataclasses.asdict(result),
        **totals,
        "invocation": invocation_figures(result),
        "sentences_per_20_minutes": None if steady is None else steady * 1200,
        "world_size": dist.world_size,
        "nodes": dist.nodes,
        "threads": torch.get_num_threads(),
        "placement": [dataclasses.asdict(place) for place in dist.placement],
        "device": str(dist.device),
        "modeling": model.modeling,
        "recompute_policy": model.recompute_policy if model.modeling == "recompute" else None,
        "path": path,
        "path_reason": path_reason,
        "precision": train.precision,
        "use_xla": train.compile,
        "train_batch_size": config.task.train_batch_size,
        "num_accumulation_steps": train.gradient_accumulation_steps,
        "max_seq_length": config.task.max_seq_length,
        "lr_scaling": config.task.lr_scaling,
        "learning_rate": train.learning_rate,
        "optimizer": train.optimizer,
        "adam_bias_correction": train.adam_bias_correction,
        "optimizer_rule": optim.rule(train.optimizer, train.adam_bias_correction),
        "sync_gradients": train.sync_gradients,
        **(extra or {}),
    }
    if dist.is_main:
        write_json(os.path.join(config.run.model_dir, TRAIN_RESULTS), summary)
    log("***** Training summary *****")
    log(
        f"  steps {result.steps} (global step {result.global_step}), {result.sentences} sentences in "
        f"{result.seconds:.1f} s, {result.checkpoint_saves} checkpoint saves ({result.checkpoint_seconds:.2f} s)"
    )
    if result.steps:
        log(
            f"  throughput with overhead: {result.sentences_per_second:.1f} sentences/s; the first step took "
            f"{result.first_step_seconds:.2f} s (start-up: compilation, CUDA graph captures, the first batch)"
        )
    if result.steady_sentences_per_second is not None:
        log(
            f"  throughput (steady, {result.steady_steps} steps, no checkpoint saves): "
            f"{result.steady_sentences_per_second:.1f} sentences/s = {result.sentences_per_20_minutes:,.0f} "
            f"sentences per 20 minutes"
        )
    if result.steady_real_tokens_per_second is not None and result.padding_fraction is not None:
        log(
            f"  real tokens (not padding): {result.steady_real_tokens_per_second:,.0f} tokens/s steady; padding was "
            f"{result.padding_fraction:.1%} of the batches' tokens, on the {summary['path']} path"
        )
    if len(result.segments) > 1 or (result.segments and not result.steps):
        rate = "n/a" if steady is None else f"{steady:.1f}"
        log(
            f"  the whole run, {len(result.segments)} segments: {totals['steps']} steps, {totals['sentences']} "
            f"sentences in {totals['seconds']:.1f} s, steady {rate} sentences/s"
        )
    return summary


def invocation_figures(result: TrainResult) -> dict[str, Any]:
    """This command's own share of the run's figures (train_results.json's top level holds the whole run's)."""
    return {
        name: getattr(result, name)
        for name in (
            "steps",
            "sentences",
            "seconds",
            "sentences_per_second",
            "steady_sentences_per_second",
            "steady_steps",
            "evaluation_seconds",
            "final_loss",
            "first_step_seconds",
        )
    }


def interrupted_status(result: TrainResult) -> int | None:
    """The shell's exit status for a run a signal stopped (128 + signal number), None for a finished run."""
    return None if result.interrupted_by is None else signal_status(result.interrupted_by)


def report_eval(
    run: RunConfig, title: str, results: Mapping[str, Any], header: Mapping[str, Any], is_main: bool, log: Log
) -> None:
    """Log the figures and (rank 0) write eval_results.txt (Google's `key = value` lines), eval_results.json (header
    first: what was scored), HF's all_results.json, whose eval_* figures it updates, and, with --report_to
    tensorboard, the figures at their global_step in the eval/ event files (training.events)."""
    log(f"***** Eval results ({title}) *****")
    lines = [f"{key} = {results[key]}" for key in sorted(results)]
    for line in lines:
        log(f"  {line}")
    if is_main:
        os.makedirs(run.model_dir, exist_ok=True)
        write_atomically(os.path.join(run.model_dir, EVAL_RESULTS_TEXT), "".join(f"{line}\n" for line in lines))
        write_json(os.path.join(run.model_dir, EVAL_RESULTS), {**header, **results})
        all_results = os.path.join(run.model_dir, ALL_RESULTS)
        earlier = read_json(all_results) if os.path.isfile(all_results) else {}
        write_json(
            all_results, {**earlier, **{key: value for key, value in results.items() if key.startswith("eval_")}}
        )
        if run.reports_to_tensorboard:
            write_eval_events(run.events_dir, results["global_step"], results, log)


# The final figures NVIDIA's scripts log through dllogger (--json-summary), with the units they declare.
SUMMARY_UNITS = {
    "e2e_train_time": "s",
    "training_sequences_per_second": "sequences/s",
    "final_loss": None,
    "raw_train_time": "s",
    "e2e_inference_time": "s",
    "inference_sequences_per_second": "sequences/s",
    "exact_match": None,
    "F1": None,
}


class JsonSummary:
    """NVIDIA's --json-summary file, as dllogger's JSONStreamBackend writes it, so that NVIDIA's tooling reads it:
    one `DLLL {json}` line per record, each with timestamp, datetime and elapsedtime (seconds since the command
    started); METADATA records give each figure's unit, a PARAMETER record the command's flags, and LOG records whose
    step is [] (dllogger's step=tuple()) the final figures. Rank 0 writes it when the command ends, whole or not at
    all; nothing is written without --json_summary."""

    def __init__(self, config: RunnerConfig):
        self.path, self.started, self.lines = config.task.json_summary, datetime.datetime.now(), []
        for metric, unit in SUMMARY_UNITS.items():
            self._add(type="METADATA", metric=metric, metadata={"unit": unit})
        self.log("PARAMETER", {"Config": [str(argparse.Namespace(**config.args))]})  # NVIDIA's str(args)

    def _add(self, **record: Any) -> None:
        now = datetime.datetime.now()
        stamp = {
            "timestamp": str(now.timestamp()),
            "datetime": str(now.astimezone()),
            "elapsedtime": str((now - self.started).total_seconds()),
        }
        self.lines.append("DLLL " + json.dumps({**stamp, **record}) + "\n")

    def log(self, step: str | list, data: Mapping[str, Any]) -> None:
        if data:
            self._add(type="LOG", step=step, data=dict(data))

    def elapsed(self) -> float:
        """Seconds since the command started (NVIDIA's e2e times)."""
        return (datetime.datetime.now() - self.started).total_seconds()

    def write(self, is_main: bool) -> None:
        if self.path is not None and is_main:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            write_atomically(self.path, "".join(self.lines))
