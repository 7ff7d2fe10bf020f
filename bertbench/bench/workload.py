"""What a bench times: a model size, a step kind, a modeling variant and a precision, on synthetic data.

Every bench (throughput, memory, profile, scaling) builds its steps here, so that "BERT-base, pre-training, seq 128,
recompute/selective, bf16" means the same model, batch and step everywhere, and the step is the one users train with:
bertbench.training.step.TrainStep with the training defaults (optimizer, schedule, clipping, loss scaling). The data is
random token ids: a step's cost does not depend on the values, and no file or network is needed. It does depend on
the lengths where padding is skipped (the unpadded path, HF's dynamic padding), so the batches can have real text's
lengths (Lengths): a distribution of them, the built-in one measured on real text.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources

import torch
from torch import nn

from bertbench.bench.errors import BenchError
from bertbench.model.attention import ATTENTION_KERNELS
from bertbench.model.config import IGNORE_INDEX, BertConfig, ConfigError
from bertbench.model.factory import build_model, path_of, unrunnable
from bertbench.model.precision import PRECISIONS
from bertbench.model.sizes import MODEL_SIZES
from bertbench.tasks.synthetic import synthetic_batch
from bertbench.training.config import TrainConfig
from bertbench.training.distributed import Distributed
from bertbench.training.step import TrainStep, autocast, fallbacks, slow_here

# pretraining: BertForPreTraining with MLM on the masked positions only plus NSP (NVIDIA's / MLPerf's step);
# finetuning: sequence classification (GLUE's step).
STEP_KINDS = ("pretraining", "finetuning")


@dataclass(frozen=True)
class Variant:
    """A modeling module with its recompute policy, "baseline", "full", "selective" or "every-K", on the unpadded path
    as runs train (batches with padding run on their real tokens only; "/KERNEL" picks its attention kernel, e.g.
    "baseline/nested", see attention.ATTENTION_KERNELS), or on the padded path with "/padded" ("baseline/padded":
    every sequence computed at the batch's length, Google's path); or HF transformers' BERT with
    the baseline's weights (the reference users compare against), trained by the same step: "hf" fed each batch
    padded to the sequence length (run_glue.py's default, pad_to_max_length), "hf-dynamic" fed it cut to its
    longest sequence (the Trainer's DataCollatorWithPadding)."""

    name: str
    modeling: str
    policy: str = "full"
    every_k: int = 2
    unpad: bool = True
    attention_kernel: str | None = None  # the unpadded path's; None: the device's default
    cut_to_longest: bool = False
    compiled: bool = False  # its step under torch.compile ("+compile"), beside the others in the same sweep

    @classmethod
    def parse(cls, text: str, hf: bool = False, compiled: bool = False) -> Variant:
        """A variant by name; `hf` and `hf-dynamic` only where the bench takes them (the HF model has no runner,
        no recompute), and a bertbench variant with "+compile" (its step compiled) only where `compiled`."""
        if text.endswith(COMPILE_SUFFIX) and text != COMPILE_SUFFIX:
            eager = text[: -len(COMPILE_SUFFIX)]
            if not compiled or eager in HF_VARIANTS:
                raise BenchError(
                    f"unknown variant {text!r}: a compiled variant (VARIANT{COMPILE_SUFFIX}) is a "
                    "bertbench variant in `bertbench bench throughput`"
                )
            return dataclasses.replace(cls.parse(eager), name=text, compiled=True)
        if text in HF_VARIANTS:
            if not hf:
                raise BenchError(
                    f"variant {text} is HF transformers' model: compare with it in `bertbench bench "
                    f"throughput --variants baseline,{text}`"
                )
            return cls(text, "hf", unpad=False, cut_to_longest=text == "hf-dynamic")
        model = text.partition("/")[0]
        every = model[len("every-") :] if model.startswith("every-") else ""
        if model == "baseline":
            fields = {"modeling": "baseline"}
        elif model in ("full", "selective"):
            fields = {"modeling": "recompute", "policy": model}
        elif every.isdigit() and int(every) >= 1:
            fields = {"modeling": "recompute", "policy": "every-k", "every_k": int(every)}
        else:
            fields = None
        path = text[len(model) + 1 :] if text != model else None
        if fields is None or path not in (None, "padded", *ATTENTION_KERNELS):
            raise BenchError(
                f"unknown variant {text!r}: use baseline, full, selective or every-K (K >= 1), each "
                f"optionally /padded (the padded path) or /KERNEL (the unpadded path's attention: "
                f"{', '.join(ATTENTION_KERNELS)})" + (", or hf or hf-dynamic" if hf else "")
            )
        return cls(text, unpad=path != "padded", attention_kernel=None if path in (None, "padded") else path, **fields)

    @property
    def file_name(self) -> str:
        """The name as a file or directory name ("baseline/padded" -> "baseline-padded")."""
        return self.name.replace("/", "-")

    def runner_values(self) -> dict:
        """The runners' flags that pick this variant, as values by flag name (see runner.run_values)."""
        path = (
            {"unpad": False}
            if not self.unpad
            else {"attention_kernel": self.attention_kernel}
            if self.attention_kernel
            else {}
        )
        if self.modeling != "recompute":
            return {"modeling": self.modeling, **path}
        return {"modeling": "recompute", "recompute_policy": self.policy, "recompute_every": self.every_k, **path}

    def path(self, model: nn.Module, device: torch.device | str, precision: str, compiled: bool) -> tuple[str, str]:
        """What the variant's batches with padding run on, as the benches name it, and why (models.path_of)."""
        if self.modeling == "hf":
            return (
                ("hf dynamic", "each batch cut to its longest sequence")
                if self.cut_to_longest
                else ("hf padded to max", "every batch at the sequence length")
            )
        return path_of(model, device, precision, compiled)


HF_VARIANTS = ("hf", "hf-dynamic")
COMPILE_SUFFIX = "+compile"
ALL_VARIANTS = ("baseline", "full", "selective", "every-2")
# The schedule length of a bench step: long enough that the learning rate never decays noticeably while timed.
BENCH_STEPS = 10**9


def bert_config(model: str, max_seq_length: int, dropout: float = 0.1) -> BertConfig:
    """A named size (MODEL_SIZES) or a bert_config.json / config.json path, with positions for max_seq_length."""
    if model in MODEL_SIZES:
        values = dict(
            MODEL_SIZES[model],
            max_position_embeddings=max(512, max_seq_length),
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
        return BertConfig(**values)
    if not os.path.exists(model):
        raise BenchError(f"unknown model {model!r}: use {', '.join(MODEL_SIZES)} or a bert_config.json path")
    try:
        config = BertConfig.from_json_file(model)
    except ConfigError as error:
        raise BenchError(str(error)) from None
    if max_seq_length > config.max_position_embeddings:
        raise BenchError(
            f"{model}: max_position_embeddings={config.max_position_embeddings} is shorter than "
            f"sequence length {max_seq_length}"
        )
    return config


def build(
    config: BertConfig, kind: str, variant: Variant, device: torch.device | str = "cpu", seed: int = 0
) -> nn.Module:
    """The model of a step kind from the variant's modeling module, in training mode, seeded alike for all."""
    torch.manual_seed(seed)
    task = "pretraining" if kind == "pretraining" else "classification"
    head = {} if kind == "pretraining" else {"num_labels": 2}
    if variant.modeling == "hf":
        model = HFContender(build_model(task, config, **head), config, kind)
    else:
        model = build_model(
            task,
            config,
            variant.modeling,
            variant.policy,
            variant.every_k,
            variant.unpad,
            variant.attention_kernel,
            **head,
        )
    return model.to(device).train()


class HFContender(nn.Module):
    """HF transformers' BertForPreTraining or BertForSequenceClassification (its default attention, sdpa), holding
    `baseline`'s weights, fed bertbench's batches: pre-training labels become HF's (-100 outside the masked
    positions), so HF computes its MLM logits at every position, as its model does."""

    def __init__(self, baseline: nn.Module, config: BertConfig, kind: str):
        super().__init__()
        try:
            import transformers
        except ImportError:
            raise BenchError("variant hf needs HF transformers: pip install transformers") from None
        classes = {
            "pretraining": (transformers.BertForPreTraining, {}),
            "finetuning": (transformers.BertForSequenceClassification, {"num_labels": 2}),
        }
        model_class, head = classes[kind]
        self.hf = model_class(transformers.BertConfig(**config.to_hf_dict(), **head))
        missing, _ = self.hf.load_state_dict(baseline.state_dict(), strict=False)
        if [name for name in missing if not name.endswith("position_ids")]:
            raise BenchError(f"HF {model_class.__name__} lacks bertbench's weights {missing}")

    def forward(
        self,
        input_ids,
        token_type_ids,
        attention_mask,
        labels=None,
        masked_lm_positions=None,
        masked_lm_labels=None,
        next_sentence_labels=None,
    ):
        if masked_lm_positions is not None:
            labels = torch.full_like(input_ids, IGNORE_INDEX).scatter(1, masked_lm_positions, masked_lm_labels)
            extra = {"next_sentence_label": next_sentence_labels}
        else:
            extra = {}
        return self.hf(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask, labels=labels, **extra
        )


def forward_loss(
    model: nn.Module, batch: dict[str, torch.Tensor], precision: str, device: torch.device | str
) -> torch.Tensor:
    """The loss of a forward under the training step's precision (for counting saved bytes without a step)."""
    with autocast(precision, device):
        return model(**batch).loss


def train_config(precision: str, **overrides) -> TrainConfig:
    """The TrainConfig a bench step trains with: the training defaults (AdamW, weight decay, clipping at 1.0, one
    micro-batch, no compile) with the bench's precision and any `overrides`. The schedule spans BENCH_STEPS without
    warm-up, so the learning rate stays at its peak however many steps a bench times."""
    if precision not in PRECISIONS:
        raise BenchError(f"unknown precision {precision!r}: use {', '.join(PRECISIONS)}")
    try:
        return TrainConfig(num_train_steps=BENCH_STEPS, warmup_proportion=0.0, precision=precision, **overrides)
    except ValueError as error:
        raise BenchError(str(error)) from None


def slow_precisions(precisions: Sequence[str], device: torch.device) -> list[str]:
    """Why a precision is timed far slower here than another would run (bf16 on a CPU without a bf16 unit): it is
    timed as asked, and its figures come with the reason."""
    return [line for precision in precisions for line in slow_here(train_config(precision), device)]


def check_runnable(train: TrainConfig, device: torch.device | str) -> TrainConfig:
    """`train`, which a run trains with as it is on `device`; a setting that a run would change there (fp16 on a
    CPU, compile without a compiler: train_step.fallbacks) is a BenchError, rather than timed as no run trains
    or relabelled."""
    changes = fallbacks(train, device)
    if changes:
        raise BenchError(
            f"on {device}: {changes[0].reason}: a run trains otherwise here (fp32, eager), so a bench does not time it"
        )
    return train


@dataclass(frozen=True)
class Lengths:
    """The sequence lengths (pair length, [CLS] and [SEP] counted) a bench's batches are drawn from: "full" (every
    sequence at the setting's length, no padding), "real-text" (the built-in distribution, real_text_lengths.txt) or
    a file of lengths: integers of 2 or more separated by whitespace, "#" starting a comment."""

    name: str
    values: tuple[int, ...] = ()  # empty for "full"

    @classmethod
    def parse(cls, text: str) -> Lengths:
        """--lengths: a name, else a file's path; an unreadable file or a bad length is a BenchError naming it."""
        if text == "full":
            return cls(text)
        if text == "real-text":
            return cls.read(resources.files(__package__).joinpath(BUILT_IN_LENGTHS), text)
        return cls.read(pathlib.Path(text), text)

    @classmethod
    def read(cls, path: pathlib.Path | resources.abc.Traversable, name: str) -> Lengths:
        values = []
        try:
            with path.open(encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    for word in line.partition("#")[0].split():
                        if not (word.isdigit() and int(word) >= 2):
                            raise BenchError(
                                f"{name}:{number}: {word!r} is not a sequence length (an integer of "
                                "2 or more: [CLS] and [SEP] at least)"
                            )
                        values.append(int(word))
        except OSError as error:
            raise BenchError(
                f"--lengths {name}: neither full, real-text nor a readable file ({error.strerror})"
            ) from None
        except UnicodeDecodeError:
            raise BenchError(f"{name}: not a text file of sequence lengths") from None
        if not values:
            raise BenchError(f"{name}: no sequence lengths in it")
        return cls(name, tuple(values))

    @property
    def full(self) -> bool:
        return not self.values

    def draw(self, count: int, seq: int, seed: int = 0) -> list[int]:
        """`count` lengths drawn from the distribution, the same on every call with the same `seed`, each cut to
        `seq`, as Google's truncation keeps a pair within max_seq_length."""
        if self.full:
            return [seq] * count
        return [min(seq, length) for length in random.Random(seed).choices(self.values, k=count)]

    def summary(self) -> dict:
        """What a report says of the distribution: count, mean, median, longest and the share at the longest."""
        if self.full:
            return {"name": self.name}
        longest = max(self.values)
        return {
            "name": self.name,
            "count": len(self.values),
            "mean": statistics.fmean(self.values),
            "median": statistics.median(self.values),
            "longest": longest,
            "share_at_longest": self.values.count(longest) / len(self.values),
        }


FULL_LENGTHS = Lengths("full")
# Made by tests/fixtures/google_bert/make_lengths.py from sentence pairs of English prose; its header says how.
BUILT_IN_LENGTHS = "real_text_lengths.txt"
TOKEN_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def cut_to_longest(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch cut to its longest sequence, as HF's DataCollatorWithPadding pads a batch; pre-training's masked
    positions lie among the real tokens, so they hold."""
    longest = int(batch["attention_mask"].sum(1).max())
    return {name: tensor[:, :longest].contiguous() if name in TOKEN_KEYS else tensor for name, tensor in batch.items()}


@dataclass
class BenchStep:
    """The training step users train with (bertbench.training.step.TrainStep), fed a cycle of synthetic micro-batches
    in turn (for full-length batches, one fixed batch); call it to run one optimizer step
    (gradient_accumulation_steps micro-batches)."""

    step: TrainStep
    batches: list[dict[str, torch.Tensor]]
    position: int = 0  # the micro-batch of the cycle that the next call starts with

    @property
    def model(self) -> nn.Module:
        return self.step.model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.step.optimizer

    @property
    def device(self) -> torch.device:
        return self.step.device

    @property
    def sequences(self) -> int:
        """Sequences one call trains: the batch times the micro-batches per step."""
        return len(self.batches[0]["input_ids"]) * self.step.config.gradient_accumulation_steps

    def per_step(self, per_sequence: Callable[[int], float]) -> float:
        """A figure of `per_sequence(real length)` summed over one call's sequences (real tokens, model FLOPs),
        averaged over the cycle: what the calls that go round the cycle whole (train_step's `steps`) average to."""
        lengths = [length for batch in self.batches for length in batch["attention_mask"].sum(1).tolist()]
        return sum(map(per_sequence, lengths)) * self.step.config.gradient_accumulation_steps / len(self.batches)

    def _next_batch(self) -> dict[str, torch.Tensor]:
        batch = self.batches[self.position % len(self.batches)]
        self.position += 1
        return batch

    def forward(self) -> torch.Tensor:
        """The loss of the micro-batch the next call starts with."""
        return self.step.forward_loss(self.step.prepare(self.batches[self.position % len(self.batches)]))

    def __call__(self) -> None:
        self.step(iter(self._next_batch, None))

    def capture_graphs(self) -> None:
        """Go round the cycle once, so that each of its batch sizes has its CUDA graph before the timing starts, as
        a run's first steps capture its common sizes (nothing when the step replays no graphs)."""
        if self.step.graphs is not None:
            for _ in range(len(self.batches) // self.step.config.gradient_accumulation_steps):
                self()


def train_step(
    config: BertConfig,
    kind: str,
    variant: Variant,
    precision: str,
    batch: int,
    seq: int,
    device: torch.device | str = "cpu",
    model: nn.Module | None = None,
    dist: Distributed | None = None,
    lengths: Lengths = FULL_LENGTHS,
    steps: int = 1,
    seed: int = 0,
    **train_overrides,
) -> BenchStep:
    """The training step of one setting; pass `model` to reuse one already built for the same kind and variant, and
    `train_overrides` (TrainConfig fields: optimizer, gradient_accumulation_steps, compile, ...) to time another
    recipe. Under torchrun pass the job's `dist`: the step is then DDP's, as in training. With `lengths` other than
    full, the step goes round a cycle of the micro-batches of `steps` steps with lengths drawn from it, the same
    examples for every variant (from `seed`, as the weights of a model built here), so that `steps` timed calls
    train each once; hf-dynamic's are cut to their longest sequence."""
    device = torch.device(device)
    dist = dist or Distributed(device=device)
    train = check_runnable(train_config(precision, **train_overrides), device)
    reason = unrunnable(variant.modeling, variant.attention_kernel, device)
    if reason is not None:
        raise BenchError(f"variant {variant.name}: {reason}")
    model = model if model is not None else build(config, kind, variant, device, seed)
    step = TrainStep(model, train, dist)
    micro_batches = 1 if lengths.full else steps * train.gradient_accumulation_steps
    drawn = lengths.draw(micro_batches * batch, seq, seed)
    # On the host, as a data set's batches are: the step packs and moves each one as training does. Each seed's
    # micro-batches have seeds of their own (seed 0's are 0, 1, ...).
    batches = [
        synthetic_batch(
            config,
            kind,
            batch,
            seq,
            seed=seed * micro_batches + index,
            lengths=drawn[index * batch : (index + 1) * batch],
        )
        for index in range(micro_batches)
    ]
    return BenchStep(step, [cut_to_longest(each) for each in batches] if variant.cut_to_longest else batches)
