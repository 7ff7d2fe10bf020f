"""`bertbench bench optimizer`: files and rows in the result schema on the CPU with a tiny model, the floors at a
bandwidth fed in or at STREAM's best rate, a step below its floor never printed as a ratio, STREAM's kernels and bytes,
bad flags refused before anything is written; on a GPU, the fused paths run and the fused LAMB is the eager one."""

import copy
import re

import pytest
import torch
from helpers import tiny_config

from bertbench.bench import bandwidth, cli, measure, optimizer
from bertbench.bench.results import BenchResult, Ratio, Spread
from bertbench.model import modeling
from bertbench.training import optim


def run(tmp_path, *flags):
    return cli.main(
        ["optimizer", "--model", "tiny", "--output_dir", str(tmp_path), "--warmup", "0", "--steps", "2", *flags]
    )


def known_step_times(steps, warmup, repeats, device):
    """A clock of known step times: every optimizer step takes 2 ms, then 4 ms (a median of 3 ms)."""
    return {name: [0.002, 0.004] for name in steps}


def test_writes_a_row_per_optimizer_with_floors_at_the_given_bandwidth(tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "time_steps", known_step_times)
    flags = ["--device", "cpu", "--optimizers", "adamw,lamb:eager", "--bandwidth_gbs", "100", "--step_ms", "50"]
    assert run(tmp_path, *flags) == 0
    result = BenchResult.read(str(tmp_path / "optimizer.json"))
    assert (tmp_path / "optimizer.md").exists() and (tmp_path / "optimizer-steps.png").stat().st_size > 0
    assert [row.get("optimizer") for row in result.rows] == ["adamw:fused", "adamw:eager", "lamb:eager"]
    # BERT-tiny for pre-training: 2 layers of hidden 64, vocabulary 1024 (counted here from the config by hand)
    hidden, layers, inner, vocab, positions = 64, 2, 256, 1024, 512
    embeddings = (vocab + positions + 2) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden + hidden * inner + inner + inner * hidden + hidden + 2 * hidden
    heads = hidden * hidden + hidden + hidden * hidden + hidden + 2 * hidden + vocab + hidden * 2 + 2
    parameters = embeddings + layers * layer + heads
    assert result.context["bandwidth"] == Spread.exact(100e9) and result.context["bandwidth_source"] == "given"
    for row in result.rows:
        assert (row.measured, row.unit, set(row.setting)) == ("step_ms", "ms", {"optimizer", "rule", "form"})
        assert row.get("parameters") == parameters
        # 28 bytes a parameter at 100 GB/s: 208,130 parameters x 0.28 ns = 0.0582764 ms
        assert row.get("floor_ms") == pytest.approx(0.0582764)
        assert row.get("rule_bytes_per_parameter") == (32 if row.get("rule") == "adamw" else 44)
        assert (row.value.median, row.value.min, row.value.max, row.value.n) == pytest.approx((3.0, 2.0, 4.0, 2))
        assert isinstance(row.get("ratio_to_floor"), Ratio)
        assert row.median("ratio_to_floor") == pytest.approx(51.4788)  # 3 ms / 0.0582764 ms
        assert row.get("ratio_to_floor").inputs_cv == row.value.cv
        assert row.get("share_of_step") == pytest.approx(0.06)  # 3 ms of --step_ms 50
    assert (
        "| adamw:fused | 3.00 (2.00–4.00, CV 47%) | 0.06 | 51.48x (noisy: inputs' CV 47%) |"
        in (tmp_path / "optimizer.md").read_text()
    )


def test_a_step_faster_than_its_floor_is_never_printed_as_a_ratio(tmp_path, monkeypatch, capsys):
    # a bandwidth far below the machine's: 1 GB/s puts adamw's floors at 5.83 ms (28 B) and 6.66 ms (32 B), and its
    # fastest step, 2 ms, beats both; lamb's steps, 10 and 12 ms, sit above its rule floor of 9.16 ms (44 B)
    monkeypatch.setattr(
        measure,
        "time_steps",
        lambda steps, warmup, repeats, device: {
            name: [0.002, 0.009] if name.startswith("adamw") else [0.010, 0.012] for name in steps
        },
    )
    flags = ["--device", "cpu", "--optimizers", "adamw:eager,lamb:eager", "--bandwidth_gbs", "1"]
    assert run(tmp_path, *flags) == 0
    out = capsys.readouterr().out
    rows = {row.get("optimizer"): row for row in BenchResult.read(str(tmp_path / "optimizer.json")).rows}
    adamw, lamb = rows["adamw:eager"], rows["lamb:eager"]
    assert adamw.get("ratio_to_floor") is None and adamw.get("ratio_to_rule_floor") is None
    assert lamb.median("ratio_to_floor") == pytest.approx(11 / 5.827640) and lamb.median("ratio_to_rule_floor") > 1
    warning = "1 of 2 optimizer steps ran faster than a floor (adamw:eager took 2.00 ms, under its 28 B/parameter "
    assert out.count(warning) == 1 and "1.0 GB/s (given: --bandwidth_gbs)" in out
    markdown = (tmp_path / "optimizer.md").read_text()
    assert markdown.count(f"| {optimizer.BELOW_FLOOR} |") == 2 and warning in markdown
    ratios = re.findall(r"\| ([0-9.]+)x", markdown)  # every ratio the table prints is 1 or more
    assert ratios and all(float(ratio) >= 1 for ratio in ratios)


def test_the_bandwidth_is_the_best_rate_of_streams_fastest_kernel_timed_with_the_steps(tmp_path, monkeypatch):
    timed = {}

    def times(steps, warmup, repeats, device):
        timed.update(steps)
        # the triad moves 3 arrays, the copy 2: at these times the triad's best rate is the highest
        kernel_seconds = {"copy": [0.02, 0.03], "scale": [0.03, 0.03], "add": [0.04, 0.05], "triad": [0.025, 0.05]}
        return {name: kernel_seconds.get(name.removeprefix(optimizer.STREAM_PREFIX), [0.004, 0.004]) for name in steps}

    monkeypatch.setattr(measure, "time_steps", times)
    monkeypatch.setattr(bandwidth, "array_bytes", lambda device: 2**20)
    assert run(tmp_path, "--device", "cpu", "--optimizers", "adamw:fused") == 0
    assert set(timed) == {"adamw:fused", *(optimizer.STREAM_PREFIX + kernel for kernel in bandwidth.ARRAYS_MOVED)}
    result = BenchResult.read(str(tmp_path / "optimizer.json"))
    context = result.context
    assert context["bandwidth_source"] == "STREAM" and context["stream_kernel"] == "triad"
    assert context["bandwidth"].max == context["bandwidth_bytes_per_second"] == pytest.approx(3 * 2**20 / 0.025)
    assert context["bandwidth"].median == pytest.approx(3 * 2**20 / 0.0375) and context["stream_array_bytes"] == 2**20
    assert context["stream"]["copy"].max == pytest.approx(2 * 2**20 / 0.02)
    (row,) = result.rows
    assert row.get("floor_ms") == pytest.approx(1e3 * row.get("parameters") * 28 / context["bandwidth"].max)
    assert "measured as STREAM does: arrays of 1 MiB each" in (tmp_path / "optimizer.md").read_text()


def test_stream_kernels_compute_streams_arrays_in_place_and_count_its_bytes():
    stream = bandwidth.Stream(torch.device("cpu"), 4096)  # 1024 fp32 elements an array
    assert stream.size_bytes == 4096
    assert {kernel: stream.bytes_moved(kernel) for kernel in bandwidth.ARRAYS_MOVED} == {
        "copy": 2 * 4096,  # read a, write c
        "scale": 2 * 4096,  # read c, write b
        "add": 3 * 4096,  # read a and b, write c
        "triad": 3 * 4096,  # read b and c, write a
    }
    storage = [array.data_ptr() for array in (stream.a, stream.b, stream.c)]
    a, b, c = 1.0, 2.0, 0.0
    for kernel, call in stream.kernels().items():  # STREAM's order, as its own validation replays it
        call()
        if kernel == "copy":
            c = a
        elif kernel == "scale":
            b = bandwidth.SCALAR * c
        elif kernel == "add":
            c = a + b
        else:
            a = b + bandwidth.SCALAR * c
    assert [array.data_ptr() for array in (stream.a, stream.b, stream.c)] == storage  # nothing allocated
    for array, value in zip((stream.a, stream.b, stream.c), (a, b, c)):
        assert torch.equal(array, torch.full_like(array, value))
    rates = stream.rates({"copy": [0.001, 0.002], "triad": [0.004]})
    assert rates["copy"].max == 8192 / 0.001 and rates["triad"].median == 3 * 4096 / 0.004
    assert bandwidth.fastest(rates) == "copy"


def test_the_cache_size_sets_the_arrays(monkeypatch):
    monkeypatch.setattr(bandwidth, "last_level_cache_bytes", lambda device: 32 * 2**20)
    assert bandwidth.array_bytes(torch.device("cpu")) == 128 * 2**20
    monkeypatch.setattr(bandwidth, "last_level_cache_bytes", lambda device: None)
    assert bandwidth.array_bytes(torch.device("cpu")) == bandwidth.MIN_ARRAY_BYTES


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--optimizers", "sgd"], "--optimizers: unknown optimizer 'sgd'"),
        (["--optimizers", "lamb:fast"], "--optimizers: unknown optimizer 'lamb:fast'"),
        (["--bandwidth_gbs", "0"], "--bandwidth_gbs must be positive"),
        (["--step_ms", "-1"], "--step_ms must be positive"),
        (["--warmup", "-1"], "--warmup must be 0 or more"),
        (["--steps", "x"], "--steps: invalid int value: 'x'"),
        (["--model", "huge"], "unknown model 'huge'"),
        (["--device", "nowhere"], "--device 'nowhere'"),
    ],
)
def test_bad_flags_are_refused_before_anything_is_written(tmp_path, capsys, flags, message):
    assert run(tmp_path / "out", "--device", "cpu", *flags) == 2
    error = capsys.readouterr().err
    assert message in error and len(error.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_refuses_to_overwrite(tmp_path, capsys):
    (tmp_path / "optimizer.json").write_text("{}")
    assert run(tmp_path, "--device", "cpu", "--optimizers", "adamw:eager", "--bandwidth_gbs", "1") == 2
    assert "--overwrite" in capsys.readouterr().err
    assert (tmp_path / "optimizer.json").read_text() == "{}"


@pytest.mark.gpu
def test_on_cuda_the_fused_paths_run_and_fused_lamb_is_the_eager_one(tmp_path):
    assert run(tmp_path, "--device", "cuda") == 0
    rows = BenchResult.read(str(tmp_path / "optimizer.json")).rows
    assert {row.get("optimizer") for row in rows} == {
        f"{rule}:{form}" for rule in optimizer.RULES for form in optimizer.FORMS
    }
    for name in ("lamb", "nvlamb"):
        torch.manual_seed(0)
        model = modeling.BertForSequenceClassification(tiny_config(), num_labels=2).cuda()
        twins = {fused: copy.deepcopy(model) for fused in (False, True)}
        optimizers = {fused: optim.build_optimizer(twins[fused], name, 1e-2, fused=fused) for fused in twins}
        assert optim.build_optimizer(model, name, 1e-2)._fused_here()  # the default on a GPU
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        for step in range(4):
            grads = [(step + 1) * torch.randn_like(parameter) for parameter in model.parameters()]
            for fused, twin in twins.items():
                for parameter, grad in zip(twin.parameters(), grads):
                    parameter.grad = grad.clone()
                optim.clip_and_step(optimizers[fused], twin.parameters(), 1.0, scaler)
        for (key, eager), fused in zip(twins[False].named_parameters(), twins[True].parameters()):
            torch.testing.assert_close(fused, eager, rtol=1e-6, atol=1e-7, msg=key)
