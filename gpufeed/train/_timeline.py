"""Steps that partition the training timeline: queued one ahead on a GPU, each timed end to end.

A step's ``step_s`` runs from the end of the previous step's record to the end of its own; the
first step of an epoch (or of a benchmark's chunk) starts at the start of its wait. The steps of an
epoch so add up to its wall time, and loader wait, augment and compute are parts of that time.

Where the host waits for a step differs by device:

* **GPU**: the host queues step k+1 before it reads step k (see :mod:`gpufeed.train._telemetry`),
  so the device always has a step queued. Step k's record ends once its own events are read, after
  the host has waited for batch k+1 and queued its step: step k's period holds the host's wait for
  the *next* batch, which overlaps step k's device work and costs the device nothing while it is
  shorter. Summed over an epoch, every wait still falls inside exactly one step.
* **CPU**: launching a step runs it (the CPU works synchronously), so queueing ahead gains
  nothing; each step is read as soon as it is launched, and its period holds its own wait,
  augment and compute.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Generic, TypeVar

from gpufeed.train._step import PendingStep, StepOutcome

__all__ = ["Finished", "StepTimeline"]

InfoT = TypeVar("InfoT")


@dataclass(frozen=True)
class Finished(Generic[InfoT]):
    """A step that has been read: what its caller attached, its outcome and its period.

    Attributes:
        info: What :meth:`StepTimeline.push` was given with the step (epoch, batch, wait, ...).
        outcome: Loss, learning rate, augment and compute times, rows.
        step_s: From the end of the previous step's record (or the start of the epoch's first
            wait) to the end of this one's.
    """

    info: InfoT
    outcome: StepOutcome
    step_s: float


class StepTimeline(Generic[InfoT]):
    """Queues launched steps and reads them, cutting the host's time into consecutive step periods.

    Usage per epoch: :meth:`begin` at the start of the first wait, :meth:`push` each launched step
    (it returns the step read now, if any), :meth:`finish` when the epoch ends or a step must be
    complete (a checkpoint, a trace, the last step).

    Args:
        launch_ahead: Read each step only after the next one is queued (a GPU); ``False`` reads
            each step as soon as it is pushed (the CPU, where launching runs it).
    """

    def __init__(self, launch_ahead: bool) -> None:
        self.launch_ahead = launch_ahead
        self._queued: tuple[PendingStep, InfoT] | None = None
        self._since = time.perf_counter()

    def begin(self, at: float | None = None) -> None:
        """The next step's period starts at ``at`` (a ``time.perf_counter`` reading; default: now)."""
        self._since = time.perf_counter() if at is None else at

    @property
    def last_end(self) -> float:
        """Where the next period starts: the end of the last step's record, or :meth:`begin`'s moment."""
        return self._since

    def push(self, pending: PendingStep, info: InfoT) -> Finished[InfoT] | None:
        """Queue a launched step; returns the step read now (the previous one on a GPU, this one on the CPU)."""
        if self.launch_ahead:
            done = self.finish()
            self._queued = (pending, info)
            return done
        self._queued = (pending, info)
        return self.finish()

    def finish(self) -> Finished[InfoT] | None:
        """Read the queued step, if any (on a GPU: wait for its own end, not for work queued after it)."""
        if self._queued is None:
            return None
        (pending, info), self._queued = self._queued, None
        outcome = pending.result()
        now = time.perf_counter()
        step_s, self._since = now - self._since, now
        return Finished(info, outcome, step_s)
