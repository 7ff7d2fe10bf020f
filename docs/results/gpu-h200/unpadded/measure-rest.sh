#!/usr/bin/env bash
# The unpadded path's GPU figures that measure.sh does not take, in one call (about 4 minutes on one H200): BERT-tiny
# and BERT-mini (default, padded, HF dynamic; batch 8 and 32), compiled BERT-large (batch 32), and dev accuracy on
# both paths on the GPU (the built-in GLUE task with seeds 1-3, the built-in SQuAD). Same conventions as measure.sh:
# logs and reports under $OUT (default gpu-out), then one tarball beside summary.txt.
#
#   OUT=/tmp/out bash docs/results/gpu-h200/unpadded/measure-rest.sh
source "$(dirname "$0")/../common.sh"

bench="python3 -m bertbench bench throughput --kinds finetuning --precisions bf16 --lengths real-text --steps 10
  --warmup 2 --no_memory --device cuda"
for model in tiny mini; do
  stage "$model-eager" 40 $bench --model $model --batch_sizes 8,32 --variants baseline,baseline/padded,hf-dynamic \
    --output_dir "$OUT/$model-eager"
done
stage large-compiled 120 $bench --model large --batch_sizes 32 --variants baseline,baseline/padded --compile \
  --output_dir "$OUT/large-compiled"
for seed in 1 2 3; do
  stage "glue-seed$seed" 25 python3 -m bertbench bench finetuning --task glue --variants baseline,baseline/padded \
    --rounds 1 --seed $seed --device cuda --output_dir "$OUT/glue-seed$seed"
done
stage squad 40 python3 -m bertbench bench finetuning --task squad --variants baseline,baseline/padded --rounds 1 \
  --device cuda --output_dir "$OUT/squad"
grep -h "seq/s" "$OUT"/*-eager.log "$OUT"/large-compiled.log | tee -a "$summary"
grep -h -A4 "^| variant" "$OUT"/glue-seed*/finetuning.md "$OUT"/squad/finetuning.md | tee -a "$summary"
pack
