"""Ctrl-C or SIGTERM stops a run after its current step, with a checkpoint of that step.

Before, SIGINT raised wherever the training thread was (``gpufeed train: interrupted``, exit 130)
and SIGTERM, what a scheduler sends before it pre-empts a job (Kubernetes, SLURM), killed the
process at once: either lost every step since the last checkpoint (``checkpoint_every_steps``
defaults to 500), and neither said how to go on. Now the first signal asks the loop to stop at the
end of the step it is in; the loop checkpoints that step, as ``checkpoint_every_steps`` would, and
ends with :class:`TrainStopped` naming the checkpoint and the ``--resume`` that continues it, exit
status 128 + the signal's number. A second signal stops at once, as before.

Under ``torchrun`` the ranks agree on the step: each step ends with every rank's signal reduced
over a gloo group (:func:`._distributed.all_reduce_max_int`: a CPU integer, no GPU sync), so a
signal any rank got stops all of them after the same step, and the checkpoint (which gathers every
rank's loader state) is written by all together. A rank that stopped alone would wait forever in
the next step's gradient all-reduce. There one signal often arrives twice: a terminal's Ctrl-C
reaches every worker and torchrun's agent, which passes on what it got (SIGTERM to the agent
likewise, beside ``scancel``'s own to every process); so a repeat within
:data:`REPEAT_WINDOW_S` of the first is the same request, not "stop at once". The agent kills its
workers 30 s after passing the signal on: the stop must checkpoint within that.

A signal its process ignores (``SIGINT`` in a job started with ``&``) stays ignored.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Any

from gpufeed.train._distributed import all_reduce_max_int
from gpufeed.train._errors import TrainError

__all__ = ["REPEAT_WINDOW_S", "StopRequest", "TrainStopped"]

log = logging.getLogger("gpufeed")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# Under torchrun: a repeat this soon after the first signal is the same signal passed on by the agent.
REPEAT_WINDOW_S = 5.0


class TrainStopped(TrainError):
    """The run stopped on a signal after checkpointing its last step; ``exit_status`` is 128 + the signal."""

    def __init__(self, message: str, signum: int, quiet: bool = False) -> None:
        super().__init__(message)
        self.exit_status = 128 + signum
        self.quiet = quiet  # a rank other than 0: rank 0 says it, once for the job


class StopRequest:
    """Catches SIGINT and SIGTERM while the block runs (on the main thread), and says when to stop.

    Args:
        world_size: The job's ranks; with more than one, :meth:`agreed` is a collective and a
            repeat within :data:`REPEAT_WINDOW_S` is the same request.
    """

    def __init__(self, world_size: int = 1) -> None:
        self.world_size = world_size
        self.repeat_window_s = REPEAT_WINDOW_S if world_size > 1 else 0.0
        self.signum: int | None = None  # the first signal received (or, by agreement, another rank's)
        self._first_at = 0.0
        self._previous: dict[int, Any] = {}  # signal.signal's earlier handlers, as it returned them

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in _SIGNALS:
            if signal.getsignal(signum) is signal.SIG_IGN:
                continue  # ignored by whoever started us (a background job's SIGINT): left so
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _on_signal(self, signum: int, frame) -> None:
        if self.signum is None:
            self.signum, self._first_at = signum, time.monotonic()
            log.warning(
                "%s: stopping after this step, with a checkpoint of it (%s again to stop at once)",
                signal.Signals(signum).name,
                signal.Signals(signum).name,
            )
            return
        if time.monotonic() - self._first_at < self.repeat_window_s:
            return  # torchrun's agent passing on the signal its workers got too: the same request
        self._restore()  # the second: as if gpufeed had never caught them
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)

    def agreed(self) -> bool:
        """Whether the run stops after this step; every rank calls it once a step, at the same point.

        With one rank: whether a signal came. With several: whether any rank's did (a reduction of
        one integer over the ranks); a rank that got none takes the other's signal for its message.
        """
        if self.world_size == 1:
            return self.signum is not None
        agreed = all_reduce_max_int(self.signum or 0)
        if agreed and self.signum is None:  # its own copy may still come: within the window, the same
            self.signum, self._first_at = agreed, time.monotonic()
        return bool(agreed)

    def stopped(
        self, step: int, epoch: int, batch: int, batches: int, checkpoint, run_dir, main: bool = True
    ) -> TrainStopped:
        """The error that ends the run, once step ``step``'s checkpoint is on disk (``main``: rank 0, which says it)."""
        name = signal.Signals(self.signum or signal.SIGINT).name
        where = f"step {step} (epoch {epoch + 1}, batch {batch} of {batches})"
        return TrainStopped(
            f"stopped by {name} after {where}; its checkpoint is {checkpoint}: "
            f"continue the run with --resume --out {run_dir}",
            self.signum or signal.SIGINT,
            quiet=not main,
        )
