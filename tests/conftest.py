"""pytest's hooks and the fixtures tests share; the helpers they share are in helpers.py."""

import gc
import os
import sys
from pathlib import Path

import pytest

# The tests' models are tiny and the machine they run on may have 2 cores, shared with the processes a test starts:
# a second intra-op thread then costs far more than it gives (OpenMP threads spin waiting for each other; a run of
# test_run_squad took 4x the CPU time with 2). One thread in every process that imports torch after this (the
# test modules', pytest-xdist's workers, the processes a test starts), unless OMP_NUM_THREADS says otherwise (a
# bench's --threads still sets its own).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# The tests, and every process they start (runners, torchrun jobs and their workers, the scripts), import the bertbench
# of this checkout, wherever pytest was started from and whatever a `pip install -e` elsewhere put on the path: a
# worker started from a test's directory would otherwise import the installed one (another checkout's code, tested
# silently, or none: "No module named 'bertbench'").
REPOSITORY = str(Path(__file__).resolve().parent.parent)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPOSITORY, os.environ.get("PYTHONPATH")]))
sys.path.insert(0, REPOSITORY)
# Where PYTHONDONTWRITEBYTECODE is set (containers set it, this project's machines among them), every process would
# compile what it imports from this checkout again: a worker's collection took 11.7 s of CPU instead of 6.0 (pytest
# rewrites every test module's asserts), and each of the ~110 processes the tests start compiled bertbench's 25,000
# lines (0.3 s). The tests' processes cache their bytecode as Python does by default, in the __pycache__/ directories
# .gitignore leaves out. (Not PYTHONPYCACHEPREFIX: a cache there holds no bytecode of the installed packages, and each
# process of a first run compiled torch's 2,300 modules again.)
if sys.dont_write_bytecode:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
# Nothing here imports torch or bertbench at module level: under `pytest -n` this module also loads in the process
# that only starts the workers, before it starts them (torch's import: 2-3 s of the suite's start).

# A worker holds torch, dynamo and transformers (millions of long-lived objects), and its tests make many more (traced
# graphs, models, runs): at CPython's thresholds (700, 10, 10) a full collection of all of it, 0.5 s here, ran every
# few seconds. Collections every 10,000 allocations and a full one every 400 of them took test_run_squad,
# test_compile and test_estimator from 123 s of CPU to 103 s (garbage collection from 14 s to 4), for 18 MB more.
gc.set_threshold(10_000, 20, 20)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """Collect the garbage once, then freeze what is left: pytest collects 5 times as the session closes (to report
    exceptions raised in finalizers), 0.4 s a pass over a worker's heap, and the run waits for its last worker. The
    one pass here still runs the finalizers, whose exceptions pytest then reports."""
    gc.collect()
    gc.freeze()


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`'s worker count: one more than the cores. Many tests wait on the processes they start (torchrun jobs,
    killed and restarted runs, time budgets), so a third worker on 2 cores fills the time the other two wait."""
    return len(os.sched_getaffinity(0)) + 1


@pytest.fixture
def config():
    """The tiny BertConfig (helpers.tiny_config)."""
    from helpers import tiny_config

    return tiny_config()


@pytest.fixture
def error_line(capsys):
    """Reads the single stderr line a failed command printed (and fails if it printed more or none)."""

    def read() -> str:
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    return read


def uses_a_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses a fixture of module scope (a training run several tests read, say)."""
    definitions = item._fixtureinfo.name2fixturedefs.values() if hasattr(item, "_fixtureinfo") else ()
    return any(fixture_defs[-1].scope == "module" for fixture_defs in definitions)


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups
def pytest_collection_modifyitems(config, items):
    # The tests of a module that share a module-scoped fixture run on one worker (`--dist loadgroup`) and one after
    # the other, so that the fixture runs once, not once per worker that takes one of them, nor again after another
    # module's tests have run in between (pytest then tears it down).
    slow_groups: dict[str, bool] = {}
    for item in items:
        if uses_a_module_fixture(item):
            group = item.module.__name__
            item.add_marker(pytest.mark.xdist_group(group))
            slow_groups[group] = slow_groups.get(group, False) or "slow" in item.keywords

    def slow(item: pytest.Item) -> bool:
        return slow_groups[item.module.__name__] if uses_a_module_fixture(item) else "slow" in item.keywords

    # Slow tests (and groups holding one) first: the workers of `pytest -n` then take them in turn and finish
    # together, instead of one worker meeting a 20-second test at the end. The sort is stable, so the rest keep their
    # order.
    items.sort(key=lambda item: not slow(item))
    import torch  # the test modules imported it already

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def runner_inputs(tmp_path_factory) -> Path:
    """Small valid inputs of the three runners: glue/MRPC, squad/ (v1.1), shards/ and eval/ (NVIDIA's layout) and
    bert/ (TINY_BERT, the built-in vocabulary)."""
    from helpers import write_bert_dir, write_nvidia_shard

    from bertbench.tasks.synthetic import write_glue_task, write_squad

    root = tmp_path_factory.mktemp("runner_inputs")
    write_glue_task(root / "glue", "MRPC", train=64, dev=16, test=8)
    write_squad(root / "squad", "1.1", train=8, dev=2)
    write_bert_dir(root / "bert")
    for name, count in (("shards", 64), ("eval", 16)):
        (root / name).mkdir()
        write_nvidia_shard(root / name / "part_0.hdf5", count=count, seed=count)
    return root
