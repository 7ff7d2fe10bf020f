#!/usr/bin/env bash
# Issue 29's GPU figures in one call (9 minutes at most on one H100/H200): `bertbench bench suite` at its standard
# size, whose report holds every figure the issue names (BERT-large phase 1/2 MFU vs HF, real-text fine-tuning vs HF
# and padding, recompute time and memory per policy, the largest batch per policy, the optimizer step vs its floor,
# compile on/off) and whether each target holds; then the GPU-marked tests of the benches, recompute and optimizers.
# Logs and reports go under $OUT (default gpu-out), then one tarball beside summary.txt.
#
#   OUT=/tmp/out bash docs/results/gpu-h200/suite/measure.sh
source "$(dirname "$0")/../common.sh"
stage suite 420 python3 -m bertbench bench suite --device cuda --output_dir "$OUT/suite"
sed -n '/^suite:/,$p' "$OUT/suite.log" | tee -a "$summary"  # the suite's summary: each headline with its target
stage gpu-tests 120 python3 -m pytest -q -m gpu -n 0 tests/test_gpu_benches.py tests/test_gpu_recompute.py \
  tests/test_bench_optimizer.py tests/test_bench_suite.py tests/test_optim.py tests/test_cuda_graphs.py
tail -5 "$OUT/gpu-tests.log" | tee -a "$summary"
pack
