# What the one-call GPU scripts here share (sourced, not run): $OUT (default gpu-out) with summary.txt, `stage` to
# run a command with a time limit into its log, the machine's line, and `pack`, which leaves $OUT as summary.txt and
# one tarball (the device tool brings back a few files only).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
summary="$OUT/summary.txt"
stage() {  # stage NAME SECONDS COMMAND...: the command's output in NAME.log, its status in the summary
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "== $name: exit $? in $((SECONDS - started)) s" | tee -a "$summary"
}
pack() {
  local archive
  archive=$(mktemp -d)/results.tgz
  tar czf "$archive" -C "$OUT" --exclude summary.txt . && \
    find "$OUT" -mindepth 1 -maxdepth 1 ! -name summary.txt -exec rm -rf {} + && mv "$archive" "$OUT/"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$summary"
