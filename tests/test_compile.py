"""torch.compile (the original --use_xla) and fp16 where they cannot apply.

The training step as users run it traces to one graph, with no break in bertbench's code, for every head and every
modeling module and recompute policy, padded or not, on the padded path; on the unpadded path it breaks at the
packing only, and stops recompiling once the batches' sizes have varied. The compiled step computes what the eager
one does. On a CPU, fp16 trains in fp32 and a run without a C++ compiler trains eagerly, each with a one-line note;
train_results.json says what ran, and the same command resumes the run.
"""

import dataclasses
import functools
import json
import platform
import re

import pytest
import torch
from helpers import classifier_flags, tiny_batch, tiny_config, write_bert_dir
from torch._dynamo.utils import counters

from bertbench.model.factory import build_model
from bertbench.runners.classifier import main
from bertbench.tasks.synthetic import synthetic_batch, write_glue_task
from bertbench.training import devices
from bertbench.training.batches import ShuffledBatches
from bertbench.training.config import RunConfig, TrainConfig
from bertbench.training.loop import Estimator
from bertbench.training.step import TrainStep, fallbacks, slow_here

CONFIG = tiny_config(hidden_size=32, intermediate_size=64)
# One block where the policy needs no second one: the traced graph grows with the blocks, and a graph break, a
# recompile or a wrong gradient in a block's code shows in its first.
ONE_BLOCK = dataclasses.replace(CONFIG, num_hidden_layers=1)
VARIANTS = {
    "baseline": ("baseline", "full"),
    "full": ("recompute", "full"),
    "every-2": ("recompute", "every-k"),
    "selective": ("recompute", "selective"),
}


def batch(task, padded, config=CONFIG):
    """Two sequences of 16 tokens with the labels of `task`; `padded`: the second ends in 3 padding tokens."""
    input_ids, token_type_ids, attention_mask = tiny_batch(config, batch=2, seq=16)
    values = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask if padded else torch.ones_like(attention_mask),
    }
    if task == "classification":
        values["labels"] = torch.tensor([0, 1])
    elif task == "question_answering":
        values.update(start_positions=torch.tensor([1, 4]), end_positions=torch.tensor([3, 9]))
    else:
        values.update(
            masked_lm_positions=torch.tensor([[1, 5, 9], [2, 3, 0]]),
            masked_lm_labels=torch.tensor([[7, 8, 9], [10, 11, -100]]),
            next_sentence_labels=torch.tensor([0, 1]),
        )
    return values


def batch_of_lengths(task, lengths):
    """batch(task) with sequences of `lengths` real tokens (of 16)."""
    values = batch(task, padded=True)
    values["attention_mask"] = (torch.arange(16)[None, :] < torch.tensor(lengths)[:, None]).long()
    return values


def model(task, variant, config=None, unpad=True):
    """`task`'s model of `variant`, of one block but for every-2, whose every second block is checkpointed."""
    torch.manual_seed(0)
    config = config or (CONFIG if variant == "every-2" else ONE_BLOCK)
    modeling_name, policy = VARIANTS[variant]
    return build_model(
        task, config, modeling_name, policy, unpad=unpad, **({"num_labels": 2} if task == "classification" else {})
    )


@pytest.fixture
def traced_by_aot_eager(monkeypatch):
    """torch.compile as the step calls it, dynamo's graph run through AOTAutograd eagerly: the tracing and the joint
    forward/backward graph (checkpointed blocks included) are what inductor gets, without its C++ compile."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


# Every piece of bertbench's model code, each traced once, in fewer runs than the whole grid. On the padded path: the
# classification and question-answering heads with the baseline blocks; the pre-training heads with every-2, whose
# blocks are full's checkpointed block (0) and the baseline's (1), so neither full nor the baseline under those heads
# is traced again; selective's blocks under bf16 and under fp16 autocast (fp16 with the loss scaler), the fp32 forward
# being the other padded cases'. On the unpadded path, the heads that read the packing (question answering's padding
# mask) or the sequence output (pre-training), under the policies that checkpoint blocks whole and in part, one of
# them under autocast; test_modeling compiles the classifier's unpadded forward.
@pytest.mark.slow
@pytest.mark.parametrize(
    "task, variant, precision, unpad",
    [("classification", "baseline", "fp32", False), ("question_answering", "baseline", "fp32", False)]
    + [("pretraining", "every-2", "fp32", False)]
    + [("pretraining", "selective", "bf16", False), ("pretraining", "selective", "fp16", False)]
    + [("question_answering", "every-2", "bf16", True), ("pretraining", "selective", "fp32", True)],
)
def test_the_compiled_training_step_is_one_graph(traced_by_aot_eager, task, variant, precision, unpad):
    # Two micro-batches, padded then not: the padding check is eager-only, so both take the same path (and on the
    # padded path the same graph). TrainStep runs fp16 as its config says (the runners apply step.fallbacks before it),
    # so autocast to it is traced too.
    step = TrainStep(
        model(task, variant, unpad=unpad),
        TrainConfig(num_train_steps=10, compile=True, precision=precision, gradient_accumulation_steps=2),
    )
    outcome = step(iter([batch(task, padded=True), batch(task, padded=False)]))
    assert torch.isfinite(outcome.loss)
    if not unpad:
        assert dict(counters["graph_break"]) == {}
        assert counters["stats"]["unique_graphs"] == 1
        return
    # The packing comes with the batch, made on the host from the mask: the unpadded step is one graph too.
    assert dict(counters["graph_break"]) == {}
    if variant != "selective":  # the recompiles below are the same for every head and policy: checked once
        return
    # The first changes of the packing's sizes (rows, the batch's width, below the sequence length or at it) make
    # them dynamic; then new lengths (a sequence of one token, full ones) trace nothing new: no recompile per batch.
    for lengths in ((16, 9), (5, 12)), ((16, 1), (7, 3)):
        assert torch.isfinite(step(iter([batch_of_lengths(task, pair) for pair in lengths])).loss)
    warmed = counters["stats"]["unique_graphs"]
    assert warmed <= 4, warmed  # the padded path's, and the unpadded path's static and dynamic ones
    for lengths in ((2, 11), (14, 16)), ((13, 4), (16, 2)):
        assert torch.isfinite(step(iter([batch_of_lengths(task, pair) for pair in lengths])).loss)
    assert counters["stats"]["unique_graphs"] == warmed and dict(counters["graph_break"]) == {}


@pytest.mark.slow
def test_bucketed_varlen_packings_trace_through_batch_and_bucket_changes(traced_by_aot_eager):
    """The packings a GPU's CUDA graphs get (varlen, rows bucketed with filler sequences), traced as the compiled
    step traces them: the batch size and the buckets change and become dynamic, and the step keeps training with no
    graph break."""
    torch.manual_seed(0)
    step = TrainStep(
        build_model("classification", ONE_BLOCK, attention_kernel="varlen", num_labels=2),
        TrainConfig(num_train_steps=10, compile=True),
    )
    step.packer = dataclasses.replace(step.packer, bucketed=True)
    for lengths in ((16, 9), (5, 12), (16, 3, 7, 11), (2, 13, 16)):
        values = synthetic_batch(ONE_BLOCK, "finetuning", len(lengths), 16, lengths=lengths)
        assert step.prepare(values)["packing"].bucketed
        assert torch.isfinite(step(iter([values])).loss)
    assert dict(counters["graph_break"]) == {}


# every-2 is full's blocks and baseline's; on the unpadded path, the selective policy's tags over the baseline's blocks
@pytest.mark.parametrize(
    "variant, unpad", [("baseline", False), ("full", False), ("selective", False), ("selective", True)]
)
def test_compiled_and_eager_gradients_agree(variant, unpad):
    """Through inductor's decompositions and its partitioner, which decides what the backward saves and what it
    recomputes (for the selective policy, from the policy's tags): everything but inductor's code generation. On the
    unpadded path the compiled model runs torch.compile's attention kernel, the eager one the CPU's."""
    config = dataclasses.replace(ONE_BLOCK, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    eager, compiled = model("pretraining", variant, config, unpad), model("pretraining", variant, config, unpad)
    torch._dynamo.reset()
    traced = torch.compile(compiled, backend="aot_eager_decomp_partition")
    for padded in (True, False):
        expected, got = eager(**batch("pretraining", padded, config)), traced(**batch("pretraining", padded, config))
        torch.testing.assert_close(got.mlm_logits, expected.mlm_logits, rtol=1e-5, atol=1e-6)
        got.loss.backward()
        expected.loss.backward()
    for (name, reference), (_, parameter) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(parameter.grad, reference.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.fixture
def no_cxx(monkeypatch):
    """Inductor's C++ compiler search finds none: it raises as it does when neither config.cpp.cxx, $CXX nor g++
    names a compiler."""
    from torch._inductor import cpp_builder, exc

    def no_compiler():
        raise exc.InvalidCxxCompiler()

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)


def test_fp16_on_a_cpu_trains_in_fp32_and_says_so():
    (change,) = fallbacks(TrainConfig(num_train_steps=1, precision="fp16"), torch.device("cpu"))
    assert (change.field, change.value) == ("precision", "fp32")
    assert change.note == "fp16 needs a CUDA GPU; on cpu this run trains in fp32 (--precision=fp32 to say so)"
    for precision in ("fp32", "bf16"):
        assert fallbacks(TrainConfig(num_train_steps=1, precision=precision), "cpu") == []
    assert fallbacks(TrainConfig(num_train_steps=1, precision="fp16"), torch.device("cuda", 1)) == []


@pytest.fixture
def cpu_named(monkeypatch):
    """The CPU's name and feature flags as devices.cpu_features reads them, set by the test."""

    def set_cpu(name: str, *flags: str) -> None:
        monkeypatch.setattr(devices, "cpu_features", lambda: (name, set(flags)))

    return set_cpu


def test_bf16_on_a_cpu_without_a_bf16_unit_trains_as_asked_and_says_it_is_slow(cpu_named):
    """bf16 runs as asked everywhere (no fallback); on a CPU whose matmuls would be emulated the run says so, naming
    the CPU and what it has. With AMX or AVX-512 BF16, or where the features cannot be read, nothing is said."""
    bf16 = TrainConfig(num_train_steps=1, precision="bf16")
    cpu_named("AMD EPYC", "avx", "avx2", "fma3")
    assert fallbacks(bf16, "cpu") == []
    assert slow_here(bf16, "cpu") == [
        "--precision=bf16: this CPU (AMD EPYC: AVX2) has no bf16 matmul unit (AMX or AVX-512 BF16), so bf16 matmuls "
        "run emulated, many times slower than fp32 (--precision=fp32 trains faster here)"
    ]
    assert slow_here(dataclasses.replace(bf16, precision="fp32"), "cpu") == []
    assert slow_here(bf16, torch.device("cuda", 0)) == []
    for flags in (("avx2", "avx512_f", "avx512_bf16"), ("avx2", "amx_tile", "amx_bf16"), ()):
        cpu_named("Intel Xeon", *flags)
        assert slow_here(bf16, "cpu") == [], flags


def test_the_cpu_features_are_read():
    name, flags = devices.cpu_features()
    assert name and flags
    if platform.machine() in ("x86_64", "AMD64"):
        assert {"sse2", "avx"} <= flags


def test_compile_without_a_cxx_compiler_trains_eagerly_and_says_so(no_cxx):
    (change,) = fallbacks(TrainConfig(num_train_steps=1, compile=True), torch.device("cpu"))
    assert (change.field, change.value) == ("compile", False)
    assert change.note.startswith("torch.compile cannot run here (inductor finds no C++ compiler")


def test_a_checkpoint_without_loss_scaling_resumes_under_fp16():
    """fp16 asked for on a CPU trains in fp32, so its checkpoints hold no loss scale: an fp16 step resuming one (on a
    GPU) starts from the initial scale, as a new fp16 run does, where GradScaler alone refuses the empty state. An
    fp16 checkpoint still restores its scale, and an fp32 step resuming it leaves the scale out."""

    def step(precision):
        return TrainStep(torch.nn.Linear(2, 2), TrainConfig(num_train_steps=10, precision=precision))

    fp16 = step("fp16")
    fp16.load_state_dict(step("fp32").state_dict())
    assert fp16.scaler.get_scale() == step("fp16").scaler.get_scale()
    saved = fp16.state_dict()
    saved["scaler"]["scale"] /= 4  # lowered by overflows
    resumed = step("fp16")
    resumed.load_state_dict(saved)
    assert resumed.scaler.get_scale() == saved["scaler"]["scale"]
    step("fp32").load_state_dict(saved)


@pytest.fixture
def mrpc(tmp_path):
    write_glue_task(tmp_path / "glue", "MRPC", train=64, dev=16, test=8)
    write_bert_dir(tmp_path / "bert")
    return tmp_path


def test_the_runner_notes_what_runs_instead_records_it_and_resumes(mrpc, no_cxx, capsys):
    out = mrpc / "run"
    command = classifier_flags(mrpc, out, "--do_train", "--num_train_epochs=1", "--precision=fp16", "--use_xla=true")
    assert main(command + ["--max_train_seconds=1e-6"]) == 0  # stops after its first step
    first = capsys.readouterr()
    notes = [line for line in first.out.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: fp16 needs a CUDA GPU; on cpu this run trains in fp32 (--precision=fp32 to say so)",
        "note: torch.compile cannot run here (inductor finds no C++ compiler; install g++ or set CXX); "
        "this run trains eagerly (--use_xla=false to say so)",
    ]
    assert "fp32 on cpu" in first.out and first.err == ""
    train = json.loads((out / "train_results.json").read_text())
    assert (train["precision"], train["use_xla"], train["global_step"]) == ("fp32", False, 1)
    # The record keeps the command's flags, so the same command continues the run.
    args = json.loads((out / "bertbench_run.json").read_text())["args"]
    assert (args["precision"], args["use_xla"]) == ("fp16", True)
    assert main(command) == 0
    second = capsys.readouterr()
    assert f"resumed from {out}/ckpt-000000001.pt (step 1" in second.out and second.err == ""
    train = json.loads((out / "train_results.json").read_text())
    assert (train["precision"], train["use_xla"], train["global_step"]) == ("fp32", False, 4)


def test_a_bf16_run_on_a_cpu_without_a_bf16_unit_says_so_in_its_first_lines(mrpc, cpu_named, capsys):
    cpu_named("AMD EPYC", "avx", "avx2")
    out = mrpc / "run"
    command = classifier_flags(mrpc, out, "--do_train", "--num_train_epochs=1", "--precision=bf16")
    assert main(command + ["--max_train_seconds=1e-6"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(index for index, line in enumerate(lines) if line.startswith("***** Training"))
    assert [line for line in lines[:header] if line.startswith("note: ")] == [
        "note: " + slow_here(TrainConfig(num_train_steps=1, precision="bf16"), "cpu")[0]
    ]
    assert "bf16 on cpu" in lines[header]
    assert json.loads((out / "train_results.json").read_text())["precision"] == "bf16"


def test_a_compiled_run_on_a_cpu_says_what_compiling_costs_and_times_the_first_step(tmp_path, monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda model, **options: model)  # the run's lines, not inductor's minutes
    input_ids, token_type_ids, attention_mask = tiny_batch(CONFIG, batch=8)
    data = {
        "input_ids": input_ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "labels": torch.arange(8) % 2,
    }
    lines = []
    estimator = Estimator(
        build_model("classification", CONFIG, num_labels=2),
        RunConfig(str(tmp_path), save_checkpoints_secs=None, log_step_count_steps=10),
        TrainConfig(num_train_steps=2, compile=True),
        log=lines.append,
    )
    estimator.train(ShuffledBatches(data, 4, seed=0))
    assert (
        lines[0].startswith("note: torch.compile on a CPU takes minutes")
        and "docs/results/cpu-2core/compile" in lines[0]
    )
    assert lines[1] == "step 1: compiling the model (torch.compile) ..."
    assert re.fullmatch(r"step 1: compiled and trained in \d+\.\d s", lines[2])
    assert not any("compil" in line for line in lines[3:])
