"""What the task runners share: their configuration (settings dataclasses whose fields are the flags, and the one
table of Google's and NVIDIA's names for RunConfig and TrainConfig fields), the run directory's record, model and
estimator set-up, the fine-tuning runners' one skeleton (`fine_tune` over a TaskSpec), and the path from an error to
its exit status (bertbench.common.errors).

A run directory (`--output_dir`) records its settings in bertbench_run.json when training starts. A later command
on the same directory takes every flag it leaves out from there (so `eval.sh RESULTS_DIR` needs nothing else, and
the same command resumes), and refuses a flag that contradicts the recorded run: continuing a run with another
learning rate or model would give weights that belong to neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, TextIO

import torch
from torch import nn

from bertbench import __version__
from bertbench.training import optim, progress
from bertbench.training.batches import ShuffledBatches
from bertbench.training.checkpoint import (CheckpointError, checkpoint_step, holds_training_state, latest_checkpoint,
                                  remove_temporary_files)
from bertbench.model.config import BertConfig, ConfigError
from bertbench.training.devices import physical_memory_bytes
from bertbench.training.distributed import Distributed, job_from_environment
from bertbench.common.durable import write_text_atomically
from bertbench.common.errors import UsageError, one_line, run_command, signal_status
from bertbench.training.loop import Estimator, TrainingDivergedError
from bertbench.common.flags import FlagName, FlagParser, FrozenNamespace, IgnoredFlag, add_dataclass_flags, build, setting
from bertbench.model.factory import add_model_arguments, model_from_args, path_of, unrunnable
from bertbench.runners.run_lock import RunDirectoryBusy, RunLock
from bertbench.weights.tf_checkpoint import CheckpointError as TFCheckpointError
from bertbench.weights.tf_checkpoint import TFCheckpoint
from bertbench.tasks.tokenization import BertTokenizer, VocabError
from bertbench.training.state import RESTORE, WARM_START, RunStart, decide_start, seed_everything
from bertbench.training.stats import TrainResult, run_totals
from bertbench.training.step import runnable_config
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.weights.hf import WeightsError, flags_from_hf_directory, load_pretrained

RUN_RECORD = "bertbench_run.json"
# --lr_scaling: the factor on --learning_rate for a number of processes.
LR_SCALINGS = {"none": lambda processes: 1.0, "linear": float, "sqrt": math.sqrt}
# NVIDIA's --optimizer_type names for TrainConfig.optimizer.
OPTIMIZER_TYPES = {"adam": "adamw", "adamw": "adamw", "lamb": "lamb", "nvlamb": "nvlamb"}

# Google's, NVIDIA's and tf.estimator's flag names for RunConfig and TrainConfig fields, and how a flag's value becomes
# the field's; a field not named here is the flag of its own name. What depends on the processes or the phase (the
# steps, --lr_scaling's factor, a warm-up given in steps) is derived when the TrainConfig is built (build_estimator).
FLAG_NAMES = (
    FlagName("output_dir", RunConfig, "model_dir"),
    FlagName("save_checkpoints_secs", RunConfig, "save_checkpoints_secs", value=lambda secs: secs if secs > 0 else None),
    FlagName("save_checkpoints_steps", RunConfig, "save_checkpoints_steps", aliases=("num_steps_per_checkpoint",)),
    FlagName("log_step_count_steps", RunConfig, "log_step_count_steps", aliases=("log_freq",)),
    FlagName("num_accumulation_steps", TrainConfig, "gradient_accumulation_steps"),
    FlagName("gradient_accumulation_steps", TrainConfig, "gradient_accumulation_steps",
             note="NVIDIA's PyTorch name, with its meaning of --train_batch_size: the batch of one optimizer step, "
                  "cut into this many micro-batches (it must divide it)."),
    FlagName("optimizer_type", TrainConfig, "optimizer", value=OPTIMIZER_TYPES.__getitem__,
             choices=tuple(OPTIMIZER_TYPES), default="adam", note="adam is AdamW (NVIDIA's names)."),
    FlagName("poly_power", TrainConfig, "decay_power"),
    FlagName("use_xla", TrainConfig, "compile"),
    FlagName("precision", TrainConfig, "precision", default=None, note="Default fp32, or fp16 with --amp."),
    FlagName("amp", TrainConfig, "precision", value=lambda on: "fp16" if on else "fp32", type=bool, default=False,
             aliases=("fp16",), note="Mixed precision: --precision=fp16 (NVIDIA's flag; also --fp16)."),
    FlagName("use_fp16", TrainConfig, "precision", value=lambda on: "fp16" if on else "fp32", type=bool,
             default=False, note="Same as --amp (older NVIDIA scripts)."),
    FlagName("sync_gradients", TrainConfig, "sync_gradients",
             note="With --no_sync_gradients the runners keep the worker with the best dev metric."),
)
# Google's and NVIDIA's flags that mean nothing here: a command that gives one runs, and is told why it is ignored.
_NO_TPU = "there is no TPU here: bertbench runs on CPUs and CUDA GPUs (--device)"
_SQUAD, _PRETRAINING = ("run_squad",), ("run_pretraining",)
IGNORED_FLAGS = (
    IgnoredFlag("use_tpu", _NO_TPU, bool, refuse=lambda on: "bertbench runs on CPUs and CUDA GPUs, not TPUs; leave "
                                                              "the flag out or give --use_tpu=false" if on else None),
    *(IgnoredFlag(name, f"{_NO_TPU} (Google's TPU settings)", kind)
      for name, kind in (("tpu_name", str), ("tpu_zone", str), ("gcp_project", str), ("master", str),
                         ("num_tpu_cores", int))),
    IgnoredFlag("iterations_per_loop", "TPUEstimator's steps per host call; here every step is one call, logged "
                                       "every --log_step_count_steps", int),
    IgnoredFlag("bert_model", "NVIDIA's scripts name the model for their feature cache only; the model is "
                              "--bert_config_file (--config_file) and --init_checkpoint"),
    IgnoredFlag("local_rank", "torchrun (bertbench launch) gives each process its LOCAL_RANK in the environment, "
                              "where bertbench reads it", int),
    IgnoredFlag("use_env", "the local rank is always read from the environment (torchrun)", bool),
    IgnoredFlag("loss_scale", "fp16 scales the loss dynamically (NVIDIA's default, 0)", float),
    IgnoredFlag("init_loss_scale", "the dynamic loss scale starts at torch.amp's 2**16", int, runners=_PRETRAINING),
    IgnoredFlag("skip_checkpoint", "a run resumes from its checkpoints, so they are always written "
                                   "(--save_checkpoints_steps/--save_checkpoints_secs say when)", bool),
    IgnoredFlag("disable_progress_bar", "the progress bar is drawn only on a terminal; a batch job's output gets one "
                                        "plain line every --log_step_count_steps", bool,
                aliases=("disable-progress-bar",)),
    IgnoredFlag("verbose_logging", "the windows' answer-alignment warnings are not printed", bool, runners=_SQUAD),
    IgnoredFlag("skip_cache", "the features are made in memory at each start, not cached", bool, runners=_SQUAD),
    IgnoredFlag("cache_dir", "the features are made in memory at each start, not cached", runners=_SQUAD),
    IgnoredFlag("eval_script", "the predictions are scored by bertbench's copy of the official evaluate-v1.1.py / "
                               "evaluate-v2.0.py (bertbench evaluate-squad)", runners=_SQUAD),
    IgnoredFlag("allreduce_post_accumulation", "DDP all-reduces the gradients once per optimizer step already (the "
                                               "other micro-batches run under no_sync)", bool, runners=_PRETRAINING),
    IgnoredFlag("allreduce_post_accumulation_fp16", "DDP all-reduces the gradients once per optimizer step, in "
                                                    "their own dtype (fp32 under autocast)", bool,
                runners=_PRETRAINING),
    IgnoredFlag("resume_from_checkpoint", "a run always resumes output_dir's newest intact checkpoint when there is "
                                          "one", bool, runners=_PRETRAINING),
    IgnoredFlag("resume_step", "a run resumes output_dir's newest intact checkpoint", int, runners=_PRETRAINING),
    IgnoredFlag("num_workers", "each process reads its own shards, the next one in the background", int,
                runners=_PRETRAINING),
    IgnoredFlag("vocab_file", "the shards hold token ids; the vocabulary's size is --bert_config_file's vocab_size",
                runners=_PRETRAINING),
    IgnoredFlag("profile", "NVIDIA's pyprof/nvtx markers are not here: `bertbench bench profile` gives the step's "
                           "torch.profiler trace", bool),
    IgnoredFlag("server_ip", "no remote debugger is attached", runners=_SQUAD),
    IgnoredFlag("server_port", "no remote debugger is attached", runners=_SQUAD),
    IgnoredFlag("resume_phase2", "a run always resumes output_dir's newest intact checkpoint, phase 2's included",
                bool, runners=_PRETRAINING),
    IgnoredFlag("no_dense_sequence_output", "the MLM head runs on the masked positions only (NVIDIA's dense "
                                            "sequence output), which gives the same loss as on every position",
                bool, runners=_PRETRAINING),
    IgnoredFlag("disable_jit_fusions", "there are no TorchScript fusions here to disable (--use_xla compiles with "
                                       "torch.compile)", bool),
    IgnoredFlag("steps_this_run", "this invocation trains on to --num_train_steps (--max_steps)", int,
                refuse=lambda steps: "bertbench stops a run part-way by time, not steps: give --max_train_seconds "
                                     "(the same command then resumes it)" if steps > 0 else None,
                runners=_PRETRAINING),
)
# What changes how the training steps run, and so what a run measures: a resumed training keeps them (evaluation
# and prediction may differ). The modeling flags (models.add_model_arguments), and TrainConfig fields whatever flag
# sets them (--precision, --amp and --use_fp16 all set precision).
MODEL_FLAGS = ("modeling", "recompute_policy", "recompute_every", "unpad", "attention_kernel")
TRAINING_FIELDS = ("precision", "compile", "cuda_graphs")
# TrainConfig fields that are no runner's flag: the steps come from the epochs or the phase's steps; clipping and the
# steady-state window stay Google's and the loop's.
NOT_FLAGS = ("num_train_steps", "max_grad_norm", "excluded_steps")

# Errors a user's input causes (exit status 2, see bertbench.common.errors), each naming its file or flag; and the runtime
# failures of a run (exit status 1).
INPUT_ERRORS = (ConfigError, VocabError, WeightsError, CheckpointError, TFCheckpointError)
RUNTIME_FAILURES = (TrainingDivergedError, torch.cuda.OutOfMemoryError)

Log = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class RunnerSettings:
    """The model, the run's actions, sizes and processes (Google's and NVIDIA's flags)."""

    bert_config_file: str | None = setting("bert_config.json of the pre-trained model (Google or HF format).", None,
                                           required=True, aliases=("config_file",))
    init_checkpoint: str | None = setting("Warm-start weights: a TF1 bert_model.ckpt, an HF directory or file, or a "
                                          "bertbench checkpoint or run directory. Ignored when output_dir holds a "
                                          "checkpoint: that run resumes.", None)
    do_train: bool = setting("Train (resuming from output_dir's newest checkpoint if any).", False, per_command=True)
    max_seq_length: int = setting("Tokens per sequence, padded or truncated.", 128, positive=True, defines_run=True)
    train_batch_size: int = setting("Sequences per micro-batch per process.", 32, positive=True, defines_run=True)
    device: str | None = setting("cpu, cuda or cuda:N (default: CUDA when available).", None)
    horovod: bool = setting("Accepted for NVIDIA's scripts: processes come from the launcher (torchrun), see the "
                            "README.", False)
    lr_scaling: str = setting("Multiply --learning_rate by the number of processes N: none, linear (x N, as the "
                              "original's Horovod runs) or sqrt (x sqrt(N)).", "none", choices=tuple(LR_SCALINGS),
                              defines_run=True)
    json_summary: str | None = setting("Also write the final figures NVIDIA's scripts log (training and inference "
                                       "time and sequences/s, final loss, scores) to this file, in dllogger's JSON "
                                       "lines (NVIDIA's --json-summary).", None, aliases=("json-summary",),
                                       per_command=True)

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None and field.metadata.get("required"):
                raise UsageError(f"--{field.name} is required")
            if value is not None and field.metadata.get("positive") and not value > 0:  # NaN too
                raise UsageError(f"--{field.name} must be positive, got {value}")
        if self.json_summary is not None and os.path.isdir(self.json_summary):
            raise UsageError(f"--json_summary {self.json_summary}: is a directory; give the file to write")


@dataclasses.dataclass(frozen=True)
class FineTuningSettings(RunnerSettings):
    """What the fine-tuning runners add: the vocabulary, epochs and predictions."""

    vocab_file: str | None = setting("vocab.txt the model was trained with.", None, required=True)
    do_lower_case: bool = setting("Lower-case and strip accents (uncased models).", True, defines_run=True)
    do_predict: bool = setting("Write predictions for the test set(s) (SQuAD: --predict_file).", False,
                               per_command=True)
    predict_batch_size: int = setting("Sequences per prediction batch.", 8, positive=True)
    num_train_epochs: float = setting("Epochs of training data.", 3.0, positive=True, defines_run=True)
    max_train_samples: int | None = setting("Train on the first N examples only, for quick runs.", None,
                                            positive=True, defines_run=True)
    max_steps: float | None = setting("Train this many optimizer steps at most, the schedule spanning them, instead "
                                      "of the epochs' count (NVIDIA's flag; -1, its default: the epochs decide).",
                                      None, defines_run=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_steps is not None and self.max_steps > 0 and self.max_steps != int(self.max_steps):
            raise UsageError(f"--max_steps must be a whole number of steps, got {self.max_steps}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerSpec:
    """A runner's flags and record: its name (bertbench_run.json's `runner`), its settings dataclass, the common
    flags it leaves out or defaults otherwise, and the errors of its input files (exit status 2)."""

    name: str
    description: str
    settings: type[RunnerSettings]
    omit: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    input_errors: tuple[type[Exception], ...] = ()
    run: Callable[[Command, RunRecord | None], int] | None = None  # the runner's body (a TaskSpec has fine_tune)

    def execute(self, command: Command, record: RunRecord | None) -> int:
        return self.run(command, record)


@dataclasses.dataclass(frozen=True)
class Command:
    """A runner command once parsed, frozen: the runner's settings, the run's RunConfig, TrainConfig's fields as the
    flags set them (build_estimator adds what depends on the processes and the data), and every flag's value by its
    name (--modeling's too), which bertbench_run.json records but for the `per_command` flags."""

    settings: RunnerSettings
    run: RunConfig
    train: Mapping[str, Any]
    flags: FrozenNamespace
    per_command: frozenset[str]
    notes: tuple[str, ...] = ()  # what the log tells the command: the flags it gives that are ignored, and why


def build_parser(spec: RunnerSpec, prog: str | None = None) -> FlagParser:
    """One flag per field of the runner's settings, of RunConfig and of TrainConfig (FLAG_NAMES), and --modeling."""
    parser = FlagParser(prog=prog or spec.name, description=spec.description)
    add_dataclass_flags(parser, spec.settings, defaults=spec.defaults)
    add_dataclass_flags(parser, TrainConfig, FLAG_NAMES, NOT_FLAGS + spec.omit, spec.defaults)
    add_dataclass_flags(parser, RunConfig, FLAG_NAMES)
    add_model_arguments(parser)  # --modeling, --recompute-policy, --recompute-every: these keep real defaults
    parser.ignored_flags([flag for flag in IGNORED_FLAGS if not flag.runners or spec.name in flag.runners],
                         "Google's and NVIDIA's flags that mean nothing here (accepted, with a note)")
    nvidia = parser.add_argument_group("NVIDIA's switches for bertbench's flags")
    nvidia.add_argument("--no_cuda", dest="device", action="store_const", const="cpu",
                        help="NVIDIA's: train on the CPU (--device=cpu).")
    nvidia.add_argument("--checkpoint_activations", dest="modeling", action="store_const", const="recompute",
                        help="NVIDIA's: checkpoint every transformer block (--modeling=recompute, whose default "
                             "--recompute-policy is full).")
    return parser


def parse_command(spec: RunnerSpec, argv: Sequence[str] | None, prog: str | None = None
                  ) -> tuple[Command, RunRecord | None]:
    """The command's flags, the run directory's recorded flags for those it leaves out, then the defaults. A flag
    whose field `defines_run` must not contradict the record."""
    parser = build_parser(spec, prog)
    return resolve_command(spec, parser, vars(parser.parse_args(argv)))


def command_from_values(spec: RunnerSpec, values: Mapping[str, Any]) -> tuple[Command, RunRecord | None]:
    """parse_command for a command given as Python values by flag name ({"do_train": True, "max_seq_length": 64,
    "modeling": "recompute", ...}), checked as the flags would be."""
    parser = build_parser(spec)
    return resolve_command(spec, parser, parser.given_values(values))


def resolve_command(spec: RunnerSpec, parser: FlagParser, given: Mapping[str, Any]
                    ) -> tuple[Command, RunRecord | None]:
    given = dict(given)
    notes = parser.notes(given)
    record = RunRecord.read(given["output_dir"])
    recorded = {}
    if record is not None:
        if record.runner != spec.name:
            raise UsageError(f"{record.path}: holds a {record.runner} run, not a {spec.name} run; use another "
                             "--output_dir")
        defining = [name for name, field in parser.fields.items() if field.metadata.get("defines_run")]
        for name in defining + list(MODEL_FLAGS if given.get("do_train") else ()):
            if name in given and name in record.args and given[name] != record.args[name]:
                raise UsageError(f"{record.path}: this run was made with --{name}={record.args[name]}, the command "
                                 f"gives {given[name]}; use a new --output_dir, or leave the flag out to continue "
                                 "the run")
        recorded = {name: value for name, value in record.args.items() if name in parser.defaults}
    values = {**parser.defaults, **recorded, **given}
    # An HF directory as --init_checkpoint says the model config, vocabulary and lower-casing the flags leave out.
    taken, note = flags_from_hf_directory(values["init_checkpoint"], {**recorded, **given}, parser.defaults)
    values.update(taken)
    notes.extend([note] if note else [])
    train_fields = parser.field_values(TrainConfig, values)
    if record is not None and values["do_train"]:  # how the steps run: an evaluation may use another precision
        defaults = {field.name: field.default for field in dataclasses.fields(TrainConfig)}
        was = {**defaults, **parser.field_values(TrainConfig, {**parser.defaults, **recorded})}
        now = {**defaults, **train_fields}
        for name in TRAINING_FIELDS:
            if was[name] != now[name]:
                raise UsageError(f"{record.path}: this run was trained with {name} {was[name]}, the command gives "
                                 f"{now[name]}; use a new --output_dir, or leave the flag out to continue the run")
    if values["do_train"]:  # every training flag checked now, before any file is read; the steps come later
        build(TrainConfig, FLAG_NAMES, **{**train_fields, "num_train_steps": 1})
    settings = parser.field_values(spec.settings, values)
    cut = values.get("gradient_accumulation_steps", 1)
    if cut > 1:  # NVIDIA's PyTorch scripts: --train_batch_size is the batch of one optimizer step
        if settings["train_batch_size"] % cut:
            raise UsageError(f"--train_batch_size {settings['train_batch_size']} is the batch of one optimizer step "
                             f"with --gradient_accumulation_steps (NVIDIA's meaning), so it must divide by {cut}")
        settings["train_batch_size"] //= cut
        notes.append(f"--train_batch_size={values['train_batch_size']} with --gradient_accumulation_steps={cut} "
                     f"(NVIDIA's meaning): micro-batches of {settings['train_batch_size']} sequences")
    command = Command(
        settings=build(spec.settings, **settings),
        run=build(RunConfig, FLAG_NAMES, **parser.field_values(RunConfig, values)),
        train=MappingProxyType(train_fields), flags=FrozenNamespace(**values),
        per_command=frozenset(name for name, field in parser.fields.items() if field.metadata.get("per_command")),
        notes=tuple(notes))
    return command, record


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """bertbench_run.json: which runner made the run directory, its flags (by name), model config and process
    count, and what the run derived from them once (`derived`: where a phase 2's phase 1 ended)."""

    path: str
    runner: str
    args: Mapping[str, Any]
    bert_config: Mapping[str, Any]
    world_size: int
    derived: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def read(cls, output_dir: str) -> RunRecord | None:
        path = os.path.join(output_dir, RUN_RECORD)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            # Records written before `derived` existed have none.
            return cls(path=path, runner=data["runner"], args=_with_legacy_rule(data["args"]),
                       bert_config=data["bert_config"], world_size=data["world_size"], derived=data.get("derived", {}))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise UsageError(f"{path}: not valid JSON ({error})") from None
        except (KeyError, TypeError) as error:
            raise UsageError(f"{path}: not a bertbench run record (missing {error})") from None

    def write(self) -> None:
        write_json(self.path, {"runner": self.runner, "bertbench_version": __version__, "args": self.args,
                               "bert_config": self.bert_config, "world_size": self.world_size,
                               "derived": self.derived})


def _with_legacy_rule(args: Mapping[str, Any]) -> Mapping[str, Any]:
    """A record's flags, with the optimizer rule a run recorded before bertbench had --adam_bias_correction was
    trained with (optim.legacy_rule: bias-corrected AdamW, and nvlamb for its lamb), so that resuming it keeps it."""
    if "adam_bias_correction" in args or "optimizer_type" not in args:
        return args
    optimizer, bias_correction = optim.legacy_rule(args["optimizer_type"])
    return {**args, "optimizer_type": optimizer, "adam_bias_correction": bias_correction}


def write_record(record: RunRecord | None, runner: str, command: Command, config: BertConfig, dist: Distributed,
                 derived: Mapping[str, Any] | None = None) -> None:
    """A new run's record (rank 0): every flag but the per-command ones, the model config, the processes."""
    if record is not None or not dist.is_main:
        return
    os.makedirs(command.run.model_dir, exist_ok=True)
    args = {name: value for name, value in vars(command.flags).items() if name not in command.per_command}
    RunRecord(os.path.join(command.run.model_dir, RUN_RECORD), runner, args, dataclasses.asdict(config),
              dist.world_size, dict(derived or {})).write()


def check_record(record: RunRecord | None, config: BertConfig, command: Command, dist: Distributed) -> None:
    """The model flags must be able to run on this job's device; a recorded run must continue with the same model
    and, when training, the same number of processes."""
    reason = unrunnable(command.flags.modeling, command.flags.attention_kernel, dist.device)
    if reason is not None:
        raise UsageError(reason)
    settings = command.settings
    if record is None:
        return
    current = dataclasses.asdict(config)
    for key in sorted(set(current) | set(record.bert_config)):
        if current.get(key) != record.bert_config.get(key):
            raise UsageError(f"{record.path}: this run's model has {key}={record.bert_config.get(key)}, "
                             f"{settings.bert_config_file} has {current.get(key)}; use a new --output_dir")
    if settings.do_train and record.world_size != dist.world_size:
        raise UsageError(f"{record.path}: this run was trained by {record.world_size} process(es), this command "
                         f"has {dist.world_size}; the global batch and data order would change")


@contextlib.contextmanager
def hold_run_directory(command: Command, record: RunRecord | None, dist: Distributed, log: Log):
    """The run directory for this command alone (run_lock.RunLock, taken by rank 0 for every rank), and checked: a
    run that has saved checkpoints (saved_history) but holds none now is refused rather than silently started again
    from step 0. A command that fails before it writes leaves the directory as it was (the lock file included), so
    every check of its inputs comes before its first write: remove_leftovers, once the checks are done."""
    model_dir = command.run.model_dir
    with contextlib.ExitStack() as stack:
        refusal = None
        if dist.is_main:
            try:
                stack.enter_context(RunLock(model_dir, log))
            except RunDirectoryBusy as busy:
                refusal = str(busy)
        refusal = next((message for message in dist.all_gather_object(refusal) if message), None)
        if refusal:
            raise RunDirectoryBusy(refusal)
        history = saved_history(model_dir)
        if command.settings.do_train and record is not None and history and not holds_training_state(model_dir):
            raise UsageError(f"{model_dir}: this run has saved checkpoints ({history}) but holds none now, so it "
                             "cannot resume; to start it over, remove the directory or use another --output_dir")
        yield


def remove_leftovers(command: Command, dist: Distributed, log: Log) -> None:
    """Remove the temporary files a killed save left in the run directory (rank 0): a command's first write there,
    made once every check is done (hold_run_directory)."""
    if dist.is_main:
        for name in remove_temporary_files(command.run.model_dir):
            log(f"removed {os.path.join(command.run.model_dir, name)}, left by a save that did not finish")


def saved_history(model_dir: str) -> str | None:
    """What says that a run in model_dir has saved a checkpoint: train_results.json (written after a checkpoint),
    or a metrics.jsonl line naming its newest checkpoint. A run stopped before its first save has none: starting it
    again from step 0 is its exact resume."""
    if os.path.isfile(os.path.join(model_dir, "train_results.json")):
        return "train_results.json is there"
    metrics = os.path.join(model_dir, "metrics.jsonl")
    if os.path.isfile(metrics):
        with open(metrics, "rb") as handle:
            for number, line in enumerate(handle, 1):
                with contextlib.suppress(ValueError):  # a line cut short, or not UTF-8: says nothing
                    record = json.loads(line)
                    step = record.get("checkpoint_step") if isinstance(record, dict) else None
                    if step is not None:
                        return f"{metrics} line {number} follows the checkpoint of step {step}"
    return None


def load_config(settings: RunnerSettings) -> BertConfig:
    """The model config, checked against --max_seq_length and against what every runner feeds it (two segments)."""
    config = BertConfig.from_json_file(settings.bert_config_file)
    if config.type_vocab_size < 2:
        raise UsageError(f"{settings.bert_config_file}: type_vocab_size is {config.type_vocab_size}; BERT's inputs "
                         "have two segments (sentence A and B), so it must be at least 2")
    if settings.max_seq_length > config.max_position_embeddings:
        raise UsageError(f"{settings.bert_config_file}: max_position_embeddings is {config.max_position_embeddings}, "
                         f"so --max_seq_length {settings.max_seq_length} cannot be used")
    weight_bytes, memory_bytes = 4 * config.encoder_parameter_count(), physical_memory_bytes()
    if memory_bytes and weight_bytes > memory_bytes:  # built in fp32 on the host, whatever the device
        # The parts that make the size (a tenth of it or more), largest first, each with the keys that size it.
        parts = sorted(((4 * count, part, keys) for part, (count, keys) in config.parameter_parts().items()
                        if 4 * count >= weight_bytes / 10), reverse=True)
        raise UsageError(f"{settings.bert_config_file}: the model's fp32 weights alone take "
                         f"{weight_bytes / 2**30:,.1f} GiB ("
                         + "; ".join(f"{part}: {keys}, {size / 2**30:,.1f} GiB" for size, part, keys in parts)
                         + f"), more than this machine's {memory_bytes / 2**30:,.1f} GiB of memory")
    return config


def load_config_and_tokenizer(settings: FineTuningSettings) -> tuple[BertConfig, BertTokenizer]:
    """The model config and tokenizer, checked against each other and against --max_seq_length."""
    config = load_config(settings)
    tokenizer = BertTokenizer.from_vocab_file(settings.vocab_file, do_lower_case=settings.do_lower_case)
    if tokenizer.vocab_size > config.vocab_size:
        raise UsageError(f"{settings.vocab_file}: {tokenizer.vocab_size} tokens, but {settings.bert_config_file} has "
                         f"vocab_size {config.vocab_size}: this vocab does not belong to this model")
    return config, tokenizer


def main_process_log(dist: Distributed) -> Log:
    """The log (progress.log) on rank 0, nothing elsewhere: one copy of each line however many processes run."""
    return progress.log if dist.is_main else (lambda line: None)


def build_model(command: Command, task: str, config: BertConfig, dist: Distributed, log: Log,
                continue_phase: bool = False, **head_kwargs) -> tuple[nn.Module, RunStart]:
    """The task model from the chosen modeling module, and where the run starts, decided once here
    (train_state.decide_start): training resumes output_dir's checkpoint, continues an earlier phase
    (`continue_phase`), warm-starts from --init_checkpoint or starts afresh; evaluation and prediction restore the
    run's checkpoint or warm-start from --init_checkpoint. A warm start's weights are loaded here."""
    settings = command.settings
    start = decide_start(command.run.model_dir, training=settings.do_train, init_checkpoint=settings.init_checkpoint,
                         continue_phase=continue_phase, dist=dist,
                         independent_workers=dist.enabled and not command.train.get("sync_gradients", True), log=log)
    seed_everything(command.run.seed)
    try:
        model = model_from_args(command.flags, task, config, **head_kwargs)
    except RuntimeError as error:
        if "allocate" not in str(error):
            raise
        raise MemoryError(f"{command.settings.bert_config_file}: the model does not fit in this machine's memory "
                          f"({one_line(error).split('. ', 1)[-1]})") from None
    if start.kind == WARM_START:
        log(str(load_pretrained(model, start.checkpoint, config)))
    return model, start


def restore_for_inference(estimator: Estimator, start: RunStart) -> None:
    """Without training, evaluation and prediction score the run's checkpoint (or the warm start's weights, at the
    step they were saved at, when they say it)."""
    if start.kind == RESTORE:
        estimator.restore(start.checkpoint, verify=False)  # decide_start verified it
    elif start.kind == WARM_START:
        estimator.global_step = saved_step(start.checkpoint) or 0


def saved_step(path: str) -> int | None:
    """The training step of warm-start weights: a bertbench checkpoint's (a run directory: its newest), a TF1
    checkpoint's global_step (a fine-tuned model.ckpt-1000); None for weights that do not say (HF, a TF1 checkpoint
    without one)."""
    newest = latest_checkpoint(path) if os.path.isdir(path) else path if path.endswith(".pt") else None
    if newest is not None:
        return checkpoint_step(newest)
    with contextlib.suppress(TFCheckpointError, OSError):
        checkpoint = TFCheckpoint(path)
        if "global_step" in checkpoint.entries:
            return int(checkpoint.read("global_step"))
    return None


def build_estimator(command: Command, model: nn.Module, dist: Distributed, num_train_steps: int | None,
                    **derived: Any) -> Estimator:
    """An Estimator with the command's RunConfig and, to train `num_train_steps`, its TrainConfig: the flags'
    fields, the learning rate scaled for the processes (--lr_scaling), and the fields a runner derives (`derived`),
    as they can run on the device (train_step.runnable_config), each setting that cannot apply noted in the log.
    The run record keeps the flags as given, so the same command resumes; train_results.json says what ran."""
    train_config, notes = None, []
    if num_train_steps is not None:
        train_config, notes = runnable_config(build(
            TrainConfig, FLAG_NAMES, **{**command.train, "num_train_steps": num_train_steps,
                                        "learning_rate": scaled_learning_rate(command.flags, dist), **derived}),
            dist.device)
    estimator = Estimator(model, command.run, train_config, dist)
    for note in notes:
        estimator.log(f"note: {note}")
    return estimator


def scaled_learning_rate(args, dist: Distributed) -> float:
    """--learning_rate times the --lr_scaling factor for this many processes."""
    return args.learning_rate * LR_SCALINGS[args.lr_scaling](dist.world_size)


def num_train_steps(num_sequences: int, command: Command, dist: Distributed) -> int:
    """Google's count: training sequences / global batch x epochs, rounded down."""
    settings, accumulation = command.settings, command.train["gradient_accumulation_steps"]
    global_batch = settings.train_batch_size * accumulation * dist.world_size
    steps = int(num_sequences / global_batch * settings.num_train_epochs)
    if settings.max_steps is not None and settings.max_steps > 0:
        steps = min(steps, int(settings.max_steps))
    if steps < 1:
        raise UsageError(f"{num_sequences} training sequences make no full step of {global_batch} sequences "
                         f"({settings.train_batch_size} x {accumulation} accumulation x {dist.world_size} processes) "
                         f"in {settings.num_train_epochs} epochs")
    return steps


@dataclasses.dataclass(frozen=True)
class WorkerScore:
    """How independent workers (--no_sync_gradients) are compared: `score(estimator)` is the dev figure of this
    rank's model."""

    name: str  # e.g. "dev_acc", "f1"
    score: Callable[[Estimator], float]


def read_json(path: str) -> Any:
    """A JSON file a run wrote (train_results.json, eval_results.json, ...)."""
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_json(path: str, data: Mapping[str, Any]) -> None:
    write_text_atomically(path, json.dumps(data, indent=2) + "\n")


def report_training(result: TrainResult, command: Command, estimator: Estimator, dist: Distributed, log: Log,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """train_results.json and the summary NVIDIA's scripts print: sentences/s with and without the start-up. The
    figures are the whole run's, over every invocation that trained it (`segments`: each one's own), so a resumed
    or re-run command adds to them and never replaces them."""
    config, flags = estimator.train_config, command.flags
    if result.steps == 0 and result.resumed_from is not None:
        log(f"the run is already at its last step {result.global_step}: nothing to train, its figures are kept")
    totals = run_totals(result.segments) if result.segments else {}
    path, path_reason = path_of(estimator.model, dist.device, config.precision, config.compile)
    steady = totals.get("steady_sentences_per_second")
    summary = {**dataclasses.asdict(result), **totals, "invocation": invocation_figures(result),
               "sentences_per_20_minutes": None if steady is None else steady * 1200,
               "world_size": dist.world_size, "nodes": dist.nodes, "threads": torch.get_num_threads(),
               "device": str(dist.device), "modeling": flags.modeling,
               "recompute_policy": flags.recompute_policy if flags.modeling == "recompute" else None,
               "path": path, "path_reason": path_reason,
               "precision": config.precision, "use_xla": config.compile,
               "train_batch_size": command.settings.train_batch_size,
               "num_accumulation_steps": config.gradient_accumulation_steps,
               "max_seq_length": command.settings.max_seq_length, "lr_scaling": command.settings.lr_scaling,
               "learning_rate": config.learning_rate, "optimizer": config.optimizer,
               "adam_bias_correction": config.adam_bias_correction,
               "optimizer_rule": optim.rule(config.optimizer, config.adam_bias_correction),
               "sync_gradients": config.sync_gradients, **(extra or {})}
    if dist.is_main:
        write_json(os.path.join(command.run.model_dir, "train_results.json"), summary)
    log("***** Training summary *****")
    log(f"  steps {result.steps} (global step {result.global_step}), {result.sentences} sentences in "
        f"{result.seconds:.1f} s, {result.checkpoint_saves} checkpoint saves ({result.checkpoint_seconds:.2f} s)")
    if result.steps:
        log(f"  throughput with overhead: {result.sentences_per_second:.1f} sentences/s; the first step took "
            f"{result.first_step_seconds:.2f} s (start-up: compilation, CUDA graph captures, the first batch)")
    if result.steady_sentences_per_second is not None:
        log(f"  throughput (steady, {result.steady_steps} steps, no checkpoint saves): "
            f"{result.steady_sentences_per_second:.1f} sentences/s = {result.sentences_per_20_minutes:,.0f} "
            f"sentences per 20 minutes")
    if result.steady_real_tokens_per_second is not None and result.padding_fraction is not None:
        log(f"  real tokens (not padding): {result.steady_real_tokens_per_second:,.0f} tokens/s steady; padding was "
            f"{result.padding_fraction:.1%} of the batches' tokens, on the {summary['path']} path")
    if len(result.segments) > 1 or (result.segments and not result.steps):
        rate = "n/a" if steady is None else f"{steady:.1f}"
        log(f"  the whole run, {len(result.segments)} segments: {totals['steps']} steps, {totals['sentences']} "
            f"sentences in {totals['seconds']:.1f} s, steady {rate} sentences/s")
    return summary


def invocation_figures(result: TrainResult) -> dict[str, Any]:
    """This command's own share of the run's figures (train_results.json's top level holds the whole run's)."""
    return {name: getattr(result, name) for name in ("steps", "sentences", "seconds", "sentences_per_second",
                                                     "steady_sentences_per_second", "steady_steps")}


def interrupted_status(result: TrainResult) -> int | None:
    """The shell's exit status for a run a signal stopped (128 + signal number), None for a finished run."""
    return None if result.interrupted_by is None else signal_status(result.interrupted_by)


def report_eval(output_dir: str, title: str, results: Mapping[str, Any], header: Mapping[str, Any], is_main: bool,
                log: Log) -> None:
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


# The final figures NVIDIA's scripts log through dllogger (--json-summary), with the units they declare.
SUMMARY_UNITS = {"e2e_train_time": "s", "training_sequences_per_second": "sequences/s", "final_loss": None,
                 "raw_train_time": "s", "e2e_inference_time": "s", "inference_sequences_per_second": "sequences/s",
                 "exact_match": None, "F1": None}


class JsonSummary:
    """NVIDIA's --json-summary file, as dllogger's JSONStreamBackend writes it, so that NVIDIA's tooling reads it:
    one `DLLL {json}` line per record, each with timestamp, datetime and elapsedtime (seconds since the command
    started); METADATA records give each figure's unit, a PARAMETER record the command's flags, and LOG records whose
    step is [] (dllogger's step=tuple()) the final figures. Rank 0 writes it when the command ends, whole or not at
    all; nothing is written without --json_summary."""

    def __init__(self, command: Command):
        self.path, self.started, self.lines = command.settings.json_summary, datetime.datetime.now(), []
        for metric, unit in SUMMARY_UNITS.items():
            self._add(type="METADATA", metric=metric, metadata={"unit": unit})
        self.log("PARAMETER", {"Config": [str(command.flags)]})

    def _add(self, **record: Any) -> None:
        now = datetime.datetime.now()
        stamp = {"timestamp": str(now.timestamp()), "datetime": str(now.astimezone()),
                 "elapsedtime": str((now - self.started).total_seconds())}
        self.lines.append("DLLL " + json.dumps({**stamp, **record}) + "\n")

    def log(self, step: str | list, data: Mapping[str, Any]) -> None:
        if data:
            self._add(type="LOG", step=step, data=dict(data))

    def training(self, result: TrainResult) -> None:
        """run_squad's and run_glue's training figures: the loop's time and sequences/s, the last loss."""
        if result.steps:
            self.log([], {"e2e_train_time": result.seconds, "training_sequences_per_second":
                          result.sentences_per_second, "final_loss": result.final_loss})

    def write(self, is_main: bool) -> None:
        if self.path is not None and is_main:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            write_text_atomically(self.path, "".join(self.lines))


def run_main(spec: RunnerSpec, argv: Sequence[str] | None, prog: str | None = None) -> int:
    """A runner's main: parse the command (see parse_command) and run it."""
    return _run(spec, prog or spec.name, lambda: parse_command(spec, argv, prog))


def run_values(spec: RunnerSpec, values: Mapping[str, Any], output: TextIO | None = None) -> int:
    """Run a runner's command given as Python values by flag name (see command_from_values), under the same
    exit-code policy as its main: what the demo and the benches call. `output` takes the run's log and its error
    line instead of stdout and stderr."""
    with contextlib.ExitStack() as stack:
        if output is not None:
            stack.enter_context(contextlib.redirect_stdout(output))
            stack.enter_context(contextlib.redirect_stderr(output))
        return _run(spec, spec.name, lambda: command_from_values(spec, values))


def _run(spec: RunnerSpec, program: str, command: Callable[[], tuple[Command, RunRecord | None]]) -> int:
    """Make the command and run it under bertbench.common.errors' exit-code policy (input errors: INPUT_ERRORS and the
    runner's own)."""
    return run_command(program, lambda: spec.execute(*command()), input_errors=INPUT_ERRORS + spec.input_errors,
                       runtime_errors=RUNTIME_FAILURES)


# ---- the fine-tuning runners' one skeleton --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskData:
    """What a task reads before its model is built, so that a bad file does not surface after hours of training:
    the training features (with --do_train), what they are for the log, the head's arguments; a task's subclass adds
    what it scores and predicts."""

    train: Mapping[str, torch.Tensor] | None
    description: str
    head_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSpec(RunnerSpec):
    """A fine-tuning task in the skeleton (fine_tune): the model's task (models.TASKS), the flag whose dev figure
    chooses among independent workers (`scored_by`), and its functions: `read(settings, tokenizer, log)` every file
    the command needs; `worker_score(settings, data)` that dev figure (asked for independent workers only, a
    UsageError if the data has none); `infer(settings, estimator, data, is_main, log)` evaluation and predictions
    after training, returning the figures NVIDIA's scripts log for them (JsonSummary)."""

    model_task: str
    scored_by: str
    read: Callable[[Any, BertTokenizer, Log], TaskData]
    worker_score: Callable[[Any, TaskData], WorkerScore]
    infer: Callable[[Any, Estimator, TaskData, bool, Log], Mapping[str, float]]

    def execute(self, command: Command, record: RunRecord | None) -> int:
        return fine_tune(self, command, record)


def fine_tune(task: TaskSpec, command: Command, record: RunRecord | None) -> int:
    """Read every file, build the model (where the run starts is decided there, once), then train (recording the
    run) or restore its checkpoint, and evaluate and predict. Returns the exit status."""
    settings = command.settings
    independent = settings.do_train and not command.train["sync_gradients"]
    if independent and not getattr(settings, task.scored_by):
        raise UsageError(f"--no_sync_gradients keeps the worker with the best dev metric: it needs --{task.scored_by}")
    config, tokenizer = load_config_and_tokenizer(settings)
    summary = JsonSummary(command)
    with job_from_environment(settings.device) as dist:
        log = main_process_log(dist)
        log_notes(command, log)
        data = task.read(settings, tokenizer, log)
        worker_score = task.worker_score(settings, data) if independent else None
        check_record(record, config, command, dist)
        steps = num_train_steps(len(data.train["input_ids"]), command, dist) if settings.do_train else None
        with hold_run_directory(command, record, dist, log):
            model, start = build_model(command, task.model_task, config, dist, log, **data.head_kwargs)
            estimator = build_estimator(command, model, dist, steps)
            remove_leftovers(command, dist, log)
            if settings.do_train:
                write_record(record, task.name, command, config, dist)
                result = train(estimator, command, dist, data, log, start, worker_score)
                if result.interrupted_by is not None:
                    return interrupted_status(result)
                summary.training(result)
            else:
                restore_for_inference(estimator, start)
            summary.log([], task.infer(settings, estimator, data, dist.is_main, log))
            summary.write(dist.is_main)
        return 0


def log_notes(command: Command, log: Log) -> None:
    """What the command should know before it runs: the flags it gives that are ignored, and why."""
    for note in command.notes:
        log(f"note: {note}")


def train(estimator: Estimator, command: Command, dist: Distributed, data: TaskData, log: Log, start: RunStart,
          worker_score: WorkerScore | None) -> TrainResult:
    """Train on the task's features (resuming from output_dir's newest checkpoint) and report; independent workers
    then keep the best by `worker_score`."""
    settings, config = command.settings, estimator.train_config
    mode = "independent workers" if estimator.independent_workers else "processes"
    log(f"***** Training {data.description}, {config.num_train_steps} steps, batch {settings.train_batch_size} x "
        f"{config.gradient_accumulation_steps} x {dist.world_size} {mode}, {command.flags.modeling} model, "
        f"{config.precision} on {dist.device}, learning rate {config.learning_rate:g}"
        + (f", time budget {config.max_train_seconds:g} s" if config.max_train_seconds is not None else "") + " *****")
    batches = ShuffledBatches(data.train, settings.train_batch_size, command.run.seed, dist.rank, dist.world_size)
    result = estimator.train(batches, start)
    selection = {}
    if result.interrupted_by is None and estimator.independent_workers:
        best, scores = estimator.keep_best_worker(lambda: worker_score.score(estimator))
        log(f"independent workers' {worker_score.name}: "
            + ", ".join(f"worker {rank} {score:.4f}" for rank, score in enumerate(scores))
            + f"; keeping worker {best}")
        selection = {"selection_metric": worker_score.name, "worker_scores": scores, "selected_worker": best}
    report_training(result, command, estimator, dist, log, selection)
    return result
