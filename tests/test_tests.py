"""Rules the test files keep, read from their syntax trees: shared helpers come from tests/helpers.py, never from
another test module or conftest.py, and tests use bertbench through its public names only (a test that reaches for
`_private` names breaks on a rename that changes no behaviour)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import bertbench

TESTS = Path(__file__).parent
# The modules of tests/ that are neither tests nor conftest.py: test files may import these.
SHARED_MODULES = {"helpers", "ddp_worker", "fault_campaign", "optimizer_references"}


def python_files() -> list[Path]:
    return sorted(path for path in TESTS.glob("*.py") if path.name != "__init__.py")


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def bertbench_module_names(tree: ast.Module) -> set[str]:
    """The local names a file binds to bertbench modules or packages (`import bertbench.x as y`, `from bertbench.x
    import module`): their attributes are bertbench's names."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "bertbench":
                    names.add(alias.asname or "bertbench")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "bertbench":
            for alias in node.names:
                if alias.name[:1].islower():  # a module or a function; classes and constants have no attributes here
                    names.add(alias.asname or alias.name)
    return names


def root_name(node: ast.expr) -> str | None:
    """The name a chain of attributes starts from (`bertbench` of `bertbench.model.modeling`), None for any other
    expression (an object's own attributes are not a module's names)."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []

    def where(node: ast.AST) -> str:
        return f"{path.name}:{node.lineno}"

    modules = bertbench_module_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            imported = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for module in imported:
                top = module.split(".")[0]
                if top == "conftest" or top.startswith("test_"):
                    found.append(f"{where(node)} imports {module}: shared helpers belong in tests/helpers.py")
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bertbench":
                for alias in node.names:
                    if is_private(alias.name):
                        found.append(f"{where(node)} imports the private name {node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute) and is_private(node.attr) and root_name(node.value) in modules:
            found.append(f"{where(node)} uses the private name {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in modules
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
        ):
            found.append(f"{where(node)} replaces the private name {node.args[0].id}.{node.args[1].value}")
    return sorted(found, key=lambda line: int(line.split(" ", 1)[0].rsplit(":", 1)[1]))  # in line order


def test_no_test_imports_another_test_module_or_a_private_name():
    found = [line for path in python_files() for line in violations(path)]
    assert not found, "\n".join(found)


def test_the_rules_catch_what_they_name(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "from conftest import tiny_config\nimport test_other\nfrom bertbench.model import modeling\n"
        "from bertbench.weights.tf_checkpoint import _varint\nmodeling._packing_on_device\n"
        "import bertbench.model.packing\nbertbench.model.packing._rows\n"
        "def test(monkeypatch):\n    monkeypatch.setattr(modeling, '_hidden', None)\n"
    )
    assert [line.split(" ", 2)[:2] for line in violations(sample)] == [
        ["test_sample.py:1", "imports"],
        ["test_sample.py:2", "imports"],
        ["test_sample.py:4", "imports"],
        ["test_sample.py:5", "uses"],
        ["test_sample.py:7", "uses"],
        ["test_sample.py:9", "replaces"],
    ]


@pytest.fixture(scope="module")
def shared_by_the_module():
    return object()


def test_tests_sharing_a_module_fixture_keep_their_group(shared_by_the_module, request):
    """conftest.py puts the tests that share a module fixture in one xdist_group, and `--dist loadgroup` runs a group
    on one worker, read from the "@group" pytest-xdist adds to each test's node id. pytest 9.2 loses that suffix
    (pytest-xdist#1386), silently: every module fixture then runs once per worker that takes one of its tests, and
    the suite took 310-397 s instead of 233 s (so pyproject.toml's test extra keeps pytest below 9.2)."""
    # A worker's `loadgroup` option says its controller distributes by group (its own --dist reads "no").
    if "PYTEST_XDIST_WORKER" not in os.environ or not getattr(request.config.option, "loadgroup", False):
        pytest.skip("the README's command runs the tests on pytest-xdist's workers, with --dist loadgroup")
    assert request.node.nodeid.endswith("@test_tests"), request.node.nodeid


def test_the_tests_and_the_processes_they_start_import_this_checkout(tmp_path):
    """A test that starts a process (a runner, a torchrun job, a script) tests the bertbench of this checkout, not
    one that `pip install -e` of another checkout put on the path (conftest.py puts this one first), even from a
    directory of its own, where Python does not look in the checkout."""
    checkout = TESTS.parent / "bertbench"
    assert Path(bertbench.__file__).resolve().parent == checkout.resolve()
    started = subprocess.run(
        [sys.executable, "-c", "import bertbench; print(bertbench.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(started.stdout.strip()).resolve().parent == checkout.resolve()
