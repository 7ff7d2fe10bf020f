#!/usr/bin/env bash
# The GPU-marked tests on one H100 after issue 32's restructure, in one call of about 3 minutes: the unpadded and
# recompute kernels first, then the runners and benches on cuda:0 (the whole-suite test, ~2 minutes alone, is left
# out). Each test is cut at 60 s (pytest-timeout) and the whole run at 180 s; the log goes to $OUT/gpu-tests.log.
#
#   OUT=/tmp/out bash docs/results/gpu-h100/restructure/gpu-tests.sh
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
if [ -d .whl ]; then  # google-crc32c for the device's Python (see the README's GPU notes)
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu-tests.log"
timeout -k 5 180 python3 -m pytest -v --tb=short -m gpu -n 0 -p no:cacheprovider --timeout=60 --durations=15 \
  tests/test_gpu_unpadded.py tests/test_gpu_recompute.py tests/test_recompute.py tests/test_run_squad.py \
  tests/test_estimator.py tests/test_gpu_benches.py tests/test_bench_throughput.py tests/test_bench_memory.py \
  tests/test_bench_optimizer.py \
  >> "$OUT/gpu-tests.log" 2>&1
echo "exit $?" >> "$OUT/gpu-tests.log"
grep -E "PASSED|FAILED|ERROR|SKIPPED|^exit|passed|failed" "$OUT/gpu-tests.log" | tail -70
