"""Command-line flags in Google's (absl) style on argparse, generated from the fields of frozen dataclasses.

A command's settings are dataclasses whose fields carry their --help text (`setting`, or metadata["help"]);
`add_dataclass_flags` makes one flag per field, with the field's help, type and default, and `FlagName` gives a field
another project's flag name and value (Google's --num_accumulation_steps for TrainConfig.gradient_accumulation_steps).
Booleans take absl's spellings: --flag, --flag=false, --noflag. FlagParser records only the flags a command gives
(their defaults are kept apart), so that a run directory's record can fill the others; `build` turns flag values back
into the dataclass. Every bertbench command parses with ArgumentParser and its HelpFormatter (each default shown once):
a flag in either spelling (--learning-rate is --learning_rate), every usage error of a command line in one line with
exit status 2, a misspelt flag or choice with the closest one (`closest`, which the sub-command dispatcher uses too).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
import typing
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from bertbench.common.errors import INPUT_ERROR, UsageError


def help_with_default(help: str, default) -> str:
    """An option's --help text with its default once: added after the text unless the text gives it already (a
    default said in words) or there is none (None). A list reads as typed, 1,2,4. Escaped for argparse's %-format."""
    if default is None or default is argparse.SUPPRESS or "(default" in help or "%(default)" in help:
        return help
    shown = ",".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
    return f"{help} (default: {shown.replace('%', '%%')})"


def description(doc: str) -> str:
    """A command's --help description: its module docstring's first paragraph (a first line alone may stop
    mid-sentence)."""
    return " ".join(doc.split("\n\n")[0].split())


class HelpFormatter(argparse.HelpFormatter):
    """Every bertbench --help: each default shown once (help_with_default), none for an on/off switch."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        return help if action.nargs == 0 else help_with_default(help, action.default)


# How alike a word and a name must be (difflib's ratio) for the name to be offered as what the word misspells: 0.6,
# difflib's default, offered --amp for --warmup; 0.7 keeps a swapped, missing or extra letter (--do_trian,
# --learning_rat, 'basline') and a word cut short (--output for --output_dir).
CLOSE = 0.7


def closest(word: str, names: Iterable[str]) -> str | None:
    """The name `word` most likely misspells (difflib, ignoring case), or None when none is close: what a usage
    error offers as "did you mean"."""
    by_lower = {str(name).lower(): name for name in names}
    matches = difflib.get_close_matches(word.lower(), by_lower, n=1, cutoff=CLOSE)
    return by_lower[matches[0]] if matches else None


def invalid_choice(value: Any, choices: Iterable[Any]) -> str:
    """A value that is none of `choices`, said as argparse does, with the closest choice when one is close."""
    choices = list(choices)
    meant = closest(value, map(str, choices)) if isinstance(value, str) else None
    offered = f"did you mean {meant!r}? " if meant else ""
    return f"invalid choice: {value!r} ({offered}choose from {', '.join(map(repr, choices))})"


def spelling(option: str) -> str:
    """What an option's spellings share: --learning-rate and --learning_rate are learning_rate; a boolean's
    --no-flag and --no_flag are absl's --noflag."""
    key = option.lstrip("-").replace("-", "_")
    return "no" + key[3:] if key.startswith("no_") else key


class _Refused(Exception):
    """argparse's error in a parse that lists every error (ArgumentParser.parse_args_and_errors): its message."""


_REFUSED = object()  # what a refused value leaves: parsing goes on, to find the command line's other errors


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (no usage block above it), with exit status 2, and whose
    --help shows each default once (HelpFormatter). A flag must be spelled out: argparse would take
    `--learning_rat` for `--learning_rate`, absl refuses it, and a typo that silently picks some flag is worse than
    an error. Each flag takes either spelling, `_` or `-` between its words (--help shows the declared one), and
    every usage error of a command line is in its one line (parse_args_and_errors), a misspelt flag or choice with
    the closest one."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self._refused: list[str] | None = None  # while parse_args_and_errors runs: the values refused, in order

    def parse_args(self, args: Sequence[str] | None = None, namespace=None) -> argparse.Namespace:
        namespace, errors = self.parse_args_and_errors(args, namespace)
        if errors:
            self.error("; ".join(errors))
        return namespace

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        return super().parse_known_args(self.respelled(args), namespace)

    def parse_args_and_errors(
        self, args: Sequence[str] | None = None, namespace=None
    ) -> tuple[argparse.Namespace | None, list[str]]:
        """The command line's values and every usage error in it, in this order: the unrecognized arguments (each
        misspelt flag with the closest flag: a misspelt required flag is then also missing, below), the values
        refused in the order given, then what argparse finds wrong with the whole (a flag missing its value,
        required flags missing). The values are None when anything but unrecognized arguments was refused: a
        command may check them further only when every flag given was read."""
        args = self.respelled(args)
        self._refused = []
        try:
            namespace, extras = super().parse_known_args(args, namespace)
            ending = []
        except _Refused as refusal:  # argparse stopped: the unknown flags are found without it
            namespace, extras, ending = None, [arg for arg in _options(args) if self._unknown(arg)], [str(refusal)]
        finally:
            refused, self._refused = self._refused, None
        before_values = set(_options(args))  # after `--` an argument is a value, never a misspelt flag
        unrecognized = [self._with_closest(arg) if arg in before_values else arg for arg in extras]
        errors = ["unrecognized arguments: " + " ".join(unrecognized)] if extras else []
        errors += refused + ending
        return (None if refused or ending else namespace), errors

    def respelled(self, args: Sequence[str] | None) -> list[str]:
        """`args` with each flag as this parser declares it (--learning-rate as --learning_rate, --no-do-lower-case
        as --nodo_lower_case): the same flag in another spelling, never a guess. Values and whatever follows `--`
        stay as given."""
        args = list(sys.argv[1:] if args is None else args)
        spellings = self._spellings()
        options = _options(args)
        for index, arg in enumerate(options):
            name, equals, value = arg.partition("=")
            if self._unknown(arg) and spelling(name) in spellings:
                args[index] = spellings[spelling(name)] + equals + value
        return args

    def error(self, message: str):
        if self._refused is not None:  # inside parse_args_and_errors, which reports it with the others
            raise _Refused(message)
        self.exit(INPUT_ERROR, f"{self.prog}: error: {message}\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # argparse converts and checks each flag's value here (Python 3.11 to 3.13 alike); a refused one is noted and
        # parsing goes on, where argparse would stop at the first
        try:
            return super()._get_values(action, arg_strings)
        except argparse.ArgumentError as error:
            if self._refused is None:
                raise
            self._refused.append(str(error))
            return _REFUSED

    def _check_value(self, action: argparse.Action, value: Any) -> None:  # argparse's check of a choice
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, invalid_choice(value, action.choices))

    def _spellings(self) -> dict[str, str]:
        """Each long option's spelling() -> the option as declared."""
        spellings: dict[str, str] = {}
        for option, action in self._option_string_actions.items():
            if option.startswith("--"):
                declared = spellings.setdefault(spelling(option), option)
                assert self._option_string_actions[declared] is action, (
                    f"{declared} and {option}: two flags, one spelling"
                )
        return spellings

    def _unknown(self, arg: str) -> bool:
        """Whether `arg` is a flag this parser lacks, as argparse reads it: --name or --name=value with a name it
        does not know (an argument with a space in it is a value)."""
        name = arg.partition("=")[0]
        return arg.startswith("--") and len(arg) > 2 and name not in self._option_string_actions and " " not in arg

    def _with_closest(self, arg: str) -> str:
        if not arg.startswith("-"):
            return arg  # a value no flag takes
        spellings = self._spellings()
        meant = closest(spelling(arg.partition("=")[0]), spellings)
        return f"{arg} (did you mean {spellings[meant]}?)" if meant else arg


def _options(args: list[str]) -> list[str]:
    """The arguments before `--`, after which every argument is a value."""
    return args[: args.index("--")] if "--" in args else args


def setting(help: str, default: Any = dataclasses.MISSING, **metadata: Any) -> Any:
    """A dataclass field that is also a flag: its --help text, its default, and what else the flag or a run record
    reads from metadata: choices, aliases (other names of the flag), required (None is refused), positive (values
    <= 0 are refused), defines_run (a resumed run must keep it), defines_training (a resumed training must keep
    it; an evaluation may differ), per_command (what one command does, not what the run is: never recorded), at_least (a smaller value is refused).
    A tuple[X, ...] field is a comma-separated flag (--batch_sizes=8,32)."""
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def parse_bool(text: str) -> bool:
    """absl's boolean spellings: --flag=true/false/1/0/yes/no (any case)."""
    lowered = text.strip().lower()
    if lowered in ("true", "t", "1", "yes", "y"):
        return True
    if lowered in ("false", "f", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _same(value: Any) -> Any:
    return value


FIELD_DEFAULT = object()  # a FlagName's default: the field's own


@dataclasses.dataclass(frozen=True)
class FlagName:
    """A flag for the field `field` of the dataclass `owner` (and of its subclasses) under another name (NVIDIA's
    --use_xla for TrainConfig.compile), and how its value becomes the field's. Several flags may set one field
    (--precision, --amp): those left at their default say nothing, the others must agree. `also`: other fields the
    flag sets to the same value, where the dataclass has them (HF's --per_device_eval_batch_size is the evaluation
    and the prediction batch)."""

    flag: str
    owner: type
    field: str
    value: Callable[[Any], Any] = _same  # the flag's value -> the field's
    type: type | None = None  # the flag's type, when not the field's (--amp is a boolean for a string field)
    choices: Sequence[str] | None = None  # the flag's choices, when not the field's
    default: Any = FIELD_DEFAULT  # the flag's default, when not the field's
    aliases: tuple[str, ...] = ()
    note: str = ""  # how the flag reads, after the field's help
    also: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class IgnoredFlag:
    """A flag of another project's script that means nothing here (NVIDIA's --local_rank: torchrun places the
    processes), accepted so that its commands run as they are and never silently: a command that gives it is told
    `note`, why it is ignored. `refuse(value)` says why a value cannot be ignored (Google's --use_tpu=true), None when
    it can. `runners`: the runners that take it (bertbench_run.json's names), empty for every runner."""

    flag: str
    note: str
    type: type = str  # bool: an absl boolean (--flag, --flag=false, --noflag)
    aliases: tuple[str, ...] = ()
    refuse: Callable[[Any], str | None] | None = None
    runners: tuple[str, ...] = ()

    def check(self, value: Any) -> str:
        """The note a command giving `value` gets; a UsageError for a value that cannot be ignored."""
        refusal = self.refuse(value) if self.refuse is not None else None
        if refusal:
            raise UsageError(f"--{self.flag}={_spelt(value)}: {refusal}")
        return f"--{self.flag} is ignored: {self.note}"


class FlagParser(ArgumentParser):
    """argparse that only records the flags a command gives (defaults live in `defaults`, so a run directory's
    record can fill the others) and takes absl booleans: --do_train, --do_train=false, --nodo_train."""

    def __init__(self, **kwargs):
        super().__init__(argument_default=argparse.SUPPRESS, **kwargs)
        self.defaults: dict[str, Any] = {}
        self.names: dict[str, FlagName] = {}  # the flags add_dataclass_flags made: the field each one sets
        self.fields: dict[str, dataclasses.Field] = {}  # ... and that field, whose metadata describes the flag
        self.ignored: dict[str, IgnoredFlag] = {}  # other projects' flags that set nothing (ignored_flags)

    def flag(self, group, name: str, default: Any, help: str, aliases: Sequence[str] = (), **kwargs) -> None:
        """--name (and --alias ...: other projects' names for the same flag)."""
        self.defaults[name] = default  # argparse's is SUPPRESS (nothing given): the help shows this one
        group.add_argument(
            f"--{name}", *(f"--{alias}" for alias in aliases), help=help_with_default(help, default), **kwargs
        )

    def bool_flag(self, group, name: str, default: bool, help: str, aliases: Sequence[str] = ()) -> None:
        self.flag(group, name, default, help, aliases, nargs="?", const=True, type=parse_bool, metavar="BOOL")
        group.add_argument(f"--no{name}", dest=name, action="store_false", help=argparse.SUPPRESS)

    def ignored_flags(self, flags: Sequence[IgnoredFlag], title: str) -> None:
        """Accept `flags` in a group of their own; they have no default, so only a command that gives one holds
        it (see notes)."""
        group = self.add_argument_group(title)
        for ignored in flags:
            self.ignored[ignored.flag] = ignored
            names = [f"--{name}" for name in (ignored.flag, *ignored.aliases)]
            help_text = f"Ignored: {ignored.note}"
            if ignored.type is bool:
                group.add_argument(
                    *names, dest=ignored.flag, nargs="?", const=True, type=parse_bool, metavar="BOOL", help=help_text
                )
                group.add_argument(
                    f"--no{ignored.flag}", dest=ignored.flag, action="store_false", help=argparse.SUPPRESS
                )
            else:
                group.add_argument(*names, dest=ignored.flag, type=ignored.type, help=help_text)

    def notes(self, given: dict[str, Any]) -> list[str]:
        """Take the ignored flags out of `given` (what a command gave, by flag name): the note each one gets, or a
        UsageError for a value that cannot be ignored."""
        return [self.ignored[name].check(given.pop(name)) for name in list(given) if name in self.ignored]

    def field_values(self, cls: type, flags: Mapping[str, Any]) -> dict[str, Any]:
        """The fields of `cls` that `flags` (values by flag name) set, each value translated by its FlagName. Of
        several flags for one field, those at their default say nothing and the others must agree; a field none of
        them sets takes their common default, or the dataclass's when they have none (--precision, --amp)."""
        by_field = defaultdict(list)
        fields = {field.name for field in dataclasses.fields(cls)}
        for name in self.names.values():
            if issubclass(cls, name.owner) and name.flag in flags:
                for field in (name.field, *name.also):
                    if field in fields:
                        by_field[field].append(name)
        values = {}
        for field, names in by_field.items():
            said = {
                name.flag: name.value(flags[name.flag])
                for name in names
                if len(names) == 1 or flags[name.flag] != self.defaults[name.flag]
            }
            if len(set(said.values())) > 1:
                raise UsageError(
                    " and ".join(f"--{flag}={_spelt(flags[flag])}" for flag in said)
                    + f" contradict each other: {field} {' or '.join(map(str, said.values()))}"
                )
            at_default = {name.value(flags[name.flag]) for name in names} - {None}  # None: no default of its own
            if said:
                values[field] = next(iter(said.values()))
            elif len(at_default) == 1:  # --num_accumulation_steps/--gradient_accumulation_steps
                values[field] = at_default.pop()
        return values

    def given_values(self, values: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
        """What parse_args_and_errors returns for a command that gives `values`, Python values by flag name (how
        code calls a command: the demo, the benches, the tests): each checked as parsing checks a flag (a flag of
        this parser, a value of its type, one of its choices), with the defaults argparse itself fills in; None gives
        nothing. The errors: the unknown names (each with the closest flag), then the values refused, in the order
        given; the values are None when one was refused."""
        actions: dict[str, argparse.Action] = {}
        for action in self._actions:
            if action.option_strings and action.dest != "help" and (action.dest not in actions or action.type):
                actions[action.dest] = action  # a boolean's --flag (typed), not its --noflag
        given = {dest: action.default for dest, action in actions.items() if action.default is not argparse.SUPPRESS}
        unknown, refused = [], []
        for name, value in values.items():
            action = actions.get(name)
            if action is None:
                meant = closest(name, actions)
                unknown.append(f"unknown flag {name!r}" + (f" (did you mean {meant!r}?)" if meant else ""))
                continue
            if value is None:
                continue
            kind = bool if action.type is parse_bool else action.type if action.type in (int, float) else str
            accepted = (int, float) if kind is float else kind  # a float flag takes an int, as its text would
            if not isinstance(value, accepted) or isinstance(value, bool) and kind is not bool:
                refused.append(f"--{name}: expected {kind.__name__}, got {value!r}")
            elif action.choices is not None and value not in action.choices:
                refused.append(f"--{name}: {invalid_choice(value, action.choices)}")
            else:
                given[name] = value
        return (None if refused else given), unknown + refused


def as_flags(values: Mapping[str, Any]) -> list[str]:
    """The command line of `values` (Python values by flag name, None for none): what a user types for the same
    command (--do_train, --nodo_lower_case, --max_seq_length=64, --batch_sizes=8,32)."""
    return [
        (f"--{name}" if value else f"--no{name}") if isinstance(value, bool) else f"--{name}={_spelt_all(value)}"
        for name, value in values.items()
        if value is not None
    ]


def _spelt(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def flag_names(cls: type, names: Sequence[FlagName] = ()) -> dict[str, list[FlagName]]:
    """The flags of each field of `cls`: those `names` gives it, else the flag of the field's own name."""
    given = defaultdict(list)
    for name in names:
        if issubclass(cls, name.owner):
            given[name.field].append(name)
    return {
        field.name: given.get(field.name) or [FlagName(field.name, cls, field.name)]
        for field in dataclasses.fields(cls)
    }


def add_dataclass_flags(
    parser: FlagParser,
    cls: type,
    names: Sequence[FlagName] = (),
    omit: Collection[str] = (),
    defaults: Mapping[str, Any] | None = None,
    one_of: Collection[str] = (),
) -> None:
    """One flag per field of the dataclass `cls` (or the flags `names` gives a field), in an argument group for each
    class of `cls`'s hierarchy that declares fields, titled by its docstring's first line. A flag's help is the
    field's metadata["help"], its type the field's (X | None reads X; a type argparse cannot call, such as a tuple,
    reads text for the command to convert), its default the field's (a field without one is a required flag); a bool
    is an absl boolean. omit: flags to leave out; defaults: flag defaults other than the fields'; one_of: flags of
    which a command must give exactly one."""
    hints = typing.get_type_hints(cls)
    fields = {field.name: field for field in dataclasses.fields(cls)}
    class_groups, exclusive = {}, None
    for field_name, flags in flag_names(cls, names).items():
        field = fields[field_name]
        declared_by = next(klass for klass in cls.__mro__ if field_name in vars(klass).get("__annotations__", {}))
        if declared_by not in class_groups:
            class_groups[declared_by] = parser.add_argument_group(declared_by.__doc__.splitlines()[0].rstrip("."))
        for name in flags:
            if name.flag in omit:
                continue
            parser.names[name.flag], parser.fields[name.flag] = name, field
            default = (defaults or {}).get(name.flag, field.default if name.default is FIELD_DEFAULT else name.default)
            required = default is dataclasses.MISSING
            if name.type is not None:  # another kind of value: what the flag means comes first
                help_text = f"{name.note} [{cls.__name__}.{field_name}: {field.metadata['help']}]"
            else:
                help_text = " ".join(filter(None, (field.metadata["help"], name.note)))
                help_text += f" [{cls.__name__}.{field_name}]" if name.flag != field_name else ""
            aliases = name.aliases + (tuple(field.metadata.get("aliases", ())) if name.flag == field_name else ())
            where = class_groups[declared_by]
            if name.flag in one_of:
                exclusive = exclusive or where.add_mutually_exclusive_group(required=True)
                where = exclusive
            kind = name.type or _flag_type(hints[field_name])
            if kind is bool:
                parser.bool_flag(where, name.flag, default, help_text, aliases)
            else:
                parser.flag(
                    where,
                    name.flag,
                    None if required else default,
                    help_text,
                    aliases,
                    type=kind,
                    choices=name.choices or field.metadata.get("choices"),
                    required=required,
                )


def _flag_type(hint: Any) -> Callable[[str], Any]:
    arguments = [argument for argument in typing.get_args(hint) if argument is not type(None)]
    kind = arguments[0] if typing.get_origin(hint) in (typing.Union, type(int | None)) else hint
    if typing.get_origin(kind) is tuple and typing.get_args(kind)[1:] == (Ellipsis,):
        return comma_list(typing.get_args(kind)[0])
    return kind if isinstance(kind, type) and typing.get_origin(kind) is None else str


def comma_list(convert: Callable[[str], Any]) -> Callable[[str], tuple]:
    """The flag type of a tuple[X, ...] field: "8,32" is (8, 32), each item converted by `convert`."""

    def parse(text: str) -> tuple:
        try:
            values = tuple(convert(item.strip()) for item in text.split(",") if item.strip())
        except ValueError:
            values = ()
        if not values:
            raise argparse.ArgumentTypeError(f"expected comma-separated {items}, got {text!r}")
        return values

    items = {int: "integers", float: "numbers"}.get(convert, "values")
    return parse


def check_fields(settings: Any, also_missing: Sequence[str] = ()) -> None:
    """The checks a settings dataclass's metadata asks for, every field's in one error: `required` (None refused;
    the flags missing named together, with `also_missing`, what the settings' own rules find missing), `positive`
    (<= 0 refused; each item of a tuple), `at_least` (a value below it refused)."""
    fields = dataclasses.fields(settings)
    missing = [
        f"--{field.name}"
        for field in fields
        if field.metadata.get("required") and getattr(settings, field.name) is None
    ] + list(also_missing)
    errors = []
    if missing:
        names = f"{', '.join(missing[:-1])} and {missing[-1]} are" if len(missing) > 1 else f"{missing[0]} is"
        errors.append(f"{names} required")
    for field in fields:
        value = getattr(settings, field.name)
        values = value if isinstance(value, tuple) else () if value is None else (value,)
        if field.metadata.get("positive") and any(not item > 0 for item in values):  # NaN too
            errors.append(f"--{field.name} must be positive, got {_spelt_all(value)}")
        least = field.metadata.get("at_least")
        if least is not None and any(not item >= least for item in values):
            errors.append(f"--{field.name} must be {least} or more, got {_spelt_all(value)}")
    if errors:
        raise UsageError("; ".join(errors))


def _spelt_all(value: Any) -> str:
    return ",".join(map(_spelt, value)) if isinstance(value, tuple) else _spelt(value)


def build(cls: type, names: Sequence[FlagName] = (), **values: Any) -> Any:
    """cls(**values), with the ValueError of a check in the dataclass made a UsageError that names the flags (a
    UsageError names them already): "gradient_accumulation_steps must be at least 1" reads
    "--num_accumulation_steps must be at least 1"."""
    try:
        return cls(**values)
    except UsageError:
        raise
    except ValueError as error:
        message = str(error)
        for field, flags in flag_names(cls, names).items():
            message = re.sub(
                rf"(?<![\w.-]){re.escape(field)}\b", "--" + "/--".join(name.flag for name in flags), message
            )
        raise UsageError(message) from None
