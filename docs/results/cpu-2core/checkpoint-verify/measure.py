"""What verifying a checkpoint costs: save, CRC check (checkpoint.verify_checkpoint) and load of a BERT-base
pre-training checkpoint with its AdamW state, as the training loop writes it, in interleaved rounds.

    python docs/results/cpu-2core/checkpoint-verify/measure.py [--rounds 5] [--dir /tmp/ckpt-verify]
"""

import argparse
import os
import shutil
import statistics
import time

import torch

from bertbench.model.config import BertConfig
from bertbench.model.modeling import BertForPreTraining
from bertbench.training.checkpoint import load_checkpoint, save_checkpoint, verify_checkpoint


def drop_page_cache(path: str) -> None:
    """Evict the file from the page cache (posix_fadvise), so a load reads the disk as a resume on a fresh node does."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default="/tmp/ckpt-verify")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    model = BertForPreTraining(BertConfig(vocab_size=30522))
    optimizer = torch.optim.AdamW(model.parameters())
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    times = {
        name: [] for name in ("save", "verify (cached)", "load (cached)", "verify (from disk)", "load (from disk)")
    }
    for round_ in range(args.rounds):
        started = time.perf_counter()
        path = save_checkpoint(args.dir, round_ + 1, state, keep_max=1)
        times["save"].append(time.perf_counter() - started)
        for cached in (True, False):
            where = "cached" if cached else "from disk"
            for name, action in (
                (f"verify ({where})", lambda: verify_checkpoint(path)),
                (f"load ({where})", lambda: load_checkpoint(path, verify=False)),
            ):
                if not cached:
                    drop_page_cache(path)
                started = time.perf_counter()
                action()
                times[name].append(time.perf_counter() - started)
    size = os.path.getsize(path)
    print(f"BERT-base pre-training checkpoint with AdamW state: {size / 2**20:,.0f} MiB, {args.rounds} rounds")
    print("| action | median s | min-max s | MiB/s |")
    print("|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {min(values):.2f}-{max(values):.2f} | {size / 2**20 / median:,.0f} |")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
