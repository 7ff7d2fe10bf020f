#!/usr/bin/env bash
# Every GPU figure of the unpadded path in one call (about 5 minutes on one H200): the GPU tests, each file in its own
# process (a failed CUDA graph capture leaves its process's CUDA RNG unusable, and would fail every later test), then
# the training step users train with, bf16, real-text lengths, interleaved contenders with their spread:
#   BERT-base fine-tuning, batch 32 and 128: the default (unpadded, flash varlen, CUDA graphs), the padded path and
#   HF transformers with dynamic padding, eagerly; BERT-large, batch 32, the same; BERT-base compiled, default vs
#   padded. Logs and reports go under $OUT (default gpu-out), then into one tarball beside summary.txt.
#
#   OUT=/tmp/out bash docs/results/gpu-h200/unpadded/measure.sh
source "$(dirname "$0")/../common.sh"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" | tee -a "$summary"

pytest_gpu="python3 -m pytest -m gpu -n 0 -q -p no:cacheprovider"
stage tests-unpadded 60 $pytest_gpu tests/test_gpu_unpadded.py
stage tests-estimator 40 $pytest_gpu tests/test_estimator.py
stage tests-squad-recompute 40 $pytest_gpu tests/test_run_squad.py tests/test_recompute.py
stage tests-benches 40 $pytest_gpu tests/test_bench_throughput.py tests/test_bench_memory.py
grep -hE "^(FAILED|ERROR)|passed|failed" "$OUT"/tests-*.log | tee -a "$summary"

bench="python3 -m bertbench bench throughput --kinds finetuning --precisions bf16 --lengths real-text --steps 10
  --warmup 2 --no_memory --device cuda"
stage base-eager 70 $bench --model base --batch_sizes 32,128 --variants baseline,baseline/padded,hf-dynamic \
  --output_dir "$OUT/base-eager"
stage large-eager 70 $bench --model large --batch_sizes 32 --variants baseline,baseline/padded,hf-dynamic \
  --output_dir "$OUT/large-eager"
stage base-compiled 120 $bench --model base --batch_sizes 128,32 --variants baseline,baseline/padded --compile \
  --output_dir "$OUT/base-compiled"
grep -h "seq/s" "$OUT"/base-eager.log "$OUT"/large-eager.log "$OUT"/base-compiled.log | tee -a "$summary"
pack
