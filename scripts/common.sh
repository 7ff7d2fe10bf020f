# Shared by run_glue.sh and run_squad.sh (sourced, not run): argument checks, the launcher, the logged run.

visible_gpus() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi -L | grep -c '^GPU'
  else
    echo 1
  fi
}

# check_launch_arguments SCRIPT PRECISION NUM_GPU: exit 2 with a one-line error on a bad value.
check_launch_arguments() {
  case "$2" in
    fp16|fp32|bf16) ;;
    *) echo "$1: error: precision must be fp16, fp32 or bf16, got '$2'" >&2; exit 2 ;;
  esac
  if ! [[ "$3" =~ ^[1-9][0-9]*$ ]]; then
    echo "$1: error: num_gpu must be a positive integer, got '$3'" >&2
    exit 2
  fi
}

# run_logged RUN_DIR NUM_GPU MODULE FLAGS...: run the bertbench module on one process, or through torchrun on
# NUM_GPU; append the command to RUN_DIR/command.log and its output to RUN_DIR/train.log.
run_logged() {
  local run_dir=$1 num_gpu=$2 module=$3
  shift 3
  local launch=("$PYTHON" -m "$module")
  if [ "$num_gpu" -gt 1 ]; then
    launch=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node="$num_gpu" -m "$module")
  fi
  mkdir -p "$run_dir"
  echo "${launch[*]} $*" | tee -a "$run_dir/command.log"
  "${launch[@]}" "$@" 2>&1 | tee -a "$run_dir/train.log"
}
