#!/usr/bin/env bash
# Score the newest checkpoint of a run on its dev set(s) and print the metrics:
#
#   scripts/eval.sh [RESULTS_DIR] [runner flags...]
#
# RESULTS_DIR (default: the environment's RESULTS_DIR, else results) is a run directory (it holds bertbench_run.json) or a directory of them (run_glue.sh's and
# run_squad.sh's RESULTS_DIR): each run is scored by the runner that made it, with the task, data, vocab and model
# it recorded. GLUE runs are evaluated (run_classifier --do_eval); SQuAD runs predict their predict_file and score it
# (run_squad --do_predict: predictions.json, nbest_predictions.json, null_odds.json). Flags given here override
# those that do not change the run (--data_dir or --predict_file if the data moved, batch sizes, --device). Results
# are also written to each run's eval_results.txt and eval_results.json. PYTHON defaults to python3. Exit status: the
# README's policy (2: no run directory or an unreadable record; otherwise the last failing runner's status).
set -euo pipefail

# No argument, or flags only (the original's habit): the runs of $RESULTS_DIR (default results), where run_glue.sh
# and run_squad.sh put them.
if [ $# -ge 1 ] && [[ "$1" != -* ]]; then
  results_dir=$1
  shift
else
  results_dir=${RESULTS_DIR:-results}
fi
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
  exit 2
fi

status=0
for run in "${runs[@]}"; do
  echo "== $run"
  runner=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["runner"])' "$run/bertbench_run.json") \
    || { status=2; continue; }
  case "$runner" in
    run_classifier) action=--do_eval=true ;;
    run_squad) action=--do_predict=true ;;
    *) echo "eval.sh: error: $run/bertbench_run.json: unknown runner '$runner'" >&2; status=2; continue ;;
  esac
  "$PYTHON" -m "bertbench.$runner" "$action" --output_dir="$run" "$@" || status=$?
done
exit $status
