"""Which clips a PyAV worker reads in what order, and which frames the plan's next batches read.

:func:`clip_read_order` orders a batch by (video, start) so that a worker meets a video's clips
forward; :func:`starts_ahead` names the clips the next batches read, so that a worker decoding a
video on its way to one clip keeps those frames for later clips (:class:`~gpufeed.pipelines._pyav.ClipDecoder`),
and :func:`ahead_batches` bounds how far it looks (the memory the kept frames take).

Imported by DALI's worker processes (numpy and ``gpufeed.core._size`` only).
"""

from __future__ import annotations

import numpy as np

from gpufeed.core import SizePx
from gpufeed.pipelines._clip_plan import ClipPlan, PlanRows

__all__ = ["PARK_BATCHES", "ahead_batches", "clip_read_order", "plan_read_order", "starts_ahead"]


def clip_read_order(videos: np.ndarray, starts: np.ndarray, batch_size: int) -> np.ndarray:
    """The order :class:`~gpufeed.pipelines._pyav_clips.PyAVClips` reads one batch's rows in: by (video, start), plan rows as positions.

    DALI hands each worker process a contiguous run of a batch's samples, so in this order a
    worker reads the clips of a video one after another, forward, and the decoder
    continues from one clip to the next when they share a GOP instead of seeking back. Rows past
    a short batch (``len(videos) < batch_size``) keep their places. Output row ``r`` is plan row
    ``order[r]``; its tag says so and the loader puts the rows back in plan order.
    """
    n = len(videos)
    return np.concatenate([np.lexsort((np.asarray(starts), np.asarray(videos))), np.arange(n, batch_size)])


def plan_read_order(rows: PlanRows) -> np.ndarray:
    """:func:`clip_read_order` of one iteration's rows."""
    return clip_read_order(*rows.clips(), rows.batch_size)


# Fitted frames a worker keeps for the next batches' clips, at most (the look-ahead is cut to fit).
_KEPT_BYTES = 64 << 20
_AHEAD_BATCHES = 16
# Batches whose clips may keep a decoder where it stands (pipelines._pyav_decoders), whatever the kept frames' window:
# long-GOP bench videos, two workers simulated over 120 batches: 58 decoded frames a clip with 16, 54-55 with 32-128,
# for no less CPU (more decoders opened, and a longer plan to scan each batch).
PARK_BATCHES = _AHEAD_BATCHES


def ahead_batches(batch_size: int, clip_length_frames: int, size_px: SizePx) -> int:
    """Batches a worker looks ahead: :data:`_AHEAD_BATCHES`, fewer when their frames would pass :data:`_KEPT_BYTES`."""
    batch_bytes = batch_size * clip_length_frames * size_px.width_px * size_px.height_px * 3
    return max(0, min(_AHEAD_BATCHES, _KEPT_BYTES // max(1, batch_bytes) - 1))


def starts_ahead(plan: ClipPlan, first: int, batches: int) -> dict[int, np.ndarray]:
    """Video id -> the sorted first frames of the clips of iterations ``first`` .. ``first + batches - 1``."""
    if batches <= 0:
        return {}
    rows = [plan[k].clips() for k in range(first, first + batches)]
    videos = np.concatenate([v for v, _ in rows])
    starts = np.concatenate([s for _, s in rows])
    return {int(v): np.unique(starts[videos == v]) for v in np.unique(videos)}
