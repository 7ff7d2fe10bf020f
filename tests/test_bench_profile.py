"""`bertbench bench profile` on a tiny BERT on the CPU, and the op categorisation it reports."""

import json
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from bertbench.bench import profile, workload
from bertbench.bench.results import BenchResult
from bertbench.model import attention, flops
from bertbench.model.packing import Packing

TINY = [
    "--model",
    "tiny",
    "--batch_size",
    "2",
    "--max_seq_length",
    "32",
    "--warmup",
    "1",
    "--steps",
    "2",
    "--device",
    "cpu",
    "--threads",
    "1",
]
# Every aten op of the step is in the table: which ones lead it depends on the machine's load (preemption can push a
# view or a sqrt above the matmuls), what they add up to does not.
TOP = 1000


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """One tiny profile run shared by the tests that only read its files; its directory does not exist yet."""
    directory = tmp_path_factory.mktemp("profile") / "run"
    assert profile.main([*TINY, "--top", str(TOP), "--output_dir", str(directory)]) == 0
    return directory, BenchResult.read(str(directory / "profile.json"))


def measuring(result: BenchResult, measured: str, key: str) -> dict:
    """The rows measuring `measured`, by their setting `key` (category, operator)."""
    return {row.get(key): row for row in result.rows_measuring(measured)}


def test_trace_is_chrome_json_with_matmul_events(profiled):
    directory, result = profiled
    assert result.context["trace"] == "profile-trace.json"
    with open(directory / "profile-trace.json") as handle:
        names = {event.get("name") for event in json.load(handle)["traceEvents"]}
    assert names & {"aten::mm", "aten::addmm"}
    assert not [name for name in os.listdir(directory) if name.endswith(".tmp")]


def counted_flops() -> dict[str, int]:
    """FLOPs of the profiled step's forward and backward (pretraining, batch 2, seq 32), counted by PyTorch's
    FlopCounterMode."""
    config = workload.bert_config("tiny", 32)
    model = workload.build(config, "pretraining", workload.Variant.parse("baseline"))
    with FlopCounterMode(display=False) as counter:
        model(**workload.synthetic_batch(config, "pretraining", 2, 32)).loss.backward()
    return {str(op): count for op, count in counter.get_flop_counts()["Global"].items()}


def test_flops_and_categories(profiled):
    _, result = profiled
    counted = counted_flops()
    (step,) = result.rows_measuring("step_seconds")
    assert step.setting == {
        "model": "tiny",
        "kind": "pretraining",
        "variant": "baseline",
        "precision": "fp32",
        "batch_size": 2,
        "max_seq_length": 32,
        "lengths": "full",
    }
    assert step.get("model_flops_per_step") == sum(counted.values())
    assert step.get("attention_flops_per_step") == counted["aten.bmm"]  # scores and mix, forward and backward
    categories = measuring(result, "category_seconds_per_step", "category")
    assert list(categories) == ["matmul", "attention", "dropout", "norm_activation", "optimizer", "other"]
    assert categories["matmul"].median() > 0 and categories["attention"].median() > 0
    assert sum(row.get("share") for row in categories.values()) == pytest.approx(1)
    assert all(step.get(f"{name}_share") == row.get("share") for name, row in categories.items())
    # the dense layers' FLOPs (all but the attention's bmm) over the time of the ops categorised as matmul, not over
    # the whole step
    assert step.get("matmul_tflops_per_s") * 1e12 * categories["matmul"].median() == pytest.approx(
        sum(count for op, count in counted.items() if op != "aten.bmm")
    )
    # addmm and mm are matmuls wherever they run: all their self time is in the matmul category
    operators = measuring(result, "operator_seconds_per_step", "operator")
    dense = operators["aten::addmm"].median() + operators["aten::mm"].median()
    assert 0 < dense <= categories["matmul"].median() * (1 + 1e-9)
    # self times are disjoint parts of the profiled steps: together at most the step's time
    operator_seconds = sum(row.median() for row in categories.values())
    assert operator_seconds == pytest.approx(step.get("operator_share_of_step") * step.get("mean_step_seconds"))
    assert 0 < step.get("operator_share_of_step") <= 1.01
    # the profiled steps' spread: two steps, their median between their min and max
    assert step.value.n == 2 and step.value.min <= step.value.median <= step.value.max


def test_top_operators_sorted_by_self_time(profiled):
    directory, result = profiled
    rows = result.rows_measuring("operator_seconds_per_step")
    assert len({row.get("operator") for row in rows}) == len(rows) > 20  # every aten op of a training step, once
    seconds = [row.get("self_seconds") for row in rows]
    assert seconds == sorted(seconds, reverse=True)
    assert all(row.get("operator").startswith("aten::") and row.get("calls") > 0 for row in rows)
    markdown = (directory / "profile.md").read_text()
    assert "| operator | calls | self ms | share of step | ms per step |" in markdown
    # the profiled steps' range beside their mean
    (step,) = result.rows_measuring("step_seconds")
    spread = step.value.scaled(1e3)
    assert f"the steps: {spread.median:.1f} ({spread.min:.1f}–{spread.max:.1f}, CV " in markdown
    assert all(f"| {row.get('operator')} |" in markdown for row in rows)
    assert (directory / "profile-categories.png").stat().st_size > 0


def test_top_operators_are_the_aten_ops_of_most_self_time():
    def average(key, count, self_us):
        return SimpleNamespace(key=key, count=count, self_cpu_time_total=self_us, self_device_time_total=0)

    averages = [
        average("aten::add", 8, 1000),
        average("ProfilerStep#1", 1, 9000),
        average("aten::mm", 4, 3000),
        average("aten::gelu", 2, 2000),
    ]
    rows = profile.top_operators(averages, device_time=False, steps=2, profiled_seconds=0.01, top=2)
    assert [(row["name"], row["calls"]) for row in rows] == [("aten::mm", 4), ("aten::gelu", 2)]
    # mm: 3 ms in 2 steps of 10 ms in all; gelu: 2 ms
    figures = [row[key] for row in rows for key in ("self_seconds", "seconds_per_step", "step_share")]
    assert figures == pytest.approx([0.003, 0.0015, 0.3, 0.002, 0.001, 0.2])


def test_refuses_to_overwrite_and_leaves_files_alone(profiled, capsys):
    directory, _ = profiled
    before = {name: (directory / name).read_bytes() for name in os.listdir(directory)}
    assert profile.main([*TINY, "--output_dir", str(directory)]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and error.startswith("bertbench bench profile: error: ")
    assert f"{directory}{os.sep}profile" in error and "exists" in error
    assert {name: (directory / name).read_bytes() for name in os.listdir(directory)} == before


def test_existing_trace_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    trace = tmp_path / "profile-trace.json"
    trace.write_text("earlier trace")

    def no_work(*args, **kwargs):
        raise AssertionError("the step was built although the trace exists")

    monkeypatch.setattr(workload, "train_step", no_work)
    assert profile.main([*TINY, "--output_dir", str(tmp_path)]) == 2
    assert str(trace) in capsys.readouterr().err
    assert trace.read_text() == "earlier trace"


def test_overwrite_replaces_the_trace(tmp_path):
    trace = tmp_path / "profile-trace.json"
    trace.write_text("earlier trace")
    assert profile.main([*TINY, "--warmup", "0", "--steps", "1", "--output_dir", str(tmp_path), "--overwrite"]) == 0
    assert "traceEvents" in json.loads(trace.read_text())
    assert (tmp_path / "profile.json").exists() and (tmp_path / "profile.md").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--batch_size", "0"], "--batch_size must be positive, got 0"),
        (["--steps", "0"], "--steps must be at least 1, got 0"),
        (["--warmup", "-1"], "--warmup must be 0 or more, got -1"),
        (["--variant", "every-0"], "--variant: unknown variant 'every-0'"),
        (["--precision", "fp8"], "--precision: invalid choice: 'fp8'"),
        (["--lengths", "no-such-file"], "--lengths no-such-file: neither full, real-text nor a readable file"),
    ],
)
def test_bad_flags_are_usage_errors(flags, message, tmp_path, capsys):
    # argparse's refusals exit from the parser, the settings' own checks return the status: both 2, in one line
    try:
        status = profile.main([*TINY, *flags, "--output_dir", str(tmp_path)])
    except SystemExit as exit:
        status = exit.code
    assert status == 2 and message in capsys.readouterr().err
    assert not os.listdir(tmp_path)


def test_unknown_model_is_one_line_error(tmp_path, capsys):
    assert profile.main(["--model", "huge", "--output_dir", str(tmp_path)]) == 2
    assert "unknown model 'huge'" in capsys.readouterr().err
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
    "name, category",
    [
        ("aten::mm", "matmul"),
        ("aten::addmm", "matmul"),
        ("aten::bmm", "matmul"),
        ("aten::linear", "matmul"),
        ("aten::matmul", "matmul"),
        ("aten::scaled_dot_product_attention", "attention"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        ("aten::_efficient_attention_backward", "attention"),
        ("aten::_flash_attention_forward", "attention"),
        ("bertbench::varlen_attention", "attention"),
        ("bertbench::varlen_attention_backward", "attention"),
        ("bertbench::per_sequence_attention", "attention"),
        ("bertbench::per_sequence_attention_backward", "attention"),
        ("aten::native_dropout", "dropout"),
        ("aten::dropout", "dropout"),
        ("aten::native_layer_norm_backward", "norm_activation"),
        ("aten::gelu", "norm_activation"),
        ("aten::_fused_adamw_", "optimizer"),
        ("aten::_foreach_mul_", "optimizer"),
        ("aten::_amp_foreach_non_finite_check_and_unscale_", "optimizer"),
        ("Optimizer.step#AdamW.step", "optimizer"),
        ("aten::softmax", None),
        ("aten::add", None),
        ("aten::copy_", None),
        ("aten::embedding_dense_backward", None),
        ("ProfilerStep#1", None),
        ("MmBackward0", None),
        ("autograd::engine::evaluate_function: MmBackward0", None),
    ],
)
def test_op_category_by_name(name, category):
    assert profile.op_category(name) == category


def categorized(run) -> list[tuple[str, str]]:
    """(op name, category) of each aten op that `run` executes."""
    with torch.profiler.profile() as profiler:
        run()
    return [(event.name, category) for event, category in profile.categorized_ops(profiler.events())]


def test_attention_math_path_and_its_backward_count_as_attention():
    query, key, value = (torch.randn(2, 2, 8, 4, requires_grad=True) for _ in range(3))

    def attention():
        with sdpa_kernel(SDPBackend.MATH):
            F.scaled_dot_product_attention(query, key, value).sum().backward()

    ops = categorized(attention)
    bmm = [category for name, category in ops if name == "aten::bmm"]
    assert bmm == ["attention"] * 6  # scores and mix forward, two bmm each in their backward
    assert {category for name, category in ops if name == "aten::_softmax_backward_data"} == {"attention"}
    assert {category for name, category in ops if name == "aten::sum"} == {"other"}


def test_the_per_sequence_kernel_and_its_backward_count_as_attention():
    mask = torch.tensor([[1] * 5 + [0] * 3, [1] * 3 + [0] * 5, [1] * 8])
    packing = Packing.of_mask(mask, "per-sequence")
    query, key, value = (torch.randn(packing.rows, 8, requires_grad=True) for _ in range(3))
    ops = categorized(lambda: attention.attention(packing, query, key, value, 2, 0.1).sum().backward())
    assert [category for name, category in ops if name == "aten::bmm"] == ["attention"] * 6 * 3  # 3 sequences
    kernels = ("aten::_softmax", "aten::_softmax_backward_data", "aten::uniform_")
    assert {category for name, category in ops if name in kernels} == {"attention"}


def test_real_lengths_count_the_flops_of_their_tokens(tmp_path):
    """--lengths: the profiled steps go round a cycle of batches of real text's lengths, each once; the FLOPs are
    of each sequence at its real length; --seed draws them."""
    flags = ["--model", "tiny", "--kind", "finetuning", "--batch_size", "2", "--lengths", "real-text", "--seed", "3"]
    flags += ["--warmup", "0", "--steps", "2", "--device", "cpu", "--threads", "1", "--output_dir", str(tmp_path)]
    assert profile.main(flags) == 0
    result = BenchResult.read(str(tmp_path / "profile.json"))
    (step,) = result.rows_measuring("step_seconds")
    assert step.setting["lengths"] == "real-text"
    config = workload.bert_config("tiny", 128)
    real = workload.Lengths.parse("real-text").draw(4, 128, 3)  # 2 steps of 2, as train_step draws them
    assert min(real) < 128 and real != workload.Lengths.parse("real-text").draw(4, 128, 0)
    assert step.get("model_flops_per_step") == sum(flops.train_flops(config, "finetuning", n) for n in real) / 2
    assert step.get("attention_flops_per_step") == sum(3 * flops.attention_forward_flops(config, n) for n in real) / 2
    assert measuring(result, "category_seconds_per_step", "category")["attention"].median() > 0
    assert "batch 2 x seq 128, real-text lengths on cpu" in (tmp_path / "profile.md").read_text()


def test_recomputed_linear_counts_as_matmul_not_as_the_node_it_runs_in():
    linear = torch.nn.Linear(4, 4)
    hidden = torch.randn(3, 4, requires_grad=True)

    def checkpointed():
        output = checkpoint(lambda x: F.layer_norm(linear(x), (4,)), hidden, use_reentrant=False)
        output.sum().backward()

    ops = categorized(checkpointed)
    # the forward, and its recomputation inside LayerNorm's backward node
    assert [category for name, category in ops if name == "aten::addmm"] == ["matmul", "matmul"]
    assert {category for name, category in ops if name == "aten::native_layer_norm_backward"} == {"norm_activation"}


def test_gradient_accumulation_between_nodes_is_not_the_nodes_op():
    linear = torch.nn.Linear(4, 4)
    hidden = torch.randn(3, 4, requires_grad=True) * 2

    def shared_input():
        (linear(hidden) + linear(hidden)).sum().backward()

    ops = categorized(shared_input)
    # the autograd engine adds the two gradients of `hidden` after the second AddmmBackward0, inside its
    # evaluate_function range but outside the node
    assert {category for name, category in ops if name in ("aten::add", "aten::add_")} == {"other"}
