"""BertConfig: the model hyper-parameters, read from Google's bert_config.json, an HF config.json or the model config
a bertbench run records (bertbench_run.json)."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from bertbench.common.durable import read_json


class ConfigError(ValueError):
    """A configuration file or value a user supplied is unusable; the message names the file and key."""


# The label value a loss skips (padding of masked-LM labels): the models' convention, which the data readers
# follow; here, so that a reader need not import the model code (and torch) for it.
IGNORE_INDEX = -100
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu", "silu", "swish", "tanh")

# Keys HF writes into config.json that do not change the encoder maths bertbench implements (or that it checks
# separately below). They are accepted and ignored so that any HF BERT directory loads.
_HF_IGNORED_KEYS = frozenset(
    {
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "use_cache",
        "classifier_dropout",
        "gradient_checkpointing",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "finetuning_task",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "tie_word_embeddings",
        "torchscript",
        "_name_or_path",
        "_attn_implementation_autoset",
        "attn_implementation",
        "chunk_size_feed_forward",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "pruned_heads",
        "is_encoder_decoder",
        "cross_attention_hidden_size",
        "tf_legacy_loss",
        "use_bfloat16",
        "add_pooling_layer",
    }
)
# Google's multilingual bert_config.json carries pooler_* keys that its own modeling.py never reads.
_GOOGLE_IGNORED_KEYS = frozenset(
    {
        "directionality",
        "pooler_fc_size",
        "pooler_num_attention_heads",
        "pooler_num_fc_layers",
        "pooler_size_per_head",
        "pooler_type",
    }
)
# HF keys whose non-default value would mean a different model than BERT; value given is the only one supported.
_HF_REQUIRED_VALUES = {"position_embedding_type": "absolute", "is_decoder": False, "add_cross_attention": False}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder; field names are Google's bert_config.json keys."""

    vocab_size: int = field(metadata={"help": "Number of WordPiece tokens in vocab.txt."})
    hidden_size: int = field(default=768, metadata={"help": "Width of the encoder (H)."})
    num_hidden_layers: int = field(default=12, metadata={"help": "Number of transformer blocks (L)."})
    num_attention_heads: int = field(default=12, metadata={"help": "Attention heads per block (A); divides H."})
    intermediate_size: int = field(default=3072, metadata={"help": "Width of the feed-forward layer (usually 4H)."})
    hidden_act: str = field(
        default="gelu",
        metadata={
            "help": f"Feed-forward activation, one of {ACTIVATIONS}; 'gelu' is the exact erf form Google BERT uses."
        },
    )
    hidden_dropout_prob: float = field(default=0.1, metadata={"help": "Dropout after embeddings and each sub-layer."})
    attention_probs_dropout_prob: float = field(default=0.1, metadata={"help": "Dropout on attention probabilities."})
    max_position_embeddings: int = field(default=512, metadata={"help": "Longest sequence the model can take."})
    type_vocab_size: int = field(default=2, metadata={"help": "Number of segment (token type) ids."})
    initializer_range: float = field(default=0.02, metadata={"help": "Std of the truncated normal weight init."})
    layer_norm_eps: float = field(default=1e-12, metadata={"help": "LayerNorm epsilon (Google BERT: 1e-12)."})

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "type_vocab_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name}: expected a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"hidden_size: {self.hidden_size} is not a multiple of num_attention_heads={self.num_attention_heads}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act: {self.hidden_act!r} is not one of {', '.join(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise ConfigError(f"{name}: expected a probability in [0, 1), got {value!r}")
        for name in ("initializer_range", "layer_norm_eps"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 < value < float("inf"):
                raise ConfigError(f"{name}: expected a positive number, got {value!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def encoder_parameter_count(self) -> int:
        """Parameters of the encoder and pooler (embeddings, layers, pooler), counted from the config: what every
        task model holds before its head."""
        return sum(count for count, _ in self.parameter_parts().values())

    def parameter_parts(self) -> dict[str, tuple[int, str]]:
        """encoder_parameter_count by part (embeddings, layers, pooler): each one's parameters, and the keys that
        make it that size (what an error says of a model too large)."""
        h, ffn = self.hidden_size, self.intermediate_size
        rows = max(("vocab_size", "max_position_embeddings", "type_vocab_size"), key=lambda key: getattr(self, key))
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        # Q, K, V and output projections; the feed-forward pair; two LayerNorms.
        layer = 4 * (h * h + h) + (h * ffn + ffn) + (ffn * h + h) + 2 * 2 * h
        return {
            "embeddings": (embeddings, f"{rows}={getattr(self, rows)} x hidden_size={h}"),
            "layers": (
                self.num_hidden_layers * layer,
                f"num_hidden_layers={self.num_hidden_layers} x (4 x "
                f"hidden_size={h} squared + 2 x hidden_size x "
                f"intermediate_size={ffn})",
            ),
            "pooler": (h * h + h, f"hidden_size={h} squared"),
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> BertConfig:
        """Build from Google or HF keys; an unknown key, a missing required key or a bad value names itself."""
        fields = {f.name for f in dataclasses.fields(cls)}
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        # Google's configs carry every key; require them all there so a truncated file is caught, not defaulted.
        google_keys = fields - {"layer_norm_eps"}
        is_hf = "model_type" in values or "architectures" in values or "layer_norm_eps" in values
        needed = required if is_hf else google_keys
        missing = sorted(needed - values.keys())
        if missing:
            raise ConfigError(f"{source}: missing key {missing[0]!r}")
        if is_hf and values.get("model_type", "bert") != "bert":
            raise ConfigError(f"{source}: key 'model_type' is {values['model_type']!r}, expected 'bert'")
        kwargs = {}
        for key, value in values.items():
            if key in fields:
                kwargs[key] = value
            elif key in _HF_REQUIRED_VALUES:
                if value != _HF_REQUIRED_VALUES[key]:
                    raise ConfigError(
                        f"{source}: key {key!r} = {value!r} is not supported (only {_HF_REQUIRED_VALUES[key]!r})"
                    )
            elif key not in _HF_IGNORED_KEYS and key not in _GOOGLE_IGNORED_KEYS:
                raise ConfigError(f"{source}: unknown key {key!r}")
        try:
            return cls(**kwargs)
        except ConfigError as error:
            raise ConfigError(f"{source}: {error}") from None

    @classmethod
    def from_json_file(cls, path: str | os.PathLike) -> BertConfig:
        """Read a Google bert_config.json, an HF config.json (a directory means its config.json) or a bertbench run
        record's model config (what a run directory as --init_checkpoint supplies as --bert_config_file)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            values = read_json(path, ConfigError)
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such file") from None
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a JSON object of config keys")
        if isinstance(values.get("bert_config"), dict) and "runner" in values:  # a run record (runners.run_directory)
            return cls.from_dict(values["bert_config"], source=f"{path}: bert_config")
        return cls.from_dict(values, source=path)

    def to_google_dict(self) -> dict[str, Any]:
        """The keys of Google's bert_config.json."""
        values = dataclasses.asdict(self)
        values.pop("layer_norm_eps")
        return values

    def to_hf_dict(self, architectures: list[str] | None = None) -> dict[str, Any]:
        """An HF config.json that transformers' BertConfig reads back to the same model."""
        values = dataclasses.asdict(self)
        values.update({"model_type": "bert", "position_embedding_type": "absolute", "pad_token_id": 0})
        if architectures:
            values["architectures"] = architectures
        return values

    def to_json_file(self, path: str | os.PathLike, hf: bool = True) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.to_hf_dict() if hf else self.to_google_dict(), handle, indent=2, sort_keys=True)
            handle.write("\n")
