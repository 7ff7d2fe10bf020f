r"""`bertbench convert`: a Google or NVIDIA TensorFlow BERT checkpoint to an HF-format directory.

    bertbench convert --tf_checkpoint uncased_L-12_H-768_A-12/bert_model.ckpt \
        --bert_config_file uncased_L-12_H-768_A-12/bert_config.json --output_dir bert-base-uncased \
        --vocab_file uncased_L-12_H-768_A-12/vocab.txt

The flags are spelled as every other bertbench command spells them (underscores, `--output_dir`). The spellings of
earlier releases (`--tf-checkpoint`, `--bert-config`, `--output`, `--vocab-file`, `--pytorch-bin`) and those of HF's
`convert_tf_checkpoint_to_pytorch.py` (`--tf_checkpoint_path`, `--pytorch_dump_path`) are kept as aliases.
"""

from __future__ import annotations

import argparse
import sys

from bertbench.config import ConfigError
from bertbench.tf_checkpoint import CheckpointError
from bertbench.errors import ArgumentParser, run_command
from bertbench.weights import WeightsError, convert_tf_checkpoint

PROG = "bertbench convert"


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=PROG, description="Convert a TensorFlow BERT checkpoint (Google's names, as in Google's "
                     "and NVIDIA's releases) into an HF-format directory that bertbench and transformers load.")
    parser.add_argument("--tf_checkpoint", "--tf-checkpoint", "--tf_checkpoint_path", dest="tf_checkpoint",
                        required=True, metavar="PREFIX",
                        help="checkpoint prefix (bert_model.ckpt), its .index file, or a directory holding one")
    parser.add_argument("--bert_config_file", "--bert-config", dest="bert_config_file", required=True,
                        metavar="JSON", help="the checkpoint's bert_config.json")
    parser.add_argument("--output_dir", "--output", "--pytorch_dump_path", dest="output_dir", required=True,
                        metavar="DIR", help="directory to write (must not exist, or be empty, unless --overwrite)")
    parser.add_argument("--vocab_file", "--vocab-file", dest="vocab_file", metavar="TXT",
                        help="vocab.txt to copy into the output directory")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    parser.add_argument("--pytorch_bin", "--pytorch-bin", dest="pytorch_bin", action="store_true",
                        help="write pytorch_model.bin instead of model.safetensors")
    return parser


def main(argv: list[str] | None = None) -> int:
    def body() -> None:
        args = build_parser().parse_args(argv)
        mapping = convert_tf_checkpoint(args.tf_checkpoint, args.bert_config_file, args.output_dir,
                                        vocab_file=args.vocab_file, overwrite=args.overwrite,
                                        safe_serialization=not args.pytorch_bin)
        print(f"{PROG}: wrote {args.output_dir}: {mapping.summary()}")
    return run_command(PROG, body, input_errors=(CheckpointError, ConfigError, WeightsError))


if __name__ == "__main__":
    sys.exit(main())
