"""`bertbench bench budget`: contenders train for the same few seconds through run_classifier (the second under
torchrun), then score the dev set; bad contenders, half-given data flags and failing runs are one-line errors."""

import json
import os

import pytest
from helpers import read_json, write_bert_dir

from bertbench.bench import budget
from bertbench.bench.results import BenchResult, Ratio
from bertbench.tasks.synthetic import write_glue_task

TINY = [
    "--hidden=32",
    "--layers=1",
    "--max_seq_length=32",
    "--log_step_count_steps=1",
    "--threads_per_process=1",
    "--device=cpu",
]


@pytest.fixture(scope="module")
def race(tmp_path_factory):
    out = tmp_path_factory.mktemp("budget") / "out"
    assert budget.main(["--minutes=0.01", "--contenders=baseline:1,full:2", *TINY, f"--output_dir={out}"]) == 0
    return out


@pytest.mark.slow
def test_each_contender_trains_until_the_budget_then_is_scored(race):
    result = BenchResult.read(str(race / "budget.json"))
    assert result.context["metric"] == "dev_acc_and_f1" and result.context["budget_seconds"] == 0.6
    baseline, recompute = result.rows
    assert (baseline.get("contender"), recompute.get("contender")) == ("baseline:1", "full:2")
    for row in result.rows:
        assert row.measured == "sentences" and row.get("minutes") == 0.01
        assert row.get("budget_exhausted") and row.get("train_seconds") >= 0.6 and row.get("learning_rate") == 1e-3
        # every sequence of every process counted, and the figures are the run's own
        assert row.get("steps") > 0 and row.median() == row.get("steps") * row.get("global_batch")
        scores = read_json(os.path.join(row.get("run_dir"), "eval_results.json"))
        assert (row.get("metric_value"), row.get("dev_loss")) == (scores["dev_acc_and_f1"], scores["dev_loss"])
        records = [json.loads(line) for line in open(os.path.join(row.get("run_dir"), "metrics.jsonl"))]
        assert len(records) == row.get("steps")  # --log_step_count_steps=1
        assert result.context["loss_curves"][row.get("contender")] == [
            [record["elapsed_s"] for record in records],
            [record["loss"] for record in records],
        ]
    assert (baseline.get("world_size"), recompute.get("world_size")) == (1, 2) and recompute.get("global_batch") == 64
    # the second's sentences over the first's, carrying the larger CV of their window rates
    vs_first = recompute.get("sentences_vs_first")
    assert vs_first.value == recompute.median() / baseline.median()
    assert baseline.get("sentences_vs_first") == Ratio(1.0, None)
    cvs = [row.get("window_seq_per_s").cv for row in result.rows if row.get("window_seq_per_s") is not None]
    assert vs_first.inputs_cv == max([cv for cv in cvs if cv is not None], default=None)
    train = read_json(race / "runs" / "full-2proc" / "train_results.json")
    assert train["world_size"] == 2 and train["recompute_policy"] == "full" and train["interrupted_by"] is None
    assert (race / "budget-curves.png").stat().st_size > 0
    markdown = (race / "budget.md").read_text()
    assert "| baseline:1 | 1 | 1 |" in markdown  # 1 process of 1 thread
    for row in result.rows:  # seq/s over the log windows after the first (one step each here)
        records = [json.loads(line) for line in open(os.path.join(row.get("run_dir"), "metrics.jsonl"))]
        rates = sorted(record["seq_per_s"] for record in records[1:])
        # How many steps fit in the budget depends on the machine's load: a busy one may leave a contender one step
        # (no window after the first: no figure) or two (one window: a figure without a spread).
        windows = row.get("window_seq_per_s")
        if not rates:
            assert windows is None
            continue
        assert (windows.min, windows.max) == (rates[0], rates[-1])
        shown = (
            f"| {windows.median:,.1f} ({rates[0]:,.1f}–{rates[-1]:,.1f}, CV "
            if len(rates) > 1
            else f"| {windows.median:,.1f} |"
        )
        assert shown in markdown


@pytest.mark.slow
def test_a_second_run_on_the_same_directory_is_refused(race, error_line):
    before = (race / "budget.json").read_bytes()
    assert budget.main(["--minutes=0.02", "--device=cpu", f"--output_dir={race}"]) == 2
    assert "exists: choose another --output_dir or pass --overwrite" in error_line()
    assert (race / "budget.json").read_bytes() == before


def test_contender_flags_and_command():
    contender = budget.Contender.parse("every-3:2:independent")
    assert contender.run_name == "every-3-2proc-independent" and contender.label == "every-3:2:independent"
    command = contender.command(["--do_train"])
    assert command[1:6] == ["-m", "bertbench.runners.launch", "--standalone", "--nproc-per-node=2", "-m"]
    assert command[-5:] == [
        "--do_train",
        "--modeling=recompute",
        "--recompute-policy=every-k",
        "--recompute-every=3",
        "--no_sync_gradients",
    ]
    assert budget.Contender.parse("baseline:1").command([])[1:] == [
        "-m",
        "bertbench.runners.classifier",
        "--modeling=baseline",
    ]


@pytest.mark.parametrize(
    "contenders, message",
    [
        ("baseline", "use VARIANT:PROCESSES"),
        ("full:0", "use VARIANT:PROCESSES"),
        ("full:2:alone", "use VARIANT"),
        ("warp:1", "unknown variant 'warp'"),
        ("baseline:1:independent", "need 2 or more processes"),
        ("full:2,full:2", "names a contender twice"),
    ],
)
def test_bad_contenders_are_one_line_errors(tmp_path, error_line, contenders, message):
    assert budget.main([f"--contenders={contenders}", f"--output_dir={tmp_path / 'out'}"]) == 2
    assert message in error_line()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "flags, missing",
    [
        (["--task_name=MRPC", "--data_dir=glue/MRPC"], "--vocab_file, --bert_config_file"),
        (["--init_checkpoint=bert.ckpt"], "--task_name, --data_dir, --vocab_file, --bert_config_file"),
    ],
)
def test_own_data_needs_all_four_flags(tmp_path, error_line, flags, missing):
    assert budget.main([*flags, f"--output_dir={tmp_path / 'out'}"]) == 2
    line = error_line()
    assert "--bert_config_file together" in line and line.endswith(f"missing {missing}")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_failing_contender_names_itself_its_run_and_the_reason(tmp_path, error_line):
    write_glue_task(tmp_path / "glue", "MRPC", train=64, dev=16, test=4)
    bert = write_bert_dir(tmp_path / "bert")  # max_position_embeddings 64: seq 128 cannot run
    out = tmp_path / "out"
    assert (
        budget.main(
            [
                "--minutes=0.05",
                "--contenders=baseline:1",
                "--task_name=MRPC",
                f"--data_dir={tmp_path / 'glue' / 'MRPC'}",
                f"--vocab_file={bert / 'vocab.txt'}",
                f"--bert_config_file={bert / 'bert_config.json'}",
                f"--output_dir={out}",
            ]
        )
        == 1
    )
    line = error_line()
    assert "contender baseline:1 failed" in line and str(out / "runs" / "baseline-1proc") in line
    assert "max_position_embeddings is 64" in line
    assert not (out / "budget.json").exists()
