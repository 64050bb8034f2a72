"""gpufeed.reliability: fault-injection runs that prove what training promises, with figures.

* :func:`run_kill_resume`: kill -9 a CPU training run at random moments, resume each time,
  compare the final weights with an uninterrupted run's (``gpufeed reliability kill-resume``).
* :func:`run_bad_data`: a dataset with corrupt images and a truncated video through ``gpufeed
  check`` and training with each bad-sample policy and a quarantine list (``... bad-data``).
* :func:`run_disk_faults`: unwritable and full run folders, and a disk filling up mid-run
  (``... disk``).

Each returns a report in the shape of every run that passes or fails
(:class:`gpufeed._report.Checklist`, which the server's load runs in ``gpufeed.bench`` share):
``table()`` (the figures, ending with the verdict), ``checks()``, ``problems()``, ``ok`` and
``to_dict()``.
"""

from gpufeed.reliability._bad_data import BadDataReport, run_bad_data
from gpufeed.reliability._disk import DiskReport, run_disk_faults
from gpufeed.reliability._kill_resume import KillResumeReport, run_kill_resume

__all__ = [
    "BadDataReport",
    "DiskReport",
    "KillResumeReport",
    "run_bad_data",
    "run_disk_faults",
    "run_kill_resume",
]
