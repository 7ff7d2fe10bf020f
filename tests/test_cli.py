import subprocess
import sys

from bertbench import __version__, cli


def test_usage_lists_commands(capsys):
    assert cli.main([]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


def test_unknown_command_is_a_one_line_error(capsys):
    assert cli.main(["train-everything"]) == 2
    assert "unknown command 'train-everything'" in capsys.readouterr().err


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_every_command_has_help():
    for name in cli.COMMANDS:
        done = subprocess.run([sys.executable, "-m", "bertbench", name, "--help"], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "usage:" in done.stdout
