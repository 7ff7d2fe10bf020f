"""A runner command's one configuration, parsed once: the flag table and the frozen dataclasses it fills.

`parse_config` turns a command line (or `config_from_values`, Python values by flag name) into a RunnerConfig:
- `model`: model.factory.ModelSettings (--modeling, --recompute_policy, ...);
- `run`: training.config.RunConfig (--output_dir, checkpoints, logging, seed);
- `train`: training.config.TrainConfig (optimizer, schedule, precision ...) of a command that trains, its
  steps left to the job;
- `task`: the runner's settings (GlueSettings, SquadSettings, PretrainingSettings: actions, sizes, files).
Every field's help is its --help; Google's, NVIDIA's and tf.estimator's names for the fields are in FLAG_NAMES, their
flags that mean nothing here in IGNORED_FLAGS. What depends on the job's processes or the data (the global batch, the
scaled learning rate, the steps) is derived in one place, RunnerConfig's methods. After parsing, code reads the
sections; `flags` keeps every flag as given only for what records the command (bertbench_run.json, --json_summary).

A run directory (`--output_dir`) records its flags in bertbench_run.json when training starts. A later command on the
same directory takes every flag it leaves out from there (so `eval.sh RESULTS_DIR` needs nothing else, and the same
command resumes), and refuses a flag that contradicts the recorded run: continuing a run with another learning rate
or model would give weights that belong to neither.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from bertbench.common.errors import INPUT_ERRORS, UsageError, one_line
from bertbench.common.flags import (
    FlagName,
    FlagParser,
    FrozenNamespace,
    IgnoredFlag,
    add_dataclass_flags,
    build,
    setting,
)
from bertbench.model.factory import ModelSettings
from bertbench.runners.run_directory import RunRecord, run_flags, run_of_checkpoint
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.weights.hf import hf_directory_flags, take_checkpoint_flags

# --lr_scaling: the factor on --learning_rate for a number of processes.
LR_SCALINGS = {"none": lambda processes: 1.0, "linear": float, "sqrt": math.sqrt}
# NVIDIA's --optimizer_type names for TrainConfig.optimizer.
OPTIMIZER_TYPES = {"adam": "adamw", "adamw": "adamw", "lamb": "lamb", "nvlamb": "nvlamb"}

# Google's, NVIDIA's and tf.estimator's flag names for RunConfig and TrainConfig fields, and how a flag's value becomes
# the field's; a field not named here is the flag of its own name. What depends on the processes or the phase (the
# steps, --lr_scaling's factor, a warm-up given in steps) is derived by RunnerConfig.train_config.
FLAG_NAMES = (
    FlagName("output_dir", RunConfig, "model_dir"),
    FlagName(
        "save_checkpoints_secs", RunConfig, "save_checkpoints_secs", value=lambda secs: secs if secs > 0 else None
    ),
    FlagName("save_checkpoints_steps", RunConfig, "save_checkpoints_steps", aliases=("num_steps_per_checkpoint",)),
    FlagName("log_step_count_steps", RunConfig, "log_step_count_steps", aliases=("log_freq",)),
    FlagName("num_accumulation_steps", TrainConfig, "gradient_accumulation_steps"),
    FlagName(
        "gradient_accumulation_steps",
        TrainConfig,
        "gradient_accumulation_steps",
        note="NVIDIA's PyTorch name, with its meaning of --train_batch_size: the batch of one optimizer step, "
        "cut into this many micro-batches (it must divide it).",
    ),
    FlagName(
        "optimizer_type",
        TrainConfig,
        "optimizer",
        value=OPTIMIZER_TYPES.__getitem__,
        choices=tuple(OPTIMIZER_TYPES),
        default="adam",
        note="adam is AdamW (NVIDIA's names).",
    ),
    FlagName(
        "optimizer",
        TrainConfig,
        "optimizer",
        note="run_pretraining's default is NVIDIA's lamb; --optimizer adamw trains with Google's run_pretraining.py "
        "rule (AdamWeightDecayOptimizer, without bias correction; with --poly_power 1, Google's linear decay).",
    ),
    FlagName("poly_power", TrainConfig, "decay_power"),
    FlagName("use_xla", TrainConfig, "compile"),
    FlagName("precision", TrainConfig, "precision", default=None, note="Default fp32, or fp16 with --amp."),
    FlagName(
        "amp",
        TrainConfig,
        "precision",
        value=lambda on: "fp16" if on else "fp32",
        type=bool,
        default=False,
        aliases=("fp16",),
        note="Mixed precision: --precision=fp16 (NVIDIA's flag; also --fp16).",
    ),
    FlagName(
        "use_fp16",
        TrainConfig,
        "precision",
        value=lambda on: "fp16" if on else "fp32",
        type=bool,
        default=False,
        note="Same as --amp (older NVIDIA scripts).",
    ),
    FlagName(
        "sync_gradients",
        TrainConfig,
        "sync_gradients",
        note="With --no_sync_gradients the runners keep the worker with the best dev metric.",
    ),
)
# Google's and NVIDIA's flags that mean nothing here: a command that gives one runs, and is told why it is ignored.
_NO_TPU = "there is no TPU here: bertbench runs on CPUs and CUDA GPUs (--device)"
_SQUAD, _PRETRAINING = ("run_squad",), ("run_pretraining",)
IGNORED_FLAGS = (
    IgnoredFlag(
        "use_tpu",
        _NO_TPU,
        bool,
        refuse=lambda on: (
            "bertbench runs on CPUs and CUDA GPUs, not TPUs; leave the flag out or give --use_tpu=false" if on else None
        ),
    ),
    *(
        IgnoredFlag(name, f"{_NO_TPU} (Google's TPU settings)", kind)
        for name, kind in (
            ("tpu_name", str),
            ("tpu_zone", str),
            ("gcp_project", str),
            ("master", str),
            ("num_tpu_cores", int),
        )
    ),
    IgnoredFlag(
        "iterations_per_loop",
        "TPUEstimator's steps per host call; here every step is one call, logged every --log_step_count_steps",
        int,
    ),
    IgnoredFlag(
        "bert_model",
        "NVIDIA's scripts name the model for their feature cache only; the model is "
        "--bert_config_file (--config_file) and --init_checkpoint",
    ),
    IgnoredFlag(
        "local_rank",
        "torchrun (bertbench launch) gives each process its LOCAL_RANK in the environment, where bertbench reads it",
        int,
    ),
    IgnoredFlag("use_env", "the local rank is always read from the environment (torchrun)", bool),
    IgnoredFlag("loss_scale", "fp16 scales the loss dynamically (NVIDIA's default, 0)", float),
    IgnoredFlag("init_loss_scale", "the dynamic loss scale starts at torch.amp's 2**16", int, runners=_PRETRAINING),
    IgnoredFlag(
        "skip_checkpoint",
        "a run resumes from its checkpoints, so they are always written "
        "(--save_checkpoints_steps/--save_checkpoints_secs say when)",
        bool,
    ),
    IgnoredFlag(
        "disable_progress_bar",
        "the progress bar is drawn only on a terminal; a batch job's output gets one "
        "plain line every --log_step_count_steps",
        bool,
    ),
    IgnoredFlag("verbose_logging", "the windows' answer-alignment warnings are not printed", bool, runners=_SQUAD),
    IgnoredFlag("skip_cache", "the features are made in memory at each start, not cached", bool, runners=_SQUAD),
    IgnoredFlag("cache_dir", "the features are made in memory at each start, not cached", runners=_SQUAD),
    IgnoredFlag(
        "eval_script",
        "the predictions are scored by bertbench's copy of the official evaluate-v1.1.py / "
        "evaluate-v2.0.py (bertbench evaluate-squad)",
        runners=_SQUAD,
    ),
    IgnoredFlag(
        "allreduce_post_accumulation",
        "DDP all-reduces the gradients once per optimizer step already (the other micro-batches run under no_sync)",
        bool,
        runners=_PRETRAINING,
    ),
    IgnoredFlag(
        "allreduce_post_accumulation_fp16",
        "DDP all-reduces the gradients once per optimizer step, in their own dtype (fp32 under autocast)",
        bool,
        runners=_PRETRAINING,
    ),
    IgnoredFlag(
        "resume_from_checkpoint",
        "a run always resumes output_dir's newest intact checkpoint when there is one",
        bool,
        runners=_PRETRAINING,
    ),
    IgnoredFlag("resume_step", "a run resumes output_dir's newest intact checkpoint", int, runners=_PRETRAINING),
    IgnoredFlag(
        "num_workers", "each process reads its own shards, the next one in the background", int, runners=_PRETRAINING
    ),
    IgnoredFlag(
        "vocab_file",
        "the shards hold token ids; the vocabulary's size is --bert_config_file's vocab_size",
        runners=_PRETRAINING,
    ),
    IgnoredFlag(
        "profile",
        "NVIDIA's pyprof/nvtx markers are not here: `bertbench bench profile` gives the step's torch.profiler trace",
        bool,
    ),
    IgnoredFlag("server_ip", "no remote debugger is attached", runners=_SQUAD),
    IgnoredFlag("server_port", "no remote debugger is attached", runners=_SQUAD),
    IgnoredFlag(
        "resume_phase2",
        "a run always resumes output_dir's newest intact checkpoint, phase 2's included",
        bool,
        runners=_PRETRAINING,
    ),
    IgnoredFlag(
        "no_dense_sequence_output",
        "the MLM head runs on the masked positions only (NVIDIA's dense "
        "sequence output), which gives the same loss as on every position",
        bool,
        runners=_PRETRAINING,
    ),
    IgnoredFlag(
        "disable_jit_fusions",
        "there are no TorchScript fusions here to disable (--use_xla compiles with torch.compile)",
        bool,
    ),
    IgnoredFlag(
        "steps_this_run",
        "this invocation trains on to --num_train_steps (--max_steps)",
        int,
        refuse=lambda steps: (
            "bertbench stops a run part-way by time, not steps: give --max_train_seconds "
            "(the same command then resumes it)"
            if steps > 0
            else None
        ),
        runners=_PRETRAINING,
    ),
)
# TrainConfig fields that change how the training steps run, and so what a run measures, whatever flag sets them
# (--precision, --amp and --use_fp16 all set precision): a resumed training keeps them, as it keeps the model flags
# (ModelSettings' `defines_training`); evaluation and prediction may differ.
TRAINING_FIELDS = ("precision", "compile", "cuda_graphs")
# TrainConfig fields that are no runner's flag: the steps come from the epochs or the phase's steps; clipping and the
# steady-state window stay Google's and the loop's.
NOT_FLAGS = ("num_train_steps", "max_grad_norm", "excluded_steps")


def check_fields(settings: Any) -> None:
    """The checks a settings dataclass's metadata asks for, every field's in one error: `required` (None refused;
    the flags missing named together), `positive` (<= 0 refused)."""
    fields = dataclasses.fields(settings)
    missing = [
        f"--{field.name}"
        for field in fields
        if field.metadata.get("required") and getattr(settings, field.name) is None
    ]
    errors = []
    if missing:
        names = f"{', '.join(missing[:-1])} and {missing[-1]} are" if len(missing) > 1 else f"{missing[0]} is"
        errors.append(f"{names} required")
    for field in fields:
        value = getattr(settings, field.name)
        if value is not None and field.metadata.get("positive") and not value > 0:  # NaN too
            errors.append(f"--{field.name} must be positive, got {value}")
    if errors:
        raise UsageError("; ".join(errors))


@dataclasses.dataclass(frozen=True)
class RunnerSettings:
    """The model files, the run's actions, sizes and processes (Google's and NVIDIA's flags)."""

    bert_config_file: str | None = setting(
        "bert_config.json of the pre-trained model (Google or HF format).",
        None,
        required=True,
        aliases=("config_file",),
    )
    init_checkpoint: str | None = setting(
        "Warm-start weights: a TF1 bert_model.ckpt, an HF directory or file, or a "
        "bertbench checkpoint or run directory. Ignored when output_dir holds a "
        "checkpoint: that run resumes.",
        None,
    )
    allow_partial_init_checkpoint: bool = setting(
        "Warm-start even when --init_checkpoint lacks some of the model's encoder weights, or holds encoder weights "
        "the model has no place for (more layers): those start from random values or are left out, and the log "
        "names them. Off: such a checkpoint is refused (it is rarely this model's).",
        False,
    )
    do_train: bool = setting("Train (resuming from output_dir's newest checkpoint if any).", False, per_command=True)
    max_seq_length: int = setting("Tokens per sequence, padded or truncated.", 128, positive=True, defines_run=True)
    train_batch_size: int = setting("Sequences per micro-batch per process.", 32, positive=True, defines_run=True)
    device: str | None = setting("cpu, cuda or cuda:N (default: CUDA when available).", None)
    horovod: bool = setting(
        "Accepted for NVIDIA's scripts: processes come from the launcher (torchrun), see docs/clusters.md.", False
    )
    lr_scaling: str = setting(
        "Multiply --learning_rate by the number of processes N: none, linear (x N, as the "
        "original's Horovod runs) or sqrt (x sqrt(N)).",
        "none",
        choices=tuple(LR_SCALINGS),
        defines_run=True,
    )
    json_summary: str | None = setting(
        "Also write the final figures NVIDIA's scripts log (training and inference "
        "time and sequences/s, final loss, scores) to this file, in dllogger's JSON "
        "lines (NVIDIA's --json-summary).",
        None,
        per_command=True,
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.json_summary is not None and os.path.isdir(self.json_summary):
            raise UsageError(f"--json_summary {self.json_summary}: is a directory; give the file to write")


@dataclasses.dataclass(frozen=True)
class FineTuningSettings(RunnerSettings):
    """What the fine-tuning runners add: the vocabulary, epochs and predictions."""

    vocab_file: str | None = setting("vocab.txt the model was trained with.", None, required=True)
    do_lower_case: bool = setting("Lower-case and strip accents (uncased models).", True, defines_run=True)
    do_predict: bool = setting(
        "Write predictions for the test set(s) (SQuAD: --predict_file).", False, per_command=True
    )
    predict_batch_size: int = setting("Sequences per prediction batch.", 8, positive=True)
    num_train_epochs: float = setting("Epochs of training data.", 3.0, positive=True, defines_run=True)
    max_train_samples: int | None = setting(
        "Train on the first N examples only, for quick runs.", None, positive=True, defines_run=True
    )
    max_steps: float | None = setting(
        "Train this many optimizer steps at most, the schedule spanning them, instead "
        "of the epochs' count (NVIDIA's flag; -1, its default: the epochs decide).",
        None,
        defines_run=True,
    )

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
    # The flag of a later phase (run_pretraining's phase2): a training command that gives it on a run directory
    # whose record has it off starts that run's next phase in place, as NVIDIA's phase 2 goes on in phase 1's
    # --output_dir; the phase's flags then replace the record's.
    phase_flag: str | None = None


@dataclasses.dataclass(frozen=True)
class RunnerConfig:
    """A runner command, parsed once and frozen (see the module's doc): `model`, `run`, `train` and `task`, the
    notes the log tells the command (the flags it gives that are ignored, and why), and every flag's value by name
    (`flags`), which bertbench_run.json records but for the `per_command` ones."""

    model: ModelSettings
    run: RunConfig
    train: TrainConfig | None  # None without --do_train; num_train_steps None: the job derives it (train_config)
    task: RunnerSettings
    flags: FrozenNamespace
    per_command: frozenset[str]
    notes: tuple[str, ...] = ()
    new_phase: bool = False  # the command starts the next phase of the run its output_dir holds (RunnerSpec)

    def global_batch(self, world_size: int) -> int:
        """Sequences per optimizer step over every process: micro-batch x accumulation x processes."""
        return self.task.train_batch_size * self.train.gradient_accumulation_steps * world_size

    def learning_rate(self, world_size: int) -> float:
        """--learning_rate times the --lr_scaling factor for this many processes."""
        return self.train.learning_rate * LR_SCALINGS[self.task.lr_scaling](world_size)

    def epoch_steps(self, num_sequences: int, world_size: int) -> int:
        """A fine-tuning run's steps, Google's count: training sequences / global batch x epochs, rounded down, at
        most --max_steps."""
        task, global_batch = self.task, self.global_batch(world_size)
        steps = int(num_sequences / global_batch * task.num_train_epochs)
        if task.max_steps is not None and task.max_steps > 0:
            steps = min(steps, int(task.max_steps))
        if steps < 1:
            raise UsageError(
                f"{num_sequences} training sequences make no full step of {global_batch} sequences "
                f"({task.train_batch_size} x {self.train.gradient_accumulation_steps} accumulation x "
                f"{world_size} processes) in {task.num_train_epochs} epochs"
            )
        return steps

    def train_config(self, world_size: int, num_train_steps: int, **derived: Any) -> TrainConfig:
        """The TrainConfig this job trains with: the flags' fields, `num_train_steps`, the learning rate scaled for
        the processes, and the fields a runner derives (`derived`: a warm-up given in steps)."""
        return build(
            TrainConfig,
            FLAG_NAMES,
            **{
                **dataclasses.asdict(self.train),
                "num_train_steps": num_train_steps,
                "learning_rate": self.learning_rate(world_size),
                **derived,
            },
        )


def build_parser(spec: RunnerSpec, prog: str | None = None) -> FlagParser:
    """One flag per field of the runner's settings, of ModelSettings, RunConfig and TrainConfig (FLAG_NAMES)."""
    parser = FlagParser(prog=prog or spec.name, description=spec.description)
    add_dataclass_flags(parser, spec.settings, defaults=spec.defaults)
    add_dataclass_flags(parser, TrainConfig, FLAG_NAMES, NOT_FLAGS + spec.omit, spec.defaults)
    add_dataclass_flags(parser, RunConfig, FLAG_NAMES)
    add_dataclass_flags(parser, ModelSettings)
    parser.ignored_flags(
        [flag for flag in IGNORED_FLAGS if not flag.runners or spec.name in flag.runners],
        "Google's and NVIDIA's flags that mean nothing here (accepted, with a note)",
    )
    nvidia = parser.add_argument_group("NVIDIA's switches for bertbench's flags")
    nvidia.add_argument(
        "--no_cuda", dest="device", action="store_const", const="cpu", help="NVIDIA's: train on the CPU (--device=cpu)."
    )
    nvidia.add_argument(
        "--checkpoint_activations",
        dest="modeling",
        action="store_const",
        const="recompute",
        help="NVIDIA's: checkpoint every transformer block (--modeling=recompute, whose default "
        "--recompute_policy is full).",
    )
    return parser


def parse_config(
    spec: RunnerSpec, argv: Sequence[str] | None, prog: str | None = None
) -> tuple[RunnerConfig, RunRecord | None]:
    """The command's flags, the run directory's recorded flags for those it leaves out, then the defaults. A flag
    whose field `defines_run` must not contradict the record. Every usage error is in one UsageError
    (resolve_or_report)."""
    parser = build_parser(spec, prog)
    namespace, errors = parser.parse_args_and_errors(argv)
    return resolve_or_report(spec, parser, None if namespace is None else vars(namespace), errors)


def config_from_values(spec: RunnerSpec, values: Mapping[str, Any]) -> tuple[RunnerConfig, RunRecord | None]:
    """parse_config for a command given as Python values by flag name ({"do_train": True, "max_seq_length": 64,
    "modeling": "recompute", ...}), checked as the flags would be."""
    parser = build_parser(spec)
    return resolve_or_report(spec, parser, *parser.given_values(values))


def resolve_or_report(
    spec: RunnerSpec, parser: FlagParser, given: Mapping[str, Any] | None, errors: Sequence[str]
) -> tuple[RunnerConfig, RunRecord | None]:
    """resolve, or every usage error of the command in one UsageError: first those of the command line itself
    (`errors`: unknown flags, refused values, required flags missing), then, when every flag given was read (`given`
    is not None), what resolve refuses (the flags a record did not fill, a value that contradicts the run, a file a
    flag names)."""
    if not errors:
        return resolve(spec, parser, given)
    if given is not None:
        try:
            resolve(spec, parser, given)
        except INPUT_ERRORS + spec.input_errors as error:
            errors = [*errors, one_line(error)]
    raise UsageError("; ".join(errors))


def resolve(spec: RunnerSpec, parser: FlagParser, given: Mapping[str, Any]) -> tuple[RunnerConfig, RunRecord | None]:
    given = dict(given)
    notes = parser.notes(given)
    record = RunRecord.read(given["output_dir"])
    recorded = {}
    new_phase = starts_new_phase(spec, record, given)
    if new_phase:
        notes.append(
            f"{given['output_dir']} holds phase 1 of this run (its {os.path.basename(record.path)}): phase 2 goes on "
            "from its newest checkpoint, with this command's flags; phase 1's results are kept as phase1_*"
        )
        given.setdefault("init_checkpoint", given["output_dir"])  # NVIDIA's phase 2 names no checkpoint
    elif record is not None:
        if record.runner != spec.name:
            raise UsageError(
                f"{record.path}: holds a {record.runner} run, not a {spec.name} run; use another --output_dir"
            )
        for name, field in parser.fields.items():
            defines = (
                field.metadata.get("defines_run") or field.metadata.get("defines_training") and given.get("do_train")
            )
            if defines and name in given and name in record.args and given[name] != record.args[name]:
                raise UsageError(
                    f"{record.path}: this run was made with --{name}={record.args[name]}, the command "
                    f"gives {given[name]}; use a new --output_dir, or leave the flag out to continue "
                    "the run"
                    + (
                        f" (a later phase goes on here with --{spec.phase_flag})"
                        if spec.phase_flag and not record.args.get(spec.phase_flag)
                        else ""
                    )
                )
        recorded = {name: value for name, value in record.args.items() if name in parser.defaults}
    values = {**parser.defaults, **recorded, **given}
    # An HF directory or a bertbench run as --init_checkpoint says the model config, vocabulary and lower-casing the
    # flags leave out.
    init_checkpoint = values["init_checkpoint"]
    warm_run = run_of_checkpoint(init_checkpoint)
    found = (
        run_flags(warm_run) if warm_run is not None else hf_directory_flags(init_checkpoint) if init_checkpoint else {}
    )
    taken, note = take_checkpoint_flags(
        found, init_checkpoint if found else None, {**recorded, **given}, parser.defaults
    )
    values.update(taken)
    notes.extend([note] if note else [])
    train_fields = parser.field_values(TrainConfig, values)
    if record is not None and values["do_train"] and not new_phase:  # an evaluation may use another precision
        defaults = {field.name: field.default for field in dataclasses.fields(TrainConfig)}
        was = {**defaults, **parser.field_values(TrainConfig, {**parser.defaults, **recorded})}
        now = {**defaults, **train_fields}
        for name in TRAINING_FIELDS:
            if was[name] != now[name]:
                raise UsageError(
                    f"{record.path}: this run was trained with {name} {was[name]}, the command gives "
                    f"{now[name]}; use a new --output_dir, or leave the flag out to continue the run"
                )
    settings = parser.field_values(spec.settings, values)
    cut = values.get("gradient_accumulation_steps", 1)
    if cut > 1:  # NVIDIA's PyTorch scripts: --train_batch_size is the batch of one optimizer step
        if settings["train_batch_size"] % cut:
            raise UsageError(
                f"--train_batch_size {settings['train_batch_size']} is the batch of one optimizer step "
                f"with --gradient_accumulation_steps (NVIDIA's meaning), so it must divide by {cut}"
            )
        settings["train_batch_size"] //= cut
        notes.append(
            f"--train_batch_size={values['train_batch_size']} with --gradient_accumulation_steps={cut} "
            f"(NVIDIA's meaning): micro-batches of {settings['train_batch_size']} sequences"
        )
    config = RunnerConfig(
        model=build(ModelSettings, **parser.field_values(ModelSettings, values)),
        run=build(RunConfig, FLAG_NAMES, **parser.field_values(RunConfig, values)),
        train=build(TrainConfig, FLAG_NAMES, **train_fields) if values["do_train"] else None,
        task=build(spec.settings, **settings),
        flags=FrozenNamespace(**values),
        per_command=frozenset(name for name, field in parser.fields.items() if field.metadata.get("per_command")),
        notes=tuple(notes),
        new_phase=new_phase,
    )
    return config, record


def starts_new_phase(spec: RunnerSpec, record: RunRecord | None, given: Mapping[str, Any]) -> bool:
    """Whether a training command starts the next phase of the run in its output_dir (RunnerSpec.phase_flag): the
    command gives the phase's flag, the record has it off. A phase 1 named elsewhere as well is refused: which of
    the two is meant cannot be told."""
    if not (spec.phase_flag and record is not None and record.runner == spec.name and given.get("do_train")):
        return False
    if not given.get(spec.phase_flag) or record.args.get(spec.phase_flag):
        return False
    other = given.get("init_checkpoint")
    if other and not (os.path.exists(other) and os.path.samefile(os.path.realpath(other), given["output_dir"])):
        raise UsageError(
            f"--{spec.phase_flag} on {given['output_dir']}, which holds phase 1 of a run, and --init_checkpoint={other}: "
            "phase 2 goes on from one of them; leave --init_checkpoint out to go on in place, or give a new --output_dir"
        )
    return True
