"""Compile on vs off, interleaved: the training step users train with (bertbench.bench.workload.train_step ->
TrainStep, torch.compile with inductor when compile=True), fp32, one fixed synthetic batch. Prints a markdown row
per setting (results.md beside this file) and every time as JSON on stderr.

    PYTHONPATH=. python docs/results/cpu-2core/compile/measure.py --model mini --kinds finetuning,pretraining \
        --variants baseline,full,selective --rounds 7 --warmup 3 --threads 1
"""

import argparse
import json
import statistics
import sys
import time

import torch

from bertbench.bench import workload

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mini")
parser.add_argument("--kinds", default="finetuning")
parser.add_argument("--variants", default="baseline,selective")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--rounds", type=int, default=7)
parser.add_argument("--warmup", type=int, default=2)
parser.add_argument("--threads", type=int, default=2)
args = parser.parse_args()
torch.set_num_threads(args.threads)
config = workload.bert_config(args.model, args.seq)
rows = []
for kind in args.kinds.split(","):
    for name in args.variants.split(","):
        variant = workload.Variant.parse(name)
        steps, warm = {}, {}
        for compiled in (False, True):
            step = workload.train_step(config, kind, variant, "fp32", args.batch, args.seq, compile=compiled)
            started = time.perf_counter()
            for _ in range(args.warmup):
                step()
            warm[compiled] = time.perf_counter() - started
            steps[compiled] = step
        times = {False: [], True: []}
        for r in range(args.rounds):
            for compiled in (False, True) if r % 2 == 0 else (True, False):
                started = time.perf_counter()
                steps[compiled]()
                times[compiled].append(time.perf_counter() - started)
        speedups = [e / c for e, c in zip(times[False], times[True])]
        row = {
            "model": args.model,
            "kind": kind,
            "variant": name,
            "batch": args.batch,
            "seq": args.seq,
            "eager_s": times[False],
            "compiled_s": times[True],
            "speedup": speedups,
            "warmup_eager_s": warm[False],
            "warmup_compiled_s": warm[True],
        }
        rows.append(row)

        def mmm(v, f="%.3f"):
            return "/".join(f % x for x in (min(v), statistics.median(v), max(v)))

        print(
            f"| {args.model} | {kind} | {name} | {mmm(times[False])} | {mmm(times[True])} | {mmm(speedups, '%.2f')} | "
            f"{warm[True] - args.warmup * statistics.median(times[True]):.0f} |",
            flush=True,
        )
        del steps
json.dump(rows, sys.stderr)
