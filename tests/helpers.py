"""What the tests share: the tiny models and batches, the wrappers that stop a run mid-way (a signal, a kill), the
inputs the runners read (a BERT directory, NVIDIA's shards, the runners' short commands and the classifier's flags),
the in-process entry point of a documented command, a torchrun command, a snapshot of a directory, a free port, and
the recompute and unpadded paths' common steps. Test modules import these from here, never from each other or from conftest.py, which
holds only pytest's hooks and fixtures."""

import importlib
import json
import os
import re
import shlex
import signal
import socket
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertbench.common.run_files import LOCK
from bertbench.model.config import BertConfig
from bertbench.model.factory import build_model
from bertbench.tasks.synthetic import write_vocab

# bert_config.json of the runners' tests: Google's format, 2 layers of hidden 32, the built-in task's vocab.
TINY_BERT = {
    "vocab_size": 48,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "attention_probs_dropout_prob": 0.1,
    "max_position_embeddings": 64,
    "type_vocab_size": 2,
    "initializer_range": 0.02,
}


def tiny_config(**overrides) -> BertConfig:
    """The tests' debug model: 2 layers, hidden 64."""
    values = {
        "vocab_size": 120,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
    }
    values.update(overrides)
    return BertConfig(**values)


def tiny_batch(config: BertConfig, batch: int = 3, seq: int = 24, seed: int = 0):
    """Random ids with segment ids and right padding of different lengths."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, config.vocab_size, (batch, seq), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, seq // 2 :] = 1
    attention_mask = torch.ones_like(input_ids)
    for row in range(batch):
        attention_mask[row, seq - 3 * row :] = 0
    return input_ids, token_type_ids, attention_mask


def read_json(path: str | Path) -> Any:
    """A JSON file's contents (a run's train_results.json, a bench's report)."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def free_port() -> int:
    """A TCP port nothing listens on now, for a rendezvous or a daemon a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch_command(processes: int, *arguments: str, restarts: int = 0) -> list[str]:
    """`bertbench launch` (torchrun) of `processes` workers on this machine, each running `arguments` (a script and
    its arguments, or -m and a module's), restarted up to `restarts` times."""
    return [
        sys.executable,
        "-m",
        "bertbench.runners.launch",
        "--standalone",
        f"--nproc-per-node={processes}",
        f"--max-restarts={restarts}",
        *arguments,
    ]


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
            files[str(path.relative_to(directory))] = None if name == LOCK else path.read_bytes()
    return files


def write_bert_dir(directory, **config_overrides):
    """directory/ with the built-in task's vocab.txt and TINY_BERT (with the overrides) as bert_config.json."""
    os.makedirs(directory, exist_ok=True)
    write_vocab(directory)
    with open(os.path.join(directory, "bert_config.json"), "w") as handle:
        json.dump({**TINY_BERT, **config_overrides}, handle)
    return directory


def write_nvidia_shard(
    path, count=32, seq=32, predictions=5, vocab_size=48, seed=0, varlength=False, lengths=None, masked_id=None
):
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
            input_ids[row, 1 : length - 1][input_ids[row, 1 : length - 1] > 3] = masked_id
        input_mask[row, :length] = 1
        segment_ids[row, split + 1 : length] = 1
        candidates = [i for i in range(1, length - 1) if i != split]
        chosen = np.sort(rng.choice(candidates, int(rng.integers(1, predictions + 1)), replace=False))
        positions[row, : len(chosen)] = chosen
        masked_ids[row, : len(chosen)] = input_ids[row, chosen]
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
            for key, array, dtype, widths in (
                ("input_ids", input_ids, np.int16, lengths),
                ("segment_ids", segment_ids, np.int8, lengths),
                ("masked_lm_positions", positions, np.int16, real),
                ("masked_lm_ids", masked_ids, np.int16, real),
            ):
                handle.create_dataset(key, data=rows(array, dtype, widths), dtype=h5py.vlen_dtype(dtype))
            handle.create_dataset("next_sentence_labels", data=labels, dtype="i1")
        else:
            for key, array, dtype in (
                ("input_ids", input_ids, "i4"),
                ("input_mask", input_mask, "i1"),
                ("segment_ids", segment_ids, "i1"),
                ("masked_lm_positions", positions, "i4"),
                ("masked_lm_ids", masked_ids, "i4"),
                ("next_sentence_labels", labels, "i1"),
            ):
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


class SignalAfter(torch.nn.Module):
    """Wraps a model and sends this process `signum` during forward call number `call`: a preemption mid-run."""

    def __init__(self, model, call, signum=signal.SIGTERM):
        super().__init__()
        self.model, self.call, self.signum, self.calls = model, call, signum, 0
        self.config = getattr(model, "config", None)  # the loop counts the model's FLOPs by it

    def forward(self, **batch):
        self.calls += 1
        if self.calls == self.call:
            os.kill(os.getpid(), self.signum)
        return self.model(**batch)

    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self.model.load_state_dict(*args, **kwargs)


class Killed(BaseException):
    """What a SIGKILL does to a run, in-process: it ends at once, without the stop's save."""


class KilledAt(SignalAfter):
    def forward(self, **batch):
        if self.calls + 1 == self.call:
            raise Killed
        return super().forward(**batch)


def is_the_packing_skip(reason: str) -> bool:
    """Whether a graph break's reason is dynamo skipping modeling._packing_on_device, the unpadded path's one disabled
    call."""
    return "marked as skipped" in reason and "qualname: _packing_on_device," in reason


def runner_command(runner: str, inputs: Path, out: Path, *extra: str) -> tuple:
    """(main, argv) of a short training of `runner` (classifier, squad or pretraining) on runner_inputs into `out`:
    a few steps of batch 8 (2; SQuAD's windows 4), a checkpoint only at the end; later flags in `extra` win."""
    from bertbench.runners import classifier as run_classifier
    from bertbench.runners import pretraining as run_pretraining
    from bertbench.runners import squad as run_squad

    common = [
        f"--bert_config_file={inputs / 'bert' / 'bert_config.json'}",
        "--max_seq_length=32",
        "--train_batch_size=8",
        "--do_train",
        "--save_checkpoints_secs=0",
        "--log_step_count_steps=1000",
        f"--output_dir={out}",
    ]
    vocab = f"--vocab_file={inputs / 'bert' / 'vocab.txt'}"
    own = {
        "classifier": (
            run_classifier.main,
            [
                "--task_name=MRPC",
                f"--data_dir={inputs / 'glue' / 'MRPC'}",
                vocab,
                "--max_train_samples=16",
                "--num_train_epochs=1",
            ],
        ),
        "squad": (
            run_squad.main,
            [
                f"--train_file={inputs / 'squad' / 'train-v1.1.json'}",
                vocab,
                "--max_query_length=8",
                "--doc_stride=8",
                "--max_train_samples=16",
                "--num_train_epochs=1",
            ],
        ),
        "pretraining": (
            run_pretraining.main,
            [f"--input_dir={inputs / 'shards'}", "--max_predictions_per_seq=5", "--num_train_steps=2"],
        ),
    }
    main, flags = own[runner]
    return main, [*flags, *common, *extra]


def in_process_entry_point(command: str):
    """A plain `bertbench ...` or `python -m bertbench.X ...` line (no variables, pipes, redirections or lists) runs
    through the same entry point in the test's process, which spares a Python and torch start each: (main, argv) for
    it, or None for a line bash runs."""
    words = shlex.split(command, comments=True)
    if re.search(r"[$|&;<>`]", command.split(" #", 1)[0]):
        return None
    if words[0] == "bertbench":
        from bertbench import cli

        return cli.main, words[1:]
    if words[:2] == ["python", "-m"] and words[2].startswith("bertbench."):
        return importlib.import_module(words[2]).main, words[3:]
    return None


def flip_byte(path, offset):
    """Flips one bit of the byte at `offset` of the file: damage a checksum must catch."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x10]))


def classifier_flags(
    data: Path,
    out: Path,
    *extra: str,
    bert: bool = True,
    batch: int | None = 16,
    learning_rate: str | None = None,
    log_every: int | None = None,
    save_every: int | None = None,
    keep: int | None = None,
) -> list[str]:
    """The flags of a classifier run on the MRPC task under data/glue/MRPC into out/, sequences of 32 tokens, batch
    `batch`, checkpoints every `save_every` steps (keeping `keep`) and at the end, never by the clock: with data/bert's
    vocab.txt and bert_config.json (write_bert_dir) unless bert=False (an --init_checkpoint directory gives them). A
    keyword left None leaves the runner's default; later flags in `extra` win."""
    flags = [
        "--task_name=MRPC",
        f"--data_dir={data / 'glue' / 'MRPC'}",
        "--max_seq_length=32",
        "--save_checkpoints_secs=0",
    ]
    if bert:
        flags += [
            f"--vocab_file={data / 'bert' / 'vocab.txt'}",
            f"--bert_config_file={data / 'bert' / 'bert_config.json'}",
        ]
    for flag, value in (
        ("train_batch_size", batch),
        ("learning_rate", learning_rate),
        ("log_step_count_steps", log_every),
        ("save_checkpoints_steps", save_every),
        ("keep_checkpoint_max", keep),
    ):
        if value is not None:
            flags.append(f"--{flag}={value}")
    return [*flags, f"--output_dir={out}", *extra]


# The recompute and unpadded paths' tests (test_recompute.py, test_unpadded.py, test_gpu_unpadded.py).
POLICIES = [("full", 2), ("every-k", 2), ("every-k", 3), ("selective", 2)]
# The most a policy's forward may save for backward, as a share of the baseline's (tiny_config with 4 layers; its
# intermediate size is small next to the CPU attention's score matrices, so selective's share is high here).
SAVED_LIMITS = {"full": 0.25, "every-k": 0.8, "selective": 0.95}


def make(modeling_name, policy="full", every_k=2, config=None, unpad=False, attention_kernel=None):
    """A classifier of `modeling_name` (4 layers of tiny_config unless `config`), the same weights whatever the
    modeling, policy or path."""
    torch.manual_seed(0)
    return build_model(
        "classification",
        config or tiny_config(num_hidden_layers=4),
        modeling_name,
        policy,
        every_k,
        unpad,
        attention_kernel,
        num_labels=2,
    )


def parse_model_flags(argv):
    """The modeling flags of a command as a runner reads them: a FlagParser (absl booleans), its defaults under the
    flags the command gives, as ModelSettings (runners.config.resolve)."""
    from bertbench.common.flags import FlagParser, add_dataclass_flags, build
    from bertbench.model.factory import ModelSettings

    parser = FlagParser()
    add_dataclass_flags(parser, ModelSettings)
    return build(
        ModelSettings, **parser.field_values(ModelSettings, {**parser.defaults, **vars(parser.parse_args(argv))})
    )


SEQ = 12
HEAD_KWARGS = {"classification": {"num_labels": 3}}


def lengths_mask(lengths, seq=SEQ):
    return (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).long()


def varied_batch(config, mask):
    """Random ids and segment ids under `mask` ([batch, SEQ])."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, config.vocab_size, mask.shape, generator=generator)
    token_type_ids = torch.randint(0, config.type_vocab_size, mask.shape, generator=generator)
    return input_ids, token_type_ids, mask


def labels(task, mask):
    """The labels of `task` for a 4-sequence batch, every predicted or answer position a real token of `mask`."""
    if task == "classification":
        values = {"labels": torch.tensor([0, 2, 1, 2], device=mask.device)}
    elif task == "pretraining":
        values = {
            "masked_lm_positions": torch.tensor([[1, 5, 11], [0, 0, 0], [2, 6, 3], [1, 3, 0]]),
            "masked_lm_labels": torch.tensor([[5, 6, 7], [8, -100, -100], [9, 10, 11], [12, 13, -100]]),
            "next_sentence_labels": torch.tensor([0, 1, 0, 1]),
        }
        positions = values["masked_lm_positions"]
    elif task == "question_answering":
        values = {"start_positions": torch.tensor([3, 0, 6, 1]), "end_positions": torch.tensor([5, 0, 6, 3])}
        positions = torch.stack(list(values.values()), 1)
    else:
        return {}
    if task != "classification":
        assert mask.cpu().bool()[torch.arange(4)[:, None], positions].all()
    return {name: value.to(mask.device) for name, value in values.items()}


def span_loss_over_real_tokens(start_logits, end_logits, mask, starts, ends):
    """The SQuAD loss with each span softmax over the real tokens only: what the unpadded path trains on."""
    real = mask.bool()
    start_logits, end_logits = (logits.masked_fill(~real, float("-inf")) for logits in (start_logits, end_logits))
    return (F.cross_entropy(start_logits, starts) + F.cross_entropy(end_logits, ends)) / 2


def outputs_and_loss(model, task, batch):
    """What a head computes from the real tokens (each [batch, seq] output at the real positions only; the pooled
    output of the sequences whose first position, which the pooler reads, is real), and a scalar loss of those only,
    the same on either path."""
    input_ids, token_type_ids, mask = batch
    real = mask.bool()
    given = labels(task, mask)
    out = model(input_ids, token_type_ids, mask, **given)
    if task == "encoder":
        generator = torch.Generator().manual_seed(2)
        weights, pooled_weights = (
            torch.randn(x.shape, generator=generator).to(x.device, x.dtype)
            for x in (out.sequence_output, out.pooled_output)
        )
        pooled = real[:, 0]
        loss = (out.sequence_output * weights)[real].sum() + (out.pooled_output * pooled_weights)[pooled].sum()
        return {"sequence_output": out.sequence_output[real], "pooled_output": out.pooled_output[pooled]}, loss
    if task == "classification":
        return {"logits": out.logits, "loss": out.loss}, out.loss
    if task == "pretraining":
        return {"mlm_logits": out.mlm_logits, "nsp_logits": out.nsp_logits, "loss": out.loss}, out.loss
    loss = span_loss_over_real_tokens(
        out.start_logits, out.end_logits, mask, given["start_positions"], given["end_positions"]
    )
    if out.loss is not None and model.bert.unpad:
        torch.testing.assert_close(out.loss, loss.to(out.loss.dtype), rtol=1e-6, atol=1e-7)
    return {"start_logits": out.start_logits[real], "end_logits": out.end_logits[real], "loss": loss}, loss


def forward_backward(model, task, batch):
    """The outputs, and every parameter's gradient of the loss, of one forward and backward."""
    outputs, loss = outputs_and_loss(model.train(), task, batch)
    loss.backward()
    return {
        **{name: value.detach() for name, value in outputs.items()},
        **{f"grad of {name}": parameter.grad for name, parameter in model.named_parameters()},
    }


def assert_close_to_fp64(ours, padded, fp64, name):
    """The unpadded path's fp32 error against the padded path in fp64 must be of the order of the padded path's own
    fp32 error (an output exactly zero in fp64, as the gradient of an unused position embedding, must be zero)."""
    reference_error = (padded.double() - fp64).abs().max().item()
    our_error = (ours.double() - fp64).abs().max().item()
    bound = 4 * reference_error + 1e-6 * fp64.abs().max().item()
    assert our_error <= bound, f"{name}: error {our_error:.3g} vs padded fp32 {reference_error:.3g}"


def scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in `directory` by tag, as (step, value) in the order TensorBoard's loader
    reads them, file after file by name, purging nothing: a step written twice shows twice."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    drawn = defaultdict(list)
    for path in sorted(Path(directory).glob("events.out.tfevents.*")):
        events = list(EventFileLoader(str(path)).Load())
        assert events[0].file_version == "brain.Event:2"
        for each in events[1:]:
            for value in each.summary.value:
                drawn[value.tag].append((each.step, value.tensor.float_val[0]))
    return dict(drawn)
