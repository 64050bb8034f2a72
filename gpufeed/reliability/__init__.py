"""gpufeed.reliability: fault-injection runs that prove what training promises, with figures.

* :func:`run_kill_resume`: kill -9 a CPU training run at random moments, resume each time,
  compare the final weights with an uninterrupted run's (``gpufeed reliability kill-resume``).
"""

from gpufeed.reliability.kill_resume import (
    WEIGHT_TOLERANCE,
    Kill,
    KillResumeReport,
    KillTarget,
    draw_targets,
    run_kill_resume,
)

__all__ = [
    "WEIGHT_TOLERANCE",
    "Kill",
    "KillResumeReport",
    "KillTarget",
    "draw_targets",
    "run_kill_resume",
]
