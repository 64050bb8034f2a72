"""gpufeed.reliability: pass/fail fault and load runs that prove what training and serving promise.

Training (``gpufeed reliability kill-resume|resume-boundaries|bad-data|disk``):

* :func:`run_kill_resume`: kill -9 a CPU training run at random moments, resume each time,
  compare the final weights with an uninterrupted run's.
* :func:`run_boundary_kills`: kill -9 a run of any config before its first checkpoint,
  mid-epoch and right after an end-of-epoch checkpoint, resume each time, compare bit for bit,
  and check that no process of a killed run outlives it.
* :func:`run_bad_data`: a dataset with corrupt images and a truncated video through ``gpufeed
  check`` and training with each bad-sample policy and a quarantine list.
* :func:`run_disk_faults`: unwritable and full run folders, and a disk filling up mid-run.

Serving, each against a real ``gpufeed serve`` process (``gpufeed reliability soak|overload|drain|fuzz``):

* :func:`run_soak`: many clients for a long time: errors, RSS growth, throughput, p99.
* :func:`run_overload`: far more load than capacity: a bounded queue, 503 with Retry-After.
* :func:`run_drain`: SIGTERM with requests in flight: every request accounted for, exit 0.
* :func:`run_fuzz`: over a thousand malformed requests: every answer a 4xx naming the problem.

Each returns a report in the shape of every run that passes or fails
(:class:`gpufeed.core._report.Checklist`): ``table()`` (the figures, ending with the verdict),
``checks()``, ``problems()``, ``ok`` and ``to_dict()``. Speed against peers is ``gpufeed.bench``.
"""

from gpufeed.reliability._bad_data import BadDataReport, run_bad_data
from gpufeed.reliability._boundaries import BoundaryReport, run_boundary_kills
from gpufeed.reliability._disk import DiskReport, run_disk_faults
from gpufeed.reliability._drain import DrainReport, run_drain
from gpufeed.reliability._fuzz import FuzzReport, run_fuzz
from gpufeed.reliability._kill_resume import KillResumeReport, run_kill_resume
from gpufeed.reliability._overload import OverloadReport, run_overload

# For gpufeed's own packages: the names they use from this package's private modules, re-exported
# here (``as`` marks a re-export) so no package reaches into another's ``_*`` modules. Not in the
# API reference; they may change with the code that uses them.
from gpufeed.reliability._server_runs import ServerRunReport as ServerRunReport
from gpufeed.reliability._server_runs import reliability_inputs as reliability_inputs
from gpufeed.reliability._soak import SoakReport, run_soak
from gpufeed.reliability._soak import plot_soak as plot_soak

__all__ = [
    "BadDataReport",
    "BoundaryReport",
    "DiskReport",
    "DrainReport",
    "FuzzReport",
    "KillResumeReport",
    "OverloadReport",
    "SoakReport",
    "run_bad_data",
    "run_boundary_kills",
    "run_disk_faults",
    "run_drain",
    "run_fuzz",
    "run_kill_resume",
    "run_overload",
    "run_soak",
]
