import json
import os
import socket

import pytest
import torch

from bertbench.config import BertConfig
from bertbench.demo.data import write_vocab

# bert_config.json of the runners' tests: Google's format, 2 layers of hidden 32, the built-in task's vocab.
TINY_BERT = {"vocab_size": 48, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "intermediate_size": 64, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
             "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 64, "type_vocab_size": 2,
             "initializer_range": 0.02}


def tiny_config(**overrides) -> BertConfig:
    """The tests' debug model: 2 layers, hidden 64."""
    values = dict(vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  max_position_embeddings=64, type_vocab_size=2)
    values.update(overrides)
    return BertConfig(**values)


def tiny_batch(config: BertConfig, batch: int = 3, seq: int = 24, seed: int = 0):
    """Random ids with segment ids and right padding of different lengths."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, config.vocab_size, (batch, seq), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2:] = 1
    attention_mask = torch.ones_like(input_ids)
    for row in range(batch):
        attention_mask[row, seq - 3 * row:] = 0
    return input_ids, token_type_ids, attention_mask


@pytest.fixture
def config() -> BertConfig:
    return tiny_config()


@pytest.fixture
def error_line(capsys):
    """Reads the single stderr line a failed command printed (and fails if it printed more or none)."""
    def read() -> str:
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]
    return read


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def free_port() -> int:
    """A TCP port nothing listens on now, for a rendezvous or a daemon a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write_bert_dir(directory, **config_overrides):
    """directory/ with the built-in task's vocab.txt and TINY_BERT (with the overrides) as bert_config.json."""
    os.makedirs(directory, exist_ok=True)
    write_vocab(directory)
    with open(os.path.join(directory, "bert_config.json"), "w") as handle:
        json.dump({**TINY_BERT, **config_overrides}, handle)
    return directory
