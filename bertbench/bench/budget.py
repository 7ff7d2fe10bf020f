"""`bertbench bench budget`: train each contender for the same wall-clock budget, then score the dev set.

The original suite's comparison: what a fixed time (20 minutes) of training buys, e.g. the plain model on one worker
against the recompute model on N. A contender is `VARIANT:PROCESSES[:independent]`: VARIANT is baseline, full,
selective or every-K (the recompute policies), PROCESSES the number of processes (1: a plain process; more: data
parallel under torchrun through `bertbench launch`), and `independent` makes them independent workers
(--no_sync_gradients; the one with the best dev metric is kept). The contenders run one after another through
`run_classifier`, as users run it, each with --max_train_seconds set to the budget and epochs enough that the budget,
not the data, ends training; then the dev set is scored. The budget counts the training loop only (checkpoint saves
included); start-up, reading the data and evaluation come on top. Every process gets cores / processes threads,
so each contender has the whole machine.

The learning-rate schedule is that of --max_epochs with no warm-up by default: within any budget the rate stays
close to its peak, and it is the same at the same step for every contender. The data is the built-in pair task in
GLUE's MRPC layout (3,668 train / 408 dev) with a BERT-Tiny-shaped model trained from scratch, or your own GLUE task
(--task_name, --data_dir, --vocab_file, --bert_config_file, and --init_checkpoint to fine-tune pre-trained weights).

    bertbench bench budget                                     # 20 minutes per contender
    bertbench bench budget --minutes 1 --contenders baseline:1,full:2,full:2:independent
    bertbench bench budget --task_name MRPC --data_dir glue_data/MRPC --vocab_file $BERT/vocab.txt \\
        --bert_config_file $BERT/bert_config.json --init_checkpoint $BERT/bert_model.ckpt --lr_scaling sqrt
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bertbench.bench import settings as bench_settings
from bertbench.bench.errors import BenchError, BenchRunFailed
from bertbench.bench.output import BenchOutput, with_warnings
from bertbench.bench.plots import line_plot
from bertbench.bench.results import Column, Ratio, Row, Spread, noisy_ratios_note, noisy_rows, table
from bertbench.bench.settings import BenchSettings, device_setting
from bertbench.bench.workload import Variant
from bertbench.common import run_files
from bertbench.common.durable import read_json
from bertbench.common.flags import setting
from bertbench.common.noise import LoadWatch, available_cores
from bertbench.runners.config import LR_SCALINGS
from bertbench.tasks.glue import get_processor
from bertbench.tasks.synthetic import vocabulary, write_glue_task, write_vocab
from bertbench.training.config import global_batch
from bertbench.training.distributed import check_processes
from bertbench.training.metrics import read_metrics, window_rates

USER_DATA = ("task_name", "data_dir", "vocab_file", "bert_config_file")
# Peak learning rates: a small model trained from scratch on the built-in task, and BERT's fine-tuning rate.
BUILT_IN_LEARNING_RATE, FINE_TUNING_LEARNING_RATE = 1e-3, 2e-5


@dataclass(frozen=True)
class Contender:
    """A modeling variant on a number of processes, data parallel or independent workers."""

    variant: Variant
    processes: int
    independent: bool = False

    @classmethod
    def parse(cls, text: str) -> Contender:
        parts = text.split(":")
        if (
            len(parts) not in (2, 3)
            or not parts[1].isdigit()
            or int(parts[1]) < 1
            or parts[2:] not in ([], ["independent"])
        ):
            raise BenchError(
                f"contender {text!r}: use VARIANT:PROCESSES or VARIANT:PROCESSES:independent, "
                "e.g. baseline:1 or full:2:independent"
            )
        contender = cls(Variant.parse(parts[0]), int(parts[1]), len(parts) == 3)
        if contender.independent and contender.processes < 2:
            raise BenchError(f"contender {text!r}: independent workers need 2 or more processes")
        return contender

    @property
    def label(self) -> str:
        return f"{self.variant.name}:{self.processes}" + (":independent" if self.independent else "")

    @property
    def run_name(self) -> str:
        return f"{self.variant.file_name}-{self.processes}proc" + ("-independent" if self.independent else "")

    def flags(self) -> list[str]:
        flags = [f"--{name.replace('_', '-')}={value}" for name, value in self.variant.runner_values().items()]
        return flags + (["--no_sync_gradients"] if self.independent else [])

    def command(self, classifier_flags: Sequence[str]) -> list[str]:
        launcher = (
            []
            if self.processes == 1
            else ["-m", "bertbench.runners.launch", "--standalone", f"--nproc-per-node={self.processes}"]
        )
        return [sys.executable, *launcher, "-m", "bertbench.runners.classifier", *classifier_flags, *self.flags()]


@dataclasses.dataclass(frozen=True)
class BudgetSettings(BenchSettings):
    """Contenders and budget, run_classifier's training flags, and the data: the built-in pair task, or your own GLUE
    task (--task_name, --data_dir, --vocab_file and --bert_config_file together)."""

    bench = "budget"

    minutes: float = setting(
        "Training budget of each contender, in minutes of training-loop wall-clock time.", 20.0, positive=True
    )
    contenders: tuple[str, ...] = setting(
        "Comma-separated VARIANT:PROCESSES[:independent]; VARIANT baseline, full, selective or every-K. Run one "
        "after another.",
        ("baseline:1", "full:2"),
    )
    threads_per_process: int | None = setting(
        "OMP_NUM_THREADS of every process; None: the cores available / the contender's processes.", None, positive=True
    )
    device: str | None = device_setting(
        "cpu or cuda: one GPU per process (default: CUDA when available); cuda:N for contenders of one process."
    )
    max_epochs: float = setting(
        "num_train_epochs: the length of the learning-rate schedule, to be far more than the budget holds.",
        1000.0,
        positive=True,
    )
    train_batch_size: int = setting("Sequences per process per step.", 32, positive=True)
    learning_rate: float | None = setting(
        f"Peak learning rate; None: {BUILT_IN_LEARNING_RATE:g} on the built-in data, {FINE_TUNING_LEARNING_RATE:g} "
        "on your own.",
        None,
        positive=True,
    )
    warmup_proportion: float = setting("Share of --max_epochs in warm-up, in [0, 1].", 0.0)
    lr_scaling: str = setting(
        "Learning rate times the processes: none, linear or sqrt.", "none", choices=tuple(LR_SCALINGS)
    )
    max_seq_length: int = setting("Tokens per sequence.", 128, positive=True)
    log_step_count_steps: int = setting("Steps between loss records (the curves' points).", 20, positive=True)
    hidden: int = setting("Built-in data: hidden size (BERT-Tiny: 128); heads = hidden / 64.", 128, positive=True)
    layers: int = setting("Built-in data: transformer blocks (BERT-Tiny: 2).", 2, positive=True)
    task_name: str | None = setting("Your own task: GLUE task name, e.g. MRPC.", None)
    data_dir: str | None = setting("Your own task: the task's directory of the GLUE download.", None)
    vocab_file: str | None = setting("Your own task: vocab.txt of the model.", None)
    bert_config_file: str | None = setting("Your own task: bert_config.json of the model.", None)
    init_checkpoint: str | None = setting("Pre-trained weights to fine-tune; None: train from scratch.", None)
    cased: bool = setting("A cased model: --do_lower_case=false.", False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.warmup_proportion <= 1:
            raise ValueError(f"warmup_proportion must be in [0, 1], got {self.warmup_proportion:g}")
        names = [contender.run_name for contender in self.contender_list]
        if len(set(names)) != len(names):
            raise ValueError(f"contenders names a contender twice: {','.join(self.contenders)}")
        given = [name for name in USER_DATA if getattr(self, name)]
        if (given and len(given) < len(USER_DATA)) or ((self.init_checkpoint or self.cased) and not given):
            missing = [f"--{name}" for name in USER_DATA if name not in given]
            raise BenchError(
                "your own task needs --task_name, --data_dir, --vocab_file and --bert_config_file together "
                f"(--init_checkpoint and --cased go with them); missing {', '.join(missing)}"
            )

    @property
    def contender_list(self) -> list[Contender]:
        return [Contender.parse(text) for text in self.contenders]


SETTINGS = BudgetSettings


def check_inputs(settings: BudgetSettings) -> None:
    """What the settings name outside themselves, refused before anything is written: the processes the device has,
    your own task's name and files."""
    check_processes(settings.device, max(contender.processes for contender in settings.contender_list))
    if settings.task_name:
        try:
            get_processor(settings.task_name)
        except ValueError as error:
            raise BenchError(str(error)) from None
        for name in ("data_dir", "vocab_file", "bert_config_file"):
            if not os.path.exists(getattr(settings, name)):
                raise BenchError(f"--{name} {getattr(settings, name)}: no such file or directory")


def write_built_in_data(root: str, hidden: int, layers: int) -> dict[str, str]:
    """The built-in pair task as GLUE MRPC files, its vocab and a from-scratch model config; run_classifier's flags."""
    task_dir = write_glue_task(os.path.join(root, "glue"), "MRPC")
    bert_dir = os.path.join(root, "bert")
    os.makedirs(bert_dir, exist_ok=True)
    config = {
        "vocab_size": len(vocabulary()),
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": max(1, hidden // 64),
        "intermediate_size": 4 * hidden,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "initializer_range": 0.02,
    }
    with open(os.path.join(bert_dir, "bert_config.json"), "w", encoding="utf-8") as handle:
        json.dump(config, handle, indent=2)
    return {
        "task_name": "MRPC",
        "data_dir": task_dir,
        "vocab_file": write_vocab(bert_dir),
        "bert_config_file": os.path.join(bert_dir, "bert_config.json"),
    }


def classifier_flags(settings: BudgetSettings, data: dict[str, str], learning_rate: float, run_dir: str) -> list[str]:
    """run_classifier's flags for every contender: train until the budget is spent, then score the dev set."""
    flags = [f"--{name}={value}" for name, value in data.items()]
    if settings.init_checkpoint:
        flags.append(f"--init_checkpoint={settings.init_checkpoint}")
    if settings.device:
        flags.append(f"--device={settings.device}")
    return flags + [
        "--do_train",
        "--do_eval",
        f"--do_lower_case={not settings.cased}",
        f"--max_seq_length={settings.max_seq_length}",
        f"--train_batch_size={settings.train_batch_size}",
        "--eval_batch_size=64",
        f"--learning_rate={learning_rate}",
        f"--num_train_epochs={settings.max_epochs}",
        f"--warmup_proportion={settings.warmup_proportion}",
        f"--lr_scaling={settings.lr_scaling}",
        f"--max_train_seconds={settings.minutes * 60}",
        "--save_checkpoints_secs=0",
        f"--log_step_count_steps={settings.log_step_count_steps}",
        f"--output_dir={run_dir}",
    ]


def last_error_line(text: str) -> str:
    """The line of a failed run's output that says why: the last naming an error, else the last one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["(no output)"])[-1]


def run_contender(contender: Contender, flags: Sequence[str], run_dir: str, threads: int) -> float:
    """Run one contender to the end (training, then evaluation), its output in run_dir/output.log; wall seconds."""
    os.makedirs(run_dir)
    log_path = os.path.join(run_dir, "output.log")
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(
            contender.command(flags),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
        )
    if done.returncode:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            reason = last_error_line(log.read())
        raise BenchRunFailed(
            f"contender {contender.label} failed (exit status {done.returncode}) in {run_dir}: "
            f"{reason} (whole output: {log_path})"
        )
    return time.perf_counter() - started


def contender_row(
    settings: BudgetSettings,
    contender: Contender,
    run_dir: str,
    dev_set: str,
    metric: str,
    threads: int,
    wall_seconds: float,
) -> Row:
    """A contender's figures: the sentences it trained within the budget, from its run's own files, and its dev
    score."""
    train = read_json(os.path.join(run_dir, run_files.TRAIN_RESULTS))
    scores = read_json(os.path.join(run_dir, run_files.EVAL_RESULTS))
    steady = train["steady_sentences_per_second"]
    # Each log window's seq/s after the first (which holds the start-up): the run's rate, measured repeatedly.
    windows = window_rates(read_metrics(run_dir))
    columns = {
        "threads_per_process": threads,
        "world_size": train["world_size"],
        "global_batch": global_batch(train["train_batch_size"], train["num_accumulation_steps"], train["world_size"]),
        "learning_rate": train["learning_rate"],
        "steps": train["steps"],
        "train_seconds": train["seconds"],
        "seq_per_s": train["sentences_per_second"],
        "steady_seq_per_s": steady,
        "sentences_per_budget_at_steady_rate": None if steady is None else steady * settings.minutes * 60,
        "window_seq_per_s": Spread.of(windows) if windows else None,
        "budget_exhausted": train["budget_exhausted"],
        "metric": f"{dev_set}_{metric}",
        "metric_value": scores[f"{dev_set}_{metric}"],
        "dev_loss": scores[f"{dev_set}_loss"],
        "wall_seconds": wall_seconds,
        "run_dir": run_dir,
    }
    return Row(
        "sentences",
        "sentences",
        {
            "minutes": settings.minutes,
            "contender": contender.label,
            "variant": contender.variant.name,
            "processes": contender.processes,
            "independent": contender.independent,
        },
        Spread.exact(train["sentences"]),
        columns,
    )


def with_vs_first(rows: list[Row]) -> list[Row]:
    """Each contender's sentences over the first's: a Ratio carrying the larger CV of the two runs' window rates
    (the sentences are the rate times the budget), so that a race run on a busy machine says so."""
    first = rows[0]
    compared = []
    for row in rows:
        rates = [part.get("window_seq_per_s") or part.median() for part in (row, first)]
        ratio = dataclasses.replace(Ratio.of(*rates), value=row.median() / max(1, first.median()))
        ratio = Ratio(1.0, None) if row is first else ratio  # the first over itself is exactly 1
        compared.append(dataclasses.replace(row, columns={**row.columns, "sentences_vs_first": ratio}))
    return compared


def loss_curve(run_dir: str) -> tuple[list[float], list[float]]:
    """(seconds into training, mean loss of the window) of each log window of the run."""
    records = [record for record in read_metrics(run_dir) if record.get("loss") is not None]
    return [record["elapsed_s"] for record in records], [record["loss"] for record in records]


COLUMNS = [
    Column("contender", "contender", ""),
    Column("processes", "processes", "d"),
    Column("threads each", "threads_per_process", "d"),
    Column("global batch", "global_batch", "d"),
    Column("steps", "steps", ",d"),
    Column("sentences", "sentences", lambda row: f"{row.median():,.0f}"),
    Column("vs first", "sentences_vs_first", ".2f"),
    Column("steady seq/s", "steady_seq_per_s", ",.1f"),
    Column("seq/s per log window: median (min–max, CV)", "window_seq_per_s", ",.1f"),
    Column("steady seq/s x budget", "sentences_per_budget_at_steady_rate", ",.0f"),
    Column("train s", "train_seconds", ".1f"),
    Column("budget ended it", "budget_exhausted", ""),
    Column("dev metric", "metric_value", ".4f"),
    Column("dev loss", "dev_loss", ".4f"),
]


def markdown(rows: list[Row], settings: BudgetSettings, context: dict) -> str:
    lines = [
        f"# Budget: {settings.minutes:g} minutes of training per contender, then the dev set",
        "",
        f"- data: {context['data']}; model: {context['model']}",
        f"- seq {settings.max_seq_length}, batch {settings.train_batch_size} per process, peak learning "
        f"rate {context['learning_rate']:g} (--lr_scaling {settings.lr_scaling}), schedule of "
        f"{settings.max_epochs:g} epochs, warm-up {settings.warmup_proportion:g}",
        f"- dev metric: {context['metric']}; {context['cores']} cores",
        "",
        table(rows, COLUMNS),
        "",
        "sentences: trained within the budget, every process's; vs first: as a share of the first contender's; "
        "seq/s per log window: over the windows after the first (CV = stdev / mean); steady seq/s x budget: the "
        "rate after start-up times the budget (the original's sentences per 20 minutes); train s: the "
        "training loop, the final checkpoint included.",
    ]
    note = noisy_ratios_note(rows)
    return "\n".join(lines + (["", note] if note else []))


def run(settings: BudgetSettings, argv: list[str]) -> None:
    contenders = settings.contender_list
    check_inputs(settings)
    own_data = bool(settings.task_name)
    output = BenchOutput(settings.directory, "budget", argv, settings.overwrite)
    run_dirs = {contender: os.path.join(output.directory, "runs", contender.run_name) for contender in contenders}
    for run_dir in run_dirs.values():
        if os.path.exists(run_dir):
            if not settings.overwrite:
                raise FileExistsError(
                    f"{run_dir} exists (a run there would resume): choose another --output_dir or pass --overwrite"
                )
            shutil.rmtree(run_dir)
    if own_data:
        data = {name: getattr(settings, name) for name in USER_DATA}
    else:
        data = write_built_in_data(os.path.join(output.directory, "data"), settings.hidden, settings.layers)
    processor = get_processor(data["task_name"])
    dev_set = next(iter(processor.dev))  # MNLI: matched
    learning_rate = settings.learning_rate or (FINE_TUNING_LEARNING_RATE if own_data else BUILT_IN_LEARNING_RATE)
    context = {
        "metric": f"{dev_set}_{processor.main_metric}",
        "learning_rate": learning_rate,
        "budget_seconds": settings.minutes * 60,
        "cores": available_cores(),
        "data": f"GLUE {processor.name} in {data['data_dir']}" + ("" if own_data else " (the built-in pair task)"),
        "model": data["bert_config_file"]
        + (f" from {settings.init_checkpoint}" if settings.init_checkpoint else " from scratch"),
    }
    rows, curves = [], {}
    for contender, run_dir in run_dirs.items():
        threads = settings.threads_per_process or max(1, context["cores"] // contender.processes)
        print(
            f"{contender.label}: training for {settings.minutes:g} min on {contender.processes} process(es) of "
            f"{threads} thread(s), then evaluating; log in {run_dir}/output.log",
            flush=True,
        )
        load = LoadWatch()  # per contender: a busy machine during one of them makes the race unfair
        flags = classifier_flags(settings, data, learning_rate, run_dir)
        wall = run_contender(contender, flags, run_dir, threads)
        output.warn(load.busy(f"contender {contender.label}"))
        rows.append(contender_row(settings, contender, run_dir, dev_set, processor.main_metric, threads, wall))
        curves[contender.label] = loss_curve(run_dir)
        print(
            f"  {rows[-1].get('steps'):,} steps, {rows[-1].median():,.0f} sentences in "
            f"{rows[-1].get('train_seconds'):.1f} s; {context['metric']} {rows[-1].get('metric_value'):.4f} "
            f"({wall:.0f} s in all)",
            flush=True,
        )
    rows = with_vs_first(rows)
    output.warn(noisy_rows(rows, "window_seq_per_s", lambda row: f"contender {row.get('contender')}", "training rate"))
    context["loss_curves"] = curves
    text = markdown(rows, settings, context)
    plots = {}
    if any(xs for xs, _ in curves.values()):
        plots["curves"] = line_plot(
            curves,
            "seconds of training",
            "training loss (mean of each log window)",
            f"{settings.minutes:g} min budget: {processor.name}, seq {settings.max_seq_length}",
        )
    output.write_result(settings, rows, context, text, plots)
    print(with_warnings(text, output.warnings))
    print(
        f"\nwrote {output.path('.json')}, {output.path('.md')}"
        + (f" and {output.path('-curves.png')}" if plots else "")
    )


main = bench_settings.main_for(BudgetSettings, __doc__.splitlines()[0], run)
