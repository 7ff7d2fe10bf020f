#!/usr/bin/env bash
# Fine-tune BERT on SQuAD, predict the dev set and score it, with the original run_squad.sh's positional arguments:
#
#   scripts/run_squad.sh [batch_size] [learning_rate] [precision] [use_xla] [num_gpu] [seq_length] [doc_stride] \
#                        [bert_model] [squad_version] [init_checkpoint] [epochs] [run_squad flags...]
#
#   batch_size       8                sequences per micro-batch per process (also the prediction batch)
#   learning_rate    5e-6
#   precision        fp16             fp16 | fp32 | bf16
#   use_xla          true             true: torch.compile (stands in for XLA)
#   num_gpu          GPUs seen, or 1  processes on each node; more than 1 (or several nodes) launches through torchrun
#   seq_length       384
#   doc_stride       128
#   bert_model       large            large | base: picks BERT_DIR when it is not set
#   squad_version    1.1              1.1 | 2.0 (2.0 trains and predicts with --version_2_with_negative)
#   init_checkpoint  $BERT_DIR/bert_model.ckpt   TF1 checkpoint, HF directory or bertbench checkpoint
#   epochs           2.0
#
# Environment: BERT_DIR (vocab.txt, bert_config.json, bert_model.ckpt; default the original's
# data/download/google_pretrained_weights/uncased_L-24_H-1024_A-16, or uncased_L-12_H-768_A-12 for base),
# SQUAD_DIR (holding train-v<version>.json and dev-v<version>.json; default data/download/squad/v<version>),
# RESULTS_DIR (default results), PYTHON (default python3); the job templates' knobs MODELING, RECOMPUTE_POLICY,
# MAX_TRAIN_SECONDS, LR_SCALING, EXTRA_FLAGS and CORES_PER_GPU (see knob_flags in common.sh); on several nodes
# NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT or the scheduler's variables, and RDZV_TIMEOUT, MAX_RESTARTS (see
# common.sh): run the same command on every node, with the data, BERT_DIR and RESULTS_DIR on a filesystem they
# share. The run directory,
# $RESULTS_DIR/squad<version>_<model>_<precision>_bs<batch>_lr<lr>_seq<len>_stride<n>_<modeling>_gpu<n>[_nodes<N>]
# (<model>: bert_model, or the name of BERT_DIR when that is set; <modeling> as in run_glue.sh, from MODELING and
# RECOMPUTE_POLICY or --modeling and --recompute-policy after the 11th argument), is named by the arguments: running the same command again resumes it from its newest checkpoint. The dev set is scored
# with the official definitions (eval_results.json); flags after the 11th argument go to run_squad as they are.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
RESULTS_DIR=${RESULTS_DIR:-results}
PYTHON=${PYTHON:-python3}

batch_size=${1:-"8"}
learning_rate=${2:-"5e-6"}
precision=${3:-"fp16"}
use_xla=${4:-"true"}
num_gpu=${5:-"$(visible_gpus)"}
seq_length=${6:-"384"}
doc_stride=${7:-"128"}
bert_model=${8:-"large"}
squad_version=${9:-"1.1"}

case "$bert_model" in
  large) default_bert_dir=data/download/google_pretrained_weights/uncased_L-24_H-1024_A-16 ;;
  base) default_bert_dir=data/download/google_pretrained_weights/uncased_L-12_H-768_A-12 ;;
  *) echo "run_squad.sh: error: bert_model must be large or base, got '$bert_model'" >&2; exit 2 ;;
esac
# The run directory names the model that runs: bert_model when it picks BERT_DIR, else BERT_DIR's own name.
if [ -n "${BERT_DIR:-}" ]; then
  model_name=$(basename "$BERT_DIR")
else
  model_name=$bert_model
fi
BERT_DIR=${BERT_DIR:-$default_bert_dir}
init_checkpoint=${10:-"$BERT_DIR/bert_model.ckpt"}
epochs=${11:-"2.0"}
shift $(( $# < 11 ? $# : 11 ))

check_launch_arguments run_squad.sh "$precision" "$num_gpu"
knob_flags run_squad.sh
set -- ${KNOB_FLAGS[@]+"${KNOB_FLAGS[@]}"} "$@"
resolve_nodes run_squad.sh
case "$squad_version" in
  1.1) version_2_with_negative=false ;;
  2.0) version_2_with_negative=true ;;
  *) echo "run_squad.sh: error: squad_version must be 1.1 or 2.0, got '$squad_version'" >&2; exit 2 ;;
esac
SQUAD_DIR=${SQUAD_DIR:-data/download/squad/v$squad_version}

run_dir="$RESULTS_DIR/squad${squad_version}_${model_name}_${precision}_bs${batch_size}_lr${learning_rate}"
run_dir+="_seq${seq_length}_stride${doc_stride}$(modeling_tag "$@")$(run_directory_suffix "$num_gpu")"
run_logged "$run_dir" "$num_gpu" bertbench.run_squad \
  --do_train=true --do_predict=true \
  --train_file="$SQUAD_DIR/train-v$squad_version.json" --predict_file="$SQUAD_DIR/dev-v$squad_version.json" \
  --vocab_file="$BERT_DIR/vocab.txt" --bert_config_file="$BERT_DIR/bert_config.json" \
  --init_checkpoint="$init_checkpoint" --version_2_with_negative="$version_2_with_negative" \
  --max_seq_length="$seq_length" --doc_stride="$doc_stride" --train_batch_size="$batch_size" \
  --predict_batch_size="$batch_size" --learning_rate="$learning_rate" --num_train_epochs="$epochs" \
  --precision="$precision" --use_xla="$use_xla" --output_dir="$run_dir" "$@"
echo "run directory: $run_dir (predict and score it again with: scripts/eval.sh $run_dir)"
