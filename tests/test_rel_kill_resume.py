"""Training reliability: kill -9 at 5 seeded random moments of a real `gpufeed train` process, resume each time."""

from __future__ import annotations

import pytest

from gpufeed.reliability import run_kill_resume
from gpufeed.reliability._kill_resume import WEIGHT_TOLERANCE, draw_targets

pytestmark = pytest.mark.process


def test_kill_moments_are_seeded_and_include_one_checkpoint_write():
    checkpoints = [4, 6, 8, 12, 16, 18, 20, 24]
    a = draw_targets(24, checkpoints, kills=5, seed=0)
    assert a == draw_targets(24, checkpoints, kills=5, seed=0), "the same seed draws the same moments"
    assert a != draw_targets(24, checkpoints, kills=5, seed=1)
    assert [t.position for t in a] == sorted(t.position for t in a), "in run order"
    writes = [t for t in a if t.kind == "write"]
    assert len(writes) == 1 and writes[0].position in checkpoints[:-1]
    assert all(1.0 <= t.position <= 23.0 for t in a if t.kind == "step")
    with pytest.raises(ValueError, match="no checkpoint between step 2 and 23"):
        draw_targets(24, [24], kills=2, seed=0)


@pytest.mark.timeout(300)
def test_five_kills_then_resume_end_with_the_uninterrupted_weights(synth_dir, tmp_path):
    report = run_kill_resume(tmp_path, kills=5, seed=0, data=synth_dir, progress=False)
    print(report.table())  # the figures, with -s

    assert len(report.kills) == 5 and report.attempts == 6
    assert report.completed and report.final_step == report.num_steps == 24
    for kill in report.kills:
        assert kill.unreadable == [], f"a checkpoint could not be loaded after a kill: {kill}"
        assert kill.loaded == len(kill.checkpoints)
        assert 0 <= kill.resumed_from <= kill.steps_done and kill.steps_redone == kill.steps_done - kill.resumed_from
    assert any(k.writing for k in report.kills), "one kill lands while a checkpoint is being written"
    assert any(not k.writing for k in report.kills), "and others between checkpoint writes, mid-step"
    assert report.kills[-1].resumed_from > 0, "later kills resume from checkpoints, not from scratch"
    assert sum(len(k.checkpoints) for k in report.kills) > 5

    assert report.max_weight_diff <= WEIGHT_TOLERANCE, report.table()
    assert report.max_moment_diff <= WEIGHT_TOLERANCE
    assert report.max_loss_diff <= 1e-6, "every step's loss is the uninterrupted run's"
    assert report.steps_logged == list(range(1, 25)), "each step logged once across six processes"
    assert report.ok and report.table().endswith("PASS")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("seed", [1, 2])
def test_more_kills_other_moments(synth_dir, tmp_path, seed):
    """The long version (``-m slow``): 10 kills per run, other seeds, a checkpoint every 2 steps."""
    report = run_kill_resume(tmp_path, kills=10, seed=seed, checkpoint_every_steps=2, data=synth_dir, progress=False)
    print(report.table())
    assert report.ok, report.table()
    assert all(k.unreadable == [] for k in report.kills)
