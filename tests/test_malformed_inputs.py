"""A corpus of malformed inputs, each a valid input with one thing broken, run in this process through a command's
main(argv): every one must be refused with exit status 2 (bertbench.common.errors), one line on stderr that names the
culprit file, key or flag, no traceback, and the output directory exactly as it was (absent, empty, or an earlier
run's without a lock file): no file written or deleted, the lock file included, but for the note of its last holder
where one was there."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import TINY_BERT, snapshot, write_bert_dir, write_nvidia_shard

from bertbench import cli
from bertbench.common.run_files import LOCK
from bertbench.example_data import write_hf_glue_files
from bertbench.model.config import BertConfig
from bertbench.model.factory import build_model
from bertbench.runners import classifier as run_classifier
from bertbench.runners import pretraining as run_pretraining
from bertbench.runners import squad as run_squad
from bertbench.tasks import create_pretraining_data
from bertbench.tasks.squad import evaluate as evaluate_squad
from bertbench.tasks.synthetic import write_corpus, write_glue_task, write_squad
from bertbench.training.checkpoint import save_checkpoint
from bertbench.weights import convert
from bertbench.weights.hf import save_hf_directory
from bertbench.weights.tf_checkpoint import block_entries, masked_crc32c, read_block, read_varint

TF1 = Path(__file__).parent / "fixtures" / "tf1_tiny"
COMMANDS = {  # name -> (program name on stderr, main)
    "classify": ("run_classifier", run_classifier.main),
    "squad": ("run_squad", run_squad.main),
    "pretrain": ("run_pretraining", run_pretraining.main),
    "convert": ("bertbench convert", convert.main),
    "data": ("create_pretraining_data", create_pretraining_data.main),
    "evaluate": ("bertbench evaluate-squad", evaluate_squad.main),
    "cli": ("bertbench", cli.main),
    "cli-classify": ("bertbench classify", cli.main),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Valid inputs of every kind, each corrupted by a case in a copy: GLUE tasks, SQuAD files, the tiny model's
    bert/, hdf5 shards, an HF directory, a corpus."""
    root = tmp_path_factory.mktemp("inputs")
    for task in ("MRPC", "STS-B", "MNLI"):
        write_glue_task(root / "glue", task, train=64, dev=16, test=8)
    for version in ("1.1", "2.0"):
        write_squad(root / "squad", version, train=4, dev=2)
    write_bert_dir(root / "bert")
    (root / "shards").mkdir()
    for index in range(2):
        write_nvidia_shard(root / "shards" / f"part_{index}.hdf5", count=16, seed=index)
    (root / "eval").mkdir()
    write_nvidia_shard(root / "eval" / "eval.hdf5", count=8, seed=9)
    config = BertConfig(**TINY_BERT)
    torch.manual_seed(0)
    save_hf_directory(build_model("pretraining", config), config, root / "hf")
    write_corpus(root / "corpus.txt", documents=20)
    return root


def classify_flags(inputs: Path, out: Path, *extra: str, data_dir=None, vocab=None, config=None) -> list[str]:
    return [
        f"--task_name={'MRPC' if data_dir is None else Path(data_dir).name}",
        f"--data_dir={data_dir or inputs / 'glue' / 'MRPC'}",
        f"--vocab_file={vocab or inputs / 'bert/vocab.txt'}",
        f"--bert_config_file={config or inputs / 'bert/bert_config.json'}",
        "--max_seq_length=32",
        "--train_batch_size=16",
        "--learning_rate=2e-3",
        "--num_train_epochs=1",
        "--save_checkpoints_secs=0",
        "--log_step_count_steps=1000",
        f"--output_dir={out}",
        *extra,
    ]


def squad_flags(inputs: Path, out: Path, *extra: str, version="1.1", train=None, predict=None) -> list[str]:
    squad = inputs / "squad"
    return [
        f"--train_file={train or squad / f'train-v{version}.json'}",
        f"--predict_file={predict or squad / f'dev-v{version}.json'}",
        f"--vocab_file={inputs / 'bert/vocab.txt'}",
        f"--bert_config_file={inputs / 'bert/bert_config.json'}",
        f"--version_2_with_negative={version == '2.0'}",
        "--max_seq_length=32",
        "--max_query_length=8",
        "--doc_stride=8",
        "--train_batch_size=4",
        "--save_checkpoints_secs=0",
        "--do_train",
        "--do_predict",
        f"--output_dir={out}",
        *extra,
    ]


def pretrain_flags(inputs: Path, out: Path, *extra: str, shards=None, eval_dir=None) -> list[str]:
    return [
        f"--input_dir={shards or inputs / 'shards'}",
        f"--eval_dir={eval_dir or inputs / 'eval'}",
        f"--bert_config_file={inputs / 'bert/bert_config.json'}",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--train_batch_size=8",
        "--num_train_steps=2",
        "--do_train",
        "--save_checkpoints_secs=0",
        "--log_step_count_steps=1000",
        f"--output_dir={out}",
        *extra,
    ]


@pytest.fixture(scope="module")
def finished_runs(inputs, tmp_path_factory) -> dict[str, Path]:
    """Earlier run directories that cases run on, copied: a finished run of each runner that has cases on one, and
    the same run stopped before its first checkpoint (`-unsaved`: its record and metrics.jsonl, which a new start
    replaces), none with a lock file (a command that adds one and fails must remove it). A case must leave each as
    it was."""
    root = tmp_path_factory.mktemp("finished")
    runs = {"classify": root / "classify", "pretrain": root / "pretrain"}
    assert run_classifier.main(classify_flags(inputs, runs["classify"], "--do_train", "--do_eval", "--do_predict")) == 0
    assert run_pretraining.main(pretrain_flags(inputs, runs["pretrain"], "--do_eval")) == 0
    for name, finished in list(runs.items()):
        (finished / LOCK).unlink()
        unsaved = runs[f"{name}-unsaved"] = root / f"{name}-unsaved"
        unsaved.mkdir()
        shutil.copy(finished / "bertbench_run.json", unsaved)
        logged = (finished / "metrics.jsonl").read_text().splitlines()
        (unsaved / "metrics.jsonl").write_text(
            "".join(line + "\n" for line in logged if json.loads(line)["checkpoint_step"] is None)
        )
    return runs


# ---- corruption helpers: each writes a broken copy under the case's tmp directory and returns its path ------------


def copy_tree(source: Path, tmp: Path) -> Path:
    target = tmp / source.name
    shutil.copytree(source, target)
    return target


def glue_copy(inputs: Path, tmp: Path, task: str = "MRPC") -> Path:
    return copy_tree(inputs / "glue" / task, tmp)


def edit_tsv(path: Path, edit: Callable[[list[str]], list[str]]) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(edit(lines)) + "\n", encoding="utf-8")


def replace_line(number: int, text: str) -> Callable[[Path], None]:
    """A broken_glue damage: line `number` (1-based) becomes `text`."""
    return lambda path: edit_tsv(path, lambda lines: lines[: number - 1] + [text] + lines[number:])


def replace_label(number: int, label: str) -> Callable[[Path], None]:
    """A broken_glue damage: the last field of line `number` (the label of STS-B and MNLI rows) becomes `label`."""

    def edit(lines: list[str]) -> list[str]:
        others = lines[number - 1].rsplit("\t", 1)[0]
        return lines[: number - 1] + [f"{others}\t{label}"] + lines[number:]

    return lambda path: edit_tsv(path, edit)


def keep_lines(start: int, stop: int | None) -> Callable[[Path], None]:
    """A broken_glue damage: only lines[start:stop] are left."""
    return lambda path: edit_tsv(path, lambda lines: lines[start:stop])


def broken_glue(inputs: Path, tmp: Path, split: str, damage: Callable[[Path], None], task: str = "MRPC") -> Path:
    task_dir = glue_copy(inputs, tmp, task)
    damage(task_dir / f"{split}.tsv")
    return task_dir


def empty(path: Path) -> None:
    path.write_bytes(b"")


def not_utf8(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"the", b"th\xe9", 7))


def write_bytes(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def write_json(path: Path, value) -> Path:
    return write_bytes(path, json.dumps(value).encode())


def squad_data(inputs: Path, name: str = "train-v1.1.json") -> dict:
    return json.loads((inputs / "squad" / name).read_text())


def broken_squad(inputs: Path, tmp: Path, edit: Callable[[dict], None], name: str = "train-v1.1.json") -> Path:
    """A copy of a SQuAD file with `edit` applied to its JSON: edit gets {"qa": the first question of the first
    paragraph, "paragraph": that paragraph, "data": the whole file}."""
    data = squad_data(inputs, name)
    paragraph = data["data"][0]["paragraphs"][0]
    edit({"qa": paragraph["qas"][0], "paragraph": paragraph, "data": data})
    return write_json(tmp / name, data)


def bert_config(tmp: Path, **changes) -> Path:
    """TINY_BERT with keys changed (a value None deletes the key)."""
    values = {key: value for key, value in {**TINY_BERT, **changes}.items() if value is not None}
    return write_json(tmp / "bert_config.json", values)


def vocab_file(inputs: Path, tmp: Path, edit: Callable[[list[str]], list[str]]) -> Path:
    tokens = (inputs / "bert" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    return write_bytes(tmp / "vocab.txt", ("\n".join(edit(tokens)) + "\n").encode())


def tf1_copy(tmp: Path) -> Path:
    """The TF1 fixture's bert_model.ckpt (+ its vocab and config) in tmp; returns the checkpoint prefix."""
    for path in TF1.glob("bert_model.ckpt.*"):
        shutil.copy(path, tmp / path.name)
    return tmp / "bert_model.ckpt"


def truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def reshape_tf_tensor(index_path: Path, name: str, old: int, new: int) -> None:
    """Rewrite one dimension of a tensor's shape in a TF1 index (and the CRC of its block), as a checkpoint saved
    from another model would have it."""
    raw = bytearray(index_path.read_bytes())
    footer = bytes(raw[-48:])
    _, pos = read_varint(footer, 0, "footer")
    _, pos = read_varint(footer, pos, "footer")
    for _, handle in block_entries(read_block(bytes(raw), footer[pos:], "top"), "top"):
        offset, pos = read_varint(handle, 0, "handle")
        size, _ = read_varint(handle, pos, "handle")
        block = bytes(raw[offset : offset + size])
        for key, value in block_entries(block, "block"):
            if key == name.encode():
                start = offset + block.index(value)
                dim = value.index(bytes([0x08, old]))  # TensorShapeProto.Dim.size, a one-byte varint
                raw[start + dim + 1] = new
                crc = masked_crc32c(bytes(raw[offset : offset + size + 1]))
                raw[offset + size + 1 : offset + size + 5] = crc.to_bytes(4, "little")
                index_path.write_bytes(bytes(raw))
                return
    raise AssertionError(f"no tensor {name} in {index_path}")


def hf_copy(inputs: Path, tmp: Path) -> Path:
    return copy_tree(inputs / "hf", tmp)


def hf_truncated(inputs: Path, tmp: Path) -> Path:
    directory = hf_copy(inputs, tmp)
    truncate(directory / "model.safetensors")
    return directory


def hf_without_weights(inputs: Path, tmp: Path) -> Path:
    directory = hf_copy(inputs, tmp)
    (directory / "model.safetensors").unlink()
    return directory


def hf_with_wrong_shape(inputs: Path, tmp: Path) -> Path:
    from safetensors.torch import load_file, save_file

    directory = hf_copy(inputs, tmp)
    state = load_file(directory / "model.safetensors")
    state["bert.embeddings.position_embeddings.weight"] = torch.zeros(63, TINY_BERT["hidden_size"])
    save_file(state, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def hf_with_garbage_bin(inputs: Path, tmp: Path) -> Path:
    directory = hf_copy(inputs, tmp)
    (directory / "model.safetensors").unlink()
    (directory / "pytorch_model.bin").write_bytes(b"PK\x03\x04 this is no pickle of weights" * 10)
    return directory


def hf_of_another_model_type(inputs: Path, tmp: Path) -> Path:
    directory = hf_copy(inputs, tmp)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    return directory


def torch_file(inputs: Path, tmp: Path, name: str, make: Callable[[dict], object]) -> Path:
    """tmp/name: torch.save of `make(the HF directory's weights)`: another project's checkpoint of the tiny model."""
    from safetensors.torch import load_file

    path = tmp / name
    torch.save(make(load_file(inputs / "hf" / "model.safetensors")), path)
    return path


def without_layer(state: dict, layer: int) -> dict:
    return {name: tensor for name, tensor in state.items() if f"encoder.layer.{layer}." not in name}


def with_a_third_layer(state: dict) -> dict:
    return {**state, **{name.replace("layer.1.", "layer.2."): t for name, t in state.items() if "layer.1." in name}}


def bertbench_run(inputs: Path, tmp: Path, damaged: bool = False) -> Path:
    """tmp/run: a bertbench run directory holding the checkpoint of step 4 (the HF directory's weights); `damaged`:
    with a flipped byte in the middle of its weights."""
    from safetensors.torch import load_file

    checkpoint = Path(save_checkpoint(tmp / "run", 4, {"model": load_file(inputs / "hf" / "model.safetensors")}))
    if damaged:
        data = bytearray(checkpoint.read_bytes())
        data[len(data) // 2] ^= 0xFF
        checkpoint.write_bytes(bytes(data))
    return checkpoint.parent


def shards_copy(inputs: Path, tmp: Path, damage: Callable, which: str = "shards") -> Path:
    """A copy of the training shards (or the eval shards) with `damage(handle)` done to the first shard."""
    directory = copy_tree(inputs / which, tmp)
    with h5py.File(directory / sorted(os.listdir(directory))[0], "a") as handle:
        damage(handle)
    return directory


def set_value(key: str, where, value) -> Callable:
    def damage(handle):
        data = handle[key][()]
        data[where] = value
        del handle[key]
        handle.create_dataset(key, data=data)

    return damage


def replace_dataset(key: str, make: Callable[[np.ndarray], np.ndarray]) -> Callable:
    def damage(handle):
        data = make(handle[key][()])
        del handle[key]
        handle.create_dataset(key, data=data)

    return damage


def longer_sequences(handle):
    for key in ("input_ids", "input_mask", "segment_ids"):
        replace_dataset(key, lambda data: np.pad(data, ((0, 0), (0, 32))))(handle)


# ---- the corpus -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    """`build(inputs, tmp, out)` writes the broken input under tmp and returns the command's argv and the text, or
    texts, the error line must hold (the culprit's path, key or flag, and what is wrong with it). `state`: what the
    output directory holds before: absent, empty, or a copy of the named finished run."""

    id: str
    command: str
    build: Callable[[Path, Path, Path], tuple[list[str], str | tuple[str, ...]]]
    state: str = "absent"


def glue_case(id, split, damage, expect, *extra, task="MRPC", state="absent"):
    def build(inputs, tmp, out):
        task_dir = broken_glue(inputs, tmp, split, damage, task)
        flags = extra or ("--do_train", "--do_eval", "--do_predict")
        return classify_flags(inputs, out, *flags, data_dir=task_dir), f"{task_dir / split}.tsv{expect}"

    return Case(id, "classify", build, state)


def hf_files_case(id, split, extension, damage, expect, *extra):
    """A broken copy of HF run_glue's own files (inputs' MRPC as csv or JSON lines): `damage` breaks split's file."""

    def build(inputs, tmp, out):
        directory = tmp / "files"
        write_hf_glue_files(inputs / "glue" / "MRPC", directory)
        damage(directory / f"{split}.{extension}")
        flags = [f"--{name}_file={directory / f'{name}.{extension}'}" for name in ("train", "validation", "test")]
        argv = [flag for flag in classify_flags(inputs, out) if not flag.startswith(("--task_name", "--data_dir"))]
        return [*argv, *flags, *(extra or ("--do_train", "--do_eval", "--do_predict"))], (
            f"{directory / f'{split}.{extension}'}",
            expect,
        )

    return Case(id, "classify", build)


def squad_case(id, edit, expect, *extra, name="train-v1.1.json", version="1.1", state="absent"):
    def build(inputs, tmp, out):
        path = broken_squad(inputs, tmp, edit, name)
        which = {"train" if name.startswith("train") else "predict": path}
        return squad_flags(inputs, out, *extra, version=version, **which), (f"{path}: ", expect)

    return Case(id, "squad", build, state)


def config_case(id, changes, expect, state="absent"):
    def build(inputs, tmp, out):
        path = bert_config(tmp, **changes)
        return classify_flags(inputs, out, "--do_train", "--do_eval", config=path), f"{path}: {expect}"

    return Case(id, "classify", build, state)


def vocab_case(id, edit, expect, state="absent"):
    def build(inputs, tmp, out):
        path = vocab_file(inputs, tmp, edit)
        return classify_flags(inputs, out, "--do_train", vocab=path), (f"{path}", expect)

    return Case(id, "classify", build, state)


def flag_case(id, command, extra, expect, state="absent"):
    make = {
        "classify": lambda inputs, out: classify_flags(inputs, out, "--do_train", "--do_eval"),
        "squad": squad_flags,
        "pretrain": pretrain_flags,
    }[command]
    return Case(id, command, lambda inputs, tmp, out: (make(inputs, out) + list(extra), expect), state)


def shard_case(id, damage, expect, which="shards", state="absent"):
    def build(inputs, tmp, out):
        directory = shards_copy(inputs, tmp, damage, which)
        given = {"shards" if which == "shards" else "eval_dir": directory}
        shard = directory / sorted(os.listdir(directory))[0]
        return pretrain_flags(inputs, out, **given), f"{shard}: {expect}"

    return Case(id, "pretrain", build, state)


def small_shard_case(id, state):
    """A shard of 4 sequences for the runs' batch of 8: no batch can be drawn from it."""

    def build(inputs, tmp, out):
        (tmp / "small").mkdir()
        shard = write_nvidia_shard(tmp / "small" / "part_0.hdf5", count=4)
        return pretrain_flags(
            inputs, out, shards=shard.parent
        ), f"{shard}: 4 sequences, the most of any training shard, fewer than --train_batch_size 8"

    return Case(id, "pretrain", build, state)


def tf1_case(id, damage, expect, command="classify", state="absent"):
    """A damaged copy of the TF1 fixture's checkpoint, warm-started from (classify) or converted (convert)."""

    def build(inputs, tmp, out):
        prefix = tf1_copy(tmp)
        culprit = damage(prefix)
        if command == "convert":
            argv = [
                "--tf-checkpoint",
                str(prefix),
                "--bert-config",
                str(TF1 / "bert_config.json"),
                "--output",
                str(out),
                "--vocab-file",
                str(TF1 / "vocab.txt"),
            ]
        else:
            argv = classify_flags(
                inputs,
                out,
                "--do_train",
                f"--init_checkpoint={prefix}",
                vocab=TF1 / "vocab.txt",
                config=TF1 / "bert_config.json",
            )
        return argv, f"{culprit}: {expect}"

    return Case(id, command, build, state)


def hf_case(id, make, expect, culprit="model.safetensors", state="absent"):
    def build(inputs, tmp, out):
        directory = make(inputs, tmp)
        return (
            classify_flags(inputs, out, "--do_train", f"--init_checkpoint={directory}"),
            f"{directory / culprit}: {expect}",
        )

    return Case(id, "classify", build, state)


def without(token):
    return lambda tokens: [t for t in tokens if t != token]


MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
INDEX = "bert_model.ckpt.index"
DATA = "bert_model.ckpt.data-00000-of-00001"


def _truncated_index(prefix):
    truncate(prefix.parent / INDEX, 0.6)
    return prefix.parent / INDEX


def _truncated_data(prefix):
    truncate(prefix.parent / DATA, 0.5)
    return prefix.parent / DATA


def _missing_data(prefix):
    (prefix.parent / DATA).unlink()
    return prefix.parent / DATA


def _reshaped(prefix):
    reshape_tf_tensor(prefix.parent / INDEX, "bert/embeddings/LayerNorm/beta", 32, 31)
    return prefix.parent / INDEX


def _answer(qa):
    return qa["answers"][0]


CASES = [
    # ---- GLUE TSVs --------------------------------------------------------------------------------------------------
    glue_case(
        "glue-train-row-missing-columns",
        "train",
        replace_line(5, "1\t10\t11\tthe cat sees ."),
        ":5: 4 tab-separated fields",
    ),
    glue_case(
        "glue-train-bad-label",
        "train",
        replace_line(4, "2\t6\t7\tthe cat sees .\tthe dog sees ."),
        ":4: unknown label '2'",
    ),
    glue_case("glue-train-empty-file", "train", empty, ": no examples"),
    glue_case("glue-train-header-only", "train", keep_lines(0, 1), ": no examples"),
    glue_case("glue-train-missing-header", "train", keep_lines(1, None), ":1: an example (MRPC label"),
    glue_case(
        "glue-dev-wrong-column-count", "dev", replace_line(3, "0\tthe happy cat sees ."), ":3: 2 tab-separated fields"
    ),
    glue_case(
        "glue-dev-label-yes",
        "dev",
        replace_line(3, "yes\t4\t5\tthe cat sees .\tthe dog sees ."),
        ":3: unknown label 'yes'",
    ),
    glue_case(
        "glue-test-broken-refused-before-training",
        "test",
        replace_line(4, "2\tthe cat sees ."),
        ":4: 2 tab-separated fields",
    ),
    glue_case(
        "glue-test-broken-on-a-finished-run",
        "test",
        replace_line(2, "0"),
        ":2: 1 tab-separated field",
        state="classify",
    ),
    glue_case(
        "glue-test-broken-predict-only",
        "test",
        replace_line(2, "0"),
        ":2: 1 tab-separated field",
        "--do_predict",
        state="classify",
    ),
    glue_case(
        "glue-stsb-score-not-a-number",
        "train",
        replace_label(3, "five"),
        ":3: label 'five' is not a number",
        task="STS-B",
    ),
    glue_case(
        "glue-mnli-dev-mismatched-bad-label",
        "dev_mismatched",
        replace_label(3, "maybe"),
        ":3: unknown label 'maybe'",
        task="MNLI",
    ),
    glue_case("glue-train-non-utf8", "train", not_utf8, ":2: not valid UTF-8", "--do_train"),
    glue_case("glue-dev-missing", "dev", Path.unlink, ": no such file", "--do_train", "--do_eval", state="empty"),
    # ---- HF run_glue's csv and JSON-lines files ---------------------------------------------------------------------
    hf_files_case(
        "hf-csv-no-label-column", "train", "csv", replace_line(1, "sentence1,sentence2,gold"), ": no 'label' column"
    ),
    hf_files_case(
        "hf-csv-short-row",
        "train",
        "csv",
        replace_line(4, "the cat sees .,1"),
        ":4: 2 comma-separated fields, the header has 3",
    ),
    hf_files_case("hf-csv-no-label", "train", "csv", replace_line(3, "the cat sees .,the dog sees .,"), ":3: no label"),
    hf_files_case("hf-csv-one-class", "train", "csv", keep_lines(0, 2), ": every label is '"),
    hf_files_case(
        "hf-csv-text-and-number-labels",
        "train",
        "csv",
        replace_line(5, "a,b,yes"),
        ":5: label 'yes', where line 2's is ",
    ),
    hf_files_case(
        "hf-csv-nan-label", "train", "csv", replace_line(2, "a,b,nan"), ":2: label nan is not a finite number"
    ),
    hf_files_case(
        "hf-csv-unknown-validation-label",
        "validation",
        "csv",
        replace_line(3, "the cat sees .,the dog sees .,2"),
        ":3: label '2' is not one of the training file's labels (0, 1)",
    ),
    hf_files_case(
        "hf-csv-test-without-second-column",
        "test",
        "csv",
        replace_line(1, "sentence1,other"),
        ": no 'sentence2' column, which the training file has",
    ),
    hf_files_case("hf-json-not-json", "train", "json", replace_line(6, '{"sentence1": "a",'), ":6: not valid JSON"),
    hf_files_case(
        "hf-json-not-an-object",
        "validation",
        "json",
        replace_line(2, '["a", "b", 1]'),
        ":2: list, expected a JSON object",
    ),
    hf_files_case(
        "hf-json-number-text",
        "train",
        "json",
        replace_line(3, '{"sentence1": 7, "sentence2": "b", "label": 1}'),
        ":3: column 'sentence1' holds 7, not text",
    ),
    hf_files_case(
        "hf-json-test-record-missing-a-text",
        "test",
        "json",
        replace_line(2, '{"sentence1": "a"}'),
        ":2: column 'sentence2' holds None, not text",
    ),
    hf_files_case("hf-json-empty", "train", "json", empty, ": no examples"),
    hf_files_case("hf-csv-not-utf8", "validation", "csv", not_utf8, ": not valid UTF-8"),
    # ---- SQuAD JSON -------------------------------------------------------------------------------------------------
    Case(
        "squad-not-json",
        "squad",
        lambda inputs, tmp, out: (
            squad_flags(inputs, out, train=write_bytes(tmp / "train.json", b'{"version": "1.1", "data": [')),
            f"{tmp / 'train.json'}: not JSON",
        ),
    ),
    Case(
        "squad-top-level-list",
        "squad",
        lambda inputs, tmp, out: (
            squad_flags(inputs, out, train=write_json(tmp / "train.json", squad_data(inputs)["data"])),
            f"{tmp / 'train.json'}: not a SQuAD file",
        ),
    ),
    Case(
        "squad-non-utf8",
        "squad",
        lambda inputs, tmp, out: (
            squad_flags(
                inputs,
                out,
                train=write_bytes(
                    tmp / "train.json", (inputs / "squad/train-v1.1.json").read_bytes().replace(b"the", b"th\xff", 1)
                ),
            ),
            f"{tmp / 'train.json'}: not JSON",
        ),
    ),
    squad_case("squad-no-data-key", lambda d: d["data"].pop("data"), "not a SQuAD file (no 'data' list)"),
    squad_case("squad-no-context", lambda d: d["paragraph"].pop("context"), "has no 'context' field"),
    squad_case("squad-no-qas", lambda d: d["paragraph"].pop("qas"), "a paragraph has no 'qas' field"),
    squad_case("squad-no-answers", lambda d: d["qa"].pop("answers"), "has no 'answers' field"),
    squad_case("squad-no-id", lambda d: d["qa"].pop("id"), "a question has no 'id' field"),
    squad_case(
        "squad-answer-start-outside-context",
        lambda d: _answer(d["qa"]).update(answer_start=len(d["paragraph"]["context"]) + 5),
        "answer_start",
    ),
    squad_case(
        "squad-answer-text-not-at-answer-start",
        lambda d: _answer(d["qa"]).update(answer_start=_answer(d["qa"])["answer_start"] + 1),
        "points at",
    ),
    squad_case(
        "squad-answer-start-is-text", lambda d: _answer(d["qa"]).update(answer_start="4"), "answer_start is '4'"
    ),
    squad_case("squad-question-not-text", lambda d: d["qa"].update(question=7), "the question is 7"),
    squad_case(
        "squad-duplicate-id", lambda d: d["qa"].update(id=d["paragraph"]["qas"][1]["id"]), "the id is used twice"
    ),
    squad_case(
        "squad-v2-is-impossible-a-string",
        lambda d: d["qa"].update(is_impossible="false"),
        "is_impossible is 'false'",
        name="train-v2.0.json",
        version="2.0",
    ),
    squad_case(
        "squad-v2-question-in-a-v1-run",
        lambda d: d["qa"].update(is_impossible=True, answers=[]),
        "--version_2_with_negative",
        name="train-v1.1.json",
    ),
    squad_case(
        "squad-predict-file-no-qas",
        lambda d: d["paragraph"].pop("qas"),
        "a paragraph has no 'qas' field",
        name="dev-v1.1.json",
    ),
    squad_case(
        "squad-predict-answer-text-not-text", lambda d: _answer(d["qa"]).update(text=3), "answer", name="dev-v1.1.json"
    ),
    squad_case(
        "squad-v2-predict-is-impossible-a-number",
        lambda d: d["qa"].update(is_impossible=1),
        "is_impossible",
        name="dev-v2.0.json",
        version="2.0",
    ),
    Case(
        "evaluate-squad-predictions-a-list",
        "evaluate",
        lambda inputs, tmp, out: (
            [
                str(inputs / "squad/dev-v1.1.json"),
                str(write_json(tmp / "predictions.json", ["calm owl"])),
                f"--out-file={out / 'scores.json'}",
            ],
            f"{tmp / 'predictions.json'}: expected a JSON object",
        ),
    ),
    Case(
        "evaluate-squad-prediction-not-text",
        "evaluate",
        lambda inputs, tmp, out: (
            [
                str(inputs / "squad/dev-v1.1.json"),
                str(write_json(tmp / "predictions.json", {"demo-1-0-0": 5})),
                f"--out-file={out / 'scores.json'}",
            ],
            f"{tmp / 'predictions.json'}: question demo-1-0-0",
        ),
    ),
    Case(
        "evaluate-squad-data-not-json",
        "evaluate",
        lambda inputs, tmp, out: (
            [
                str(write_bytes(tmp / "dev.json", b"<html>")),
                str(write_json(tmp / "predictions.json", {})),
                f"--out-file={out / 'scores.json'}",
            ],
            f"{tmp / 'dev.json'}: not JSON",
        ),
        state="empty",
    ),
    Case(
        "evaluate-squad-na-prob-not-a-number",
        "evaluate",
        lambda inputs, tmp, out: (
            [
                str(inputs / "squad/dev-v2.0.json"),
                str(write_json(tmp / "predictions.json", {})),
                f"--na-prob-file={write_json(tmp / 'null_odds.json', {'demo-1-0-0': 'high'})}",
                f"--out-file={out / 'scores.json'}",
            ],
            f"{tmp / 'null_odds.json'}: question demo-1-0-0",
        ),
    ),
    # ---- bert_config.json -------------------------------------------------------------------------------------------
    Case(
        "config-not-json",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(
                inputs, out, "--do_train", config=write_bytes(tmp / "bert_config.json", b"{'vocab_size': 48}")
            ),
            f"{tmp / 'bert_config.json'}: not JSON",
        ),
    ),
    Case(
        "config-top-level-list",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(inputs, out, "--do_train", config=write_json(tmp / "bert_config.json", [TINY_BERT])),
            f"{tmp / 'bert_config.json'}: expected a JSON object",
        ),
    ),
    config_case("config-missing-key", {"hidden_act": None}, "missing key 'hidden_act'"),
    config_case("config-unknown-key", {"hidden_sizes": 32}, "unknown key 'hidden_sizes'"),
    config_case("config-initializer-range-text", {"initializer_range": "x"}, "initializer_range"),
    config_case("config-hidden-size-text", {"hidden_size": "32"}, "hidden_size"),
    config_case("config-vocab-size-zero", {"vocab_size": 0}, "vocab_size"),
    config_case("config-layers-negative", {"num_hidden_layers": -2}, "num_hidden_layers"),
    config_case("config-hidden-not-divisible-by-heads", {"num_attention_heads": 5}, "hidden_size"),
    config_case("config-bad-activation", {"hidden_act": "gelu2"}, "hidden_act"),
    config_case("config-dropout-1.5", {"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
    config_case("config-type-vocab-size-1", {"type_vocab_size": 1}, "type_vocab_size"),
    config_case("config-layer-norm-eps-0", {"layer_norm_eps": 0}, "layer_norm_eps"),
    config_case(
        "config-weights-larger-than-memory",
        {"vocab_size": 10**12},
        "the model's fp32 weights alone take "
        "119,209.3 GiB (embeddings: vocab_size=1000000000000 x hidden_size=32, 119,209.3 GiB), more than",
    ),
    config_case(
        "config-layers-larger-than-memory",
        {"num_hidden_layers": 10**8},
        "the model's fp32 weights alone "
        "take 3,182.9 GiB (layers: num_hidden_layers=100000000 x (4 x hidden_size=32 squared + 2 x "
        "hidden_size x intermediate_size=64), 3,182.9 GiB), more than",
    ),
    config_case("config-on-a-finished-run", {"hidden_act": None}, "missing key 'hidden_act'", state="classify"),
    Case(
        "config-hf-of-another-model-type",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(inputs, out, "--do_train", config=hf_of_another_model_type(inputs, tmp)),
            f"{tmp / 'hf' / 'config.json'}: key 'model_type' is 'roberta'",
        ),
    ),
    # ---- vocab.txt --------------------------------------------------------------------------------------------------
    vocab_case("vocab-empty", lambda tokens: [], ": empty vocabulary file"),
    vocab_case("vocab-missing-cls", without("[CLS]"), ": missing special token [CLS]"),
    vocab_case(
        "vocab-missing-sep-and-unk",
        lambda tokens: [t for t in tokens if t not in ("[SEP]", "[UNK]")],
        ": missing special tokens [UNK], [SEP]",
    ),
    vocab_case("vocab-missing-pad", without("[PAD]"), ": missing special token [PAD]"),
    vocab_case("vocab-duplicate-token", lambda tokens: tokens + ["cat"], ":43: duplicate token 'cat'"),
    vocab_case("vocab-empty-line", lambda tokens: tokens[:6] + [""] + tokens[6:], ":7: empty line"),
    vocab_case(
        "vocab-duplicate-on-a-finished-run",
        lambda tokens: tokens + ["[CLS]"],
        ":43: duplicate token '[CLS]'",
        state="classify",
    ),
    Case(
        "vocab-non-utf8",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(
                inputs,
                out,
                "--do_train",
                vocab=write_bytes(
                    tmp / "vocab.txt", (inputs / "bert/vocab.txt").read_bytes().replace(b"cat", b"c\xe0t")
                ),
            ),
            f"{tmp / 'vocab.txt'}:",
        ),
    ),
    vocab_case("vocab-bigger-than-vocab-size", lambda tokens: tokens + [f"word{i}" for i in range(10)], ": 52 tokens"),
    Case(
        "vocab-missing-mask-for-pretraining-data",
        "data",
        lambda inputs, tmp, out: (
            [
                f"--input_file={inputs / 'corpus.txt'}",
                f"--vocab_file={vocab_file(inputs, tmp, without('[MASK]'))}",
                f"--output_dir={out}",
                "--max_seq_length=32",
                "--max_predictions_per_seq=5",
            ],
            f"{tmp / 'vocab.txt'}: missing special token [MASK]",
        ),
    ),
    # ---- TF1 checkpoints --------------------------------------------------------------------------------------------
    tf1_case("tf1-truncated-index", _truncated_index, "not a TensorFlow checkpoint index"),
    tf1_case("tf1-truncated-data", _truncated_data, "truncated"),
    tf1_case("tf1-missing-data", _missing_data, "no such file"),
    tf1_case("tf1-tensor-of-wrong-shape", _reshaped, "variable bert/embeddings/LayerNorm/beta has shape [31]"),
    tf1_case("tf1-truncated-data-in-an-existing-directory", _truncated_data, "truncated", state="empty"),
    tf1_case(
        "tf1-tensor-of-wrong-shape-in-an-existing-directory",
        _reshaped,
        "variable bert/embeddings/LayerNorm/beta has shape [31]",
        state="empty",
    ),
    tf1_case("convert-tf1-truncated-index", _truncated_index, "not a TensorFlow checkpoint index", "convert"),
    tf1_case("convert-tf1-truncated-data", _truncated_data, "truncated", "convert"),
    tf1_case("convert-tf1-missing-data", _missing_data, "no such file", "convert"),
    tf1_case(
        "convert-tf1-tensor-of-wrong-shape",
        _reshaped,
        "variable bert/embeddings/LayerNorm/beta has shape [31]",
        "convert",
    ),
    Case(
        "convert-bad-bert-config",
        "convert",
        lambda inputs, tmp, out: (
            [
                "--tf-checkpoint",
                str(TF1 / "bert_model.ckpt"),
                "--bert-config",
                str(bert_config(tmp, num_attention_heads=3)),
                "--output",
                str(out),
            ],
            f"{tmp / 'bert_config.json'}: hidden_size",
        ),
        state="empty",
    ),
    # ---- warm-start checkpoints of every format: a checkpoint that cannot be this model's is refused -------------
    Case(
        "init-checkpoint-torch-file-without-bert-weights",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(
                inputs,
                out,
                "--do_train",
                f"--init_checkpoint={torch_file(inputs, tmp, 'ckpt_8601.pt', lambda s: {'epoch': 2, 'files': [0]})}",
            ),
            (f"{tmp / 'ckpt_8601.pt'}: no BERT weights in it (a dict of epoch, files); expected BERT's weights",),
        ),
    ),
    Case(
        "init-checkpoint-of-another-model",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(
                inputs,
                out,
                "--do_train",
                "--init_checkpoint="
                + str(
                    torch_file(inputs, tmp, "gpt.pt", lambda s: {"model": {"h.0.attn.c_attn.weight": torch.ones(2)}})
                ),
            ),
            f"{tmp / 'gpt.pt'}: no BERT encoder weight in it (1 tensors such as h.0.attn.c_attn.weight)",
        ),
    ),
    Case(
        "init-checkpoint-without-an-encoder-layer",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(
                inputs,
                out,
                "--do_train",
                f"--init_checkpoint={torch_file(inputs, tmp, 'one-layer.bin', lambda s: without_layer(s, 1))}",
            ),
            (
                f"{tmp / 'one-layer.bin'}: 16 of the model's 37 encoder weights are not in it (bert.encoder.layer.1)",
                "--allow_partial_init_checkpoint",
            ),
        ),
    ),
    Case(
        "init-checkpoint-of-more-layers-than-the-config",
        "squad",
        lambda inputs, tmp, out: (
            squad_flags(
                inputs,
                out,
                f"--init_checkpoint={torch_file(inputs, tmp, 'three-layers.pt', with_a_third_layer)}",
            ),
            f"{tmp / 'three-layers.pt'}: it holds encoder weights the model has no place for (bert.encoder.layer.2)",
        ),
    ),
    Case(
        "init-checkpoint-run-whose-checkpoint-is-damaged",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(inputs, out, "--do_eval", f"--init_checkpoint={bertbench_run(inputs, tmp, damaged=True)}"),
            (f"{tmp / 'run' / 'ckpt-000000004.pt'}: damaged checkpoint",),
        ),
    ),
    Case(
        "init-checkpoint-google-name-in-a-bertbench-run",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(
                inputs, out, "--do_eval", f"--init_checkpoint={bertbench_run(inputs, tmp) / 'model.ckpt-4'}"
            ),
            (
                f"{tmp / 'run' / 'model.ckpt-4'}: no such file or directory; {tmp / 'run'} is a bertbench run",
                f"give the run directory {tmp / 'run'} (its newest checkpoint) or {tmp / 'run' / 'ckpt-000000004.pt'}",
            ),
        ),
    ),
    Case(
        "init-checkpoint-missing",
        "pretrain",
        lambda inputs, tmp, out: (
            pretrain_flags(inputs, out, f"--init_checkpoint={tmp / 'nowhere' / 'bert_model.ckpt'}"),
            f"{tmp / 'nowhere' / 'bert_model.ckpt'}: no such file or directory ({tmp / 'nowhere'} does not exist)",
        ),
    ),
    Case(
        "max-train-samples-below-a-batch-is-named-before-the-checkpoint-is-read",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(
                inputs,
                out,
                "--do_train",
                "--max_train_samples=4",
                f"--init_checkpoint={write_bytes(tmp / 'garbage.bin', b'not a checkpoint')}",
            ),
            "4 training sequences make no full step of 16 sequences",
        ),
    ),
    # ---- HF checkpoints ---------------------------------------------------------------------------------------------
    hf_case("hf-truncated-safetensors", hf_truncated, "cannot read weights"),
    hf_case("hf-safetensors-wrong-shape", hf_with_wrong_shape, "bert.embeddings.position_embeddings.weight has shape"),
    hf_case("hf-garbage-pytorch-model-bin", hf_with_garbage_bin, "cannot read weights", "pytorch_model.bin"),
    hf_case(
        "hf-config-of-another-model-type", hf_of_another_model_type, "key 'model_type' is 'roberta'", "config.json"
    ),
    hf_case(
        "hf-directory-without-weights", hf_without_weights, "an HF directory without weights (no model.safetensors", ""
    ),
    hf_case(
        "hf-truncated-safetensors-on-an-unsaved-run", hf_truncated, "cannot read weights", state="classify-unsaved"
    ),
    hf_case(
        "hf-safetensors-wrong-shape-on-an-unsaved-run",
        hf_with_wrong_shape,
        "bert.embeddings.position_embeddings.weight has shape",
        state="classify-unsaved",
    ),
    hf_case(
        "hf-garbage-pytorch-model-bin-in-an-existing-directory",
        hf_with_garbage_bin,
        "cannot read weights",
        "pytorch_model.bin",
        state="empty",
    ),
    Case(
        "init-checkpoint-directory-of-unrelated-files-on-an-unsaved-run",
        "classify",
        lambda inputs, tmp, out: (
            classify_flags(
                inputs, out, "--do_train", f"--init_checkpoint={write_bytes(tmp / 'notes' / 'a.txt', b'').parent}"
            ),
            f"{tmp / 'notes'}: a directory with no BERT weights (it holds a.txt); expected BERT's weights",
        ),
        state="classify-unsaved",
    ),
    # ---- hdf5 pre-training shards -----------------------------------------------------------------------------------
    Case(
        "shard-not-hdf5",
        "pretrain",
        lambda inputs, tmp, out: (
            pretrain_flags(
                inputs, out, shards=write_bytes(tmp / "shards" / "part_0.hdf5", b"input_ids\n1 2 3\n").parent
            ),
            f"{tmp / 'shards' / 'part_0.hdf5'}: cannot be read as hdf5",
        ),
    ),
    Case(
        "shard-directory-without-shards",
        "pretrain",
        lambda inputs, tmp, out: (
            pretrain_flags(inputs, out, shards=write_bytes(tmp / "shards" / "part_0.txt", b"").parent),
            f"{tmp / 'shards'}: no .hdf5 or .h5 shard",
        ),
    ),
    shard_case("shard-missing-dataset", lambda handle: handle.__delitem__("masked_lm_ids"), "no dataset masked_lm_ids"),
    shard_case(
        "shard-wrong-shapes",
        replace_dataset("segment_ids", lambda data: data[:, :16]),
        "segment_ids has shape [16, 16]",
    ),
    shard_case("shard-train-ids-outside-the-vocab", set_value("input_ids", (3, 1), 48), "row 3: input_ids value 48"),
    shard_case(
        "shard-train-float-ids",
        replace_dataset("input_ids", lambda data: data.astype(np.float32)),
        "input_ids holds float32",
    ),
    shard_case(
        "shard-eval-ids-outside-the-vocab",
        set_value("masked_lm_ids", (2, 0), 1000),
        "row 2: masked_lm_ids value 1000",
        "eval",
    ),
    shard_case(
        "shard-eval-masked-position-outside-the-sequence",
        set_value("masked_lm_positions", (1, 0), 31),
        "row 1: masked position 31 is outside its sequence",
        "eval",
    ),
    shard_case("shard-eval-segment-id-2", set_value("segment_ids", (0, 2), 2), "row 0: segment_ids value 2", "eval"),
    shard_case(
        "shard-eval-float-dtype",
        replace_dataset("masked_lm_positions", lambda data: data.astype(np.float64)),
        "masked_lm_positions holds float64",
        "eval",
    ),
    shard_case(
        "shard-eval-next-sentence-label-5",
        set_value("next_sentence_labels", 4, 5),
        "row 4: next_sentence_labels value 5",
        "eval",
        state="pretrain",
    ),
    shard_case(
        "shard-eval-longer-than-max-seq-length",
        longer_sequences,
        "sequences of 64 tokens, longer than --max_seq_length 32",
        "eval",
        state="pretrain",
    ),
    small_shard_case("shard-smaller-than-a-batch-on-an-unsaved-run", "pretrain-unsaved"),
    small_shard_case("shard-smaller-than-a-batch-on-a-finished-run", "pretrain"),
    # ---- flags ------------------------------------------------------------------------------------------------------
    flag_case("flag-bad-int", "classify", ["--train_batch_size=many"], "--train_batch_size"),
    flag_case("flag-bad-bool", "classify", ["--do_train=maybe"], "--do_train"),
    flag_case("flag-unknown", "classify", ["--no_such_flag=1"], "--no_such_flag"),
    flag_case("flag-num-accumulation-steps-0", "classify", ["--num_accumulation_steps=0"], "--num_accumulation_steps"),
    flag_case(
        "flag-num-accumulation-steps-0-pretraining",
        "pretrain",
        ["--num_accumulation_steps=0"],
        "--num_accumulation_steps",
    ),
    flag_case("flag-learning-rate-nan", "classify", ["--learning_rate=nan"], "--learning_rate"),
    flag_case("flag-num-train-epochs-nan", "classify", ["--num_train_epochs=nan"], "--num_train_epochs"),
    flag_case("flag-warmup-proportion-2", "classify", ["--warmup_proportion=2"], "--warmup_proportion"),
    flag_case(
        "flag-max-seq-length-beyond-positions", "classify", ["--max_seq_length=128"], "max_position_embeddings is 64"
    ),
    flag_case("flag-max-seq-length-2", "classify", ["--max_seq_length=2"], "--max_seq_length"),
    flag_case(
        "flag-recompute-every-0",
        "classify",
        ["--modeling=recompute", "--recompute-policy=every-k", "--recompute-every=0"],
        "--recompute-every",
    ),
    flag_case(
        "flag-recompute-every-0-in-an-existing-directory",
        "classify",
        ["--modeling=recompute", "--recompute-policy=every-k", "--recompute-every=0"],
        "--recompute-every",
        state="empty",
    ),
    flag_case("flag-device-nonsense", "classify", ["--device=nonsense"], "nonsense"),
    flag_case(
        "flag-device-nonsense-on-a-finished-run", "pretrain", ["--device=nonsense"], "nonsense", state="pretrain"
    ),
    flag_case("flag-keep-checkpoint-max-0", "classify", ["--keep_checkpoint_max=0"], "--keep_checkpoint_max"),
    flag_case(
        "flag-save-checkpoints-steps-negative", "classify", ["--save_checkpoints_steps=-1"], "--save_checkpoints_steps"
    ),
    flag_case("flag-eval-batch-size-0", "classify", ["--eval_batch_size=0"], "--eval_batch_size"),
    flag_case("flag-optimizer-unknown", "classify", ["--optimizer_type=sgd"], "--optimizer_type"),
    flag_case(
        "flag-max-predictions-not-below-seq", "pretrain", ["--max_predictions_per_seq=32"], "--max_predictions_per_seq"
    ),
    flag_case("flag-warmup-steps-beyond-steps", "pretrain", ["--num_warmup_steps=9"], "--num_warmup_steps"),
    flag_case("flag-length-bins-not-numbers", "pretrain", ["--length_bins=short,long"], "--length_bins"),
    flag_case("flag-doc-stride-0", "squad", ["--doc_stride=0"], "--doc_stride"),
    flag_case(
        "flag-learning-rate-conflicts-with-the-run",
        "classify",
        ["--learning_rate=1e-5"],
        "--learning_rate",
        state="classify",
    ),
    flag_case(
        "flag-num-accumulation-steps-0-on-a-finished-run",
        "classify",
        ["--num_accumulation_steps=0"],
        "--num_accumulation_steps",
        state="classify",
    ),
    Case(
        "flag-device-cuda-without-cuda",
        "classify",
        lambda inputs, tmp, out: (classify_flags(inputs, out, "--do_train", "--device=cuda"), "'cuda'"),
    ),
    Case(
        "flag-masked-lm-prob-1.5",
        "data",
        lambda inputs, tmp, out: (
            [
                f"--input_file={inputs / 'corpus.txt'}",
                f"--vocab_file={inputs / 'bert/vocab.txt'}",
                f"--output_dir={out}",
                "--masked_lm_prob=1.5",
            ],
            "--masked_lm_prob",
        ),
    ),
    Case(
        "flag-input-file-missing",
        "data",
        lambda inputs, tmp, out: (
            [f"--input_file={tmp / 'nothing.txt'}", f"--vocab_file={inputs / 'bert/vocab.txt'}", f"--output_dir={out}"],
            f"{tmp / 'nothing.txt'}: no such file",
        ),
        state="empty",
    ),
    Case(
        "corpus-non-utf8",
        "data",
        lambda inputs, tmp, out: (
            [
                f"--input_file={write_bytes(tmp / 'corpus.txt', b'the cat sees .' + bytes([10, 0xC3, 0x28, 10]))}",
                f"--vocab_file={inputs / 'bert/vocab.txt'}",
                f"--output_dir={out}",
            ],
            f"{tmp / 'corpus.txt'}:2:",
        ),
    ),
    Case("cli-unknown-command", "cli", lambda inputs, tmp, out: (["train", f"--output_dir={out}"], "'train'")),
    Case(
        "cli-classify-bad-flag",
        "cli-classify",
        lambda inputs, tmp, out: (
            ["classify"] + classify_flags(inputs, out, "--do_train", "--train_batch_size=1.5"),
            "--train_batch_size",
        ),
    ),
]


def test_the_corpus_is_large_and_its_ids_unique():
    assert len(CASES) >= 60 and len({case.id for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_malformed_input_is_refused_in_one_line_and_changes_nothing(case, inputs, finished_runs, tmp_path, capsys):
    if case.id == "flag-device-cuda-without-cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "out"
    if case.state == "empty":
        out.mkdir()
    elif case.state != "absent":
        shutil.copytree(finished_runs[case.state], out)
    argv, culprit = case.build(inputs, tmp_path, out)
    before = snapshot(out)
    capsys.readouterr()

    program, main = COMMANDS[case.command]
    status = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert status == 2, captured.err[-3000:]
    assert "Traceback" not in captured.err + captured.out
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{program}: error: "), lines[0]
    for text in (culprit,) if isinstance(culprit, str) else culprit:
        assert text in lines[0], lines[0]
    assert snapshot(out) == before
