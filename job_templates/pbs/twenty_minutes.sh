#!/usr/bin/env bash
# The original suite's headline experiment in one command on a PBS login node: the baseline model on 1 GPU and the
# recompute model on 2 nodes x 4 GPUs fine-tune on MNLI for the same wall-clock budget (20 minutes), each scored on
# the dev sets when its budget is spent; when both have ended, a third job runs scripts/eval.sh on them and
# `bertbench report` puts sentences/s, sentences seen and dev accuracy side by side:
# $RESULTS_DIR/report/report.md, report.json, report-training-progress.png and report-training-accuracy.png.
#
#   BERT_DIR=$PWD/data/uncased_L-24_H-1024_A-16 GLUE_DIR=$PWD/data/glue job_templates/pbs/twenty_minutes.sh
#
# Run it from the repository root. It submits baseline_1gpu.pbs, optimized_2x4gpu.pbs and compare.pbs (after both,
# `-W depend=afterany`) and prints their job ids. Variables: MAX_TRAIN_SECONDS (1200), RESULTS_DIR (default
# results/twenty-minutes-<date>-<time>: a fresh directory, so that the report holds these two runs only), the jobs'
# own (TASK MNLI, BATCH_SIZE, LEARNING_RATE 5e-5, PRECISION fp16, USE_XLA, SEQ_LENGTH 128, EPOCHS 3.0, WARMUP 0.1,
# INIT_CHECKPOINT, RECOMPUTE_POLICY, EXTRA_FLAGS, CORES_PER_GPU, IMAGE, CONTAINER_RUNTIME, PYTHON), passed to both,
# GPUS_PER_NODE (4) to the optimized job only (change its select line to match), and QSUB_OPTIONS: more qsub
# options for the three jobs, separated by spaces (-q QUEUE, -A ACCOUNT). Each job keeps its own batch and USE_XLA
# unless they are set: the baseline 24 and true, the optimized job 48 and false, as in the original's runs;
# BATCH_SIZE sets both batches, BASELINE_BATCH_SIZE and OPTIMIZED_BATCH_SIZE one job's (and win over BATCH_SIZE):
#
#   BASELINE_BATCH_SIZE=32 OPTIMIZED_BATCH_SIZE=64 BERT_DIR=... GLUE_DIR=... job_templates/pbs/twenty_minutes.sh
#
# Each run's learning-rate schedule is that of EPOCHS; the budget cuts it short, as the original's 20-minute runs
# did. Without qsub on PATH (not a PBS login node) it stops with one line and status 2, having submitted nothing: the
# line gives the command that runs the three jobs one after the other on this machine, each as a one-host job.
set -euo pipefail

if [ ! -f job_templates/pbs/baseline_1gpu.pbs ]; then
  echo "twenty_minutes.sh: error: run it from the repository root (job_templates/pbs/baseline_1gpu.pbs not found)" >&2
  exit 2
fi
for name in BERT_DIR GLUE_DIR; do
  if [ -z "${!name:-}" ]; then
    echo "twenty_minutes.sh: error: $name is not set (see job_templates/pbs/baseline_1gpu.pbs)" >&2
    exit 2
  fi
done
for name in BATCH_SIZE BASELINE_BATCH_SIZE OPTIMIZED_BATCH_SIZE; do
  if [ -n "${!name:-}" ] && ! [[ "${!name}" =~ ^[1-9][0-9]*$ ]]; then
    echo "twenty_minutes.sh: error: $name must be a positive integer, got '${!name}'" >&2
    exit 2
  fi
done
export MAX_TRAIN_SECONDS=${MAX_TRAIN_SECONDS:-1200}
export RESULTS_DIR=${RESULTS_DIR:-$PWD/results/twenty-minutes-$(date +%Y%m%d-%H%M%S)}
if ! [[ "$MAX_TRAIN_SECONDS" =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "twenty_minutes.sh: error: MAX_TRAIN_SECONDS must be a number of seconds, got '$MAX_TRAIN_SECONDS'" >&2
  exit 2
fi

# qsub -v NAME passes NAME's value here; only the set ones go, so that each job keeps its own defaults.
passed=()
for name in BERT_DIR GLUE_DIR RESULTS_DIR MAX_TRAIN_SECONDS TASK LEARNING_RATE PRECISION USE_XLA \
            SEQ_LENGTH EPOCHS WARMUP INIT_CHECKPOINT RECOMPUTE_POLICY EXTRA_FLAGS CORES_PER_GPU IMAGE \
            CONTAINER_RUNTIME PYTHON PATH VIRTUAL_ENV PYTHONPATH; do
  [ -n "${!name:-}" ] && passed+=("$name")
done
variables=$(IFS=,; echo "${passed[*]}")
read -ra options <<< "${QSUB_OPTIONS:-}"

# Each job's batch: its own variable, else BATCH_SIZE, else the job's default (nothing passed).
baseline_batch=${BASELINE_BATCH_SIZE:-${BATCH_SIZE:-}}
optimized_batch=${OPTIMIZED_BATCH_SIZE:-${BATCH_SIZE:-}}
baseline_variables=$variables${baseline_batch:+,BATCH_SIZE=$baseline_batch}
optimized_variables=$variables${GPUS_PER_NODE:+,GPUS_PER_NODE}${optimized_batch:+,BATCH_SIZE=$optimized_batch}

if ! command -v qsub >/dev/null 2>&1; then
  # The three jobs one after the other on this machine, each as a one-host job with what qsub -v would give it
  # (PATH and the Python environment are this shell's already).
  exported=()
  for name in "${passed[@]}"; do
    [[ " PATH VIRTUAL_ENV PYTHONPATH " == *" $name "* ]] || exported+=("$name=$(printf %q "${!name}")")
  done
  one_host="PBS_NODEFILE=<(echo localhost)"
  optimized_only="${GPUS_PER_NODE:+GPUS_PER_NODE=$(printf %q "$GPUS_PER_NODE") }"
  echo "twenty_minutes.sh: error: qsub not found: run it on a PBS login node, or try it on this machine, its jobs" \
       "one after the other as one-host jobs: ( export PBS_O_WORKDIR=$(printf %q "$PWD") ${exported[*]};" \
       "$one_host ${baseline_batch:+BATCH_SIZE=$baseline_batch }bash job_templates/pbs/baseline_1gpu.pbs;" \
       "$one_host $optimized_only${optimized_batch:+BATCH_SIZE=$optimized_batch }bash" \
       "job_templates/pbs/optimized_2x4gpu.pbs; bash job_templates/pbs/compare.pbs )" >&2
  exit 2
fi
baseline=$(qsub ${options[@]+"${options[@]}"} -v "$baseline_variables" job_templates/pbs/baseline_1gpu.pbs)
optimized=$(qsub ${options[@]+"${options[@]}"} -v "$optimized_variables" job_templates/pbs/optimized_2x4gpu.pbs)
compare=$(qsub ${options[@]+"${options[@]}"} -W "depend=afterany:$baseline:$optimized" -v "$variables" \
          job_templates/pbs/compare.pbs)
echo "baseline (1 GPU): $baseline"
echo "optimized (2 x 4 GPUs): $optimized"
echo "compare (after both): $compare -> $RESULTS_DIR/report/report.md"
