"""The layers point one way: the core never imports the benches or the demo, the model code knows nothing of
training, and the data-creation tool and an eager training run load only what they use. The imports are read from
the source (every import statement, at any depth), so a lazy import inside a function counts too."""

import ast
import pathlib
import subprocess
import sys

import pytest
from helpers import runner_command, write_bert_dir

from bertbench.tasks.synthetic import write_glue_task

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "bertbench"


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every bertbench module `path` imports (`from bertbench import x` counts as bertbench.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "bertbench" or name.startswith("bertbench.")}


MODULES = {module_name(path): imported_modules(path) for path in sorted(PACKAGE.rglob("*.py"))}


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_the_modules_were_found():
    assert {
        "bertbench.training.loop",
        "bertbench.training.step",
        "bertbench.bench.throughput",
        "bertbench.demo.run",
        "bertbench.tasks.glue",
    } <= set(MODULES)


# The packages from the bottom up: a module imports its own package and the packages below it, never one above.
# bench/ and demo/ share the top; the package's own top-level modules (the CLI, the original's module names, the tools
# export and example-data) sit above everything but them.
LAYERS = [("common",), ("model",), ("training",), ("tasks",), ("weights",), ("runners",), ("(top)",), ("bench", "demo")]
LEVEL = {package: level for level, packages in enumerate(LAYERS) for package in packages}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (PACKAGE / parts[1]).is_dir() else "(top)"


def test_every_package_has_its_layer():
    packages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    assert packages | {"(top)"} == set(LEVEL), "a new package needs its place in LAYERS"


def test_packages_import_only_their_own_layer_and_those_below():
    upward = {}
    for module, imports in MODULES.items():
        level = LEVEL[package_of(module)]
        # a module, or a name from one (the package's own __init__ holds only its version)
        modules = {
            name for name in imports if name in MODULES or name.rpartition(".")[0] in set(MODULES) - {"bertbench"}
        }
        above = sorted(
            name
            for name in modules
            if name != "bertbench" and LEVEL[package_of(name)] > level and package_of(name) != package_of(module)
        )
        if above:
            upward[module] = above
    assert upward == {}


def test_no_two_modules_import_each_other():
    """Within a package too the arrow points one way (model/packing.py once imported model/attention.py's PathRule,
    which imports its Packing): what both need lives in one of them."""
    mutual = sorted(
        (module, name)
        for module, imports in MODULES.items()
        for name in imports
        if module < name and module in MODULES.get(name, ())
    )
    assert mutual == []


@pytest.mark.parametrize("leaf", ["bertbench.bench", "bertbench.demo"])
def test_the_core_never_imports_the_benches_or_the_demo(leaf):
    offenders = {
        module: sorted(name for name in imports if under(name, leaf))
        for module, imports in MODULES.items()
        if not (under(module, "bertbench.bench") or under(module, "bertbench.demo"))
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_the_benches_and_the_demo_do_not_lean_on_each_other():
    crossing = {
        module: sorted(
            name
            for name in imports
            if under(name, "bertbench.demo" if under(module, "bertbench.bench") else "bertbench.bench")
        )
        for module, imports in MODULES.items()
        if under(module, "bertbench.bench") or under(module, "bertbench.demo")
    }
    assert {module: names for module, names in crossing.items() if names} == {}


@pytest.mark.parametrize(
    "model_module",
    ["bertbench.model.modeling", "bertbench.model.recompute", "bertbench.model.config", "bertbench.model.factory"],
)
def test_model_code_has_no_training_code(model_module):
    training = (
        "bertbench.training.loop",
        "bertbench.training.step",
        "bertbench.training.state",
        "bertbench.training.stats",
        "bertbench.training.optim",
        "bertbench.runners",
        "bertbench.training.checkpoint",
        "bertbench.model.saved_activations",
    )
    assert sorted(name for name in MODULES[model_module] if name.startswith(training)) == []


def test_the_training_step_and_state_do_not_import_the_loop_or_the_runners():
    for module in (
        "bertbench.training.step",
        "bertbench.training.state",
        "bertbench.training.stats",
        "bertbench.training.batches",
        "bertbench.training.config",
    ):
        assert not {
            name
            for name in MODULES[module]
            if name.startswith(("bertbench.training.loop", "bertbench.runners", "bertbench.run_"))
        }, module


def test_data_creation_loads_no_training_code():
    # Its worker processes import this module: the loop, the runners and the weights code have no place there.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, bertbench.tasks.create_pretraining_data; "
            "print(' '.join(m for m in sys.modules if m.startswith(('bertbench', 'torch'))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "bertbench.tasks.create_pretraining_data" in loaded and "torch" not in loaded  # ~1 s and 200 MiB a worker
    assert (
        sorted(
            name
            for name in loaded
            if name.startswith(
                (
                    "bertbench.training.loop",
                    "bertbench.runners",
                    "bertbench.run_",
                    "bertbench.weights.hf",
                    "bertbench.train_",
                    "bertbench.bench",
                    "bertbench.demo",
                    "bertbench.training.optim",
                    "bertbench.model.recompute",
                    "bertbench.model.modeling",
                )
            )
        )
        == []
    )


def test_an_eager_training_run_loads_no_compiler(tmp_path):
    """A single-process run that compiles nothing never imports torch._dynamo: 1.9 s of the 4.7 s of CPU the
    README's GLUE command took, and hundreds of modules read from a cluster's shared file system."""
    write_bert_dir(tmp_path / "bert")
    write_glue_task(tmp_path / "glue", "MRPC", train=16, dev=8, test=4)
    _, argv = runner_command("classifier", tmp_path, tmp_path / "run", "--do_eval")
    code = "import sys\nfrom bertbench.runners.classifier import main\nstatus = main(sys.argv[1:])\n"
    code += "print('compiler loaded:', 'torch._dynamo' in sys.modules)\nsys.exit(status)\n"
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "compiler loaded: False"
