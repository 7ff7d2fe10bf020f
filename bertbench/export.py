r"""`bertbench export SOURCE OUTPUT_DIR`: a run, a bertbench checkpoint or any other checkpoint as an HF directory.

    bertbench export results/mrpc bert-mrpc-hf
    bertbench export results/mrpc/ckpt-344.pt bert-mrpc-hf
    bertbench export uncased_L-12_H-768_A-12/bert_model.ckpt bert-base-uncased-hf \
        --bert_config_file uncased_L-12_H-768_A-12/bert_config.json --vocab_file uncased_L-12_H-768_A-12/vocab.txt

SOURCE is a run directory (its newest checkpoint that verifies, and what its bertbench_run.json says: the model
config, the vocabulary, do_lower_case, a GLUE task's labels), a bertbench checkpoint file (with the run record beside
it, or --bert_config_file), or any other checkpoint --init_checkpoint takes (weights.pretrained: a TF1 checkpoint
prefix, NVIDIA's checkpoint, a state dict; with --bert_config_file). OUTPUT_DIR gets config.json (the
task head's architecture, num_labels and id2label), model.safetensors and, where the vocabulary is known, vocab.txt,
tokenizer.json, tokenizer_config.json and special_tokens_map.json: transformers' AutoModelFor... and AutoTokenizer
load it offline. Every input is checked before anything is written, and OUTPUT_DIR appears whole or not at all.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

import torch

from bertbench.common.errors import UsageError, run_command
from bertbench.common.flags import ArgumentParser, parse_bool
from bertbench.common.run_files import RUN_RECORD
from bertbench.model.config import BertConfig, ConfigError
from bertbench.runners.run_directory import RunRecord, run_of_checkpoint
from bertbench.tasks.glue import GlueDataError, glue_task
from bertbench.tasks.tokenization import VocabError
from bertbench.training.checkpoint import CheckpointError
from bertbench.weights.hf import check_output_dir, model_tokenizer, save_hf_directory
from bertbench.weights.pretrained import BERTBENCH_CHECKPOINT, find_weights, read_weights
from bertbench.weights.tf_checkpoint import TFCheckpointError
from bertbench.weights.tf_names import WeightsError

PROG = "bertbench export"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Export a bertbench run or checkpoint, or a TF1 BERT checkpoint, "
        "as an HF-format directory (weights, config and tokenizer) that "
        "transformers loads offline.",
    )
    parser.add_argument(
        "source",
        metavar="SOURCE",
        help="a run directory (--output_dir of a runner), a bertbench "
        "checkpoint (ckpt-<step>.pt), or any checkpoint --init_checkpoint takes (a TF1 checkpoint prefix, "
        "NVIDIA's checkpoint, a state dict)",
    )
    parser.add_argument(
        "output_dir", metavar="OUTPUT_DIR", help="directory to write (must not exist, or be empty, unless --overwrite)"
    )
    parser.add_argument(
        "--bert_config_file", metavar="JSON", help="the model's bert_config.json (default: the run's record)"
    )
    parser.add_argument("--vocab_file", metavar="TXT", help="vocab.txt or tokenizer.json (default: the run's)")
    parser.add_argument(
        "--do_lower_case",
        type=parse_bool,
        nargs="?",
        const=True,
        default=None,
        metavar="BOOL",
        help="the tokenizer lower-cases and strips accents (default: the run's, else true)",
    )
    parser.add_argument("--nodo_lower_case", dest="do_lower_case", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty OUTPUT_DIR")
    return parser


@dataclasses.dataclass(frozen=True)
class Exported:
    """What goes into the HF directory, every input read and checked."""

    state: Mapping[str, torch.Tensor]
    config: BertConfig
    vocab_file: str | None
    do_lower_case: bool
    labels: Sequence[str] | None = None
    problem_type: str | None = None
    notes: tuple[str, ...] = ()


def read_source(args: argparse.Namespace) -> Exported:
    """The weights, config, tokenizer and labels SOURCE and the flags give (see the module docstring)."""
    source = find_weights(args.source)  # a path that is not there, or holds no weights, is named here
    notes = list(source.notes)
    record = run_of_checkpoint(source.file if source.kind == BERTBENCH_CHECKPOINT else source.path)
    config = _config(args.bert_config_file, record, source.path)
    recorded = record.args if record is not None else {}
    vocab_file = args.vocab_file or recorded.get("vocab_file")
    if args.vocab_file is None and vocab_file is not None and not os.path.exists(vocab_file):
        raise VocabError(
            f"{record.path}: the run's vocab_file {vocab_file} is not there (a path relative to where "
            "it ran?); give --vocab_file"
        )
    do_lower_case = _agreed("do_lower_case", args.do_lower_case, recorded.get("do_lower_case"), record)
    if vocab_file is None:
        notes.append("no vocabulary (--vocab_file), so no tokenizer files")
    elif do_lower_case is None:
        do_lower_case = True
        notes.append("do_lower_case=true, the default (--nodo_lower_case for a cased model)")
    if vocab_file is not None:
        model_tokenizer(vocab_file, do_lower_case, config)
    weights = read_weights(source, config)  # read last: a checkpoint may be gigabytes
    notes.append(
        f"{source.path}: {weights.described}"
        + (f"; names read as {', '.join(weights.renamed)}" if weights.renamed else "")
    )
    state = weights.state
    labels = problem_type = None
    if record is not None and record.runner == "run_classifier" and "task_name" in recorded:
        processor = glue_task(recorded["task_name"], recorded.get("train_file"))  # HF's files: their labels
        labels, problem_type = (
            (None, "regression") if processor.is_regression else (processor.labels, "single_label_classification")
        )
    return Exported(
        state=state,
        config=config,
        vocab_file=vocab_file,
        do_lower_case=bool(do_lower_case),
        labels=labels,
        problem_type=problem_type,
        notes=tuple(notes),
    )


def _config(flag: str | None, record: RunRecord | None, source: str) -> BertConfig:
    """--bert_config_file, else the run record's config; both given must describe the same model."""
    if record is None:
        if flag is None:
            raise UsageError(
                f"--bert_config_file: {source} carries no model config (no {RUN_RECORD} beside it); "
                "give the model's bert_config.json"
            )
        return BertConfig.from_json_file(flag)
    recorded = BertConfig.from_dict(dict(record.bert_config), source=record.path)
    if flag is not None and BertConfig.from_json_file(flag) != recorded:
        raise UsageError(f"--bert_config_file={flag} describes another model than {record.path}; leave the flag out")
    return recorded


def _agreed(name: str, flag, recorded, record: RunRecord | None):
    if flag is not None and recorded is not None and flag != recorded:
        raise UsageError(
            f"--{name}={str(flag).lower()} contradicts {record.path}, which says "
            f"{name}={str(recorded).lower()}; leave the flag out"
        )
    return flag if flag is not None else recorded


def main(argv: list[str] | None = None) -> int:
    def body() -> None:
        args = build_parser().parse_args(argv)
        check_output_dir(args.output_dir, args.overwrite)
        exported = read_source(args)
        architecture = save_hf_directory(
            exported.state,
            exported.config,
            args.output_dir,
            vocab_file=exported.vocab_file,
            overwrite=args.overwrite,
            do_lower_case=exported.do_lower_case,
            labels=exported.labels,
            problem_type=exported.problem_type,
        )
        for note in exported.notes:
            print(f"{PROG}: {note}")
        print(
            f"{PROG}: wrote {args.output_dir} ({architecture}"
            + (f", labels {', '.join(exported.labels)}" if exported.labels else "")
            + (", with the tokenizer" if exported.vocab_file else ", no tokenizer")
            + ")"
        )

    return run_command(
        PROG,
        body,
        input_errors=(CheckpointError, TFCheckpointError, ConfigError, VocabError, WeightsError, GlueDataError),
    )


if __name__ == "__main__":
    sys.exit(main())
