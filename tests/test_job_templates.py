"""job_templates/ run as the schedulers run them: the PBS jobs in a PBS job's environment (PBS_NODEFILE with one
or two hosts, a remote shell, Singularity), the Slurm job submitted to a real single-machine Slurm cluster (Debian's
slurmctld, slurmd and munge, started here), the Kubernetes PyTorchJob's pods as the Kubeflow operator starts them;
the container recipes against the repository."""

import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from bertbench.synthetic import write_glue_task
from conftest import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEMPLATES = os.path.join(ROOT, "job_templates")
BERT_DIR = os.path.join(HERE, "fixtures", "tf1_tiny")
# The templates' GPU-sized defaults, replaced by what the CPU runs in seconds.
CPU_SETTINGS = {"PRECISION": "fp32", "USE_XLA": "false", "BATCH_SIZE": "8", "LEARNING_RATE": "1e-3",
                "SEQ_LENGTH": "32", "EPOCHS": "1.0", "GPUS_PER_NODE": "1", "RDZV_TIMEOUT": "120"}


@pytest.fixture
def job_env(tmp_path):
    write_glue_task(tmp_path / "glue", "MRPC", train=128, dev=24, test=8)
    return dict(os.environ, BERT_DIR=BERT_DIR, GLUE_DIR=str(tmp_path / "glue"), RESULTS_DIR=str(tmp_path / "results"),
                PYTHON=sys.executable, MASTER_PORT=str(free_port()), **CPU_SETTINGS)


def read_json(path):
    with open(path) as handle:
        return json.load(handle)


def pbs_env(job_env, tmp_path, hosts):
    """What PBS gives a job: PBS_NODEFILE (a line per MPI process: mpiprocs lines per host), PBS_O_WORKDIR (where
    qsub ran: the repository), PBS_JOBID."""
    (tmp_path / "nodefile").write_text("".join(f"{host}\n" for host in hosts))
    return dict(job_env, PBS_NODEFILE=str(tmp_path / "nodefile"), PBS_O_WORKDIR=ROOT, PBS_JOBID="4242.pbs-server")


def run_job(script, env, cwd):
    return subprocess.run(["bash", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_pbs_baseline_1gpu_job(job_env, tmp_path):
    env = pbs_env(job_env, tmp_path, ["gpu-node-7"])
    done = run_job(os.path.join(TEMPLATES, "pbs", "baseline_1gpu.pbs"), env, cwd=tmp_path)  # PBS starts in $HOME
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = tmp_path / "results" / "MRPC_fp32_bs8_lr1e-3_seq32_baseline_gpu1"
    train = read_json(run_dir / "train_results.json")
    assert (train["world_size"], train["modeling"], train["lr_scaling"]) == (1, "baseline", "none")
    assert read_json(run_dir / "eval_results.json")["dev_examples"] == 24
    assert f"loaded {BERT_DIR}/bert_model.ckpt" in (run_dir / "train.log").read_text()


@pytest.mark.slow
def test_pbs_optimized_job_runs_one_agent_per_node_inside_singularity(job_env, tmp_path):
    """Two hosts of four MPI processes each (select=2:ngpus=4:mpiprocs=4); the second is reached through the remote
    shell; every node's command runs in `singularity exec --nv IMAGE` (a stand-in that records its arguments and
    runs the command)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "singularity").write_text(
        '#!/usr/bin/env bash\necho "$*" >> "$SINGULARITY_LOG"\n[ "$1" = exec ] || exit 64\nshift\n'
        'while [[ "$1" == --* ]]; do shift; done\nshift\nexec "$@"\n')
    (bin_dir / "singularity").chmod(0o755)
    env = pbs_env(job_env, tmp_path, ["localhost"] * 4 + ["127.0.0.1"] * 4)
    env.update(PATH=f"{bin_dir}:{env['PATH']}", IMAGE="/images/bertbench.sif", SINGULARITY_LOG=str(tmp_path / "sif"),
               PBS_REMOTE_SHELL=os.path.join(HERE, "fixtures", "local_rsh"), LOCAL_RSH_LOG=str(tmp_path / "rsh"))
    done = run_job(os.path.join(TEMPLATES, "pbs", "optimized_2x4gpu.pbs"), env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    assert (tmp_path / "rsh").read_text().split() == ["127.0.0.1"]  # the first host runs its part itself
    calls = (tmp_path / "sif").read_text().splitlines()
    assert len(calls) == 2
    assert all(call.startswith("exec --nv /images/bertbench.sif scripts/run_glue.sh MRPC 8 1e-3 fp32 false 1 32 64 ")
               and call.endswith(" --modeling=recompute --lr_scaling=linear") for call in calls)
    run_dir = tmp_path / "results" / "MRPC_fp32_bs8_lr1e-3_seq32_recompute-full_gpu1_nodes2"
    train = read_json(run_dir / "train_results.json")
    assert (train["world_size"], train["nodes"], train["modeling"], train["lr_scaling"]) == (2, 2, "recompute",
                                                                                             "linear")
    assert train["learning_rate"] == pytest.approx(2e-3) and train["global_step"] == 8  # 128 / (8 x 2)
    assert sorted(name for name in os.listdir(run_dir) if name.endswith(".log")) == \
        ["command.log", "train.node0.log", "train.node1.log"]
    logs = "".join((run_dir / name).read_text() for name in ("train.node0.log", "train.node1.log"))
    assert logs.count("***** Eval results") == 1  # one set of results, from rank 0
    assert "--rdzv-backend=c10d --rdzv-endpoint=localhost:" in (run_dir / "command.log").read_text()


def test_pbs_job_without_hosts_fails_clearly(job_env, tmp_path):
    env = pbs_env(job_env, tmp_path, [])
    done = run_job(os.path.join(TEMPLATES, "pbs", "baseline_1gpu.pbs"), env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == f"every_node.sh: error: {tmp_path / 'nodefile'} lists no hosts"


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
        pytest.skip(f"Slurm cannot be started here: {', '.join(missing)} not installed (Debian's slurmctld slurmd "
                    "slurm-client munge; .ci/run installs them)")
    if os.geteuid() != 0:
        pytest.skip("Slurm cannot be started here: its daemons need root")
    root = tmp_path_factory.mktemp("slurm")
    for name in ("munge", "state", "spool", "log"):
        (root / name).mkdir()
    (root / "munge" / "munge.key").write_bytes(os.urandom(1024))
    (root / "munge" / "munge.key").chmod(0o600)
    socket_path = root / "munge" / "munge.socket"
    subprocess.run([find_program("munged"), "--force", f"--socket={socket_path}",
                    f"--key-file={root / 'munge' / 'munge.key'}", f"--pid-file={root / 'munge' / 'munged.pid'}",
                    f"--log-file={root / 'munge' / 'munged.log'}", f"--seed-file={root / 'munge' / 'seed'}"],
                   check=True, capture_output=True)
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
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'slurmctld.pid'}
SlurmdPidFile={root / 'slurmd.pid'}
SlurmctldLogFile={root / 'log' / 'slurmctld.log'}
SlurmdLogFile={root / 'log' / 'slurmd.log'}
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
        wait_for(lambda: subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True,
                                        text=True).stdout.strip() == "idle", 60, "the Slurm node never became idle")
        yield env
    finally:
        subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True)
        pid_file = root / "munge" / "munged.pid"
        if pid_file.exists():
            subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True)


@pytest.mark.slow
def test_slurm_job_srun_torchrun_two_tasks(slurm_cluster, job_env, tmp_path):
    env = {**job_env, "SLURM_CONF": slurm_cluster["SLURM_CONF"]}
    # The template asks for 2 nodes x 4 GPUs; this cluster is one CPU node: 2 tasks there, a process each.
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1",
         f"--output={tmp_path / 'slurm-%j.out'}", "--export=ALL",
         os.path.join(TEMPLATES, "slurm", "run_glue.sbatch")],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", job_id], env=env, capture_output=True,
                                        text=True).stdout.strip(), 300, f"Slurm job {job_id} did not finish")
    output = (tmp_path / f"slurm-{job_id}.out").read_text()
    state = subprocess.run(["scontrol", "show", "job", job_id], env=env, capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, output[-3000:]
    run_dir = tmp_path / "results" / "MRPC_fp32_bs8_lr1e-3_seq32_baseline_slurm2x1"
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
    container, = replicas["Worker"]["template"]["spec"]["containers"]
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
    operator = {"PET_NNODES": str(len(pods)), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": job_env["MASTER_PORT"],
                "WORLD_SIZE": str(len(pods)), "PYTHONUNBUFFERED": "1"}
    processes = []
    for rank, container in enumerate(pods):
        env = {item["name"]: item["value"] for item in container["env"]}
        env.update(CPU_SETTINGS, BERT_DIR=BERT_DIR, GLUE_DIR=job_env["GLUE_DIR"], RESULTS_DIR=job_env["RESULTS_DIR"],
                   NPROC_PER_NODE="1")
        env.update(operator, PET_NODE_RANK=str(rank), RANK=str(rank))
        command = [expand(word, env) for word in container["command"] + container["args"]]
        processes.append(subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env, "PYTHON": sys.executable},
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], "\n".join(outputs)[-4000:]
    run_dir = tmp_path / "results" / "MRPC_fp32_bs8_lr1e-3_seq32_recompute-full_gpu1_nodes2"
    train = read_json(run_dir / "train_results.json")
    assert (train["world_size"], train["nodes"], train["modeling"], train["lr_scaling"]) == (2, 2, "recompute",
                                                                                             "linear")
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


@pytest.mark.parametrize("script", sorted(
    os.path.relpath(os.path.join(directory, name), ROOT)
    for top in ("scripts", "job_templates") for directory, _, names in os.walk(os.path.join(ROOT, top))
    for name in names if name.endswith((".sh", ".pbs", ".sbatch"))))
def test_shell_scripts_parse(script):
    done = subprocess.run(["bash", "-n", os.path.join(ROOT, script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
