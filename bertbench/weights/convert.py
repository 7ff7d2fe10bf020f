r"""`bertbench convert`: a Google or NVIDIA TensorFlow BERT checkpoint to an HF-format directory.

    bertbench convert --tf_checkpoint uncased_L-12_H-768_A-12/bert_model.ckpt \
        --bert_config_file uncased_L-12_H-768_A-12/bert_config.json --output_dir bert-base-uncased \
        --vocab_file uncased_L-12_H-768_A-12/vocab.txt

The flags are spelled as every other bertbench command spells them (underscores, `--output_dir`; `-` works too, as
everywhere). The names of earlier releases (`--bert-config`, `--output`) are kept as aliases, and HF's
`convert_bert_original_tf_checkpoint_to_pytorch.py` command line works as it does there: `--tf_checkpoint_path`,
`--bert_config_file`, and `--pytorch_dump_path FILE`, which writes the one file FILE (a torch.save'd state dict,
pytorch_model.bin's format), not a directory.
"""

from __future__ import annotations

import argparse
import sys

from bertbench.common.errors import UsageError, run_command
from bertbench.common.flags import ArgumentParser, parse_bool
from bertbench.model.config import ConfigError
from bertbench.tasks.tokenization import VocabError
from bertbench.weights.hf import convert_tf_checkpoint
from bertbench.weights.tf_checkpoint import TFCheckpointError
from bertbench.weights.tf_names import WeightsError

PROG = "bertbench convert"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=PROG,
        description="Convert a TensorFlow BERT checkpoint (Google's names, as in Google's "
        "and NVIDIA's releases) into an HF-format directory that bertbench and transformers load.",
    )
    parser.add_argument(
        "--tf_checkpoint",
        "--tf_checkpoint_path",
        dest="tf_checkpoint",
        required=True,
        metavar="PREFIX",
        help="checkpoint prefix (bert_model.ckpt), its .index file, or a directory holding one",
    )
    parser.add_argument(
        "--bert_config_file",
        "--bert-config",
        dest="bert_config_file",
        required=True,
        metavar="JSON",
        help="the checkpoint's bert_config.json",
    )
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument(
        "--output_dir",
        "--output",
        dest="output_dir",
        metavar="DIR",
        help="directory to write: config.json, weights and, with --vocab_file, the tokenizer files "
        "(must not exist, or be empty, unless --overwrite)",
    )
    output.add_argument(
        "--pytorch_dump_path",
        dest="pytorch_dump_path",
        metavar="FILE",
        help="HF's flag: write the weights alone to the file FILE, as HF's "
        "convert_bert_original_tf_checkpoint_to_pytorch.py does (must not exist unless "
        "--overwrite)",
    )
    parser.add_argument(
        "--vocab_file",
        dest="vocab_file",
        metavar="TXT",
        help="the checkpoint's vocab.txt (or tokenizer.json): the output directory gets the "
        "tokenizer files AutoTokenizer loads",
    )
    parser.add_argument(
        "--do_lower_case",
        type=parse_bool,
        nargs="?",
        const=True,
        default=True,
        metavar="BOOL",
        help="the tokenizer lower-cases and strips accents (uncased models; default true); written "
        "into tokenizer_config.json",
    )
    parser.add_argument("--nodo_lower_case", dest="do_lower_case", action="store_false", help=argparse.SUPPRESS)
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a non-empty output directory or an existing --pytorch_dump_path file",
    )
    parser.add_argument(
        "--pytorch_bin",
        dest="pytorch_bin",
        action="store_true",
        help="write pytorch_model.bin instead of model.safetensors",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    def body() -> None:
        args = build_parser().parse_args(argv)
        if args.pytorch_dump_path is not None and args.vocab_file is not None:
            raise UsageError(
                "--vocab_file: --pytorch_dump_path writes one weights file, with no place for the "
                "tokenizer; use --output_dir for a directory that holds both"
            )
        mapping = convert_tf_checkpoint(
            args.tf_checkpoint,
            args.bert_config_file,
            args.output_dir,
            vocab_file=args.vocab_file,
            overwrite=args.overwrite,
            safe_serialization=not args.pytorch_bin,
            do_lower_case=args.do_lower_case,
            weights_file=args.pytorch_dump_path,
        )
        print(f"{PROG}: wrote {args.output_dir or args.pytorch_dump_path}: {mapping.summary()}")

    return run_command(PROG, body, input_errors=(TFCheckpointError, ConfigError, VocabError, WeightsError))


if __name__ == "__main__":
    sys.exit(main())
