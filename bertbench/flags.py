"""Command-line flags in Google's (absl) style on argparse: --flag=true/false, --noflag, and defaults kept apart.

Every command builds its parser here, so that a boolean is spelt alike everywhere and a run directory's record can
fill the flags a command leaves out (FlagParser records only the flags given).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from bertbench.errors import ArgumentParser


def parse_bool(text: str) -> bool:
    """absl's boolean spellings: --flag=true/false/1/0/yes/no (any case)."""
    lowered = text.strip().lower()
    if lowered in ("true", "t", "1", "yes", "y"):
        return True
    if lowered in ("false", "f", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class FlagParser(ArgumentParser):
    """argparse that only records the flags a command gives (defaults live in `defaults`, so a run directory's
    record can fill the others) and takes absl booleans: --do_train, --do_train=false, --nodo_train."""

    def __init__(self, omit: Sequence[str] = (), default_overrides: Mapping[str, Any] | None = None, **kwargs):
        super().__init__(argument_default=argparse.SUPPRESS, **kwargs)
        self.defaults: dict[str, Any] = {}
        self.omit = frozenset(omit)  # common flags a runner has no use for
        self.default_overrides = dict(default_overrides or {})  # common flags whose default differs in a runner

    def flag(self, group, name: str, default: Any, help: str, aliases: Sequence[str] = (), **kwargs) -> None:
        """--name (and --alias ...: other projects' names for the same flag)."""
        if name in self.omit:
            return
        default = self.default_overrides.get(name, default)
        self.defaults[name] = default
        shown = "" if default is None else f" (default: {default})"
        group.add_argument(f"--{name}", *(f"--{alias}" for alias in aliases), help=help + shown, **kwargs)

    def bool_flag(self, group, name: str, default: bool, help: str) -> None:
        if name in self.omit:
            return
        self.flag(group, name, default, help, nargs="?", const=True, type=parse_bool, metavar="BOOL")
        group.add_argument(f"--no{name}", dest=name, action="store_false", help=argparse.SUPPRESS)
