"""Every bench's settings, as the runners have theirs: a frozen dataclass per bench, each field declared with the flag
table's `setting()` (its help is the --help), parsed once by `parse`, checked in `__post_init__`.

The bases hold what benches share: `BenchSettings` the output directory, `MeasuredSettings` the device, threads,
seed and timing of a bench that times something; `model_setting` and `precision_setting` the model and precision
fields, for the benches that build one. A bench's functions take its settings object, never an argparse namespace;
the suite builds its parts as settings objects and runs each as `bertbench bench KIND` with `as_argv(settings)`.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from bertbench.bench import cli
from bertbench.common.flags import FlagParser, add_dataclass_flags, as_flags, build, check_fields, setting
from bertbench.model.precision import PRECISIONS
from bertbench.model.sizes import MODEL_SIZES

if TYPE_CHECKING:
    import torch

Settings = TypeVar("Settings", bound="BenchSettings")


def device_setting(help: str = "cpu, cuda or cuda:N (default: CUDA when available).") -> Any:
    """--device: the settings' device, None for CUDA when available (MeasuredSettings; a bench whose parts run
    elsewhere says where in `help`)."""
    return setting(help, None)


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """Output."""

    bench: ClassVar[str] = ""  # the bench's name: bertbench bench NAME, and its files NAME.json, NAME.md, NAME-*.png

    @classmethod
    def program(cls) -> str:
        """The command, as its usage and errors name it."""
        return f"bertbench bench {cls.bench}"

    output_dir: str | None = setting(
        "Where the bench's JSON, markdown and plots go (default: bench_results/<bench>-<date>-<time>).", None
    )
    overwrite: bool = setting("Replace this bench's files in --output_dir.", False)

    def __post_init__(self) -> None:
        check_fields(self)

    @property
    def directory(self) -> str:
        """--output_dir as given; parse() fills in the dated default, so a settings object always names one."""
        assert self.output_dir is not None, "settings built without parse(): give output_dir"
        return self.output_dir


@dataclasses.dataclass(frozen=True)
class MeasuredSettings(BenchSettings):
    """Device and timing."""

    device: str | None = device_setting()
    threads: int | None = setting("CPU threads (default: torch's, one per core).", None, positive=True)
    seed: int = setting("Seed of the model's weights and the synthetic data.", 0)
    warmup: int = setting("Untimed steps before the timed ones (the first allocates, a compiled one compiles).", 2)
    steps: int = setting("Timed steps, interleaved with the compared ones: the median, min, max and CV.", 5)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {self.warmup}")
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")

    def torch_device(self) -> torch.device:
        """--device as the torch device, made the current one; set the CPU threads (--threads) first. An unusable
        device is a UsageError naming --device. (torch is imported here, not with the settings: `bertbench report`
        takes settings and runs no model.)"""
        import torch

        from bertbench.training.distributed import resolve_device

        if self.threads:
            torch.set_num_threads(self.threads)
        return resolve_device(self.device)


def model_setting(default: str | None = "base", more: str = "") -> Any:
    """--model as every bench that builds a model takes it: a named size or a bert_config.json path (`more`: the
    bench's own words, such as what a default of None means)."""
    return setting(f"{', '.join(MODEL_SIZES)} or a bert_config.json{more}.", default)


def precision_setting(default: str = "fp32") -> Any:
    return setting("The training step's precision.", default, choices=tuple(PRECISIONS))


def precisions_setting(default: tuple[str, ...] = ("fp32",)) -> Any:
    return setting(f"Precisions to measure, comma-separated ({', '.join(PRECISIONS)}).", default)


def parser_for(cls: type[BenchSettings], description: str) -> FlagParser:
    """A flag per field; a field whose metadata names a `positional` metavar (bertbench report's DIR...) is the
    command's arguments instead, one or more."""
    parser = FlagParser(prog=cls.program(), description=description)
    add_dataclass_flags(parser, cls, omit=positional_fields(cls))
    for name in positional_fields(cls):
        field = cls.__dataclass_fields__[name]
        parser.add_argument(name, nargs="+", metavar=field.metadata["positional"], help=field.metadata["help"])
    return parser


def positional_fields(cls: type[BenchSettings]) -> list[str]:
    return [field.name for field in dataclasses.fields(cls) if field.metadata.get("positional")]


def parse(cls: type[Settings], argv: Sequence[str], description: str) -> Settings:
    """The settings `argv` gives, with every usage error of it in one line (exit status 2): the flags' own, then
    what the settings' checks refuse. --output_dir's default (a dated directory) is fixed here, once."""
    parser = parser_for(cls, description)
    namespace, errors = parser.parse_args_and_errors(argv)
    if errors:
        parser.error("; ".join(errors))
    values = {**parser.defaults, **vars(namespace)}
    if values.get("output_dir") is None:
        values["output_dir"] = os.path.join("bench_results", f"{cls.bench}-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    arguments = {name: tuple(values[name]) for name in positional_fields(cls)}
    return build(cls, **parser.field_values(cls, values), **arguments)


def as_argv(settings: BenchSettings) -> list[str]:
    """The command line that parses to `settings`: a flag for each field that is not at its default, then the
    arguments (positional fields)."""
    arguments = positional_fields(type(settings))
    values = {
        field.name: getattr(settings, field.name)
        for field in dataclasses.fields(settings)
        if getattr(settings, field.name) != field.default and field.name not in arguments
    }
    return as_flags(values) + [str(item) for name in arguments for item in getattr(settings, name)]


def as_dict(settings: BenchSettings) -> dict[str, Any]:
    """The settings as a JSON object (tuples as lists): what a result records as its settings."""
    return {field.name: _plain(getattr(settings, field.name)) for field in dataclasses.fields(settings)}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def main_for(cls: type[Settings], description: str, body: Callable[[Settings, list[str]], None]) -> Callable:
    """A bench's `main(argv)`: parse its settings once, then run `body(settings, argv)` under the exit-code policy
    (bench.cli.run)."""

    def main(argv: Sequence[str] | None = None) -> int:
        given = list(sys.argv[1:] if argv is None else argv)
        return cli.run(cls.program(), lambda: body(parse(cls, given, description), given))

    return main
