"""Ctrl-C or SIGTERM stops a run after its current step, with a checkpoint of that step.

Before, SIGINT raised wherever the training thread was (``gpufeed train: interrupted``, exit 130)
and SIGTERM, what a scheduler sends before it pre-empts a job (Kubernetes, SLURM), killed the
process at once: either lost every step since the last checkpoint (``checkpoint_every_steps``
defaults to 500), and neither said how to go on. Now the first signal asks the loop to stop at the
end of the step it is in; the loop checkpoints that step, as ``checkpoint_every_steps`` would, and
ends with :class:`TrainStopped` naming the checkpoint and the ``--resume`` that continues it, exit
status 128 + the signal's number. A second signal stops at once, as before.

Only a run of one process asks: under ``torchrun`` the ranks would have to agree on the step to
stop at (a collective per step for a rare event), so each rank keeps the default behaviour there.
A signal its process ignores (``SIGINT`` in a job started with ``&``) stays ignored.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from gpufeed.train._errors import TrainError

__all__ = ["StopRequest", "TrainStopped"]

log = logging.getLogger("gpufeed")

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainStopped(TrainError):
    """The run stopped on a signal after checkpointing its last step; ``exit_status`` is 128 + the signal."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_status = 128 + signum


class StopRequest:
    """Catches SIGINT and SIGTERM while the block runs, if asked to and on the main thread.

    Args:
        enabled: Install the handlers (a run of one process); otherwise :attr:`signum` stays ``None``.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.signum: int | None = None  # the first signal received
        self._previous: dict[int, Any] = {}  # signal.signal's earlier handlers, as it returned them

    def __enter__(self) -> StopRequest:
        if not self.enabled or threading.current_thread() is not threading.main_thread():
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
            self.signum = signum
            log.warning(
                "%s: stopping after this step, with a checkpoint of it (%s again to stop at once)",
                signal.Signals(signum).name,
                signal.Signals(signum).name,
            )
            return
        self._restore()  # the second: as if gpufeed had never caught them
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)

    def stopped(self, step: int, epoch: int, batch: int, batches: int, checkpoint, run_dir) -> TrainStopped:
        """The error that ends the run, once step ``step``'s checkpoint is on disk."""
        name = signal.Signals(self.signum or signal.SIGINT).name
        where = f"step {step} (epoch {epoch + 1}, batch {batch} of {batches})"
        return TrainStopped(
            f"stopped by {name} after {where}; its checkpoint is {checkpoint}: "
            f"continue the run with --resume --out {run_dir}",
            self.signum or signal.SIGINT,
        )
