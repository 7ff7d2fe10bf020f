"""`bertbench launch --cpu-processes`: a CPU node split into processes, each pinned to its cores with as many OpenMP
threads. The split of given topologies (lscpu's listing of made-up nodes), the flag's refusals (one line, exit 2,
nothing started), and one real 2-process launch on this machine."""

import json
import os
import subprocess
import sys

import pytest

from bertbench.common import cpus
from bertbench.common.errors import UsageError
from bertbench.runners import launch

HERE = os.path.dirname(os.path.abspath(__file__))


def lscpu(rows) -> str:
    """`lscpu --parse=CPU,Core,Socket,Node` of (cpu, core, socket, node) rows; node None: lscpu names none."""
    lines = ["# The following is the parsable format, which can be fed to other", "# CPU,Core,Socket,Node"]
    return "\n".join(
        lines + [f"{cpu},{core},{socket},{'' if node is None else node}" for cpu, core, socket, node in rows]
    )


def xeon(sockets=2, cores=28, nodes_per_socket=1, smt=True):
    """An Intel numbering: CPUs 0..N-1 are the cores (socket by socket), N..2N-1 their SMT siblings."""
    total, per_node = sockets * cores, cores // nodes_per_socket
    rows = [(core, core, core // cores, core // per_node) for core in range(total)]
    return lscpu(
        rows + [(total + core, core, core // cores, core // per_node) for core in range(total)] if smt else rows
    )


THIS_MACHINE = lscpu([(0, 0, 0, 0), (1, 1, 0, 0)])  # 1 socket, 1 NUMA node, 2 cores
ADJACENT_SIBLINGS = lscpu([(cpu, cpu // 2, 0, 0) for cpu in range(8)])  # AMD's numbering: CPUs 2k, 2k+1 share core k


def split(listing, value, allowed=None):
    return cpus.split(cpus.parse_lscpu(listing, allowed), value)


def cpu_lists(node_split):
    return [cpus.format_cpus(node_split.cpus(rank)) for rank in range(len(node_split.processes))]


def test_cpu_lists_are_written_and_read_as_linux_does():
    assert cpus.format_cpus([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert cpus.parse_cpus("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]


def test_a_two_socket_xeon_splits_by_socket_numa_node_core_or_count():
    topology = cpus.parse_lscpu(xeon())
    assert (len(topology.sockets), len(topology.nodes), len(topology.cores), len(topology.cpus)) == (2, 2, 56, 112)
    by_socket = cpus.split(topology, "socket")
    # one CPU of each physical core, never its SMT sibling (56-111), and a thread per core
    assert cpu_lists(by_socket) == ["0-27", "28-55"]
    assert by_socket.environment() == {cpus.CPUS_VARIABLE: "0-27;28-55", "OMP_NUM_THREADS": "28"}
    assert by_socket.describe() == (
        "this node (2 sockets, 2 NUMA nodes, 56 cores, 112 CPUs) split by --cpu-processes=socket into 2 processes "
        "of 28 cores, one CPU of each (its SMT siblings idle), 28 OpenMP threads each: local rank 0 on CPUs 0-27 "
        "(socket 0, NUMA node 0); local rank 1 on CPUs 28-55 (socket 1, NUMA node 1)"
    )
    assert cpu_lists(cpus.split(topology, "numa")) == ["0-27", "28-55"]
    assert cpu_lists(cpus.split(topology, "core")) == [str(core) for core in range(56)]
    assert cpu_lists(cpus.split(topology, "4")) == ["0-13", "14-27", "28-41", "42-55"]
    assert cpu_lists(cpus.split(topology, "1")) == ["0-55"]  # one process on whole nodes: all of them


def test_sub_numa_clusters_make_a_process_per_node():
    topology = cpus.parse_lscpu(xeon(nodes_per_socket=2))
    assert cpu_lists(cpus.split(topology, "socket")) == ["0-27", "28-55"]
    assert cpu_lists(cpus.split(topology, "numa")) == ["0-13", "14-27", "28-41", "42-55"]


def test_smt_siblings_numbered_side_by_side_give_one_cpu_of_each_core():
    assert cpu_lists(split(ADJACENT_SIBLINGS, "core")) == ["0", "2", "4", "6"]
    assert cpu_lists(split(ADJACENT_SIBLINGS, "2")) == ["0,2", "4,6"]
    assert split(ADJACENT_SIBLINGS, "2").environment()["OMP_NUM_THREADS"] == "2"


def test_this_machines_shape_two_single_core_processes():
    assert cpu_lists(split(THIS_MACHINE, "core")) == ["0", "1"]
    assert cpu_lists(split(THIS_MACHINE, "2")) == ["0", "1"]
    assert cpu_lists(split(THIS_MACHINE, "socket")) == ["0-1"]
    assert "one CPU of each" not in split(THIS_MACHINE, "core").describe()  # no SMT to leave idle


def test_only_the_cpus_the_launcher_may_run_on_count():
    # a job given cores 0-13 and 28-41 of the Xeon (and their siblings) by its batch system
    allowed = [*range(14), *range(28, 42), *range(56, 70)]
    assert cpu_lists(split(xeon(), "socket", allowed)) == ["0-13", "28-41"]
    with pytest.raises(
        UsageError, match=r"^--cpu-processes=socket: the sockets have unequal numbers .* \(20 on socket 0, 8"
    ):
        split(xeon(), "socket", [*range(20), *range(28, 36)])


@pytest.mark.parametrize(
    "listing, value, message",
    [
        (
            THIS_MACHINE,
            "3",
            "--cpu-processes=3: more processes than the 2 cores the launcher may run on \\(CPUs 0-1\\)",
        ),
        (
            xeon(),
            "3",
            "--cpu-processes=3: 3 processes cannot share the 56 cores .* counts that can: 1, 2, 4, 8, 14, 28, 56",
        ),
        (
            xeon(),
            "7",
            "--cpu-processes=7: a process of 8 cores would take part of one NUMA node and part of another "
            "\\(NUMA nodes of 28, 28 cores\\); counts that keep each process within a NUMA node or on whole ones: "
            "1, 2, 4, 8, 14, 28, 56",
        ),
        (lscpu([(cpu, cpu, cpu // 3, None) for cpu in range(6)]), "4", "--cpu-processes=4: 4 processes cannot"),
        (
            lscpu([(cpu, cpu, cpu // 2, None) for cpu in range(6)]),
            "2",
            "--cpu-processes=2: a process of 3 cores would take part of one socket and part of another",
        ),
        (xeon(), "half", "--cpu-processes=half: give socket, numa, core, or a number of processes"),
        (xeon(), "0", "--cpu-processes=0: give socket"),
        (lscpu([(0, 0, 0, None), (1, 1, 0, None)]), "numa", "--cpu-processes=numa: lscpu names no NUMA node"),
    ],
    ids=[
        "more than cores",
        "not dividing",
        "cutting nodes",
        "not dividing 6",
        "cutting sockets",
        "no split",
        "zero",
        "no NUMA nodes",
    ],
)
def test_splits_that_cannot_be_are_refused_naming_the_flag(listing, value, message):
    with pytest.raises(UsageError, match="^" + message):
        split(listing, value)


@pytest.fixture
def fake_node(monkeypatch):
    """launch.main on a made-up CPU node (this machine's shape) with torchrun stubbed: the arguments it got."""
    for name in (cpus.CPUS_VARIABLE, "OMP_NUM_THREADS", "GOMP_CPU_AFFINITY", "PET_NPROC_PER_NODE"):
        monkeypatch.delenv(name, raising=False)  # restored after the test, whatever main sets
    monkeypatch.setattr(cpus, "read_topology", lambda: cpus.parse_lscpu(THIS_MACHINE))
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 0)
    started = []
    monkeypatch.setattr(launch.torchrun, "run", started.append)
    return started


def test_launch_pins_through_runners_pin_and_says_how_it_split(fake_node, capsys):
    argv = ["--standalone", "--cpu_processes=core", "-m", "bertbench.runners.classifier", "--do_train"]
    assert launch.main(argv) == 0
    (args,) = fake_node
    assert (args.nproc_per_node, args.module, args.no_python) == ("2", True, False)
    assert args.training_script == "bertbench.runners.pin"
    assert args.training_script_args == [sys.executable, "-u", "-m", "bertbench.runners.classifier", "--do_train"]
    assert (os.environ[cpus.CPUS_VARIABLE], os.environ["OMP_NUM_THREADS"]) == ("0;1", "1")
    assert capsys.readouterr().out.startswith("bertbench launch: this node (1 socket, 1 NUMA node, 2 cores, 2 CPUs)")
    # a script without Python (--no-python) is exec'd as given
    assert launch.main(["--cpu-processes=2", "--nproc-per-node=2", "--no-python", "./train.sh", "x"]) == 0
    assert fake_node[1].training_script_args == ["./train.sh", "x"]


@pytest.mark.parametrize(
    "argv, environment, message",
    [
        (["--nproc-per-node=4"], {}, "--nproc-per-node=4 and --cpu-processes=core disagree: the split makes 2"),
        ([], {"PET_NPROC_PER_NODE": "4"}, "PET_NPROC_PER_NODE=4 and --cpu-processes=core disagree"),
        ([], {"OMP_NUM_THREADS": "2"}, "OMP_NUM_THREADS=2, and --cpu-processes=core gives each process 1 core"),
        ([], {"GOMP_CPU_AFFINITY": "0-1"}, "GOMP_CPU_AFFINITY names the same CPUs to every process"),
        (["--numa-binding=node"], {}, "--cpu-processes=core: --numa-binding binds processes near their GPUs"),
        (["--cpu-processes=4"], {}, "--cpu-processes=4: more processes than the 2 cores"),
    ],
)
def test_launch_refuses_in_one_line_before_anything_starts(fake_node, monkeypatch, capsys, argv, environment, message):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert launch.main(["--cpu-processes=core", *argv, "train.py"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"bertbench launch: error: {message}") and err.count("\n") == 1, err
    assert fake_node == [] and out == ""
    assert cpus.CPUS_VARIABLE not in os.environ


def test_launch_refuses_a_cpu_split_on_a_gpu_node(fake_node, monkeypatch, capsys):
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 8)
    assert launch.main(["--cpu-processes=socket", "train.py"]) == 2
    assert capsys.readouterr().err.startswith(
        "bertbench launch: error: --cpu-processes=socket splits a CPU-only node, and this one has 8 GPU(s): "
        "use --nproc-per-node=gpu"
    )
    assert fake_node == []


@pytest.mark.slow
def test_two_processes_each_pinned_to_its_core_with_one_thread(tmp_path):
    """A real launch on this machine: 2 processes of one core each, as the job itself sees them (gloo)."""
    cores = cpus.read_topology().cores
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    first, second = cores[0].cpus[0], cores[1].cpus[0]
    out = tmp_path / "placement.json"
    done = subprocess.run(
        # taskset: the launcher's affinity narrowed to two CPUs, so that the split is 2 x 1 core on any machine
        ["taskset", "-c", f"{first},{second}", sys.executable, "-m", "bertbench.runners.launch", "--standalone"]
        + ["--cpu-processes=2", os.path.join(HERE, "cpu_split_worker.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={name: value for name, value in os.environ.items() if name != "OMP_NUM_THREADS"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("bertbench launch: this node (")
    assert "split by --cpu-processes=2 into 2 processes of 1 core, 1 OpenMP thread each" in done.stdout
    assert f"local rank 0 on CPU {first} " in done.stdout and f"local rank 1 on CPU {second} " in done.stdout
    found = json.loads(out.read_text())
    assert [(place["rank"], place["cpus"], place["threads"]) for place in found["placement"]] == [
        (0, str(first), 1),
        (1, str(second), 1),
    ]
    assert found["omp_num_threads"] == ["1", "1"]
    assert found["line"].startswith("2 processes: rank 0 on ") and f": CPU {second}, 1 thread" in found["line"]
