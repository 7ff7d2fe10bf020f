"""The names of the files a run directory (a runner's --output_dir) holds, in one place: the runners write them,
the benches, the report and the demo read them, and docs/ lists them."""

from __future__ import annotations

import re

# A training checkpoint: ckpt-<step>.pt, the step zero-padded to 9 digits so names sort by step.
CHECKPOINT_NAME = re.compile(r"^ckpt-(\d+)\.pt$")
CHECKPOINT_GLOB = "ckpt-*.pt"  # what a shell pattern or a message calls them
# An independent worker's own directory of checkpoints (training without gradient all-reduce).
WORKER_DIR_PREFIX = "worker-"
METRICS = "metrics.jsonl"  # one JSON object per logged training step (training.metrics)
EVALS = "evals.jsonl"  # run_pretraining: one JSON object per evaluation
TRAIN_RESULTS = "train_results.json"  # the training summary, written after a checkpoint
EVAL_RESULTS = "eval_results.json"  # the dev-set figures by key
EVAL_RESULTS_TEXT = "eval_results.txt"  # the same figures as Google's `key = value` lines
ALL_RESULTS = "all_results.json"  # HF's: the eval_* figures of eval_results.json, as HF's Trainer merges them
RUN_RECORD = "bertbench_run.json"  # which runner made the directory, its flags, model config and processes
LOCK = ".bertbench.lock"  # the run directory's flock (runners.run_lock)
GOOGLE_TEST_RESULTS = "test_results.tsv"  # run_classifier --do_predict: Google's class probabilities per example
SQUAD_PREDICTIONS = "predictions.json"  # run_squad --do_predict: question id -> answer text
SQUAD_NBEST = "nbest_predictions.json"  # question id -> the n best answers with probabilities and logits
SQUAD_NULL_ODDS = "null_odds.json"  # SQuAD v2.0: question id -> null score minus best span score
# TensorBoard's event files (training.events): each command's own, named events.out.tfevents.<seconds>.<host>.bertbench
# (the seconds after every earlier file's, so that names sort in the order they were written), in the logging
# directory (default: the run directory); the evaluations' in its eval/ subdirectory, as tf.estimator kept them.
EVENT_FILE_NAME = re.compile(r"^events\.out\.tfevents\.(\d{10})\..+\.bertbench$")
EVAL_EVENTS_DIR = "eval"


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:09d}.pt"


def worker_dir_name(rank: int) -> str:
    return f"{WORKER_DIR_PREFIX}{rank:05d}"


def event_file_name(seconds: int, host: str) -> str:
    return f"events.out.tfevents.{seconds:010d}.{host}.bertbench"
