"""A kill -9 fault campaign: each runner's command is SIGKILLed at random moments, run again each time, and must end
exactly as a run never stopped.

    python tests/fault_campaign.py --trials 8 --seed 1 [--runners classifier,squad,pretraining,launch2]

For each runner a tiny model is trained once uninterrupted (the reference). Each trial then starts the same command
in a fresh directory, kills it 1-3 times (SIGKILL; for `launch2` the torchrun agent and both workers, stopped
together first, as a lost node loses them), starts the same command again after each kill, and finally runs it to
completion. Each command is a process of its own, forked from a Python that has imported torch (ForkServer), so
that it spends its time on its own work rather than on 2 seconds of imports. The moments come from a seeded RNG:
during start-up (before any checkpoint), a random delay after a new
checkpoint, while a checkpoint is being written (its temporary file seen), the moment a new checkpoint appears
(before the older ones are pruned, if the poll is quick enough), or any time in the run. A trial loses
nothing when: every command that was not killed exited 0; every restart resumed the newest checkpoint; the final
weights are bit-identical to the reference's; train_results.json has the reference's global step and sentences and
its `segments` chain from step 0 to it without gap or overlap, each earlier segment ending at a checkpoint;
metrics.jsonl logs the reference's steps, once each, in order, with the reference's figures (all but times, rates
and memory); no temporary file is left; and the checkpoints kept
are the reference's (keep_checkpoint_max of them). Prints a markdown table; exit status 1 when a trial lost anything.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import importlib
import json
import multiprocessing.synchronize
import os
import random
import re
import runpy
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Run as a script from anywhere: the tests' helpers sit beside this file, and this checkout's bertbench is the one
# tested (here and in the commands started) whatever an installed copy points to.
for path in (HERE, ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

from helpers import classifier_flags, write_bert_dir, write_nvidia_shard  # noqa: E402

from bertbench.common.run_files import CHECKPOINT_NAME  # noqa: E402
from bertbench.tasks.synthetic import vocabulary, write_glue_task, write_squad  # noqa: E402
from bertbench.training.checkpoint import list_checkpoints, load_checkpoint  # noqa: E402
from bertbench.training.metrics import MEASURED_FIELDS  # noqa: E402

RUNNERS = ("classifier", "squad", "pretraining", "launch2")
MOMENTS = ("start-up", "after a checkpoint", "in a save", "as a checkpoint appears", "any time")
KEEP = 2  # --keep_checkpoint_max of every runner: pruning is exercised
SAVE_EVERY = 8  # --save_checkpoints_steps of every runner
RUN_TIMEOUT = 300  # seconds one command may take before the campaign gives up on it
POLL = 0.002
RESUMED = re.compile(r"resumed from (\S+) \(step (\d+)")


def prepare_data(root: Path) -> Path:
    """Every runner's inputs under root: GLUE MRPC, SQuAD v1.1, NVIDIA-layout shards and the tiny model's files."""
    write_glue_task(root / "glue", "MRPC", train=256, dev=16, test=8)
    write_squad(root / "squad", "1.1", train=40, dev=4)
    write_bert_dir(root / "bert")
    write_bert_dir(root / "squad_bert", vocab_size=len(vocabulary()))
    (root / "shards").mkdir(exist_ok=True)
    for index in range(2):
        write_nvidia_shard(root / "shards" / f"part_{index:05d}.hdf5", count=48, seed=index)
    return root


def saves_and_logs(out: Path) -> list[str]:
    """Every runner's: a checkpoint every SAVE_EVERY steps (no timed ones), KEEP kept, a log record every 4 steps
    (so a run killed before its first checkpoint may have logged)."""
    return [
        "--save_checkpoints_secs=0",
        f"--save_checkpoints_steps={SAVE_EVERY}",
        f"--keep_checkpoint_max={KEEP}",
        "--log_step_count_steps=4",
        f"--output_dir={out}",
    ]


def classifier_command(data: Path, out: Path, batch: int, epochs: int) -> list[str]:
    return classifier_flags(
        data, out, "--do_train", f"--num_train_epochs={epochs}", *saves_and_logs(out), batch=batch, learning_rate="1e-3"
    )


def command(runner: str, data: Path, out: Path, short: bool = False) -> list[str]:
    """The runner's command line: the same for the reference, every restart and the final run (only `out`
    differs between trials). `short` halves the classifier's and pre-training's steps (the test's campaign): 6
    checkpoints, still pruned, and the pre-training loader still crosses both shards."""
    python = [sys.executable, "-m"]
    if runner == "classifier":  # 96 steps (48 short)
        return python + [
            "bertbench.runners.classifier",
            *classifier_command(data, out, batch=16, epochs=3 if short else 6),
        ]
    if runner == "squad":  # 91 steps (147 windows of 48 tokens, 5 epochs)
        return python + [
            "bertbench.runners.squad",
            f"--train_file={data / 'squad' / 'train-v1.1.json'}",
            f"--vocab_file={data / 'squad_bert' / 'vocab.txt'}",
            f"--bert_config_file={data / 'squad_bert' / 'bert_config.json'}",
            "--max_seq_length=48",
            "--doc_stride=16",
            "--max_query_length=16",
            "--do_train",
            "--train_batch_size=8",
            "--num_train_epochs=5",
            "--learning_rate=1e-3",
            *saves_and_logs(out),
        ]
    if runner == "pretraining":  # 96 steps (48 short): 8 (4) passes over 2 shards of 48, the loader crossing both
        return python + [
            "bertbench.runners.pretraining",
            f"--input_dir={data / 'shards'}",
            f"--bert_config_file={data / 'bert' / 'bert_config.json'}",
            "--max_seq_length=32",
            "--max_predictions_per_seq=5",
            "--do_train",
            "--train_batch_size=8",
            f"--num_train_steps={48 if short else 96}",
            "--learning_rate=2e-3",
            *saves_and_logs(out),
        ]
    if runner == "launch2":  # run_classifier on 2 processes under torchrun (gloo on CPU): 80 steps
        return python + [
            "bertbench",
            "launch",
            "--standalone",
            "--nproc_per_node=2",
            "--max-restarts=0",
            "-m",
            "bertbench.runners.classifier",
            *classifier_command(data, out, batch=8, epochs=5),
        ]
    raise ValueError(f"unknown runner {runner!r}; choose from {', '.join(RUNNERS)}")


# ---- processes -----------------------------------------------------------------------------------------------------


def environment() -> dict[str, str]:
    # One intra-op thread, as the tests' processes have (conftest.py says why); the same in every run.
    python_path = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": python_path}


# What the commands import from outside bertbench: the fork server imports it once, and each command's process,
# forked from it, starts with it imported (a fresh Python spends ~2 CPU-seconds importing torch, most of a short run).
# Not bertbench, 0.1 s: its import makes state a process must not share with others, such as tqdm's lock, a semaphore
# that a command killed while writing a line would hold for every command forked after it (serve checks that none
# is made here).
PRELOADED = ("torch", "h5py", "tokenizers", "google_crc32c")  # launch2's agent imports torch.distributed.run itself


class ForkServer:
    """Starts the commands (`python -m MODULE ARGS...`), each as a child of one Python that has imported what they
    import (`fault_campaign.py --serve`), forked for it: a process of its own in a session of its own, its output to
    its log, killed as any, whose exit status the server reports. What the commands do, and so what a kill can
    interrupt, is unchanged; only the interpreter's start-up and imports, which write nothing, are no longer theirs."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=environment(),
        )
        self.replies = b""
        self.started: list[int] = []
        self.ended: dict[int, int] = {}
        if self.process.stdout.readline() != b"ready\n":  # its imports done: a command's time is its own
            raise RuntimeError(f"the fork server did not start ({self.process.wait()})")

    def start(self, argv: Sequence[str], log: Path) -> Forked:
        if list(argv[:2]) != [sys.executable, "-m"]:
            raise ValueError(f"not a `python -m` command: {argv}")
        self.process.stdin.write(json.dumps([*argv[2:], str(log)]).encode() + b"\n")
        self.process.stdin.flush()
        while not self.started:
            self.read(timeout=None)
        return Forked(self, self.started.pop())

    def read(self, timeout: float | None) -> None:
        """Take in the server's replies (`started PID`, `ended PID RETURNCODE`) that arrive within `timeout` seconds
        (None: until one does)."""
        if b"\n" not in self.replies and select.select([self.process.stdout], [], [], timeout)[0]:
            data = os.read(self.process.stdout.fileno(), 65536)
            if not data:
                raise RuntimeError(f"the fork server ended ({self.process.wait()})")
            self.replies += data
        *lines, self.replies = self.replies.split(b"\n")
        for line in lines:
            kind, pid, *returncode = line.decode().split()
            if kind == "started":
                self.started.append(int(pid))
            else:
                self.ended[int(pid)] = int(returncode[0])

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exception) -> None:
        self.close()


class Forked:
    """A command the fork server started: what the campaign uses of subprocess.Popen's interface."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.read(timeout=0)
            self.returncode = self.server.ended.pop(self.pid, None)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            self.server.read(left)
        return self.returncode


def serve() -> list[str] | None:
    """The fork server (`fault_campaign.py --serve`): for each request on stdin, a JSON line [MODULE ARGS..., LOG],
    it forks a child, which returns here with its command (the rest of its work is run_forked's); it answers
    `started PID`, and `ended PID RETURNCODE` once the child has ended (a negative signal number when killed).
    Returns None in the server when the requests end."""
    for module in PRELOADED:
        importlib.import_module(module)
    if any(issubclass(type(thing), multiprocessing.synchronize.SemLock) for thing in gc.get_objects()):
        raise RuntimeError("the fork server's imports made a multiprocessing lock, which its children would share")
    requests, replies = sys.stdin.fileno(), os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    os.write(replies, b"ready\n")
    children_ended, wake = os.pipe()  # SIGCHLD writes to the second, which select sees on the first
    os.set_blocking(wake, False)
    signal.set_wakeup_fd(wake)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""
    while True:
        ready = select.select([requests, children_ended], [], [])[0]
        if children_ended in ready:
            os.read(children_ended, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not pid:
                    break
                os.write(replies, f"ended {pid} {os.waitstatus_to_exitcode(status)}\n".encode())
        if requests in ready:
            data = os.read(requests, 65536)
            if not data:
                return None
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                *command, log = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    os.setsid()
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for fd in (requests, replies, children_ended, wake):
                        os.close(fd)
                    output = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    for fd in (1, 2):
                        os.dup2(output, fd)
                    os.close(output)
                    nothing = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(nothing, 0)
                    os.close(nothing)
                    return command
                os.write(replies, f"started {pid}\n".encode())


def run_forked(module: str, args: list[str]) -> None:
    """A forked child's command, run as `python -m module args...` runs it: as __main__, with sys.argv. When it exits
    with a status, it ends as a multiprocessing child does: its threads joined, its atexit functions run, its output
    flushed, then os._exit, without the interpreter's finalization, which cleared the server's modules for 0.5
    CPU-seconds and writes nothing for these commands (under `python -X dev` they leave no file for it to close)."""
    sys.argv = [module, *args]  # run_module puts the module's file first, as -m does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as stop:
        if stop.code is not None and not isinstance(stop.code, int):
            raise  # a message: the interpreter prints it and exits 1
        status = stop.code or 0
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def descendants(pid: int) -> list[int]:
    """The pids of pid's children, grandchildren, ... (torchrun starts its workers in sessions of their own, so the
    agent's process group does not hold them)."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, pending = [], [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_tree(process: Forked) -> None:
    """SIGKILL the process and every descendant at once: all are stopped first, so no worker sees its peer die
    and reacts, then killed. Returns once every one is gone."""
    stopped: list[int] = []
    while True:
        new = [pid for pid in [process.pid, *descendants(process.pid)] if pid not in stopped]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        stopped += new
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in stopped):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {stopped} outlived SIGKILL")
        time.sleep(POLL)


def run_to_end(server: ForkServer, argv: Sequence[str], log: Path) -> int:
    process = server.start(argv, log)
    try:
        return process.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        kill_tree(process)
        return -signal.SIGKILL


# list_checkpoints' answer for a directory's checkpoint files as they were (name, inode, size, modification time): the
# campaign polls every POLL seconds, and list_checkpoints reads each file's zip directory.
_listed: dict[Path, tuple[tuple | None, list[tuple[int, str]]]] = {}


def newest_step(out: Path) -> int | None:
    """The step of the newest checkpoint list_checkpoints lists (None: none), asked again only when a checkpoint
    file has changed."""
    files: list | None = []
    try:
        with os.scandir(out) as entries:
            for entry in entries:
                if CHECKPOINT_NAME.match(entry.name):
                    status = entry.stat(follow_symlinks=False)
                    files.append((entry.name, status.st_ino, status.st_size, status.st_mtime_ns))
    except FileNotFoundError:  # not made yet, or a file pruned between scandir and stat: list it
        files = None
    key = None if files is None else tuple(sorted(files))
    if key is None or out not in _listed or _listed[out][0] != key:
        _listed[out] = (key, list_checkpoints(out))
    checkpoints = _listed[out][1]
    return checkpoints[-1][0] if checkpoints else None


def saving(out: Path) -> bool:
    try:
        return any(name.startswith(".ckpt-") and name.endswith(".tmp") for name in os.listdir(out))
    except FileNotFoundError:
        return False


# ---- the reference -------------------------------------------------------------------------------------------------


@dataclass
class Reference:
    weights: dict[str, torch.Tensor]
    train: dict
    checkpoint_steps: list[int]
    metrics: list[dict]
    seconds: float  # the whole command, start-up included
    first_checkpoint_seconds: float
    save_interval_seconds: float

    def expected_seconds(self, resumed_step: int | None) -> float:
        """About how long the command runs when it starts over the checkpoint of `resumed_step` (None: none): its
        start-up, then the steps left at the reference's pace."""
        step_seconds = self.save_interval_seconds / SAVE_EVERY
        start_up = max(0.0, self.first_checkpoint_seconds - SAVE_EVERY * step_seconds)
        return start_up + (self.train["global_step"] - (resumed_step or 0)) * step_seconds


def metric_records(out: Path) -> list[dict]:
    """metrics.jsonl's records without their times, rates and memory (a line that is not a JSON record raises)."""
    with open(out / "metrics.jsonl") as handle:
        return [
            {key: value for key, value in json.loads(line).items() if key not in MEASURED_FIELDS} for line in handle
        ]


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(list_checkpoints(out)[-1][1])["model"]


def measure_reference(server: ForkServer, argv: Sequence[str], out: Path, log: Path) -> Reference:
    """Run the command uninterrupted, noting when each checkpoint appears (the kill moments are scaled to it)."""
    started = time.monotonic()
    process = server.start(argv, log)
    seen: list[float] = []
    last = None
    while process.poll() is None:
        step = newest_step(out)
        if step != last:
            seen.append(time.monotonic() - started)
            last = step
        time.sleep(POLL)
    seconds = time.monotonic() - started
    if process.returncode != 0:
        raise RuntimeError(f"the reference run failed ({process.returncode}): {log.read_text()[-3000:]}")
    if len(list_checkpoints(out)) != KEEP:  # every runner saves more often than it keeps
        raise RuntimeError(f"the reference run kept {list_checkpoints(out)}, not {KEEP} checkpoints")
    first = seen[0] if seen else seconds
    interval = (seen[-1] - seen[0]) / (len(seen) - 1) if len(seen) > 1 else seconds - first
    return Reference(
        final_weights(out),
        json.loads((out / "train_results.json").read_text()),
        [step for step, _ in list_checkpoints(out)],
        metric_records(out),
        seconds,
        first,
        interval,
    )


# ---- one trial -----------------------------------------------------------------------------------------------------


@dataclass
class Kill:
    moment: str
    seconds: float  # after the command started
    newest_checkpoint: int | None  # at the kill
    during_save: bool  # a checkpoint's temporary file was there
    before_prune: bool  # more checkpoints than keep_checkpoint_max were there: a new one, the old not yet deleted


@dataclass
class Trial:
    kills: list[Kill] = field(default_factory=list)
    resumed_ok: bool = True
    identical: bool = False
    lost: list[str] = field(default_factory=list)


def sleep_while_running(process: Forked, seconds: float) -> bool:
    """Sleep `seconds` unless the process ends first; whether it still runs."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        time.sleep(min(POLL * 5, max(0.0, deadline - time.monotonic())))
    return process.poll() is None


def wait_while_running(process: Forked, condition: Callable[[], bool]) -> bool:
    """Poll until `condition()` holds; False when the process ended first."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(POLL)
    return True


def strike(
    process: Forked, out: Path, moment: str, rng: random.Random, reference: Reference, started: float
) -> Kill | None:
    """Wait for the moment, then SIGKILL the command; None when it ended first."""
    expected = reference.expected_seconds(newest_step(out))
    if moment == "start-up":  # imports, reading the data, building the model, up to the first save
        running = sleep_while_running(process, rng.uniform(0, reference.first_checkpoint_seconds))
    elif moment == "after a checkpoint":
        before = newest_step(out)
        running = wait_while_running(process, lambda: newest_step(out) != before) and sleep_while_running(
            process, rng.uniform(0, reference.save_interval_seconds)
        )
    elif moment in ("in a save", "as a checkpoint appears"):
        running = sleep_while_running(process, rng.uniform(0, 0.9 * expected))
        before = newest_step(out)
        # In a save: its temporary file is there (or, a save too quick for the poll, the checkpoint it became).
        # As a checkpoint appears: renamed, perhaps not yet fsynced nor the older ones pruned.
        appeared = (
            (lambda: saving(out) or newest_step(out) != before)
            if moment == "in a save"
            else (lambda: newest_step(out) != before)
        )
        running = running and wait_while_running(process, appeared)
    else:
        running = sleep_while_running(process, rng.uniform(0, expected))
    if not running:
        return None
    during_save, checkpoints = saving(out), len(list_checkpoints(out))
    newest = newest_step(out)
    kill_tree(process)
    return Kill(moment, time.monotonic() - started, newest, during_save, checkpoints > KEEP)


def check_resume(log: Path, found: int | None, trial: Trial, run: str, required: bool) -> None:
    """A command started over checkpoint `found` (None: none) must say it resumed that one, or nothing."""
    resumed = [int(step) for _, step in RESUMED.findall(log.read_text(errors="replace"))]
    if resumed != ([] if found is None else [found]) and (resumed or required):
        trial.resumed_ok = False
        trial.lost.append(f"{run}: started over checkpoint {found}, resumed {resumed or 'nothing'}")


def run_trial(
    server: ForkServer, argv: Sequence[str], out: Path, logs: Path, reference: Reference, rng: random.Random
) -> Trial:
    trial = Trial()
    for number in range(rng.randint(1, 3)):
        moment = rng.choice(MOMENTS)
        found, log = newest_step(out), logs / f"run-{number}.log"
        started = time.monotonic()
        process = server.start(argv, log)
        kill = strike(process, out, moment, rng, reference, started)
        if kill is not None:
            trial.kills.append(kill)
        check_resume(log, found, trial, f"run {number}", required=kill is None and process.returncode == 0)
        if kill is None and process.wait() != 0:  # it ended before the moment came: it must have ended well
            refused(trial, out, f"run {number} (before a kill '{moment}')", process.returncode, log)
            if list_checkpoints(out):
                return trial
    found, log = newest_step(out), logs / "final.log"
    status = run_to_end(server, argv, log)
    check_resume(log, found, trial, "final run", required=status == 0)
    if status != 0:
        refused(trial, out, "final run", status, log)
        if list_checkpoints(out) or run_to_end(server, argv, logs / "final-again.log") != 0:
            return trial
    trial.lost += check_run(out, reference)
    trial.identical = not any(problem.startswith("weights") for problem in trial.lost)
    return trial


def refused(trial: Trial, out: Path, run: str, status: int, log: Path) -> None:
    """Note a command that failed on its own. When the directory holds no checkpoint, nothing trained is lost by
    removing it (what the runners' refusal advises): the trial goes on from scratch, so its other checks still
    count."""
    trial.resumed_ok = False
    trial.lost.append(f"{run} exited {status}: {tail(log)}")
    if not list_checkpoints(out):
        shutil.rmtree(out, ignore_errors=True)


def tail(log: Path, lines: int = 3) -> str:
    return " | ".join(log.read_text(errors="replace").strip().splitlines()[-lines:])


def check_run(out: Path, reference: Reference) -> list[str]:
    """What a finished run lost against the reference, one line each (none: nothing lost)."""
    problems = []
    steps = [step for step, _ in list_checkpoints(out)]
    if steps != reference.checkpoint_steps:
        problems.append(f"checkpoints at steps {steps}, the reference keeps {reference.checkpoint_steps}")
    if steps:
        weights = final_weights(out)
        differing = [
            name
            for name in weights.keys() | reference.weights.keys()
            if name not in weights
            or name not in reference.weights
            or not torch.equal(weights[name], reference.weights[name])
        ]
        if differing:
            problems.append(f"weights differ from the reference's ({len(differing)} tensors, e.g. {differing[:2]})")
    leftovers = sorted(str(path.relative_to(out)) for path in out.rglob("*.tmp"))
    if leftovers:
        problems.append(f"temporary files left: {leftovers}")
    try:
        logged = metric_records(out)
    except (OSError, ValueError, AttributeError) as error:
        problems.append(f"metrics.jsonl unreadable: {type(error).__name__}: {error}")
    else:
        steps, reference_steps = ([record.get("step") for record in records] for records in (logged, reference.metrics))
        if steps != reference_steps:
            problems.append(f"metrics.jsonl steps {steps}, the reference logged {reference_steps}")
        else:
            differing = [
                (
                    record["step"],
                    sorted(key for key in record.keys() | expected.keys() if record.get(key) != expected.get(key)),
                )
                for record, expected in zip(logged, reference.metrics)
                if record != expected
            ]
            if differing:
                problems.append(f"metrics.jsonl differs from the reference's at (step, fields) {differing[:3]}")
    try:
        train = json.loads((out / "train_results.json").read_text())
    except (OSError, ValueError) as error:
        return problems + [f"train_results.json unreadable: {type(error).__name__}: {error}"]
    for key in ("global_step", "sentences"):
        if train.get(key) != reference.train[key]:
            problems.append(f"train_results.json {key} {train.get(key)}, the reference's {reference.train[key]}")
    global_step = reference.train["global_step"]
    return problems + check_segments(
        train.get("segments") or [], global_step, {*range(SAVE_EVERY, global_step, SAVE_EVERY), global_step}
    )


def check_segments(segments: list[dict], global_step: int, save_steps: set[int]) -> list[str]:
    """The segments must chain 0 -> global_step, each one's steps its end minus its start, every segment but the
    last ending where a checkpoint was saved (a killed invocation counts up to its last checkpoint)."""
    spans = [(segment.get("start_step"), segment.get("end_step"), segment.get("steps")) for segment in segments]
    problems = []
    if not spans:
        return [f"train_results.json has no segments (global step {global_step})"]
    expected_start = 0
    for start_step, end_step, steps in spans:
        if start_step != expected_start or steps != end_step - start_step:
            problems.append(f"segments {spans} do not chain from 0 to {global_step}")
            break
        expected_start = end_step
    else:
        if expected_start != global_step:
            problems.append(f"segments {spans} end at {expected_start}, not at {global_step}")
    if not all(end_step in save_steps for _, end_step, _ in spans):
        problems.append(f"segments {spans} end between checkpoints ({sorted(save_steps)})")
    if segments[-1].get("ended") != "finished" or any(segment.get("ended") is not None for segment in segments[:-1]):
        problems.append(f"segments end as {[segment.get('ended') for segment in segments]}")
    return problems


# ---- the campaign --------------------------------------------------------------------------------------------------


@dataclass
class RunnerResult:
    runner: str
    trials: list[Trial]


def campaign(
    runners: Sequence[str],
    trials: int | dict[str, int],
    seed: int,
    workdir: Path,
    report: Callable[[str], None] = lambda line: None,
    short: bool = False,
) -> list[RunnerResult]:
    """Run `trials` trials (per runner, or a count for each) of every runner in workdir; each runner's RNG is
    seeded from `seed` and its name, so one runner's trials do not depend on which others run. `short`: the
    runners' shorter commands (command())."""
    data = prepare_data(workdir / "data")
    results = []
    # The references from one server, the trials' commands from another: a trial's processes and its reference's are
    # forked from different interpreters (hash seeds, addresses), as fresh processes would be.
    with ForkServer() as reference_server, ForkServer() as server:
        for runner in runners:
            count = trials[runner] if isinstance(trials, dict) else trials
            root = workdir / runner
            root.mkdir()
            reference = measure_reference(
                reference_server,
                command(runner, data, root / "reference", short),
                root / "reference",
                root / "reference.log",
            )
            report(
                f"{runner}: reference {reference.seconds:.1f} s, {reference.train['global_step']} steps, first "
                f"checkpoint at {reference.first_checkpoint_seconds:.1f} s, then every "
                f"{reference.save_interval_seconds:.2f} s"
            )
            rng = random.Random(f"{seed}-{runner}")
            done = []
            for number in range(count):
                out, logs = root / f"trial-{number}", root / f"trial-{number}-logs"
                logs.mkdir()
                trial = run_trial(server, command(runner, data, out, short), out, logs, reference, rng)
                done.append(trial)
                kills = ", ".join(
                    f"{kill.moment} at {kill.seconds:.2f} s (newest checkpoint {kill.newest_checkpoint}"
                    f"{', saving' if kill.during_save else ''}{', not pruned' if kill.before_prune else ''})"
                    for kill in trial.kills
                )
                report(
                    f"{runner} trial {number}: {len(trial.kills)} kills [{kills}]; "
                    f"{'; '.join(trial.lost) if trial.lost else 'nothing lost'}"
                )
            results.append(RunnerResult(runner, done))
    return results


def table(results: Sequence[RunnerResult]) -> str:
    lines = [
        "| runner | trials | kills | kills before a checkpoint / in a save / before a prune | resumed ok | "
        "bit-identical final weights | anything lost |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in results:
        trials = result.trials
        kills = [kill for trial in trials for kill in trial.kills]
        lost = [trial for trial in trials if trial.lost]
        lines.append(
            f"| {result.runner} | {len(trials)} | {len(kills)} | "
            f"{sum(kill.newest_checkpoint is None for kill in kills)} / "
            f"{sum(kill.during_save for kill in kills)} / {sum(kill.before_prune for kill in kills)} | "
            f"{sum(trial.resumed_ok for trial in trials)}/{len(trials)} | "
            f"{sum(trial.identical for trial in trials)}/{len(trials)} | "
            f"{f'{len(lost)} trials' if lost else 'nothing'} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8, help="trials per runner")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    parser.add_argument("--runners", default=",".join(RUNNERS), help=f"comma-separated, of {', '.join(RUNNERS)}")
    parser.add_argument("--workdir", type=Path, help="kept afterwards (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    runners = args.runners.split(",")
    unknown = [runner for runner in runners if runner not in RUNNERS]
    if unknown:
        parser.error(f"unknown runner(s) {', '.join(unknown)}; choose from {', '.join(RUNNERS)}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fault-campaign-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        results = campaign(runners, args.trials, args.seed, workdir, report=lambda line: print(line, flush=True))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(table(results))
    print(f"\n{sum(len(result.trials) for result in results)} trials in {time.monotonic() - started:.0f} s")
    return 1 if any(trial.lost for result in results for trial in result.trials) else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        forked = serve()
        if forked is not None:  # a forked child: its command
            run_forked(forked[0], forked[1:])
    else:
        sys.exit(main())
