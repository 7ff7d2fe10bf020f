# Sourced by the PBS job templates: stop in one line outside a PBS job, and start a command once on every node of the
# job, as one node of a multi-node run.
#
# require_pbs_job NAME...: returns 2, with one line on stderr, when any of the variables NAME... that PBS gives a job
# (PBS_O_WORKDIR, PBS_NODEFILE) is unset, as when the template runs outside PBS: what is missing, and the command that
# runs the template on this machine as a one-host job (PBS_O_WORKDIR the repository, a node file listing localhost).
#
# run_on_every_node COMMAND...: runs COMMAND (scripts/run_glue.sh or run_squad.sh and their arguments) once on each
# distinct host of $PBS_NODEFILE, in $PBS_O_WORKDIR, with NNODES, NODE_RANK, MASTER_ADDR (the first host),
# MASTER_PORT and RDZV_ID set, so that the torchrun agents of all nodes meet in one c10d rendezvous. The first host
# runs it here; the others through PBS_REMOTE_SHELL (below). With IMAGE set (a .sif file), COMMAND runs inside it:
# `$CONTAINER_RUNTIME exec --nv IMAGE COMMAND` (CONTAINER_RUNTIME: singularity, the default, or apptainer).
# Returns non-zero if any node's command failed; returns 2 with a one-line error, before any node starts, when the
# node file lists no host or the starter is not a command. On qdel, PBS sends SIGTERM to the processes of every node:
# the runners save a checkpoint and stop, and the same qsub resumes the run.
#
# Every node runs the same argument vector, each word passed on as it is, never re-quoted:
#   /bin/bash -c 'cd -- "$1" && shift && exec "$@"' every_node $PBS_O_WORKDIR /usr/bin/env NNODES=... NODE_RANK=k
#     MASTER_ADDR=... MASTER_PORT=... RDZV_ID=... NAME=value... [$CONTAINER_RUNTIME exec --nv $IMAGE] COMMAND...
# Absolute interpreters, since a task manager's exec need not search PATH (and a remote task starts in $HOME).
# PBS_REMOTE_SHELL (default pbs_tmrsh) says how it reaches the other hosts; the name of its first word decides, and
# further words are that command's options (PBS_REMOTE_SHELL="ssh -o BatchMode=yes"):
#   pbs_tmrsh  `pbs_tmrsh HOST ARGV...`: PBS's task manager (tm_spawn) starts ARGV as given, no shell, inside the job
#              (qdel, accounting and cgroups reach it), with the environment the job started with.
#   pbsdsh     `pbsdsh -n INDEX -- ARGV...`: tm_spawn as well. INDEX is the line (from 0) of the host's first entry in
#              $PBS_NODEFILE: assumes PBS wrote the file in the order of the job's task-manager node list, as
#              pbs_tmrsh assumes when it looks a host up. pbsdsh exits 0 whatever the task did and reports a failed
#              task as "pbsdsh: task 0x... exit status N" (a failed start as "spawn failed on node ..."): such a line
#              makes that node count as failed (pbsdsh's stderr joins its stdout for that).
#   srun       `srun --nodes=1 --ntasks=1 --nodelist=HOST ARGV...`: a Slurm job step, argv as given, for a PBS job
#              that runs in a Slurm allocation (Slurm's qsub wrapper) where srun is the way onto a node.
#   any other  ssh, rsh, ...: they join the words after HOST into one line that the remote login shell parses once,
#              so ARGV goes as ONE word, each element quoted with printf %q (backslashes, which every shell undoes;
#              a value with a control character such as a newline comes as $'...' and needs a bash, ksh or zsh
#              login shell).

# Passed to every node: a task manager gives a task the environment the job started with, ssh a login one; what the
# job script (or a module it loads) sets and the knobs scripts/run_glue.sh and run_squad.sh read (knob_flags in
# scripts/common.sh: MODELING ... CORES_PER_GPU) go explicitly.
# LOGLEVEL is torchrun's (INFO: each node's agent logs its rendezvous and how its workers ended). Not
# CUDA_VISIBLE_DEVICES: PBS sets it for each node's own GPUs.
EVERY_NODE_VARIABLES=(BERT_DIR GLUE_DIR SQUAD_DIR RESULTS_DIR PYTHON RDZV_TIMEOUT MAX_RESTARTS
                      TORCH_ELASTIC_SHUTDOWN_TIMEOUT PATH VIRTUAL_ENV PYTHONPATH LD_LIBRARY_PATH OMP_NUM_THREADS
                      LOGLEVEL NCCL_DEBUG NCCL_SOCKET_IFNAME GLOO_SOCKET_IFNAME
                      MODELING RECOMPUTE_POLICY MAX_TRAIN_SECONDS LR_SCALING EXTRA_FLAGS CORES_PER_GPU)

require_pbs_job() {
  local missing=() name try
  for name in "$@"; do
    [ -n "${!name:-}" ] || missing+=("$name")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  try="PBS_O_WORKDIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && printf %q "$PWD")"
  [[ " $* " == *" PBS_NODEFILE "* ]] && try+=" PBS_NODEFILE=<(echo localhost)"
  echo "${0##*/}: error: not inside a PBS job (${missing[0]}${missing[1]:+ and ${missing[1]}} unset): submit it with" \
       "qsub, or try it on this machine as a one-host job, with the same variables: $try bash $(printf %q "$0")" >&2
  return 2
}

run_on_every_node() {
  local hosts=() first_lines=() host line index name status=0 pids=() pid prefix=() container=() argv=() starter=()
  local spec=${PBS_REMOTE_SHELL:-pbs_tmrsh}
  if [ ! -r "${PBS_NODEFILE:-}" ]; then
    echo "every_node.sh: error: PBS_NODEFILE ('${PBS_NODEFILE:-}') is not a readable file: not inside a PBS job?" >&2
    return 2
  fi
  # One line per MPI process: keep each host once, with the line (from 0) of its first entry for pbsdsh -n.
  while read -r host line; do
    hosts+=("$host")
    first_lines+=("$line")
  done < <(awk 'NF && !seen[$1]++ {print $1, NR - 1}' "$PBS_NODEFILE")
  if [ ${#hosts[@]} -eq 0 ]; then
    echo "every_node.sh: error: $PBS_NODEFILE lists no hosts" >&2
    return 2
  fi
  if [ ${#hosts[@]} -gt 1 ]; then
    # A path with spaces names one command; otherwise the words after the first are its options.
    if command -v -- "$spec" >/dev/null 2>&1; then
      starter=("$spec")
    else
      read -r -a starter <<< "$spec"
    fi
    if [ ${#starter[@]} -eq 0 ] || ! command -v -- "${starter[0]}" >/dev/null 2>&1; then
      echo "every_node.sh: error: PBS_REMOTE_SHELL='$spec' is not a command here; the ${#hosts[@]} hosts need one" \
           "to start the others (pbs_tmrsh, pbsdsh, ssh, rsh or srun)" >&2
      return 2
    fi
  fi

  prefix=(NNODES="${#hosts[@]}" MASTER_ADDR="${MASTER_ADDR:-${hosts[0]}}" MASTER_PORT="${MASTER_PORT:-29500}"
          RDZV_ID="${RDZV_ID:-${PBS_JOBID:-bertbench}}")
  for name in "${EVERY_NODE_VARIABLES[@]}"; do
    if [ -n "${!name:-}" ]; then
      prefix+=("$name=${!name}")
    fi
  done
  if [ -n "${IMAGE:-}" ]; then
    container=("${CONTAINER_RUNTIME:-singularity}" exec --nv "$IMAGE")
  fi
  for index in "${!hosts[@]}"; do
    argv=(/bin/bash -c 'cd -- "$1" && shift && exec "$@"' every_node "$PBS_O_WORKDIR"
          /usr/bin/env "${prefix[@]}" NODE_RANK="$index" "${container[@]}" "$@")
    host=${hosts[$index]}
    if [ "$index" -eq 0 ]; then
      "${argv[@]}" </dev/null &
    else
      case "${starter[0]##*/}" in
        pbs_tmrsh)
          "${starter[@]}" "$host" "${argv[@]}" </dev/null & ;;
        pbsdsh)
          # pbsdsh's exit status says nothing about the task: its report lines do (passed on unbuffered).
          (set -o pipefail
           "${starter[@]}" -n "${first_lines[$index]}" -- "${argv[@]}" </dev/null 2>&1 |
             awk '{ print; fflush() }
                  / task 0x[0-9A-Fa-f]+ exit status -?[1-9]|: spawn failed on node |^error -?[0-9]+ on spawn$/ {
                    failed = 1 }
                  END { exit failed ? 1 : 0 }') & ;;
        srun)
          "${starter[@]}" --nodes=1 --ntasks=1 --nodelist="$host" "${argv[@]}" </dev/null & ;;
        *)
          "${starter[@]}" "$host" "$(printf '%q ' "${argv[@]}")" </dev/null & ;;
      esac
    fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do
    wait "$pid" || status=$?
  done
  return "$status"
}
