import json
import os
import socket
from pathlib import Path

import pytest
import torch

from bertbench.model.config import BertConfig
from bertbench.runners.run_lock import LOCK_NAME
from bertbench.tasks.synthetic import write_vocab

# The tests' models are tiny and the machine they run on may have 2 cores, shared with the processes a test starts:
# a second intra-op thread then costs far more than it gives (OpenMP threads spin waiting for each other; a run of
# test_run_squad took 4x the CPU time with 2). One thread here and, through the environment, in every process a test
# starts, unless OMP_NUM_THREADS says otherwise (a bench's --threads still sets its own).
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

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
    # Slow tests first: the workers of `pytest -n` then take them in turn and finish together, instead of one worker
    # meeting a 20-second test at the end. The sort is stable, so the rest keep their order.
    items.sort(key=lambda item: "slow" not in item.keywords)
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


def snapshot(directory) -> dict[str, bytes | None] | None:
    """Every file's bytes under `directory` by relative path (the lock file's by None: whether it is there counts,
    not its note of the last holder); None when there is no such directory: what a refused command must leave as it
    was."""
    directory = Path(directory)
    if not directory.exists():
        return None
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = Path(root) / name
            files[str(path.relative_to(directory))] = None if name == LOCK_NAME else path.read_bytes()
    return files


def write_bert_dir(directory, **config_overrides):
    """directory/ with the built-in task's vocab.txt and TINY_BERT (with the overrides) as bert_config.json."""
    os.makedirs(directory, exist_ok=True)
    write_vocab(directory)
    with open(os.path.join(directory, "bert_config.json"), "w") as handle:
        json.dump({**TINY_BERT, **config_overrides}, handle)
    return directory


def write_nvidia_shard(path, count=32, seq=32, predictions=5, vocab_size=48, seed=0, varlength=False,
                       lengths=None, masked_id=None):
    """A shard as NVIDIA's create_pretraining_data.py writes it (datasets, dtypes, gzip; positions and ids padded
    with 0), or as MLPerf's convert_fixed2variable.py does (varlength: unpadded int16/int8 rows, no input_mask).
    Random ids with [CLS]=2 and [SEP]=3 of the built-in vocab; `lengths` fixes each sequence's length;
    `masked_id` makes every masked token that id (a pattern a model learns in a few steps)."""
    import h5py
    import numpy as np

    rng = np.random.default_rng(seed)
    lengths = rng.integers(predictions + 4, seq + 1, count) if lengths is None else np.asarray(lengths)
    input_ids = np.zeros((count, seq), np.int32)
    input_mask = np.zeros((count, seq), np.int8)
    segment_ids = np.zeros((count, seq), np.int8)
    positions = np.zeros((count, predictions), np.int32)
    masked_ids = np.zeros((count, predictions), np.int32)
    for row, length in enumerate(lengths):
        split = int(rng.integers(2, length - 1))
        input_ids[row, :length] = rng.integers(5, vocab_size, length)
        input_ids[row, [0, split, length - 1]] = [2, 3, 3]
        if masked_id is not None:
            input_ids[row, 1:length - 1][input_ids[row, 1:length - 1] > 3] = masked_id
        input_mask[row, :length] = 1
        segment_ids[row, split + 1:length] = 1
        candidates = [i for i in range(1, length - 1) if i != split]
        chosen = np.sort(rng.choice(candidates, int(rng.integers(1, predictions + 1)), replace=False))
        positions[row, :len(chosen)] = chosen
        masked_ids[row, :len(chosen)] = input_ids[row, chosen]
        input_ids[row, chosen] = 4  # [MASK]
    labels = rng.integers(0, 2, count).astype(np.int8)
    with h5py.File(path, "w") as handle:
        if varlength:
            def rows(array, dtype, widths):
                column = np.empty(count, dtype=object)
                for row, width in enumerate(widths):
                    column[row] = array[row, :width].astype(dtype)
                return column
            real = (positions != 0).sum(1)
            for key, array, dtype, widths in (("input_ids", input_ids, np.int16, lengths),
                                              ("segment_ids", segment_ids, np.int8, lengths),
                                              ("masked_lm_positions", positions, np.int16, real),
                                              ("masked_lm_ids", masked_ids, np.int16, real)):
                handle.create_dataset(key, data=rows(array, dtype, widths), dtype=h5py.vlen_dtype(dtype))
            handle.create_dataset("next_sentence_labels", data=labels, dtype="i1")
        else:
            for key, array, dtype in (("input_ids", input_ids, "i4"), ("input_mask", input_mask, "i1"),
                                      ("segment_ids", segment_ids, "i1"), ("masked_lm_positions", positions, "i4"),
                                      ("masked_lm_ids", masked_ids, "i4"), ("next_sentence_labels", labels, "i1")):
                handle.create_dataset(key, data=array, dtype=dtype, compression="gzip")
    return path


class Overflowing(torch.nn.Module):
    """Wraps a model so that the loss of its `at_call`-th forward (every forward's when None) is infinite: what an
    fp16 overflow looks like to the loss scaler. Its state dict is the wrapped model's."""

    def __init__(self, model, at_call=None):
        super().__init__()
        self.model, self.at_call, self.calls = model, at_call, 0

    def forward(self, **batch):
        self.calls += 1
        output = self.model(**batch)
        if self.at_call is None or self.calls == self.at_call:
            output.loss = output.loss * torch.tensor(float("inf"))
        return output

    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)


def is_the_packing_skip(reason: str) -> bool:
    """Whether a graph break's reason is dynamo skipping modeling._packing_on_device, the unpadded path's one disabled call."""
    return "torch.compiler.disable" in reason and "function _packing_on_device at" in reason


@pytest.fixture(scope="module")
def runner_inputs(tmp_path_factory) -> Path:
    """Small valid inputs of the three runners: glue/MRPC, squad/ (v1.1), shards/ and eval/ (NVIDIA's layout) and
    bert/ (TINY_BERT, the built-in vocabulary)."""
    from bertbench.tasks.synthetic import write_glue_task, write_squad

    root = tmp_path_factory.mktemp("runner_inputs")
    write_glue_task(root / "glue", "MRPC", train=64, dev=16, test=8)
    write_squad(root / "squad", "1.1", train=8, dev=2)
    write_bert_dir(root / "bert")
    for name, count in (("shards", 64), ("eval", 16)):
        (root / name).mkdir()
        write_nvidia_shard(root / name / "part_0.hdf5", count=count, seed=count)
    return root


def runner_command(runner: str, inputs: Path, out: Path, *extra: str) -> tuple:
    """(main, argv) of a short training of `runner` (classifier, squad or pretraining) on runner_inputs into `out`:
    a few steps of batch 8 (2; SQuAD's windows 4), a checkpoint only at the end; later flags in `extra` win."""
    from bertbench.runners import classifier as run_classifier, pretraining as run_pretraining, squad as run_squad

    common = [f"--bert_config_file={inputs / 'bert' / 'bert_config.json'}", "--max_seq_length=32",
              "--train_batch_size=8", "--do_train", "--save_checkpoints_secs=0", "--log_step_count_steps=1000",
              f"--output_dir={out}"]
    vocab = f"--vocab_file={inputs / 'bert' / 'vocab.txt'}"
    own = {"classifier": (run_classifier.main, ["--task_name=MRPC", f"--data_dir={inputs / 'glue' / 'MRPC'}", vocab,
                                                "--max_train_samples=16", "--num_train_epochs=1"]),
           "squad": (run_squad.main, [f"--train_file={inputs / 'squad' / 'train-v1.1.json'}", vocab,
                                      "--max_query_length=8", "--doc_stride=8", "--max_train_samples=16",
                                      "--num_train_epochs=1"]),
           "pretraining": (run_pretraining.main, [f"--input_dir={inputs / 'shards'}", "--max_predictions_per_seq=5",
                                                  "--num_train_steps=2"])}
    main, flags = own[runner]
    return main, [*flags, *common, *extra]
