"""A plan stream's clips, batch by batch: computed once per batch and handed on as one object.

:class:`ClipDraw` is which clip each slot reads in an epoch (the table and the loader's ``train``
and ``seed``: :meth:`gpufeed.pipelines._clips.ClipTable.clips`, the one place a start is drawn).
:class:`ClipPlan` puts it over a :class:`~gpufeed.pipelines._sampler.PlanStream`: ``plan[k]`` is
pipeline iteration ``k``'s :class:`PlanRows`, the (video, start) of each of its ``batch_size``
rows in plan order, a short plan batch filled by repeating its last row (DALI's batches are always
full; the loader drops the filling). Everything that feeds or reads a clip pipeline (the reader's
list, the worker feeds, the crop windows, the augmentation, the loader's batch) takes the plan or
its rows; within one process each batch's rows are computed once.

This module is imported by DALI's worker processes (numpy only), and a plan pickles without its
cache, so every worker computes the rows of the batches it reads.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from gpufeed.pipelines._clips import ClipTable

__all__ = ["ClipDraw", "ClipPlan", "PlanRows"]

# Rows a plan keeps (16 bytes each): more than a DALI reader's file list holds (8192 lines, written
# when the pipeline is built), so the rows drawn for the list are the ones the crop windows, the
# augmentation and the loader's batches use later; the worker feeds keep as many of the batches they read.
_KEPT_ROWS = 16384


@dataclass(frozen=True)
class ClipDraw:
    """Which clip each slot of a :class:`~gpufeed.pipelines._clips.ClipTable` reads in an epoch.

    Attributes:
        table: The clip slots.
        train: Random starts (training) or each slot's tiled start (evaluation).
        seed: Seeds the random starts.
    """

    table: ClipTable
    train: bool
    seed: int

    def clips(self, slots, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(video ids, start frames) of the slots ``slots`` in ``epoch``."""
        return self.table.clips(slots, train=self.train, seed=self.seed, epoch=epoch)


@dataclass(frozen=True)
class PlanRows:
    """One pipeline iteration's clips in plan order, filled to the batch size.

    Attributes:
        iteration: The pipeline iteration ``k``; row ``j``'s tag is ``k * batch_size + j``.
        epoch: The plan batch's epoch.
        videos: (batch_size,) int64 video id of each row.
        starts: (batch_size,) int64 first frame of each row.
        count: Rows of the plan batch; rows past it repeat the last one and are dropped.
    """

    iteration: int
    epoch: int
    videos: np.ndarray
    starts: np.ndarray
    count: int

    @property
    def batch_size(self) -> int:
        return len(self.videos)

    @property
    def first_tag(self) -> int:
        """The tag of row 0 (``iteration * batch_size``)."""
        return self.iteration * self.batch_size

    def clips(self) -> tuple[np.ndarray, np.ndarray]:
        """(video ids, starts) of the plan batch's own rows, without the filling."""
        return self.videos[: self.count], self.starts[: self.count]


class ClipPlan:
    """The clips of a plan stream's iterations (see the module docs).

    Args:
        stream: The plan batches (:class:`~gpufeed.pipelines._sampler.PlanStream`).
        draw: Which clip each slot reads.
        batch_size: Rows per pipeline iteration.
    """

    def __init__(self, stream, draw: ClipDraw, batch_size: int) -> None:
        self.stream, self.draw, self.batch_size = stream, draw, int(batch_size)
        self._rows: OrderedDict[int, PlanRows] = OrderedDict()
        self._kept = max(16, _KEPT_ROWS // self.batch_size)

    def __getstate__(self) -> dict:
        return {"stream": self.stream, "draw": self.draw, "batch_size": self.batch_size}

    def __setstate__(self, state: dict) -> None:
        ClipPlan.__init__(self, state["stream"], state["draw"], state["batch_size"])

    def __getitem__(self, iteration: int) -> PlanRows:
        rows = self._rows.get(iteration)
        if rows is None:
            batch = self.stream[iteration]
            videos, starts = self.draw.clips(batch.sample_ids, batch.epoch)
            count, fill = len(videos), self.batch_size - len(videos)
            if fill:
                videos = np.concatenate([videos, np.full(fill, videos[-1])])
                starts = np.concatenate([starts, np.full(fill, starts[-1])])
            rows = PlanRows(int(iteration), batch.epoch, videos, starts, count)
            self._rows[iteration] = rows
            while len(self._rows) > self._kept:
                self._rows.popitem(last=False)
        return rows

    def __call__(self, iteration: int) -> tuple[np.ndarray, np.ndarray]:
        """(video ids, starts) of iteration ``iteration``'s rows, filled: the ``rows(k)`` the frame feeds take."""
        rows = self[iteration]
        return rows.videos, rows.starts
