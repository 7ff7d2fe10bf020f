"""What the task runners (run_classifier, run_squad) share: Google's common flags, the run directory's record,
model and estimator set-up, and turning user errors into one line and an exit status.

A run directory (`--output_dir`) records its settings in bertbench_run.json when training starts. A later command
on the same directory takes every flag it leaves out from there (so `eval.sh RESULTS_DIR` needs nothing else, and
the same command resumes), and refuses a flag that contradicts the recorded run: continuing a run with another
learning rate or model would give weights that belong to neither.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from bertbench import __version__
from bertbench.checkpoint import CheckpointError
from bertbench.config import BertConfig, ConfigError
from bertbench.distributed import Distributed
from bertbench.durable import write_text_atomically
from bertbench.errors import UsageError, run_command, signal_status
from bertbench.flags import FlagParser
from bertbench.batches import ShuffledBatches
from bertbench.estimator import Estimator, TrainingDivergedError
from bertbench.train_state import RESTORE, WARM_START, RunStart, decide_start, seed_everything
from bertbench.train_stats import TrainResult
from bertbench.training_config import PRECISIONS, RunConfig, TrainConfig
from bertbench.models import add_model_arguments, model_from_args
from bertbench.tf_checkpoint import CheckpointError as TFCheckpointError
from bertbench.tokenization import BertTokenizer, VocabError
from bertbench.weights import WeightsError, load_pretrained

RUN_RECORD = "bertbench_run.json"
# --lr_scaling: the factor on --learning_rate for a number of processes.
LR_SCALINGS = {"none": lambda processes: 1.0, "linear": float, "sqrt": math.sqrt}


# Errors a user's input causes (exit status 2, see bertbench.errors), each naming its file or flag; and the runtime
# failures of a run (exit status 1).
INPUT_ERRORS = (ConfigError, VocabError, WeightsError, CheckpointError, TFCheckpointError)
RUNTIME_FAILURES = (TrainingDivergedError, torch.cuda.OutOfMemoryError)


def add_common_flags(parser: FlagParser, default_learning_rate: float, default_max_seq_length: int = 128) -> None:
    """Flags of Google's run_classifier.py / run_squad.py and NVIDIA's additions, plus bertbench's."""
    files = parser.add_argument_group("model files (Google's flag names)")
    parser.flag(files, "bert_config_file", None, "bert_config.json of the pre-trained model (Google or HF format).")
    parser.flag(files, "vocab_file", None, "vocab.txt the model was trained with.")
    parser.flag(files, "init_checkpoint", None, "Warm-start weights: a TF1 bert_model.ckpt, an HF directory or "
                                                "file, or a bertbench checkpoint or run directory. Ignored when "
                                                "output_dir holds a checkpoint: that run resumes.")
    parser.bool_flag(files, "do_lower_case", True, "Lower-case and strip accents (uncased models).")
    parser.flag(files, "output_dir", None, "Run directory: checkpoints, logs, results. Required.")

    train = parser.add_argument_group("training")
    parser.bool_flag(train, "do_train", False, "Train (resuming from output_dir's newest checkpoint if any).")
    parser.bool_flag(train, "do_predict", False, "Write predictions for the test set(s).")
    parser.flag(train, "max_seq_length", default_max_seq_length, "Tokens per sequence after WordPiece, padded or "
                                                                  "truncated.",
                type=int)
    parser.flag(train, "train_batch_size", 32, "Sequences per micro-batch per process.", type=int)
    parser.flag(train, "predict_batch_size", 8, "Sequences per prediction batch.", type=int)
    parser.flag(train, "learning_rate", default_learning_rate, "Peak learning rate.", type=float)
    parser.flag(train, "num_train_epochs", 3.0, "Epochs of training data.", type=float)
    parser.flag(train, "warmup_proportion", 0.1, "Share of the steps in linear warm-up.", type=float)
    parser.flag(train, "decay", "linear", "Decay after warm-up: linear or poly.", choices=("linear", "poly"))
    parser.flag(train, "weight_decay", 0.01, "Decoupled weight decay (not on biases and LayerNorm).", type=float)
    parser.flag(train, "optimizer_type", "adam", "adam (AdamW) or lamb (NVIDIA's names).",
                choices=("adam", "adamw", "lamb"))
    parser.flag(train, "num_accumulation_steps", 1, "Micro-batches per optimizer step (NVIDIA's name).", type=int)
    parser.flag(train, "max_train_samples", None, "Train on the first N examples only, for quick runs.", type=int)
    parser.flag(train, "max_train_seconds", None, "Time budget of this command's training loop (checkpoint saves "
                                                  "included): once spent, save a checkpoint and go on to "
                                                  "evaluation/prediction, exit status 0. The learning-rate schedule "
                                                  "stays that of --num_train_epochs; the budget only cuts it short. "
                                                  "Not recorded: a resumed run has only the budget its command gives.",
                type=float)
    parser.flag(train, "seed", 42, "Seed of weights, data order and dropout.", type=int)

    speed = parser.add_argument_group("precision and speed")
    parser.flag(speed, "precision", None, "fp32, fp16 or bf16 (default fp32, or fp16 with --amp).",
                choices=PRECISIONS)
    parser.bool_flag(speed, "amp", False, "Mixed precision fp16 with dynamic loss scaling (NVIDIA's flag).")
    parser.bool_flag(speed, "use_fp16", False, "Same as --amp (older NVIDIA scripts).")
    parser.bool_flag(speed, "use_xla", False, "Compile the training step: torch.compile stands in for XLA.")
    parser.flag(speed, "device", None, "cpu, cuda or cuda:N (default: CUDA when available).")

    scale = parser.add_argument_group("processes and nodes (under torchrun / bertbench launch)")
    parser.bool_flag(scale, "horovod", False, "Accepted for NVIDIA's scripts: processes come from the launcher "
                                              "(torchrun), see the README.")
    parser.flag(scale, "lr_scaling", "none", "Multiply --learning_rate by the number of processes N: none, linear "
                                             "(x N, as the original's Horovod runs) or sqrt (x sqrt(N)).",
                choices=LR_SCALINGS)
    parser.bool_flag(scale, "sync_gradients", True, "All-reduce gradients every step (data parallel). "
                                                    "--no_sync_gradients: independent workers, each training on "
                                                    "its shard alone; the worker with the best dev metric is kept.")
    if "sync_gradients" not in parser.omit:
        scale.add_argument("--no_sync_gradients", dest="sync_gradients", action="store_false",
                           help=argparse.SUPPRESS)

    checkpoints = parser.add_argument_group("checkpoints and logs (tf.estimator.RunConfig)")
    parser.flag(checkpoints, "save_checkpoints_secs", 1200.0, "Save every this many seconds of wall-clock time; "
                                                              "0 turns the timer off.", type=float)
    parser.flag(checkpoints, "save_checkpoints_steps", None, "Save every this many steps as well.", type=int)
    parser.flag(checkpoints, "keep_checkpoint_max", 1, "Checkpoints kept.", type=int)
    parser.flag(checkpoints, "log_step_count_steps", 100, "Log loss and throughput every this many steps.",
                type=int)
    add_model_arguments(parser)  # --modeling, --recompute-policy, --recompute-every: these keep real defaults


# Flags whose value defines the trained weights: a resumed or re-evaluated run must not change them.
RUN_DEFINING = ("do_lower_case", "max_seq_length", "train_batch_size", "learning_rate", "num_train_epochs",
                "warmup_proportion", "decay", "weight_decay", "optimizer_type", "num_accumulation_steps",
                "max_train_samples", "seed", "lr_scaling", "sync_gradients")
# Flags that are actions, say where things are or hold for one command only, not what the run is; they are not
# recorded.
NOT_RECORDED = ("output_dir", "do_train", "do_eval", "do_predict", "max_train_seconds")


@dataclasses.dataclass
class RunRecord:
    """bertbench_run.json: which runner made the run directory, its flags, model config and process count."""

    path: str
    runner: str
    args: dict[str, Any]
    bert_config: dict[str, Any]
    world_size: int

    @classmethod
    def read(cls, output_dir: str) -> "RunRecord | None":
        path = os.path.join(output_dir, RUN_RECORD)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            return cls(path=path, runner=data["runner"], args=data["args"], bert_config=data["bert_config"],
                       world_size=data["world_size"])
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise UsageError(f"{path}: not valid JSON ({error})") from None
        except (KeyError, TypeError) as error:
            raise UsageError(f"{path}: not a bertbench run record (missing {error})") from None

    def write(self) -> None:
        write_json(self.path, {"runner": self.runner, "bertbench_version": __version__, "args": self.args,
                               "bert_config": self.bert_config, "world_size": self.world_size})


def parse_flags(parser: FlagParser, argv: Sequence[str] | None, runner: str,
                run_defining: Sequence[str]) -> tuple[argparse.Namespace, RunRecord | None]:
    """The command's flags, the run directory's recorded flags for those it leaves out, then the defaults."""
    given = vars(parser.parse_args(argv))
    if not given.get("output_dir"):
        parser.error("--output_dir is required")
    record = RunRecord.read(given["output_dir"])
    recorded = {}
    if record is not None:
        if record.runner != runner:
            raise UsageError(f"{record.path}: holds a {record.runner} run, not a {runner} run; use another "
                             "--output_dir")
        for name in run_defining:
            if name in given and name in record.args and given[name] != record.args[name]:
                raise UsageError(f"{record.path}: this run was made with --{name}={record.args[name]}, the command "
                                 f"gives {given[name]}; use a new --output_dir, or leave the flag out to continue "
                                 "the run")
        recorded = {name: value for name, value in record.args.items() if name in parser.defaults}
    args = argparse.Namespace(**{**parser.defaults, **recorded, **given})
    for name in ("bert_config_file", "vocab_file"):
        if name in parser.defaults and getattr(args, name) is None:
            parser.error(f"--{name} is required")
    for name in ("max_seq_length", "train_batch_size", "predict_batch_size", "eval_batch_size", "max_train_samples",
                 "num_train_epochs", "max_train_seconds"):
        value = getattr(args, name, None)
        if value is not None and value <= 0:
            parser.error(f"--{name} must be positive, got {value}")
    return args, record


def resolve_precision(args: argparse.Namespace) -> str:
    if args.amp or args.use_fp16:
        if args.precision not in (None, "fp16"):
            raise UsageError(f"--amp/--use_fp16 asks for fp16 but --precision is {args.precision}")
        return "fp16"
    return args.precision or "fp32"


def load_config(args: argparse.Namespace) -> BertConfig:
    """The model config, checked against --max_seq_length."""
    config = BertConfig.from_json_file(args.bert_config_file)
    if args.max_seq_length > config.max_position_embeddings:
        raise UsageError(f"{args.bert_config_file}: max_position_embeddings is {config.max_position_embeddings}, "
                         f"so --max_seq_length {args.max_seq_length} cannot be used")
    return config


def load_config_and_tokenizer(args: argparse.Namespace) -> tuple[BertConfig, BertTokenizer]:
    """The model config and tokenizer, checked against each other and against --max_seq_length."""
    config = load_config(args)
    tokenizer = BertTokenizer.from_vocab_file(args.vocab_file, do_lower_case=args.do_lower_case)
    if tokenizer.vocab_size > config.vocab_size:
        raise UsageError(f"{args.vocab_file}: {tokenizer.vocab_size} tokens, but {args.bert_config_file} has "
                         f"vocab_size {config.vocab_size}: this vocab does not belong to this model")
    return config, tokenizer


def check_record(record: RunRecord | None, config: BertConfig, args: argparse.Namespace, dist: Distributed) -> None:
    """A recorded run must continue with the same model and, when training, the same number of processes."""
    if record is None:
        return
    current = dataclasses.asdict(config)
    for key in sorted(set(current) | set(record.bert_config)):
        if current.get(key) != record.bert_config.get(key):
            raise UsageError(f"{record.path}: this run's model has {key}={record.bert_config.get(key)}, "
                             f"{args.bert_config_file} has {current.get(key)}; use a new --output_dir")
    if args.do_train and record.world_size != dist.world_size:
        raise UsageError(f"{record.path}: this run was trained by {record.world_size} process(es), this command "
                         f"has {dist.world_size}; the global batch and data order would change")


def write_record(record: RunRecord | None, runner: str, args: argparse.Namespace, config: BertConfig,
                 dist: Distributed) -> None:
    if record is not None or not dist.is_main:
        return
    os.makedirs(args.output_dir, exist_ok=True)
    recorded = {name: value for name, value in vars(args).items() if name not in NOT_RECORDED}
    RunRecord(os.path.join(args.output_dir, RUN_RECORD), runner, recorded, dataclasses.asdict(config),
              dist.world_size).write()


def build_model(args: argparse.Namespace, task: str, config: BertConfig, dist: Distributed,
                log: Callable[[str], None], continue_phase: bool = False, **head_kwargs) -> tuple[nn.Module, RunStart]:
    """The task model from the chosen modeling module, and where the run starts, decided once here
    (train_state.decide_start): training resumes output_dir's checkpoint, continues an earlier phase
    (`continue_phase`), warm-starts from --init_checkpoint or starts afresh; evaluation and prediction restore the
    run's checkpoint or warm-start from --init_checkpoint. A warm start's weights are loaded here."""
    start = decide_start(args.output_dir, training=args.do_train, init_checkpoint=args.init_checkpoint,
                         continue_phase=continue_phase, dist=dist,
                         independent_workers=dist.enabled and not getattr(args, "sync_gradients", True), log=log)
    seed_everything(args.seed)
    model = model_from_args(args, task, config, **head_kwargs)
    if start.kind == WARM_START:
        log(str(load_pretrained(model, start.checkpoint, config)))
    return model, start


def restore_for_inference(estimator: Estimator, start: RunStart) -> None:
    """Without training, evaluation and prediction score the run's checkpoint (or the warm start's weights)."""
    if start.kind == RESTORE:
        estimator.restore(start.checkpoint)


def build_estimator(args: argparse.Namespace, model: nn.Module, dist: Distributed,
                    num_train_steps: int | None) -> Estimator:
    try:
        run_config = RunConfig(
            model_dir=args.output_dir,
            save_checkpoints_secs=args.save_checkpoints_secs if args.save_checkpoints_secs > 0 else None,
            save_checkpoints_steps=args.save_checkpoints_steps, keep_checkpoint_max=args.keep_checkpoint_max,
            log_step_count_steps=args.log_step_count_steps, seed=args.seed)
        train_config = None if num_train_steps is None else TrainConfig(
            num_train_steps=num_train_steps, learning_rate=scaled_learning_rate(args, dist),
            warmup_proportion=args.warmup_proportion, decay=args.decay,
            decay_power=getattr(args, "poly_power", 1.0),
            optimizer="lamb" if args.optimizer_type == "lamb" else "adamw", weight_decay=args.weight_decay,
            gradient_accumulation_steps=args.num_accumulation_steps, precision=resolve_precision(args),
            compile=args.use_xla, sync_gradients=getattr(args, "sync_gradients", True),
            max_train_seconds=args.max_train_seconds)
    except ValueError as error:
        raise UsageError(str(error)) from None
    return Estimator(model, run_config, train_config, dist)


def scaled_learning_rate(args: argparse.Namespace, dist: Distributed) -> float:
    """--learning_rate times the --lr_scaling factor for this many processes."""
    return args.learning_rate * LR_SCALINGS[args.lr_scaling](dist.world_size)


@dataclasses.dataclass
class WorkerScore:
    """How independent workers (--no_sync_gradients) are compared: `score()` is this rank's model's dev figure."""

    name: str  # e.g. "dev_acc", "f1"
    score: Callable[[], float]


def check_independent_workers(args: argparse.Namespace, needs: str) -> None:
    """--no_sync_gradients keeps the best worker by a dev metric, so training needs the flag that provides it."""
    if args.do_train and not args.sync_gradients and not getattr(args, needs):
        raise UsageError(f"--no_sync_gradients keeps the worker with the best dev metric: it needs --{needs}")


def train_and_report(estimator: Estimator, args: argparse.Namespace, record: RunRecord | None, runner: str,
                     config: BertConfig, dist: Distributed, features: Mapping[str, Any], description: str,
                     log: Callable[[str], None], start: RunStart,
                     worker_score: WorkerScore | None = None) -> int | None:
    """Record the run, train on `features` (resuming from output_dir's newest checkpoint) and report; independent
    workers then keep the best by `worker_score`. Returns the exit status of a run a signal stopped, None for a
    finished one."""
    write_record(record, runner, args, config, dist)
    mode = "independent workers" if estimator.independent_workers else "processes"
    log(f"***** Training {description}, {estimator.train_config.num_train_steps} steps, batch "
        f"{args.train_batch_size} x {args.num_accumulation_steps} x {dist.world_size} {mode}, {args.modeling} "
        f"model, {resolve_precision(args)} on {dist.device}, learning rate "
        f"{estimator.train_config.learning_rate:g}"
        + (f", time budget {args.max_train_seconds:g} s" if args.max_train_seconds is not None else "") + " *****")
    result = estimator.train(ShuffledBatches(features, args.train_batch_size, args.seed, dist.rank, dist.world_size),
                             start)
    selection = {}
    if result.interrupted_by is None and estimator.independent_workers:
        best, scores = estimator.keep_best_worker(worker_score.score)
        log(f"independent workers' {worker_score.name}: "
            + ", ".join(f"worker {rank} {score:.4f}" for rank, score in enumerate(scores))
            + f"; keeping worker {best}")
        selection = {"selection_metric": worker_score.name, "worker_scores": scores, "selected_worker": best}
    report_training(result, args, dist, log, {"learning_rate": estimator.train_config.learning_rate, **selection})
    return interrupted_status(result)


def num_train_steps(num_sequences: int, args: argparse.Namespace, dist: Distributed) -> int:
    """Google's count: training sequences / global batch x epochs, rounded down."""
    global_batch = args.train_batch_size * args.num_accumulation_steps * dist.world_size
    steps = int(num_sequences / global_batch * args.num_train_epochs)
    if steps < 1:
        raise UsageError(f"{num_sequences} training sequences make no full step of {global_batch} sequences "
                         f"({args.train_batch_size} x {args.num_accumulation_steps} accumulation x "
                         f"{dist.world_size} processes) in {args.num_train_epochs} epochs")
    return steps


def write_json(path: str, data: Mapping[str, Any]) -> None:
    write_text_atomically(path, json.dumps(data, indent=2) + "\n")


def report_training(result: TrainResult, args: argparse.Namespace, dist: Distributed, log: Callable[[str], None],
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """train_results.json and the summary NVIDIA's scripts print: sentences/s with and without the start-up."""
    summary = {**dataclasses.asdict(result), "sentences_per_20_minutes": result.sentences_per_20_minutes,
               "world_size": dist.world_size, "nodes": dist.nodes,
               "device": str(dist.device), "modeling": args.modeling,
               "recompute_policy": args.recompute_policy if args.modeling == "recompute" else None,
               "precision": resolve_precision(args), "use_xla": args.use_xla,
               "train_batch_size": args.train_batch_size, "num_accumulation_steps": args.num_accumulation_steps,
               "max_seq_length": args.max_seq_length, "lr_scaling": args.lr_scaling,
               "sync_gradients": getattr(args, "sync_gradients", True), **(extra or {})}
    if dist.is_main:
        write_json(os.path.join(args.output_dir, "train_results.json"), summary)
    log("***** Training summary *****")
    log(f"  steps {result.steps} (global step {result.global_step}), {result.sentences} sentences in "
        f"{result.seconds:.1f} s, {result.checkpoint_saves} checkpoint saves ({result.checkpoint_seconds:.2f} s)")
    log(f"  throughput with overhead: {result.sentences_per_second:.1f} sentences/s")
    if result.steady_sentences_per_second is not None:
        log(f"  throughput (steady, {result.steady_steps} steps, no checkpoint saves): "
            f"{result.steady_sentences_per_second:.1f} sentences/s = {result.sentences_per_20_minutes:,.0f} "
            f"sentences per 20 minutes")
    return summary


def interrupted_status(result: TrainResult) -> int | None:
    """The shell's exit status for a run a signal stopped (128 + signal number), None for a finished run."""
    return None if result.interrupted_by is None else signal_status(result.interrupted_by)


def report_eval(output_dir: str, title: str, results: Mapping[str, Any], header: Mapping[str, Any], is_main: bool,
                log: Callable[[str], None]) -> None:
    """Log the figures and (rank 0) write eval_results.txt (Google's `key = value` lines) and eval_results.json
    (header first: what was scored)."""
    log(f"***** Eval results ({title}) *****")
    lines = [f"{key} = {results[key]}" for key in sorted(results)]
    for line in lines:
        log(f"  {line}")
    if is_main:
        os.makedirs(output_dir, exist_ok=True)
        write_text_atomically(os.path.join(output_dir, "eval_results.txt"), "".join(f"{line}\n" for line in lines))
        write_json(os.path.join(output_dir, "eval_results.json"), {**header, **results})


def run_main(program: str, parser: FlagParser, argv: Sequence[str] | None, runner: str,
             run_defining: Sequence[str], run: Callable[[argparse.Namespace, RunRecord | None], int],
             extra_errors: tuple[type[Exception], ...] = ()) -> int:
    """A runner's main: parse the flags (see parse_flags) and run, with bertbench.errors' exit-code policy (input
    errors: INPUT_ERRORS and the task's own `extra_errors`)."""
    def body() -> int:
        return run(*parse_flags(parser, argv, runner, run_defining))
    return run_command(program, body, input_errors=INPUT_ERRORS + extra_errors, runtime_errors=RUNTIME_FAILURES)
