"""`bertbench bench optimizer`: files and rows on the CPU with a tiny model, the floors at a bandwidth fed in, bad
flags refused before anything is written; on a GPU, the fused paths run and the fused LAMB is the eager one."""

import copy
import json

import pytest
import torch
from helpers import tiny_config

from bertbench.bench import cli, measure, optimizer
from bertbench.model import modeling
from bertbench.training import optim


def run(tmp_path, *flags):
    return cli.main(
        ["optimizer", "--model", "tiny", "--output_dir", str(tmp_path), "--warmup", "0", "--steps", "2", *flags]
    )


def test_writes_a_row_per_optimizer_with_floors_at_the_given_bandwidth(tmp_path, monkeypatch):
    # a clock of known step times: every optimizer step takes 2 ms, then 4 ms (a median of 3 ms)
    monkeypatch.setattr(
        measure, "time_steps", lambda steps, warmup, repeats, device: {name: [0.002, 0.004] for name in steps}
    )
    assert (
        run(
            tmp_path, "--device", "cpu", "--optimizers", "adamw,lamb:eager", "--bandwidth_gbs", "100", "--step_ms", "50"
        )
        == 0
    )
    report = json.loads((tmp_path / "optimizer.json").read_text())
    assert (tmp_path / "optimizer.md").exists() and (tmp_path / "optimizer-steps.png").stat().st_size > 0
    assert [row["optimizer"] for row in report["rows"]] == ["adamw:fused", "adamw:eager", "lamb:eager"]
    # BERT-tiny for pre-training: 2 layers of hidden 64, vocabulary 1024 (counted here from the config by hand)
    hidden, layers, inner, vocab, positions = 64, 2, 256, 1024, 512
    embeddings = (vocab + positions + 2) * hidden + 2 * hidden
    layer = 4 * (hidden * hidden + hidden) + 2 * hidden + hidden * inner + inner + inner * hidden + hidden + 2 * hidden
    heads = hidden * hidden + hidden + hidden * hidden + hidden + 2 * hidden + vocab + hidden * 2 + 2
    parameters = embeddings + layers * layer + heads
    for row in report["rows"]:
        assert row["parameters"] == parameters
        # 28 bytes a parameter at 100 GB/s: 208,130 parameters x 0.28 ns = 0.0582764 ms
        assert row["floor_ms"] == pytest.approx(0.0582764)
        assert row["rule_bytes_per_parameter"] == (32 if row["rule"] == "adamw" else 44)
        assert (row["step_ms"], row["step_ms_min"], row["step_ms_max"]) == pytest.approx((3.0, 2.0, 4.0))
        assert row["ratio_to_floor"] == pytest.approx(51.4788)  # 3 ms / 0.0582764 ms
        assert row["share_of_step"] == pytest.approx(0.06)  # 3 ms of --step_ms 50
    assert report["bandwidth_bytes_per_second"] == 100e9


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--optimizers", "sgd"], "unknown optimizer 'sgd'"),
        (["--optimizers", "lamb:fast"], "unknown optimizer 'lamb:fast'"),
        (["--bandwidth_gbs", "0"], "--bandwidth_gbs must be positive"),
        (["--step_ms", "-1"], "--step_ms must be positive"),
        (["--warmup", "-1"], "--warmup must be 0 or more"),
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
    rows = json.loads((tmp_path / "optimizer.json").read_text())["rows"]
    assert {row["optimizer"] for row in rows} == {
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
