"""`bertbench bench KIND`: one module per bench, each with its own `main(argv)`; and what their entry points share."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from bertbench.bench.errors import BenchError, BenchRunFailed
from bertbench.common.commands import command_lines, dispatch
from bertbench.common.errors import run_command
from bertbench.model.config import ConfigError

# bench -> (module with main(argv), one-line help): a command table of bertbench.common.commands.
BENCHES = {
    "suite": (
        "bertbench.bench.suite",
        (
            "the standard figures of a machine in one command (pre-training MFU and vs HF, real-text fine-tuning, "
            "recompute, largest batch, optimizer, compile): one report"
        ),
    ),
    "throughput": (
        "bertbench.bench.throughput",
        ("seq/s, tokens/s, TFLOP/s, MFU and memory over batch sizes, sequence lengths, variants and precisions"),
    ),
    "memory": (
        "bertbench.bench.memory",
        "largest batch under a memory cap for each recompute policy, and the slowdown at equal batch",
    ),
    "optimizer": (
        "bertbench.bench.optimizer",
        "clip + optimizer step of each rule, fused and eager, against the device's memory-bandwidth floor",
    ),
    "scaling": (
        "bertbench.bench.scaling",
        "1..N processes under torchrun (or runs of the job templates): speedup and efficiency",
    ),
    "budget": (
        "bertbench.bench.budget",
        "train for a fixed wall-clock budget, then evaluate: baseline on 1 worker vs recompute on N",
    ),
    "finetuning": (
        "bertbench.bench.finetuning",
        (
            "run_classifier or run_squad as users run them, on built-in data: steady seq/s and dev score per "
            "variant, checkpoint cost, resume after SIGKILL"
        ),
    ),
    "profile": (
        "bertbench.bench.profile",
        "torch.profiler trace of a few steps and the time in matmul / attention / other",
    ),
    "plan": (
        "bertbench.bench.plan",
        (
            "predict throughput, efficiency and time-to-train on a cluster from a measured step and the ring "
            "all-reduce cost"
        ),
    ),
    "squad-data": (
        "bertbench.bench.squad_data",
        ("run_squad's feature creation (windows/s) and answer post-processing (questions/s) on SQuAD v1.1-sized files"),
    ),
    "pretraining-data": (
        "bertbench.bench.pretraining_data",
        ("create_pretraining_data's throughput and peak memory over worker counts, on your corpus or a generated one"),
    ),
}


def _usage() -> str:
    lines = ["usage: bertbench bench KIND [options]   (bertbench bench KIND --help for its options)", "", "kinds:"]
    lines += command_lines(BENCHES, 16)
    lines += [
        "",
        ("Each writes KIND.json, KIND.md and KIND-*.png to --output_dir; `bertbench report DIR...` merges runs."),
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch("bertbench bench", list(sys.argv[1:] if argv is None else argv), BENCHES, _usage(), noun="bench")


# ---- shared by the benches' entry points --------------------------------------------------------------------------


def run(program: str, body: Callable[[], int | None]) -> int:
    """Run a bench's body under bertbench.common.errors' exit-code policy: a bad setting or input file is an input error
    (2), a run the bench started that failed is a runtime failure (1)."""
    return run_command(program, body, input_errors=(BenchError, ConfigError), runtime_errors=(BenchRunFailed,))
