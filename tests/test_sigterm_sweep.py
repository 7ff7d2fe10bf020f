"""SIGTERM at every moment of a short run: from the interpreter's start-up to its exit, a command either saves and
exits 143 (in training), stops at once with its one line and 143 (any other phase), or, once its work is done, exits
0 without a word; never Python's default (killed, -15) nor a traceback. Run again, the command ends with an
uninterrupted run's weights.

One Python process imports bertbench once and forks a child per delay, which starts as the `bertbench` script does
(bertbench's own start-up, then cli.main() and the interpreter's exit); the parent sends SIGTERM after the delay.
Training is a few milliseconds of the run, less than a busy machine's jitter from run to run: when the delays miss
it, a last trial sends SIGTERM as the run's first checkpoint appears, with 7 of its 8 steps still to train; when a
busy machine ran every trial past the reference run's length, longer delays find the run done."""

import gc
import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Delays from 0 to a little past the uninterrupted run's end (in fractions of it), closer together early on: start-up
# and training (8 steps) take a fifth of it, the rest is writing the results and Python's shutdown (0.3 s with torch
# loaded).
DELAYS = [0, 0.05, 0.11, 0.17, 0.4, 1.1]
TRAINING = "SIGTERM received: saving a checkpoint at the end of this step, then stopping"
# Before cli.main's run_command, or in it: the process's own handler names the program, the command itself.
OTHER_PHASE = [
    [f"{program}: stopped by SIGTERM; every file already written is whole, none half-written"]
    for program in ("bertbench", "bertbench classify")
]


def catches_sigterm(pid):
    """Whether the process has a SIGTERM handler (SigCgt in /proc): before it, SIGTERM acts as on a process that
    has not started Python yet."""
    with open(f"/proc/{pid}/status") as handle:
        mask = next(int(line.split()[1], 16) for line in handle if line.startswith("SigCgt:"))
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def run_child(argv, log, delay=None, exit_quickly=False, after_file=None):
    """`bertbench ARGV` in a forked child (stderr to `log`), sent SIGTERM `delay` s after it first handles SIGTERM,
    or as soon as the file `after_file` exists. Returns the exit status (-15: killed by the default handler) and the
    seconds it ran. `exit_quickly`: without Python's shutdown, for a run whose exit is not under test."""
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()  # the child's exit then skips the parent's objects: 0.3 s instead of 1 s, the same phases
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: no try/finally of the parent's may run here, it leaves through SystemExit
        error = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(error, 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        sys.argv = ["bertbench", *argv]
        import bertbench

        importlib.reload(bertbench)  # bertbench's start-up in a process the `bertbench` script starts
        from bertbench.cli import main

        if exit_quickly:
            os._exit(main())
        sys.exit(main())
    if delay is not None:
        while not catches_sigterm(pid) and os.waitpid(pid, os.WNOHANG) == (0, 0):
            time.sleep(0.0005)
        time.sleep(delay)
        os.kill(pid, signal.SIGTERM)
    elif after_file is not None:
        while not after_file.exists() and os.waitpid(pid, os.WNOHANG) == (0, 0):
            time.sleep(0.0005)
        os.kill(pid, signal.SIGTERM)  # a child that has exited stays a zombie until the wait below: still its pid
    status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return status, time.monotonic() - started


def sweep(inputs: Path, work: Path) -> list[str]:
    """Every problem seen, one line each."""
    from helpers import runner_command

    from bertbench.common.run_files import checkpoint_name
    from bertbench.training.checkpoint import list_checkpoints, load_checkpoint

    def command(out):  # 8 steps of 8, a checkpoint after each
        extra = ("--num_train_epochs=4", "--save_checkpoints_steps=1")
        return ["classify", *runner_command("classifier", inputs, out, *extra)[1]]

    def final_weights(out):
        return load_checkpoint(list_checkpoints(out)[-1][1])["model"]

    status, seconds = run_child(command(work / "reference"), work / "reference.err")
    assert status == 0, (work / "reference.err").read_text()
    reference = final_weights(work / "reference")
    problems, seen = [], {}

    def trial(delay, in_training=False):
        run_name = "run-at-first-checkpoint" if in_training else f"run-{delay:.4f}"
        out, log = work / run_name, work / f"{run_name}.err"
        status, _ = run_child(command(out), log, delay, after_file=out / checkpoint_name(1) if in_training else None)
        text = log.read_text()
        lines = [line for line in text.splitlines() if line.strip()]
        moment = "as the first checkpoint appeared" if in_training else f"at {delay:.3f} s of {seconds:.3f}"
        where = f"SIGTERM {moment}: exit {status}, stderr {lines}"
        expected = {0: [[]], 143: [[TRAINING], *OTHER_PHASE]}
        if status not in expected or lines not in expected[status] or "Traceback" in text:
            problems.append(where)
            return
        seen["at the first checkpoint" if in_training else delay] = (
            "done" if not lines else "training" if lines == [TRAINING] else "other"
        )
        if status == 0:  # done before the signal: nothing to resume
            return
        again, _ = run_child(command(out), work / f"{run_name}-again.err", exit_quickly=True)
        if again != 0:
            problems.append(f"{where}; run again: exit {again}, {(work / f'{run_name}-again.err').read_text()}")
            return
        resumed = final_weights(out)
        if any(not (resumed[name] == weights).all() for name, weights in reference.items()):
            problems.append(f"{where}; run again, its weights differ from the uninterrupted run's")

    for fraction in DELAYS:
        trial(fraction * seconds)
    for _ in range(6):  # on a busy machine the phases shift: look for training where a stop turns into done
        if problems or "training" in seen.values():
            break
        # The first delay, in order, at which a stop is followed by done: the phases shift from run to run, so a
        # longer delay may still find the run before its end, and halving one pair of delays again would repeat.
        ordered = sorted(seen.items())
        turns = [(a, b) for (a, before), (b, after) in zip(ordered, ordered[1:]) if before != "done" == after]
        if not turns:
            break
        trial(sum(turns[0]) / 2)
    if not problems and "training" not in seen.values():
        trial(None, in_training=True)
    for factor in (2, 4, 8):  # a busy machine ran every trial longer than the reference: wait past its end
        if problems or "done" in seen.values():
            break
        trial(factor * seconds)
    if not problems and set(seen.values()) != {"training", "other", "done"}:
        problems.append(f"the sweep did not see every phase: {seen}")
    return problems


@pytest.mark.slow
def test_sigterm_at_every_moment_of_a_run_ends_in_one_line_and_the_run_resumes_exactly(runner_inputs, tmp_path):
    done = subprocess.run(
        [sys.executable, __file__, str(runner_inputs), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("argv0, handled", [("-m", True), ("/usr/bin/bertbench", True), ("script.py", False)])
def test_a_command_handles_sigterm_before_it_imports_torch(argv0, handled):
    """`python -m bertbench.runners.classifier` (torchrun's workers) imports torch for seconds before its main: the
    package's import installs the handler first, in a command only (argv[0] is "-m" while -m imports the package)."""
    probe = (
        f"import signal, sys; sys.argv[0] = {argv0!r}; import bertbench; "
        "print(signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=HERE.parent, check=True)
    assert done.stdout.split() == [str(handled), "False"]


if __name__ == "__main__":
    sys.path[:0] = [str(HERE), str(HERE.parent)]
    found = sweep(Path(sys.argv[1]), Path(sys.argv[2]))
    print("\n".join(found))
    sys.exit(1 if found else 0)
