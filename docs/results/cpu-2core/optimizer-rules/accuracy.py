"""Dev accuracy under each Adam rule at the same learning rate: run_classifier (as users run it) on the built-in
MRPC-sized task (3,668 train / 408 dev) with the tiny BERT from scratch, Google's rule (--adam_bias_correction=false,
the runners' default) against torch.optim.AdamW's (true), seeds interleaved; and the demo's GLUE step under each rule.

    PYTHONPATH=. python docs/results/cpu-2core/optimizer-rules/accuracy.py [--seeds 3] [--learning_rates 1e-4,1e-3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile

from bertbench.bench import finetuning
from bertbench.demo import run as demo
from bertbench.runners import classifier as run_classifier

WRITTEN: dict[str, dict] = {}  # inputs directory -> the flags that read it


def mrpc_accuracy(root: str, learning_rate: float, bias_correction: bool, seed: int) -> dict:
    args = finetuning.build_parser().parse_args(
        ["--task", "glue", "--max_seq_length", "64", "--learning_rate", str(learning_rate), "--seed", str(seed)]
    )
    config = finetuning.bert_config(args)
    inputs_dir = os.path.join(root, f"inputs-{seed}-{learning_rate}")
    if inputs_dir not in WRITTEN:  # the data, vocab and config once per setting, not once per rule
        os.makedirs(inputs_dir)
        WRITTEN[inputs_dir] = finetuning.write_inputs(inputs_dir, args, config)
    values = dict(WRITTEN[inputs_dir])
    values.update(
        do_train=True,
        adam_bias_correction=bias_correction,
        save_checkpoints_secs=0,
        output_dir=os.path.join(root, f"run-{learning_rate}-{bias_correction}-{seed}"),
    )
    return finetuning.train_once(run_classifier.SPEC, values, ["dev_acc"])


def demo_accuracy(learning_rate: float, bias_correction: bool, seed: int) -> float:
    settings = demo.DemoConfig(learning_rate=learning_rate, seed=seed, adam_bias_correction=bias_correction)
    config, train, dev = demo.glue_inputs(settings)
    result, _ = demo.train_one(settings, config, "baseline", None, train, dev)
    return result["dev_accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--learning_rates", default="1e-4,1e-3")
    parser.add_argument("--demo_learning_rates", default="5e-4")
    args = parser.parse_args()
    rules = {"google (no bias correction)": False, "torch AdamW (bias-corrected)": True}
    print("| run | learning rate | rule | dev accuracy, min / median / max over seeds |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for learning_rate in map(float, filter(None, args.learning_rates.split(","))):
            scores = {name: [] for name in rules}
            for seed in range(args.seeds):  # the two rules interleaved, seed by seed
                for name, bias_correction in rules.items():
                    scores[name].append(mrpc_accuracy(root, learning_rate, bias_correction, seed)["dev_acc"])
            for name, values in scores.items():
                print(
                    f"| run_classifier, built-in MRPC, tiny, 1 epoch | {learning_rate:g} | {name} | "
                    f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f} |",
                    flush=True,
                )
    for learning_rate in map(float, filter(None, args.demo_learning_rates.split(","))):
        scores = {name: [] for name in rules}
        for seed in range(args.seeds):
            for name, bias_correction in rules.items():
                scores[name].append(demo_accuracy(learning_rate, bias_correction, seed))
        for name, values in scores.items():
            print(
                f"| demo GLUE step (baseline, 200 steps) | {learning_rate:g} | {name} | "
                f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
