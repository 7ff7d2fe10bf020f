"""The one skeleton every runner runs (run_task), and the parts each runner fills in (TaskRunner's methods).

A command: parse its flags once (runners.config), load the model's config, then in the job's processes read and
check every input file, check the run directory's record, hold the directory, build the model (where the run starts
is decided there, once), derive the steps, build the Estimator, and only then write: the record, training, its
results; or, without training, restore the run's checkpoint; then evaluate and predict. Every error on the way has
one exit status (bertbench.common.errors): a user's bad input 2, with nothing written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

import torch
from torch import nn

from bertbench.common.errors import UsageError, one_line, run_command
from bertbench.model.config import BertConfig, ConfigError
from bertbench.runners.config import RunnerConfig, RunnerSettings, RunnerSpec, config_from_values, parse_config
from bertbench.runners.results import JsonSummary, interrupted_status, report_training
from bertbench.runners.run_directory import (
    Log,
    RunRecord,
    check_record,
    hold_run_directory,
    remove_leftovers,
    write_record,
)
from bertbench.tasks.tokenization import BertTokenizer, VocabError
from bertbench.training import progress
from bertbench.training.batches import ShuffledBatches
from bertbench.training.checkpoint import CheckpointError
from bertbench.training.devices import physical_memory_bytes
from bertbench.training.distributed import Distributed, describe_placement, job_from_environment
from bertbench.training.loop import Estimator, TrainingDivergedError
from bertbench.training.state import RESTORE, WARM_START, RunStart, decide_start, seed_everything, trains_independently
from bertbench.training.stats import TrainResult
from bertbench.weights.pretrained import LoadReport, find_weights, load_pretrained, read_weights
from bertbench.weights.tf_checkpoint import TFCheckpointError
from bertbench.weights.tf_names import WeightsError

# Errors a user's input causes (exit status 2, see bertbench.common.errors), each naming its file or flag; and the
# runtime failures of a run (exit status 1).
INPUT_ERRORS = (ConfigError, VocabError, WeightsError, CheckpointError, TFCheckpointError)
RUNTIME_FAILURES = (TrainingDivergedError, torch.cuda.OutOfMemoryError)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskData:
    """What a task reads before its model is built, so that a bad file does not surface after hours of training:
    how many sequences it trains on, what they are for the log, the head's arguments; a runner's subclass adds the
    rest (features, batches, what it scores and predicts)."""

    num_train_sequences: int = 0
    description: str = ""
    head_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    """What a job trains, derived once its start is known: the run's last step, TrainConfig fields the runner
    derives (a warm-up given in steps), and what the run record keeps of them (where a phase 2's phase 1 ended)."""

    num_train_steps: int
    derived: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    recorded: Mapping[str, Any] | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskRunner(RunnerSpec):
    """A runner: its flags (RunnerSpec) and the steps of run_task it fills in. `model_task` is the head
    (model.factory.TASKS)."""

    model_task: str

    def load(self, settings: RunnerSettings) -> tuple[BertConfig, BertTokenizer | None]:
        """The model config (and a fine-tuning runner's tokenizer), checked."""
        return load_bert_config(settings), None

    def read(
        self,
        config: RunnerConfig,
        bert_config: BertConfig,
        tokenizer: BertTokenizer | None,
        dist: Distributed,
        log: Log,
        cleanup: contextlib.ExitStack,
    ) -> TaskData:
        """Every input file the command needs, read and checked before anything is written."""
        raise NotImplementedError

    def continues_phase(self, config: RunnerConfig) -> bool:
        """Whether training starts from an earlier phase's state (pre-training's phase 2)."""
        return False

    def earlier_phase_end(self, config: RunnerConfig, record: RunRecord | None) -> float | None:
        """The step up to which output_dir's checkpoints are an earlier phase's, continued from rather than resumed
        (training.state.decide_start); None when it holds no earlier phase."""
        return None

    def plan(
        self, config: RunnerConfig, data: TaskData, start: RunStart, record: RunRecord | None, dist: Distributed
    ) -> TrainingPlan:
        raise NotImplementedError

    def train(
        self,
        config: RunnerConfig,
        estimator: Estimator,
        data: TaskData,
        start: RunStart,
        plan: TrainingPlan,
        dist: Distributed,
        log: Log,
        summary: JsonSummary,
    ) -> TrainResult:
        """Train (resuming the run, or continuing an earlier phase), write train_results.json, and give `summary`
        the training figures NVIDIA's scripts log."""
        raise NotImplementedError

    def infer(
        self, config: RunnerConfig, estimator: Estimator, data: TaskData, dist: Distributed, log: Log
    ) -> Mapping[str, float]:
        """Evaluation and prediction after training (or of the run's checkpoint); returns the figures NVIDIA's
        scripts log of them (JsonSummary)."""
        raise NotImplementedError

    def main(self, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
        """The runner's command line: parse it (runners.config) and run it."""
        return self._run(prog or self.name, lambda: parse_config(self, argv, prog))

    def run_values(self, values: Mapping[str, Any], output: TextIO | None = None) -> int:
        """Run a command given as Python values by flag name (runners.config.config_from_values), under the same
        exit-code policy as main: what the demo and the benches call. `output` takes the run's log and its error
        line instead of stdout and stderr."""
        with contextlib.ExitStack() as stack:
            if output is not None:
                stack.enter_context(contextlib.redirect_stdout(output))
                stack.enter_context(contextlib.redirect_stderr(output))
            return self._run(self.name, lambda: config_from_values(self, values))

    def _run(self, program: str, parse: Callable[[], tuple[RunnerConfig, RunRecord | None]]) -> int:
        return run_command(
            program,
            lambda: run_task(self, *parse()),
            input_errors=INPUT_ERRORS + self.input_errors,
            runtime_errors=RUNTIME_FAILURES,
        )


def run_task(runner: TaskRunner, config: RunnerConfig, record: RunRecord | None) -> int:
    """The skeleton (see the module's doc). Returns the exit status."""
    summary = JsonSummary(config)  # NVIDIA's e2e times run from the command's start
    task = config.task
    bert_config, tokenizer = runner.load(task)
    with job_from_environment(task.device) as dist, contextlib.ExitStack() as cleanup:
        log = main_process_log(dist)
        for note in config.notes:
            log(f"note: {note}")
        if dist.enabled:
            log(describe_placement(dist.placement))
        data = runner.read(config, bert_config, tokenizer, dist, log, cleanup)
        check_record(record, bert_config, config, dist)
        with hold_run_directory(config.run.model_dir, task.do_train, record, dist, log):
            start = decide_run_start(config, runner, record, dist, log)
            # Every check that needs no model (the steps a run can take from its data) comes before the model loads.
            plan = runner.plan(config, data, start, record, dist) if task.do_train else None
            model, warm_start = build_model(config, runner.model_task, bert_config, start, log, **data.head_kwargs)
            estimator = build_estimator(config, model, dist, plan)
            remove_leftovers(config.run.model_dir, dist, log)
            if task.do_train:
                write_record(record, runner.name, config, bert_config, dist, plan.recorded)
                result = runner.train(config, estimator, data, start, plan, dist, log, summary)
                if result.interrupted_by is not None:
                    return interrupted_status(result)
            else:
                restore_for_inference(estimator, start, warm_start)
            summary.log([], runner.infer(config, estimator, data, dist, log))
            summary.write(dist.is_main)
        return 0


def load_bert_config(settings: RunnerSettings) -> BertConfig:
    """The model config, checked against --max_seq_length and against what every runner feeds it (two segments)."""
    config = BertConfig.from_json_file(settings.bert_config_file)
    if config.type_vocab_size < 2:
        raise UsageError(
            f"{settings.bert_config_file}: type_vocab_size is {config.type_vocab_size}; BERT's inputs "
            "have two segments (sentence A and B), so it must be at least 2"
        )
    if settings.max_seq_length > config.max_position_embeddings:
        raise UsageError(
            f"{settings.bert_config_file}: max_position_embeddings is {config.max_position_embeddings}, "
            f"so --max_seq_length {settings.max_seq_length} cannot be used"
        )
    weight_bytes, memory_bytes = 4 * config.encoder_parameter_count(), physical_memory_bytes()
    if memory_bytes and weight_bytes > memory_bytes:  # built in fp32 on the host, whatever the device
        # The parts that make the size (a tenth of it or more), largest first, each with the keys that size it.
        parts = sorted(
            (
                (4 * count, part, keys)
                for part, (count, keys) in config.parameter_parts().items()
                if 4 * count >= weight_bytes / 10
            ),
            reverse=True,
        )
        raise UsageError(
            f"{settings.bert_config_file}: the model's fp32 weights alone take "
            f"{weight_bytes / 2**30:,.1f} GiB ("
            + "; ".join(f"{part}: {keys}, {size / 2**30:,.1f} GiB" for size, part, keys in parts)
            + f"), more than this machine's {memory_bytes / 2**30:,.1f} GiB of memory"
        )
    return config


def main_process_log(dist: Distributed) -> Log:
    """The log (progress.log) on rank 0, nothing elsewhere: one copy of each line however many processes run."""
    return progress.log if dist.is_main else (lambda line: None)


def decide_run_start(
    config: RunnerConfig, runner: TaskRunner, record: RunRecord | None, dist: Distributed, log: Log
) -> RunStart:
    """Where the run starts (training.state.decide_start): training resumes output_dir's checkpoint, continues an
    earlier phase (the runner's continues_phase; in output_dir itself, its earlier_phase_end), warm-starts from
    --init_checkpoint or starts afresh; evaluation and prediction restore the run's checkpoint or warm-start from
    --init_checkpoint."""
    training = config.task.do_train
    return decide_start(
        config.run.model_dir,
        training=training,
        init_checkpoint=config.task.init_checkpoint,
        continue_phase=training and runner.continues_phase(config),
        earlier_phase_end=runner.earlier_phase_end(config, record) if training else None,
        dist=dist,
        independent_workers=trains_independently(config.train, dist),
        log=log,
    )


def build_model(
    config: RunnerConfig, task: str, bert_config: BertConfig, start: RunStart, log: Log, **head_kwargs
) -> tuple[nn.Module, LoadReport | None]:
    """The task model from the chosen modeling module, seeded; a warm start's weights loaded into it (read and
    checked first: a checkpoint that cannot be this model's is refused before the model is built), with what was
    loaded in the log."""
    settings = config.task
    weights = (
        read_weights(find_weights(start.checkpoint), bert_config, whole_encoder=False)  # load_pretrained checks it
        if start.kind == WARM_START
        else None
    )
    seed_everything(config.run.seed)
    try:
        model = config.model.build(task, bert_config, **head_kwargs)
    except RuntimeError as error:
        if "allocate" not in str(error):
            raise
        raise MemoryError(
            f"{settings.bert_config_file}: the model does not fit in this machine's memory "
            f"({one_line(error).split('. ', 1)[-1]})"
        ) from None
    if weights is None:
        return model, None
    report = load_pretrained(model, weights, allow_partial=settings.allow_partial_init_checkpoint, log=log)
    log(str(report))
    return model, report


def build_estimator(config: RunnerConfig, model: nn.Module, dist: Distributed, plan: TrainingPlan | None) -> Estimator:
    """An Estimator with the command's RunConfig and, to train, the TrainConfig this job trains with
    (RunnerConfig.train_config: the flags', the plan's steps, the device's fallbacks), each setting that cannot apply
    on the device noted in the log."""
    train_config, notes = None, []
    if plan is not None:
        train_config, notes = config.train_config(dist.world_size, plan.num_train_steps, dist.device, **plan.derived)
    estimator = Estimator(model, config.run, train_config, dist)
    for note in notes:
        estimator.log(f"note: {note}")
    return estimator


def restore_for_inference(estimator: Estimator, start: RunStart, warm_start: LoadReport | None) -> None:
    """Without training, evaluation and prediction score the run's checkpoint (or the warm start's weights, at the
    step they were saved at, when they say it)."""
    if start.kind == RESTORE:
        estimator.restore(start.checkpoint, verify=False)  # decide_start verified it
    elif warm_start is not None:
        estimator.global_step = warm_start.step or 0


# ---- the fine-tuning runners: features in memory, epochs, independent workers chosen by a dev figure --------------


@dataclasses.dataclass(frozen=True)
class WorkerScore:
    """How independent workers (--no_sync_gradients) are compared: `score(estimator)` is the dev figure of this
    rank's model."""

    name: str  # e.g. "dev_acc", "f1"
    score: Callable[[Estimator], float]


@dataclasses.dataclass(frozen=True, kw_only=True)
class FineTuningData(TaskData):
    """A fine-tuning task's training features (with --do_train) and the dev figure that chooses among independent
    workers (asked for only then)."""

    train: Mapping[str, torch.Tensor] | None = None
    worker_score: WorkerScore | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class FineTuningRunner(TaskRunner):
    """GLUE's and SQuAD's runner. A task gives `scored_by`, the flag whose dev figure chooses among independent
    workers, and three functions of its settings: `read_files(settings, tokenizer, log)`, every file the command
    needs; `dev_score(settings, data)`, that dev figure (asked for independent workers only; a UsageError when the
    data cannot tell); `evaluate(settings, estimator, data, is_main, log)`, evaluation and predictions after
    training, returning the figures NVIDIA's scripts log of them."""

    scored_by: str
    read_files: Callable[[Any, BertTokenizer, Log], FineTuningData]
    dev_score: Callable[[Any, FineTuningData], WorkerScore]
    evaluate: Callable[[Any, Estimator, FineTuningData, bool, Log], Mapping[str, float]]

    def load(self, settings: Any) -> tuple[BertConfig, BertTokenizer]:
        """The model config and tokenizer, checked against each other and against --max_seq_length."""
        bert_config = load_bert_config(settings)
        tokenizer = BertTokenizer.from_vocab_file(settings.vocab_file, do_lower_case=settings.do_lower_case)
        if tokenizer.vocab_size > bert_config.vocab_size:
            raise UsageError(
                f"{settings.vocab_file}: {tokenizer.vocab_size} tokens, but {settings.bert_config_file} "
                f"has vocab_size {bert_config.vocab_size}: this vocab does not belong to this model"
            )
        return bert_config, tokenizer

    def read(
        self,
        config: RunnerConfig,
        bert_config: BertConfig,
        tokenizer: BertTokenizer | None,
        dist: Distributed,
        log: Log,
        cleanup: contextlib.ExitStack,
    ) -> FineTuningData:
        settings = config.task
        independent = settings.do_train and not config.train.sync_gradients
        if independent and not getattr(settings, self.scored_by):
            raise UsageError(
                f"--no_sync_gradients keeps the worker with the best dev metric: it needs --{self.scored_by}"
            )
        data = self.read_files(settings, tokenizer, log)
        return dataclasses.replace(data, worker_score=self.dev_score(settings, data)) if independent else data

    def plan(
        self, config: RunnerConfig, data: FineTuningData, start: RunStart, record: RunRecord | None, dist: Distributed
    ) -> TrainingPlan:
        return TrainingPlan(config.epoch_steps(data.num_train_sequences, dist.world_size))

    def train(
        self,
        config: RunnerConfig,
        estimator: Estimator,
        data: FineTuningData,
        start: RunStart,
        plan: TrainingPlan,
        dist: Distributed,
        log: Log,
        summary: JsonSummary,
    ) -> TrainResult:
        """Train on the task's features (resuming from output_dir's newest checkpoint) and report; independent
        workers then keep the best by the data's worker score."""
        settings, train = config.task, estimator.train_config
        mode = "independent workers" if estimator.independent_workers else "processes"
        log(
            f"***** Training {data.description}, {train.num_train_steps} steps, batch {settings.train_batch_size} "
            f"x {train.gradient_accumulation_steps} x {dist.world_size} {mode}, {config.model.modeling} model, "
            f"{train.precision} on {dist.device}, learning rate {train.learning_rate:g}"
            + (f", time budget {train.max_train_seconds:g} s" if train.max_train_seconds is not None else "")
            + " *****"
        )
        batches = ShuffledBatches(data.train, settings.train_batch_size, config.run.seed, dist.rank, dist.world_size)
        result = estimator.train(batches, start)
        selection = {}
        if result.interrupted_by is None and estimator.independent_workers:
            worker_score = data.worker_score
            best, scores = estimator.keep_best_worker(lambda: worker_score.score(estimator))
            log(
                f"independent workers' {worker_score.name}: "
                + ", ".join(f"worker {rank} {score:.4f}" for rank, score in enumerate(scores))
                + f"; keeping worker {best}"
            )
            selection = {"selection_metric": worker_score.name, "worker_scores": scores, "selected_worker": best}
        report_training(result, config, estimator, dist, log, selection)
        if result.steps:  # run_squad's and run_glue's training figures: the loop's time and sequences/s
            summary.log(
                [],
                {
                    "e2e_train_time": result.seconds,
                    "training_sequences_per_second": result.sentences_per_second,
                    "final_loss": result.final_loss,
                },
            )
        return result

    def infer(
        self, config: RunnerConfig, estimator: Estimator, data: FineTuningData, dist: Distributed, log: Log
    ) -> Mapping[str, float]:
        return self.evaluate(config.task, estimator, data, dist.is_main, log)
