"""run_pretraining end to end on shards in NVIDIA's layout: training and evaluation, phase 2 continuing phase 1,
exact resume, the MLPerf-style target stop and one-line errors (its ranks under torchrun, each reading shards of its
own, are test_distributed.py's)."""

import json
import os
import shutil

import h5py
import pytest
import torch
from helpers import read_json, scalars, snapshot, write_bert_dir, write_nvidia_shard

from bertbench import cli
from bertbench.model.factory import MODELINGS
from bertbench.runners.pretraining import main
from bertbench.training.checkpoint import list_checkpoints, load_checkpoint


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """train/ (4 shards of 48 sequences of up to 32 tokens), eval/ (one MLPerf variable-length shard), easy/ (every
    masked token the same id: a model learns it in a few steps) and bert/ (the tiny model, no dropout)."""
    root = tmp_path_factory.mktemp("pretraining")
    for index in range(4):
        (root / "train").mkdir(exist_ok=True)
        write_nvidia_shard(root / "train" / f"part_{index:05d}.hdf5", count=48, seed=index)
        (root / "easy").mkdir(exist_ok=True)
        write_nvidia_shard(root / "easy" / f"part_{index:05d}.hdf5", count=48, seed=index, masked_id=7)
    (root / "eval").mkdir()
    write_nvidia_shard(root / "eval" / "eval.hdf5", count=40, seed=99, varlength=True)
    write_nvidia_shard(root / "easy_eval.hdf5", count=40, seed=98, masked_id=7)
    write_bert_dir(root / "bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return root


def flags(data, out, *extra, train="train", evaluate="eval"):
    return [
        f"--input_dir={data / train}",
        f"--eval_dir={data / evaluate}",
        f"--bert_config_file={data / 'bert' / 'bert_config.json'}",
        "--max_seq_length=32",
        "--max_predictions_per_seq=5",
        "--train_batch_size=8",
        "--learning_rate=2e-3",
        "--log_step_count_steps=5",
        "--save_checkpoints_secs=0",
        f"--output_dir={out}",
        *extra,
    ]


def final_weights(out):
    return load_checkpoint(list_checkpoints(out)[-1][1])["model"]


@pytest.fixture(scope="module")
def phase1(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("phase1") / "run"
    assert (
        main(
            flags(
                data,
                out,
                "--do_train",
                "--do_eval",
                "--num_train_steps=30",
                "--eval_iter_samples=80",
                "--save_checkpoints_steps=10",
                "--keep_checkpoint_max=5",
            )
        )
        == 0
    )
    return out


def test_phase1_trains_evaluates_and_writes_every_result(phase1):
    train = read_json(phase1 / "train_results.json")
    assert train["global_step"] == 30 and train["sentences"] == 240
    assert train["training_shards"] == 4 and train["training_sequences"] == 192
    assert 0 < train["padding_fraction"] < 1 and train["evaluation_seconds"] > 0
    evals = [json.loads(line) for line in open(phase1 / "evals.jsonl")]
    assert [record["step"] for record in evals] == [10, 20, 30]  # every 80 sequences = 10 steps, and the last
    assert all(0 <= record["masked_lm_accuracy"] <= 1 and record["eval_sequences"] == 40 for record in evals)
    results = read_json(phase1 / "eval_results.json")
    assert results["global_step"] == 30 and results["masked_lm_accuracy"] == evals[-1]["masked_lm_accuracy"]
    assert results["masked_tokens"] == evals[-1]["masked_tokens"] > 40
    assert "masked_lm_accuracy = " in (phase1 / "eval_results.txt").read_text()
    state = load_checkpoint(list_checkpoints(phase1)[-1][1])
    assert state["train_config"]["optimizer"] == "lamb" and state["train_config"]["decay"] == "poly"
    assert state["data"][0]["consumed"] == 240


def test_phase2_continues_the_step_count_and_restarts_the_schedule(phase1, data, tmp_path):
    out = tmp_path / "phase2"
    assert (
        main(
            flags(
                data,
                out,
                "--do_train",
                "--phase2",
                f"--init_checkpoint={phase1}",
                "--num_train_steps=10",
                "--warmup_proportion=0.5",
                "--learning_rate=1e-3",
                "--phase1_end_step=30",
            )
        )
        == 0
    )
    train = read_json(out / "train_results.json")
    assert train["global_step"] == 40 and train["steps"] == 10 and train["schedule_start_step"] == 30
    assert [step for step, _ in list_checkpoints(out)] == [40]
    lrs = {record["step"]: record["lr"] for record in map(json.loads, open(out / "metrics.jsonl"))}
    # A warm-up of 5 steps starting anew at step 30: its 5th step runs at 4/5 of the peak (its first at 0).
    assert sorted(lrs) == [35, 40] and lrs[35] == pytest.approx(0.8e-3)
    state = load_checkpoint(list_checkpoints(out)[-1][1])
    phase1_state = load_checkpoint(list_checkpoints(phase1)[-1][1])
    # LAMB's moments came from phase 1: after 10 more steps they are not those of a fresh optimizer's 10 steps.
    assert state["optimizer"]["state"][0]["step"] == phase1_state["optimizer"]["state"][0]["step"] + 10
    assert state["schedule_start_step"] == 30
    record = read_json(out / "bertbench_run.json")
    assert record["derived"] == {"phase1_end_step": 30} and record["args"]["phase1_end_step"] == 30  # as given


def test_phase2_resumes_without_phase1s_directory(phase1, data, tmp_path):
    copy, out = tmp_path / "phase1", tmp_path / "phase2"
    shutil.copytree(phase1, copy)
    arguments = flags(
        data,
        out,
        "--do_train",
        "--phase2",
        f"--init_checkpoint={copy}",
        "--num_train_steps=10",
        "--save_checkpoints_steps=5",
        "--keep_checkpoint_max=2",
    )
    assert main(arguments) == 0
    os.remove(list_checkpoints(out)[-1][1])  # back to step 35, and phase 1's run is gone
    shutil.rmtree(copy)
    assert main(arguments) == 0
    train = read_json(out / "train_results.json")
    assert train["resumed_from"].endswith("ckpt-000000035.pt") and train["global_step"] == 40
    assert train["schedule_start_step"] == 30


PHASE1_AND_2_LOG_STEPS = [5, 10, 15, 20, 25, 30, 35, 40]  # every 5 steps: phase 1's 30, then phase 2's 10


def logged_steps(run):
    return [record["step"] for record in map(json.loads, open(run / "metrics.jsonl"))]


def phase2_in_place(phase1, data, tmp_path, *extra):
    """NVIDIA's phase 2 command (run_pretraining.sh) on a copy of phase 1's directory: its own batch, steps, rate
    and warm-up, --resume_from_checkpoint and --phase1_end_step, no --init_checkpoint."""
    run = tmp_path / "run"
    if not run.exists():
        shutil.copytree(phase1, run)
    argv = flags(data, run, "--do_train", "--phase2", "--resume_from_checkpoint", "--phase1_end_step=30")
    argv = [flag for flag in argv if not flag.startswith(("--train_batch_size", "--learning_rate"))]
    return run, [
        *argv,
        "--train_batch_size=16",
        "--max_steps=10",
        "--learning_rate=1e-3",
        "--warmup_proportion=0.5",
        "--num_steps_per_checkpoint=5",
        *extra,
    ]


def test_nvidias_phase2_goes_on_in_phase1s_directory(phase1, data, tmp_path, capsys):
    """Before: refused by the run record (this run was made with --train_batch_size=8, the command gives 16)."""
    run, argv = phase2_in_place(phase1, data, tmp_path, "--keep_checkpoint_max=5")
    assert main(argv) == 0
    assert f"note: {run} holds phase 1 of this run (its bertbench_run.json): phase 2 goes on" in capsys.readouterr().out
    assert [step for step, _ in list_checkpoints(run)][-3:] == [30, 35, 40]
    train, phase1_train = read_json(run / "train_results.json"), read_json(run / "phase1_train_results.json")
    assert (train["global_step"], train["schedule_start_step"], train["phase2"]) == (40, 30, True)
    assert (phase1_train["global_step"], phase1_train["phase2"]) == (30, False)
    assert read_json(run / "phase1_eval_results.json")["global_step"] == 30
    assert logged_steps(run) == PHASE1_AND_2_LOG_STEPS
    assert [record["step"] for record in map(json.loads, open(run / "evals.jsonl"))] == [10, 20, 30]  # phase 1's
    assert [step for step, _ in scalars(run)["loss"]] == PHASE1_AND_2_LOG_STEPS  # TensorBoard's curve too
    assert [step for step, _ in scalars(run / "eval")["masked_lm_accuracy"]] == [10, 20, 30]
    record = read_json(run / "bertbench_run.json")
    assert record["args"]["train_batch_size"] == 16 and record["derived"] == {"phase1_end_step": 30}
    assert [phase["args"]["train_batch_size"] for phase in record["phases"]] == [8]
    # The same phase 2 the bertbench way, from phase 1's directory into a new one, trains the same weights.
    elsewhere = [flag.replace(str(run), str(tmp_path / "elsewhere")) for flag in argv] + [f"--init_checkpoint={phase1}"]
    assert main(elsewhere) == 0
    weights = final_weights(run)
    assert all(torch.equal(weights[name], tensor) for name, tensor in final_weights(tmp_path / "elsewhere").items())


def test_phase2_in_place_resumes_as_phase2(phase1, data, tmp_path):
    """Killed before its first save, phase 2 in place goes on from phase 1's last checkpoint again, not as a resume
    of it; killed later, it resumes its own: the same weights either way."""
    run, argv = phase2_in_place(phase1, data, tmp_path, "--keep_checkpoint_max=5")
    assert main(argv) == 0
    uninterrupted = final_weights(run)
    for killed_before in ([40], [35, 40]):  # phase 2's last save, then its first save too
        for step in killed_before:
            os.remove(run / f"ckpt-{step:09d}.pt")
        assert main(argv) == 0
        weights = final_weights(run)
        assert all(torch.equal(weights[name], tensor) for name, tensor in uninterrupted.items())
    train = read_json(run / "train_results.json")
    assert train["schedule_start_step"] == 30 and train["global_step"] == 40
    assert logged_steps(run) == PHASE1_AND_2_LOG_STEPS


def test_phase2_in_phase1s_directory_and_another_phase1_is_refused(phase1, data, tmp_path, error_line):
    run, argv = phase2_in_place(phase1, data, tmp_path, f"--init_checkpoint={phase1}")
    before = snapshot(run)
    assert main(argv) == 2
    assert f"--phase2 on {run}, which holds phase 1 of a run, and --init_checkpoint={phase1}" in error_line()
    assert snapshot(run) == before


def test_phase2_refuses_another_phase1_end_step(phase1, data, tmp_path, error_line):
    out = tmp_path / "phase2"
    assert (
        main(
            flags(
                data,
                out,
                "--do_train",
                "--phase2",
                f"--init_checkpoint={phase1}",
                "--num_train_steps=5",
                "--phase1_end_step=7038",
            )
        )
        == 2
    )
    assert "phase 1 ended at step 30, not --phase1_end_step 7038" in error_line()
    assert not out.exists()


def test_a_run_resumed_from_a_middle_checkpoint_ends_with_the_same_weights(phase1, tmp_path, data):
    out = tmp_path / "resumed"
    shutil.copytree(phase1, out)
    for step, path in list_checkpoints(out):
        if step > 10:
            os.remove(path)
    assert main(flags(data, out, "--do_train", "--do_eval", "--num_train_steps=30", "--eval_iter_samples=80")) == 0
    assert read_json(out / "train_results.json")["resumed_from"].endswith("ckpt-000000010.pt")
    first, second = final_weights(phase1), final_weights(out)
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert [json.loads(line)["step"] for line in open(out / "evals.jsonl")] == [10, 20, 30]


def test_target_accuracy_stops_training_and_reports_the_time_to_train(data, tmp_path):
    out = tmp_path / "target"
    assert (
        main(
            flags(
                data,
                out,
                "--do_train",
                "--do_eval",
                "--num_train_steps=200",
                "--eval_iter_samples=40",
                "--target_mlm_accuracy=0.9",
                train="easy",
                evaluate="easy_eval.hdf5",
            )
        )
        == 0
    )
    train = read_json(out / "train_results.json")
    assert train["target_reached"] is True and train["target_mlm_accuracy"] == 0.9
    assert train["global_step"] == train["steps_to_target"] < 200 and train["steps_to_target"] % 5 == 0
    assert train["sequences_to_target"] == train["steps_to_target"] * 8 and train["time_to_train_seconds"] > 0
    assert [step for step, _ in list_checkpoints(out)] == [train["global_step"]]
    assert read_json(out / "eval_results.json")["masked_lm_accuracy"] >= 0.9


def test_length_bins_cut_the_padding(data, tmp_path):
    plain, binned = tmp_path / "plain", tmp_path / "binned"
    assert main(flags(data, plain, "--do_train", "--num_train_steps=12")) == 0
    assert main(flags(data, binned, "--do_train", "--num_train_steps=12", "--length_bins=16,24,32")) == 0
    without, with_bins = (read_json(out / "train_results.json")["padding_fraction"] for out in (plain, binned))
    assert with_bins < without / 2


@pytest.mark.parametrize(
    "extra",
    [["--precision=bf16"], ["--num_accumulation_steps=2", "--optimizer_type=adam", "--decay=linear"]],
    ids=["bf16", "adamw-accumulated"],
)
def test_precision_and_optimizer_variants_train(data, tmp_path, extra):
    out = tmp_path / "run"
    assert main(flags(data, out, "--do_train", "--num_train_steps=6", *extra)) == 0
    assert read_json(out / "train_results.json")["global_step"] == 6


@pytest.fixture(scope="module")
def modeling_runs(data, tmp_path_factory):
    """A short train and eval run with each modeling module (recompute: the full policy)."""
    runs = {}
    for modeling in MODELINGS:
        out = tmp_path_factory.mktemp(modeling) / "run"
        assert (
            main(
                flags(
                    data,
                    out,
                    "--do_train",
                    "--do_eval",
                    "--num_train_steps=4",
                    f"--modeling={modeling}",
                    "--recompute-policy=full",
                )
            )
            == 0
        )
        runs[modeling] = out
    return runs


@pytest.mark.parametrize("modeling", MODELINGS)
def test_each_modeling_module_trains_and_evaluates(modeling_runs, modeling):
    out = modeling_runs[modeling]
    train = read_json(out / "train_results.json")
    assert train["modeling"] == modeling and train["recompute_policy"] == ("full" if modeling == "recompute" else None)
    results = read_json(out / "eval_results.json")
    assert results["global_step"] == train["global_step"] == 4 and results["eval_sequences"] == 40


def test_recompute_ends_with_the_baselines_weights(modeling_runs):
    first, second = (final_weights(modeling_runs[modeling]) for modeling in MODELINGS)
    assert all(torch.allclose(first[name], second[name], atol=1e-6) for name in first)


def test_warmup_in_steps_is_this_phases_share_and_the_flags_stay_as_given(data, tmp_path):
    out = tmp_path / "run"
    assert (
        main(flags(data, out, "--do_train", "--num_train_steps=8", "--num_warmup_steps=2", "--optimizer_type=adam"))
        == 0
    )
    config = load_checkpoint(list_checkpoints(out)[-1][1])["train_config"]
    assert config["warmup_proportion"] == 0.25 and config["optimizer"] == "adamw" and config["decay"] == "poly"
    assert config["decay_power"] == 0.5 and config["num_train_steps"] == 8
    args = read_json(out / "bertbench_run.json")["args"]
    assert (args["num_warmup_steps"], args["warmup_proportion"], args["optimizer_type"]) == (2, 0.1, "adam")


def test_eval_only_scores_the_runs_checkpoint(phase1, data, capsys):
    assert main([f"--output_dir={phase1}", "--do_eval"]) == 0
    assert "masked_lm_accuracy = " in capsys.readouterr().out
    assert read_json(phase1 / "eval_results.json")["global_step"] == 30


def test_pretrain_subcommand(data, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["pretrain", *flags(data, out, "--do_train", "--num_train_steps=2")]) == 0
    assert (out / "train_results.json").exists()


def damaged_copy(data, tmp_path, damage):
    shards = tmp_path / "shards"
    shutil.copytree(data / "train", shards)
    with h5py.File(shards / "part_00002.hdf5", "a") as handle:
        damage(handle)
    return shards


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda h: h.__delitem__("input_mask"), "part_00002.hdf5: no dataset input_mask"),
        (
            lambda h: h["masked_lm_positions"].__setitem__((3, 0), 31),
            "part_00002.hdf5: row 3: masked position 31 is outside its sequence",
        ),
    ],
)
def test_a_bad_training_shard_fails_in_one_line_before_anything_is_written(data, tmp_path, damage, message, error_line):
    shards = damaged_copy(data, tmp_path, damage)
    out = tmp_path / "run"
    status = main(flags(data, out, "--do_train", "--num_train_steps=40", f"--input_dir={shards}"))
    assert status == 2
    assert message in error_line()
    # A layout error is found before training; a value error when its shard is read, before any checkpoint of it.
    assert not out.exists() or not list_checkpoints(out)


def test_a_bad_eval_shard_fails_before_training(data, tmp_path, error_line):
    bad = tmp_path / "eval.hdf5"
    write_nvidia_shard(bad, count=4, seq=64)
    out = tmp_path / "run"
    assert main(flags(data, out, "--do_train", "--num_train_steps=4", f"--eval_dir={bad}")) == 2
    assert f"{bad}: sequences of 64 tokens, longer than --max_seq_length 32" in error_line()
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--do_train"], "--do_train needs --num_train_steps"),
        (["--num_train_steps=5"], "at least one of --do_train or --do_eval"),
        (["--do_train", "--num_train_steps=5", "--target_mlm_accuracy=0.7"], "give --eval_iter_samples"),
        (["--do_train", "--num_train_steps=5", "--phase2"], "--phase2 needs phase 1: --init_checkpoint=its run"),
        (["--do_train", "--num_train_steps=5", "--length_bins=8,16"], "--length_bins must end at --max_seq_length 32"),
        (
            ["--do_train", "--num_train_steps=5", "--input_dir=/nonexistent/*.hdf5"],
            "/nonexistent/*.hdf5: no such shard",
        ),
    ],
)
def test_bad_flags(data, tmp_path, extra, message, error_line):
    assert main(flags(data, tmp_path / "run", *extra)) == 2
    assert message in error_line()
