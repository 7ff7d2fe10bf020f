"""A small kill -9 campaign (tests/fault_campaign.py): real processes SIGKILLed at seeded random moments, each run
again, must end with the uninterrupted run's weights, figures, log and checkpoints."""

import pytest
from fault_campaign import campaign, check_segments


def segment(start, end, ended=None):
    return {"start_step": start, "end_step": end, "steps": end - start, "ended": ended}


def test_the_segment_check_sees_gaps_overlaps_and_unsaved_ends():
    saves = {8, 16, 24, 30}
    assert check_segments([segment(0, 16), segment(16, 30, "finished")], 30, saves) == []
    assert check_segments([segment(0, 8), segment(16, 30, "finished")], 30, saves)  # a gap
    assert check_segments([segment(0, 16), segment(8, 30, "finished")], 30, saves)  # an overlap
    assert check_segments([segment(0, 12), segment(12, 30, "finished")], 30, saves)  # ends where nothing was saved
    assert check_segments([segment(0, 16), segment(16, 24, "finished")], 30, saves)  # short of the run
    assert check_segments([segment(0, 30)], 30, saves)  # the last one never finished


@pytest.mark.slow
def test_a_small_campaign_loses_nothing(tmp_path):
    # Seed 167 draws 4 kills of 4 kinds (start-up, after a checkpoint, as one appears, in a save), the runners' short
    # commands.
    results = campaign(
        ["classifier", "pretraining"], {"classifier": 1, "pretraining": 1}, seed=167, workdir=tmp_path, short=True
    )
    lost = [f"{result.runner}: {problem}" for result in results for trial in result.trials for problem in trial.lost]
    assert not lost, "\n".join(lost)
    assert all(trial.identical for result in results for trial in result.trials)
    assert sum(len(trial.kills) for result in results for trial in result.trials) >= 2
