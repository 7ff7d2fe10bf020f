#!/usr/bin/env bash
# Score the newest checkpoint of a run on its dev set(s) and print the metrics:
#
#   scripts/eval.sh RESULTS_DIR [run_classifier flags...]
#
# RESULTS_DIR is a run directory (it holds bertbench_run.json) or a directory of them (run_glue.sh's RESULTS_DIR):
# each run is scored with the task, data, vocab and model it recorded; flags given here override those that do not
# change the run (--data_dir if the GLUE download moved, --eval_batch_size, --device). Results are also written to
# each run's eval_results.txt and eval_results.json. PYTHON defaults to python3.
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: scripts/eval.sh RESULTS_DIR [run_classifier flags...]" >&2
  exit 2
fi
results_dir=$1
shift
PYTHON=${PYTHON:-python3}

runs=()
if [ -f "$results_dir/bertbench_run.json" ]; then
  runs=("$results_dir")
else
  for record in "$results_dir"/*/bertbench_run.json; do
    [ -f "$record" ] && runs+=("$(dirname "$record")")
  done
fi
if [ ${#runs[@]} -eq 0 ]; then
  echo "eval.sh: error: $results_dir: no run directory (bertbench_run.json) here or one level down" >&2
  exit 1
fi

status=0
for run in "${runs[@]}"; do
  echo "== $run"
  "$PYTHON" -m bertbench.run_classifier --do_eval=true --output_dir="$run" "$@" || status=$?
done
exit $status
