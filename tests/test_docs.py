"""The README and docs/ as a user reads them: the README fits a front page, every relative link and anchor resolves,
the layouts they draw match the tree (a module without its line in docs/architecture.md fails here, named), every
flag a command's --help shows is in docs/reference/flags.md, every run-directory file name is in
docs/reference/files.md, and every command marked `<!-- runs -->` runs as printed on the example data.

A runnable block is a fenced ```bash or ```python block right after `<!-- runs -->`, or after
`<!-- runs: writes PATH ... -->`, whose PATHs must exist once the block has run. The blocks run in the order of the
README, then docs/ page by page, in one directory (the README's first block writes the example data there); a
command printed twice runs once."""

import ast
import importlib
import re
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import in_process_entry_point

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bertbench"
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_LIMIT = 15_000  # bytes: a front page, not a manual


def doc_pages() -> list[Path]:
    """docs/**/*.md but for docs/results/ (the benches' own reports, linked, not checked here)."""
    return sorted(path for path in DOCS.rglob("*.md") if (DOCS / "results") not in path.parents)


PAGES = [README] + doc_pages()
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def prose(text: str) -> str:
    """The text outside fenced blocks (links and headings inside code are not links and headings)."""
    return FENCE.sub("", text)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path.read_text()), re.M):
        slug = anchor(heading)
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def relative_links(path: Path) -> list[str]:
    targets = re.findall(r"\]\(([^)\s]+)\)", prose(path.read_text()))
    return [target for target in targets if not re.match(r"[a-z]+:", target)]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_readme_is_a_front_page():
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes, over {README_LIMIT}: move a section to docs/"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in relative_links(page):
        file_part, _, fragment = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            broken.append(f"{target}: no heading #{fragment} in {rel(linked)}")
    assert broken == [], f"{rel(page)}: broken links"


def test_the_docs_index_lists_every_page():
    index = DOCS / "README.md"
    listed = {(index.parent / target.partition("#")[0]).resolve() for target in relative_links(index)}
    missing = [rel(page) for page in doc_pages() if page != index and page not in listed]
    assert missing == [], f"docs/README.md lists no line for {missing}"


@pytest.mark.parametrize("page", [page for page in doc_pages() if page.name != "README.md"], ids=rel)
def test_every_topic_page_opens_with_its_contents(page):
    """Between the title and the first section: a list of links to the page's own sections."""
    head = prose(page.read_text()).split("\n## ", 1)[0]
    own = [target for target in re.findall(r"^- \[[^]]+\]\((#[^)]+)\)", head, re.M)]
    assert own, f"{rel(page)}: no contents list ('- [Section](#section)' lines) before its first '## ' section"
    assert {target[1:] for target in own} <= anchors(page)


def named_paths(text: str) -> set[str]:
    """Paths inside the package named in backticks: `model/attention.py`, `tasks/squad/` (relative to bertbench/)."""
    names = set()
    for quoted in re.findall(r"`([^`]+)`", text):
        names.update(re.findall(r"^(?:[a-z_]+/)*(?:[a-z_]+\.py|[a-z_]+/)$", quoted))
    return {name for name in names if not name.startswith(("bertbench/", "tests/", "docs/"))}


def package_modules() -> dict[str, Path]:
    """Every module (bar __init__.py) and sub-package under bertbench/, by its path relative to bertbench/."""
    modules = {
        str(path.relative_to(PACKAGE)): path
        for path in PACKAGE.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }
    modules.update(
        {
            f"{path.parent.relative_to(PACKAGE)}/": path
            for path in PACKAGE.rglob("__init__.py")
            if path.parent != PACKAGE
        }
    )
    return modules


def summary(path: Path) -> str:
    docstring = ast.get_docstring(ast.parse(path.read_text())) or "(no docstring)"
    return " ".join(docstring.split("\n\n")[0].split())[:100]


def test_architecture_names_every_module_and_only_modules_that_exist():
    text = (DOCS / "architecture.md").read_text()
    named = named_paths(text.split("\n## Modules", 1)[1].split("\n## ", 1)[0])
    modules = package_modules()
    gone = sorted(named - set(modules))
    assert gone == [], f"docs/architecture.md names modules that are not under bertbench/: {gone}"
    undocumented = sorted(set(modules) - named)
    assert undocumented == [], (
        "modules without their line in docs/architecture.md's Modules section (add one to "
        "the package's table):\n" + "\n".join(f"| `{name}` | {summary(modules[name])} |" for name in undocumented)
    )


def test_the_readme_layout_names_every_package_and_only_what_exists():
    block = README.read_text().split("## Package layout", 1)[1].split("```", 2)[1]
    tree = block.split("bertbench/", 1)[1]
    inside = tree.split("\nscripts/", 1)[0]
    packages = {f"{path.parent.name}/" for path in PACKAGE.glob("*/__init__.py")}
    drawn = set(re.findall(r"^  ([a-z_]+/)", inside, re.M))
    assert drawn == packages, f"README.md's layout draws {sorted(drawn)}; bertbench/ holds {sorted(packages)}"
    files = set(re.findall(r"\b([a-z_]+\.py)\b", inside))
    assert files and all((PACKAGE / name).is_file() for name in files), sorted(files)
    outside = re.findall(r"^([a-z_]+/)", tree.split("\nscripts/", 1)[1].join(["\nscripts/", ""]), re.M)
    assert outside and all((ROOT / name).is_dir() for name in outside), outside


def code_references(text: str) -> tuple[set[str], set[str]]:
    """Backticked repository paths (`bertbench/model/modeling.py`, `tests/test_layers.py`) and dotted bertbench
    names (`bertbench.training.loop.Estimator`) a page names."""
    paths, dotted = set(), set()
    for quoted in re.findall(r"`([^`\n]+)`", text):
        paths.update(
            word
            for word in re.findall(r"(?<![\w/])(?:bertbench|tests|scripts|job_templates|docs)/[\w./*<>-]*", quoted)
            if not word.endswith("...")
        )
        dotted.update(
            name
            for name in re.findall(r"(?<![\w./=-])bertbench(?:\.[a-z_]\w*)+(?:\.[A-Za-z_]\w*)*", quoted)
            if not name.endswith((".sif", ".def"))
        )  # the container image and its recipe
    return paths, dotted


def resolves(dotted: str) -> bool:
    """Whether a dotted name is a module, or an attribute chain of the longest module it starts with."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError:
            continue
        for name in parts[end:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_the_code_a_page_names_exists(page):
    paths, dotted = code_references(page.read_text())
    missing = sorted(path for path in paths if "*" not in path and "<" not in path and not (ROOT / path).exists())
    assert missing == [], f"{rel(page)} names paths that do not exist"
    unresolved = sorted(name for name in dotted if not resolves(name))
    assert unresolved == [], f"{rel(page)} names modules or attributes that do not exist"


def help_flags(command: str, capsys, monkeypatch) -> set[str]:
    """The long options `bertbench COMMAND --help` lists, aliases included."""
    from bertbench import cli

    monkeypatch.setenv("COLUMNS", "250")
    assert cli.main([command, "--help"]) == 0
    flags = set()
    for line in capsys.readouterr().out.split("\noptions:", 1)[1].splitlines():
        if line.lstrip().startswith("-"):
            invocation = re.split(r"\s{2,}", line.strip())[0]
            flags.update(part.split()[0] for part in invocation.split(", ") if part.startswith("--"))
    return flags - {"--help"}


@pytest.mark.parametrize(
    "command",
    [
        "classify",
        "squad",
        "pretrain",
        "create-pretraining-data",
        "convert",
        "export",
        "evaluate-squad",
        "example-data",
        "demo",
    ],
)
def test_flags_reference_lists_every_flag(command, capsys, monkeypatch):
    flags = help_flags(command, capsys, monkeypatch)
    assert len(flags) > 1
    documented = set(re.findall(r"--[\w-]+", (DOCS / "reference" / "flags.md").read_text()))
    assert sorted(flags - documented) == [], f"`bertbench {command} --help` flags missing from docs/reference/flags.md"


def test_files_reference_names_every_run_directory_file():
    from bertbench.common import run_files

    names = {
        value for key, value in vars(run_files).items() if key.isupper() and isinstance(value, str) and "*" not in value
    }
    text = (DOCS / "reference" / "files.md").read_text()
    assert names and sorted(name for name in names if name not in text) == []


def test_the_readme_shows_one_command_per_runner_and_per_bench():
    from bertbench import cli
    from bertbench.bench import cli as bench_cli

    shown = "\n".join(block for block in re.findall(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M))
    # a runner shown under the original's module name counts: python -m bertbench.run_classifier is bertbench classify
    modules = {
        "classify": "run_classifier",
        "squad": "run_squad",
        "pretrain": "run_pretraining",
        "create-pretraining-data": "create_pretraining_data",
    }
    missing = [
        name
        for name in cli.COMMANDS
        if name not in ("bench", "demo")
        and not re.search(rf"^(bertbench {name}|python -m bertbench\.{modules.get(name, '-')}) ", shown, re.M)
    ]
    missing += [kind for kind in bench_cli.BENCHES if not re.search(rf"^bertbench bench {kind} ", shown, re.M)]
    assert missing == [], "README.md shows no command for these runners and benches"


RUNNABLE = re.compile(r"<!-- runs(?::\s*writes\s+([^>]*?))?\s*-->\s*\n```(bash|python)\n(.*?)^```", re.S | re.M)


def runnable_blocks() -> list[tuple[str, str, str, list[str]]]:
    """(where, language, code, paths it writes) of every marked block: the README's, then docs/'s."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        for match in RUNNABLE.finditer(text):
            where = f"{rel(page)}:{text.count(chr(10), 0, match.start()) + 1}"
            blocks.append((where, match[2], match[3], (match[1] or "").split()))
    return blocks


def commands(code: str) -> list[str]:
    """A bash block's commands, one a line: continuation lines joined, comment lines and blank lines dropped."""
    return [line for line in code.replace("\\\n", "").splitlines() if line.strip() and not line.startswith("#")]


def test_the_first_marked_block_writes_the_example_data_and_none_is_empty():
    blocks = runnable_blocks()
    assert blocks[0][2].strip() == "bertbench example-data example", "the README's first runnable block writes the data"
    assert all(language == "python" or commands(code) for _, language, code, _ in blocks)


@pytest.mark.slow
def test_every_marked_command_runs_as_printed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # bench throughput measures the CPU's peak on matrices of 512 x 512 instead of 2048, as test_bench_throughput's
    # sweep does: 1.4 CPU-seconds less for each of its two commands; the MFU it divides is not what is tested here
    from bertbench.bench import throughput

    measure_peak = throughput.measure.matmul_flops_per_second
    monkeypatch.setattr(throughput.measure, "matmul_flops_per_second", lambda size, *args: measure_peak(512, *args))
    threads = torch.get_num_threads()
    done = set()
    for where, language, code, writes in runnable_blocks():
        if language == "python":
            exec(compile(code, where, "exec"), {"__name__": "__docs__"})
        for command in commands(code) if language == "bash" else []:
            if command in done:
                continue
            done.add(command)
            entry = in_process_entry_point(command)
            if entry:
                status = entry[0](entry[1])
                output = capsys.readouterr()
                output = output.out + output.err
            else:
                run = subprocess.run(
                    ["bash", "-c", f"set -euo pipefail\n{command}\n"], capture_output=True, text=True, timeout=300
                )
                status, output = run.returncode, run.stdout + run.stderr
            torch.set_num_threads(threads)  # a bench's --threads stays with its command
            assert status == 0, f"{where}: exit {status}: {command}\n{output[-3000:]}"
        missing = [path for path in writes if not (tmp_path / path).exists()]
        assert missing == [], f"{where}: the block did not write {missing}"
