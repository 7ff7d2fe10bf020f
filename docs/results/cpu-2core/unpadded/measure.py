"""The unpadded path against the padded one, HF and the code before it, interleaved in one run on the same examples.

Every contender is the training step users train with (bertbench.bench.workload.train_step -> TrainStep: AdamW,
clipping, fp32), fed the same cycle of micro-batches: real-text lengths (the built-in distribution of `bench
throughput --lengths real-text`) or full-length ones. Contenders are `LENGTHS:VARIANT[:compile]` with the bench's
variant names (baseline, baseline/padded, baseline/KERNEL, hf, hf-dynamic, ...), plus `full:before`, the modeling
module of another checkout (--before, e.g. a `git worktree` of the commit before the unpadded path) on full-length
batches, holding the same weights. Rounds run A B C ..., then ... C B A. Prints a markdown row per contender
(results.md beside this file); --json writes every time.

    git worktree add /tmp/before <commit before>
    PYTHONPATH=. python docs/results/cpu-2core/unpadded/measure.py --model base --batch 8 --rounds 7 \\
        --contenders full:baseline,full:before,real-text:baseline,real-text:baseline/padded,real-text:hf-dynamic \\
        --before /tmp/before
"""

import argparse
import importlib.util
import json
import statistics
import sys
import time

import torch

from bertbench.bench import flops, workload
from bertbench.model import attention

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="base")
parser.add_argument("--kind", default="finetuning")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--rounds", type=int, default=7, help="Timed rounds; each contender steps once per round.")
parser.add_argument("--warmup", type=int, default=2)
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--contenders", default="full:baseline,real-text:baseline,real-text:baseline/padded")
parser.add_argument("--before", default=None, help="A checkout whose bertbench/modeling.py is `full:before`.")
parser.add_argument("--json", default=None, help="Write the settings and every step time here.")
parser.add_argument(
    "--min_padding_share",
    type=float,
    default=None,
    help="Set the CPU's attention.MIN_PADDING_SHARE: 0 runs every batch with padding unpadded.",
)
args = parser.parse_args()
torch.set_num_threads(args.threads)
if args.min_padding_share is not None:
    attention.MIN_PADDING_SHARE["cpu"] = args.min_padding_share
config = workload.bert_config(args.model, args.seq)
masked = 0 if args.kind == "finetuning" else workload.synthetic.masked_positions(args.seq)


def modeling_before(path):
    spec = importlib.util.spec_from_file_location("modeling_before", f"{path}/bertbench/modeling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


steps, compile_seconds = {}, {}
for contender in args.contenders.split(","):
    lengths_name, _, rest = contender.partition(":")
    name, _, compiled = rest.partition(":")
    lengths = workload.Lengths.parse(lengths_name)
    if name == "before":
        reference = workload.build(config, args.kind, workload.Variant.parse("baseline"))
        old = modeling_before(args.before)
        model = (
            old.BertForSequenceClassification(config, 2)
            if args.kind == "finetuning"
            else old.BertForPreTraining(config)
        )
        model.load_state_dict(reference.state_dict())
        step = workload.train_step(
            config,
            args.kind,
            workload.Variant.parse("baseline"),
            "fp32",
            args.batch,
            args.seq,
            model=model.train(),
            lengths=lengths,
            steps=args.rounds,
        )
    else:
        step = workload.train_step(
            config,
            args.kind,
            workload.Variant.parse(name, hf=True),
            "fp32",
            args.batch,
            args.seq,
            lengths=lengths,
            steps=args.rounds,
            compile=compiled == "compile",
        )
    started = time.perf_counter()
    for _ in range(args.warmup):
        step()
    compile_seconds[contender] = time.perf_counter() - started
    step.position = 0
    steps[contender] = step
    print(
        f"built {contender} ({compile_seconds[contender]:.1f} s for {args.warmup} warm-up steps)",
        file=sys.stderr,
        flush=True,
    )

times = {name: [] for name in steps}
for round_index in range(args.rounds):
    order = list(steps.items()) if round_index % 2 == 0 else list(reversed(steps.items()))
    for name, step in order:
        started = time.perf_counter()
        step()
        times[name].append(time.perf_counter() - started)

first = next(iter(steps))
reference_rate = args.batch / statistics.median(times[first])
print(f"| contender | step (s): median (min–max) | seq/s | vs {first} | real tokens/s | model TFLOP/s |")
print("|---|---|---|---|---|---|")
rows = []
for name, step in steps.items():
    seconds = times[name]
    median = statistics.median(seconds)
    real_tokens = step.per_step(lambda length: length)
    model_flops = step.per_step(lambda length: flops.train_flops(config, args.kind, length, masked))
    row = {
        "contender": name,
        "seconds": seconds,
        "seq_per_s": args.batch / median,
        "real_tokens_per_s": real_tokens / median,
        "tflops": model_flops / median / 1e12,
        "warmup_seconds": compile_seconds[name],
    }
    rows.append(row)
    print(
        f"| {name} | {median:.3f} ({min(seconds):.3f}–{max(seconds):.3f}) | {row['seq_per_s']:.2f} | "
        f"{row['seq_per_s'] / reference_rate:.2f}x | {row['real_tokens_per_s']:,.0f} | {row['tflops']:.3f} |"
    )
if args.json:
    with open(args.json, "w", encoding="utf-8") as handle:
        json.dump({"args": vars(args), "rows": rows}, handle)
