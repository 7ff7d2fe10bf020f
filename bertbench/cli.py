"""The `bertbench` command: one sub-command per entry point, each a thin `main(argv)` in its own module."""

from __future__ import annotations

import functools
import sys
from contextlib import AbstractContextManager

from bertbench.common.commands import command_lines, dispatch
from bertbench.common.errors import run_command

# sub-command -> (module with main(argv), one-line help): a command table of bertbench.common.commands.
COMMANDS = {
    "demo": ("bertbench.demo.run", "train a tiny BERT on built-in data, baseline vs recompute (no network)"),
    "example-data": (
        "bertbench.example_data",
        (
            "write a tiny BERT (TF1 checkpoint + HF directory), GLUE, SQuAD and pre-training data: every "
            "runner runs without downloads"
        ),
    ),
    "classify": (
        "bertbench.runners.classifier",
        "fine-tune / evaluate / predict a GLUE task (Google's run_classifier flags)",
    ),
    "squad": ("bertbench.runners.squad", "fine-tune / predict SQuAD v1.1 or v2.0 (Google's run_squad flags)"),
    "pretrain": (
        "bertbench.runners.pretraining",
        ("pre-train BERT (MLM + NSP) on NVIDIA-layout hdf5 shards, phase 1 / phase 2 (Google's run_pretraining flags)"),
    ),
    "create-pretraining-data": (
        "bertbench.tasks.create_pretraining_data",
        ("raw text (Google's format) -> hdf5 shards in NVIDIA's layout, optionally in length bins"),
    ),
    "evaluate-squad": (
        "bertbench.tasks.squad.evaluate",
        "SQuAD v1.1/v2.0 exact match and F1 (the official definitions)",
    ),
    "launch": ("bertbench.runners.launch", "torchrun (same arguments), with one-line errors when nodes fail to meet"),
    "bench": (
        "bertbench.bench.cli",
        (
            "benchmarks: suite, throughput, memory, optimizer, scaling, budget, profile, plan, finetuning, "
            "squad-data, pretraining-data (JSON, markdown, PNG)"
        ),
    ),
    "report": ("bertbench.bench.report", "merge bench results of several runs into one comparison"),
    "convert": ("bertbench.weights.convert", "convert a TF1 checkpoint (bert_model.ckpt) to an HF-format directory"),
    "export": (
        "bertbench.export",
        (
            "a run, a bertbench checkpoint or a TF1 checkpoint -> an HF directory (weights, config, tokenizer) "
            "that transformers loads"
        ),
    ),
}


# Options of `bertbench` itself, before the command: how much the run's log says (bertbench.training.progress.LEVELS).
VERBOSITY_OPTIONS = {"-q": "quiet", "--quiet": "quiet", "-v": "verbose", "--verbose": "verbose"}
VERSION_OPTIONS = ("-V", "--version")


def _usage() -> str:
    lines = [
        "usage: bertbench [-q | -v] COMMAND [options]   (bertbench COMMAND --help for its options)",
        "",
        "options:",
        "  -q, --quiet              warnings and errors only: no log lines, no progress bars",
        "  -v, --verbose            debug lines too, and an error's traceback above its one line",
        "  -V, --version            the version",
        "",
        "commands:",
    ]
    lines += command_lines(COMMANDS, 24)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    verbosity = "normal"
    while argv and argv[0] in VERBOSITY_OPTIONS:
        verbosity, argv = VERBOSITY_OPTIONS[argv[0]], argv[1:]
    if argv and argv[0] in VERSION_OPTIONS:
        from bertbench import __version__

        return run_command("bertbench", lambda: print(f"bertbench {__version__}"))
    return dispatch(
        "bertbench",
        argv,
        COMMANDS,
        _usage(),
        around=functools.partial(_log_level, verbosity),
        options=[*VERBOSITY_OPTIONS, *VERSION_OPTIONS],
    )


def _log_level(verbosity: str) -> AbstractContextManager:
    # Imported here, under the dispatcher's run_command, like the command's own module.
    from bertbench.training.progress import verbosity as log_level

    return log_level(verbosity)


if __name__ == "__main__":
    sys.exit(main())
