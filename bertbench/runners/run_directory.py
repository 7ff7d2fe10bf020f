"""A runner's run directory (--output_dir): its record, bertbench_run.json (which runner made it, with which flags,
model and processes), checked against each later command; the directory held for one command (runners.run_lock);
and what it says of the run's history (saved checkpoints)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from bertbench import __version__
from bertbench.common.durable import read_json, write_atomically
from bertbench.common.errors import UsageError
from bertbench.common.run_files import EVAL_RESULTS, EVAL_RESULTS_TEXT, METRICS, RUN_RECORD, TRAIN_RESULTS
from bertbench.model.config import BertConfig
from bertbench.runners.run_lock import RunDirectoryBusy, RunLock
from bertbench.training import optim
from bertbench.training.checkpoint import (
    checkpoint_step,
    holds_training_state,
    remove_temporary_files,
)
from bertbench.training.config import RunConfig
from bertbench.training.distributed import Distributed
from bertbench.training.events import eval_events_dir, event_files
from bertbench.training.metrics import scan_log

Log = Callable[[str], None]  # where a runner's lines go: progress.log on rank 0, nothing elsewhere
# What a phase's results are, kept as phase<N>_<name> when the run's next phase goes on in its directory.
PHASE_RESULTS = (TRAIN_RESULTS, EVAL_RESULTS, EVAL_RESULTS_TEXT)


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """bertbench_run.json: which runner made the run directory, its flags (by name), model config and process
    count, what the run derived from them once (`derived`: where a phase 2's phase 1 ended), and the earlier phases
    of a run that went on in their directory (`phases`: each one's flags, processes and derived values)."""

    path: str
    runner: str
    args: Mapping[str, Any]
    bert_config: Mapping[str, Any]
    world_size: int
    derived: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    phases: list[Mapping[str, Any]] = dataclasses.field(default_factory=list)

    @classmethod
    def read(cls, output_dir: str) -> RunRecord | None:
        path = os.path.join(output_dir, RUN_RECORD)
        if not os.path.isfile(path):
            return None
        try:
            data = read_json(path)
            # Records written before `derived` existed have none.
            return cls(
                path=path,
                runner=data["runner"],
                args=_with_legacy_settings(data["runner"], data["args"]),
                bert_config=data["bert_config"],
                world_size=data["world_size"],
                derived=data.get("derived", {}),
                phases=data.get("phases", []),
            )
        except (KeyError, TypeError) as error:
            raise UsageError(f"{path}: not a bertbench run record (missing {error})") from None

    def write(self) -> None:
        write_json(
            self.path,
            {
                "runner": self.runner,
                "bertbench_version": __version__,
                "args": self.args,
                "bert_config": self.bert_config,
                "world_size": self.world_size,
                "derived": self.derived,
                "phases": self.phases,
            },
        )


def _with_legacy_settings(runner: str, args: Mapping[str, Any]) -> Mapping[str, Any]:
    """A record's flags, with what a run recorded before a setting existed was trained with, so that resuming it
    keeps it: the optimizer rule of a run from before --adam_bias_correction (optim.legacy_rule: bias-corrected
    AdamW, and nvlamb for its lamb); the character rule of SQuAD's answer spans before --train_answer_span."""
    if "adam_bias_correction" not in args and "optimizer_type" in args:
        optimizer, bias_correction = optim.legacy_rule(args["optimizer_type"])
        args = {**args, "optimizer_type": optimizer, "adam_bias_correction": bias_correction}
    if runner == "run_squad" and "train_answer_span" not in args:
        args = {**args, "train_answer_span": "characters"}
    return args


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """A JSON file of the run directory, written whole or not at all."""
    write_atomically(path, json.dumps(data, indent=2) + "\n")


def write_record(
    record: RunRecord | None,
    runner: str,
    config: Any,
    bert_config: BertConfig,
    dist: Distributed,
    derived: Mapping[str, Any] | None = None,
) -> None:
    """A new run's record (rank 0): every flag of the RunnerConfig `config` but the per-command ones, the model
    config, the processes. A command that starts the run's next phase in place (config.new_phase) writes the new
    phase's record with the earlier ones under `phases`, after keeping their results files as phase<N>_<name>."""
    if not dist.is_main or (record is not None and not config.new_phase):
        return
    os.makedirs(config.run.model_dir, exist_ok=True)
    phases = []
    if record is not None:
        phases = [
            *record.phases,
            {"args": dict(record.args), "world_size": record.world_size, "derived": dict(record.derived)},
        ]
        keep_phase_results(config.run.model_dir, len(phases))
    args = {name: value for name, value in config.args.items() if name not in config.per_command}
    RunRecord(
        os.path.join(config.run.model_dir, RUN_RECORD),
        runner,
        args,
        dataclasses.asdict(bert_config),
        dist.world_size,
        dict(derived or {}),
        phases,
    ).write()


def keep_phase_results(model_dir: str, phase: int) -> None:
    """Phase `phase`'s results files in model_dir, renamed phase<phase>_<name> so that the next phase's do not
    replace them (a rename already done, by a start killed before its record was written, is not done again)."""
    for name in PHASE_RESULTS:
        path, kept = os.path.join(model_dir, name), os.path.join(model_dir, f"phase{phase}_{name}")
        if os.path.isfile(path) and not os.path.exists(kept):
            os.replace(path, kept)


def check_record(record: RunRecord | None, bert_config: BertConfig, config: Any, dist: Distributed) -> None:
    """The model settings must be able to run on this job's device; a new run's --logging_dir must not hold another
    run's event files (its start would remove them); a recorded run must continue with the same model and, when
    training, the same number of processes."""
    reason = config.model.unrunnable(dist.device)
    if reason is not None:
        raise UsageError(reason)
    if record is None:
        check_logging_dir(config.run)
        return
    current = dataclasses.asdict(bert_config)
    for key in sorted(set(current) | set(record.bert_config)):
        if current.get(key) != record.bert_config.get(key):
            raise UsageError(
                f"{record.path}: this run's model has {key}={record.bert_config.get(key)}, "
                f"{config.task.bert_config_file} has {current.get(key)}; use a new --output_dir"
            )
    if config.task.do_train and not config.new_phase and record.world_size != dist.world_size:
        raise UsageError(
            f"{record.path}: this run was trained by {record.world_size} process(es), this command "
            f"has {dist.world_size}; the global batch and data order would change"
        )


def check_logging_dir(run: RunConfig) -> None:
    """A new run (no record in its run directory) writing its events to another directory (RunConfig.logging_dir)
    must find no event files of bertbench's there: they belong to another run, whose curves a shared directory
    would mix with this one's, and which this run's start would remove."""
    logging_dir = run.events_dir
    if not run.reports_to_tensorboard or os.path.abspath(logging_dir) == os.path.abspath(run.model_dir):
        return
    found = event_files(logging_dir) or event_files(eval_events_dir(logging_dir))
    if found:
        raise UsageError(
            f"--logging_dir {logging_dir}: holds the TensorBoard events of another run ({found[0]}); give this run "
            "a logging directory of its own"
        )


@contextlib.contextmanager
def hold_run_directory(model_dir: str, training: bool, record: RunRecord | None, dist: Distributed, log: Log):
    """The run directory for this command alone (run_lock.RunLock, taken by rank 0 for every rank), and checked: a
    run that has saved checkpoints (saved_history) but holds none now is refused rather than silently started again
    from step 0. A command that fails before it writes leaves the directory as it was (the lock file included), so
    every check of its inputs comes before its first write: remove_leftovers, once the checks are done."""
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
        if training and record is not None and history and not holds_training_state(model_dir):
            raise UsageError(
                f"{model_dir}: this run has saved checkpoints ({history}) but holds none now, so it "
                "cannot resume; to start it over, remove the directory or use another --output_dir"
            )
        yield


def remove_leftovers(model_dir: str, dist: Distributed, log: Log) -> None:
    """Remove the temporary files a killed save left in the run directory (rank 0): a command's first write there,
    made once every check is done (hold_run_directory)."""
    if dist.is_main:
        for name in remove_temporary_files(model_dir):
            log(f"removed {os.path.join(model_dir, name)}, left by a save that did not finish")


def saved_history(model_dir: str) -> str | None:
    """What says that a run in model_dir has saved a checkpoint: train_results.json (written after a checkpoint),
    or a metrics.jsonl line naming its newest checkpoint. A run stopped before its first save has none: starting it
    again from step 0 is its exact resume."""
    if os.path.isfile(os.path.join(model_dir, TRAIN_RESULTS)):
        return f"{TRAIN_RESULTS} is there"
    metrics = os.path.join(model_dir, METRICS)
    for number, entry in scan_log(metrics).records:
        if entry.get("checkpoint_step") is not None:
            return f"{metrics} line {number} follows the checkpoint of step {entry['checkpoint_step']}"
    return None


def run_of_checkpoint(path: str | None) -> RunRecord | None:
    """The record of the bertbench run a checkpoint path belongs to: a run directory, or a ckpt-*.pt in one (or in
    its worker-<rank>/ directory); None for anything else."""
    if not path:
        return None
    if os.path.isdir(path):
        return RunRecord.read(path)
    if not os.path.isfile(path) or checkpoint_step(path) is None:
        return None
    directory = os.path.dirname(os.path.abspath(path))
    return RunRecord.read(directory) or RunRecord.read(os.path.dirname(directory))


def run_flags(record: RunRecord) -> dict[str, tuple[Any, str]]:
    """What a run's record says of the model flags a later command on its checkpoints leaves out (bert_config_file,
    vocab_file, do_lower_case), each with the file that says it: the run is a self-contained checkpoint."""
    found: dict[str, tuple[Any, str]] = {"bert_config_file": (record.path, record.path)}
    vocab_file = record.args.get("vocab_file")
    if vocab_file is not None:
        if not os.path.exists(vocab_file):
            raise UsageError(
                f"{record.path}: the run's vocab_file {vocab_file} is not there (a path relative to where it ran?); "
                "give --vocab_file"
            )
        found["vocab_file"] = (vocab_file, record.path)
    if record.args.get("do_lower_case") is not None:
        found["do_lower_case"] = (record.args["do_lower_case"], record.path)
    return found
