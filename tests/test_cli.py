import argparse
import io
import os
import re

import pytest

from bertbench import __version__, cli
from bertbench.bench.cli import BENCHES
from bertbench.common.flags import spelling
from bertbench.training import progress

COMMANDS, KINDS = ", ".join(cli.COMMANDS), ", ".join(BENCHES)


def test_usage_lists_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


@pytest.mark.parametrize(
    "argv, help_command",
    [([], "bertbench --help"), (["--quiet"], "bertbench --help"), (["bench"], "bertbench bench --help")],
)
def test_no_command_is_a_usage_error_pointing_at_help(argv, help_command, error_line):
    assert cli.main(argv) == 2
    assert f"`{help_command}`" in error_line()


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["clasify"],
            f"bertbench: error: unknown command 'clasify' (did you mean 'classify'?); choose one of {COMMANDS}",
        ),
        (["train-everything"], f"bertbench: error: unknown command 'train-everything'; choose one of {COMMANDS}"),
        (
            ["bench", "throughputt"],
            f"bertbench bench: error: unknown bench 'throughputt' (did you mean 'throughput'?); choose one of {KINDS}",
        ),
        (
            ["--quite", "demo"],
            "bertbench: error: unknown option '--quite' (did you mean '--quiet'?); `bertbench --help` lists them",
        ),
        (["-x", "demo"], "bertbench: error: unknown option '-x'; `bertbench --help` lists them"),
    ],
)
def test_an_unknown_command_is_one_line_with_the_closest_name(argv, line, error_line):
    assert cli.main(argv) == 2
    assert error_line() == line


@pytest.mark.parametrize("command", [["create_pretraining_data"], ["example_data"], ["bench", "squad_data"]])
def test_a_command_name_takes_underscores_for_its_hyphens(command, capsys, monkeypatch):
    out, _ = run_help(command, capsys, monkeypatch)
    assert out.startswith(f"usage: bertbench {' '.join(command).replace('_', '-')} ")


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


# A flag of each command's own that its --help must show (the command's parser, not a generic one, answered).
OWN_FLAG = {
    "demo": "--pretraining_steps",
    "classify": "--num_accumulation_steps",
    "squad": "--doc_stride",
    "pretrain": "--max_predictions_per_seq",
    "create-pretraining-data": "--dupe_factor",
    "evaluate-squad": "--na-prob-file",
    "launch": "--nproc-per-node",
    "bench": "pretraining-data",
    "report": "--overwrite",
    "convert": "--tf_checkpoint",
    "export": "--bert_config_file",
    "example-data": "--seed",
}


def test_every_command_is_covered():
    assert set(OWN_FLAG) == set(cli.COMMANDS)


@pytest.mark.parametrize("name", sorted(OWN_FLAG))
def test_every_command_has_help(name, capsys, monkeypatch):
    out, _ = run_help([name], capsys, monkeypatch)
    assert OWN_FLAG[name] in out
    if name == "launch":  # torchrun's parser would name itself after sys.argv[0]
        assert out.startswith("usage: bertbench launch ")


def options_help(out: str) -> dict[str, str]:
    """--help's options section: each option's text (its names, metavar and help), by its first name."""
    entries, current = {}, None
    for line in out.splitlines():
        if re.match(r"  -", line):
            current = line.split()[0].rstrip(",")
            entries[current] = line
        elif current and line.startswith("   "):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


EVERY_HELP = [[name] for name in cli.COMMANDS if name != "bench"] + [["bench", kind] for kind in BENCHES]


def run_help(command: list[str], capsys, monkeypatch) -> tuple[str, list[argparse.ArgumentParser]]:
    """`bertbench COMMAND --help`: what it printed, and the parsers that printed it."""
    parsers = []
    print_help = argparse.ArgumentParser.print_help
    monkeypatch.setattr(
        argparse.ArgumentParser, "print_help", lambda parser, *args: (parsers.append(parser), print_help(parser, *args))
    )
    try:  # in-process: a command returns its status, argparse exits with it
        status = cli.main([*command, "--help"])
    except SystemExit as stop:
        status = stop.code
    assert status in (0, None)
    return capsys.readouterr().out, parsers


@pytest.mark.parametrize("command", EVERY_HELP, ids=" ".join)
def test_help_names_the_command_and_shows_each_default_once(command, capsys, monkeypatch):
    out, parsers = run_help(command, capsys, monkeypatch)
    assert out.startswith(f"usage: bertbench {' '.join(command)} ")
    if command == ["launch"]:  # torchrun's own parser and help text
        return
    entries = options_help(out)
    for entry in entries.values():
        assert entry.count("(default:") <= 1, entry
    (parser,) = parsers
    for action in parser._actions:
        default = getattr(parser, "defaults", {}).get(action.dest, action.default)  # FlagParser keeps its own
        if (
            action.option_strings
            and action.nargs != 0
            and action.help != argparse.SUPPRESS
            and default not in (None, argparse.SUPPRESS)
        ):
            assert entries[action.option_strings[0]].count("(default:") == 1, (action.option_strings, default)
    assert not parser.description or parser.description.rstrip().endswith((".", ")")), parser.description


# Every command but launch, whose parser is torchrun's own (its flags have both spellings already, and what follows the
# script is the script's).
PARSED = [command for command in EVERY_HELP if command != ["launch"]]


@pytest.mark.parametrize("command", PARSED, ids=" ".join)
def test_every_flag_takes_both_spellings_and_help_shows_one(command, capsys, monkeypatch):
    _, (parser,) = run_help(command, capsys, monkeypatch)
    swap = str.maketrans("_-", "-_")
    for action in parser._actions:
        options = [option for option in action.option_strings if option.startswith("--")]
        assert len({spelling(option) for option in options}) == len(options), f"two spellings of one flag: {options}"
        for option in options:
            other = f"--{option[2:].translate(swap)}"
            assert parser.respelled([f"{other}=x", other]) == [f"{option}=x", option]
            if isinstance(action, argparse._StoreFalseAction) and option.startswith("--no"):  # absl's --noflag
                for negation in (f"--no_{option[4:]}", f"--no-{option[4:].replace('_', '-')}"):
                    assert parser.respelled([negation]) == [option]


@pytest.mark.parametrize("command", PARSED, ids=" ".join)
def test_a_misspelt_flag_of_every_command_gets_the_closest_in_its_one_line(command, tmp_path, monkeypatch, error_line):
    flag = "--overwrite" if command[0] == "bench" else OWN_FLAG[command[0]]
    monkeypatch.chdir(tmp_path)
    assert cli.main([*command, f"{flag[:-1]}=1"]) == 2  # its last letter left out
    line = error_line()
    assert line.startswith(
        f"bertbench {' '.join(command)}: error: unrecognized arguments: {flag[:-1]}=1 (did you mean {flag}?)"
    )
    assert os.listdir(tmp_path) == []


def test_quiet_keeps_warnings_only_also_in_the_processes_it_starts(capsys):
    with progress.verbosity("quiet"):
        assert os.environ[progress.VERBOSITY_VARIABLE] == "quiet"  # what torchrun's workers read at import
        progress.log("step 4/12  loss 0.6931")
        progress.log("warning: metrics.jsonl: line(s) 2 are not JSON in UTF-8; dropped from the log")
        assert not progress.ProgressDisplay(12, stream=Terminal()).enabled
    progress.log("step 8/12  loss 0.5")
    assert capsys.readouterr().out.splitlines() == [
        "warning: metrics.jsonl: line(s) 2 are not JSON in UTF-8; dropped from the log",
        "step 8/12  loss 0.5",
    ]
    assert progress.ProgressDisplay(12, stream=Terminal()).enabled


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_verbose_shows_the_traceback_above_the_one_line_error(tmp_path, capsys):
    missing = str(tmp_path / "dev.json")
    assert cli.main(["--verbose", "evaluate-squad", missing, missing]) == 2
    error = capsys.readouterr().err.splitlines()
    assert error[0] == "Traceback (most recent call last):" and error[-1].startswith("bertbench evaluate-squad: error:")
    assert cli.main(["evaluate-squad", missing, missing]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
