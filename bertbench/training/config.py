"""What a training run is: RunConfig (where it keeps checkpoints, how often it saves and logs) and TrainConfig (the
optimisation: steps, optimizer, schedule, clipping, accumulation, precision, compile). The loop, the training step
and the benches all read these; the runners' flags are generated from their fields (bertbench.common.flags): the help
text, and in metadata the choices, whether a field defines the trained weights (`defines_run`: a resumed run must keep
it) and whether it holds for one command only (`per_command`: not recorded in the run directory).
"""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass, field

from bertbench.model.precision import PRECISIONS
from bertbench.training import optim

# --report_to's values (HF Trainer's flag): bertbench's one integration is TensorBoard.
REPORT_TO = ("tensorboard", "all", "none")
# HF Trainer's other integrations, by the module whose presence says it is installed.
OTHER_INTEGRATIONS = {
    "azure_ml": "azureml",
    "clearml": "clearml",
    "codecarbon": "codecarbon",
    "comet_ml": "comet_ml",
    "dagshub": "dagshub",
    "dvclive": "dvclive",
    "flyte": "flytekit",
    "kubeflow": "kubeflow",
    "mlflow": "mlflow",
    "neptune": "neptune",
    "swanlab": "swanlab",
    "trackio": "trackio",
    "wandb": "wandb",
}


@dataclass(frozen=True)
class RunConfig:
    """Where a run keeps its checkpoints and logs and how often it writes them (tf.estimator.RunConfig's names; HF
    Trainer's for report_to and logging_dir)."""

    model_dir: str = field(
        metadata={
            "help": "Directory of the run's checkpoints and logs; a run started on a "
            "directory holding a checkpoint resumes from it.",
            "per_command": True,
        }
    )
    save_checkpoints_secs: float | None = field(
        default=1200,
        metadata={
            "help": "Save a checkpoint every this many seconds of wall-clock time (None, or 0 on the command line: not "
            "on a timer)."
        },
    )
    save_checkpoints_steps: int | None = field(
        default=None,
        metadata={"help": "Save a checkpoint every this many steps (None: not by steps). Either, both or neither."},
    )
    keep_checkpoint_max: int = field(
        default=1, metadata={"help": "Checkpoints kept; older ones are deleted once a newer one is completely written."}
    )
    log_step_count_steps: int = field(
        default=100,
        metadata={"help": "Log loss and throughput every this many steps (to the console and metrics.jsonl)."},
    )
    seed: int = field(
        default=42,
        metadata={
            "help": "Seed of the data order and of dropout (the runners also seed a new model's weights with it).",
            "defines_run": True,
        },
    )
    report_to: str = field(
        default="tensorboard",
        metadata={
            "help": "Where the figures go besides metrics.jsonl and eval_results.json (HF Trainer's flag): "
            "tensorboard (TensorBoard event files: training's in --logging_dir, evaluations' in its eval/), all "
            "(every integration bertbench has: tensorboard) or none (no event file written or changed)."
        },
    )
    logging_dir: str | None = field(
        default=None,
        metadata={
            "help": "Directory of the training event files, the evaluations' in its eval/ (HF Trainer's flag; "
            "default: the output directory, tf.estimator's layout). One run's only: a fresh run starts it afresh."
        },
    )

    def __post_init__(self) -> None:
        if self.save_checkpoints_secs is not None and self.save_checkpoints_secs <= 0:
            raise ValueError(f"save_checkpoints_secs must be positive, got {self.save_checkpoints_secs}")
        if self.save_checkpoints_steps is not None and self.save_checkpoints_steps < 1:
            raise ValueError(f"save_checkpoints_steps must be at least 1, got {self.save_checkpoints_steps}")
        if self.keep_checkpoint_max < 1:
            raise ValueError(f"keep_checkpoint_max must be at least 1, got {self.keep_checkpoint_max}")
        if self.log_step_count_steps < 1:
            raise ValueError(f"log_step_count_steps must be at least 1, got {self.log_step_count_steps}")
        names = self.report_names
        for name in names:
            check_report_to(name)
        if "none" in names and len(names) > 1:
            raise ValueError(f"report_to {self.report_to}: none means no integration, so it stands alone")
        if self.logging_dir is not None and os.path.isfile(self.logging_dir):
            raise ValueError(f"logging_dir {self.logging_dir}: is a file; give the directory of the event files")

    @property
    def report_names(self) -> list[str]:
        """report_to's comma-separated names."""
        return [name.strip() for name in self.report_to.split(",")]

    @property
    def reports_to_tensorboard(self) -> bool:
        return "none" not in self.report_names

    @property
    def events_dir(self) -> str:
        """Where the training event files go: logging_dir, or the run directory."""
        return self.logging_dir or self.model_dir


def check_report_to(name: str) -> None:
    """A --report_to value other than REPORT_TO's is one line: for another of HF's integrations, whether its package
    is here and what bertbench gives instead; for any other name, the values."""
    if name in REPORT_TO:
        return
    if name in OTHER_INTEGRATIONS:
        module = OTHER_INTEGRATIONS[name]
        installed = "installed" if importlib.util.find_spec(module) is not None else "not installed"
        raise ValueError(
            f"report_to {name}: bertbench has no {name} integration ({module} is {installed} here); every figure is "
            "in metrics.jsonl and eval_results.json, and report_to tensorboard (the default) writes them as "
            "TensorBoard event files"
        )
    raise ValueError(
        f"report_to {name!r} is not a value: give tensorboard (the default: TensorBoard event files), all (every "
        "integration bertbench has: tensorboard) or none"
    )


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation: steps, optimizer, schedule, precision."""

    num_train_steps: int | None = field(
        default=None,
        metadata={
            "help": "Optimizer steps of the whole run (a resumed run continues to the same number); None until the job "
            "derives it (a runner's from the epochs or the phase's steps): the loop needs it.",
            "defines_run": True,
        },
    )
    learning_rate: float = field(default=5e-5, metadata={"help": "Peak learning rate.", "defines_run": True})
    warmup_proportion: float = field(
        default=0.1, metadata={"help": "Share of the steps in linear warm-up.", "defines_run": True}
    )
    decay: str = field(
        default="linear",
        metadata={
            "help": "After warm-up: linear or poly(nomial) decay to 0.",
            "choices": optim.DECAYS,
            "defines_run": True,
        },
    )
    decay_power: float = field(
        default=1.0,
        metadata={"help": "Power of the polynomial decay (1 is Google's linear decay).", "defines_run": True},
    )
    schedule: str = field(
        default="google",
        metadata={
            "help": "How warm-up and decay fit together. google (Google's and NVIDIA's BERT): the decay spans every "
            "step from the first, and the warm-up, floor(warmup_proportion x steps) of them, overrides its start; "
            "hf (HF Trainer's get_scheduler): ceil(warmup_proportion x steps) warm-up steps, then the decay from "
            "the peak over the rest (poly: to HF's lr_end 1e-7).",
            "choices": optim.SCHEDULES,
            "defines_run": True,
        },
    )
    warmup_steps: int | None = field(
        default=None,
        metadata={
            "help": "Warm-up steps, instead of warmup_proportion's share (a runner derives it from a flag that gives "
            "them); None: warmup_proportion.",
            "defines_run": True,
        },
    )
    optimizer: str = field(
        default="adamw",
        metadata={
            "help": "adamw (see adam_bias_correction), lamb (apex FusedLAMB: the trust ratio on the decayed weights "
            "only) or nvlamb (the trust ratio on every tensor, NVIDIA's TF LAMB).",
            "choices": optim.OPTIMIZERS,
            "defines_run": True,
        },
    )
    adam_bias_correction: bool = field(
        default=False,
        metadata={
            "help": "adamw's rule. False: Google's/NVIDIA's AdamWeightDecayOptimizer, no bias correction, the rule the "
            "original recipes' learning rates are for; True: torch.optim.AdamW, HF Trainer's default, with "
            "bias correction (updates several times smaller over the first hundreds of steps at the same "
            "learning rate). LAMB is always bias-corrected, as apex's.",
            "defines_run": True,
        },
    )
    adam_beta1: float = field(
        default=0.9, metadata={"help": "The optimizer's first-moment decay (every rule).", "defines_run": True}
    )
    adam_beta2: float = field(
        default=0.999, metadata={"help": "The optimizer's second-moment decay (every rule).", "defines_run": True}
    )
    adam_epsilon: float = field(
        default=1e-6,
        metadata={"help": "The optimizer's epsilon (Google's 1e-6; HF Trainer's is 1e-8).", "defines_run": True},
    )
    weight_decay: float = field(
        default=0.01, metadata={"help": "Decoupled weight decay (not on biases and LayerNorm).", "defines_run": True}
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={"help": "Micro-batches per optimizer step; the step's batch is their sum.", "defines_run": True},
    )
    max_grad_norm: float | None = field(
        default=1.0, metadata={"help": "Clip the global gradient norm to this (Google's 1.0); None: no clipping."}
    )
    precision: str = field(
        default="fp32",
        metadata={
            "help": "fp32, fp16 (autocast + dynamic loss scaling; a "
            "CUDA GPU's: on a CPU the run trains in fp32) or bf16 "
            "(autocast).",
            "choices": PRECISIONS,
        },
    )
    compile: bool = field(
        default=False,
        metadata={
            "help": "Run the training forward/backward through "
            "torch.compile (the original --use_xla); where it cannot "
            "run (no C++ compiler for a CPU) the run trains eagerly."
        },
    )
    cuda_graphs: bool = field(
        default=True,
        metadata={
            "help": "On a CUDA GPU, replay each micro-batch's forward and backward from a CUDA graph (one per bucketed "
            "batch size), so that kernel launches do not hold the GPU back. Applies to the baseline model in one "
            "process (or independent workers) on the padded path or flash attention's; train_results.json says "
            "whether it ran and why not."
        },
    )
    excluded_steps: int = field(
        default=10,
        metadata={
            "help": "Steps at the start of each run left out of the steady-state throughput (start-up, compilation)."
        },
    )
    sync_gradients: bool = field(
        default=True,
        metadata={
            "help": "Under torchrun, all-reduce the gradients (data parallel). False: independent workers, each "
            "training its own copy on its shard of the data with no communication of gradients.",
            "defines_run": True,
        },
    )
    max_train_seconds: float | None = field(
        default=None,
        metadata={
            "help": "Stop training after this many seconds of training-loop wall-clock time in this invocation "
            "(checkpoint saves included), save a checkpoint, and go on to evaluation (a fixed-time budget, the "
            "original suite's 20-minute comparison). The learning-rate schedule stays that of num_train_steps: "
            "the budget only cuts the run short. None: train to num_train_steps.",
            "per_command": True,
        },
    )

    def __post_init__(self) -> None:
        if self.num_train_steps is not None and self.num_train_steps < 1:
            raise ValueError(f"num_train_steps must be at least 1, got {self.num_train_steps}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        if self.gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be at least 1, got {self.gradient_accumulation_steps}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be positive, got {self.max_grad_norm}")
        if self.optimizer not in optim.OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; choose one of {', '.join(optim.OPTIMIZERS)}")
        if self.decay not in optim.DECAYS:
            raise ValueError(f"unknown decay {self.decay!r}; choose one of {', '.join(optim.DECAYS)}")
        if self.schedule not in optim.SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; choose one of {', '.join(optim.SCHEDULES)}")
        if not (0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1 and 0 < self.adam_epsilon < math.inf):
            raise ValueError(
                f"adam_beta1 and adam_beta2 must be in [0, 1) and adam_epsilon positive, got {self.adam_beta1}, "
                f"{self.adam_beta2} and {self.adam_epsilon}"
            )
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be at least 0, got {self.warmup_steps}")
        if not self.sync_gradients and self.precision == "fp16":
            raise ValueError(
                "independent workers need fp32 or bf16: fp16 loss scaling skips overflowing steps on "
                "each worker separately, and the workers must stay at the same step"
            )
        if self.max_train_seconds is not None and self.max_train_seconds <= 0:
            raise ValueError(f"max_train_seconds must be positive, got {self.max_train_seconds}")
        if not 0 < self.learning_rate < math.inf or not 0 <= self.warmup_proportion <= 1 or self.excluded_steps < 0:
            raise ValueError(
                f"invalid learning_rate {self.learning_rate}, warmup_proportion "
                f"{self.warmup_proportion} or excluded_steps {self.excluded_steps}"
            )


def global_batch(batch: int, accumulation: int, processes: int) -> int:
    """Sequences per optimizer step over every process: the per-process micro-batch x accumulation x processes."""
    return batch * accumulation * processes
