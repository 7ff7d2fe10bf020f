r"""`bertbench example-data DIR`: everything the README's commands read, small and made here, so that every runner
and script can be tried without a download.

    bertbench example-data example
    cat example/README.txt

DIR gets a tiny BERT as Google ships one (bert/: bert_config.json, vocab.txt and a TF1 checkpoint bert_model.ckpt
with Google's variable names, weights from a seeded initialisation), the same model as an HF directory (bert-hf/)
and as NVIDIA's run_pretraining.py saves it (bert-nvidia/ckpt_1.pt);
a GLUE task in MRPC's layout (glue/MRPC/) and the same examples as HF run_glue's csv and JSON-lines files
(glue/files/), SQuAD v1.1 and v2.0 files (squad/v1.1/, squad/v2.0/); a pre-training
corpus in Google's text format (corpus/) and its hdf5 shards in NVIDIA's layout, made by create_pretraining_data
(shards/phase1/, shards/phase2/, shards/eval/); all of it tokenised by the one vocab.txt (bertbench.tasks.synthetic's
tasks). README.txt in DIR says what is where and gives a command for each runner and script that runs in seconds on
a laptop CPU. Nothing is read from the network. The model has not learnt anything: the numbers the commands print
show that the pipeline runs, not what BERT scores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence

import numpy as np
import torch

from bertbench.common.errors import UsageError, run_command
from bertbench.common.flags import ArgumentParser
from bertbench.model.config import BertConfig
from bertbench.model.factory import build_model
from bertbench.tasks import synthetic
from bertbench.tasks.create_pretraining_data import create_pretraining_data
from bertbench.tasks.glue import get_processor
from bertbench.tasks.pretraining_data.settings import DataSettings
from bertbench.weights.hf import save_hf_directory
from bertbench.weights.pretrained import nvidia_checkpoint
from bertbench.weights.tf_checkpoint import write_tf_checkpoint
from bertbench.weights.tf_names import tf_model_variables

PROG = "bertbench example-data"
# Google's BERT-Tiny shape, narrowed to the 42-token vocabulary; 512 positions so that every script's default
# sequence length (128 and 512 for pre-training, 384 for SQuAD) fits.
MODEL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "max_position_embeddings": 512,
}
# Sizes that keep each README.txt command within seconds on a CPU: (train, dev, test) pairs of MRPC; SQuAD paragraphs
# (three questions each); corpus documents (training, held out).
GLUE_SIZES = (256, 64, 32)
SQUAD_SIZES = (40, 10)
CORPUS_DOCUMENTS = (200, 20)
# create_pretraining_data's settings per shard directory: NVIDIA's phase 1 (128 tokens, 20 predictions) and phase 2
# (512, 80), and phase 1's held-out shard.
SHARDS = {"phase1": ("train", 128, 20, 2), "phase2": ("train", 512, 80, 2), "eval": ("eval", 128, 20, 1)}


def tf_variables(model: torch.nn.Module, config: BertConfig) -> dict[str, np.ndarray]:
    """The model's weights under Google's TF names and in TF's layouts (dense kernels [in, out]): the inverse of
    weights.read_tf_weights, over the variables weights.py maps that the model has."""
    state = model.state_dict()
    variables = {}
    for tf_name, (hf_name, _) in tf_model_variables(config, None).items():
        if hf_name in state:
            value = state[hf_name].detach().float()
            variables[tf_name] = (value.T if tf_name.endswith("/kernel") else value).contiguous().numpy()
    return variables


def _write_bert(directory: str, seed: int) -> None:
    bert_dir = os.path.join(directory, "bert")
    os.makedirs(bert_dir)
    vocab_file = synthetic.write_vocab(bert_dir)
    config = BertConfig(vocab_size=len(synthetic.vocabulary()), **MODEL)
    with open(os.path.join(bert_dir, "bert_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config.to_google_dict(), handle, indent=2)
        handle.write("\n")
    torch.manual_seed(seed)
    model = build_model("pretraining", config)
    write_tf_checkpoint(os.path.join(bert_dir, "bert_model.ckpt"), tf_variables(model, config))
    save_hf_directory(model, config, os.path.join(directory, "bert-hf"), vocab_file=vocab_file)
    os.makedirs(os.path.join(directory, "bert-nvidia"))
    torch.save(nvidia_checkpoint(model.state_dict()), os.path.join(directory, "bert-nvidia", "ckpt_1.pt"))


def write_hf_glue_files(task_dir: str, directory: str) -> None:
    """The MRPC-layout task in `task_dir` as HF run_glue's own files in `directory`: train, validation and test as
    .csv and as .json (JSON lines), columns sentence1, sentence2 and (but in test) label."""
    processor = get_processor("MRPC")
    splits = {
        "train": processor.train_examples(task_dir),
        "validation": processor.dev_sets(task_dir)["dev"],
        "test": processor.test_sets(task_dir)["test"],
    }
    os.makedirs(directory)
    for split, examples in splits.items():
        rows = [
            {"sentence1": example.text_a, "sentence2": example.text_b}
            | ({} if split == "test" else {"label": int(example.label)})
            for example in examples
        ]
        with open(os.path.join(directory, f"{split}.csv"), "w", encoding="utf-8", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        with open(os.path.join(directory, f"{split}.json"), "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)


def _write_pretraining_data(directory: str, seed: int) -> None:
    corpus_dir = os.path.join(directory, "corpus")
    os.makedirs(corpus_dir)
    corpora = {
        split: synthetic.write_corpus(os.path.join(corpus_dir, f"{split}.txt"), documents, seed=2 * seed + k)
        for k, (split, documents) in enumerate(zip(("train", "eval"), CORPUS_DOCUMENTS))
    }
    for name, (split, seq, predictions, shards) in SHARDS.items():
        create_pretraining_data(
            DataSettings(
                input_file=corpora[split],
                vocab_file=os.path.join(directory, "bert", "vocab.txt"),
                output_dir=os.path.join(directory, "shards", name),
                num_shards=shards,
                max_seq_length=seq,
                max_predictions_per_seq=predictions,
                dupe_factor=2 if split == "train" else 1,
                random_seed=seed,
                num_workers=1,
            ),
            log=lambda line: None,
        )


def readme(directory: str) -> str:
    """DIR/README.txt: what is where, and a command for each runner and script, with DIR's absolute path."""
    d = os.path.abspath(directory)
    out = os.path.join(tempfile.gettempdir(), "bertbench-example-runs")
    bert = f"--vocab_file={d}/bert/vocab.txt --bert_config_file={d}/bert/bert_config.json"
    return f"""Example data for bertbench, written by `bertbench example-data` (no download). Everything is small and
synthetic; the model is a seeded random initialisation, so the scores below show that each pipeline runs, not
what BERT scores. Each command takes seconds on a laptop CPU; outputs go to {out}/.

bert/           a tiny BERT as Google ships one: bert_config.json, vocab.txt, bert_model.ckpt.index and
                bert_model.ckpt.data-00000-of-00001 (a TF1 checkpoint with Google's variable names)
bert-hf/        the same model as an HF directory (config.json, model.safetensors, vocab.txt)
bert-nvidia/    the same model as NVIDIA's run_pretraining.py saves it: ckpt_1.pt ({{'model': ..., 'optimizer': ...}})
glue/MRPC/      a sentence-pair task in MRPC's layout: train.tsv, dev.tsv, test.tsv
glue/files/     the same examples as HF run_glue's own files: {{train,validation,test}}.csv and .json (JSON lines)
squad/v1.1/     train-v1.1.json, dev-v1.1.json (SQuAD's format)
squad/v2.0/     train-v2.0.json, dev-v2.0.json (with unanswerable questions)
corpus/         train.txt, eval.txt: pre-training text, one sentence per line, a blank line between documents
shards/phase1/  hdf5 shards in NVIDIA's layout, 128 tokens and 20 predictions (from corpus/train.txt)
shards/phase2/  the same, 512 tokens and 80 predictions
shards/eval/    held-out shard, 128 tokens and 20 predictions (from corpus/eval.txt)

Run from the bertbench repository (the scripts) or anywhere (the bertbench commands):

# GLUE: Google's run_classifier command, from the TF1 checkpoint
bertbench classify --task_name=MRPC --do_train --do_eval --do_predict --data_dir={d}/glue/MRPC {bert} \\
  --init_checkpoint={d}/bert/bert_model.ckpt --max_seq_length=128 --train_batch_size=32 --learning_rate=2e-5 \\
  --num_train_epochs=3.0 --output_dir={out}/mrpc

# GLUE from the HF directory instead: its config, vocabulary and lower-casing come with it
bertbench classify --task_name=MRPC --do_train --do_eval --data_dir={d}/glue/MRPC --init_checkpoint={d}/bert-hf \\
  --max_seq_length=64 --num_train_epochs=1.0 --output_dir={out}/mrpc-hf

# GLUE with HF's run_glue command, on its csv files (HF Trainer's defaults for what the command leaves out)
python -m bertbench.run_glue --model_name_or_path {d}/bert-hf --train_file {d}/glue/files/train.csv \\
  --validation_file {d}/glue/files/validation.csv --do_train --do_eval --max_seq_length 64 \\
  --per_device_train_batch_size 16 --learning_rate 2e-5 --num_train_epochs 1 --output_dir {out}/mrpc-run-glue

# SQuAD with NVIDIA's run_squad command, from NVIDIA's checkpoint, with NVIDIA's dllogger summary
python -m bertbench.run_squad --init_checkpoint={d}/bert-nvidia/ckpt_1.pt --config_file={d}/bert/bert_config.json \
  --vocab_file={d}/bert/vocab.txt --bert_model=bert-large-uncased --do_train --do_predict \
  --train_file={d}/squad/v1.1/train-v1.1.json --predict_file={d}/squad/v1.1/dev-v1.1.json --train_batch_size=16 \
  --max_seq_length=128 --doc_stride=64 --num_train_epochs=1.0 --output_dir={out}/squad-nvidia \
  --json-summary {out}/squad-nvidia/dllogger.json

# back out to an HF directory that transformers loads (the fine-tuned classifier, its tokenizer files included)
bertbench export {out}/mrpc-hf {out}/mrpc-hf-exported

# GLUE with the original's positional arguments (task batch lr precision use_xla num_gpu seq)
BERT_DIR={d}/bert GLUE_DIR={d}/glue RESULTS_DIR={out}/results scripts/run_glue.sh MRPC 32 2e-5 fp32 false 1 128

# SQuAD v1.1 (add --version_2_with_negative and the v2.0 files for 2.0), then the official scores again
bertbench squad --do_train --do_predict --train_file={d}/squad/v1.1/train-v1.1.json \\
  --predict_file={d}/squad/v1.1/dev-v1.1.json {bert} --init_checkpoint={d}/bert/bert_model.ckpt \\
  --max_seq_length=128 --doc_stride=64 --train_batch_size=16 --num_train_epochs=1.0 --output_dir={out}/squad
bertbench evaluate-squad {d}/squad/v1.1/dev-v1.1.json {out}/squad/predictions.json

# SQuAD with NVIDIA's positional arguments (batch lr precision use_xla num_gpu seq stride model version)
BERT_DIR={d}/bert SQUAD_DIR={d}/squad/v2.0 RESULTS_DIR={out}/results scripts/run_squad.sh 16 3e-5 fp32 false 1 \\
  128 64 base 2.0

# eval.sh scores every run the two scripts wrote again: GLUE evaluates its dev set, SQuAD predicts and scores
scripts/eval.sh {out}/results

# pre-training data from the text, then pre-training on the shipped shards (phase 1, scored on the eval shard)
bertbench create-pretraining-data --input_file={d}/corpus/train.txt --vocab_file={d}/bert/vocab.txt \\
  --output_dir={out}/shards --max_seq_length=128 --max_predictions_per_seq=20 --dupe_factor=1
bertbench pretrain --do_train --do_eval --input_dir={d}/shards/phase1 --eval_dir={d}/shards/eval \\
  --bert_config_file={d}/bert/bert_config.json --max_seq_length=128 --max_predictions_per_seq=20 \\
  --train_batch_size=16 --num_train_steps=10 --learning_rate=1e-3 --output_dir={out}/pretraining

# pre-training with NVIDIA's positional arguments (phase batch lr precision num_gpu warmup steps accumulation
# save_steps): phase 1, then phase 2 continuing it
BERT_DIR={d}/bert DATA_DIR_PHASE1={d}/shards/phase1 DATA_DIR_PHASE2={d}/shards/phase2 EVAL_DIR={d}/shards/eval \\
  RESULTS_DIR={out}/results scripts/run_pretraining.sh 1 8 1e-3 fp32 1 0.1 10 2 10
BERT_DIR={d}/bert DATA_DIR_PHASE1={d}/shards/phase1 DATA_DIR_PHASE2={d}/shards/phase2 EVAL_DIR={d}/shards/eval \\
  RESULTS_DIR={out}/results scripts/run_pretraining.sh 2 2 1e-3 fp32 1 0.1 5 1 10
"""


def _clear(directory: str) -> None:
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def write_example_data(directory: str | os.PathLike, overwrite: bool = False, seed: int = 0) -> str:
    """Writes the example data into `directory` (see the module's docstring) and returns its absolute path. A
    non-empty `directory` is refused (UsageError) unless `overwrite`, which empties it first. It is written in place,
    so that the paths the shards' statistics record are the ones a user sees; a failure removes what was written."""
    directory = os.path.abspath(os.fspath(directory))
    if os.path.exists(directory):
        if not os.path.isdir(directory):
            raise UsageError(f"{directory}: exists and is not a directory")
        if os.listdir(directory) and not overwrite:
            raise UsageError(f"{directory}: exists and is not empty (pass --overwrite to replace it)")
    parent = os.path.dirname(directory)
    if not os.path.isdir(parent):
        raise UsageError(f"{parent}: no such directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{parent}: not writable")
    created = not os.path.isdir(directory)
    if created:
        os.mkdir(directory)
    else:
        _clear(directory)
    try:
        _write_bert(directory, seed)
        mrpc = synthetic.write_glue_task(os.path.join(directory, "glue"), "MRPC", *GLUE_SIZES, seed=seed)
        write_hf_glue_files(mrpc, os.path.join(directory, "glue", "files"))
        for version in ("1.1", "2.0"):
            synthetic.write_squad(os.path.join(directory, "squad", f"v{version}"), version, *SQUAD_SIZES, seed=seed)
        _write_pretraining_data(directory, seed)
        with open(os.path.join(directory, "README.txt"), "w", encoding="utf-8") as handle:
            handle.write(readme(directory))
    except BaseException:
        if created:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            _clear(directory)
        raise
    return directory


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[2].replace("\n", " "))
    parser.add_argument(
        "directory", metavar="DIR", help="directory to write (must not exist, or be empty, unless --overwrite)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty DIR")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and of the weights")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    def body() -> None:
        args = build_parser().parse_args(argv)
        directory = write_example_data(args.directory, overwrite=args.overwrite, seed=args.seed)
        print(f"{PROG}: wrote {directory}; see {os.path.join(directory, 'README.txt')} for a command per runner")

    return run_command(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
