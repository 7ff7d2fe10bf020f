"""Figures of the GLUE runner on this machine (a benchmark that prints numbers, not a test).

On an MRPC-sized task in the GLUE release layout (the built-in pairs: 3,668 train / 408 dev) and Google's BERT-Tiny
shape (2 layers, hidden 128) by default, through `run_classifier` as users run it:

1. Training sentences/s (steady state, as the original reported it) and dev accuracy: baseline vs each recompute
   policy, same seed, same weights at the start.
2. The cost of a timed checkpoint: seconds per save and file size, with --save_checkpoints_secs short enough to save
   several times, and what that cost is as a share of training time at the default 1200 s.
3. Time to resume after SIGKILL: a training process is killed after its first checkpoint; the same command is run
   again, timed from launch until it has restored the checkpoint and is training again, and the restore alone.

    python benchmarks/glue_runner.py                       # about 6 minutes on 2 cores
    python benchmarks/glue_runner.py --layers 4 --hidden 256 --output figures.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from bertbench.bench.output import machine, write_report
from bertbench.checkpoint import list_checkpoints
from bertbench.synthetic import write_glue_task, write_vocab

VARIANTS = (("baseline", "full"), ("recompute", "full"), ("recompute", "every-k"), ("recompute", "selective"))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="Transformer blocks (BERT-Tiny: 2).")
    parser.add_argument("--hidden", type=int, default=128, help="Hidden size (BERT-Tiny: 128); heads = hidden/64.")
    parser.add_argument("--seq", type=int, default=128, help="max_seq_length (GLUE's usual 128).")
    parser.add_argument("--batch", type=int, default=32, help="train_batch_size.")
    parser.add_argument("--epochs", type=float, default=3.0, help="num_train_epochs of each variant.")
    parser.add_argument("--save-secs", type=float, default=2.0, help="save_checkpoints_secs of the save-cost run.")
    parser.add_argument("--output", help="Also write the figures as JSON here.")
    return parser.parse_args(argv)


def write_inputs(root: str, args) -> None:
    write_glue_task(os.path.join(root, "glue"), "MRPC")
    os.makedirs(os.path.join(root, "bert"))
    write_vocab(os.path.join(root, "bert"))
    config = {"vocab_size": 64, "hidden_size": args.hidden, "num_hidden_layers": args.layers,
              "num_attention_heads": max(1, args.hidden // 64), "intermediate_size": 4 * args.hidden,
              "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
              "max_position_embeddings": 512, "type_vocab_size": 2, "initializer_range": 0.02}
    with open(os.path.join(root, "bert", "bert_config.json"), "w") as handle:
        json.dump(config, handle)


def command(root: str, out: str, args, *extra: str) -> list[str]:
    return [sys.executable, "-m", "bertbench.run_classifier", "--task_name=MRPC", "--do_train",
            f"--data_dir={root}/glue/MRPC", f"--vocab_file={root}/bert/vocab.txt",
            f"--bert_config_file={root}/bert/bert_config.json", f"--max_seq_length={args.seq}",
            f"--train_batch_size={args.batch}", "--learning_rate=1e-3", f"--num_train_epochs={args.epochs}",
            "--log_step_count_steps=10", f"--output_dir={out}", *extra]


def read_json(path: str) -> dict:
    with open(path) as handle:
        return json.load(handle)


def throughput(root: str, args) -> list[dict]:
    rows = []
    for modeling, policy in VARIANTS:
        out = os.path.join(root, f"{modeling}-{policy}")
        subprocess.run(command(root, out, args, "--do_eval", f"--modeling={modeling}",
                               f"--recompute-policy={policy}"), check=True, capture_output=True)
        train, scores = read_json(f"{out}/train_results.json"), read_json(f"{out}/eval_results.json")
        name = modeling if modeling == "baseline" else f"recompute/{policy}"
        rows.append({"model": name, "steady_seq_per_s": train["steady_sentences_per_second"],
                     "seq_per_s_with_overhead": train["sentences_per_second"], "steps": train["steps"],
                     "sentences_per_20_minutes": train["sentences_per_20_minutes"], "dev_acc": scores["dev_acc"]})
        print(f"  {name:<20} {rows[-1]['steady_seq_per_s']:8.1f} seq/s  dev acc {scores['dev_acc']:.3f}",
              flush=True)
    return rows


def checkpoint_cost(root: str, args) -> dict:
    out = os.path.join(root, "timed")
    subprocess.run(command(root, out, args, f"--save_checkpoints_secs={args.save_secs}"), check=True,
                   capture_output=True)
    train = read_json(f"{out}/train_results.json")
    per_save = train["checkpoint_seconds"] / train["checkpoint_saves"]
    return {"saves": train["checkpoint_saves"], "seconds_per_save": per_save,
            "checkpoint_bytes": os.path.getsize(list_checkpoints(out)[-1][1]),
            "train_seconds": train["seconds"], "share_of_run": train["checkpoint_seconds"] / train["seconds"],
            "share_at_default_1200_s": per_save / 1200}


def resume_after_sigkill(root: str, args) -> dict:
    out = os.path.join(root, "killed")
    process = subprocess.Popen(command(root, out, args, "--save_checkpoints_steps=20"), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    while not list_checkpoints(out):
        if process.poll() is not None:
            raise RuntimeError("the training process ended before its first checkpoint")
        time.sleep(0.01)
    process.kill()
    process.wait()
    killed_at = list_checkpoints(out)[-1][0]
    started = time.perf_counter()
    resumed = subprocess.Popen(command(root, out, args, "--save_checkpoints_steps=20"), stdout=subprocess.PIPE,
                               text=True)
    to_resumed = None
    for line in resumed.stdout:
        if to_resumed is None and line.startswith("resumed from "):
            to_resumed = time.perf_counter() - started
    if resumed.wait() != 0:
        raise RuntimeError("the resumed run failed")
    train = read_json(f"{out}/train_results.json")
    return {"killed_after_checkpoint_step": killed_at, "restore_seconds": train["restore_seconds"],
            "launch_to_resumed_seconds": to_resumed, "resumed_from": train["resumed_from"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    print(f"GLUE runner figures: MRPC-sized built-in task, {args.layers} layers, hidden {args.hidden}, seq {args.seq}, "
          f"batch {args.batch}, {args.epochs} epochs, {torch.get_num_threads()} CPU threads, torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as root:
        write_inputs(root, args)
        print("1. throughput (steady, first steps and checkpoint saves excluded) and dev accuracy")
        rows = throughput(root, args)
        baseline = rows[0]["steady_seq_per_s"]
        for row in rows:
            row["vs_baseline"] = row["steady_seq_per_s"] / baseline
            print(f"  {row['model']:<20} {row['vs_baseline']:.2f}x baseline, "
                  f"{row['sentences_per_20_minutes']:,.0f} sentences per 20 minutes")
        saves = checkpoint_cost(root, args)
        print(f"2. timed checkpoints every {args.save_secs} s: {saves['saves']} saves, "
              f"{saves['seconds_per_save']*1000:.1f} ms each, {saves['checkpoint_bytes']/2**20:.1f} MiB; {100*saves['share_of_run']:.2f}% of this run, "
              f"{100*saves['share_at_default_1200_s']:.4f}% at the default 1200 s")
        resume = resume_after_sigkill(root, args)
        print(f"3. SIGKILL after the step-{resume['killed_after_checkpoint_step']} checkpoint: restore "
              f"{resume['restore_seconds']*1000:.0f} ms; relaunch to training again "
              f"{resume['launch_to_resumed_seconds']:.2f} s (interpreter, imports, data, model, restore)")
    write_report(args.output, {"machine": machine(), "settings": vars(args), "throughput": rows,
                               "timed_checkpoints": saves, "resume_after_sigkill": resume})
    return 0


if __name__ == "__main__":
    sys.exit(main())
