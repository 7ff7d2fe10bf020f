"""`bertbench demo`: train a tiny BERT on the built-in pair task with the baseline and each recompute policy, then
fine-tune one on the built-in SQuAD v2.0 data through run_squad, then pre-train one (MLM + NSP) on the built-in
corpus through create_pretraining_data and run_pretraining.

Everything is generated here (data, vocab.txt, model), so it runs with no network and no files. The table shows
what the suite is about: the recompute module reaches the same accuracy with the same weights, keeps fewer bytes
for backward, and pays for it in step time. The QA step runs the real SQuAD runner (windows, n-best answers,
no-answer odds, official scoring) on files in SQuAD's format; the pre-training step turns Google-format text into
NVIDIA-format hdf5 shards and pre-trains on them with LAMB, scoring masked-LM accuracy on held-out shards as it goes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import torch

from bertbench.common import run_files
from bertbench.common.durable import read_json, write_atomically
from bertbench.common.errors import UsageError
from bertbench.common.flags import FlagParser, add_dataclass_flags, as_flags, build, check_fields, description, setting
from bertbench.common.noise import LoadWatch, Ratio, Spread, noisy_warning
from bertbench.model import sizes
from bertbench.model.config import BertConfig
from bertbench.model.factory import build_model
from bertbench.model.saved_activations import saved_activation_bytes
from bertbench.runners import pretraining as run_pretraining
from bertbench.runners import squad as run_squad
from bertbench.runners.skeleton import TaskRunner
from bertbench.tasks import synthetic as data
from bertbench.tasks.create_pretraining_data import create_pretraining_data
from bertbench.tasks.pretraining_data.settings import DataSettings
from bertbench.tasks.squad.reading import read_examples
from bertbench.tasks.tokenization import BertTokenizer
from bertbench.training.batches import ShuffledBatches
from bertbench.training.config import TrainConfig
from bertbench.training.metrics import read_log
from bertbench.training.step import TrainStep

# (modeling, recompute policy) pairs the demo trains, in table order.
VARIANTS = (("baseline", None), ("recompute", "full"), ("recompute", "every-k"), ("recompute", "selective"))


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the demo; the defaults finish in about a minute on 2 CPU cores."""

    steps: int = setting("Training steps per model.", 200)
    batch_size: int = setting("Sequences per step.", 32, at_least=1)
    learning_rate: float = setting(
        "Peak learning rate of Google's AdamW (whose first steps are several times bias-corrected Adam's).", 5e-4
    )
    adam_bias_correction: bool = setting(
        "AdamW's rule for the GLUE step: false is Google's, without bias correction (the runners' default); true is "
        "torch.optim.AdamW's.",
        False,
    )
    warmup_proportion: float = setting(
        "Share of the steps spent in linear warm-up (Google's schedule, then linear decay).", 0.1
    )
    train_examples: int = setting("Generated training pairs.", 4096, at_least=1)
    dev_examples: int = setting("Generated held-out pairs for accuracy.", 1024, at_least=1)
    max_seq_length: int = setting("Padded sequence length.", 32, at_least=1)
    hidden_size: int = setting("Width of the tiny BERT.", 64, at_least=1)
    num_hidden_layers: int = setting("Transformer blocks of the tiny BERT.", 2, at_least=1)
    qa_epochs: float = setting(
        "Epochs of the QA step over its 600 built-in paragraphs (1,800 questions); 0 skips it.", 6.0
    )
    pretraining_steps: int = setting(
        "Steps of the pre-training step (batches of 32 from the built-in corpus); 0 skips it.", 400
    )
    seed: int = setting("Seed of data, weights and dropout; same seed, same table.", 0)
    output_dir: str | None = setting("Also write demo_results.json here.", None)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.qa_epochs < 0:
            raise ValueError(f"--qa_epochs must be 0 (no QA step) or more, got {self.qa_epochs}")
        if self.pretraining_steps < 0:
            raise ValueError(
                f"--pretraining_steps must be 0 (no pre-training step) or more, got {self.pretraining_steps}"
            )
        if self.steps < 2:  # step 0 counts saved bytes and warms up; the later steps are timed
            raise ValueError(f"--steps must be at least 2, got {self.steps}")
        if self.hidden_size % 4:
            raise ValueError(f"--hidden_size must be a multiple of the 4 attention heads, got {self.hidden_size}")
        if self.batch_size > self.train_examples:
            raise ValueError(f"--batch_size {self.batch_size} is larger than --train_examples {self.train_examples}")
        if self.max_seq_length < 16:  # [CLS] A [SEP] B [SEP] of the built-in task is 16 tokens
            raise ValueError(f"--max_seq_length must be at least 16 for the built-in task, got {self.max_seq_length}")


def parse_args(argv: list[str] | None) -> DemoConfig:
    """The demo's settings, a flag per DemoConfig field (common.flags, as every command's); a bad value is one
    usage line (exit status 2)."""
    parser = FlagParser(prog="bertbench demo", description=description(__doc__))
    add_dataclass_flags(parser, DemoConfig)
    try:
        return build(DemoConfig, **{**parser.defaults, **vars(parser.parse_args(argv))})
    except UsageError as error:
        parser.error(str(error))


def encode(tokenizer: BertTokenizer, examples: list[data.PairExample], max_seq_length: int) -> dict:
    inputs = tokenizer.encode_batch([(ex.text_a, ex.text_b) for ex in examples], max_seq_length)
    tensors = {name: torch.from_numpy(array) for name, array in inputs._asdict().items()}
    tensors["labels"] = torch.tensor([ex.label for ex in examples])
    return tensors


def accuracy(model: torch.nn.Module, dataset: dict, batch_size: int = 256) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(dataset["labels"]), batch_size):
            chunk = {name: tensor[start : start + batch_size] for name, tensor in dataset.items()}
            labels = chunk.pop("labels")
            correct += (model(**chunk).logits.argmax(-1) == labels).sum().item()
    return correct / len(dataset["labels"])


def train_one(
    settings: DemoConfig, config: BertConfig, modeling_name: str, policy: str | None, train: dict, dev: dict
) -> tuple[dict, torch.nn.Module]:
    torch.manual_seed(settings.seed)
    model = build_model("classification", config, modeling_name, policy or "full", num_labels=len(data.LABELS))
    # The training step users train with (Google's AdamW, warm-up and linear decay, clipping at 1.0).
    step = TrainStep(
        model,
        TrainConfig(
            num_train_steps=settings.steps,
            learning_rate=settings.learning_rate,
            warmup_proportion=settings.warmup_proportion,
            adam_bias_correction=settings.adam_bias_correction,
        ),
    )
    stream = ShuffledBatches(train, settings.batch_size, settings.seed)
    model.train()
    # Counted on a forward of its own (its graph is dropped): autograd's hooks would slow a timed step.
    first_batch = next(ShuffledBatches(train, settings.batch_size, settings.seed))
    saved_bytes = saved_activation_bytes(lambda: step.forward_loss(first_batch), model)[1]
    seconds = []
    # Untimed: the first steps, which pay for allocation and thread start-up.
    untimed = max(1, min(5, settings.steps // 4))
    for index in range(settings.steps):
        started = time.perf_counter()
        outcome = step(stream)
        if index >= untimed:
            seconds.append(time.perf_counter() - started)
    loss = outcome.loss
    name = modeling_name if policy is None else f"{modeling_name}/{policy}"
    # Medians of the timed steps, with their spread (bertbench.common.noise's convention: KEY_min, KEY_max, KEY_cv).
    result = {
        "model": name,
        "dev_accuracy": accuracy(model, dev),
        "final_loss": loss.item(),
        **Spread.of_rate(settings.batch_size, seconds).flat("train_seq_per_s"),
        **Spread.of(seconds).scaled(1000).flat("step_ms"),
        "timed_steps": len(seconds),
        "saved_for_backward_bytes": saved_bytes,
    }
    return result, model


def step_spread(result: dict) -> Spread:
    """A variant's step time in ms with its spread, from its flat record (train_one)."""
    return Spread(
        result["step_ms"], result["step_ms_min"], result["step_ms_max"], result["step_ms_cv"], result["timed_steps"]
    )


def format_table(results: list[dict], baseline: dict) -> str:
    header = (
        "model",
        "dev acc",
        "seq/s",
        "saved for backward",
        "bytes vs base",
        "step ms (min-max, CV)",
        "step time vs base",
    )
    rows = [header]
    for result in results:
        rows.append(
            (
                result["model"],
                f"{result['dev_accuracy']:.3f}",
                f"{result['train_seq_per_s']:.0f}",
                f"{result['saved_for_backward_bytes'] / 2**20:.2f} MiB",
                f"{result['saved_for_backward_bytes'] / baseline['saved_for_backward_bytes']:.2f}x",
                step_spread(result).text(".1f"),
                Ratio.of(step_spread(result), step_spread(baseline)).text(),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def run_quietly(spec: TaskRunner, values: dict) -> str:
    """Run a runner's command (Python values by flag name) with its log kept back, shown only if it fails; return
    the same command as a user would type it."""
    log = io.StringIO()
    status = spec.run_values(values, log)
    if status != 0:
        raise RuntimeError(f"{spec.name} exited with status {status}:\n{log.getvalue()}")
    return shlex.join(as_flags(values))


def question_answering(settings: DemoConfig, directory: str) -> dict:
    """Fine-tune a tiny BERT on the built-in SQuAD v2.0 files with run_squad, as a user would, in `directory`;
    return the official scores and the training throughput. The run directory is rebuilt on every call, so a
    demo run again with other settings does not resume or clash with the last one."""
    shutil.rmtree(os.path.join(directory, "run"), ignore_errors=True)
    train_file, dev_file = data.write_squad(os.path.join(directory, "data"), "2.0", seed=settings.seed)
    config_file = os.path.join(directory, "bert_config.json")
    write_atomically(
        config_file,
        json.dumps(dataclasses.asdict(BertConfig(vocab_size=len(data.vocabulary()), **sizes.SQUAD_MODEL)), indent=2)
        + "\n",
    )
    # Google's AdamW (the runners' default) on a model trained from scratch takes first updates several times
    # bias-corrected Adam's: half the steps in warm-up at 6e-4 learn the task where 1e-3 with 10% warm-up stays at
    # "no answer" everywhere.
    values = {
        "do_train": True,
        "do_predict": True,
        "train_file": train_file,
        "predict_file": dev_file,
        "vocab_file": data.write_vocab(directory),
        "bert_config_file": config_file,
        "version_2_with_negative": True,
        "max_seq_length": 48,
        "doc_stride": 16,
        "max_query_length": 16,
        "train_batch_size": 32,
        "learning_rate": 6e-4,
        "warmup_proportion": 0.5,
        "num_train_epochs": settings.qa_epochs,
        "seed": settings.seed,
        "device": "cpu",
        "save_checkpoints_secs": 0,
        "log_step_count_steps": 1000000,
        "output_dir": os.path.join(directory, "run"),
    }
    command = run_quietly(run_squad.SPEC, values)
    scores, training = (
        read_json(os.path.join(directory, "run", name)) for name in (run_files.EVAL_RESULTS, run_files.TRAIN_RESULTS)
    )
    return {
        "command": "bertbench squad " + command,
        "model_config": sizes.SQUAD_MODEL,
        "train_questions": len(read_examples(train_file, training=True, version_2=True)),
        "dev_questions": scores["questions"],
        "windows": scores["windows"],
        "exact": scores["exact"],
        "f1": scores["f1"],
        "has_answer_exact": scores["HasAns_exact"],
        "no_answer_exact": scores["NoAns_exact"],
        "no_answer_everywhere_exact": 100.0 * scores["NoAns_total"] / scores["total"],
        "steps": training["global_step"],
        "train_seq_per_s": training["steady_sentences_per_second"],
    }


# The pre-training step's model: the demo's tiny BERT, without dropout (nothing here overfits in 400 steps).
PRETRAINING_MODEL = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "max_position_embeddings": 32,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}


def pretraining(settings: DemoConfig, directory: str) -> dict:
    """Write the built-in corpus (600 training and 60 held-out documents) as Google's text, make NVIDIA-format shards
    of it with create_pretraining_data, and pre-train a tiny BERT on them with run_pretraining as a user would,
    scoring the held-out shard every tenth of the run; return the accuracy curve and the commands."""
    shutil.rmtree(os.path.join(directory, "run"), ignore_errors=True)
    os.makedirs(directory, exist_ok=True)
    vocab_file = data.write_vocab(directory)
    shard_dirs = {}
    for split, documents, shards, dupe_factor in (("train", 600, 4, 3), ("eval", 60, 1, 1)):
        seed = 2 * settings.seed + (split == "eval")
        corpus = data.write_corpus(os.path.join(directory, f"{split}.txt"), documents, seed=seed)
        shard_dirs[split] = os.path.join(directory, f"{split}_shards")
        shutil.rmtree(shard_dirs[split], ignore_errors=True)
        create_pretraining_data(
            DataSettings(
                input_file=corpus,
                vocab_file=vocab_file,
                output_dir=shard_dirs[split],
                num_shards=shards,
                max_seq_length=32,
                max_predictions_per_seq=5,
                dupe_factor=dupe_factor,
                random_seed=settings.seed,
            ),
            log=lambda line: None,
        )
    config_file = os.path.join(directory, "bert_config.json")
    write_atomically(
        config_file,
        json.dumps(dataclasses.asdict(BertConfig(vocab_size=len(data.vocabulary()), **PRETRAINING_MODEL)), indent=2)
        + "\n",
    )
    steps, batch = settings.pretraining_steps, 32
    values = {
        "do_train": True,
        "do_eval": True,
        "input_dir": shard_dirs["train"],
        "eval_dir": shard_dirs["eval"],
        "bert_config_file": config_file,
        "max_seq_length": 32,
        "max_predictions_per_seq": 5,
        "train_batch_size": batch,
        "learning_rate": 1e-2,
        "num_train_steps": steps,
        "eval_iter_samples": max(1, steps // 10) * batch,
        "eval_iter_start_samples": batch,
        "seed": settings.seed,
        "device": "cpu",
        "save_checkpoints_secs": 0,
        "log_step_count_steps": 1000000,
        "output_dir": os.path.join(directory, "run"),
    }
    command = run_quietly(run_pretraining.SPEC, values)
    curve = read_log(os.path.join(directory, "run", run_files.EVALS))
    training = read_json(os.path.join(directory, "run", run_files.TRAIN_RESULTS))
    return {
        "command": "bertbench pretrain " + command,
        "model_config": PRETRAINING_MODEL,
        "training_sequences": training["training_sequences"],
        "steps": training["global_step"],
        "train_seq_per_s": training["steady_sentences_per_second"],
        "chance_masked_lm_accuracy": 1 / len(data.vocabulary()),
        "curve": [
            {key: record[key] for key in ("step", "masked_lm_accuracy", "next_sentence_accuracy", "loss")}
            for record in curve
        ],
    }


def glue_inputs(settings: DemoConfig) -> tuple[BertConfig, dict, dict]:
    """The GLUE step's model config and its encoded training and held-out pairs."""
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = BertTokenizer.from_vocab_file(data.write_vocab(scratch), do_lower_case=True)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=settings.hidden_size,
        num_hidden_layers=settings.num_hidden_layers,
        num_attention_heads=4,
        intermediate_size=4 * settings.hidden_size,
        max_position_embeddings=settings.max_seq_length,
    )
    train = encode(tokenizer, data.make_examples(settings.train_examples, settings.seed), settings.max_seq_length)
    dev = encode(tokenizer, data.make_examples(settings.dev_examples, settings.seed + 1), settings.max_seq_length)
    return config, train, dev


class Progress:
    """What the demo is doing, as it goes. A terminal keeps the demo's display: a line per trained model, and the
    runners' progress bars while they train. A file or a pipe shows no bars, so there each step of the demo gets a
    plain line, flushed, as it starts, and one with its time as it ends."""

    def __init__(self, stream: IO[str] | None = None):
        self.stream = stream or sys.stdout
        self.plain = not self.stream.isatty()

    def terminal(self, line: str) -> None:
        """A line of the terminal's display."""
        if not self.plain:
            print(line, file=self.stream, flush=True)

    @contextlib.contextmanager
    def step(self, doing: str, announce: bool = False) -> Iterator[list[str]]:
        """One step of the demo; what the step appends to the list it is given ends its closing line. `announce`:
        a terminal shows the step as it starts, too."""
        if self.plain:
            print(f"demo: {doing} ...", file=self.stream, flush=True)
        elif announce:
            self.terminal(f"  {doing} ...")
        started, outcome = time.perf_counter(), []
        yield outcome
        if self.plain:
            print(
                f"demo: {doing}: done in {time.perf_counter() - started:.1f} s"
                + "".join(f"; {text}" for text in outcome),
                file=self.stream,
                flush=True,
            )


def run(settings: DemoConfig, progress: Progress | None = None) -> dict:
    """Train every variant; return the results (also what demo_results.json holds)."""
    progress = progress or Progress()
    with progress.step("making the built-in pair task and its vocab"):
        config, train, dev = glue_inputs(settings)
    results, models = [], []
    # The variants train one after another, not interleaved: a machine busy during one of them skews the ratios.
    load = LoadWatch()
    for modeling_name, policy in VARIANTS:
        name = modeling_name if policy is None else f"{modeling_name}/{policy}"
        with progress.step(f"training {name} ({settings.steps} steps of {settings.batch_size} sequences)") as done:
            result, model = train_one(settings, config, modeling_name, policy, train, dev)
            done.append(f"dev accuracy {result['dev_accuracy']:.3f}, step {step_spread(result).text('.1f')} ms")
        progress.terminal(f"  trained {result['model']:<22} dev accuracy {result['dev_accuracy']:.3f}")
        results.append(result)
        models.append(model)
    warnings = [
        message
        for message in (
            load.busy("training the models"),
            noisy_warning([(result["model"], step_spread(result)) for result in results], "step times"),
        )
        if message
    ]
    reference = models[0].state_dict()
    weight_difference = max(
        (model.state_dict()[name] - tensor).abs().max().item()
        for model in models[1:]
        for name, tensor in reference.items()
    )
    report = {
        "settings": dataclasses.asdict(settings),
        "model_config": dataclasses.asdict(config),
        "chance_accuracy": 1 / len(data.LABELS),
        "results": results,
        "max_weight_difference_vs_baseline": weight_difference,
        "warnings": warnings,
    }
    if settings.qa_epochs > 0:
        with progress.step("fine-tuning on the built-in SQuAD v2.0 data with run_squad", announce=True) as done:
            qa = in_output_or_scratch(settings, "squad", question_answering)
            done.append(f"exact match {qa['exact']:.1f}, F1 {qa['f1']:.1f}")
        report["question_answering"] = qa
    if settings.pretraining_steps > 0:
        with progress.step(
            "pre-training on the built-in corpus with create_pretraining_data and run_pretraining", announce=True
        ) as done:
            pre = in_output_or_scratch(settings, "pretraining", pretraining)
            done.append(f"held-out masked-LM accuracy {pre['curve'][-1]['masked_lm_accuracy']:.2f}")
        report["pretraining"] = pre
    return report


def in_output_or_scratch(settings: DemoConfig, name: str, step):
    """step(settings, directory) in OUTPUT_DIR/name, which keeps the data and the run so that the printed command
    can be run again, or in a temporary directory without --output_dir."""
    if settings.output_dir:
        return step(settings, os.path.join(settings.output_dir, name))
    with tempfile.TemporaryDirectory() as scratch:
        return step(settings, scratch)


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    print(
        f"bertbench demo: tiny BERT (hidden {settings.hidden_size}, {settings.num_hidden_layers} layers) on the "
        f"built-in majority-mood pair task, {settings.steps} steps x {settings.batch_size} sequences, "
        f"{torch.get_num_threads()} CPU threads",
        flush=True,
    )
    report = run(settings)
    print()
    print(format_table(report["results"], report["results"][0]))
    print("step ms: median of the timed steps (min-max, CV = stdev / mean); step time vs base: of the medians")
    for message in report["warnings"]:
        print(f"warning: {message}")
    print(
        f"\nchance accuracy {report['chance_accuracy']:.2f}; largest weight difference between the recompute "
        f"models and the baseline after training: {report['max_weight_difference_vs_baseline']:.1e}"
    )

    def rate(seq_per_s: float | None) -> str:
        # a run of too few steps has no steady rate: its first steps and saves are left out of it
        return "too few steps for a steady seq/s" if seq_per_s is None else f"{seq_per_s:.0f} seq/s"

    qa = report.get("question_answering")
    if qa:
        print(
            f"\nquestion answering (run_squad, SQuAD v2.0 format, {qa['train_questions']:,} training / "
            f"{qa['dev_questions']} dev questions, hidden 128, {qa['steps']} steps, "
            f"{rate(qa['train_seq_per_s'])}):"
        )
        print(
            f"  exact match {qa['exact']:.1f}  F1 {qa['f1']:.1f}  (answerable {qa['has_answer_exact']:.1f}, "
            f'unanswerable {qa["no_answer_exact"]:.1f}); answering "no answer" everywhere scores '
            f"{qa['no_answer_everywhere_exact']:.1f}"
        )
    pre = report.get("pretraining")
    if pre:
        curve = pre["curve"]
        print(
            f"\npre-training (create_pretraining_data + run_pretraining, LAMB, {pre['training_sequences']:,} "
            f"sequences of the built-in corpus, hidden 64, {pre['steps']} steps, {rate(pre['train_seq_per_s'])}), "
            f"held-out masked-LM accuracy by step (chance {pre['chance_masked_lm_accuracy']:.2f}):"
        )
        print("  " + "  ".join(f"{record['step']}: {record['masked_lm_accuracy']:.2f}" for record in curve))
    if settings.output_dir:
        os.makedirs(settings.output_dir, exist_ok=True)
        path = os.path.join(settings.output_dir, "demo_results.json")
        write_atomically(path, json.dumps(report, indent=2) + "\n")
        print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
