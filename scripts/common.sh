# Shared by run_glue.sh, run_squad.sh and run_pretraining.sh (sourced, not run): argument checks, the job
# templates' knobs, the nodes of the job, the launcher, the logged run.
#
# One node: num_gpu processes (torchrun when more than 1). Several nodes: run the same script on every node with
#   NNODES       nodes in the job (default 1)
#   NODE_RANK    this node's index, 0..NNODES-1 (names its log; rank 0 of the job writes the results)
#   MASTER_ADDR  the host of the c10d rendezvous, reachable from every node; MASTER_PORT its port (default 29500)
# or what the scheduler sets instead: a Kubeflow PyTorchJob's PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR,
# PET_MASTER_PORT, or, inside an srun step, one node per task (SLURM_STEP_NUM_TASKS, SLURM_PROCID, the step's first
# host). Also read: RDZV_ID (default bertbench-<run directory name>), RDZV_TIMEOUT (seconds to wait for every node to
# join, default 600), MAX_RESTARTS (times torchrun restarts the workers after one fails, default 0; they resume from
# the newest checkpoint), TORCH_ELASTIC_SHUTDOWN_TIMEOUT (seconds torchrun gives the workers to save a checkpoint
# after SIGTERM before it kills them; here 90 unless set, torchrun's own default is 30).

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

# knob_flags: set KNOB_FLAGS to the runner flags that the job templates' knobs ask for, read from the environment so
# that every template (PBS, Slurm, Kubernetes, a shell) sets them the same way; an unset or empty knob says nothing,
# and flags given to the script itself come after these and win:
#   MODELING           baseline | recompute                 --modeling
#   RECOMPUTE_POLICY   full | every-k | selective            --recompute_policy
#   MAX_TRAIN_SECONDS  a fixed wall-clock budget of training   --max_train_seconds (then evaluate, as usual)
#   LR_SCALING         none | linear | sqrt                  --lr_scaling (multiply the rate by 1, N, sqrt(N) processes)
#   EXTRA_FLAGS        more runner flags, separated by spaces (so a value cannot hold one)
# and CORES_PER_GPU, the CPU threads each process takes: OMP_NUM_THREADS, over what is set (PBS Pro sets it to the
# chunk's ncpus, which 4 processes would oversubscribe 4 times; torchrun would give every process 1 thread).
knob_flags() {
  KNOB_FLAGS=()
  [ -n "${MODELING:-}" ] && KNOB_FLAGS+=(--modeling="$MODELING")
  [ -n "${RECOMPUTE_POLICY:-}" ] && KNOB_FLAGS+=(--recompute_policy="$RECOMPUTE_POLICY")
  [ -n "${MAX_TRAIN_SECONDS:-}" ] && KNOB_FLAGS+=(--max_train_seconds="$MAX_TRAIN_SECONDS")
  [ -n "${LR_SCALING:-}" ] && KNOB_FLAGS+=(--lr_scaling="$LR_SCALING")
  if [ -n "${EXTRA_FLAGS:-}" ]; then
    local extra
    read -ra extra <<< "$EXTRA_FLAGS"
    KNOB_FLAGS+=("${extra[@]}")
  fi
  if [ -n "${CORES_PER_GPU:-}" ]; then
    if ! [[ "$CORES_PER_GPU" =~ ^[1-9][0-9]*$ ]]; then
      echo "$1: error: CORES_PER_GPU must be a positive integer, got '$CORES_PER_GPU'" >&2
      exit 2
    fi
    export OMP_NUM_THREADS=$CORES_PER_GPU
  fi
}

# resolve_nodes SCRIPT: set NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT from the environment (see above); exit 2
# with a one-line error when they do not describe a job.
resolve_nodes() {
  NNODES=${NNODES:-${PET_NNODES:-${SLURM_STEP_NUM_TASKS:-1}}}
  NODE_RANK=${NODE_RANK:-${PET_NODE_RANK:-${SLURM_STEP_NUM_TASKS:+${SLURM_PROCID:-}}}}
  MASTER_ADDR=${MASTER_ADDR:-${PET_MASTER_ADDR:-}}
  if [ -z "$MASTER_ADDR" ] && [ -n "${SLURM_STEP_NODELIST:-}" ]; then
    MASTER_ADDR=$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1)
  fi
  MASTER_PORT=${MASTER_PORT:-${PET_MASTER_PORT:-29500}}
  if ! [[ "$NNODES" =~ ^[1-9][0-9]*$ ]]; then
    echo "$1: error: NNODES must be a positive integer, got '$NNODES'" >&2
    exit 2
  fi
  if [ "$NNODES" -eq 1 ]; then
    NODE_RANK=0
    return
  fi
  if ! [[ "$NODE_RANK" =~ ^[0-9]+$ ]] || [ "$NODE_RANK" -ge "$NNODES" ]; then
    echo "$1: error: NODE_RANK must be 0..$((NNODES - 1)) on each of the NNODES=$NNODES nodes, got '$NODE_RANK'" >&2
    exit 2
  fi
  if [ -z "$MASTER_ADDR" ]; then
    echo "$1: error: NNODES=$NNODES needs MASTER_ADDR, the rendezvous host every node can reach" >&2
    exit 2
  fi
}

# run_logged RUN_DIR NUM_GPU MODULE FLAGS...: run the bertbench module on one process, or through torchrun
# (bertbench.runners.launch) on NUM_GPU processes per node and NNODES nodes (resolve_nodes first); append the command to
# RUN_DIR/command.log (node 0) and the output to RUN_DIR/train.log (train.node<NODE_RANK>.log on several nodes).
# A runner that refuses its input (status 2: a missing bert_config.json, a bad flag) has written nothing, and then
# neither has this: the logs and the directories made for them are removed, so a failed start leaves nothing behind
# (a run directory that existed before keeps its logs).
run_logged() {
  local run_dir=$1 num_gpu=$2 module=$3
  shift 3
  local launch=("$PYTHON" -m "$module") log=$run_dir/train.log
  if [ "$NNODES" -gt 1 ]; then
    launch=("$PYTHON" -m bertbench.runners.launch --nnodes="$NNODES" --nproc-per-node="$num_gpu" --rdzv-backend=c10d
            --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="${RDZV_ID:-bertbench-$(basename "$run_dir")}"
            --rdzv-conf=join_timeout="${RDZV_TIMEOUT:-600}" --max-restarts="${MAX_RESTARTS:-0}" -m "$module")
    log=$run_dir/train.node$NODE_RANK.log
  elif [ "$num_gpu" -gt 1 ]; then
    launch=("$PYTHON" -m bertbench.runners.launch --standalone --nproc-per-node="$num_gpu"
            --max-restarts="${MAX_RESTARTS:-0}" -m "$module")
  fi
  export TORCH_ELASTIC_SHUTDOWN_TIMEOUT=${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-90}
  local created=""  # the outermost directory that mkdir makes here, if any
  local missing=$run_dir
  while [ ! -e "$missing" ]; do
    created=$missing
    missing=$(dirname "$missing")
  done
  mkdir -p "$run_dir"
  if [ "$NODE_RANK" -eq 0 ]; then
    echo "${launch[*]} $*" | tee -a "$run_dir/command.log"
  fi
  local status=0
  "${launch[@]}" "$@" 2>&1 | tee -a "$log" || status=$?
  if [ "$status" -eq 2 ] && [ -n "$created" ]; then
    rm -f "$run_dir/command.log" "$log"
    find "$created" -depth -type d -empty -delete 2>/dev/null || true
  fi
  return "$status"
}

# modeling_tag FLAGS...: the modeling module and recompute policy the runner flags FLAGS choose, for a run directory's
# name (_baseline, _recompute-full, _recompute-every-k2, _recompute-selective), so that the baseline and recompute
# runs of the same arguments never share a directory. The last of a repeated flag wins, as in the runners.
modeling_tag() {
  local modeling=baseline policy=full every=2 flag
  while [ $# -gt 0 ]; do
    flag=$1
    shift
    case "$flag" in
      --modeling=*) modeling=${flag#*=} ;;
      --recompute-policy=*|--recompute_policy=*) policy=${flag#*=} ;;
      --recompute-every=*|--recompute_every=*) every=${flag#*=} ;;
      --modeling|--recompute-policy|--recompute_policy|--recompute-every|--recompute_every)
        [ $# -gt 0 ] || break
        case "$flag" in
          --modeling) modeling=$1 ;;
          --recompute-policy|--recompute_policy) policy=$1 ;;
          *) every=$1 ;;
        esac
        shift ;;
    esac
  done
  if [ "$modeling" != recompute ]; then
    echo "_$modeling"
  elif [ "$policy" = every-k ]; then
    echo "_recompute-every-k$every"
  else
    echo "_recompute-$policy"
  fi
}

# run_directory_suffix NUM_GPU: the end of a run directory's name, from the processes per node and the nodes.
run_directory_suffix() {
  if [ "$NNODES" -gt 1 ]; then
    echo "_gpu${1}_nodes${NNODES}"
  else
    echo "_gpu${1}"
  fi
}
