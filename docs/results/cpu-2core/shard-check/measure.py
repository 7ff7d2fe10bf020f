"""What checking every pre-training shard's values before training costs (run_pretraining.check_shard_values): on a
set of shards in NVIDIA's layout (gzip, seq 128, 20 predictions, NVIDIA's dtypes) of about --gigabytes on disk, with
Zipf-distributed token ids so that they compress as text does. Times the layout check (check_layout: keys and
shapes, what was checked before) and the value check (every value read), by 1 and 2 processes.

    python docs/results/cpu-2core/shard-check/measure.py [--gigabytes 1] [--dir /tmp/shard-check]
"""

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

import h5py
import numpy as np

from bertbench.tasks.pretraining import NVIDIA_DTYPES, ShardLimits, check_layout, check_shard

SEQ, PREDICTIONS, VOCAB = 128, 20, 30522
LIMITS = ShardLimits(max_seq_length=SEQ, max_predictions_per_seq=PREDICTIONS, vocab_size=VOCAB)


def write_shard(path: str, count: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = np.where(rng.random(count) < 0.9, SEQ, rng.integers(16, SEQ, count))
    ids = np.minimum(rng.zipf(1.3, (count, SEQ)) + 999, VOCAB - 1)
    mask = np.arange(SEQ) < lengths[:, None]
    ids[:, 0] = 101
    ids[~mask] = 0
    segments = (np.arange(SEQ) >= lengths[:, None] // 2) & mask
    positions = np.zeros((count, PREDICTIONS), dtype=np.int64)
    for row in range(count):
        picked = np.sort(
            rng.choice(np.arange(1, lengths[row]), min(PREDICTIONS, int(lengths[row] * 0.15) + 1), replace=False)
        )
        positions[row, : len(picked)] = picked
    masked_ids = np.where(positions > 0, np.take_along_axis(ids, positions, axis=1), 0)
    arrays = {
        "input_ids": ids,
        "input_mask": mask,
        "segment_ids": segments,
        "masked_lm_positions": positions,
        "masked_lm_ids": masked_ids,
        "next_sentence_labels": rng.integers(0, 2, count),
    }
    with h5py.File(path, "w") as handle:
        for key, array in arrays.items():
            handle.create_dataset(key, data=array.astype(NVIDIA_DTYPES[key]), compression="gzip")


def check_values(paths: list[str]) -> None:
    for path in paths:
        check_shard(path, LIMITS)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--dir", default="/tmp/shard-check")
    parser.add_argument("--sequences_per_shard", type=int, default=200_000)
    args = parser.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    paths, total = [], 0
    while total < args.gigabytes * 1e9:
        path = os.path.join(args.dir, f"training_{len(paths):05d}.hdf5")
        if not os.path.exists(path):
            write_shard(path, args.sequences_per_shard, len(paths))
        paths.append(path)
        total += os.path.getsize(path)
    sequences = len(paths) * args.sequences_per_shard
    print(f"{len(paths)} shards, {total / 1e9:.2f} GB on disk, {sequences:,} sequences of {SEQ} tokens")
    started = time.perf_counter()
    for path in paths:
        check_layout(path, LIMITS)
    print(f"layout check (keys, shapes): {time.perf_counter() - started:.2f} s")
    started = time.perf_counter()
    check_values(paths)
    one = time.perf_counter() - started
    print(
        f"value check, 1 process: {one:.1f} s ({total / 1e6 / one:.0f} MB/s on disk, {sequences / one:,.0f} "
        "sequences/s)"
    )
    started = time.perf_counter()
    with ProcessPoolExecutor(2) as pool:  # as two ranks share the shards
        list(pool.map(check_values, [paths[0::2], paths[1::2]]))
    two = time.perf_counter() - started
    print(f"value check, 2 processes: {two:.1f} s")


if __name__ == "__main__":
    main()
