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

import argparse
import dataclasses
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from bertbench.bench import cli, workload
from bertbench.bench.output import BenchOutput, markdown_table, spread_column
from bertbench.bench.plots import line_plot
from bertbench.common import run_files
from bertbench.common.durable import read_json, write_atomically
from bertbench.common.flags import as_flags
from bertbench.common.noise import LoadWatch, noisy_warning, spread, spread_fields
from bertbench.model import sizes
from bertbench.model.config import BertConfig
from bertbench.runners import classifier as run_classifier
from bertbench.runners import squad as run_squad
from bertbench.runners.skeleton import TaskRunner
from bertbench.tasks import synthetic
from bertbench.training.checkpoint import list_checkpoints
from bertbench.training.config import RunConfig


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


def build_parser() -> argparse.ArgumentParser:
    parser = cli.parser_for("finetuning", __doc__.splitlines()[0])
    run = parser.add_argument_group("runs")
    run.add_argument(
        "--task",
        choices=tuple(TASKS),
        default="glue",
        help="glue: run_classifier on the built-in MRPC-sized task; squad: run_squad on the built-in SQuAD v2.0 files.",
    )
    cli.add_model_flag(
        run,
        None,
        " (its vocab_size becomes the built-in vocabulary's); default: tiny for glue, "
        "the demo's QA model (2 x 128, no dropout) for squad",
    )
    run.add_argument(
        "--variants",
        type=cli.comma_list(str),
        default=list(workload.ALL_VARIANTS),
        help="baseline, full, selective, every-K.",
    )
    run.add_argument("--rounds", type=cli.positive_int, default=3, help="Runs of each variant, interleaved.")
    run.add_argument(
        "--max_seq_length",
        type=cli.positive_int,
        default=None,
        help="Tokens per sequence (default: 128 for glue, 48 for squad).",
    )
    run.add_argument("--train_batch_size", type=cli.positive_int, default=32, help="Sequences per step.")
    run.add_argument(
        "--learning_rate",
        type=float,
        default=1e-3,
        help="Peak learning rate (the built-in tasks train a model from scratch).",
    )
    run.add_argument(
        "--num_train_epochs",
        type=float,
        default=None,
        help="Epochs of each run (default: 1 for glue, 6 for squad, as the demo's QA step).",
    )
    run.add_argument(
        "--max_train_samples", type=cli.positive_int, default=None, help="Train on the first N examples only."
    )
    run.add_argument(
        "--save_checkpoints_secs",
        type=float,
        default=2.0,
        help="Timed saves of every run, short so that each run saves several times.",
    )
    run.add_argument("--no_resume", action="store_true", help="Skip the resume-after-SIGKILL figure.")
    run.add_argument("--seed", type=int, default=12345, help="Seed of every run (the same weights at the start).")
    run.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: CUDA when available).")
    return parser


def check_settings(args: argparse.Namespace) -> list[workload.Variant]:
    variants = [workload.Variant.parse(name) for name in args.variants]
    cli.device(args.device)  # an unusable --device fails here, not in the first run
    for name, value in (
        ("--num_train_epochs", args.num_train_epochs),
        ("--learning_rate", args.learning_rate),
        ("--save_checkpoints_secs", args.save_checkpoints_secs),
    ):
        if value is not None and not value > 0:
            raise workload.BenchError(f"{name} must be positive, got {value}")
    return variants


def seq_length(args: argparse.Namespace) -> int:
    return args.max_seq_length or TASKS[args.task].max_seq_length


def epochs(args: argparse.Namespace) -> float:
    return args.num_train_epochs or TASKS[args.task].epochs


def bert_config(args: argparse.Namespace) -> BertConfig:
    """The model of the runs: --model, or the task's built-in one; with the built-in vocabulary."""
    seq, vocab_size = seq_length(args), len(synthetic.vocabulary())
    if args.model is not None:
        return dataclasses.replace(workload.bert_config(args.model, seq), vocab_size=vocab_size)
    return BertConfig(**{**TASKS[args.task].model, "max_position_embeddings": max(seq, 64), "vocab_size": vocab_size})


def write_inputs(root: str, args: argparse.Namespace, config: BertConfig) -> dict:
    """The built-in data, vocab.txt and `config` as bert_config.json under `root`; the flags a run of the task reads
    them by."""
    config_file = os.path.join(root, "bert_config.json")
    write_atomically(config_file, json.dumps(dataclasses.asdict(config), indent=2) + "\n")
    values = {
        "vocab_file": synthetic.write_vocab(root),
        "bert_config_file": config_file,
        "max_seq_length": seq_length(args),
        "train_batch_size": args.train_batch_size,
        "learning_rate": args.learning_rate,
        "num_train_epochs": epochs(args),
        "seed": args.seed,
        "device": args.device,
        "log_step_count_steps": 1000000,
        "max_train_samples": args.max_train_samples,
    }
    if args.task == "glue":
        values.update(
            task_name="MRPC", data_dir=synthetic.write_glue_task(os.path.join(root, "glue"), "MRPC"), do_eval=True
        )
    else:
        train_file, dev_file = synthetic.write_squad(os.path.join(root, "squad"), "2.0", seed=args.seed)
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
        raise workload.BenchRunFailed(f"{spec.name} failed:\n{log.getvalue()}")
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


def rounds(args: argparse.Namespace, variants: Sequence[workload.Variant], root: str, inputs: dict) -> list[dict]:
    spec, scores = TASKS[args.task].spec, TASKS[args.task].scores
    runs: dict[str, list[dict]] = {variant.name: [] for variant in variants}
    for round_index in range(args.rounds):
        for variant in variants if round_index % 2 == 0 else list(reversed(variants)):
            out = os.path.join(root, "runs", f"{variant.file_name}-{round_index}")
            values = {
                **inputs,
                **variant.runner_values(),
                "do_train": True,
                "output_dir": out,
                "save_checkpoints_secs": args.save_checkpoints_secs,
            }
            run = train_once(spec, values, scores)
            runs[variant.name].append(run)
            print(
                f"  round {round_index + 1} {variant.name:<10} {run['steady_seq_per_s']:8.1f} seq/s  "
                + "  ".join(f"{name} {run[name]:.3f}" for name in scores),
                flush=True,
            )
    rows = []
    for variant in variants:
        done = runs[variant.name]
        row = {"variant": variant.name, "runs": done}
        for key in ("steady_seq_per_s", "seconds_per_save", "checkpoint_bytes", *scores):
            row.update(spread_fields(key, spread([run[key] for run in done])))
        rows.append(row)
    first = rows[0]["steady_seq_per_s"]
    for row in rows:
        row["vs_first_variant"] = row["steady_seq_per_s"] / first
        row["save_share_at_default"] = row["seconds_per_save"] / DEFAULT_SAVE_SECONDS
    return rows


def resume_after_sigkill(args: argparse.Namespace, variant: workload.Variant, root: str, inputs: dict) -> dict:
    """Kill a training process after its first checkpoint; time the same command from launch to training again."""
    spec = TASKS[args.task].spec
    out = os.path.join(root, "killed")
    values = {
        **inputs,
        **variant.runner_values(),
        "do_train": True,
        "output_dir": out,
        "save_checkpoints_steps": 10,
        "save_checkpoints_secs": 0,
    }
    command = [sys.executable, "-m", f"bertbench.{spec.name}", *as_flags(values)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not list_checkpoints(out):
        if process.poll() is not None:
            raise workload.BenchRunFailed(
                f"{spec.name} ended (status {process.returncode}) before its first checkpoint: {' '.join(command)}"
            )
        time.sleep(0.01)
    process.kill()
    if process.wait() == 0 or os.path.exists(os.path.join(out, run_files.TRAIN_RESULTS)):
        raise workload.BenchRunFailed(
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
        raise workload.BenchRunFailed(f"the resumed {spec.name} failed:\n{''.join(lines[-20:])}")
    train = read_json(os.path.join(out, run_files.TRAIN_RESULTS))
    return {
        "variant": variant.name,
        "killed_after_checkpoint_step": killed_at,
        "resumed_from": train["resumed_from"],
        "restore_seconds": train["restore_seconds"],
        "launch_to_training_seconds": to_training,
    }


def markdown(args: argparse.Namespace, config: BertConfig, rows: list[dict], resume: dict | None) -> str:
    scores = TASKS[args.task].scores
    table = [
        dict(
            row,
            **spread_fields("save_ms", spread([run["seconds_per_save"] * 1e3 for run in row["runs"]])),
            save_mib=row["checkpoint_bytes"] / 2**20,
        )
        for row in rows
    ]
    columns = [
        ("variant", "variant", ""),
        spread_column("steady seq/s: median (min–max, CV)", "steady_seq_per_s", ".1f"),
        (f"vs {rows[0]['variant']}", "vs_first_variant", ".3f"),
        *[spread_column(title, name, ".3f") for name, title in scores.items()],
        spread_column("ms per save", "save_ms", ".1f"),
        ("checkpoint MiB", "save_mib", ".1f"),
        (f"save cost at {DEFAULT_SAVE_SECONDS:g} s", "save_share_at_default", ".4%"),
    ]
    spec = TASKS[args.task].spec
    lines = [
        f"# Fine-tuning through {spec.name}: {args.model or 'built-in'} model ({config.num_hidden_layers} x "
        f"{config.hidden_size}), built-in {args.task} data, seq {seq_length(args)}, batch "
        f"{args.train_batch_size}, {epochs(args):g} epochs",
        "",
        f"{args.rounds} rounds per variant, interleaved; median, range and CV (stdev / mean) over the rounds.",
        "",
        markdown_table(table, columns),
    ]
    if resume is not None:
        lines += [
            "",
            f"Resume after SIGKILL ({resume['variant']}, killed after the step-"
            f"{resume['killed_after_checkpoint_step']} checkpoint): training again "
            f"{resume['launch_to_training_seconds']:.2f} s after launch, of which the restore took "
            f"{resume['restore_seconds'] * 1e3:.0f} ms.",
        ]
    return "\n".join(lines)


def plot(args: argparse.Namespace, rows: list[dict]):
    """Each run's steady seq/s by round, a line per variant: the spread and any drift at a glance."""
    series = {
        row["variant"]: (list(range(1, len(row["runs"]) + 1)), [run["steady_seq_per_s"] for run in row["runs"]])
        for row in rows
    }
    return line_plot(
        series,
        "round",
        "steady sentences / s",
        f"{TASKS[args.task].spec.name}, {args.model or 'built-in'} model, built-in {args.task} data",
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)

    def body() -> None:
        variants = check_settings(args)
        config = bert_config(args)  # a bad --model fails before anything runs
        output = BenchOutput(cli.output_dir(args, "finetuning"), "finetuning", argv, args.overwrite)
        with tempfile.TemporaryDirectory() as root:
            inputs = write_inputs(root, args, config)
            load = LoadWatch()
            rows = rounds(args, variants, root, inputs)
            output.warn(load.busy("the rounds"))
            output.warn(noisy_warning(rows, "steady_seq_per_s", lambda row: row["variant"], "rounds"))
            resume = None if args.no_resume else resume_after_sigkill(args, variants[0], root, inputs)
        text = markdown(args, config, rows, resume)
        print(
            output.write(
                vars(args),
                {
                    "task": args.task,
                    "runner": TASKS[args.task].spec.name,
                    "model_config": dataclasses.asdict(config),
                    "rows": rows,
                    "resume_after_sigkill": resume,
                },
                text,
                {"seq-per-s": plot(args, rows)},
            )
        )
        print(f"\nwrote {output.path('.json')}, {output.path('.md')} and plots")

    return cli.run("bertbench bench finetuning", body)
