"""HF-format directories and weights files: recognised, their tokenizer flags taken, written atomically; reading any
checkpoint into a model is weights.pretrained's, Google's TensorFlow names and their mapping are weights.tf_names'.

bertbench's state-dict names are exactly HF transformers' BERT names, so an HF directory is bertbench's own format:
`config.json` + `model.safetensors` (or `pytorch_model.bin`) + the tokenizer files, loadable by both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch

from bertbench.common.durable import atomic_output, write_directory_atomically
from bertbench.model.config import BertConfig
from bertbench.tasks.tokenization import (
    BertTokenizer,
    directory_tokenizer,
    load_vocab,
    read_tokenizer_json,
    vocab_path,
)
from bertbench.weights.tf_checkpoint import TFCheckpoint
from bertbench.weights.tf_names import (
    TFMapping,
    WeightsError,
    read_tf_weights,
    tf_model_variables,
)

# Aliases HF ties to another parameter and re-ties on load, so a saved file holds each of these once, under the
# other name (what HF's own save_pretrained does).
_HF_TIED_ALIASES = frozenset({"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"})


HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def is_hf_directory(path: str | os.PathLike) -> bool:
    """An HF-format directory: config.json beside model.safetensors, pytorch_model.bin or a sharded index of them."""
    path = os.fspath(path)
    return os.path.isfile(os.path.join(path, "config.json")) and any(
        os.path.isfile(os.path.join(path, name)) for name in HF_WEIGHT_FILES
    )


def check_shapes(state: Mapping[str, torch.Tensor], config: BertConfig, source: str) -> None:
    num_labels = state["classifier.weight"].shape[0] if "classifier.weight" in state else None
    expected = {}
    for tf_name, (hf_name, shape) in tf_model_variables(config, num_labels).items():
        expected[hf_name] = shape[::-1] if tf_name.endswith("/kernel") else shape
    for name, tensor in state.items():
        shape = expected.get(name, expected.get(f"bert.{name}"))
        if shape is not None and tuple(tensor.shape) != shape:
            raise WeightsError(f"{source}: {name} has shape {list(tensor.shape)}, the config implies {list(shape)}")


def hf_directory_flags(directory: str | os.PathLike) -> dict[str, tuple[Any, str]]:
    """What an HF directory says of the flags bert_config_file, vocab_file and do_lower_case, each with the file that
    says it: its config.json, its vocab.txt or tokenizer.json, and the lower-casing its tokenizer_config.json or
    tokenizer.json says; nothing for a path that is no HF directory."""
    directory = os.fspath(directory)
    if not is_hf_directory(directory):
        return {}
    found: dict[str, tuple[Any, str]] = {"bert_config_file": (os.path.join(directory, "config.json"),) * 2}
    tokenizer = directory_tokenizer(directory)
    if tokenizer.vocab_file is not None:
        found["vocab_file"] = (tokenizer.vocab_file,) * 2
    if tokenizer.do_lower_case is not None:
        found["do_lower_case"] = (tokenizer.do_lower_case, tokenizer.lower_case_from)
    return found


def take_checkpoint_flags(
    found: Mapping[str, tuple[Any, str]], origin: str | None, stated: Mapping[str, Any], wanted: Collection[str]
) -> tuple[dict[str, Any], str | None]:
    """The values of the `wanted` flags (bert_config_file, vocab_file, do_lower_case) that a command leaves out
    (`stated`: the flags it gives or its run recorded) and that a checkpoint `origin` supplies (`found`: flag ->
    (value, the file that says it); an HF directory's, a bertbench run's), and a one-line note of what was taken,
    None if nothing. A vocab_file that is a tokenizer.json says the lower-casing too. A stated flag that contradicts
    the file is a WeightsError naming both."""
    found = dict(found)
    vocab_file = stated.get("vocab_file") or found.get("vocab_file", (None,))[0]
    if (
        "do_lower_case" not in found
        and vocab_file
        and vocab_path(vocab_file).endswith(".json")
        and os.path.isfile(vocab_path(vocab_file))
    ):
        lower = read_tokenizer_json(vocab_path(vocab_file)).do_lower_case
        if lower is not None:
            found["do_lower_case"] = (lower, vocab_path(vocab_file))
    same = {
        "bert_config_file": lambda a, b: BertConfig.from_json_file(a) == BertConfig.from_json_file(b),
        "vocab_file": lambda a, b: load_vocab(a) == load_vocab(b),
        "do_lower_case": lambda a, b: a == b,
    }
    taken = {}
    for name in (name for name in same if name in wanted and name in found):
        value, source = found[name]
        if stated.get(name) is None:
            taken[name] = value
        elif not same[name](stated[name], value):
            given = f"--{name}={str(stated[name]).lower() if name == 'do_lower_case' else stated[name]}"
            raise WeightsError(
                {
                    "bert_config_file": f"{given} describes another model than {source}",
                    "vocab_file": f"{given} is another vocabulary than {source}",
                    "do_lower_case": f"{given} contradicts {source}, which says do_lower_case={str(value).lower()}",
                }[name]
                + "; leave the flag out to take the file's"
            )
    if not taken:
        return taken, None
    spelt = ", ".join(
        f"--{name}={str(value).lower() if isinstance(value, bool) else value}"
        + (f" (from {found[name][1]})" if name == "do_lower_case" else "")
        for name, value in taken.items()
    )
    return taken, f"{spelt}, taken from {origin or vocab_file}"


def _architecture(names) -> str:
    names = set(names)
    if "qa_outputs.weight" in names:
        return "BertForQuestionAnswering"
    if "classifier.weight" in names:
        return "BertForSequenceClassification"
    if "cls.predictions.bias" in names or "cls.seq_relationship.weight" in names:
        return "BertForPreTraining"
    return "BertModel"


def _weights_to_save(model: torch.nn.Module | Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each distinct tensor once, contiguous; of tied names the one HF does not re-tie on load is kept."""
    # Parameters only: HF BERT has no persistent buffers, and position-id buffers a model registers are no weights.
    named = dict(model.named_parameters(remove_duplicate=False)) if isinstance(model, torch.nn.Module) else model
    groups: dict[tuple, list[str]] = {}
    for name, tensor in named.items():
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        groups.setdefault(where, []).append(name)
    state = {}
    for names in groups.values():
        kept = next((name for name in names if name not in _HF_TIED_ALIASES), names[0])
        state[kept] = named[kept].detach().contiguous()
    return state


def check_output_dir(out_dir: str, overwrite: bool) -> None:
    """An output directory may be written: absent, empty, or replaced with `overwrite`; else a WeightsError."""
    if os.path.exists(out_dir):
        if not os.path.isdir(out_dir):
            raise WeightsError(f"{out_dir}: exists and is not a directory")
        if os.listdir(out_dir) and not overwrite:
            raise WeightsError(f"{out_dir}: exists and is not empty (pass overwrite=True or --overwrite to replace it)")


def _check_output_file(path: str, overwrite: bool) -> None:
    if os.path.isdir(path):
        raise WeightsError(
            f"{path}: is a directory, not a file to write (as in HF's conversion script, "
            "--pytorch_dump_path names one weights file; --output_dir writes a directory)"
        )
    if os.path.exists(path) and not overwrite:
        raise WeightsError(f"{path}: exists (pass --overwrite to replace it)")


def model_tokenizer(vocab_file: str | os.PathLike, do_lower_case: bool, config: BertConfig) -> BertTokenizer:
    """The tokenizer of `vocab_file` (vocab.txt or tokenizer.json), checked to fit the model's embeddings."""
    tokenizer = BertTokenizer.from_vocab_file(vocab_file, do_lower_case=do_lower_case)
    if tokenizer.vocab_size > config.vocab_size:
        raise WeightsError(
            f"{os.fspath(vocab_file)}: {tokenizer.vocab_size} tokens, but the model's vocab_size "
            f"is {config.vocab_size}: this vocabulary does not belong to this model"
        )
    return tokenizer


def save_hf_directory(
    model: torch.nn.Module | Mapping[str, torch.Tensor],
    config: BertConfig,
    out_dir: str | os.PathLike,
    vocab_file: str | os.PathLike | None = None,
    safe_serialization: bool = True,
    overwrite: bool = False,
    do_lower_case: bool = True,
    labels: Sequence[str] | None = None,
    problem_type: str | None = None,
) -> str:
    """Writes an HF-format directory (config.json, weights, and with `vocab_file` the tokenizer files that
    AutoTokenizer loads, do_lower_case kept) atomically; returns the architecture name.

    `model` is a module or an HF-named state dict; the architecture (BertModel, BertForPreTraining,
    BertForSequenceClassification, BertForQuestionAnswering) follows from which heads it has. A classifier's
    id2label names `labels` (LABEL_0, ... when None); `problem_type` is HF's ("regression" for one score).
    Every input is checked before anything is written.
    """
    state = _weights_to_save(model)
    check_shapes(state, config, "model")
    architecture = _architecture(state)
    if architecture == "BertModel":  # HF's BertModel names carry no `bert.` prefix
        state = {name.removeprefix("bert."): tensor for name, tensor in state.items()}
    hf_config = config.to_hf_dict(architectures=[architecture])
    if architecture == "BertForSequenceClassification":
        num_labels = state["classifier.weight"].shape[0]
        names = [f"LABEL_{i}" for i in range(num_labels)] if labels is None else list(labels)
        if len(names) != num_labels or len(set(names)) != num_labels:
            raise WeightsError(
                f"the classifier has {num_labels} outputs, and the labels {names} are not as many distinct names"
            )
        hf_config["id2label"] = {str(i): name for i, name in enumerate(names)}
        hf_config["label2id"] = {name: i for i, name in enumerate(names)}
        if problem_type is not None:
            hf_config["problem_type"] = problem_type
    tokenizer = None if vocab_file is None else model_tokenizer(vocab_file, do_lower_case, config)

    def write(directory: str) -> None:
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as handle:
            json.dump(hf_config, handle, indent=2, sort_keys=True)
            handle.write("\n")
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
        else:
            torch.save(state, os.path.join(directory, "pytorch_model.bin"))
        if tokenizer is not None:
            tokenizer.save_hf_files(directory, model_max_length=config.max_position_embeddings)

    check_output_dir(os.path.abspath(os.fspath(out_dir)), overwrite)
    write_directory_atomically(out_dir, write)
    return architecture


def save_hf_weights_file(
    model: torch.nn.Module | Mapping[str, torch.Tensor],
    config: BertConfig,
    path: str | os.PathLike,
    overwrite: bool = False,
) -> str:
    """One pytorch_model.bin-style file at `path`, as HF's convert_bert_original_tf_checkpoint_to_pytorch writes
    it (torch.save of the model's state_dict, tied decoder names included), written atomically; returns the
    architecture name. An existing file is replaced only with `overwrite`."""
    path = os.path.abspath(os.fspath(path))
    _check_output_file(path, overwrite)
    state = _weights_to_save(model)
    check_shapes(state, config, "model")
    if "cls.predictions.bias" in state:  # HF's state_dict() lists the decoder tied to these under its own names
        state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"]
        state["cls.predictions.decoder.bias"] = state["cls.predictions.bias"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_output(path) as temporary:
        torch.save(state, temporary)
    return _architecture(state)


def convert_tf_checkpoint(
    tf_prefix: str | os.PathLike,
    bert_config_file: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    vocab_file: str | os.PathLike | None = None,
    overwrite: bool = False,
    safe_serialization: bool = True,
    do_lower_case: bool = True,
    weights_file: str | os.PathLike | None = None,
) -> TFMapping:
    """A Google/NVIDIA TF BERT checkpoint to an HF-format directory (`output_dir`), or to one weights file as HF's
    conversion script writes it (`weights_file`); returns what was converted and skipped."""
    assert (output_dir is None) != (weights_file is None), "one of output_dir and weights_file"
    config = BertConfig.from_json_file(bert_config_file)
    # Every input is checked before a gigabyte checkpoint is read, and before anything is written.
    if weights_file is not None:
        _check_output_file(os.path.abspath(os.fspath(weights_file)), overwrite)
    else:
        check_output_dir(os.fspath(output_dir), overwrite)
    if vocab_file is not None:
        model_tokenizer(vocab_file, do_lower_case, config)
    checkpoint = TFCheckpoint(tf_prefix)
    state, mapping = read_tf_weights(checkpoint, config)
    if weights_file is not None:
        save_hf_weights_file(state, config, weights_file, overwrite)
    else:
        save_hf_directory(
            state,
            config,
            output_dir,
            vocab_file=vocab_file,
            safe_serialization=safe_serialization,
            overwrite=overwrite,
            do_lower_case=do_lower_case,
        )
    return mapping
