"""Pre-training in bf16 against fp32 (issue 42's accuracy parity): the example data's run_pretraining command, from
the same seeds in both precisions; the loss curves and the final MLM evaluation side by side.

    bertbench example-data /tmp/ex
    python docs/results/cpu-2core/bf16-parity/pretraining.py /tmp/ex OUT_DIR [--steps 300] [--seeds 1,2,3]

Each run is `bertbench pretrain` on shards/phase1 (the example's tiny TF1 model config, 2 x 64, batch 16, lr 1e-3),
logging its loss every 10 steps (metrics.jsonl), evaluated on shards/eval. OUT_DIR gets results.md (the curves at a
few steps, the largest gap between the precisions on one seed against the largest gap between two seeds in fp32, and
the evaluation) and results.json (every logged loss).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def run(example: str, out: str, precision: str, seed: int, steps: int) -> dict:
    command = [
        sys.executable,
        "-m",
        "bertbench",
        "pretrain",
        "--do_train",
        "--do_eval",
        f"--input_dir={example}/shards/phase1",
        f"--eval_dir={example}/shards/eval",
        f"--bert_config_file={example}/bert/bert_config.json",
        "--max_seq_length=128",
        "--max_predictions_per_seq=20",
        "--train_batch_size=16",
        f"--num_train_steps={steps}",
        "--learning_rate=1e-3",
        "--log_step_count_steps=10",
        f"--precision={precision}",
        f"--seed={seed}",
        "--device=cpu",
        f"--output_dir={out}",
    ]
    subprocess.run(command, check=True, capture_output=True)
    with open(os.path.join(out, "metrics.jsonl")) as handle:
        curve = {record["step"]: record["loss"] for record in map(json.loads, handle) if "loss" in record}
    with open(os.path.join(out, "eval_results.json")) as handle:
        evaluated = json.load(handle)
    return {"curve": curve, "eval": {name: evaluated[name] for name in ("masked_lm_loss", "masked_lm_accuracy")}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("example")
    parser.add_argument("out_dir")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args(argv)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    precisions = ("fp32", "bf16")
    runs = {
        (precision, seed): run(
            args.example, os.path.join(args.out_dir, "runs", f"{precision}-{seed}"), precision, seed, args.steps
        )
        for seed in seeds
        for precision in precisions
    }
    steps = sorted(runs["fp32", seeds[0]]["curve"])
    precision_gap = max(
        abs(runs["bf16", seed]["curve"][step] - runs["fp32", seed]["curve"][step]) for seed in seeds for step in steps
    )
    seed_gap = max(
        max(runs["fp32", seed]["curve"][step] for seed in seeds)
        - min(runs["fp32", seed]["curve"][step] for seed in seeds)
        for step in steps
    )
    shown = [step for step in steps if step in (10, 50, 100) or step % 100 == 0]
    lines = [
        f"# run_pretraining, bf16 against fp32: example data, 2 x 64 model, batch 16, {args.steps} steps, seeds "
        f"{args.seeds}",
        "",
        "Training loss (the mean of each 10-step window) by step, per seed: fp32 / bf16.",
        "",
        "| step | " + " | ".join(f"seed {seed}" for seed in seeds) + " |",
        "|---|" + "---|" * len(seeds),
    ]
    for step in shown:
        cells = [f"{runs['fp32', seed]['curve'][step]:.3f} / {runs['bf16', seed]['curve'][step]:.3f}" for seed in seeds]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Largest gap between bf16 and fp32 on one seed at one step: {precision_gap:.4f}; largest gap between two "
        f"seeds in fp32 at one step: {seed_gap:.3f}.",
        "",
        "| evaluation (shards/eval) | " + " | ".join(f"seed {seed}" for seed in seeds) + " |",
        "|---|" + "---|" * len(seeds),
    ]
    for name in ("masked_lm_loss", "masked_lm_accuracy"):
        cells = [f"{runs['fp32', seed]['eval'][name]:.3f} / {runs['bf16', seed]['eval'][name]:.3f}" for seed in seeds]
        lines.append(f"| {name}: fp32 / bf16 | " + " | ".join(cells) + " |")
    with open(os.path.join(args.out_dir, "results.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out_dir, "results.json"), "w") as handle:
        json.dump({f"{precision}-{seed}": value for (precision, seed), value in runs.items()}, handle, indent=1)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
