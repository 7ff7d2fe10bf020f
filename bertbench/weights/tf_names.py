"""Google's TensorFlow BERT variable names (bert/encoder/layer_0/attention/self/query/kernel, ...) mapped to
HF/bertbench names with their shapes, and a TF checkpoint's weights read into an HF-named state dict."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from bertbench.model.config import BertConfig
from bertbench.weights.tf_checkpoint import TFCheckpoint

logger = logging.getLogger(__name__)


class WeightsError(ValueError):
    """Weights a user supplied do not fit the model or config, or cannot be read or written; names file and key.
    Defined here, the lowest of the weights modules, for weights.hf and the commands to share."""


_TF_LAYER = re.compile(r"bert/encoder/layer_(\d+)/")


def tf_model_variables(config: BertConfig, num_labels: int | None) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{Google TF variable: (HF name, TF shape)} for every weight a BERT with this config and its heads can have."""
    h, v = config.hidden_size, config.vocab_size
    table: dict[str, tuple[str, tuple[int, ...]]] = {}

    def dense(tf_name: str, hf_name: str, n_in: int, n_out: int) -> None:
        table[f"{tf_name}/kernel"] = (f"{hf_name}.weight", (n_in, n_out))
        table[f"{tf_name}/bias"] = (f"{hf_name}.bias", (n_out,))

    def layer_norm(tf_name: str, hf_name: str) -> None:
        table[f"{tf_name}/gamma"] = (f"{hf_name}.weight", (h,))
        table[f"{tf_name}/beta"] = (f"{hf_name}.bias", (h,))

    table["bert/embeddings/word_embeddings"] = ("bert.embeddings.word_embeddings.weight", (v, h))
    table["bert/embeddings/position_embeddings"] = (
        "bert.embeddings.position_embeddings.weight",
        (config.max_position_embeddings, h),
    )
    table["bert/embeddings/token_type_embeddings"] = (
        "bert.embeddings.token_type_embeddings.weight",
        (config.type_vocab_size, h),
    )
    layer_norm("bert/embeddings/LayerNorm", "bert.embeddings.LayerNorm")
    for n in range(config.num_hidden_layers):
        tf_layer, hf_layer = f"bert/encoder/layer_{n}", f"bert.encoder.layer.{n}"
        for part in ("query", "key", "value"):
            dense(f"{tf_layer}/attention/self/{part}", f"{hf_layer}.attention.self.{part}", h, h)
        dense(f"{tf_layer}/attention/output/dense", f"{hf_layer}.attention.output.dense", h, h)
        layer_norm(f"{tf_layer}/attention/output/LayerNorm", f"{hf_layer}.attention.output.LayerNorm")
        dense(f"{tf_layer}/intermediate/dense", f"{hf_layer}.intermediate.dense", h, config.intermediate_size)
        dense(f"{tf_layer}/output/dense", f"{hf_layer}.output.dense", config.intermediate_size, h)
        layer_norm(f"{tf_layer}/output/LayerNorm", f"{hf_layer}.output.LayerNorm")
    dense("bert/pooler/dense", "bert.pooler.dense", h, h)
    dense("cls/predictions/transform/dense", "cls.predictions.transform.dense", h, h)
    layer_norm("cls/predictions/transform/LayerNorm", "cls.predictions.transform.LayerNorm")
    table["cls/predictions/output_bias"] = ("cls.predictions.bias", (v,))
    # Google's heads multiply by output_weights transposed, so these are already [out, in] like a torch Linear.
    table["cls/seq_relationship/output_weights"] = ("cls.seq_relationship.weight", (2, h))
    table["cls/seq_relationship/output_bias"] = ("cls.seq_relationship.bias", (2,))
    table["cls/squad/output_weights"] = ("qa_outputs.weight", (2, h))
    table["cls/squad/output_bias"] = ("qa_outputs.bias", (2,))
    if num_labels is not None:  # run_classifier.py's head sits at the top level, sized by the task's labels
        table["output_weights"] = ("classifier.weight", (num_labels, h))
        table["output_bias"] = ("classifier.bias", (num_labels,))
    return table


@dataclass
class TFMapping:
    """Which TF variables are model weights (and their HF names), and which were skipped: slots, step counters..."""

    names: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

    def summary(self) -> str:
        slots = Counter(name.rsplit("/", 1)[1] for name in self.skipped if name.rsplit("/", 1)[0] in self.names)
        others = [name for name in self.skipped if name.rsplit("/", 1)[0] not in self.names]
        parts = []
        if slots:
            parts.append(
                f"{sum(slots.values())} optimizer slots ("
                + ", ".join(f"{slot}: {count}" for slot, count in sorted(slots.items()))
                + ")"
            )
        if others:
            shown = ", ".join(others[:10]) + (f" and {len(others) - 10} more" if len(others) > 10 else "")
            parts.append(f"{len(others)} other variables ({shown})")
        return (
            (f"{len(self.names)} model weights; skipped " + " and ".join(parts))
            if parts
            else f"{len(self.names)} model weights; nothing skipped"
        )


def map_tf_names(
    shapes: Mapping[str, tuple[int, ...]], config: BertConfig, source: str = "checkpoint", require_encoder: bool = True
) -> TFMapping:
    """Sorts TF variables into model weights (shape-checked against `config`) and everything else (skipped).

    Every encoder weight the config implies must be present (`require_encoder=False`: the caller checks what is
    missing, weights.pretrained.load_pretrained); heads are optional. Errors name `source` and the variable.
    """
    num_labels = next(
        (shapes[name][0] for name in ("output_weights", "output_bias") if name in shapes and len(shapes[name]) >= 1),
        None,
    )
    table = tf_model_variables(config, num_labels)
    mapping = TFMapping()
    for name in sorted(shapes):
        shape = tuple(shapes[name])
        if name in table:
            hf_name, expected = table[name]
            if shape != expected:
                raise WeightsError(
                    f"{source}: variable {name} has shape {list(shape)}, the config implies {list(expected)}"
                )
            mapping.names[name] = hf_name
            continue
        layer = _TF_LAYER.match(name)
        if layer and int(layer.group(1)) >= config.num_hidden_layers:
            raise WeightsError(
                f"{source}: variable {name} is beyond the config's num_hidden_layers={config.num_hidden_layers}"
            )
        mapping.skipped.append(name)
    missing = [name for name in table if name.startswith("bert/") and name not in mapping.names]
    if missing and require_encoder:
        raise WeightsError(
            f"{source}: missing variable {missing[0]}"
            + (f" (and {len(missing) - 1} more encoder variables)" if len(missing) > 1 else "")
        )
    return mapping


def _tf_state_dict(mapping: TFMapping, read: Callable[[str], np.ndarray]) -> dict[str, torch.Tensor]:
    logger.info("TensorFlow checkpoint: %s", mapping.summary())
    state = {}
    for tf_name, hf_name in mapping.names.items():
        value = read(tf_name)
        if tf_name.endswith("/kernel"):  # TF dense kernels are [in, out]; torch Linear weights are [out, in]
            value = value.T
        state[hf_name] = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
    return state


def tf_to_hf_state_dict(tf_vars: Mapping[str, np.ndarray], config: BertConfig) -> dict[str, torch.Tensor]:
    """Google-named TF variables to an HF BertForPreTraining/-SequenceClassification/-QuestionAnswering state dict.

    Non-model variables (optimizer slots, global_step, loss scaling) are skipped and logged in a summary; use
    `map_tf_names` to get the list.
    """
    mapping = map_tf_names({name: value.shape for name, value in tf_vars.items()}, config)
    return _tf_state_dict(mapping, tf_vars.__getitem__)


def read_tf_weights(
    checkpoint: TFCheckpoint, config: BertConfig, require_encoder: bool = True
) -> tuple[dict[str, torch.Tensor], TFMapping]:
    """The model weights of a TF checkpoint as an HF state dict, reading only those tensors (not the slots)."""
    shapes = {name: shape for name, (_, shape) in checkpoint.variables.items()}
    mapping = map_tf_names(shapes, config, source=checkpoint.index_path, require_encoder=require_encoder)
    return _tf_state_dict(mapping, checkpoint.read), mapping
