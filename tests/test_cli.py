import pytest

from bertbench import __version__, cli


def test_usage_lists_commands(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


def test_unknown_command_is_a_one_line_error(error_line):
    assert cli.main(["train-everything"]) == 2
    assert error_line().startswith("bertbench: error: unknown command 'train-everything'; choose one of demo, ")


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


# A flag of each command's own that its --help must show (the command's parser, not a generic one, answered).
OWN_FLAG = {"demo": "--pretraining_steps", "classify": "--num_accumulation_steps", "squad": "--doc_stride",
            "pretrain": "--max_predictions_per_seq", "create-pretraining-data": "--dupe_factor",
            "evaluate-squad": "--na-prob-file", "launch": "--nproc-per-node", "bench": "pretraining-data",
            "report": "--overwrite", "convert": "--tf_checkpoint"}


def test_every_command_is_covered():
    assert set(OWN_FLAG) == set(cli.COMMANDS)


@pytest.mark.parametrize("name", sorted(OWN_FLAG))
def test_every_command_has_help(name, capsys):
    try:  # in-process: a command returns its status, argparse exits with it
        status = cli.main([name, "--help"])
    except SystemExit as stop:
        status = stop.code
    assert status in (0, None)
    out = capsys.readouterr().out
    assert OWN_FLAG[name] in out
    if name == "launch":  # torchrun's parser would name itself after sys.argv[0]
        assert out.startswith("usage: bertbench launch ")
