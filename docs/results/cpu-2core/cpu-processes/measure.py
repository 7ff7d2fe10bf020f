"""A CPU node used whole (docs/clusters.md#a-cpu-node-used-whole), measured: run_classifier on this machine as one
process on all its cores against one pinned process per core, at the same global batch, in interleaved rounds.

    python docs/results/cpu-2core/cpu-processes/measure.py OUT_DIR [--rounds 3] [--model mini] [--samples 960]

Contenders, each the command a user types (fp32, the built-in MRPC-layout pairs lengthened to real text's lengths,
mean 64 of 128 tokens, the built-in 42-word vocabulary, so the embedding table is small):
- `all cores, unpinned`: `OMP_NUM_THREADS=<cores> bertbench classify ... --train_batch_size=B`
- `--cpu-processes=1`: `bertbench launch --standalone --cpu-processes=1 -m bertbench.run_classifier ... B`
- `--cpu-processes=core`: `bertbench launch --standalone --cpu-processes=core -m bertbench.run_classifier ...
  B/cores` (B/cores per process: the same global batch, so the same steps and the same learning-rate schedule)

Each run's steady seq/s (train_results.json's steady_sentences_per_second: the global batch's sequences per second,
its first steps left out) and dev accuracy; the medians with min-max and CV over the rounds go to OUT_DIR/results.md
and results.json, with every run's own figures and the load average before and after.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

from bertbench.bench import workload
from bertbench.common.noise import Spread, available_cores, load_average
from bertbench.tasks import synthetic


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="mini")
    parser.add_argument("--samples", type=int, default=960, help="training pairs (--max_train_samples)")
    parser.add_argument("--global_batch", type=int, default=32)
    args = parser.parse_args(argv)
    cores = available_cores()
    os.makedirs(args.out_dir, exist_ok=True)
    root = tempfile.mkdtemp(prefix="cpu-processes-")
    config = workload.bert_config(args.model, 128)
    config_file = os.path.join(root, "bert_config.json")
    with open(config_file, "w") as handle:
        json.dump({**dataclasses.asdict(config), "vocab_size": len(synthetic.vocabulary())}, handle)
    lengths = workload.Lengths.parse("real-text").draw(4096, 128, 0)
    data_dir = synthetic.write_glue_task(os.path.join(root, "glue"), "MRPC", lengths=lengths)
    common = [
        "--task_name=MRPC",
        "--do_train",
        "--do_eval",
        f"--data_dir={data_dir}",
        f"--vocab_file={synthetic.write_vocab(root)}",
        f"--bert_config_file={config_file}",
        "--max_seq_length=128",
        "--learning_rate=1e-3",
        "--num_train_epochs=1",
        f"--max_train_samples={args.samples}",
        "--save_checkpoints_secs=100000",
        "--device=cpu",
    ]
    launch = [sys.executable, "-m", "bertbench", "launch", "--standalone"]
    contenders = {
        "all cores, unpinned": (
            [sys.executable, "-m", "bertbench", "classify", f"--train_batch_size={args.global_batch}"],
            {"OMP_NUM_THREADS": str(cores)},
        ),
        "--cpu-processes=1": (
            [*launch, "--cpu-processes=1", "-m", "bertbench.run_classifier", f"--train_batch_size={args.global_batch}"],
            {},
        ),
        "--cpu-processes=core": (
            [
                *launch,
                "--cpu-processes=core",
                "-m",
                "bertbench.run_classifier",
                f"--train_batch_size={args.global_batch // cores}",
            ],
            {},
        ),
    }
    environment = {name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"}
    runs: dict[str, list[dict]] = {name: [] for name in contenders}
    loads = [load_average()]
    names = list(contenders)
    for round_index in range(args.rounds):
        for name in names if round_index % 2 == 0 else names[::-1]:
            command, extra = contenders[name]
            out = os.path.join(root, "runs", f"{names.index(name)}-{round_index}")
            done = subprocess.run(
                [*command, *common, f"--output_dir={out}"],
                env={**environment, **extra},
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
                return 1
            with open(os.path.join(out, "train_results.json")) as handle:
                train = json.load(handle)
            with open(os.path.join(out, "eval_results.json")) as handle:
                evaluated = json.load(handle)
            run = {
                "steady_seq_per_s": train["steady_sentences_per_second"],
                "global_step": train["global_step"],
                "placement": train["placement"],
                "dev_acc": evaluated["dev_acc"],
            }
            runs[name].append(run)
            print(f"round {round_index + 1} {name:<22} {run['steady_seq_per_s']:7.1f} seq/s", flush=True)
    loads.append(load_average())
    reference = Spread.of(run["steady_seq_per_s"] for run in runs[names[0]])
    lines = [
        f"# run_classifier on {cores} cores: one process against one per core ({args.model}, real-text lengths, "
        f"global batch {args.global_batch}, {args.samples} pairs, fp32)",
        "",
        f"{args.rounds} interleaved rounds; median (min–max, CV). Load average {loads[0]:.2f} before, "
        f"{loads[1]:.2f} after.",
        "",
        "| contender | placement (rank: CPUs, threads) | steady seq/s | vs all cores, unpinned | dev accuracy |",
        "|---|---|---|---|---|",
    ]
    summary = {}
    for name in names:
        rate = Spread.of(run["steady_seq_per_s"] for run in runs[name])
        placement = "; ".join(
            f"{place['rank']}: {place['cpus']}, {place['threads']}" for place in runs[name][0]["placement"]
        )
        accuracy = Spread.of(run["dev_acc"] for run in runs[name])
        lines.append(
            f"| {name} | {placement} | {rate.text('.1f')} | {rate.median / reference.median:.3f}x | "
            f"{accuracy.text('.3f')} |"
        )
        summary[name] = {"steady_seq_per_s": rate.median, "runs": runs[name]}
    with open(os.path.join(args.out_dir, "results.md"), "w") as handle:
        handle.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out_dir, "results.json"), "w") as handle:
        json.dump({"load_average": loads, "cores": cores, "contenders": summary}, handle, indent=2)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
