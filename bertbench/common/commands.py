"""The one sub-command dispatcher: `bertbench COMMAND` (bertbench.cli) and `bertbench bench KIND`
(bertbench.bench.cli) each keep a table of name -> (module with `main(argv)`, one-line help) and hand it here."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager

from bertbench.common.errors import INPUT_ERROR, run_command
from bertbench.common.flags import closest

# A command table: name -> (module with main(argv), one-line help); a module is imported only when its command runs.
CommandTable = Mapping[str, tuple[str, str]]


def command_lines(commands: CommandTable, width: int) -> list[str]:
    """The usage text's lines listing `commands`, their names padded to `width` columns."""
    return [f"  {name:<{width}} {help_text}" for name, (_, help_text) in commands.items()]


def dispatch(
    program: str,
    argv: Sequence[str],
    commands: CommandTable,
    usage: str,
    noun: str = "command",
    around: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    options: Collection[str] = (),
) -> int:
    """Run the command argv[0] names with the rest of argv, as `program`: -h/--help prints `usage`; no command or an
    unknown one is one line on stderr and INPUT_ERROR, a misspelt one with the closest name (`options`: those
    `program` reads before the command, for a misspelt option). A name takes `_` for `-` (create_pretraining_data is
    create-pretraining-data), as flags do. The command's module is imported only now, under run_command (so that a
    signal while torch is imported is one line too), and its main runs inside `around()`; a main that takes `prog`
    is told f"{program} NAME", to name itself as typed in its usage line and errors."""
    if argv and argv[0] in ("-h", "--help"):
        return run_command(program, lambda: print(usage))
    if not argv:
        print(f"{program}: error: no {noun} given; `{program} --help` lists them", file=sys.stderr)
        return INPUT_ERROR
    name, rest = argv[0].replace("_", "-"), list(argv[1:])
    if name not in commands:
        if name.startswith("-"):  # a misspelt option of the program's own
            unknown, names, listed = "option", [*options, "-h", "--help"], f"`{program} --help` lists them"
        else:
            unknown, names, listed = noun, list(commands), f"choose one of {', '.join(commands)}"
        meant = closest(name, names)
        hint = f" (did you mean {meant!r}?)" if meant else ""
        print(f"{program}: error: unknown {unknown} {argv[0]!r}{hint}; {listed}", file=sys.stderr)
        return INPUT_ERROR

    def body() -> int:
        main = importlib.import_module(commands[name][0]).main
        named = {"prog": f"{program} {name}"} if "prog" in inspect.signature(main).parameters else {}
        with around():
            return main(rest, **named)

    return run_command(program, body)
