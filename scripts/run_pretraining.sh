#!/usr/bin/env bash
# Pre-train BERT, phase 1 (sequences of 128 tokens) or phase 2 (512, continuing phase 1), with NVIDIA's recipe as
# the defaults (LAMB, 8 processes: global batches of 65,536 and 32,768 sequences):
#
#   scripts/run_pretraining.sh [phase] [batch_size] [learning_rate] [precision] [num_gpu] [warmup] [train_steps] \
#                              [accumulation_steps] [save_checkpoint_steps] [seed] [run_pretraining flags...]
#
#                    phase 1          phase 2
#   phase            1                2                1 | 2
#   batch_size       64               16               sequences per micro-batch per process
#   learning_rate    6e-3             4e-3
#   precision        fp16             fp16             fp16 | fp32 | bf16
#   num_gpu          GPUs seen, or 1                   processes on each node; more than 1 (or several nodes)
#                                                      launches through torchrun
#   warmup           0.2843           0.128            warm-up proportion of the phase's steps
#   train_steps      7038             1563             optimizer steps of the phase
#   accumulation_steps  128           256              micro-batches per optimizer step
#   save_checkpoint_steps  200        200              a checkpoint every this many steps (and every 20 minutes)
#   seed             12439            12439
#
# Environment: BERT_DIR (bert_config.json; default the original's
# data/download/google_pretrained_weights/uncased_L-24_H-1024_A-16), DATA_DIR_PHASE1 / DATA_DIR_PHASE2 (directories
# of hdf5 shards in NVIDIA's layout, 128 tokens with 20 predictions and 512 with 80; defaults NVIDIA's
# data/hdf5_lower_case_1_seq_len_<len>_max_pred_<n>_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5/wikicorpus_en),
# EVAL_DIR (evaluation shards: scored at the end, and with EVAL_ITER_SAMPLES every that many training sequences;
# TARGET_MLM_ACCURACY stops a run when met, MLPerf's is 0.720), RESULTS_DIR (default results), PYTHON (default
# python3); on several nodes NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT or the scheduler's variables (see
# common.sh). Runs go to $RESULTS_DIR/pretraining_<precision>_<modeling>_gpu<n>[_nodes<N>]/phase<phase> (<modeling> as
# in run_glue.sh, from --modeling and --recompute-policy after the 10th argument); phase 2 starts from
# phase1/ next to it (or PHASE1_DIR). Running the same command again resumes the phase from its newest checkpoint.
# Flags after the 10th argument go to run_pretraining as they are.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BERT_DIR=${BERT_DIR:-data/download/google_pretrained_weights/uncased_L-24_H-1024_A-16}
RESULTS_DIR=${RESULTS_DIR:-results}
PYTHON=${PYTHON:-python3}
NVIDIA_DATA=data/hdf5_lower_case_1_seq_len_%s_max_pred_%s_masked_lm_prob_0.15_random_seed_12345_dupe_factor_5
DATA_DIR_PHASE1=${DATA_DIR_PHASE1:-$(printf "$NVIDIA_DATA" 128 20)/wikicorpus_en}
DATA_DIR_PHASE2=${DATA_DIR_PHASE2:-$(printf "$NVIDIA_DATA" 512 80)/wikicorpus_en}

phase=${1:-"1"}
case "$phase" in
  1) defaults=(64 6e-3 0.2843 7038 128 128 20 "$DATA_DIR_PHASE1") ;;
  2) defaults=(16 4e-3 0.128 1563 256 512 80 "$DATA_DIR_PHASE2") ;;
  *) echo "run_pretraining.sh: error: phase must be 1 or 2, got '$phase'" >&2; exit 2 ;;
esac
batch_size=${2:-"${defaults[0]}"}
learning_rate=${3:-"${defaults[1]}"}
precision=${4:-"fp16"}
num_gpu=${5:-"$(visible_gpus)"}
warmup=${6:-"${defaults[2]}"}
train_steps=${7:-"${defaults[3]}"}
accumulation_steps=${8:-"${defaults[4]}"}
save_checkpoint_steps=${9:-"200"}
seed=${10:-"12439"}
shift $(( $# < 10 ? $# : 10 ))
seq_length=${defaults[5]}
max_predictions=${defaults[6]}
data_dir=${defaults[7]}

check_launch_arguments run_pretraining.sh "$precision" "$num_gpu"
resolve_nodes run_pretraining.sh

run_root="$RESULTS_DIR/pretraining_${precision}$(modeling_tag "$@")$(run_directory_suffix "$num_gpu")"
run_dir="$run_root/phase$phase"
phase_flags=()
if [ "$phase" = 2 ]; then
  phase1_dir=${PHASE1_DIR:-$run_root/phase1}
  if [ ! -d "$phase1_dir" ]; then
    echo "run_pretraining.sh: error: phase 2 starts from phase 1's run directory $phase1_dir, which does not exist" \
         "(run phase 1 first, or set PHASE1_DIR)" >&2
    exit 2
  fi
  phase_flags=(--phase2 --init_checkpoint="$phase1_dir")
fi
eval_flags=()
if [ -n "${EVAL_DIR:-}" ]; then
  eval_flags=(--do_eval --eval_dir="$EVAL_DIR")
  [ -n "${EVAL_ITER_SAMPLES:-}" ] && eval_flags+=(--eval_iter_samples="$EVAL_ITER_SAMPLES")
  [ -n "${TARGET_MLM_ACCURACY:-}" ] && eval_flags+=(--target_mlm_accuracy="$TARGET_MLM_ACCURACY")
fi
run_logged "$run_dir" "$num_gpu" bertbench.run_pretraining \
  --do_train --input_dir="$data_dir" --bert_config_file="$BERT_DIR/bert_config.json" \
  --max_seq_length="$seq_length" --max_predictions_per_seq="$max_predictions" --train_batch_size="$batch_size" \
  --num_accumulation_steps="$accumulation_steps" --learning_rate="$learning_rate" --precision="$precision" \
  --warmup_proportion="$warmup" --num_train_steps="$train_steps" --save_checkpoints_steps="$save_checkpoint_steps" \
  --seed="$seed" --output_dir="$run_dir" ${phase_flags[@]+"${phase_flags[@]}"} ${eval_flags[@]+"${eval_flags[@]}"} \
  "$@"
echo "run directory: $run_dir"
