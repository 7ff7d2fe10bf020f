"""The `bertbench` command: one sub-command per entry point, each a thin `main(argv)` in its own module."""

from __future__ import annotations

import importlib
import sys

from bertbench.errors import INPUT_ERROR, run_command

# sub-command -> (module with main(argv), one-line help); modules are imported only when their command runs.
COMMANDS = {
    "demo": ("bertbench.demo.run", "train a tiny BERT on built-in data, baseline vs recompute (no network)"),
    "classify": ("bertbench.run_classifier", "fine-tune / evaluate / predict a GLUE task (Google's run_classifier "
                                             "flags)"),
    "squad": ("bertbench.run_squad", "fine-tune / predict SQuAD v1.1 or v2.0 (Google's run_squad flags)"),
    "pretrain": ("bertbench.run_pretraining", "pre-train BERT (MLM + NSP) on NVIDIA-layout hdf5 shards, phase 1 / "
                                              "phase 2 (Google's run_pretraining flags)"),
    "create-pretraining-data": ("bertbench.create_pretraining_data", "raw text (Google's format) -> hdf5 shards in "
                                                                     "NVIDIA's layout, optionally in length bins"),
    "evaluate-squad": ("bertbench.evaluate_squad", "SQuAD v1.1/v2.0 exact match and F1 (the official definitions)"),
    "launch": ("bertbench.launch", "torchrun (same arguments), with one-line errors when nodes fail to meet"),
    "bench": ("bertbench.bench.cli", "benchmarks: throughput, memory, scaling, budget, profile, plan, "
                                     "finetuning, squad-data, pretraining-data (JSON, markdown, PNG)"),
    "report": ("bertbench.bench.report", "merge bench results of several runs into one comparison"),
    "convert": ("bertbench.convert", "convert a TF1 checkpoint (bert_model.ckpt) to an HF-format directory"),
}


def _usage() -> str:
    lines = ["usage: bertbench COMMAND [options]   (bertbench COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<24} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from bertbench import __version__
        print(f"bertbench {__version__}")
        return 0
    if argv[0] not in COMMANDS:  # a usage error: one line, status 2 (bertbench.errors)
        print(f"bertbench: error: unknown command {argv[0]!r}; choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return INPUT_ERROR
    # Under run_command from the start, so that a signal while torch is imported is one line too.
    return run_command("bertbench", lambda: importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
