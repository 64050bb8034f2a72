"""The learning-rate schedule across resumes on another number of steps to go (another rank count).

The optimizer's own rate is what a step uses; the log reads the scheduler's. Both must go on from
the checkpoint's rate, and a schedule anchored by one resume must stay anchored through the next.
"""

from __future__ import annotations

import types

import pytest
import torch

from gpufeed.config import TrainConfig
from gpufeed.train._optim import build_optimizer, build_scheduler, load_optimizer_state, lr_factor
from gpufeed.train._run_state import _resume_schedule

pytestmark = pytest.mark.timeout(60)


def _resumed(cfg: TrainConfig, state: dict | None, step: int, total: int):
    """A run's optimizer and schedule as a resume at ``step`` leaves them, ``total`` steps in all (or a new run)."""
    optimizer = build_optimizer(torch.nn.Linear(2, 2), cfg)
    scheduler = build_scheduler(optimizer, total, cfg)
    s = types.SimpleNamespace(step=step, cfg=types.SimpleNamespace(train=cfg), optimizer=optimizer,
                              scheduler=scheduler, total_steps=total, schedule_anchor=None,
                              data=types.SimpleNamespace(train=types.SimpleNamespace(
                                  batches_left=lambda epochs: total - step)))  # fmt: skip
    if state is not None:
        load_optimizer_state(optimizer, state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        _resume_schedule(s, state)
    return s


def _steps(s, until: int) -> list[tuple[float, float]]:
    """(rate the optimizer used, rate the scheduler reported) of each step from ``s.step`` to ``until``."""
    rates = []
    for _ in range(s.step, until):
        rates.append((s.optimizer.param_groups[0]["lr"], s.scheduler.get_last_lr()[0]))
        s.optimizer.step()
        s.scheduler.step()
        s.step += 1
    return rates


def _checkpoint(s) -> dict:
    return {
        "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(),
        "schedule": {"total_steps": s.total_steps, "anchor": list(s.schedule_anchor) if s.schedule_anchor else None},
    }


@pytest.mark.parametrize("warmup_steps", [0, 1, 5])
def test_the_first_step_after_a_resume_on_another_length_runs_at_the_checkpoints_rate(warmup_steps):
    """LambdaLR's constructor set the rate of step 0 (the peak, or lr / warmup): the log hid it."""
    cfg = TrainConfig(lr=0.1, warmup_steps=warmup_steps, schedule="cosine", epochs=2)
    first = _resumed(cfg, None, 0, 48)
    _steps(first, 30)
    want = first.optimizer.param_groups[0]["lr"]
    assert want == pytest.approx(0.1 * lr_factor(30, 48, cfg))
    for total in (39, 60):  # more ranks (fewer steps to go), fewer ranks
        resumed = _resumed(cfg, _checkpoint(first), 30, total)
        used, logged = _steps(resumed, 31)[0]
        assert used == pytest.approx(want, rel=1e-9), f"{total} steps in all: step 30 ran at {used}, not {want}"
        assert logged == pytest.approx(used, rel=1e-12)


def test_a_schedule_anchored_by_one_resume_stays_anchored_through_the_next_on_the_same_ranks():
    cfg = TrainConfig(lr=0.1, warmup_steps=0, schedule="cosine", min_lr_fraction=0.01, epochs=2)
    one_rank = _resumed(cfg, None, 0, 48)
    _steps(one_rank, 30)
    two_ranks = _resumed(cfg, _checkpoint(one_rank), 30, 39)  # 9 steps to go on two ranks
    assert two_ranks.schedule_anchor is not None
    straight = _resumed(cfg, _checkpoint(one_rank), 30, 39)
    want = [used for used, _ in _steps(straight, 39)]  # the anchored schedule, run without a stop
    _steps(two_ranks, 35)
    again = _resumed(cfg, _checkpoint(two_ranks), 35, 39)  # stopped at 35, resumed on two ranks again
    got = [used for used, _ in _steps(again, 39)]
    assert got == pytest.approx(want[5:], rel=1e-9), "it dropped the anchor and fell to the floor"
    assert got[-1] > 0.1 * cfg.min_lr_fraction


def test_a_warm_up_as_long_as_the_run_is_named(caplog):
    """The docs' ``warmup_steps: 500`` on a 12-step run trained at 2.4% of the rate, and nothing said so."""
    cfg = TrainConfig(lr=0.002, warmup_steps=500)
    with caplog.at_level("WARNING", logger="gpufeed"):
        build_scheduler(build_optimizer(torch.nn.Linear(2, 2), cfg), 12, cfg)
    assert [r.getMessage() for r in caplog.records] == [
        "train.warmup_steps (500) is not shorter than the run's 12 steps: the rate rises to 0.024 of train.lr "
        "(0.002) at the last step and never decays; lower train.warmup_steps"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="gpufeed"):
        build_scheduler(build_optimizer(torch.nn.Linear(2, 2), cfg), 501, cfg)
    assert not caplog.records
