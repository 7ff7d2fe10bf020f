"""--device on every bench and runner: the index kept and made the current CUDA device, torchrun's LOCAL_RANK picking
the GPU, and a device this machine lacks refused in one line naming --device (exit status 2, nothing written), on
machines with CUDA or without, faked here by monkeypatching torch.cuda."""

import pytest
import torch
from helpers import runner_command, snapshot

from bertbench.bench import budget, finetuning, memory, profile, scaling, throughput
from bertbench.common.errors import UsageError
from bertbench.training import distributed

BENCHES = {
    "throughput": (throughput.main, ["--model", "tiny", "--seq_lengths", "32", "--batch_sizes", "2"]),
    "memory": (memory.main, ["--model", "tiny", "--seq_lengths", "32"]),
    "profile": (profile.main, ["--model", "tiny", "--batch_size", "2", "--max_seq_length", "32"]),
    "scaling": (scaling.main, ["--model", "tiny", "--processes", "1"]),
    "finetuning": (finetuning.main, ["--task=glue", "--model=tiny", "--variants=baseline", "--no_resume"]),
    "budget": (budget.main, ["--minutes=0.02", "--contenders=baseline:1"]),
}
RUNNERS = ("classifier", "squad", "pretraining")


def fake_gpus(monkeypatch, count: int) -> list[int]:
    """torch.cuda as on a machine with `count` GPUs (none: no CUDA); returns the list set_device appends to."""
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[-1] if current else 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: current.append(torch.device(device).index))
    return current


@pytest.mark.parametrize(
    "name, gpus, expected",
    [(None, 0, "cpu"), ("cpu", 2, "cpu"), (None, 2, "cuda:0"), ("cuda", 2, "cuda:0"), ("cuda:1", 2, "cuda:1")],
)
def test_a_device_comes_with_its_index_and_becomes_the_current_one(monkeypatch, name, gpus, expected):
    current = fake_gpus(monkeypatch, gpus)
    device = distributed.resolve_device(name)
    assert device == torch.device(expected)
    assert current == ([device.index] if device.type == "cuda" else [])
    assert distributed.parse_device(name) == device


def test_parse_device_sets_nothing(monkeypatch):
    current = fake_gpus(monkeypatch, 2)
    assert distributed.parse_device("cuda:1") == torch.device("cuda", 1) and current == []


def test_under_torchrun_each_process_takes_its_local_ranks_gpu(monkeypatch):
    current = fake_gpus(monkeypatch, 4)
    assert distributed.resolve_device("cuda", local_rank=3) == torch.device("cuda", 3) and current == [3]
    assert distributed.resolve_device(None, local_rank=2) == torch.device("cuda", 2)
    assert distributed.resolve_device("cpu", local_rank=7) == torch.device("cpu")


@pytest.mark.parametrize(
    "name, gpus, local_rank, message",
    [
        ("nonsense", 2, None, "--device 'nonsense' is not a device: use cpu, cuda or cuda:N"),
        ("meta", 2, None, "--device 'meta' is not a device"),
        ("cuda", 0, None, "--device 'cuda' requested but CUDA is not available"),
        ("cuda:3", 0, None, "--device 'cuda:3' requested but CUDA is not available"),
        ("cuda:2", 2, None, "--device 'cuda:2': this machine has 2 CUDA device(s), cuda:0 to cuda:1"),
        ("cuda:0", 2, 1, "--device 'cuda:0': under torchrun each process takes the GPU of its LOCAL_RANK"),
        ("cuda", 2, 2, "--device 'cuda': 3 processes on a node need a GPU each, and this machine has 2"),
        (None, 1, 1, "--device 'cuda': 2 processes on a node need a GPU each, and this machine has 1"),
    ],
)
def test_a_device_the_machine_lacks_is_a_usage_error(monkeypatch, name, gpus, local_rank, message):
    current = fake_gpus(monkeypatch, gpus)
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        distributed.resolve_device(name, local_rank)
    assert current == []


def test_a_job_of_more_processes_than_gpus_is_refused_before_it_starts(monkeypatch):
    fake_gpus(monkeypatch, 2)
    distributed.check_processes("cuda", 2)
    distributed.check_processes("cuda:1", 1)
    distributed.check_processes("cpu", 8)
    for name, processes in (("cuda", 3), (None, 3), ("cuda:1", 2), ("cuda:2", 1)):
        with pytest.raises(UsageError, match="^--device"):
            distributed.check_processes(name, processes)


def test_torchrun_workers_take_their_local_rank_and_join_nccl(monkeypatch):
    current = fake_gpus(monkeypatch, 2)
    joined = {}
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kwargs: joined.update(kwargs))
    # every rank's placement gathered once joined: here each slot gets this rank's
    monkeypatch.setattr(
        distributed.dist, "all_gather_object", lambda out, value: out.__setitem__(slice(None), [value] * len(out))
    )
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    job = distributed.init_from_environment("cuda")
    assert job.device == torch.device("cuda", 1) and current == [1]
    assert joined["backend"] == "nccl" and joined["device_id"] == torch.device("cuda", 1)
    assert [place.rank for place in job.placement] == [1, 1]


# ---- every command that takes --device ----------------------------------------------------------------------------


def command(name: str, inputs, out, device: str, *extra: str) -> tuple:
    if name in BENCHES:
        main, flags = BENCHES[name]
        return main, [*flags, *extra, "--device", device, "--output_dir", str(out)]
    return runner_command(name, inputs, out, f"--device={device}", *extra)


@pytest.mark.parametrize("name", [*BENCHES, *RUNNERS])
@pytest.mark.parametrize(
    "gpus, device, culprit",
    [
        (0, "cuda", "CUDA is not available"),
        (0, "cuda:1", "CUDA is not available"),
        (2, "cuda:3", "this machine has 2 CUDA device(s)"),
    ],
)
def test_a_device_this_machine_lacks_is_refused_in_one_line_and_nothing_is_written(
    monkeypatch, runner_inputs, tmp_path, error_line, name, gpus, device, culprit
):
    fake_gpus(monkeypatch, gpus)
    out = tmp_path / "out"
    main, argv = command(name, runner_inputs, out, device)
    assert main(argv) == 2
    line = error_line()
    assert "--device" in line and device in line and culprit in line
    assert snapshot(out) is None


@pytest.mark.parametrize(
    "name, device, extra",
    [
        ("scaling", "cuda", ["--processes", "1,2"]),
        ("scaling", "cuda:0", ["--processes", "2"]),
        ("budget", "cuda", ["--contenders=baseline:1,full:2"]),
    ],
)
def test_more_processes_than_gpus_are_refused_before_any_job_starts(
    monkeypatch, runner_inputs, tmp_path, error_line, name, device, extra
):
    fake_gpus(monkeypatch, 1)
    monkeypatch.setattr(scaling, "run_job", lambda *args: pytest.fail("a job started"))
    out = tmp_path / "out"
    main, argv = command(name, runner_inputs, out, device, *extra)
    assert main(argv) == 2
    assert "--device" in error_line()
    assert snapshot(out) is None


@pytest.mark.parametrize("name", RUNNERS)
@pytest.mark.parametrize("device, local_rank", [("cuda:0", "1"), ("cuda", "1")])
def test_a_torchrun_worker_refuses_a_gpu_it_cannot_take(
    monkeypatch, runner_inputs, tmp_path, error_line, name, device, local_rank
):
    """An index under torchrun (LOCAL_RANK picks the GPU), or a LOCAL_RANK beyond the GPUs: refused in one line
    before the process group is joined."""
    fake_gpus(monkeypatch, 1)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kwargs: pytest.fail("joined"))
    for variable, value in (("WORLD_SIZE", "2"), ("RANK", local_rank), ("LOCAL_RANK", local_rank)):
        monkeypatch.setenv(variable, value)
    out = tmp_path / "out"
    main, argv = runner_command(name, runner_inputs, out, f"--device={device}")
    assert main(argv) == 2
    assert error_line().count("--device") >= 1
    assert snapshot(out) is None
