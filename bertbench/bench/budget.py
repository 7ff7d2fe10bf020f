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

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from bertbench.bench import cli
from bertbench.bench.output import BenchOutput, markdown_table, spread_column
from bertbench.bench.plots import line_plot
from bertbench.bench.workload import BenchError, BenchRunFailed, Variant
from bertbench.common import run_files
from bertbench.common.noise import LoadWatch, noisy_warning, spread, spread_fields
from bertbench.runners.config import LR_SCALINGS
from bertbench.runners.run_directory import read_json
from bertbench.tasks.glue import get_processor
from bertbench.tasks.synthetic import vocabulary, write_glue_task, write_vocab
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


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser_for("budget", __doc__.splitlines()[0])
    race = parser.add_argument_group("contenders and budget")
    race.add_argument(
        "--minutes",
        type=float,
        default=20.0,
        help="Training budget of each contender, in minutes of training-loop wall-clock time.",
    )
    race.add_argument(
        "--contenders",
        default="baseline:1,full:2",
        help="Comma-separated VARIANT:PROCESSES[:independent]; VARIANT baseline, full, selective or "
        "every-K. Run one after another.",
    )
    race.add_argument(
        "--threads_per_process",
        type=cli.positive_int,
        default=None,
        help="OMP_NUM_THREADS of every process; None: the cores available / the contender's processes.",
    )
    race.add_argument(
        "--device",
        default=None,
        help="cpu or cuda: one GPU per process (default: CUDA when available); cuda:N for contenders of one process.",
    )
    race.add_argument(
        "--max_epochs",
        type=float,
        default=1000.0,
        help="num_train_epochs: the length of the learning-rate schedule, to be far more than the budget holds.",
    )
    training = parser.add_argument_group("training (run_classifier's flags)")
    training.add_argument(
        "--train_batch_size", type=cli.positive_int, default=32, help="Sequences per process per step."
    )
    training.add_argument(
        "--learning_rate",
        type=float,
        default=None,
        help=f"Peak learning rate; None: {BUILT_IN_LEARNING_RATE:g} on the built-in data, "
        f"{FINE_TUNING_LEARNING_RATE:g} on your own.",
    )
    training.add_argument("--warmup_proportion", type=float, default=0.0, help="Share of --max_epochs in warm-up.")
    training.add_argument(
        "--lr_scaling",
        choices=LR_SCALINGS,
        default="none",
        help="Learning rate times the processes: none, linear or sqrt.",
    )
    training.add_argument("--max_seq_length", type=cli.positive_int, default=128, help="Tokens per sequence.")
    training.add_argument(
        "--log_step_count_steps",
        type=cli.positive_int,
        default=20,
        help="Steps between loss records (the curves' points).",
    )
    built_in = parser.add_argument_group("built-in data (used unless your own task is given)")
    built_in.add_argument(
        "--hidden", type=cli.positive_int, default=128, help="Hidden size (BERT-Tiny: 128); heads = hidden / 64."
    )
    built_in.add_argument("--layers", type=cli.positive_int, default=2, help="Transformer blocks (BERT-Tiny: 2).")
    own = parser.add_argument_group("your own GLUE task (the first four together)")
    own.add_argument("--task_name", default=None, help="GLUE task name, e.g. MRPC.")
    own.add_argument("--data_dir", default=None, help="The task's directory of the GLUE download.")
    own.add_argument("--vocab_file", default=None, help="vocab.txt of the model.")
    own.add_argument("--bert_config_file", default=None, help="bert_config.json of the model.")
    own.add_argument(
        "--init_checkpoint", default=None, help="Pre-trained weights to fine-tune; None: train from scratch."
    )
    own.add_argument("--cased", action="store_true", help="A cased model: --do_lower_case=false.")
    return parser


def check_settings(args: argparse.Namespace) -> list[Contender]:
    """The contenders; every setting a user can get wrong is refused here, before anything is written."""
    if not args.minutes > 0:
        raise BenchError(f"--minutes must be positive, got {args.minutes:g}")
    if not args.max_epochs > 0 or not 0 <= args.warmup_proportion <= 1:
        raise BenchError(
            f"--max_epochs must be positive and --warmup_proportion in [0, 1], got {args.max_epochs:g} "
            f"and {args.warmup_proportion:g}"
        )
    if args.learning_rate is not None and not args.learning_rate > 0:
        raise BenchError(f"--learning_rate must be positive, got {args.learning_rate:g}")
    contenders = [Contender.parse(item.strip()) for item in args.contenders.split(",") if item.strip()]
    if not contenders:
        raise BenchError("--contenders is empty")
    names = [contender.run_name for contender in contenders]
    if len(set(names)) != len(names):
        raise BenchError(f"--contenders names a contender twice: {args.contenders}")
    check_processes(args.device, max(contender.processes for contender in contenders))
    given = [name for name in USER_DATA if getattr(args, name)]
    if (given and len(given) < len(USER_DATA)) or ((args.init_checkpoint or args.cased) and not given):
        missing = [f"--{name}" for name in USER_DATA if name not in given]
        raise BenchError(
            f"your own task needs --task_name, --data_dir, --vocab_file and --bert_config_file "
            f"together (--init_checkpoint and --cased go with them); missing {', '.join(missing)}"
        )
    if given:
        try:
            get_processor(args.task_name)
        except ValueError as error:
            raise BenchError(str(error)) from None
        for name in ("data_dir", "vocab_file", "bert_config_file"):
            if not os.path.exists(getattr(args, name)):
                raise BenchError(f"--{name} {getattr(args, name)}: no such file or directory")
    return contenders


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


def classifier_flags(args: argparse.Namespace, data: dict[str, str], learning_rate: float, run_dir: str) -> list[str]:
    """run_classifier's flags for every contender: train until the budget is spent, then score the dev set."""
    flags = [f"--{name}={value}" for name, value in data.items()]
    if args.init_checkpoint:
        flags.append(f"--init_checkpoint={args.init_checkpoint}")
    if args.device:
        flags.append(f"--device={args.device}")
    return flags + [
        "--do_train",
        "--do_eval",
        f"--do_lower_case={not args.cased}",
        f"--max_seq_length={args.max_seq_length}",
        f"--train_batch_size={args.train_batch_size}",
        "--eval_batch_size=64",
        f"--learning_rate={learning_rate}",
        f"--num_train_epochs={args.max_epochs}",
        f"--warmup_proportion={args.warmup_proportion}",
        f"--lr_scaling={args.lr_scaling}",
        f"--max_train_seconds={args.minutes * 60}",
        "--save_checkpoints_secs=0",
        f"--log_step_count_steps={args.log_step_count_steps}",
        f"--output_dir={run_dir}",
    ]


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


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
    contender: Contender,
    run_dir: str,
    dev_set: str,
    metric: str,
    budget_seconds: float,
    threads: int,
    wall_seconds: float,
) -> dict:
    train = read_json(os.path.join(run_dir, run_files.TRAIN_RESULTS))
    scores = read_json(os.path.join(run_dir, run_files.EVAL_RESULTS))
    steady = train["steady_sentences_per_second"]
    # Each log window's seq/s after the first (which holds the start-up): the run's rate, measured repeatedly.
    windows = window_rates(read_metrics(run_dir))
    return {
        "contender": contender.label,
        "variant": contender.variant.name,
        "processes": contender.processes,
        "independent": contender.independent,
        "threads_per_process": threads,
        "world_size": train["world_size"],
        "global_batch": train["train_batch_size"] * train["num_accumulation_steps"] * train["world_size"],
        "learning_rate": train["learning_rate"],
        "steps": train["steps"],
        "sentences": train["sentences"],
        "train_seconds": train["seconds"],
        "seq_per_s": train["sentences_per_second"],
        "steady_seq_per_s": steady,
        "sentences_per_budget_at_steady_rate": None if steady is None else steady * budget_seconds,
        **(spread_fields("window_seq_per_s", spread(windows)) if windows else {}),
        "budget_exhausted": train["budget_exhausted"],
        "metric": f"{dev_set}_{metric}",
        "metric_value": scores[f"{dev_set}_{metric}"],
        "dev_loss": scores[f"{dev_set}_loss"],
        "wall_seconds": wall_seconds,
        "run_dir": run_dir,
    }


def loss_curve(run_dir: str) -> tuple[list[float], list[float]]:
    """(seconds into training, mean loss of the window) of each log window of the run."""
    records = [record for record in read_metrics(run_dir) if record.get("loss") is not None]
    return [record["elapsed_s"] for record in records], [record["loss"] for record in records]


COLUMNS = [
    ("contender", "contender", ""),
    ("processes", "processes", "d"),
    ("threads each", "threads_per_process", "d"),
    ("global batch", "global_batch", "d"),
    ("steps", "steps", ",d"),
    ("sentences", "sentences", ",d"),
    ("vs first", "sentences_vs_first", ".2f"),
    ("steady seq/s", "steady_seq_per_s", ",.1f"),
    spread_column("seq/s per log window: median (min–max, CV)", "window_seq_per_s", ",.1f"),
    ("steady seq/s x budget", "sentences_per_budget_at_steady_rate", ",.0f"),
    ("train s", "train_seconds", ".1f"),
    ("budget ended it", "budget_exhausted", ""),
    ("dev metric", "metric_value", ".4f"),
    ("dev loss", "dev_loss", ".4f"),
]


def markdown(rows: list[dict], settings: dict) -> str:
    lines = [
        f"# Budget: {settings['minutes']:g} minutes of training per contender, then the dev set",
        "",
        f"- data: {settings['data']}; model: {settings['model']}",
        f"- seq {settings['max_seq_length']}, batch {settings['train_batch_size']} per process, peak learning "
        f"rate {settings['learning_rate']:g} (--lr_scaling {settings['lr_scaling']}), schedule of "
        f"{settings['max_epochs']:g} epochs, warm-up {settings['warmup_proportion']:g}",
        f"- dev metric: {rows[0]['metric']}; {settings['cores']} cores",
        "",
        markdown_table(rows, COLUMNS),
        "",
        "sentences: trained within the budget, every process's; vs first: as a share of the first contender's; "
        "seq/s per log window: over the windows after the first (CV = stdev / mean); steady seq/s x budget: the "
        "rate after start-up times the budget (the original's sentences per 20 minutes); train s: the "
        "training loop, the final checkpoint included.",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        contenders = check_settings(args)
        own_data = bool(args.task_name)
        output = BenchOutput(cli.output_dir(args, "budget"), "budget", argv, args.overwrite)
        run_dirs = {contender: os.path.join(output.directory, "runs", contender.run_name) for contender in contenders}
        for run_dir in run_dirs.values():
            if os.path.exists(run_dir):
                if not args.overwrite:
                    raise FileExistsError(
                        f"{run_dir} exists (a run there would resume): choose another --output_dir or pass --overwrite"
                    )
                shutil.rmtree(run_dir)
        if own_data:
            data = {name: getattr(args, name) for name in USER_DATA}
        else:
            data = write_built_in_data(os.path.join(output.directory, "data"), args.hidden, args.layers)
        processor = get_processor(data["task_name"])
        dev_set = next(iter(processor.dev))  # MNLI: matched
        metric_key = f"{dev_set}_{processor.main_metric}"
        learning_rate = args.learning_rate or (FINE_TUNING_LEARNING_RATE if own_data else BUILT_IN_LEARNING_RATE)
        budget_seconds = args.minutes * 60
        settings = {
            **vars(args),
            "learning_rate": learning_rate,
            "budget_seconds": budget_seconds,
            "cores": available_cores(),
            "data": f"GLUE {processor.name} in {data['data_dir']}" + ("" if own_data else " (the built-in pair task)"),
            "model": (
                f"{data['bert_config_file']}"
                + (f" from {args.init_checkpoint}" if args.init_checkpoint else " from scratch")
            ),
        }
        rows, curves = [], {}
        for contender, run_dir in run_dirs.items():
            threads = args.threads_per_process or max(1, settings["cores"] // contender.processes)
            print(
                f"{contender.label}: training for {args.minutes:g} min on {contender.processes} process(es) of "
                f"{threads} thread(s), then evaluating; log in {run_dir}/output.log",
                flush=True,
            )
            load = LoadWatch()  # per contender: a busy machine during one of them makes the race unfair
            wall = run_contender(contender, classifier_flags(args, data, learning_rate, run_dir), run_dir, threads)
            output.warn(load.busy(f"contender {contender.label}"))
            rows.append(
                contender_row(contender, run_dir, dev_set, processor.main_metric, budget_seconds, threads, wall)
            )
            curves[contender.label] = loss_curve(run_dir)
            print(
                f"  {rows[-1]['steps']:,} steps, {rows[-1]['sentences']:,} sentences in "
                f"{rows[-1]['train_seconds']:.1f} s; {metric_key} {rows[-1]['metric_value']:.4f} "
                f"({wall:.0f} s in all)",
                flush=True,
            )
        for row in rows:
            row["sentences_vs_first"] = row["sentences"] / max(1, rows[0]["sentences"])
        output.warn(
            noisy_warning(rows, "window_seq_per_s", lambda row: f"contender {row['contender']}", "training rate")
        )
        text = markdown(rows, settings)
        plots = {}
        if any(xs for xs, _ in curves.values()):
            plots["curves"] = line_plot(
                curves,
                "seconds of training",
                "training loss (mean of each log window)",
                f"{args.minutes:g} min budget: {processor.name}, seq {args.max_seq_length}",
            )
        print(output.write(settings, {"metric": metric_key, "rows": rows, "loss_curves": curves}, text, plots))
        print(
            f"\nwrote {output.path('.json')}, {output.path('.md')}"
            + (f" and {output.path('-curves.png')}" if plots else "")
        )

    return cli.run("bertbench bench budget", body)
