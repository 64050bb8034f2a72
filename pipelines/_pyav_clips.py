"""The PyAV worker feed of the clip loader: each worker process decodes its share of a plan's batches.

Imported by DALI's parallel ``external_source`` worker processes (numpy, PyAV and light gpufeed modules).
"""

from __future__ import annotations

import numpy as np

from gpufeed.core import SizePx, WorkerCallback
from gpufeed.pipelines._clip_plan import ClipPlan
from gpufeed.pipelines._clip_read_plan import PARK_BATCHES, ahead_batches, plan_read_order, starts_ahead
from gpufeed.pipelines._frame_fit import FrameFitter
from gpufeed.pipelines._pyav import ClipDecoder, VideoRef

__all__ = ["PyAVClips"]


class PyAVClips(WorkerCallback):
    """Per-sample callback for DALI's parallel ``external_source``: the clips of a plan, decoded with PyAV.

    DALI's workers call it with ``sample_info``; sample ``idx_in_batch`` of pipeline iteration
    ``iteration`` is row ``order[idx_in_batch]`` of ``plan[iteration]`` (the
    :func:`~gpufeed.pipelines._clip_read_plan.clip_read_order`), so the workers start once and read epoch after epoch with no message
    from the loader: everything is a pure function of the (picklable) plan and video facts.
    Returns ``(frames (T, H, W, 3) uint8, tag (1,) int64)``, frames fitted to ``size_px`` (see
    :class:`FrameFitter`), tag ``iteration * batch_size + order[idx_in_batch]``. Rows past a short
    plan batch (DALI's batches here are always full) are black frames the loader drops. Each
    worker keeps its :class:`ClipDecoder` (open files, decoder positions) for as long as the
    pipeline lives, epoch after epoch, and names to it the clips of the plan's next batches
    (:func:`~gpufeed.pipelines._clip_read_plan.starts_ahead`), so that frames it decodes on the
    way to one clip serve later ones.

    Args:
        plan: The clips of each iteration (:class:`~gpufeed.pipelines._clip_plan.ClipPlan`).
        videos: :class:`VideoRef` per video id.
        clip_length_frames, stride_frames: Which frames a clip holds from its start.
        size_px, fit: The output size and fit (:class:`FrameFitter`).
    """

    def __init__(
        self,
        plan: ClipPlan,
        videos: list[VideoRef],
        *,
        clip_length_frames: int,
        stride_frames: int,
        size_px: SizePx,
        fit: str,
    ) -> None:
        self.plan, self.videos = plan, videos
        self.offsets = np.arange(clip_length_frames, dtype=np.int64) * stride_frames
        self.size, self.fit = size_px, fit
        self._decoder: ClipDecoder | None = None
        self._batch: tuple[int | None, tuple | None] = (None, None)  # (iteration, its rows): a worker reads many
        self._ahead: dict[int, np.ndarray] = {}  # video id -> first frames of the next batches' clips
        self._awaited: dict[int, np.ndarray] = {}  # the same over park_batches (decoders left where a clip continues)
        self.ahead_batches = ahead_batches(plan.batch_size, len(self.offsets), size_px)
        # Decoders left standing cost no kept frames: their window does not shrink with the batch's bytes.
        self.park_batches = max(self.ahead_batches, PARK_BATCHES)
        # PyAV imported here, in the loader's process, so that forked workers inherit it instead of each
        # importing it inside its first clip (first batch 0.16-0.35 s against 0.24-0.6 s, prepared h264, load 5).
        import av.video.reformatter  # noqa: F401

    def __getstate__(self):
        state = super().__getstate__()
        state["_decoder"] = None  # open files do not travel to worker processes
        state["_batch"] = (None, None)
        state["_ahead"] = {}
        state["_awaited"] = {}
        return state

    def _rows(self, iteration: int):
        """(video ids, starts, plan row of each) of ``iteration`` in its read order."""
        cached, rows = self._batch
        if cached != iteration:
            plan_rows = self.plan[iteration]
            videos, starts = plan_rows.clips()
            order = plan_read_order(plan_rows)
            n = plan_rows.count
            rows = (videos[order[:n]], starts[order[:n]], order)
            self._batch = (iteration, rows)
            self._look_ahead(iteration)
        return rows

    def _look_ahead(self, iteration: int) -> None:
        """On a worker's first clip of ``iteration``: the clips of the next batches; kept frames no longer read dropped."""
        if self._decoder is None:
            self._decoder = ClipDecoder(fitter=FrameFitter(self.size, self.fit))
        self._ahead = starts_ahead(self.plan, iteration + 1, self.ahead_batches)
        same = self.park_batches == self.ahead_batches
        self._awaited = self._ahead if same else starts_ahead(self.plan, iteration + 1, self.park_batches)
        still = starts_ahead(self.plan, iteration, self.ahead_batches + 1)  # this batch's clips may be kept already
        offsets = self.offsets
        self._decoder.retain(
            {self.videos[v].path: frozenset((s[:, None] + offsets).ravel().tolist()) for v, s in still.items()}
        )

    def __call__(self, sample_info):
        k, j = int(sample_info.iteration), int(sample_info.idx_in_batch)
        videos, starts, order = self._rows(k)
        tag = np.array([k * self.plan.batch_size + int(order[j])], dtype=np.int64)
        if j >= len(videos):
            return np.zeros((len(self.offsets), *self.size.hw, 3), dtype=np.uint8), tag
        assert self._decoder is not None, "made by _rows"
        video = int(videos[j])
        clip = self._decoder.read(
            self.videos[video], int(starts[j]) + self.offsets, self._ahead.get(video), self._awaited.get(video)
        )
        return clip, tag
