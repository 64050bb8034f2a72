"""A warning when the training loop has waited long for its next batch.

An object store that accepts connections but stops answering (a network partition, a stopped
server), or a stalled network file system, left a run silent: no step, no log line, for as long
as the readers' retries lasted (minutes), and a Ctrl-C or SIGTERM then said "stopping after this
step" of a step that could not come. :class:`StallWatch` says so after ``after_s`` seconds of
waiting, and again every ``every_s``, naming the batch and, when a stop was asked meanwhile,
that a second signal stops at once (without a checkpoint of this step).

Its thread polls a timestamp once a second: nothing is added to a step but two attribute writes.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterator

__all__ = ["StallWatch"]

log = logging.getLogger("gpufeed")


class StallWatch:
    """Warns while :meth:`watch` blocks longer than ``after_s`` (see the module docs).

    Args:
        stop: Whose ``signum`` says a stop was asked (a :class:`~gpufeed.train._stop.StopRequest`).
        after_s: Seconds of waiting before the first warning.
        every_s: Seconds between the warnings of one wait.
        poll_s: How often the thread looks.
    """

    def __init__(self, stop=None, after_s: float = 60.0, every_s: float = 300.0, poll_s: float = 1.0) -> None:
        self.stop, self.after_s, self.every_s, self.poll_s = stop, after_s, every_s, poll_s
        self._since: float | None = None
        self._where = (0, 0)
        self.warnings = 0
        # The thread holds the watch weakly: it ends within a poll once the loop drops it.
        threading.Thread(target=_poll, args=(weakref.ref(self), poll_s), name="gpufeed-stall", daemon=True).start()

    @contextlib.contextmanager
    def watch(self, epoch: int, batch: int) -> Iterator[None]:
        """Time the wait for batch ``batch`` (0-based) of epoch ``epoch`` (0-based)."""
        self._where, self._since = (epoch, batch), time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def check(self, now: float, due: float) -> float:
        """Warn if the current wait has passed ``due`` seconds; the wait at which to warn next."""
        since = self._since
        if since is None:
            return due
        waited = now - since
        if waited < due:
            return due
        epoch, batch = self._where
        stop = getattr(self.stop, "signum", None)
        asked = " A stop was asked: it comes after this step; a second signal stops at once." if stop else ""
        log.warning(
            "the training loader has waited %.0f s for batch %d of epoch %d: its data is not arriving "
            "(an object store that stopped answering, a stalled network file system); training goes on "
            "when it does.%s",
            waited, batch + 1, epoch + 1, asked,
        )  # fmt: skip
        self.warnings += 1
        return due + self.every_s


def _poll(ref: weakref.ref, poll_s: float) -> None:
    due, waiting_since = 0.0, None
    while True:
        time.sleep(poll_s)
        watch = ref()
        if watch is None:
            return
        if watch._since != waiting_since:  # a new wait (or none): the first warning's delay again
            waiting_since, due = watch._since, watch.after_s
        due = watch.check(time.monotonic(), due)
        del watch
