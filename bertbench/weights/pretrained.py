"""Warm-start weights from every checkpoint a BERT user holds, loaded into a model or refused before anything is
written.

`find_weights` recognises what a path holds, from its name and directory alone:
- Google's TF1 checkpoints: a prefix (bert_model.ckpt), its .index or a data shard, or a directory with a
  `checkpoint` file or one *.index (tf_checkpoint.resolve_prefix);
- HF: a directory (config.json beside model.safetensors, pytorch_model.bin or a sharded index of them), or one such
  file, or a sharded index;
- any other torch.save file: NVIDIA DeepLearningExamples' checkpoints (`{'model': state_dict, 'optimizer': ...,
  'master params': ..., 'files': ..., 'epoch': ..., 'data_loader': ...}`), plain state dicts, those saved from a DDP
  (`module.`) or torch.compile (`_orig_mod.`) wrapper;
- bertbench runs: a run directory (its newest checkpoint that verifies) or a ckpt-*.pt file (verified).

`read_weights` reads the weights under HF's names (NVIDIA's `dense_act` is HF's `dense`; old `gamma`/`beta` are
`weight`/`bias`); Python objects pickled beside the tensors (NVIDIA's data loader) become inert stand-ins, never run.
`load_pretrained` matches them to a model: a checkpoint with no encoder weight is refused, naming the file, what was
found in it and what is expected; encoder weights missing in part (or of layers the model lacks) are refused unless
the caller allows it; a task head the checkpoint lacks is normal (fine-tuning from pre-training weights). Its
LoadReport says what was loaded in counts, and names weights only where they say something.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import pickle
import re
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from bertbench.common import run_files
from bertbench.common.durable import read_json
from bertbench.model.config import BertConfig
from bertbench.training.checkpoint import (
    TRAINING_CHECKPOINT_FORMAT,
    CheckpointError,
    checkpoint_step,
    list_checkpoints,
    newest_intact_checkpoint,
    stray_files,
    verify_checkpoint,
)
from bertbench.weights.hf import HF_WEIGHT_FILES, check_shapes, is_hf_directory
from bertbench.weights.tf_checkpoint import TFCheckpoint
from bertbench.weights.tf_names import WeightsError, read_tf_weights, tf_model_variables

logger = logging.getLogger(__name__)

# What each format is called in messages and load reports.
TF1, HF_DIRECTORY, HF_FILE, HF_SHARDED, TORCH_FILE, BERTBENCH_RUN, BERTBENCH_CHECKPOINT = (
    "Google's TF1 checkpoint",
    "HF directory",
    "HF weights file",
    "sharded HF weights",
    "torch.save file",
    "bertbench run",
    "bertbench checkpoint",
)
EXPECTED = (
    "BERT's weights: a TF1 checkpoint (bert_model.ckpt), an HF directory or weights file, a torch state dict "
    "(NVIDIA's checkpoints too) or a bertbench run or ckpt-*.pt"
)
# Entries under which a torch.save file keeps a model's state dict: NVIDIA's and bertbench's checkpoints ("model"),
# PyTorch Lightning's ("state_dict"), the PyTorch tutorials' ("model_state_dict").
STATE_ENTRIES = ("model", "state_dict", "model_state_dict")
# Name parts of wrappers around a model: DistributedDataParallel's module., torch.compile's _orig_mod.
WRAPPER_PARTS = {"module": "a DDP wrapper (module.)", "_orig_mod": "torch.compile (_orig_mod.)"}
NVIDIA_CHECKPOINT_NAME = re.compile(r"^ckpt_(\d+)\.pt$")  # run_pretraining.py's, named by its step
GOOGLE_CHECKPOINT_NAME = re.compile(r"^model\.ckpt-(\d+)(\.index|\.data-\d{5}-of-\d{5}|\.meta)?$")


@dataclass(frozen=True)
class WeightsSource:
    """What a path holds: its `kind` (TF1, HF_DIRECTORY, ...) and the `file` to read (the TF prefix, the weights file,
    the run's newest intact checkpoint); `notes` say what was passed over finding it (a damaged checkpoint)."""

    path: str
    kind: str
    file: str
    notes: tuple[str, ...] = ()


def find_weights(path: str | os.PathLike) -> WeightsSource:
    """What `path` holds (see the module's doc), or a WeightsError/CheckpointError naming it and what is wrong."""
    path = os.fspath(path)
    if not os.path.exists(path):
        if os.path.isfile(path + ".index"):
            return WeightsSource(path, TF1, path)
        raise WeightsError(_missing(path))
    if os.path.isdir(path):
        return _find_in_directory(path)
    name = os.path.basename(path)
    if name.endswith(".index") or re.search(r"\.data-\d{5}-of-\d{5}$", name):
        return WeightsSource(path, TF1, path)
    if name.endswith(".meta") and os.path.isfile(path.removesuffix(".meta") + ".index"):  # TF1's graph, beside it
        return WeightsSource(path, TF1, path.removesuffix(".meta"))
    if name.endswith(".index.json"):
        return WeightsSource(path, HF_SHARDED, path)
    if name.endswith(".safetensors"):
        return WeightsSource(path, HF_FILE, path)
    if run_files.CHECKPOINT_NAME.match(name):
        verify_checkpoint(path)  # a damaged checkpoint is named as such, not read as garbage
        return WeightsSource(path, BERTBENCH_CHECKPOINT, path)
    return WeightsSource(path, HF_FILE if name == "pytorch_model.bin" else TORCH_FILE, path)


def _find_in_directory(path: str) -> WeightsSource:
    weights = next(
        (os.path.join(path, name) for name in HF_WEIGHT_FILES if os.path.isfile(os.path.join(path, name))), None
    )
    if weights is not None and is_hf_directory(path):
        BertConfig.from_json_file(path)  # an HF directory of another model (model_type roberta, ...) is refused
        return WeightsSource(path, HF_DIRECTORY, weights)
    if weights is not None:  # HF's weights without their config.json: the command's config sizes them
        return WeightsSource(path, HF_SHARDED if weights.endswith(".index.json") else HF_FILE, weights)
    if os.path.isfile(os.path.join(path, "checkpoint")) or glob.glob(os.path.join(glob.escape(path), "*.index")):
        return WeightsSource(path, TF1, path)
    strays = stray_files(path)
    if list_checkpoints(path) or strays or os.path.isfile(os.path.join(path, run_files.RUN_RECORD)):
        notes: list[str] = []
        newest = newest_intact_checkpoint(path, notes.append)  # every one damaged: a CheckpointError naming them
        if newest is None:
            found = "; ".join(f"{os.path.basename(stray)} is {why}" for stray, why in strays)
            raise CheckpointError(
                f"{path}: a bertbench run with no checkpoint ({run_files.CHECKPOINT_GLOB}) to start from"
                + (f" ({found})" if found else "")
            )
        return WeightsSource(path, BERTBENCH_RUN, newest, tuple(notes))
    if os.path.isfile(os.path.join(path, "config.json")):
        raise WeightsError(f"{path}: an HF directory without weights (no {', '.join(HF_WEIGHT_FILES)})")
    held = sorted(os.listdir(path))
    listing = ", ".join(held[:8]) + (f" and {len(held) - 8} more" if len(held) > 8 else "") if held else "nothing"
    raise WeightsError(f"{path}: a directory with no BERT weights (it holds {listing}); expected {EXPECTED}")


def _missing(path: str) -> str:
    """The error for a path that is not there, pointing a Google-style name in a bertbench run at what works."""
    directory, name = os.path.split(os.path.abspath(path))
    message = f"{path}: no such file or directory"
    google = GOOGLE_CHECKPOINT_NAME.match(name)
    if google and (list_checkpoints(directory) or os.path.isfile(os.path.join(directory, run_files.RUN_RECORD))):
        shown = os.path.dirname(path) or "."
        same_step = os.path.join(shown, run_files.checkpoint_name(int(google.group(1))))
        message += (
            f"; {shown} is a bertbench run, which keeps its checkpoints as {run_files.CHECKPOINT_GLOB}, not "
            f"Google's model.ckpt-<step>: give the run directory {shown} (its newest checkpoint)"
            + (f" or {same_step}" if os.path.isfile(same_step) else "")
        )
    elif not os.path.exists(os.path.dirname(os.path.abspath(path))):
        message = f"{path}: no such file or directory ({os.path.dirname(path)} does not exist)"
    return message


@dataclass
class Weights:
    """A checkpoint's weights under HF's names, and how they were read (for the load report)."""

    source: WeightsSource
    state: dict[str, torch.Tensor]
    described: str  # the format, e.g. "NVIDIA's checkpoint: its 'model' entry; not read: epoch, ..."
    renamed: list[str] = field(default_factory=list)  # how names were read: "a DDP wrapper (module.)", ...


def read_weights(source: WeightsSource, config: BertConfig | None = None, whole_encoder: bool = True) -> Weights:
    """The weights `source` holds, under HF's names (see the module's doc). A TF checkpoint needs `config` (or a
    bert_config.json beside it) for its shapes; HF-format weights are checked against `config` when given, and
    (`whole_encoder`) must hold every encoder weight it implies: a checkpoint missing some is refused, as
    load_pretrained refuses it unless allowed (it passes whole_encoder=False and checks against the model)."""
    if source.kind == TF1:
        checkpoint = TFCheckpoint(source.file)
        if config is None:
            config_file = os.path.join(os.path.dirname(checkpoint.prefix), "bert_config.json")
            if not os.path.isfile(config_file):
                raise WeightsError(
                    f"{checkpoint.index_path}: a TensorFlow checkpoint needs a config for its "
                    "shapes, and there is no bert_config.json beside it"
                )
            config = BertConfig.from_json_file(config_file)
        state, mapping = read_tf_weights(checkpoint, config, require_encoder=whole_encoder)
        return Weights(source, state, f"{TF1}, {mapping.summary()}" if mapping.skipped else TF1)
    if source.kind == HF_SHARDED or source.file.endswith(".index.json"):
        state, described = _read_sharded(source.file), source.kind
    elif source.file.endswith(".safetensors"):
        state, described = _read_safetensors(source.file), source.kind
    else:
        state, described = _state_dict_of(read_torch_file(source.file), source)
    weights = Weights(source, state, described)
    _normalise_names(weights)
    if config is not None:
        check_shapes(weights.state, config, source.file)
    if config is not None and whole_encoder:
        expected = [name for name, _ in tf_model_variables(config, None).values() if _is_encoder(name)]
        held = {name if name.startswith(("bert.", "cls.")) else f"bert.{name}" for name in weights.state}
        missing = [name for name in expected if name not in held]
        if len(missing) == len(expected):
            raise _no_encoder(weights)
        if missing:
            raise WeightsError(
                f"{source.file}: {len(missing)} of the model's {len(expected)} encoder weights are not in it "
                f"({_groups(missing)})"
            )
    return weights


def _read_safetensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as error:  # safetensors raises its own and OS errors; the user needs the file and the reason
        raise WeightsError(f"{path}: cannot read weights ({_first_sentence(error)})") from None


def _read_sharded(index_path: str) -> dict[str, torch.Tensor]:
    index = read_json(index_path, WeightsError)
    try:
        shards = sorted(set(index["weight_map"].values()))
    except (KeyError, TypeError, AttributeError):
        raise WeightsError(f"{index_path}: not a sharded-weights index (no 'weight_map')") from None
    state = {}
    for shard in shards:
        path = os.path.join(os.path.dirname(index_path), shard)
        if not os.path.isfile(path):
            raise WeightsError(f"{index_path}: its shard {shard} is not there")
        state.update(
            _read_safetensors(path) if shard.endswith(".safetensors") else _state_dict_of(read_torch_file(path))[0]
        )
    return state


def read_torch_file(path: str) -> Any:
    """A torch.save file's contents, read by torch's safe (weights_only) unpickler; a file that pickles Python objects
    beside its tensors (NVIDIA's checkpoints keep their data loader) is read again with each such object an inert
    stand-in of the same name (_InertUnpickler): the file's code never runs."""
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as refusal:  # the safe loader's refusal of a global it does not allow
            if "Weights only load failed" not in str(refusal):
                raise
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_INERT_PICKLE)
    except Exception as error:  # torch raises many types for files it cannot read; the user needs file and reason
        raise WeightsError(f"{path}: cannot read weights (not a torch.save file? {_first_sentence(error)})") from None


class _InertUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals torch's safe loader allows (tensors, storages, dtypes, a few
    containers) and gives every other one (a class, a function such as os.system) as a stand-in that is built from
    its arguments and state and kept as data: nothing the file names is ever called."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _safe_globals().get(f"{module}.{name}")
        return allowed if allowed is not None else _stand_in(f"{module}.{name}")


@functools.cache
def _safe_globals() -> dict[str, Any]:
    from torch._weights_only_unpickler import _get_allowed_globals  # torch's own list of what is safe to load

    return _get_allowed_globals()


# What torch.load takes as its pickle_module: a module with Unpickler and load.
_INERT_PICKLE = types.ModuleType("bertbench_inert_pickle")
_INERT_PICKLE.Unpickler = _InertUnpickler
_INERT_PICKLE.load = lambda file, **kwargs: _InertUnpickler(file, **kwargs).load()


@functools.cache
def _stand_in(qualified_name: str) -> type:
    """A class whose instances stand for objects of `qualified_name` in a pickle: built from any arguments and
    state, kept as data, never the real thing."""
    module, _, name = qualified_name.rpartition(".")

    def init(self, *args, **kwargs):
        self.arguments = args

    def set_state(self, state):
        self.state = state

    return type(
        name,
        (),
        {
            "__module__": module,
            "__qualname__": name,
            "__init__": init,
            "__setstate__": set_state,
            "__repr__": lambda self: f"<{qualified_name}, not loaded>",
        },
    )


def _state_dict_of(value: Any, source: WeightsSource | None = None) -> tuple[dict[str, torch.Tensor], str]:
    """The state dict a torch.save file holds and how it is held: the file itself, or one of STATE_ENTRIES."""
    kind = source.kind if source is not None else TORCH_FILE
    if _is_state_dict(value):
        return dict(value), kind
    if isinstance(value, Mapping):
        if value.get("format") == TRAINING_CHECKPOINT_FORMAT:
            newest = f": its newest checkpoint {os.path.basename(source.file)}" if kind == BERTBENCH_RUN else ""
            return dict(value["model"]), f"{BERTBENCH_CHECKPOINT if kind != BERTBENCH_RUN else kind}{newest}"
        for entry in STATE_ENTRIES:
            if _is_state_dict(value.get(entry)):
                others = sorted(str(key) for key in value if key != entry)
                nvidia = "master params" in value or any(".dense_act." in str(name) for name in value[entry])
                described = "NVIDIA's checkpoint" if nvidia else kind
                return dict(value[entry]), (
                    f"{described}: its {entry!r} entry" + (f"; not read: {', '.join(others)}" if others else "")
                )
    raise WeightsError(
        f"{source.file if source else 'file'}: no BERT weights in it ({_contents(value)}); expected {EXPECTED}"
    )


def nvidia_checkpoint(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """HF-named weights as NVIDIA DeepLearningExamples' run_pretraining.py saves them in ckpt_<step>.pt (what
    read_weights reads back): under 'model', NVIDIA's names for the linear layers it fuses with their activation
    (dense_act), the decoder beside the word embeddings it is tied to; beside them the training state it keeps (the
    last shard files read, the epoch, the data loader: none here)."""
    model = {
        re.sub(r"(intermediate|pooler|transform)\.dense\.", r"\1.dense_act.", name): t for name, t in state.items()
    }
    if "cls.predictions.bias" in model:
        model["cls.predictions.decoder.weight"] = model["bert.embeddings.word_embeddings.weight"]
    return {
        "model": model,
        "optimizer": {"state": {}, "param_groups": []},
        "files": [0],
        "epoch": 0,
        "data_loader": None,
    }


def _is_state_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())


def _contents(value: Any) -> str:
    """What a torch.save file holds, in a few words: a dict's keys, or the type."""
    if isinstance(value, Mapping):
        keys = sorted(map(str, value))
        return (
            f"a dict of {', '.join(keys[:8])}" + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
            if keys
            else "an empty dict"
        )
    return f"a {type(value).__name__}"


def _normalise_names(weights: Weights) -> None:
    """HF's names for the weights: wrapper parts dropped, NVIDIA's dense_act and old gamma/beta renamed."""
    renamed, state = set(), {}
    for name, tensor in weights.state.items():
        parts = str(name).split(".")
        while parts[0] == "module" and len(parts) > 1:  # DDP wraps the whole model: a prefix, maybe twice
            renamed.add(WRAPPER_PARTS["module"])
            parts = parts[1:]
        if "_orig_mod" in parts[:-1]:  # torch.compile wraps the model or any of its modules
            renamed.add(WRAPPER_PARTS["_orig_mod"])
            parts = [kept for kept in parts[:-1] if kept != "_orig_mod"] + parts[-1:]
        if "dense_act" in parts[:-1]:
            renamed.add("NVIDIA's dense_act names (HF's dense)")
            parts = ["dense" if kept == "dense_act" else kept for kept in parts]
        if parts[-2:-1] == ["LayerNorm"] and parts[-1] in ("gamma", "beta"):
            renamed.add("LayerNorm gamma/beta (weight/bias)")
            parts[-1] = "weight" if parts[-1] == "gamma" else "bias"
        state[".".join(parts)] = tensor
    weights.state, weights.renamed = state, sorted(renamed)


def _first_sentence(error: BaseException) -> str:
    """What went wrong, without the advice torch's and safetensors' errors go on with."""
    text = " ".join(str(error).split())
    return text.split(". ")[0].rstrip(".") if text else type(error).__name__


# ---- into a model --------------------------------------------------------------------------------------------------


def _is_encoder(name: str) -> bool:
    """Whether a model weight is the encoder's (embeddings and layers), in a task model (bert.) or a bare BertModel."""
    return name.removeprefix("bert.").startswith(("embeddings.", "encoder."))


def _group(name: str) -> str:
    """The part of the model a weight belongs to, for the report: bert.encoder.layer.3, bert.pooler, classifier."""
    parts = name.split(".")
    depth = 4 if name.startswith("bert.encoder.layer.") else 2 if parts[0] in ("bert", "cls") else 1
    return ".".join(parts[:depth])


def _groups(names: list[str]) -> str:
    groups = list(dict.fromkeys(_group(name) for name in names))
    return ", ".join(groups[:6]) + (f" and {len(groups) - 6} more" if len(groups) > 6 else "")


@dataclass
class LoadReport:
    """What `load_pretrained` did: how many of the model's encoder weights it loaded, which of the model's weights
    start from random values (`new`: heads, the pooler; `missing`: encoder weights, only where allowed) and which of
    the checkpoint's weights the model has no place for (`unused`)."""

    source: str
    described: str
    loaded: list[str]
    encoder: int
    new: list[str]
    missing: list[str]
    unused: list[str]
    renamed: list[str] = field(default_factory=list)
    step: int | None = None  # the training step the weights were saved at, when they say it (warm_start_step)

    def __str__(self) -> str:
        beside = [name for name in self.loaded if not _is_encoder(name)]  # the pooler, heads
        parts = [
            f"loaded {self.encoder - len(self.missing)} of {self.encoder} encoder weights"
            + (f" and {_groups(beside)} ({len(beside)} weights)" if beside else "")
        ]
        if self.missing:
            parts.append(f"MISSING, from random values: {_groups(self.missing)} ({len(self.missing)} weights)")
        if self.new:
            parts.append(f"new, from random values: {_groups(self.new)} ({len(self.new)} weights)")
        if self.unused:
            parts.append(f"not used: {_groups(self.unused)} ({len(self.unused)} weights)")
        if self.renamed:
            parts.append(f"names read as {', '.join(self.renamed)}")
        return f"warm start from {self.source} ({self.described}): " + "; ".join(parts)


def load_pretrained(
    model: torch.nn.Module,
    path: str | os.PathLike | Weights,
    config: BertConfig | None = None,
    allow_partial: bool = False,
    log: Callable[[str], None] | None = None,
) -> LoadReport:
    """Load the weights at `path` (anything find_weights recognises, or Weights already read) into `model`, fitting
    the `bert.` prefix (see the module's doc for what is refused). Every shape and name is checked before a weight
    is copied, so a refused checkpoint leaves the model as it was."""
    weights = path if isinstance(path, Weights) else read_weights(find_weights(path), config, whole_encoder=False)
    source = weights.source
    for note in source.notes:
        (log or logger.warning)(note)
    targets = model.state_dict(keep_vars=True)
    matched, unused = {}, []
    for name, value in weights.state.items():
        target = next(
            (candidate for candidate in (name, f"bert.{name}", name.removeprefix("bert.")) if candidate in targets),
            None,
        )
        if target is None:
            unused.append(name)
        elif targets[target].shape != value.shape:
            raise WeightsError(
                f"{source.file}: {name} has shape {list(value.shape)}, the model expects {list(targets[target].shape)}"
            )
        else:
            matched[target] = value
    aliases = _alias_groups(model)
    loaded = set(matched)
    not_loaded = [name for name in targets if not loaded.intersection(aliases.get(name, [name]))]
    encoder = [name for name in targets if _is_encoder(name)]
    missing = [name for name in not_loaded if _is_encoder(name)]
    foreign_layers = [name for name in unused if _is_encoder(name)]
    if len(missing) == len(encoder):
        raise _no_encoder(weights)
    if (missing or foreign_layers) and not allow_partial:
        problems = []
        if missing:
            problems.append(
                f"{len(missing)} of the model's {len(encoder)} encoder weights are not in it ({_groups(missing)})"
            )
        if foreign_layers:
            problems.append(f"it holds encoder weights the model has no place for ({_groups(foreign_layers)})")
        raise WeightsError(
            f"{source.file}: " + "; ".join(problems) + ": is it this model's checkpoint (--bert_config_file)? "
            "Give --allow_partial_init_checkpoint to start the missing ones from random values"
        )
    # Copy only once every shape has been checked, so a bad file leaves the model as it was.
    with torch.no_grad():
        for target, value in matched.items():
            targets[target].copy_(value)
    report = LoadReport(
        source=os.fspath(source.path),
        described=weights.described,
        loaded=list(matched),
        encoder=len(encoder),
        new=[name for name in not_loaded if name not in missing],
        missing=missing,
        unused=sorted(unused),
        renamed=weights.renamed,
        step=warm_start_step(source),
    )
    logger.info("%s", report)
    return report


def _no_encoder(weights: Weights) -> WeightsError:
    names = sorted(weights.state)
    found = f"{len(names)} tensors such as {', '.join(names[:4])}" if names else "no tensors"
    return WeightsError(
        f"{weights.source.file}: no BERT encoder weight in it ({found}); expected {EXPECTED}, named as Google's "
        "(bert/encoder/layer_0/...), HF's or NVIDIA's (bert.encoder.layer.0...)"
    )


def _alias_groups(model: torch.nn.Module) -> dict[str, list[str]]:
    """{name: all names of that parameter} for parameters registered under several names (tied weights)."""
    by_id: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(parameter), []).append(name)
    return {name: names for names in by_id.values() for name in names}


def load_state_dict(path: str | os.PathLike, config: BertConfig | None = None) -> dict[str, torch.Tensor]:
    """The HF-named weights at `path` (anything find_weights recognises)."""
    return read_weights(find_weights(path), config).state


def warm_start_step(source: WeightsSource) -> int | None:
    """The training step warm-start weights were saved at, when they say it: a bertbench checkpoint's, a TF1
    checkpoint's global_step (a fine-tuned model.ckpt-1000), the step in NVIDIA's ckpt_<step>.pt; None for the
    others."""
    if source.kind in (BERTBENCH_RUN, BERTBENCH_CHECKPOINT):
        return checkpoint_step(source.file)
    nvidia = NVIDIA_CHECKPOINT_NAME.match(os.path.basename(source.file))
    if source.kind == TORCH_FILE and nvidia:
        return int(nvidia.group(1))
    if source.kind == TF1:
        checkpoint = TFCheckpoint(source.file)
        if "global_step" in checkpoint.entries:
            return int(checkpoint.read("global_step"))
    return None
