"""How long a training loop waits for each batch, epoch by epoch: the cost of an epoch boundary.

:func:`measure_epoch_waits` reads a few epochs from any gpufeed loader the way a training loop
does (``set_epoch``, then ``next`` until the epoch ends), optionally spending ``step_s`` per batch
as stand-in compute (a GPU step, during which the loader should be preparing the next batches),
and records the time blocked in each ``next``. The figure that shows whether pipelines persist
across epochs is each epoch's first batch against the median batch::

    waits = measure_epoch_waits(loader, epochs=3, step_s=0.02)
    print(waits.table())
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

__all__ = ["EpochWaits", "measure_epoch_waits"]


@dataclass(frozen=True)
class EpochWaits:
    """Seconds blocked in ``next(loader)`` per batch, per epoch.

    Attributes:
        waits_s: ``waits_s[e][b]``: epoch ``e`` (counted from the first measured), batch ``b``.
        step_s: The stand-in compute spent after each batch.
        pipeline_builds: Pipelines the loader built while measured (``None``: it does not say).
    """

    waits_s: tuple[tuple[float, ...], ...]
    step_s: float
    pipeline_builds: int | None

    @property
    def first_batch_s(self) -> list[float]:
        """Each epoch's first wait (pipeline start and anything not prefetched across the boundary)."""
        return [epoch[0] for epoch in self.waits_s if epoch]

    @property
    def median_s(self) -> float:
        """Median wait over all batches but each epoch's first."""
        rest = [w for epoch in self.waits_s for w in epoch[1:]]
        return statistics.median(rest) if rest else float("nan")

    def to_dict(self) -> dict:
        return {
            "step_s": self.step_s,
            "pipeline_builds": self.pipeline_builds,
            "first_batch_s": self.first_batch_s,
            "median_s": self.median_s,
            "waits_s": [list(epoch) for epoch in self.waits_s],
        }

    def table(self) -> str:
        """One line per epoch: first batch, median of the rest, total wait."""
        lines = [f"{'epoch':>5}  {'batches':>7}  {'first batch':>11}  {'median rest':>11}  {'total wait':>10}"]
        for e, epoch in enumerate(self.waits_s):
            rest = statistics.median(epoch[1:]) if len(epoch) > 1 else float("nan")
            lines.append(
                f"{e:>5}  {len(epoch):>7}  {epoch[0] * 1e3:>8.1f} ms  {rest * 1e3:>8.1f} ms  {sum(epoch):>8.3f} s"
            )
        lines.append(f"median batch wait (first batches left out): {self.median_s * 1e3:.1f} ms")
        if self.pipeline_builds is not None:
            lines.append(f"pipelines built: {self.pipeline_builds}")
        return "\n".join(lines)


def measure_epoch_waits(loader, epochs: int, step_s: float = 0.0, first_epoch: int | None = None) -> EpochWaits:
    """Read ``epochs`` epochs like a training loop and time each wait for a batch.

    Args:
        loader: An :class:`~gpufeed.pipelines.ImageLoader` or :class:`~gpufeed.pipelines.ClipLoader`.
        epochs: Epochs to read.
        step_s: Stand-in compute per batch (slept, so the loader's threads have the CPU meanwhile).
        first_epoch: Epoch to start at (default: the loader's current one).
    """
    start = loader.epoch if first_epoch is None else first_epoch
    builds_before = getattr(loader, "pipeline_builds", None)
    waits = []
    for epoch in range(start, start + epochs):
        loader.set_epoch(epoch)
        iterator = iter(loader)
        times = []
        while True:
            began = time.perf_counter()
            try:
                next(iterator)
            except StopIteration:
                break
            times.append(time.perf_counter() - began)
            if step_s:
                time.sleep(step_s)
        waits.append(tuple(times))
    builds = None if builds_before is None else loader.pipeline_builds - builds_before
    return EpochWaits(tuple(waits), step_s, builds)
