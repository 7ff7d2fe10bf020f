"""A runner command's one configuration, parsed once: the flag table and the frozen dataclasses it fills.

`parse_config` turns a command line (or `config_from_values`, Python values by flag name) into a RunnerConfig:
- `model`: model.factory.ModelSettings (--modeling, --recompute_policy, ...);
- `run`: training.config.RunConfig (--output_dir, checkpoints, logging, seed);
- `train`: training.config.TrainConfig (optimizer, schedule, precision ...) of a command that trains, as its flags
  give it: the steps are left to the job, whose TrainConfig `train_config` builds once from it, the job's steps and
  processes, and its device;
- `task`: the runner's settings (GlueSettings, SquadSettings, PretrainingSettings: actions, sizes, files).
Every field's help is its --help; Google's, NVIDIA's, HF's and tf.estimator's names for the fields are in FLAG_NAMES,
their flags that mean nothing here in IGNORED_FLAGS. An HF command (one that gives --model_name_or_path, as HF's
run_glue.py and run_qa.py do) takes HF Trainer's defaults (HF_DEFAULTS) for what it leaves out. What depends on the
job's processes or the data (the global batch, the scaled learning rate, the steps) is derived in one place,
RunnerConfig's methods. After parsing, code reads the sections; `args` keeps every flag's value by name only for
what records the command (bertbench_run.json, --json_summary).

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
from types import MappingProxyType
from typing import Any

import torch

from bertbench.common.errors import INPUT_ERRORS, UsageError, one_line
from bertbench.common.flags import (
    FlagName,
    FlagParser,
    IgnoredFlag,
    add_dataclass_flags,
    as_flags,
    build,
    check_fields,
    setting,
)
from bertbench.model.factory import ModelSettings
from bertbench.runners.run_directory import RunRecord, run_flags, run_of_checkpoint
from bertbench.training.checkpoint import latest_checkpoint
from bertbench.training.config import RunConfig, TrainConfig, global_batch
from bertbench.training.step import fallbacks, slow_here
from bertbench.weights.hf import hf_directory_flags, take_checkpoint_flags

# --lr_scaling: the factor on --learning_rate for a number of processes.
LR_SCALINGS = {"none": lambda processes: 1.0, "linear": float, "sqrt": math.sqrt}
# NVIDIA's --optimizer_type names for TrainConfig.optimizer.
OPTIMIZER_TYPES = {"adam": "adamw", "adamw": "adamw", "lamb": "lamb", "nvlamb": "nvlamb"}
# HF's --optim names of the optimizers bertbench has: torch's AdamW (fused, or apex's, is the same rule).
HF_ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused")
# HF's --lr_scheduler_type names for TrainConfig.decay.
HF_SCHEDULERS = {"linear": "linear", "polynomial": "poly"}

# Google's, NVIDIA's and tf.estimator's flag names for RunConfig and TrainConfig fields, and how a flag's value becomes
# the field's; a field not named here is the flag of its own name. What depends on the processes or the phase (the
# steps, --lr_scaling's factor, a warm-up given in steps) is derived by RunnerConfig.train_config.
FLAG_NAMES = (
    FlagName("output_dir", RunConfig, "model_dir"),
    FlagName(
        "save_checkpoints_secs", RunConfig, "save_checkpoints_secs", value=lambda secs: secs if secs > 0 else None
    ),
    FlagName(
        "save_checkpoints_steps",
        RunConfig,
        "save_checkpoints_steps",
        aliases=("num_steps_per_checkpoint", "save_steps"),
    ),
    FlagName("keep_checkpoint_max", RunConfig, "keep_checkpoint_max", aliases=("save_total_limit",)),
    FlagName("log_step_count_steps", RunConfig, "log_step_count_steps", aliases=("log_freq", "logging_steps")),
    FlagName("num_accumulation_steps", TrainConfig, "gradient_accumulation_steps"),
    FlagName(
        "gradient_accumulation_steps",
        TrainConfig,
        "gradient_accumulation_steps",
        note="NVIDIA's PyTorch name, with its meaning of --train_batch_size: the batch of one optimizer step, "
        "cut into this many micro-batches (it must divide it); with HF's --per_device_train_batch_size (or an HF "
        "command's default), HF's meaning: this many micro-batches of that size per step.",
    ),
    FlagName("warmup_proportion", TrainConfig, "warmup_proportion", aliases=("warmup_ratio",)),
    FlagName("decay", TrainConfig, "decay"),
    FlagName(
        "lr_scheduler_type",
        TrainConfig,
        "decay",
        value=lambda kind: None if kind is None else HF_SCHEDULERS[kind],
        choices=tuple(HF_SCHEDULERS),
        default=None,
        note="HF's names: linear, or polynomial (--decay=poly, power --poly_power); HF's others are not here.",
    ),
    FlagName("adam_bias_correction", TrainConfig, "adam_bias_correction"),
    FlagName(
        "optim",
        TrainConfig,
        "adam_bias_correction",
        value=lambda name: None if name is None else True,
        type=str,
        choices=HF_ADAMW,
        default=None,
        note="HF's names for torch's AdamW: --adam_bias_correction (HF's other optimizers are not here).",
    ),
    FlagName(
        "max_grad_norm",
        TrainConfig,
        "max_grad_norm",
        value=lambda norm: norm if norm > 0 else None,
        note="0 or less: no clipping (HF's meaning).",
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
    FlagName("use_xla", TrainConfig, "compile", aliases=("torch_compile",)),
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
        "bf16",
        TrainConfig,
        "precision",
        value=lambda on: "bf16" if on else "fp32",
        type=bool,
        default=False,
        note="Mixed precision in bfloat16: --precision=bf16 (HF's flag).",
    ),
    FlagName(
        "sync_gradients",
        TrainConfig,
        "sync_gradients",
        note="With --no_sync_gradients the runners keep the worker with the best dev metric.",
    ),
)
# Google's, NVIDIA's and HF's flags that mean nothing here: a command that gives one runs, and is told why it is
# ignored; a value that cannot be ignored is refused.
_NO_TPU = "there is no TPU here: bertbench runs on CPUs and CUDA GPUs (--device)"
_SQUAD, _PRETRAINING = ("run_squad",), ("run_pretraining",)
_FINE_TUNING = ("run_classifier", "run_squad")
_NO_HUB = "nothing is read from or written to the Hugging Face hub: the model and the data are local files"
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
    IgnoredFlag(
        "cache_dir",
        "nothing is downloaded, and the features are made in memory at each start, not cached",
        runners=_FINE_TUNING,
    ),
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
    # HF's run_glue.py, run_qa.py and TrainingArguments
    IgnoredFlag(
        "overwrite_output_dir",
        "bertbench deletes nothing: an absent or empty --output_dir starts a new run (on a directory that holds a "
        "run the flag is refused, as bertbench resumes that run)",
        bool,
        runners=_FINE_TUNING,
    ),
    IgnoredFlag(
        "overwrite_cache", "the features are made in memory at each start, not cached", bool, runners=_FINE_TUNING
    ),
    IgnoredFlag(
        "preprocessing_num_workers",
        "the texts are tokenized in batches on the tokenizers library's own threads",
        int,
        runners=_FINE_TUNING,
    ),
    IgnoredFlag(
        "dataloader_num_workers",
        "the features are in memory and each batch is cut from them in the training process",
        int,
        runners=_FINE_TUNING,
    ),
    IgnoredFlag(
        "use_fast_tokenizer",
        "the tokenizer is always the tokenizers library's WordPiece, configured as Google's BERT (HF's slow "
        "BertTokenizer gives the same tokens)",
        bool,
        runners=_FINE_TUNING,
    ),
    IgnoredFlag(
        "pad_to_max_length",
        "the unpadded path computes on the real tokens only, the same maths as padding them to --max_seq_length "
        "(--unpad=false pads)",
        bool,
        runners=_FINE_TUNING,
    ),
    IgnoredFlag(
        "disable_tqdm",
        "the progress bar is drawn only on a terminal; a batch job's output gets one plain line every "
        "--log_step_count_steps",
        bool,
    ),
    IgnoredFlag("run_name", "the run is named by its --output_dir"),
    *(
        IgnoredFlag(name, _NO_HUB, kind, runners=_FINE_TUNING)
        for name, kind in (
            ("model_revision", str),
            ("token", str),
            ("use_auth_token", bool),
            ("trust_remote_code", bool),
        )
    ),
    IgnoredFlag(
        "push_to_hub",
        _NO_HUB,
        bool,
        refuse=lambda on: (
            "bertbench never uploads: `bertbench export OUTPUT_DIR DIR` writes the fine-tuned model as an HF "
            "directory to push yourself"
            if on
            else None
        ),
        runners=_FINE_TUNING,
    ),
    *(
        IgnoredFlag(
            name,
            _NO_HUB,
            refuse=lambda name: (
                "bertbench never downloads a dataset: give local files (--train_file, --validation_file, "
                "--test_file; GLUE's tsv files: --data_dir)"
            ),
            runners=_FINE_TUNING,
        )
        for name in ("dataset_name", "dataset_config_name")
    ),
    *(
        IgnoredFlag(
            name,
            "bertbench evaluates once, after training (--do_eval)",
            refuse=lambda strategy: (
                None
                if strategy == "no"
                else "bertbench evaluates once, after training (--do_eval): leave the flag out or give no"
            ),
            runners=_FINE_TUNING,
        )
        for name in ("eval_strategy", "evaluation_strategy")
    ),
    IgnoredFlag(
        "save_strategy",
        "checkpoints are written every --save_steps (--save_checkpoints_steps) and --save_checkpoints_secs, "
        "and at the end: a run resumes from them",
        refuse=lambda strategy: (
            None
            if strategy in ("steps", "no")
            else "bertbench saves by steps and seconds, not by epoch or best score: give --save_steps"
        ),
        runners=_FINE_TUNING,
    ),
    IgnoredFlag(
        "load_best_model_at_end",
        "bertbench keeps the weights of the last step",
        bool,
        refuse=lambda on: (
            "bertbench evaluates once, after training, and keeps the last step's weights; leave the flag out"
            if on
            else None
        ),
        runners=_FINE_TUNING,
    ),
    IgnoredFlag(
        "label_smoothing_factor",
        "the loss is plain cross-entropy",
        float,
        refuse=lambda factor: (
            "bertbench trains with plain cross-entropy, no label smoothing; leave the flag out" if factor else None
        ),
        runners=_FINE_TUNING,
    ),
)
# HF Trainer's defaults (TrainingArguments) where they differ from Google's, which an HF command (one that gives
# --model_name_or_path, as HF's run_glue.py and run_qa.py take the model) gets for the fields it leaves out: its
# users expect the same command to train the same way. Logging and checkpointing keep bertbench's defaults.
HF_DEFAULTS = {
    "adam_bias_correction": True,  # HF's adamw_torch
    "adam_epsilon": 1e-8,
    "weight_decay": 0.0,
    "warmup_proportion": 0.0,
    "schedule": "hf",
    "per_device_train_batch_size": 8,
}
# TrainConfig fields that change how the training steps run, and so what a run measures, whatever flag sets them
# (--precision, --amp and --use_fp16 all set precision): a resumed training keeps them, as it keeps the model flags
# (ModelSettings' `defines_training`); evaluation and prediction may differ.
TRAINING_FIELDS = ("precision", "compile", "cuda_graphs")
# TrainConfig fields that are no runner's flag: the steps come from the epochs or the phase's steps, a warm-up in steps
# from the runner's flag; the steady-state window stays the loop's.
NOT_FLAGS = ("num_train_steps", "excluded_steps", "warmup_steps")


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
        check_fields(self, self.missing_inputs())

    def missing_inputs(self) -> list[str]:
        """What a runner's own rules find missing beyond its required flags (the data: a flag or another), named
        in the one error check_fields raises."""
        return []
        if self.json_summary is not None and os.path.isdir(self.json_summary):
            raise UsageError(f"--json_summary {self.json_summary}: is a directory; give the file to write")

    @classmethod
    def from_flags(cls, fields: Mapping[str, Any]) -> RunnerSettings:
        """The settings of a command whose flags give `fields` (FlagParser.field_values). A runner whose flags
        include another project's that set several fields together (HF run_qa's --validation_file with --do_eval)
        works them out here."""
        return build(cls, FLAG_NAMES, **fields)


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
    max_eval_samples: int | None = setting(
        "Score the first N examples of each dev set only, for quick runs (HF's flag).", None, positive=True
    )
    max_predict_samples: int | None = setting(
        "Predict the first N examples of each test set only, for quick runs (HF's flag).", None, positive=True
    )
    warmup_steps: int | None = setting(
        "Warm-up steps, instead of --warmup_proportion's share (HF's flag; 0: the share).", None, defines_run=True
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
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise UsageError(f"--warmup_steps must be 0 or more, got {self.warmup_steps}")


def _local_model(path: str | None) -> str | None:
    """HF's --model_name_or_path as the warm start: a local path; bertbench never downloads a hub model id."""
    if path is None or os.path.exists(path) or os.path.exists(f"{path}.index"):  # a TF1 checkpoint's prefix too
        return path
    directory = os.path.basename(path.rstrip("/")) or "model"
    raise UsageError(
        f"--model_name_or_path={path}: no such file or directory, and bertbench never downloads; if it is a hub "
        f"model id, download it once (huggingface-cli download {path} --local-dir {directory}) and give "
        f"--model_name_or_path={directory}"
    )


# HF's names for the runners' own settings (they follow the classes they name; FLAG_NAMES is still the one table).
FLAG_NAMES += (
    FlagName("init_checkpoint", RunnerSettings, "init_checkpoint"),
    FlagName(
        "model_name_or_path",
        FineTuningSettings,
        "init_checkpoint",
        value=_local_model,
        type=str,
        note="HF's name for the warm start, a local HF directory (whose config.json, vocabulary and lower-casing "
        "come with it): the command is then an HF command, with HF Trainer's defaults for what it leaves out "
        "(docs/runners.md); a hub model id is refused, as bertbench never downloads.",
    ),
    FlagName("bert_config_file", RunnerSettings, "bert_config_file", aliases=("config_name",)),
    FlagName("vocab_file", FineTuningSettings, "vocab_file", aliases=("tokenizer_name",)),
    FlagName("train_batch_size", RunnerSettings, "train_batch_size"),
    FlagName(
        "per_device_train_batch_size",
        FineTuningSettings,
        "train_batch_size",
        default=None,
        note="HF's name (8 in an HF command); --gradient_accumulation_steps then has HF's meaning.",
    ),
    FlagName("predict_batch_size", FineTuningSettings, "predict_batch_size"),
    FlagName(
        "per_device_eval_batch_size",
        FineTuningSettings,
        "predict_batch_size",
        default=None,
        also=("eval_batch_size",),
        note="HF's name: the evaluation and the prediction batch.",
    ),
    FlagName("device", RunnerSettings, "device"),
    FlagName(
        "use_cpu",
        RunnerSettings,
        "device",
        value=lambda on: "cpu" if on else None,
        type=bool,
        default=False,
        note="Train on the CPU: --device=cpu (HF's flag).",
    ),
)


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
    (`args`, read-only), which bertbench_run.json records but for the `per_command` ones: code reads the sections."""

    model: ModelSettings
    run: RunConfig
    train: TrainConfig | None  # None without --do_train; num_train_steps None: the job derives it (train_config)
    task: RunnerSettings
    args: Mapping[str, Any]
    per_command: frozenset[str]
    notes: tuple[str, ...] = ()
    new_phase: bool = False  # the command starts the next phase of the run its output_dir holds (RunnerSpec)

    def global_batch(self, world_size: int) -> int:
        """Sequences per optimizer step over every process: micro-batch x accumulation x processes."""
        return global_batch(self.task.train_batch_size, self.train.gradient_accumulation_steps, world_size)

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

    def train_config(
        self, world_size: int, num_train_steps: int, device: torch.device | str, **derived: Any
    ) -> tuple[TrainConfig, list[str]]:
        """The TrainConfig this job trains with, built once from the flags' fields (`train`), the job and its device:
        `num_train_steps`, the learning rate scaled for the processes, a fine-tuning run's --warmup_steps, the fields
        a runner derives (`derived`: a warm-up given in steps), and what runs on `device` instead of a setting that
        cannot apply there (training.step.fallbacks); with the log's one-line note for each such setting and each
        setting that runs there many times slower than another would (training.step.slow_here). The run
        record keeps the flags as given, so the same command resumes; train_results.json says what ran."""
        warmup = getattr(self.task, "warmup_steps", None)
        changes = fallbacks(self.train, device)
        config = build(
            TrainConfig,
            FLAG_NAMES,
            **{
                **dataclasses.asdict(self.train),
                "num_train_steps": num_train_steps,
                "learning_rate": self.learning_rate(world_size),
                **({"warmup_steps": warmup} if warmup else {}),  # HF's 0: --warmup_proportion's share
                **derived,
                **{change.field: change.value for change in changes},
            },
        )
        return config, [change.note for change in changes] + slow_here(config, device)


def build_parser(spec: RunnerSpec, prog: str | None = None) -> FlagParser:
    """One flag per field of the runner's settings, of ModelSettings, RunConfig and TrainConfig (FLAG_NAMES)."""
    parser = FlagParser(prog=prog or spec.name, description=spec.description)
    add_dataclass_flags(parser, spec.settings, FLAG_NAMES, defaults=spec.defaults)
    add_dataclass_flags(parser, TrainConfig, FLAG_NAMES, NOT_FLAGS + spec.omit, spec.defaults)
    add_dataclass_flags(parser, RunConfig, FLAG_NAMES)
    add_dataclass_flags(parser, ModelSettings)
    parser.ignored_flags(
        [flag for flag in IGNORED_FLAGS if not flag.runners or spec.name in flag.runners],
        "Google's, NVIDIA's and HF's flags that mean nothing here (accepted, with a note)",
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
    overwrite = given.get("overwrite_output_dir")
    notes = parser.notes(given)
    record = RunRecord.read(given["output_dir"])
    if overwrite and (record is not None or latest_checkpoint(given["output_dir"]) is not None):
        raise UsageError(
            f"--overwrite_output_dir: {given['output_dir']} holds a run, and bertbench never deletes one (the same "
            "command without the flag resumes it); give a new --output_dir to start afresh"
        )
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
    stated = {**recorded, **given}
    hf = hf_defaults(parser, stated)
    values = {**parser.defaults, **hf, **stated}
    if hf and values["do_train"]:
        defaults = " ".join(as_flags(hf))
        notes.append(f"HF Trainer's defaults for what this HF command (--model_name_or_path) leaves out: {defaults}")
    # An HF directory or a bertbench run as --init_checkpoint says the model config, vocabulary and lower-casing the
    # flags leave out.
    init_checkpoint = parser.field_values(spec.settings, values).get("init_checkpoint")
    warm_run = run_of_checkpoint(init_checkpoint)
    found = (
        run_flags(warm_run) if warm_run is not None else hf_directory_flags(init_checkpoint) if init_checkpoint else {}
    )
    taken, note = take_checkpoint_flags(found, init_checkpoint if found else None, stated, parser.defaults)
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
    settings["train_batch_size"], note = micro_batch(values, settings["train_batch_size"])
    notes.extend([note] if note else [])
    config = RunnerConfig(
        model=build(ModelSettings, **parser.field_values(ModelSettings, values)),
        run=build(RunConfig, FLAG_NAMES, **parser.field_values(RunConfig, values)),
        train=build(TrainConfig, FLAG_NAMES, **train_fields) if values["do_train"] else None,
        task=spec.settings.from_flags(settings),
        args=MappingProxyType(values),
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
            f"--{spec.phase_flag} on {given['output_dir']}, which holds phase 1 of a run, and "
            f"--init_checkpoint={other}: phase 2 goes on from one of them; leave --init_checkpoint out to go on in "
            "place, or give a new --output_dir"
        )
    return True


def hf_defaults(parser: FlagParser, stated: Mapping[str, Any]) -> dict[str, Any]:
    """HF_DEFAULTS for an HF command (`stated`, the flags it gives and its run recorded, holds --model_name_or_path):
    those of the parser's flags whose field none of the stated flags sets."""
    if stated.get("model_name_or_path") is None:
        return {}
    set_fields = {id(parser.fields[name]) for name in stated if name in parser.fields}
    return {
        name: value
        for name, value in HF_DEFAULTS.items()
        if name in parser.fields and id(parser.fields[name]) not in set_fields
    }


def micro_batch(values: Mapping[str, Any], batch: int) -> tuple[int, str | None]:
    """The micro-batch of a command whose flags (`values`) give the batch `batch`, and a note of how it was read.
    --gradient_accumulation_steps N has NVIDIA's meaning (--train_batch_size is the batch of one optimizer step, cut
    into N micro-batches) except with HF's --per_device_train_batch_size, where it has HF's (N micro-batches of that
    size per step)."""
    cut = values.get("gradient_accumulation_steps", 1)
    if cut == 1:
        return batch, None
    if values.get("per_device_train_batch_size") is not None:
        return batch, (
            f"--per_device_train_batch_size={batch} with --gradient_accumulation_steps={cut} (HF's meaning): "
            f"{cut} micro-batches of {batch} sequences per optimizer step"
        )
    if batch % cut:
        raise UsageError(
            f"--train_batch_size {batch} is the batch of one optimizer step with --gradient_accumulation_steps "
            f"(NVIDIA's meaning), so it must divide by {cut}"
        )
    return batch // cut, (
        f"--train_batch_size={batch} with --gradient_accumulation_steps={cut} (NVIDIA's meaning): micro-batches of "
        f"{batch // cut} sequences"
    )
