# Sourced by the PBS job templates: start a command once on every node of the job, as one node of a multi-node run.
#
# run_on_every_node COMMAND...: runs COMMAND (scripts/run_glue.sh or run_squad.sh and their arguments) once on each
# distinct host of $PBS_NODEFILE, in $PBS_O_WORKDIR, with NNODES, NODE_RANK, MASTER_ADDR (the first host),
# MASTER_PORT and RDZV_ID set, so that the torchrun agents of all nodes meet in one c10d rendezvous. The first host
# runs it here; the others through PBS_REMOTE_SHELL (default pbs_tmrsh, PBS's task-manager remote shell, which keeps
# the processes in the job; ssh works where nodes allow it). With IMAGE set (a .sif file), COMMAND runs inside it:
# `$CONTAINER_RUNTIME exec --nv IMAGE COMMAND` (CONTAINER_RUNTIME: singularity, the default, or apptainer).
# Returns non-zero if any node's command failed. On qdel, PBS sends SIGTERM to the processes of every node: the
# runners save a checkpoint and stop, and the same qsub resumes the run.

# Passed to every node: the remote shell does not carry the job's environment.
EVERY_NODE_VARIABLES=(BERT_DIR GLUE_DIR SQUAD_DIR RESULTS_DIR PYTHON RDZV_TIMEOUT MAX_RESTARTS
                      TORCH_ELASTIC_SHUTDOWN_TIMEOUT PATH VIRTUAL_ENV OMP_NUM_THREADS NCCL_DEBUG NCCL_SOCKET_IFNAME
                      GLOO_SOCKET_IFNAME)

run_on_every_node() {
  local hosts=() host_index status=0 pids=() command prefix=()
  mapfile -t hosts < <(awk 'NF && !seen[$1]++ {print $1}' "$PBS_NODEFILE")  # one line per process: keep hosts
  if [ ${#hosts[@]} -eq 0 ]; then
    echo "every_node.sh: error: $PBS_NODEFILE lists no hosts" >&2
    return 2
  fi
  prefix=(env NNODES="${#hosts[@]}" MASTER_ADDR="${MASTER_ADDR:-${hosts[0]}}" MASTER_PORT="${MASTER_PORT:-29500}"
          RDZV_ID="${RDZV_ID:-${PBS_JOBID:-bertbench}}")
  for name in "${EVERY_NODE_VARIABLES[@]}"; do
    if [ -n "${!name:-}" ]; then
      prefix+=("$name=${!name}")
    fi
  done
  local container=()
  if [ -n "${IMAGE:-}" ]; then
    container=("${CONTAINER_RUNTIME:-singularity}" exec --nv "$IMAGE")
  fi
  for host_index in "${!hosts[@]}"; do
    command=$(printf '%q ' cd "$PBS_O_WORKDIR")"&& exec "$(printf '%q ' "${prefix[@]}" NODE_RANK="$host_index" \
      "${container[@]}" "$@")
    if [ "$host_index" -eq 0 ]; then
      bash -c "$command" &
    else
      ${PBS_REMOTE_SHELL:-pbs_tmrsh} "${hosts[$host_index]}" bash -c "$(printf '%q' "$command")" &
    fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
  done
  return $status
}
