"""What a resumed run owes the run it continues: the evaluation a kill skipped.

An epoch's last step is checkpointed before the epoch's evaluation when the checkpoint interval
divides the epoch; a kill in between resumes at the next epoch's first batch, and that epoch's
evaluation would never be written. :func:`missed_evaluation` finds it, so the loop runs it first:
the evaluation neither draws random numbers nor changes the weights, so running it after the
resume gives the record the uninterrupted run wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpufeed.train._distributed import broadcast_object

__all__ = ["logged_steps", "missed_evaluation"]


def logged_steps(path: Path) -> set[int]:
    """The ``step`` of every complete line of a JSON-lines log (a line cut short by a kill is left out)."""
    steps = set()
    lines = Path(path).read_text(encoding="utf-8").splitlines() if Path(path).exists() else []
    for line in lines:
        try:
            steps.add(int(json.loads(line)["step"]))
        except (ValueError, KeyError, TypeError):
            continue
    return steps


def missed_evaluation(session) -> int | None:
    """The epoch whose evaluation the resumed ``session`` owes, or ``None``.

    Only at an epoch boundary where one is due (``train.eval_every_epochs``) and the run's
    ``eval.jsonl`` has no record of the resumed step. Rank 0 reads the log; every rank gets its
    answer, since an evaluation runs on all of them.
    """
    s = session
    every, done = s.cfg.train.eval_every_epochs, s.epoch
    if not s.resumed or s.mid_epoch or s.data.val is None or not every or not done or done % every:
        return None
    missed = s.step not in logged_steps(s.run_dir / "eval.jsonl") if s.dist.is_main else None
    return done - 1 if broadcast_object(missed) else None
