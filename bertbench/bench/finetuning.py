"""`bertbench bench finetuning`: a fine-tuning runner as users run it, on built-in data in the real formats.

run_classifier on the built-in pair task in GLUE's MRPC layout (3,668 train / 408 dev), or run_squad on the built-in
SQuAD v2.0 files, each modeling variant trained and scored from the same seed. The variants run in rounds, in an
order that flips every round (A B C, C B A, ...), so the machine's drift hits them alike; each figure is the median
over the rounds with its min and max:

1. steady sentences/s (the first steps and checkpoint saves left out, as the original reported it) and the dev score
   (GLUE: accuracy; SQuAD: exact match and F1);
2. the cost of a timed checkpoint: every run saves each --save_checkpoints_secs, so seconds per save and the file's
   size come from every run, and the share of training time a save costs at the default 1200 s;
3. resuming after SIGKILL: the first variant is trained in a separate process, killed after its first checkpoint and
   run again with the same command, timed from launch until it trains again (interpreter, imports, data, model,
   restore), and the restore alone.

    bertbench bench finetuning                                 # GLUE, 4 variants x 3 rounds (a few minutes)
    bertbench bench finetuning --task squad --variants baseline,full --rounds 2
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from bertbench.bench import settings, workload
from bertbench.bench.errors import BenchRunFailed
from bertbench.bench.output import BenchOutput
from bertbench.bench.plots import line_plot
from bertbench.bench.results import Column, Ratio, Row, Spread, noisy_ratios_note, noisy_rows, table
from bertbench.common import run_files
from bertbench.common.durable import read_json, write_atomically
from bertbench.common.errors import UsageError
from bertbench.common.flags import as_flags, description, setting
from bertbench.common.noise import LoadWatch
from bertbench.model import sizes
from bertbench.model.config import BertConfig
from bertbench.model.precision import PRECISIONS
from bertbench.runners import classifier as run_classifier
from bertbench.runners import squad as run_squad
from bertbench.runners.skeleton import TaskRunner
from bertbench.tasks import synthetic
from bertbench.training.checkpoint import list_checkpoints
from bertbench.training.config import RunConfig
from bertbench.training.distributed import resolve_device


@dataclasses.dataclass(frozen=True)
class Task:
    """A runner on its built-in data: the model it trains by default (BertConfig fields), the defaults of its
    sequence length and epochs, and the dev figures its eval_results.json holds, by key and title."""

    spec: TaskRunner
    model: dict
    max_seq_length: int
    epochs: float
    scores: dict


TASKS = {
    "glue": Task(run_classifier.SPEC, sizes.MODEL_SIZES["tiny"], 128, 1.0, {"dev_acc": "dev accuracy"}),
    "squad": Task(run_squad.SPEC, sizes.SQUAD_MODEL, 48, 6.0, {"f1": "dev F1", "exact": "dev exact match"}),
}
DEFAULT_SAVE_SECONDS = RunConfig("").save_checkpoints_secs  # the original's 1200 s


@dataclasses.dataclass(frozen=True)
class Contender:
    """One row's runs: the data's lengths (a --lengths name), the precision and the modeling variant."""

    lengths: str
    precision: str
    variant: workload.Variant

    @property
    def key(self) -> tuple[str, str, str]:
        return self.lengths, self.precision, self.variant.name


@dataclasses.dataclass(frozen=True)
class FinetuningSettings(settings.BenchSettings):
    """Runs."""

    bench = "finetuning"

    task: str = setting(
        "glue: run_classifier on the built-in MRPC-sized task; squad: run_squad on the built-in SQuAD v2.0 files.",
        "glue",
        choices=tuple(TASKS),
    )
    model: str | None = settings.model_setting(
        None,
        " (its vocab_size becomes the built-in vocabulary's); default: tiny for glue, "
        "the demo's QA model (2 x 128, no dropout) for squad",
    )
    variants: tuple[str, ...] = setting("baseline, full, selective, every-K.", workload.ALL_VARIANTS)
    lengths: tuple[str, ...] = setting(
        "glue: the pairs' token counts, each a row of its own in the same interleaved rounds: built-in (the task's "
        "own pairs, 16 tokens), real-text (bench throughput's real-text distribution, mean 64), full (every pair "
        "at --max_seq_length), or a file of lengths; the pairs are the built-in task's, lengthened.",
        ("built-in",),
    )
    precisions: tuple[str, ...] = setting(
        f"The runs' --precision ({', '.join(PRECISIONS)}), each a row of its own in the same interleaved rounds: with "
        "--vary_seed, the dev scores of each precision over the same seeds (bf16 against fp32's accuracy).",
        ("fp32",),
    )
    rounds: int = setting("Runs of each variant, interleaved.", 3, positive=True)
    vary_seed: bool = setting(
        "Round r trains from --seed + r (other initial weights, dropout and data order): the dev scores' spread over "
        "the rounds is then the seed noise, and each precision, lengths and variant meets the same seeds.",
        False,
    )
    max_seq_length: int | None = setting(
        "Tokens per sequence (default: 128 for glue, 48 for squad).", None, positive=True
    )
    train_batch_size: int = setting("Sequences per step.", 32, positive=True)
    learning_rate: float = setting(
        "Peak learning rate (the built-in tasks train a model from scratch).", 1e-3, positive=True
    )
    num_train_epochs: float | None = setting(
        "Epochs of each run (default: 1 for glue, 6 for squad, as the demo's QA step).", None, positive=True
    )
    max_train_samples: int | None = setting("Train on the first N examples only.", None, positive=True)
    save_checkpoints_secs: float = setting(
        "Timed saves of every run, short so that each run saves several times.", 2.0, positive=True
    )
    no_resume: bool = setting("Skip the resume-after-SIGKILL figure.", False)
    seed: int = setting("Seed of every run (the same weights at the start).", 12345)
    device: str | None = settings.device_setting()

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            variants = self.variant_list  # an unknown variant is refused with the other settings
        except workload.BenchError as error:
            raise UsageError(str(error)) from None
        if not variants:
            raise UsageError("--variants: give at least one")
        if not self.lengths or len(set(self.lengths)) != len(self.lengths):
            raise UsageError("--lengths: give each at least once and none twice")
        try:
            lengths = self.length_list  # an unreadable file of lengths is refused with the other settings
        except workload.BenchError as error:
            raise UsageError(str(error)) from None
        if self.task != "glue" and any(lengths):
            raise UsageError(f"--lengths: the {self.task} task has its own lengths (glue only)")
        if not self.precisions or len(set(self.precisions)) != len(self.precisions):
            raise UsageError("--precisions: give each at least once and none twice")
        for precision in self.precisions:
            if precision not in PRECISIONS:
                raise UsageError(f"--precisions: unknown precision {precision!r}: use {', '.join(PRECISIONS)}")

    @property
    def contenders(self) -> list[Contender]:
        """What each round runs, in its order: every lengths, precision and variant."""
        return [
            Contender(lengths, precision, variant)
            for lengths in self.lengths
            for precision in self.precisions
            for variant in self.variant_list
        ]

    @property
    def variant_list(self) -> list[workload.Variant]:
        return [workload.Variant.parse(name) for name in self.variants]

    @property
    def length_list(self) -> list[workload.Lengths | None]:
        """--lengths parsed: None for the built-in pairs."""
        return [None if name == "built-in" else workload.Lengths.parse(name) for name in self.lengths]

    @property
    def seq_length(self) -> int:
        return self.max_seq_length or TASKS[self.task].max_seq_length

    @property
    def epochs(self) -> float:
        return self.num_train_epochs or TASKS[self.task].epochs

    @property
    def model_name(self) -> str:
        return self.model or "built-in"


SETTINGS = FinetuningSettings


def bert_config(settings: FinetuningSettings) -> BertConfig:
    """The model of the runs: --model, or the task's built-in one; with the built-in vocabulary."""
    seq, vocab_size = settings.seq_length, len(synthetic.vocabulary())
    if settings.model is not None:
        return dataclasses.replace(workload.bert_config(settings.model, seq), vocab_size=vocab_size)
    return BertConfig(
        **{**TASKS[settings.task].model, "max_position_embeddings": max(seq, 64), "vocab_size": vocab_size}
    )


def write_inputs(root: str, settings: FinetuningSettings, config: BertConfig) -> dict:
    """The built-in data, vocab.txt and `config` as bert_config.json under `root`; the flags a run of the task reads
    them by (for glue, the first --lengths' data_dir; `data_dirs` holds each one's, by name)."""
    config_file = os.path.join(root, "bert_config.json")
    write_atomically(config_file, json.dumps(dataclasses.asdict(config), indent=2) + "\n")
    values = {
        "vocab_file": synthetic.write_vocab(root),
        "bert_config_file": config_file,
        "max_seq_length": settings.seq_length,
        "train_batch_size": settings.train_batch_size,
        "learning_rate": settings.learning_rate,
        "num_train_epochs": settings.epochs,
        "seed": settings.seed,
        "device": settings.device,
        "log_step_count_steps": 1000000,
        "max_train_samples": settings.max_train_samples,
    }
    if settings.task == "glue":
        data_dirs = {
            name: synthetic.write_glue_task(
                os.path.join(root, f"glue-{index}"),
                "MRPC",
                lengths=None if lengths is None else lengths.draw(4096, settings.seq_length, settings.seed),
            )
            for index, (name, lengths) in enumerate(zip(settings.lengths, settings.length_list))
        }
        values.update(task_name="MRPC", data_dir=data_dirs[settings.lengths[0]], do_eval=True)
        return {**values, "data_dirs": data_dirs}
    else:
        train_file, dev_file = synthetic.write_squad(os.path.join(root, "squad"), "2.0", seed=settings.seed)
        values.update(
            train_file=train_file,
            predict_file=dev_file,
            do_predict=True,
            version_2_with_negative=True,
            doc_stride=16,
            max_query_length=16,
        )
    return values


def train_once(spec: TaskRunner, values: dict, scores: Sequence[str]) -> dict:
    """One run in this process through TaskRunner.run_values; its figures from train_results.json and
    eval_results.json."""
    log = io.StringIO()
    if spec.run_values(values, log) != 0:
        raise BenchRunFailed(f"{spec.name} failed:\n{log.getvalue()}")
    out = values["output_dir"]
    train = read_json(os.path.join(out, run_files.TRAIN_RESULTS))
    evaluated = read_json(os.path.join(out, run_files.EVAL_RESULTS))
    checkpoint = list_checkpoints(out)[-1][1]
    return {
        "steady_seq_per_s": train["steady_sentences_per_second"],
        "steps": train["global_step"],
        "seconds": train["seconds"],
        "saves": train["checkpoint_saves"],
        "seconds_per_save": train["checkpoint_seconds"] / max(1, train["checkpoint_saves"]),
        "checkpoint_bytes": os.path.getsize(checkpoint),
        **{name: evaluated[name] for name in scores},
    }


def runner_inputs(inputs: dict, lengths: str) -> dict:
    """The flags of a run on the data of `lengths` (a --lengths name)."""
    values = {name: value for name, value in inputs.items() if name != "data_dirs"}
    return {**values, "data_dir": inputs["data_dirs"][lengths]} if "data_dirs" in inputs else values


def rounds(settings: FinetuningSettings, root: str, inputs: dict) -> list[Row]:
    """Each contender's runs (lengths, precision, variant) in `settings.rounds` interleaved rounds: a row each, its
    steady seq/s the median of its runs, with the dev scores, the save's cost and every run's own figures (`runs`) as
    columns."""
    task = TASKS[settings.task]
    contenders = settings.contenders
    runs: dict[tuple[str, str, str], list[dict]] = {contender.key: [] for contender in contenders}
    for round_index in range(settings.rounds):
        seed = settings.seed + round_index if settings.vary_seed else settings.seed
        for contender in contenders if round_index % 2 == 0 else list(reversed(contenders)):
            index = settings.lengths.index(contender.lengths)
            name = f"{index}-{contender.precision}-{contender.variant.file_name}-{round_index}"
            values = {
                **runner_inputs(inputs, contender.lengths),
                **contender.variant.runner_values(),
                "precision": contender.precision,
                "seed": seed,
                "do_train": True,
                "output_dir": os.path.join(root, "runs", name),
                "save_checkpoints_secs": settings.save_checkpoints_secs,
            }
            run = train_once(task.spec, values, task.scores)
            runs[contender.key].append({**run, "seed": seed})
            print(
                f"  round {round_index + 1} {contender.lengths:<10} {contender.precision:<5} "
                f"{contender.variant.name:<10} {run['steady_seq_per_s']:8.1f} seq/s  "
                + "  ".join(f"{name} {run[name]:.3f}" for name in task.scores),
                flush=True,
            )
    rates = {key: Spread.of(run["steady_seq_per_s"] for run in done) for key, done in runs.items()}
    first = rates[contenders[0].key]
    rows = []
    for contender in contenders:
        done = runs[contender.key]
        save = Spread.of(run["seconds_per_save"] for run in done)
        columns = {
            "vs_first_variant": Ratio.of(rates[contender.key], first),
            **{name: Spread.of(run[name] for run in done) for name in task.scores},
            "seconds_per_save": save,
            "checkpoint_bytes": Spread.of(run["checkpoint_bytes"] for run in done),
            "save_share_at_default": save.median / DEFAULT_SAVE_SECONDS,
            "runs": done,
        }
        setting = {
            "task": settings.task,
            "model": settings.model_name,
            "lengths": contender.lengths,
            "precision": contender.precision,
            "variant": contender.variant.name,
        }
        rows.append(Row("steady_seq_per_s", "seq/s", setting, rates[contender.key], columns))
    return rows


def resume_after_sigkill(settings: FinetuningSettings, contender: Contender, root: str, inputs: dict) -> dict:
    """Kill a training process after its first checkpoint; time the same command from launch to training again:
    the columns the first contender's row gets."""
    spec = TASKS[settings.task].spec
    out = os.path.join(root, "killed")
    values = {
        **runner_inputs(inputs, contender.lengths),
        **contender.variant.runner_values(),
        "precision": contender.precision,
        "do_train": True,
        "output_dir": out,
        "save_checkpoints_steps": 10,
        "save_checkpoints_secs": 0,
    }
    command = [sys.executable, "-m", f"bertbench.{spec.name}", *as_flags(values)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not list_checkpoints(out):
        if process.poll() is not None:
            raise BenchRunFailed(
                f"{spec.name} ended (status {process.returncode}) before its first checkpoint: {' '.join(command)}"
            )
        time.sleep(0.01)
    process.kill()
    if process.wait() == 0 or os.path.exists(os.path.join(out, run_files.TRAIN_RESULTS)):
        raise BenchRunFailed(
            "the run to kill finished first: give it more steps (--num_train_epochs, --max_train_samples)"
        )
    killed_at = list_checkpoints(out)[-1][0]
    started = time.perf_counter()
    resumed = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    to_training, lines = None, []
    for line in resumed.stdout:
        lines.append(line)
        if to_training is None and line.startswith("resumed from "):
            to_training = time.perf_counter() - started
    if resumed.wait() != 0 or to_training is None:
        raise BenchRunFailed(f"the resumed {spec.name} failed:\n{''.join(lines[-20:])}")
    train = read_json(os.path.join(out, run_files.TRAIN_RESULTS))
    return {
        "killed_after_checkpoint_step": killed_at,
        "resumed_from": train["resumed_from"],
        "restore_seconds": train["restore_seconds"],
        "launch_to_training_seconds": to_training,
    }


def markdown(settings: FinetuningSettings, config: BertConfig, rows: Sequence[Row]) -> str:
    first = rows[0]
    columns = [
        *([Column("lengths", "lengths")] if settings.lengths != ("built-in",) else []),
        *([Column("precision", "precision")] if settings.precisions != ("fp32",) else []),
        Column("variant", "variant"),
        Column("steady seq/s: median (min–max, CV)", "steady_seq_per_s", ".1f"),
        Column(f"vs {label(settings, first)}", "vs_first_variant", ".3f"),
        *[Column(title, name, ".3f") for name, title in TASKS[settings.task].scores.items()],
        Column("ms per save", "seconds_per_save", lambda row: row.get("seconds_per_save").scaled(1e3).text(".1f")),
        Column("checkpoint MiB", "checkpoint_bytes", lambda row: f"{row.median('checkpoint_bytes') / 2**20:.1f}"),
        Column(f"save cost at {DEFAULT_SAVE_SECONDS:g} s", "save_share_at_default", ".4%"),
    ]
    lines = [
        f"# Fine-tuning through {TASKS[settings.task].spec.name}: {settings.model_name} model "
        f"({config.num_hidden_layers} x {config.hidden_size}), built-in {settings.task} data, seq "
        f"{settings.seq_length}, batch {settings.train_batch_size}, {settings.epochs:g} epochs",
        "",
        f"{settings.rounds} rounds per variant, interleaved; median, range and CV (stdev / mean) over the rounds"
        + (f", round r from seed {settings.seed} + r." if settings.vary_seed else f", each from seed {settings.seed}."),
        "",
        table(rows, columns),
    ]
    note = noisy_ratios_note(rows)
    if note:
        lines += ["", note]
    if first.get("launch_to_training_seconds") is not None:
        lines += [
            "",
            f"Resume after SIGKILL ({label(settings, first)}, killed after the step-"
            f"{first.get('killed_after_checkpoint_step')} checkpoint): training again "
            f"{first.get('launch_to_training_seconds'):.2f} s after launch, of which the restore took "
            f"{first.get('restore_seconds') * 1e3:.0f} ms.",
        ]
    return "\n".join(lines)


def label(settings: FinetuningSettings, row: Row) -> str:
    """A row's name: its variant, after its lengths and precision where the runs have others than the built-in
    pairs' and fp32."""
    words = [
        *([row.get("lengths")] if settings.lengths != ("built-in",) else []),
        *([row.get("precision")] if settings.precisions != ("fp32",) else []),
        row.get("variant"),
    ]
    return " ".join(words)


def plot(settings: FinetuningSettings, rows: Sequence[Row]):
    """Each run's steady seq/s by round, a line per row: the spread and any drift at a glance."""
    series = {
        label(settings, row): (
            list(range(1, len(row.get("runs")) + 1)),
            [run["steady_seq_per_s"] for run in row.get("runs")],
        )
        for row in rows
    }
    return line_plot(
        series,
        "round",
        "steady sentences / s",
        f"{TASKS[settings.task].spec.name}, {settings.model_name} model, built-in {settings.task} data",
    )


def run(settings: FinetuningSettings, argv: Sequence[str]) -> None:
    device = resolve_device(settings.device)  # an unusable --device fails here, not in the first run
    config = bert_config(settings)  # a bad --model fails before anything runs
    try:
        for precision in settings.precisions:  # fp16 on a CPU: refused before anything runs
            workload.check_runnable(workload.train_config(precision), device)
    except workload.BenchError as error:
        raise UsageError(f"--precisions: {error}") from None
    output = BenchOutput(settings.directory, settings.bench, argv, settings.overwrite)
    with tempfile.TemporaryDirectory() as root:
        inputs = write_inputs(root, settings, config)
        load = LoadWatch()
        rows = rounds(settings, root, inputs)
        output.warn(load.busy("the rounds"))
        for line in workload.slow_precisions(settings.precisions, device):
            output.warn(line)
        output.warn(
            noisy_rows(
                rows,
                "steady_seq_per_s",
                lambda row: label(settings, row),
                "rounds",
            )
        )
        if not settings.no_resume:
            resume = resume_after_sigkill(settings, settings.contenders[0], root, inputs)
            rows[0] = dataclasses.replace(rows[0], columns={**rows[0].columns, **resume})
    context = {
        "runner": TASKS[settings.task].spec.name,
        "model_config": dataclasses.asdict(config),
        "max_seq_length": settings.seq_length,
        "num_train_epochs": settings.epochs,
        "lengths": {
            name: {"name": name} if lengths is None else lengths.summary()
            for name, lengths in zip(settings.lengths, settings.length_list)
        },
        "default_save_checkpoints_secs": DEFAULT_SAVE_SECONDS,
    }
    text = markdown(settings, config, rows)
    output.write_result(settings, rows, context, text, {"seq-per-s": plot(settings, rows)})
    print(text)
    print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")


main = settings.main_for(FinetuningSettings, description(__doc__), run)
