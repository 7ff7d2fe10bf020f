"""scripts/run_glue.sh, run_squad.sh, run_pretraining.sh and eval.sh as users run them.

First the commands of `bertbench example-data`'s README.txt, run once, as printed and in order: the scripts with
their positional arguments and BERT_DIR/GLUE_DIR/SQUAD_DIR/RESULTS_DIR, Google's TF1 layout as the pre-trained
model, GLUE, SQuAD and NVIDIA's shards in their release layouts, no network. Then each script's defaults, knobs,
node settings and refusals, with a stand-in PYTHON that records the command a script builds where running it would
add only a Python start: the runs of several processes through torchrun are test_distributed's (on one node) and
test_job_templates' (across nodes)."""

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import free_port, in_process_entry_point, read_json

from bertbench import example_data
from bertbench.tasks.synthetic import write_glue_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")
BERT_DIR = os.path.join(ROOT, "tests", "fixtures", "tf1_tiny")


@dataclass
class ExampleRuns:
    example: Path  # the directory bertbench example-data wrote
    out: Path  # where README.txt's commands wrote, in place of its default
    outputs: list[tuple[str, str]]  # (command, its stdout), in README.txt's order

    def output(self, of: str) -> str:
        """The stdout of the one command that holds `of`."""
        (found,) = [output for command, output in self.outputs if of in command]
        return found

    @property
    def results(self) -> Path:
        return self.out / "results"  # the scripts' RESULTS_DIR


def readme_commands(example: Path, out: Path) -> list[str]:
    """The commands of README.txt, each as one line, its output directory moved to `out`."""
    text = (example / "README.txt").read_text()
    default_out = os.path.join(tempfile.gettempdir(), "bertbench-example-runs")
    lines = text.split("\n\nRun from", 1)[1].replace("\\\n", "").splitlines()[1:]
    return [line.replace(default_out, str(out)) for line in lines if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory) -> ExampleRuns:
    """Every README.txt command run as typed: the scripts in bash in the repository, the `bertbench ...` and
    `python -m bertbench.<module> ...` commands through the same entry point in this process (the words as bash
    splits them), as test_docs runs the docs' commands, which spares a Python start each (test_hf_flags starts
    `python -m` itself). Each must end with status 0."""
    example = tmp_path_factory.mktemp("example") / "data"
    assert example_data.main([str(example)]) == 0
    out = tmp_path_factory.mktemp("runs")
    outputs = []
    for command in readme_commands(example, out):
        entry = in_process_entry_point(command)
        if entry:
            main, arguments = entry
            with contextlib.redirect_stdout(io.StringIO()) as stdout:
                assert main(arguments) == 0, command
            outputs.append((command, stdout.getvalue()))
            continue
        done = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{command}\n"], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, command + "\n" + done.stdout[-4000:] + done.stderr[-4000:]
        outputs.append((command, done.stdout))
    return ExampleRuns(example, out, outputs)


def printed(output: str, metric: str) -> str:
    """The value a runner printed for `metric` ("  metric = value" in its results block), the last if several."""
    return re.findall(rf"^\s*{re.escape(metric)} = (\S+)$", output, re.MULTILINE)[-1]


@pytest.mark.slow
def test_every_readme_command_runs_as_printed(example_runs):
    assert [shlex.split(command)[0].split("=")[0] for command, _ in example_runs.outputs] == [
        "bertbench",
        "bertbench",
        "python",
        "python",
        "bertbench",
        "BERT_DIR",
        "bertbench",
        "bertbench",
        "BERT_DIR",
        "scripts/eval.sh",
        "bertbench",
        "bertbench",
        "BERT_DIR",
        "BERT_DIR",
    ]
    example, out = example_runs.example, example_runs.out
    output = "".join(output for _, output in example_runs.outputs)
    # --init_checkpoint read the TF1 checkpoint, the HF directory and NVIDIA's checkpoint, each whole
    for source in (
        "bert/bert_model.ckpt (Google's TF1 checkpoint)",
        "bert-hf (HF directory)",
        "bert-nvidia/ckpt_1.pt (NVIDIA's",
    ):
        assert f"warm start from {example}/{source}" in output
    assert output.count("loaded 37 of 37 encoder weights") >= 3
    assert (out / "squad-nvidia" / "dllogger.json").read_text().startswith("DLLL ")
    for run in (
        "mrpc",
        "mrpc-hf",
        "mrpc-run-glue",
        "squad",
        "pretraining",
        "results/MRPC_fp32_bs32_lr2e-5_seq128_baseline_gpu1",
        "results/squad2.0_bert_fp32_bs16_lr3e-5_seq128_stride64_baseline_gpu1",
        "results/pretraining_fp32_baseline_gpu1/phase1",
        "results/pretraining_fp32_baseline_gpu1/phase2",
    ):
        assert (out / run / "train_results.json").is_file(), run
    assert (out / "shards" / "training_00000.hdf5").is_file()
    exported = out / "mrpc-hf-exported"  # the HF run back out as an HF directory
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer.json"} <= {
        path.name for path in exported.iterdir()
    }
    assert "exact_match" in example_runs.output("bertbench evaluate-squad")


GLUE_RUN = "MRPC_fp32_bs32_lr2e-5_seq128_baseline_gpu1"
SQUAD_RUN = "squad2.0_bert_fp32_bs16_lr3e-5_seq128_stride64_baseline_gpu1"


@pytest.mark.slow
def test_run_glue_trains_from_the_tf1_checkpoint(example_runs):
    done = example_runs.output("scripts/run_glue.sh")
    run_dir = example_runs.results / GLUE_RUN
    assert (
        f"warm start from {example_runs.example}/bert/bert_model.ckpt" in done
    )  # the default init_checkpoint, $BERT_DIR's
    train = read_json(run_dir / "train_results.json")
    assert train["global_step"] == 24  # 3 epochs of 256 examples in batches of 32
    assert read_json(run_dir / "eval_results.json")["dev_examples"] == 64
    assert (run_dir / "train.log").read_text().count("***** Training summary *****") == 1
    args = read_json(run_dir / "bertbench_run.json")["args"]
    assert (args["train_batch_size"], args["learning_rate"], args["precision"], args["use_xla"]) == (
        32,
        2e-5,
        "fp32",
        False,
    )
    assert "python" in (run_dir / "command.log").read_text()


@pytest.mark.slow
def test_run_squad_trains_on_v2_and_writes_the_official_files(example_runs):
    done = example_runs.output("scripts/run_squad.sh")
    run_dir = example_runs.results / SQUAD_RUN  # "bert": $BERT_DIR's name
    assert f"warm start from {example_runs.example}/bert/bert_model.ckpt" in done
    results = read_json(run_dir / "eval_results.json")
    assert results["questions"] == 30 and {"exact", "f1", "HasAns_exact", "NoAns_exact"} <= set(results)
    for name in ("predictions.json", "nbest_predictions.json", "null_odds.json", "train.log", "command.log"):
        assert (run_dir / name).is_file(), name
    args = read_json(run_dir / "bertbench_run.json")["args"]
    assert (args["version_2_with_negative"], args["doc_stride"], args["max_seq_length"]) == (True, 64, 128)


@pytest.mark.slow
def test_eval_sh_scores_each_run_again_with_the_runner_that_made_it(example_runs):
    """eval.sh over the scripts' RESULTS_DIR: the GLUE run evaluated and the SQuAD run predicted again, each with
    the figures its training run printed, and written to the run's results."""
    scored = example_runs.output("scripts/eval.sh")
    glue, squad = scored.split(f"== {example_runs.results / SQUAD_RUN}\n")
    assert glue.startswith(f"== {example_runs.results / GLUE_RUN}\n")
    trained = example_runs.output("scripts/run_glue.sh")
    assert printed(glue, "dev_acc") == printed(trained, "dev_acc")
    assert str(read_json(example_runs.results / GLUE_RUN / "eval_results.json")["dev_acc"]) == printed(glue, "dev_acc")
    trained = example_runs.output("scripts/run_squad.sh")
    for metric in ("exact", "f1"):
        assert printed(squad, metric) == printed(trained, metric), metric
    assert len(read_json(example_runs.results / SQUAD_RUN / "predictions.json")) == 30


@pytest.mark.slow
def test_run_pretraining_phase2_continues_phase1(example_runs):
    """Phase 1 (10 steps of 2 accumulated micro-batches of 8, 128 tokens), scored on the eval shard; phase 2 (5
    steps of 2 sequences of 512 tokens) goes on from it: its schedule starts at phase 1's last step."""
    run_root = example_runs.results / "pretraining_fp32_baseline_gpu1"
    train = read_json(run_root / "phase1" / "train_results.json")
    assert train["global_step"] == 10 and train["sentences"] == 10 * 8 * 2 and train["max_seq_length"] == 128
    assert read_json(run_root / "phase1" / "eval_results.json")["global_step"] == 10
    train = read_json(run_root / "phase2" / "train_results.json")
    assert train["global_step"] == 15 and train["schedule_start_step"] == 10 and train["max_seq_length"] == 512
    assert "python" in (run_root / "phase2" / "command.log").read_text()


@pytest.fixture
def env(tmp_path):
    write_glue_task(tmp_path / "glue", "MRPC", train=256, dev=64, test=16)
    return dict(
        os.environ,
        BERT_DIR=BERT_DIR,
        GLUE_DIR=str(tmp_path / "glue"),
        RESULTS_DIR=str(tmp_path / "results"),
        PYTHON=sys.executable,
    )


def run_glue(env, *arguments):
    return subprocess.run(
        ["bash", os.path.join(SCRIPTS, "run_glue.sh"), *arguments], env=env, capture_output=True, text=True
    )


# task batch lr precision use_xla num_gpu seq doc_stride epochs warmup init_checkpoint ("" = $BERT_DIR's)
POSITIONAL = ["MRPC", "16", "1e-3", "fp32", "false", "1", "32", "64", "1.0", "0.1", ""]
# batch lr precision use_xla num_gpu seq doc_stride bert_model squad_version init_checkpoint ("" = $BERT_DIR's) epochs
SQUAD_POSITIONAL = ["8", "1e-3", "fp32", "false", "1", "64", "16", "base", "2.0", "", "1.0"]


def recorded_command(env, tmp_path, script, *arguments):
    """The runner command line `script` builds, and the OMP_NUM_THREADS it gives, with PYTHON a stand-in that
    records them instead of training."""
    record = tmp_path / "python.argv"
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\necho "OMP_NUM_THREADS=$OMP_NUM_THREADS" > "{record}"\n'
        f'for word in "$@"; do echo "$word" >> "{record}"; done\n'
    )
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", os.path.join(SCRIPTS, script), *arguments],
        env=dict(env, PYTHON=str(fake)),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    threads, *argv = record.read_text().splitlines()
    return argv, threads


def test_run_glue_defaults_are_the_originals(env, tmp_path):
    """No arguments: MNLI 24 5e-5 fp16 true 1 128 64 3.0 0.1 $BERT_DIR/bert_model.ckpt, on one process."""
    argv, threads = recorded_command(
        {name: value for name, value in env.items() if name != "OMP_NUM_THREADS"}, tmp_path, "run_glue.sh"
    )
    run_dir = f"{tmp_path}/results/MNLI_fp16_bs24_lr5e-5_seq128_baseline_gpu1"
    assert argv == [
        "-m",
        "bertbench.run_classifier",
        "--task_name=MNLI",
        "--do_train=true",
        "--do_eval=true",
        f"--data_dir={env['GLUE_DIR']}/MNLI",
        f"--vocab_file={BERT_DIR}/vocab.txt",
        f"--bert_config_file={BERT_DIR}/bert_config.json",
        f"--init_checkpoint={BERT_DIR}/bert_model.ckpt",
        "--max_seq_length=128",
        "--train_batch_size=24",
        "--learning_rate=5e-5",
        "--num_train_epochs=3.0",
        "--warmup_proportion=0.1",
        "--precision=fp16",
        "--use_xla=true",
        f"--output_dir={run_dir}",
    ]
    assert threads == "OMP_NUM_THREADS="


def test_the_template_knobs_become_runner_flags_that_the_command_line_overrides(env, tmp_path):
    env = dict(
        env,
        MODELING="recompute",
        RECOMPUTE_POLICY="selective",
        MAX_TRAIN_SECONDS="1200",
        LR_SCALING="linear",
        EXTRA_FLAGS="--seed=3  --do_predict",
        CORES_PER_GPU="5",
        OMP_NUM_THREADS="20",
    )  # as PBS Pro sets it: the chunk's ncpus, for all of its processes
    argv, threads = recorded_command(env, tmp_path, "run_glue.sh", *POSITIONAL, "--seed=4")
    knobs = [
        "--modeling=recompute",
        "--recompute_policy=selective",
        "--max_train_seconds=1200",
        "--lr_scaling=linear",
        "--seed=3",
        "--do_predict",
        "--seed=4",
    ]
    assert argv[-len(knobs) :] == knobs  # the script's own flags come last: the runner takes the last one
    assert argv[-len(knobs) - 1].endswith("/MRPC_fp32_bs16_lr1e-3_seq32_recompute-selective_gpu1")
    assert threads == "OMP_NUM_THREADS=5"
    squad_argv, _ = recorded_command(dict(env, SQUAD_DIR=str(tmp_path)), tmp_path, "run_squad.sh", *SQUAD_POSITIONAL)
    assert squad_argv[1 - len(knobs) :] == knobs[:-1]
    bad = subprocess.run(
        ["bash", os.path.join(SCRIPTS, "run_glue.sh"), *POSITIONAL],
        env=dict(env, CORES_PER_GPU="five"),
        capture_output=True,
        text=True,
    )
    assert (
        bad.returncode == 2 and "run_glue.sh: error: CORES_PER_GPU must be a positive integer, got 'five'" in bad.stderr
    )


@pytest.mark.parametrize(
    "script, arguments, runner, run_dir",
    [
        (
            "run_glue.sh",
            POSITIONAL[:5] + ["2"] + POSITIONAL[6:],
            "run_classifier",
            "MRPC_fp32_bs16_lr1e-3_seq32_baseline_gpu2",
        ),
        (
            "run_squad.sh",
            SQUAD_POSITIONAL[:4] + ["2"] + SQUAD_POSITIONAL[5:],
            "run_squad",
            "squad2.0_tf1_tiny_fp32_bs8_lr1e-3_seq64_stride16_baseline_gpu2",
        ),
    ],
)
def test_num_gpu_processes_start_through_torchrun_on_one_node(env, tmp_path, script, arguments, runner, run_dir):
    argv, _ = recorded_command(dict(env, SQUAD_DIR=str(tmp_path)), tmp_path, script, *arguments)
    launch = ["-m", "bertbench.runners.launch", "--standalone", "--nproc-per-node=2", "--max-restarts=0"]
    assert argv[: len(launch) + 2] == [*launch, "-m", f"bertbench.{runner}"]
    assert f"--output_dir={tmp_path}/results/{run_dir}" in argv


def test_eval_sh_takes_a_run_a_directory_of_runs_or_results_dir(example_runs, tmp_path):
    """The runner command eval.sh starts for each run (the PYTHON stand-in records it; the one-line reads of each
    run's record go to Python): a run directory, a directory of runs, or $RESULTS_DIR when given flags only."""
    record = tmp_path / "commands"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} "$@"\necho "$*" >> "{record}"\n')
    fake.chmod(0o755)

    def commands(*arguments, **variables):
        done = subprocess.run(
            ["bash", os.path.join(SCRIPTS, "eval.sh"), *arguments],
            env=dict(os.environ, PYTHON=str(fake), **variables),
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        lines = record.read_text().splitlines()
        record.unlink()
        return lines

    glue, squad = example_runs.results / GLUE_RUN, example_runs.results / SQUAD_RUN
    assert commands(str(glue)) == [f"-m bertbench.run_classifier --do_eval=true --output_dir={glue}"]
    both = [
        f"-m bertbench.run_classifier --do_eval=true --output_dir={glue}",
        f"-m bertbench.run_squad --do_predict=true --output_dir={squad}",
    ]
    assert commands(str(example_runs.results)) == both
    flagged = [f"{command} --eval_batch_size=4" for command in both]
    assert commands("--eval_batch_size=4", RESULTS_DIR=str(example_runs.results)) == flagged


def test_bad_arguments_and_missing_runs(env, tmp_path):
    arguments = POSITIONAL.copy()
    arguments[3] = "fp64"
    done = run_glue(env, *arguments)
    assert done.returncode == 2 and "precision must be fp16, fp32 or bf16, got 'fp64'" in done.stderr
    missing = subprocess.run(
        ["bash", os.path.join(SCRIPTS, "eval.sh"), str(tmp_path / "nothing")], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 2 and "no run directory" in missing.stderr


def test_a_run_that_fails_its_input_checks_leaves_nothing_behind(env, tmp_path, error_line):
    """The original's first command without its download: the runner refuses it in one line naming the file, with
    status 2, having written nothing (the command run_glue.sh builds, run in this process); run_glue.sh then removes
    the run directory and logs it made, and a directory that was there before keeps what it had (a PYTHON stand-in
    refuses in its place, without the seconds of importing torch)."""
    from bertbench import run_classifier

    env = dict(env, BERT_DIR=str(tmp_path / "no-bert"))
    argv, _ = recorded_command(env, tmp_path, "run_glue.sh", *POSITIONAL)
    assert argv[:2] == ["-m", "bertbench.run_classifier"]
    shutil.rmtree(tmp_path / "results")  # the stand-in's run left its logs
    assert run_classifier.main(argv[2:]) == 2
    assert error_line() == f"run_classifier: error: {tmp_path}/no-bert/bert_config.json: no such file"
    assert not (tmp_path / "results").exists()

    refusing = tmp_path / "python"
    refusing.write_text("#!/bin/sh\necho 'run_classifier: error: refused' >&2\nexit 2\n")
    refusing.chmod(0o755)
    done = run_glue(dict(env, PYTHON=str(refusing)), *POSITIONAL)
    assert done.returncode == 2 and done.stdout.splitlines()[-1] == "run_classifier: error: refused"
    assert not (tmp_path / "results").exists()
    run_dir = tmp_path / "results" / "MRPC_fp32_bs16_lr1e-3_seq32_baseline_gpu1"
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("mine")
    assert run_glue(dict(env, PYTHON=str(refusing)), *POSITIONAL).returncode == 2
    assert (run_dir / "notes.txt").read_text() == "mine"


def run_squad(env, *arguments):
    return subprocess.run(
        ["bash", os.path.join(SCRIPTS, "run_squad.sh"), *arguments], env=env, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "index, value, message",
    [
        (2, "fp64", "precision must be fp16, fp32 or bf16"),
        (7, "huge", "bert_model must be large or base"),
        (8, "3.0", "squad_version must be 1.1 or 2.0"),
        (4, "0", "num_gpu must be a positive integer"),
    ],
)
def test_run_squad_bad_arguments(env, index, value, message):
    arguments = SQUAD_POSITIONAL.copy()
    arguments[index] = value
    done = run_squad(env, *arguments)
    assert done.returncode == 2 and f"run_squad.sh: error: {message}, got '{value}'" in done.stderr


@pytest.mark.parametrize(
    "flags, tag",
    [
        ((), "_baseline"),
        (("--modeling=recompute",), "_recompute-full"),
        (("--modeling", "recompute", "--recompute_policy", "every-k", "--recompute-every=3"), "_recompute-every-k3"),
        (("--recompute-policy=selective", "--modeling=recompute"), "_recompute-selective"),
        (("--modeling=recompute", "--modeling=baseline", "--learning_rate=1e-3"), "_baseline"),
    ],
)
def test_run_directory_names_carry_the_modeling_module_and_policy(flags, tag):
    """Baseline and recompute runs of the same positional arguments never share a directory."""
    done = subprocess.run(
        ["bash", "-c", f'source {SCRIPTS}/common.sh && modeling_tag "$@"', "modeling_tag", *flags],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout == f"{tag}\n"


def resolve_nodes(**variables):
    """NNODES NODE_RANK MASTER_ADDR MASTER_PORT as common.sh's resolve_nodes sets them, or its error (status 2)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("SLURM_", "PET_", "NNODES", "NODE_RANK", "MASTER_"))
    }
    done = subprocess.run(
        [
            "bash",
            "-c",
            f'source {SCRIPTS}/common.sh; resolve_nodes test.sh; echo "$NNODES $NODE_RANK $MASTER_ADDR $MASTER_PORT"',
        ],
        env={**env, **variables},
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() if done.returncode == 0 else (done.returncode, done.stderr.strip())


def test_nodes_from_the_environment_or_the_scheduler(tmp_path):
    assert resolve_nodes() == "1 0  29500"
    assert resolve_nodes(NNODES="2", NODE_RANK="1", MASTER_ADDR="node1", MASTER_PORT="1234") == "2 1 node1 1234"
    # a Kubeflow PyTorchJob pod
    assert (
        resolve_nodes(PET_NNODES="3", PET_NODE_RANK="2", MASTER_ADDR="job-master-0", MASTER_PORT="23456")
        == "3 2 job-master-0 23456"
    )
    # a task of an srun step: one node per task, the rendezvous on the step's first host
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        '#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu[03-04]" ] && printf "gpu03\\ngpu04\\n"\n'
    )
    (bin_dir / "scontrol").chmod(0o755)
    assert (
        resolve_nodes(
            SLURM_STEP_NUM_TASKS="2",
            SLURM_PROCID="1",
            SLURM_STEP_NODELIST="gpu[03-04]",
            PATH=f"{bin_dir}:{os.environ['PATH']}",
        )
        == "2 1 gpu03 29500"
    )
    # the batch script itself is not a step: one node
    assert resolve_nodes(SLURM_NTASKS="8", SLURM_PROCID="0") == "1 0  29500"


@pytest.mark.parametrize(
    "variables, message",
    [
        ({"NNODES": "two"}, "NNODES must be a positive integer, got 'two'"),
        ({"NNODES": "2", "MASTER_ADDR": "node1"}, "NODE_RANK must be 0..1 on each of the NNODES=2 nodes, got ''"),
        ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "node1"}, "NODE_RANK must be 0..1"),
        ({"NNODES": "2", "NODE_RANK": "0"}, "NNODES=2 needs MASTER_ADDR, the rendezvous host every node can reach"),
    ],
)
def test_nodes_that_do_not_describe_a_job_are_refused(variables, message):
    status, error = resolve_nodes(**variables)
    assert status == 2 and error.startswith(f"test.sh: error: {message}")


def test_a_node_that_never_joins_stops_run_glue_in_one_line(env, tmp_path, capsys):
    """Node 0 of 2 whose partner never starts: the launcher command run_glue.sh builds (run in this process) gives
    up after RDZV_TIMEOUT in one line that names the run's rendezvous; the script passes on a failed launch's status 1
    and last line and keeps its logs, as a run that started (a PYTHON stand-in fails in the launcher's place, without
    the seconds of importing torch)."""
    from bertbench.runners import launch

    env = dict(env, NNODES="2", NODE_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RDZV_TIMEOUT="1")
    argv, _ = recorded_command(env, tmp_path, "run_glue.sh", *POSITIONAL)
    assert argv[:2] == ["-m", "bertbench.runners.launch"]
    assert launch.main(argv[2:]) == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith(
            "bertbench launch: error: rendezvous 'bertbench-MRPC_fp32_bs16_lr1e-3_seq32_baseline_gpu1_nodes2' at "
            f"127.0.0.1:{env['MASTER_PORT']} (c10d) timed out after 1 s"
        )
    )
    shutil.rmtree(tmp_path / "results")  # the stand-in's run left its logs
    failing = tmp_path / "python"
    failing.write_text("#!/bin/sh\necho 'bertbench launch: error: rendezvous timed out' >&2\nexit 1\n")
    failing.chmod(0o755)
    done = run_glue(dict(env, PYTHON=str(failing)), *POSITIONAL)
    assert done.returncode == 1
    assert done.stdout.strip().splitlines()[-1] == "bertbench launch: error: rendezvous timed out"
    run_dir = tmp_path / "results" / "MRPC_fp32_bs16_lr1e-3_seq32_baseline_gpu1_nodes2"
    assert sorted(os.listdir(run_dir)) == ["command.log", "train.node0.log"]  # nothing of a run


@pytest.fixture
def pretraining_env(tmp_path):
    """BERT_DIR with a tiny model that takes 512 positions, and phase 1 / phase 2 / eval shards of NVIDIA's shapes."""
    from helpers import write_bert_dir, write_nvidia_shard

    bert_dir = write_bert_dir(tmp_path / "bert", max_position_embeddings=512)
    for phase, seq, predictions in ((1, 128, 20), (2, 512, 80)):
        for index in range(2):
            (tmp_path / f"phase{phase}").mkdir(exist_ok=True)
            write_nvidia_shard(
                tmp_path / f"phase{phase}" / f"part_{index}.hdf5",
                count=12,
                seq=seq,
                predictions=predictions,
                seed=index,
            )
    write_nvidia_shard(tmp_path / "eval.hdf5", count=8, seq=128, predictions=20, seed=7)
    return dict(
        os.environ,
        BERT_DIR=str(bert_dir),
        DATA_DIR_PHASE1=str(tmp_path / "phase1"),
        DATA_DIR_PHASE2=str(tmp_path / "phase2"),
        EVAL_DIR=str(tmp_path / "eval.hdf5"),
        RESULTS_DIR=str(tmp_path / "results"),
        PYTHON=sys.executable,
    )


def run_pretraining(env, *arguments):
    return subprocess.run(
        ["bash", os.path.join(SCRIPTS, "run_pretraining.sh"), *arguments], env=env, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["3"], "phase must be 1 or 2, got '3'"),
        (["2"], "phase 2 starts from phase 1's run directory"),
        (["1", "4", "1e-3", "fp8"], "precision must be fp16, fp32 or bf16, got 'fp8'"),
    ],
)
def test_run_pretraining_bad_arguments(pretraining_env, arguments, message):
    done = run_pretraining(pretraining_env, *arguments)
    assert done.returncode == 2 and message in done.stderr and len(done.stderr.strip().splitlines()) == 1
