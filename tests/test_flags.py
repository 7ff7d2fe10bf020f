"""The runners' configuration has one source: flags are generated from dataclass fields (help, type, default, absl
booleans), Google's and NVIDIA's names for RunConfig / TrainConfig fields live in one table, parsed configurations
are frozen, and a bad value is one line with exit status 2."""

import dataclasses
import json

import pytest
from helpers import snapshot, tiny_config
from torch import nn

from bertbench.common.errors import UsageError
from bertbench.common.flags import FlagParser, add_dataclass_flags, as_flags, setting
from bertbench.common.run_files import RUN_RECORD
from bertbench.runners import classifier as run_classifier
from bertbench.runners import pretraining as run_pretraining
from bertbench.runners import squad as run_squad
from bertbench.runners.config import FLAG_NAMES, build_parser, config_from_values, parse_config
from bertbench.runners.run_directory import RunRecord, write_record
from bertbench.runners.skeleton import TrainingPlan, build_estimator
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.training.distributed import Distributed
from bertbench.training.step import fallbacks


@dataclasses.dataclass(frozen=True)
class Example:
    """Example settings."""

    path: str = setting("Where the example reads from.")
    count: int = setting("How many times.", 3)
    rate: float | None = setting("A rate, when given.", None)
    on: bool = setting("Whether it is on.", True)
    kind: str = setting("Which kind.", "a", choices=("a", "b"), aliases=("sort",))
    edges: tuple[int, ...] | None = setting("Edges, comma-separated.", None)


def compact(text: str) -> str:
    """Text without whitespace: argparse wraps help lines wherever it likes (after hyphens too)."""
    return "".join(text.split())


def test_flags_from_a_dataclass_carry_its_help_type_and_default():
    parser = FlagParser(prog="example")
    add_dataclass_flags(parser, Example)
    assert parser.defaults == {"path": None, "count": 3, "rate": None, "on": True, "kind": "a", "edges": None}
    text = compact(parser.format_help())
    assert compact("Example settings") in text  # the group, titled by the class's docstring
    for field in dataclasses.fields(Example):
        assert compact(f"--{field.name}") in text and compact(field.metadata["help"]) in text
    assert compact("How many times. (default: 3)") in text and "--sort" in text
    given = vars(parser.parse_args(["--path=p", "--count=5", "--rate=0.5", "--noon", "--sort=b", "--edges=1,2"]))
    assert given == {"path": "p", "count": 5, "rate": 0.5, "on": False, "kind": "b", "edges": (1, 2)}
    with pytest.raises(SystemExit):
        parser.parse_args(["--edges=1,x"])
    assert vars(parser.parse_args(["--path=p", "--on=false"])) == {"path": "p", "on": False}  # only what was given
    assert vars(parser.parse_args(["--path=p", "--no_on"]))["on"] is False


@pytest.mark.parametrize(
    "argv, given, errors",
    [
        (["--path=p", "--no-on", "--sort", "b"], {"path": "p", "on": False, "kind": "b"}, []),
        (["--path", "--count"], None, ["argument --path: expected one argument"]),  # an option is never a value
        (["--path=--count", "--rate=-1"], {"path": "--count", "rate": -1.0}, []),  # ... but after `=` it is
        (["--path=p", "--", "--no-on", "--cuont"], {"path": "p"}, ["unrecognized arguments: -- --no-on --cuont"]),
        (
            ["--cuont=2", "--kind=c", "--frobnicate", "--rate=fast"],
            None,
            [
                "unrecognized arguments: --cuont=2 (did you mean --count?) --frobnicate",
                "argument --kind/--sort: invalid choice: 'c' (choose from 'a', 'b')",
                "argument --rate: invalid float value: 'fast'",
                "the following arguments are required: --path",
            ],
        ),
    ],
)
def test_a_command_line_in_either_spelling_and_every_error_in_it(argv, given, errors):
    """A flag takes `_` or `-` between its words; every usage error is found, unknown flags first (with the closest
    flag, when one is close), then the values refused, then what is missing; values and what follows `--` are never
    read as flags."""
    parser = FlagParser(prog="example")
    add_dataclass_flags(parser, Example)
    namespace, found = parser.parse_args_and_errors(argv)
    assert (given, found) == (None if namespace is None else vars(namespace), errors)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "the following arguments are required: --path"),
        (["--path=p", "--count=many"], "argument --count: invalid int value: 'many'"),
        (["--path=p", "--kind=c"], "argument --kind/--sort: invalid choice: 'c'"),
        (["--path=p", "--on=maybe"], "argument --on: expected true or false, got 'maybe'"),
    ],
)
def test_a_bad_flag_is_one_line_and_status_2(argv, message, capsys):
    parser = FlagParser(prog="example")
    add_dataclass_flags(parser, Example)
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(argv)
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"example: error: {message}")


# The least a runner command needs to parse.
REQUIRED = {
    "run_classifier": ["--task_name=MRPC", "--data_dir=d", "--vocab_file=v", "--do_train"],
    "run_squad": ["--train_file=t", "--vocab_file=v", "--do_train"],
    "run_pretraining": ["--input_dir=i", "--num_train_steps=10", "--do_train"],
}


def parse(spec, tmp_path, *extra):
    argv = [f"--output_dir={tmp_path}", "--bert_config_file=c", *REQUIRED[spec.name], *extra]
    command, _ = parse_config(spec, argv)
    return command


def run_config(command):
    return command.run


def train_values(command):
    return command.train


def task_values(command):
    return command.task


# Each Google / NVIDIA / HF / tf.estimator name in runners.config.FLAG_NAMES, and the field value it gives.
TRANSLATIONS = [
    ("output_dir", ["--output_dir=elsewhere"], run_config, "model_dir", "elsewhere"),
    ("save_checkpoints_secs", ["--save_checkpoints_secs=0"], run_config, "save_checkpoints_secs", None),
    ("save_checkpoints_secs", ["--save_checkpoints_secs=30"], run_config, "save_checkpoints_secs", 30.0),
    ("save_checkpoints_steps", ["--num_steps_per_checkpoint=50"], run_config, "save_checkpoints_steps", 50),
    ("save_checkpoints_steps", ["--save_steps=60"], run_config, "save_checkpoints_steps", 60),
    ("keep_checkpoint_max", ["--save_total_limit=3"], run_config, "keep_checkpoint_max", 3),
    ("log_step_count_steps", ["--log_freq=5"], run_config, "log_step_count_steps", 5),
    ("log_step_count_steps", ["--logging_steps=7"], run_config, "log_step_count_steps", 7),
    ("warmup_proportion", ["--warmup_ratio=0.06"], train_values, "warmup_proportion", 0.06),
    ("decay", ["--decay=poly"], train_values, "decay", "poly"),
    ("lr_scheduler_type", ["--lr_scheduler_type=polynomial"], train_values, "decay", "poly"),
    ("lr_scheduler_type", [], train_values, "decay", "linear"),  # --decay's default
    ("adam_bias_correction", ["--adam_bias_correction"], train_values, "adam_bias_correction", True),
    ("optim", ["--optim=adamw_torch_fused"], train_values, "adam_bias_correction", True),
    ("optim", [], train_values, "adam_bias_correction", False),
    ("max_grad_norm", ["--max_grad_norm=0.5"], train_values, "max_grad_norm", 0.5),
    ("max_grad_norm", ["--max_grad_norm=0"], train_values, "max_grad_norm", None),  # HF's: no clipping
    ("use_xla", ["--torch_compile"], train_values, "compile", True),
    ("bf16", ["--bf16"], train_values, "precision", "bf16"),
    ("init_checkpoint", ["--init_checkpoint=weights"], task_values, "init_checkpoint", "weights"),
    ("model_name_or_path", ["--model_name_or_path=."], task_values, "init_checkpoint", "."),
    ("bert_config_file", ["--config_name=hf.json"], task_values, "bert_config_file", "hf.json"),
    ("vocab_file", ["--tokenizer_name=tokens"], task_values, "vocab_file", "tokens"),
    ("train_batch_size", ["--train_batch_size=16"], task_values, "train_batch_size", 16),
    ("per_device_train_batch_size", ["--per_device_train_batch_size=4"], task_values, "train_batch_size", 4),
    ("predict_batch_size", ["--predict_batch_size=4"], task_values, "predict_batch_size", 4),
    ("per_device_eval_batch_size", ["--per_device_eval_batch_size=4"], task_values, "predict_batch_size", 4),
    ("per_device_eval_batch_size", ["--per_device_eval_batch_size=4"], task_values, "eval_batch_size", 4),
    ("device", ["--device=cpu"], task_values, "device", "cpu"),
    ("use_cpu", ["--use_cpu"], task_values, "device", "cpu"),
    ("num_accumulation_steps", ["--num_accumulation_steps=4"], train_values, "gradient_accumulation_steps", 4),
    ("num_accumulation_steps", [], train_values, "gradient_accumulation_steps", 1),  # the two names' default
    (
        "gradient_accumulation_steps",
        ["--gradient_accumulation_steps=4"],
        train_values,
        "gradient_accumulation_steps",
        4,
    ),
    ("optimizer_type", ["--optimizer_type=adam"], train_values, "optimizer", "adamw"),
    ("optimizer", ["--optimizer=lamb"], train_values, "optimizer", "lamb"),
    ("optimizer_type", ["--optimizer_type=lamb"], train_values, "optimizer", "lamb"),
    ("poly_power", ["--poly_power=2"], train_values, "decay_power", 2.0),
    ("use_xla", ["--use_xla"], train_values, "compile", True),
    ("precision", ["--precision=bf16"], train_values, "precision", "bf16"),
    ("precision", [], train_values, "precision", "fp32"),  # TrainConfig's default
    ("amp", ["--amp"], train_values, "precision", "fp16"),
    ("amp", ["--fp16"], train_values, "precision", "fp16"),
    ("amp", ["--amp=false", "--precision=bf16"], train_values, "precision", "bf16"),
    ("use_fp16", ["--use_fp16", "--precision=fp16"], train_values, "precision", "fp16"),
    ("sync_gradients", ["--no_sync_gradients"], train_values, "sync_gradients", False),
]


@pytest.mark.parametrize(
    "argv, optimizer", [([], "lamb"), (["--optimizer=adamw"], "adamw"), (["--optimizer_type=adam"], "adamw")]
)
def test_run_pretraining_trains_with_lamb_unless_told_googles_rule(tmp_path, argv, optimizer):
    command = parse(run_pretraining.SPEC, tmp_path, *argv)
    assert (command.train.optimizer, command.train.adam_bias_correction) == (optimizer, False)


def test_every_name_of_the_table_is_tested():
    assert {name.flag for name in FLAG_NAMES} == {case[0] for case in TRANSLATIONS}


@pytest.mark.parametrize(
    "flag, argv, config, field, expected", TRANSLATIONS, ids=[f"{case[0]}-{'-'.join(case[1])}" for case in TRANSLATIONS]
)
def test_the_table_translates_each_name(tmp_path, flag, argv, config, field, expected):
    command = parse(run_classifier.SPEC, tmp_path, *argv)
    assert getattr(config(command), field) == expected
    if expected is not None and config is train_values:  # and the job's TrainConfig takes it, as it runs on the CPU
        estimator = build_estimator(command, nn.Linear(2, 2), Distributed(), TrainingPlan(10))
        runs_instead = {change.field: change.value for change in fallbacks(command.train, "cpu")}  # fp16: fp32
        assert getattr(estimator.train_config, field) == runs_instead.get(field, expected)


def test_derived_values_and_defaults_of_the_train_config(tmp_path):
    command = parse(run_classifier.SPEC, tmp_path, "--learning_rate=1e-4", "--lr_scaling=linear")
    config = build_estimator(command, nn.Linear(2, 2), Distributed(world_size=4), TrainingPlan(10)).train_config
    assert (config.learning_rate, config.num_train_steps, config.precision, config.optimizer, config.decay_power) == (
        4e-4,
        10,
        "fp32",
        "adamw",
        1.0,
    )
    assert command.args["learning_rate"] == 1e-4  # the flag as given, which the run record keeps
    pretraining = parse(run_pretraining.SPEC, tmp_path, "--max_steps=7", "--input_file=shards")
    assert (pretraining.task.num_train_steps, pretraining.task.input_dir) == (7, "shards")
    assert (pretraining.train.optimizer, pretraining.train.decay, pretraining.train.decay_power) == (
        "lamb",
        "poly",
        0.5,
    )  # NVIDIA's recipe is pre-training's default


def test_contradicting_names_for_one_field_are_refused(tmp_path):
    with pytest.raises(UsageError, match="--precision=fp32 and --use_fp16=true contradict each other"):
        parse(run_classifier.SPEC, tmp_path, "--precision=fp32", "--use_fp16")


def test_a_parsed_command_is_frozen(tmp_path):
    command = parse(run_classifier.SPEC, tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.task.train_batch_size = 64
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.run.seed = 1
    with pytest.raises(TypeError):
        command.args["learning_rate"] = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.train.learning_rate = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.model.modeling = "recompute"
    with pytest.raises(dataclasses.FrozenInstanceError):
        command.task = None


@pytest.mark.parametrize("module", [run_classifier, run_squad, run_pretraining])
def test_help_comes_from_the_dataclasses_under_googles_names(module, capsys):
    assert module.main(["--help"]) == 0
    text = compact(capsys.readouterr().out)
    spec = module.SPEC
    for field in dataclasses.fields(spec.settings):
        assert compact(f"--{field.name}") in text and compact(field.metadata["help"]) in text, field.name
    for name in FLAG_NAMES:
        owned = any(issubclass(cls, name.owner) for cls in (spec.settings, RunConfig, TrainConfig))
        if name.flag not in spec.omit and owned:
            field = {field.name: field for field in dataclasses.fields(name.owner)}[name.field]
            assert compact(f"--{name.flag}") in text and compact(field.metadata["help"]) in text, name.flag
    assert "--model_dir" not in text  # the core's name
    assert "--excluded_steps" not in text and "--modeling" in text and "--recompute_policy" in text


def test_flags_a_runner_does_without_are_not_offered(capsys):
    assert run_pretraining.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert "--max_steps" in text and "--input_file" in text
    assert "--sync_gradients" not in text and "--num_train_epochs" not in text
    assert compact("--vocab_file VOCAB_FILE Ignored: the shards hold token ids") in compact(text)  # NVIDIA's
    assert run_classifier.main(["--help"]) == 0
    assert "--num_train_steps" not in capsys.readouterr().out  # fine-tuning counts epochs


@pytest.mark.parametrize("module", [run_classifier, run_squad, run_pretraining])
@pytest.mark.parametrize(
    "extra, message",
    [
        (["--train_batch_size=many"], "argument --train_batch_size: invalid int value: 'many'"),
        (["--optimizer_type=sgd"], "argument --optimizer_type: invalid choice: 'sgd'"),
        (["--keep_checkpoint_max=0"], "--keep_checkpoint_max must be at least 1, got 0"),  # RunConfig's own check
        (["--max_seq_length=0"], "--max_seq_length must be positive, got 0"),
        (
            ["--learning_rat=1e-4"],  # absl refuses abbreviations too
            "unrecognized arguments: --learning_rat=1e-4 (did you mean --learning_rate?)",
        ),
    ],
)
def test_a_bad_value_is_one_line_with_status_2(module, extra, message, tmp_path, error_line):
    argv = [f"--output_dir={tmp_path / 'run'}", "--bert_config_file=c", *REQUIRED[module.PROGRAM], *extra]
    assert module.main(argv) == 2
    assert error_line().startswith(f"{module.PROGRAM}: error: {message}")
    assert not (tmp_path / "run").exists()


def test_a_config_check_names_the_flag_not_the_field_and_comes_when_the_command_is_parsed(tmp_path):
    """A training flag TrainConfig refuses is refused with the command, before any file is read."""
    with pytest.raises(UsageError) as error:
        parse(run_classifier.SPEC, tmp_path, "--num_accumulation_steps=0")
    assert str(error.value) == "--num_accumulation_steps/--gradient_accumulation_steps must be at least 1, got 0"
    parse(run_classifier.SPEC, tmp_path, "--num_accumulation_steps=0", "--do_train=false", "--do_eval")  # unused


def test_the_record_keeps_flags_by_name_and_refuses_run_defining_changes(tmp_path):
    command = parse(run_classifier.SPEC, tmp_path, "--num_accumulation_steps=2", "--max_train_seconds=60")
    write_record(None, run_classifier.PROGRAM, command, tiny_config(), Distributed())
    record = RunRecord.read(str(tmp_path))
    assert record.args["num_accumulation_steps"] == 2 and record.args["task_name"] == "MRPC"
    assert not {"output_dir", "do_train", "max_train_seconds"} & set(record.args)  # what one command does
    defining = {
        name for name, field in build_parser(run_classifier.SPEC).fields.items() if field.metadata.get("defines_run")
    }
    assert {"num_accumulation_steps", "learning_rate", "seed", "task_name", "max_seq_length"} <= defining
    with pytest.raises(UsageError, match="this run was made with --num_accumulation_steps=2, the command gives 4"):
        parse_config(run_classifier.SPEC, [f"--output_dir={tmp_path}", "--do_eval", "--num_accumulation_steps=4"])
    resumed, _ = parse_config(run_classifier.SPEC, [f"--output_dir={tmp_path}", "--do_eval", "--precision=bf16"])
    assert resumed.train is None and resumed.task.task_name == "MRPC"  # an evaluation trains nothing
    assert resumed.args["num_accumulation_steps"] == 2 and isinstance(resumed.run, RunConfig)


@pytest.mark.parametrize("optimizer_type, trained_with", [("adam", "adamw"), ("lamb", "nvlamb")])
def test_a_record_older_than_adam_bias_correction_resumes_with_the_rule_it_was_trained_with(
    tmp_path, optimizer_type, trained_with
):
    """Before --adam_bias_correction, adamw was torch's bias-corrected AdamW and lamb put the trust ratio on every
    tensor: a run recorded then goes on with that rule, and a command that would change it is refused."""
    command = parse(run_pretraining.SPEC, tmp_path, f"--optimizer_type={optimizer_type}")
    write_record(None, run_pretraining.PROGRAM, command, tiny_config(), Distributed())
    path = tmp_path / RUN_RECORD
    old = json.loads(path.read_text())
    del old["args"]["adam_bias_correction"]
    path.write_text(json.dumps(old))
    resumed, _ = parse_config(run_pretraining.SPEC, [f"--output_dir={tmp_path}", "--do_train"])
    assert (resumed.train.optimizer, resumed.train.adam_bias_correction) == (trained_with, True)
    with pytest.raises(UsageError, match="this run was made with --adam_bias_correction=True, the command gives False"):
        parse_config(run_pretraining.SPEC, [f"--output_dir={tmp_path}", "--do_train", "--noadam_bias_correction"])


def test_a_squad_record_older_than_train_answer_span_resumes_with_the_character_rule(tmp_path):
    """Before --train_answer_span, run_squad's training targets were the tokens holding the answer's characters: a
    run recorded then goes on with them, and a command that would change them is refused."""
    command = parse(run_squad.SPEC, tmp_path)
    write_record(None, run_squad.PROGRAM, command, tiny_config(), Distributed())
    path = tmp_path / RUN_RECORD
    old = json.loads(path.read_text())
    del old["args"]["train_answer_span"]
    path.write_text(json.dumps(old))
    resumed, _ = parse_config(run_squad.SPEC, [f"--output_dir={tmp_path}", "--do_train"])
    assert resumed.task.train_answer_span == "characters"
    with pytest.raises(UsageError, match="this run was made with --train_answer_span=characters, the command gives"):
        parse_config(run_squad.SPEC, [f"--output_dir={tmp_path}", "--do_train", "--train_answer_span=google"])


# ---- a command given as Python values (how the demo and the benches call runners) ----------------------------------


@pytest.mark.parametrize(
    "spec, values",
    [
        (
            run_classifier.SPEC,
            {
                "task_name": "MRPC",
                "do_train": True,
                "do_lower_case": False,
                "max_seq_length": 64,
                "learning_rate": 1e-3,
                "num_train_epochs": 2,
                "amp": True,
                "save_checkpoints_secs": 0,
                "modeling": "recompute",
                "recompute_policy": "every-k",
                "init_checkpoint": None,
            },
        ),
        (
            run_pretraining.SPEC,
            {
                "input_dir": "shards",
                "do_train": True,
                "num_train_steps": 10,
                "num_accumulation_steps": 2,
                "optimizer_type": "adam",
                "use_xla": True,
            },
        ),
    ],
)
def test_values_give_the_command_their_flags_give(tmp_path, spec, values):
    common = {"output_dir": str(tmp_path), "bert_config_file": "c.json"}
    if spec is run_classifier.SPEC:
        common.update(vocab_file="v.txt", data_dir="d")
    values = {**common, **values}
    from_values, _ = config_from_values(spec, values)
    parsed, _ = parse_config(spec, as_flags(values))
    assert from_values == parsed
    assert from_values.model.modeling == values.get("modeling", "baseline")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"max_seq_lenght": 64}, "unknown flag 'max_seq_lenght' (did you mean 'max_seq_length'?)"),
        ({"max_seq_length": "64"}, "--max_seq_length: expected int, got '64'"),
        ({"max_seq_length": True}, "--max_seq_length: expected int, got True"),
        ({"do_train": 1}, "--do_train: expected bool, got 1"),
        ({"learning_rate": "fast"}, "--learning_rate: expected float, got 'fast'"),
        ({"modeling": "fast"}, "--modeling: invalid choice: 'fast' (choose from 'baseline', 'recompute')"),
        ({"max_seq_length": 0}, "--max_seq_length must be positive, got 0"),
        (
            {"max_seq_lenght": 64, "modeling": "basline", "learning_rate": "fast"},
            "unknown flag 'max_seq_lenght' (did you mean 'max_seq_length'?); --modeling: invalid choice: 'basline' "
            "(did you mean 'baseline'? choose from 'baseline', 'recompute'); --learning_rate: expected float, got 'fast'",
        ),
        (  # an unknown name leaves the others to be checked: the flags still missing too
            {"do_trian": True, "vocab_file": None, "data_dir": None},
            "unknown flag 'do_trian' (did you mean 'do_train'?); --vocab_file and --data_dir or HF's --train_file "
            "(--task_name=MRPC needs its data here: HF's run_glue downloads GLUE, bertbench never does) are required",
        ),
    ],
)
def test_bad_values_are_one_line_and_write_nothing(tmp_path, error_line, values, message):
    out = tmp_path / "run"
    given = {
        "output_dir": str(out),
        "bert_config_file": "c.json",
        "vocab_file": "v.txt",
        "data_dir": "d",
        "task_name": "MRPC",
        "do_train": True,
        **values,
    }
    assert run_classifier.SPEC.run_values(given) == 2
    assert error_line() == f"run_classifier: error: {message}" and not out.exists()


# ---- a runner's command line: either spelling, every usage error in its one line ----------------------------------

CLASSIFY = ["--bert_config_file=c", "--vocab_file=v", "--task_name=MRPC", "--data_dir=d"]


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["--output_dir=RUN", "--do_trian", *CLASSIFY],
            "unrecognized arguments: --do_trian (did you mean --do_train?); at least one of --do_train, --do_eval or "
            "--do_predict must be true",
        ),
        (
            ["--output_dir=RUN", "--do_train", "--modeling=basline", *CLASSIFY],
            "argument --modeling: invalid choice: 'basline' (did you mean 'baseline'? choose from 'baseline', "
            "'recompute')",
        ),
        (  # nothing close, nothing offered
            ["--output_dir=RUN", "--do_train", "--frobnicate=1", "--modeling=fast", *CLASSIFY],
            "unrecognized arguments: --frobnicate=1; argument --modeling: invalid choice: 'fast' (choose from "
            "'baseline', 'recompute')",
        ),
        (
            ["--output_dir=RUN", "--do_train"],
            "--bert_config_file, --vocab_file and --task_name with --data_dir (or HF's --train_file) are required",
        ),
        (
            ["--output_dir=RUN", "--do_train", "--bert_confg_file=c", "--task_name=MRPC", "--data_dir=d"],
            "unrecognized arguments: --bert_confg_file=c (did you mean --bert_config_file?); --bert_config_file and "
            "--vocab_file are required",
        ),
        (
            ["--output_dir=RUN", "--do_train", "--max_seq_length=0", "--train_batch_size=-1", *CLASSIFY],
            "--max_seq_length must be positive, got 0; --train_batch_size must be positive, got -1",
        ),
        (
            ["--do-trian", "--ouput-dir=RUN"],
            "unrecognized arguments: --do-trian (did you mean --do_train?) --ouput-dir=RUN (did you mean "
            "--output_dir?); the following arguments are required: --output_dir",
        ),
        (
            ["--output-dir=RUN", "--do_trian", "--learning-rate=fast", "--modeling=basline", "--max-seq-length"],
            "unrecognized arguments: --do_trian (did you mean --do_train?); argument --learning_rate: invalid float "
            "value: 'fast'; argument --modeling: invalid choice: 'basline' (did you mean 'baseline'? choose from "
            "'baseline', 'recompute'); argument --max_seq_length: expected one argument",
        ),
    ],
)
def test_every_usage_error_of_a_runner_is_in_its_one_line_and_nothing_is_written(argv, line, tmp_path, error_line):
    """In this order: unknown flags (with the closest one), refused values, what argparse finds missing; then, when
    every flag given was read, the runner's own checks (the flags a run record or an HF directory did not fill)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("the user's")
    before = snapshot(run)
    assert run_classifier.main([arg.replace("RUN", str(run)) for arg in argv]) == 2
    assert error_line() == f"run_classifier: error: {line.replace('RUN', str(run))}"
    assert snapshot(run) == before


def test_a_flag_in_either_spelling_is_the_same_flag(tmp_path):
    """--help shows one spelling; `-` for `_` names the same flag, a boolean's --no-flag and --no_flag are --noflag."""
    flags = {"learning_rate": "1e-4", "max_seq_length": "64", "recompute_policy": "every-k", "json_summary": "s.json"}
    declared, _ = parse_config(
        run_classifier.SPEC,
        [f"--output_dir={tmp_path}", *CLASSIFY, "--do_train", "--nodo_lower_case", "--no_cuda"]
        + [f"--{name}={value}" for name, value in flags.items()],
    )
    for negations in (["--no-do-lower-case", "--no-cuda"], ["--no_do_lower_case", "--nocuda"]):
        respelt = [f"--{name.replace('_', '-')}" for name in flags]
        spelt, _ = parse_config(
            run_classifier.SPEC,
            [f"--output-dir={tmp_path}", *CLASSIFY, "--do-train", *negations]
            + [arg for option, value in zip(respelt, flags.values(), strict=True) for arg in (option, value)],
        )
        assert spelt == declared
    assert (declared.task.do_lower_case, declared.task.device, declared.args["learning_rate"]) == (False, "cpu", 1e-4)
