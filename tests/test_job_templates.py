"""job_templates/ run as the schedulers run them: the PBS jobs in a PBS job's environment (PBS_NODEFILE with one
or two hosts, a remote shell; the optimized job's training across two hosts inside Singularity is
test_twenty_minutes' run of the recipe that submits it), the Slurm job submitted to a real single-machine Slurm cluster (Debian's
slurmctld, slurmd and munge, started here), the Kubernetes PyTorchJob's pods as the Kubeflow operator starts them;
the container recipes against the repository."""

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

import pytest
import yaml
from helpers import free_port, in_process_entry_point, read_json

from bertbench.tasks.synthetic import write_glue_task

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEMPLATES = os.path.join(ROOT, "job_templates")
BERT_DIR = os.path.join(HERE, "fixtures", "tf1_tiny")
# The templates' GPU-sized defaults, replaced by what the CPU runs in seconds (MRPC: the task job_env writes). One
# thread per process: the templates' 5 (CORES_PER_GPU) would have each tiny run's OpenMP threads spin against the
# others' on a 2-core machine (test_pbs_jobs_default_to_the_originals_runs checks the default).
CPU_SETTINGS = {
    "TASK": "MRPC",
    "PRECISION": "fp32",
    "USE_XLA": "false",
    "BATCH_SIZE": "8",
    "LEARNING_RATE": "1e-3",
    "SEQ_LENGTH": "32",
    "EPOCHS": "1.0",
    "GPUS_PER_NODE": "1",
    "CORES_PER_GPU": "1",
    "RDZV_TIMEOUT": "120",
}


@pytest.fixture
def job_env(tmp_path):
    write_glue_task(tmp_path / "glue", "MRPC", train=128, dev=24, test=8)
    return dict(
        os.environ,
        BERT_DIR=BERT_DIR,
        GLUE_DIR=str(tmp_path / "glue"),
        RESULTS_DIR=str(tmp_path / "results"),
        PYTHON=sys.executable,
        MASTER_PORT=str(free_port()),
        **CPU_SETTINGS,
    )


def pbs_env(job_env, tmp_path, hosts):
    """What PBS gives a job: PBS_NODEFILE (a line per MPI process: mpiprocs lines per host), PBS_O_WORKDIR (where
    qsub ran: the repository), PBS_JOBID, PBS_ENVIRONMENT."""
    (tmp_path / "nodefile").write_text("".join(f"{host}\n" for host in hosts))
    return dict(
        job_env,
        PBS_NODEFILE=str(tmp_path / "nodefile"),
        PBS_O_WORKDIR=ROOT,
        PBS_JOBID="4242.pbs-server",
        PBS_ENVIRONMENT="PBS_BATCH",
    )


def run_job(script, env, cwd):
    return subprocess.run(["bash", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


# How each starter of every_node.sh is stood in for (tests/fixtures): PBS_REMOTE_SHELL, whether the node gets only
# the job's own environment (tm_spawn, ssh) or the caller's (srun), and the start of the line the stand-in logs for
# host "node-1", whose first line in the node file is line 4 (from 0).
STARTERS = {
    "pbs_tmrsh": ("pbs_tmrsh", True, "pbs_tmrsh node-1 /bin/bash -c "),
    "pbsdsh": ("pbsdsh", True, "pbsdsh -n 4 (node-1) /bin/bash -c "),
    "ssh": ("local_rsh", True, "local_rsh node-1 /bin/bash -c "),
    "srun": ("srun", False, "srun --nodelist=node-1 /bin/bash -c "),
}
# Words and values a shell would take apart if anything re-parsed them once too often or too few times.
TRICKY_ARGS = [
    "two words",
    "--b='x y'",
    'say "hi"',
    "",
    "*",
    "$HOME",
    "back\\slash",
    "semi; echo injected",
    "tab\there",
    "new\nline",
    "héllo",
]
FORWARDED = {
    "EXTRA_FLAGS": "--a=1 --b='x y'",
    "MODELING": "recompute",
    "RECOMPUTE_POLICY": "selective",
    "MAX_TRAIN_SECONDS": "30",
    "LR_SCALING": "sqrt",
    "CORES_PER_GPU": "2",
    "OMP_NUM_THREADS": "1",
}
# A node's command that records what it got: its arguments (NUL-separated), environment and working directory, in
# $RESULTS_DIR (forwarded by every_node.sh).
RECORDER = """#!/bin/bash
out="${RESULTS_DIR:?not forwarded}/node$NODE_RANK"
printf '%s\\0' "$@" > "$out.argv"
env -0 > "$out.env"
pwd -P > "$out.pwd"
"""


def every_node_env(tmp_path, starter, hosts=("localhost",) * 4 + ("node-1",) * 4):
    """A two-host PBS job's environment for run_on_every_node, with a working directory, a results directory and
    forwarded values that hold spaces and quotes, and a variable that every_node.sh does not forward."""
    workdir = tmp_path / "job dir 'with' \"quotes\""
    workdir.mkdir(exist_ok=True)
    (tmp_path / "nodefile").write_text("".join(f"{host}\n" for host in hosts))
    env = dict(
        os.environ,
        PBS_NODEFILE=str(tmp_path / "nodefile"),
        PBS_O_WORKDIR=str(workdir),
        PBS_JOBID="4242.pbs-server",
        PBS_ENVIRONMENT="PBS_BATCH",
        RESULTS_DIR=str(tmp_path / "results dir"),
        SQUAD_DIR=str(tmp_path / "squad 'data'"),
        MASTER_PORT="29555",
        NOT_FORWARDED="job script only",
        STARTER_LOG=str(tmp_path / "starter.log"),
        **FORWARDED,
    )
    os.makedirs(env["RESULTS_DIR"], exist_ok=True)
    if starter is None:
        env.pop("PBS_REMOTE_SHELL", None)
    else:
        env["PBS_REMOTE_SHELL"] = os.path.join(HERE, "fixtures", STARTERS[starter][0])
    recorder = tmp_path / "bin dir" / "record node"
    recorder.parent.mkdir(exist_ok=True)
    recorder.write_text(RECORDER)
    recorder.chmod(0o755)
    return env, str(recorder)


def run_on_every_node(env, *command):
    every_node = shlex.quote(os.path.join(TEMPLATES, "pbs", "every_node.sh"))
    script = f'set -euo pipefail; source {every_node}; run_on_every_node "$@"'
    return subprocess.run(
        ["bash", "-c", script, "bash", *command], env=env, cwd=env["HOME"], capture_output=True, timeout=60
    )


def read_node(results_dir, rank):
    base = os.path.join(results_dir, f"node{rank}")
    with open(base + ".argv", "rb") as handle:
        argv = handle.read().decode().split("\0")[:-1]
    with open(base + ".env", "rb") as handle:
        env = dict(item.split("=", 1) for item in handle.read().decode().split("\0")[:-1])
    with open(base + ".pwd") as handle:
        return argv, env, handle.read().rstrip("\n")


@pytest.mark.parametrize("starter", sorted(STARTERS))
def test_run_on_every_node_gives_each_node_its_arguments_and_environment_intact(tmp_path, starter):
    env, recorder = every_node_env(tmp_path, starter)
    done = run_on_every_node(env, recorder, *TRICKY_ARGS)
    assert done.returncode == 0, done.stderr.decode()

    _, clears_environment, logged = STARTERS[starter]
    log = (tmp_path / "starter.log").read_text().splitlines()
    assert len(log) == 1 and log[0].startswith(logged)  # the first host ran its part itself
    for rank in (0, 1):
        argv, node_env, pwd = read_node(env["RESULTS_DIR"], rank)
        assert argv == TRICKY_ARGS
        assert pwd == os.path.realpath(env["PBS_O_WORKDIR"])
        assert {
            name: node_env.get(name) for name in ("NNODES", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "RDZV_ID")
        } == {
            "NNODES": "2",
            "NODE_RANK": str(rank),
            "MASTER_ADDR": "localhost",
            "MASTER_PORT": "29555",
            "RDZV_ID": "4242.pbs-server",
        }
        for name in (*FORWARDED, "SQUAD_DIR", "RESULTS_DIR", "PATH"):
            assert node_env.get(name) == env[name], name
    # The local node keeps the job's whole environment; a remote one gets what was forwarded (and, from srun, all).
    assert read_node(env["RESULTS_DIR"], 0)[1]["NOT_FORWARDED"] == "job script only"
    assert ("NOT_FORWARDED" in read_node(env["RESULTS_DIR"], 1)[1]) is not clears_environment


@pytest.mark.parametrize("starter", sorted(STARTERS))
def test_run_on_every_node_fails_when_a_remote_node_fails(tmp_path, starter):
    env, recorder = every_node_env(tmp_path, starter)
    script = tmp_path / "fail on node 1"
    script.write_text(f'#!/bin/bash\n{shlex.quote(recorder)} "$@"\n[ "$NODE_RANK" != 1 ] || exit 3\n')
    script.chmod(0o755)
    done = run_on_every_node(env, str(script), "x")
    # The node's status comes back through each starter but pbsdsh, which exits 0 whatever its task did: there its
    # report line ("pbsdsh: task 0x00000000 exit status 3") must count.
    assert done.returncode == (1 if starter == "pbsdsh" else 3), done.stderr.decode()
    assert sorted(os.listdir(env["RESULTS_DIR"])) == [
        f"node{rank}.{kind}" for rank in (0, 1) for kind in ("argv", "env", "pwd")
    ]  # both ran


def test_old_quoting_fails_under_the_tm_spawn_stand_in(tmp_path):
    """What every_node.sh did before: one %q-quoted word for `bash -c`. A remote shell's re-parse (ssh, rsh: the
    local_rsh stand-in) undoes the quoting; tm_spawn (pbs_tmrsh) passes the word as it is, and bash looks for a
    program named by the whole command line, as on a real OpenPBS job."""
    env, recorder = every_node_env(tmp_path, None)
    old_way = """
        words=(env NODE_RANK=1 RESULTS_DIR="$RESULTS_DIR" "$@")
        command=$(printf '%q ' cd "$PBS_O_WORKDIR")"&& exec "$(printf '%q ' "${words[@]}")
        "$STARTER" node-1 bash -c "$(printf '%q' "$command")"
        """
    outcomes = {}
    for stand_in in ("local_rsh", "pbs_tmrsh"):
        env["STARTER"] = os.path.join(HERE, "fixtures", stand_in)
        done = subprocess.run(
            ["bash", "-c", old_way, "bash", recorder, "two words"], env=env, capture_output=True, text=True, timeout=60
        )
        recorded = os.path.join(env["RESULTS_DIR"], "node1.argv")
        outcomes[stand_in] = (done.returncode, os.path.exists(recorded))
        if os.path.exists(recorded):
            os.remove(recorded)
        if stand_in == "pbs_tmrsh":
            assert re.search(
                r"^bash: line 1: cd .* && exec env NODE_RANK=1 .*: No such file or directory$", done.stderr, re.M
            ), done.stderr
    assert outcomes == {"local_rsh": (0, True), "pbs_tmrsh": (127, False)}


@pytest.mark.parametrize("starter", ["default", "missing"])
def test_run_on_every_node_without_a_starter_fails_before_any_node_starts(tmp_path, starter):
    env, recorder = every_node_env(tmp_path, None)
    if starter == "default":
        if shutil.which("pbs_tmrsh", path=env["PATH"]):
            pytest.skip("pbs_tmrsh is installed here")
        spec = "pbs_tmrsh"
    else:
        spec = env["PBS_REMOTE_SHELL"] = str(tmp_path / "no such starter")
    done = run_on_every_node(env, recorder)
    assert done.returncode == 2
    assert done.stderr.decode().splitlines() == [
        f"every_node.sh: error: PBS_REMOTE_SHELL='{spec}' is not a command here; the 2 hosts need one to start the "
        "others (pbs_tmrsh, pbsdsh, ssh, rsh or srun)"
    ]
    assert os.listdir(env["RESULTS_DIR"]) == []


def recording_python(tmp_path):
    """A PYTHON stand-in that records the OMP_NUM_THREADS and the words of each call (a line each) instead of running
    anything: (its path, the record)."""
    record = tmp_path / "python.argv"
    (tmp_path / "python").write_text(
        f'#!/bin/sh\necho "OMP_NUM_THREADS=$OMP_NUM_THREADS" >> "{record}"\n'
        f'for word in "$@"; do echo "$word" >> "{record}"; done\n'
    )
    (tmp_path / "python").chmod(0o755)
    return str(tmp_path / "python"), record


@pytest.mark.parametrize(
    "template, batch, xla", [("baseline_1gpu.pbs", "24", "true"), ("optimized_2x4gpu.pbs", "48", "false")]
)
def test_pbs_jobs_default_to_the_originals_runs(job_env, tmp_path, template, batch, xla):
    """Nothing set: the baseline job is the original's run_glue.sh defaults, the optimized job the original's
    optimized run (batch 48 per GPU, no XLA), each process on 5 CPU threads (CORES_PER_GPU, the select lines'
    ncpus per GPU). A PYTHON stand-in records the runner's command instead of training."""
    python, record = recording_python(tmp_path)
    env = {name: value for name, value in pbs_env(job_env, tmp_path, ["localhost"]).items() if name not in CPU_SETTINGS}
    done = run_job(os.path.join(TEMPLATES, "pbs", template), dict(env, PYTHON=python), tmp_path)
    assert done.returncode == 0, done.stderr
    argv = record.read_text().splitlines()
    assert f"--train_batch_size={batch}" in argv and f"--use_xla={xla}" in argv and "--task_name=MNLI" in argv
    assert argv[0] == "OMP_NUM_THREADS=5"


def test_pbs_job_without_hosts_fails_clearly(job_env, tmp_path):
    env = pbs_env(job_env, tmp_path, [])
    done = run_job(os.path.join(TEMPLATES, "pbs", "baseline_1gpu.pbs"), env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == f"every_node.sh: error: {tmp_path / 'nodefile'} lists no hosts"


# ---- outside the scheduler: one line, and the way to try the template on this machine -------------------------------


def outside_any_job(env):
    """The environment without what PBS or Slurm give a job."""
    return {name: value for name, value in env.items() if not name.startswith(("PBS_", "SLURM_"))}


def tried_here(line, env, cwd):
    """Runs the command that ends a template's line ("... with the same variables: COMMAND") in bash."""
    command = line.split("with the same variables: ", 1)[1]
    return subprocess.run(["bash", "-c", command], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "template, missing, started",
    [
        ("baseline_1gpu.pbs", "PBS_O_WORKDIR and PBS_NODEFILE", "--train_batch_size=8"),
        ("optimized_2x4gpu.pbs", "PBS_O_WORKDIR and PBS_NODEFILE", "--lr_scaling=linear"),
        ("compare.pbs", "PBS_O_WORKDIR", None),
    ],
)
def test_a_pbs_template_outside_pbs_says_so_in_one_line_with_the_command_that_tries_it_here(
    job_env, tmp_path, template, missing, started
):
    python, record = recording_python(tmp_path)
    env = dict(outside_any_job(job_env), PYTHON=python)
    script = os.path.join(TEMPLATES, "pbs", template)
    done = run_job(script, env, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    nodefile = " PBS_NODEFILE=<(echo localhost)" if "PBS_NODEFILE" in missing else ""
    assert line == (
        f"{template}: error: not inside a PBS job ({missing} unset): submit it with qsub, or try it on this machine "
        f"as a one-host job, with the same variables: PBS_O_WORKDIR={ROOT}{nodefile} bash {script}"
    )
    assert not record.exists() and not os.path.exists(env["RESULTS_DIR"])  # nothing started
    tried = tried_here(line, env, tmp_path)
    if started:  # the job's runner, started here (the stand-in records its flags)
        assert tried.returncode == 0, tried.stderr
        assert "--task_name=MRPC" in record.read_text().splitlines() and started in record.read_text()
    else:  # past the PBS variables, to the job's own first check
        assert (tried.returncode, tried.stderr) == (
            2,
            f"compare.pbs: error: {env['RESULTS_DIR']} holds no run directory: did the training jobs start?\n",
        )


@pytest.mark.slow
def test_the_documented_one_machine_way_trains_with_a_pbs_template_and_compares(tmp_path, monkeypatch):
    """docs/clusters.md's block, as printed, from a directory laid out as the repository (its job_templates/ and
    scripts/): the example data, the baseline job as a one-host job, then compare.pbs on its run. Its commands run
    one after the other, as test_docs runs the docs' blocks: a plain `bertbench ...` line through the same entry
    point in this process (the words as bash splits them), the others in bash."""
    page = open(os.path.join(ROOT, "docs", "clusters.md")).read()
    block = re.search(r"```bash\n(.*?)```", page[page.index("## A template on one machine") :], re.S).group(1)
    for name in ("job_templates", "scripts"):
        (tmp_path / name).symlink_to(os.path.join(ROOT, name))
    monkeypatch.chdir(tmp_path)
    env = dict(outside_any_job(os.environ), PYTHON=sys.executable)
    for command in block.replace("\\\n", "").splitlines():
        entry = in_process_entry_point(command)
        if entry:
            assert entry[0](entry[1]) == 0, command
            continue
        done = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{command}"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, command + "\n" + done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "pbs" / "MRPC_fp32_bs32_lr2e-5_seq128_baseline_gpu1"
    train = read_json(run_dir / "train_results.json")
    assert (train["world_size"], train["modeling"], train["train_batch_size"]) == (1, "baseline", 32)
    report = read_json(tmp_path / "runs" / "pbs" / "report" / "report.json")
    assert [row["run"] for row in report["context"]["training"]["rows"]] == [run_dir.name]


def test_twenty_minutes_without_qsub_gives_its_jobs_one_after_the_other_here(job_env, tmp_path):
    python, record = recording_python(tmp_path)
    env = dict(outside_any_job(job_env), PYTHON=python, PATH="/usr/bin:/bin", BASELINE_BATCH_SIZE="4")
    done = subprocess.run(
        [os.path.join(TEMPLATES, "pbs", "twenty_minutes.sh")], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line.startswith(
        "twenty_minutes.sh: error: qsub not found: run it on a PBS login node, or try it on this machine, its jobs "
        f"one after the other as one-host jobs: ( export PBS_O_WORKDIR={ROOT} BERT_DIR={BERT_DIR} "
    )
    assert not record.exists() and not os.path.exists(env["RESULTS_DIR"])
    command = line.split("as one-host jobs: ", 1)[1]
    tried = subprocess.run(["bash", "-c", command], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    # each job ran here: the two runners (with the batch each job takes, in the 20-minute budget), then compare.pbs,
    # which finds no run directory (the stand-in trained nothing)
    words = record.read_text().splitlines()
    assert [word for word in words if word.startswith("--train_batch_size=")] == [
        "--train_batch_size=4",
        "--train_batch_size=8",
    ]
    assert words.count("--max_train_seconds=1200") == 2
    assert tried.stderr.endswith(
        f"compare.pbs: error: {env['RESULTS_DIR']} holds no run directory: did the training jobs start?\n"
    )


def test_the_slurm_job_outside_slurm_says_so_in_one_line_with_what_its_nodes_run(job_env, tmp_path):
    python, record = recording_python(tmp_path)
    env = dict(outside_any_job(job_env), PYTHON=python)
    done = run_job(os.path.join(TEMPLATES, "slurm", "run_glue.sbatch"), env, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    (line,) = done.stderr.splitlines()
    assert line == (
        "run_glue.sbatch: error: not inside a Slurm job (SLURM_JOB_ID unset): submit it with sbatch, or try on this "
        f"machine what it runs on each node, with the same variables: cd {ROOT} && scripts/run_glue.sh MRPC 8 1e-3 "
        "fp32 false 1 32 64 1.0 0.1"
    )
    assert not record.exists() and not os.path.exists(env["RESULTS_DIR"])
    tried = tried_here(line, env, tmp_path)
    assert tried.returncode == 0, tried.stderr
    assert "--task_name=MRPC" in record.read_text().splitlines()


# ---- Slurm ---------------------------------------------------------------------------------------------------------

SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")


def find_program(name):
    return shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A one-node Slurm cluster on this machine (controller, node daemon and munge under a temporary directory, on
    free ports); yields the environment that points sbatch at it."""
    missing = [name for name in SLURM_PROGRAMS if find_program(name) is None]
    if missing:
        pytest.skip(
            f"Slurm cannot be started here: {', '.join(missing)} not installed (Debian's slurmctld slurmd "
            "slurm-client munge; .ci/run installs them)"
        )
    if os.geteuid() != 0:
        pytest.skip("Slurm cannot be started here: its daemons need root")
    root = tmp_path_factory.mktemp("slurm")
    for name in ("munge", "state", "spool", "log"):
        (root / name).mkdir()
    (root / "munge" / "munge.key").write_bytes(os.urandom(1024))
    (root / "munge" / "munge.key").chmod(0o600)
    socket_path = root / "munge" / "munge.socket"
    subprocess.run(
        [
            find_program("munged"),
            "--force",
            f"--socket={socket_path}",
            f"--key-file={root / 'munge' / 'munge.key'}",
            f"--pid-file={root / 'munge' / 'munged.pid'}",
            f"--log-file={root / 'munge' / 'munged.log'}",
            f"--seed-file={root / 'munge' / 'seed'}",
        ],
        check=True,
        capture_output=True,
    )
    conf = root / "slurm.conf"
    conf.write_text(f"""ClusterName=bertbench
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={socket_path}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "log" / "slurmctld.log"}
SlurmdLogFile={root / "log" / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    try:
        subprocess.run([find_program("slurmctld")], env=env, check=True, capture_output=True)
        subprocess.run([find_program("slurmd"), "-N", "localhost"], env=env, check=True, capture_output=True)
        wait_for(
            lambda: (
                subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip()
                == "idle"
            ),
            60,
            "the Slurm node never became idle",
        )
        yield env
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        pid_file = root / "munge" / "munged.pid"
        if pid_file.exists():
            subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True)


def test_run_on_every_node_through_a_real_srun(slurm_cluster, tmp_path):
    """PBS_REMOTE_SHELL=srun against the one-node Slurm cluster: the srun form every_node.sh uses (and the srun
    stand-in imitates) delivers the same arguments, directory and environment."""
    env, recorder = every_node_env(tmp_path, None, hosts=("head-node",) * 4 + ("localhost",) * 4)
    env.update(SLURM_CONF=slurm_cluster["SLURM_CONF"], PBS_REMOTE_SHELL=find_program("srun"))
    done = run_on_every_node(env, recorder, *TRICKY_ARGS)
    assert done.returncode == 0, done.stderr.decode()
    for rank in (0, 1):
        argv, node_env, pwd = read_node(env["RESULTS_DIR"], rank)
        assert (argv, pwd, node_env["NODE_RANK"], node_env["NNODES"], node_env["MASTER_ADDR"]) == (
            TRICKY_ARGS,
            os.path.realpath(env["PBS_O_WORKDIR"]),
            str(rank),
            "2",
            "head-node",
        )
        assert all(node_env.get(name) == env[name] for name in FORWARDED)
    assert read_node(env["RESULTS_DIR"], 1)[1]["SLURM_STEP_NUM_TASKS"] == "1"  # a step of its own


@pytest.mark.slow
def test_slurm_job_srun_torchrun_two_tasks(slurm_cluster, job_env, tmp_path):
    env = {**job_env, "SLURM_CONF": slurm_cluster["SLURM_CONF"]}
    # The template asks for 2 nodes x 4 GPUs; this cluster is one CPU node: 2 tasks there, a process each.
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=1",
            "--ntasks-per-node=2",
            "--gpus-per-node=0",
            "--cpus-per-task=1",
            f"--output={tmp_path / 'slurm-%j.out'}",
            "--export=ALL",
            os.path.join(TEMPLATES, "slurm", "run_glue.sbatch"),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    wait_for(
        lambda: (
            not subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True, text=True).stdout.strip()
        ),
        300,
        f"Slurm job {job_id} did not finish",
    )
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    state = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, output[-3000:]
    run_dir = tmp_path / "results" / "MRPC_fp32_bs8_lr1e-3_seq32_baseline_gpu1_nodes2"  # run_glue.sh's name
    train = read_json(run_dir / "train_results.json")
    assert (train["world_size"], train["nodes"], train["global_step"], train["sentences"]) == (2, 2, 8, 128)
    assert read_json(run_dir / "eval_results.json")["dev_examples"] == 24
    assert output.count("***** Eval results") == 1


# ---- Kubernetes and the container recipes --------------------------------------------------------------------------


def manifest():
    with open(os.path.join(TEMPLATES, "k8s", "pytorchjob.yaml")) as handle:
        return yaml.safe_load(handle)


def expand(text, env):
    """Kubernetes' $(NAME) substitution in a container's command and args."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda match: env.get(match.group(1), match.group(0)), text)


def test_pytorchjob_is_well_formed():
    job = manifest()
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 1)
    (container,) = replicas["Worker"]["template"]["spec"]["containers"]
    env = {item["name"]: item["value"] for item in container["env"]}
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert job["spec"]["nprocPerNode"] == env["NPROC_PER_NODE"] == str(gpus)
    unknown = {name for arg in container["args"] for name in re.findall(r"\$\((\w+)\)", arg)} - set(env)
    assert not unknown
    mounts = {mount["name"] for mount in container["volumeMounts"]}
    assert mounts == {volume["name"] for volume in replicas["Worker"]["template"]["spec"]["volumes"]}
    with open(os.path.join(TEMPLATES, "k8s", "Dockerfile")) as handle:
        assert f"WORKDIR {container['workingDir']}" in handle.read()
    assert os.access(os.path.join(ROOT, container["command"][0]), os.X_OK)


@pytest.mark.slow
def test_pytorchjob_pods_run_as_the_operator_starts_them(job_env, tmp_path):
    """Each pod's container command, with the env the manifest gives and the operator adds (PET_NNODES,
    PET_NODE_RANK, MASTER_ADDR/MASTER_PORT of the master's service, WORLD_SIZE, RANK), the volumes' paths and the
    GPU-sized values replaced for the CPU."""
    job = manifest()
    pods = []
    specs = job["spec"]["pytorchReplicaSpecs"]
    for replica_type in ("Master", "Worker"):
        for _ in range(specs[replica_type]["replicas"]):
            pods.append(specs[replica_type]["template"]["spec"]["containers"][0])
    operator = {
        "PET_NNODES": str(len(pods)),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": job_env["MASTER_PORT"],
        "WORLD_SIZE": str(len(pods)),
        "PYTHONUNBUFFERED": "1",
    }
    processes = []
    for rank, container in enumerate(pods):
        env = {item["name"]: item["value"] for item in container["env"]}
        env.update(
            CPU_SETTINGS,
            BERT_DIR=BERT_DIR,
            GLUE_DIR=job_env["GLUE_DIR"],
            RESULTS_DIR=job_env["RESULTS_DIR"],
            NPROC_PER_NODE="1",
        )
        env.update(operator, PET_NODE_RANK=str(rank), RANK=str(rank))
        command = [expand(word, env) for word in container["command"] + container["args"]]
        processes.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env={**os.environ, **env, "PYTHON": sys.executable},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], "\n".join(outputs)[-4000:]
    run_dir = tmp_path / "results" / "MRPC_fp32_bs8_lr1e-3_seq32_recompute-full_gpu1_nodes2"
    train = read_json(run_dir / "train_results.json")
    assert (train["world_size"], train["nodes"], train["modeling"], train["lr_scaling"]) == (
        2,
        2,
        "recompute",
        "linear",
    )
    assert train["learning_rate"] == pytest.approx(2e-3) and train["global_step"] == 8  # 128 / (8 x 2)
    assert "".join(outputs).count("***** Eval results") == 1


def test_container_recipes_copy_what_the_repository_has():
    with open(os.path.join(TEMPLATES, "k8s", "Dockerfile")) as handle:
        dockerfile = handle.read()
    with open(os.path.join(TEMPLATES, "singularity", "bertbench.def")) as handle:
        definition = handle.read()
    copied = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith("COPY ")]
    files = definition.split("%files")[1].split("%")[0].split("\n")
    copied += [line.split()[:1] for line in files if line.strip()]
    sources = [source for sources in copied for source in sources]
    assert {"pyproject.toml", "README.md", "bertbench", "scripts"} <= set(sources)
    assert all(os.path.exists(os.path.join(ROOT, source)) for source in sources)
    base = re.search(r"ARG BASE_IMAGE=(\S+)", dockerfile).group(1)
    assert f"From: {base}" in definition  # one PyTorch build for both
    assert "pip install ." in dockerfile and "pip install --no-cache-dir /opt/bertbench" in definition


@pytest.mark.parametrize(
    "script",
    sorted(
        os.path.relpath(os.path.join(directory, name), ROOT)
        for top in ("scripts", "job_templates")
        for directory, _, names in os.walk(os.path.join(ROOT, top))
        for name in names
        if name.endswith((".sh", ".pbs", ".sbatch"))
    ),
)
def test_shell_scripts_parse(script):
    done = subprocess.run(["bash", "-n", os.path.join(ROOT, script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
