#!/usr/bin/env bash
# Fine-tune and evaluate BERT on a GLUE task, with the original run_glue.sh's positional arguments and defaults:
#
#   scripts/run_glue.sh [task_name] [batch_size] [learning_rate] [precision] [use_xla] [num_gpu] [seq_length] \
#                       [doc_stride] [epochs] [warmup] [init_checkpoint] [run_classifier flags...]
#
#   task_name        MNLI             a GLUE task: CoLA SST-2 MRPC STS-B QQP MNLI QNLI RTE WNLI
#   batch_size       24               sequences per micro-batch per process
#   learning_rate    5e-5
#   precision        fp16             fp16 | fp32 | bf16 (fp16 needs a GPU: a CPU trains in fp32 and says so)
#   use_xla          true             true: torch.compile (stands in for XLA)
#   num_gpu          1                processes on each node; more than 1 (or several nodes) launches through torchrun
#   seq_length       128
#   doc_stride       64               SQuAD's; kept for the original's argument order, unused by GLUE
#   epochs           3.0
#   warmup           0.1              warm-up proportion
#   init_checkpoint  $BERT_DIR/bert_model.ckpt   TF1 checkpoint, HF directory or bertbench checkpoint
#
# Environment: BERT_DIR (vocab.txt, bert_config.json, bert_model.ckpt; default the original's
# data/download/google_pretrained_weights/uncased_L-24_H-1024_A-16), GLUE_DIR (the GLUE download holding <task>/;
# default data/download/glue), RESULTS_DIR (default results), PYTHON (default python3); the job templates' knobs
# MODELING, RECOMPUTE_POLICY, MAX_TRAIN_SECONDS, LR_SCALING, EXTRA_FLAGS and CORES_PER_GPU (see knob_flags in
# common.sh); on several nodes NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT or the scheduler's variables, and
# RDZV_TIMEOUT, MAX_RESTARTS (see common.sh): run the same command on every node, with the data, BERT_DIR and
# RESULTS_DIR on a filesystem they share.
# The run directory is $RESULTS_DIR/<task>_<precision>_bs<batch>_lr<lr>_seq<len>_<modeling>_gpu<n>[_nodes<N>]
# (<modeling>: baseline, recompute-full, recompute-every-k2, recompute-selective, from MODELING and RECOMPUTE_POLICY
# or the --modeling and --recompute-policy flags given after the 11th argument): running the same command again
# resumes it from its newest checkpoint. Flags after the 11th argument go to run_classifier as they are.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
BERT_DIR=${BERT_DIR:-data/download/google_pretrained_weights/uncased_L-24_H-1024_A-16}
GLUE_DIR=${GLUE_DIR:-data/download/glue}
RESULTS_DIR=${RESULTS_DIR:-results}
PYTHON=${PYTHON:-python3}

task_name=${1:-"MNLI"}
batch_size=${2:-"24"}
learning_rate=${3:-"5e-5"}
precision=${4:-"fp16"}
use_xla=${5:-"true"}
num_gpu=${6:-"1"}
seq_length=${7:-"128"}
doc_stride=${8:-"64"}
epochs=${9:-"3.0"}
warmup=${10:-"0.1"}
init_checkpoint=${11:-"$BERT_DIR/bert_model.ckpt"}
shift $(( $# < 11 ? $# : 11 ))

check_launch_arguments run_glue.sh "$precision" "$num_gpu"
knob_flags run_glue.sh
set -- ${KNOB_FLAGS[@]+"${KNOB_FLAGS[@]}"} "$@"
resolve_nodes run_glue.sh
: "$doc_stride"  # accepted for the original's argument order; GLUE has no documents to stride

run_dir="$RESULTS_DIR/${task_name}_${precision}_bs${batch_size}_lr${learning_rate}_seq${seq_length}"
run_dir+="$(modeling_tag "$@")$(run_directory_suffix "$num_gpu")"
run_logged "$run_dir" "$num_gpu" bertbench.run_classifier \
  --task_name="$task_name" --do_train=true --do_eval=true \
  --data_dir="$GLUE_DIR/$task_name" --vocab_file="$BERT_DIR/vocab.txt" \
  --bert_config_file="$BERT_DIR/bert_config.json" --init_checkpoint="$init_checkpoint" \
  --max_seq_length="$seq_length" --train_batch_size="$batch_size" --learning_rate="$learning_rate" \
  --num_train_epochs="$epochs" --warmup_proportion="$warmup" --precision="$precision" --use_xla="$use_xla" \
  --output_dir="$run_dir" "$@"
echo "run directory: $run_dir (score it again with: scripts/eval.sh $run_dir)"
