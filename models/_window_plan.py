"""Where a clip model's windows start in a video and which frames each reads (:class:`WindowPlan`).

The windows and the rule that joins their scores are described in :mod:`gpufeed.models._frame_scores`,
which scores them; the plan alone is here, for the scorer and for whatever needs to count windows
(``predict``'s report, the server's limits) without scoring.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["WindowPlan"]


@dataclass(frozen=True)
class WindowPlan:
    """Where windows start in a video and which frames each reads (see :mod:`gpufeed.models._frame_scores`).

    Attributes:
        clip_length_frames: Frames per window (the model's ``T``).
        stride_frames: Gap between a window's consecutive frames.
        hop_frames: Distance between consecutive window starts; at most :attr:`span_frames`.
    """

    clip_length_frames: int
    stride_frames: int = 1
    hop_frames: int = 1

    def __post_init__(self) -> None:
        for name in ("clip_length_frames", "stride_frames", "hop_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} {value!r} must be an integer >= 1")
        if self.hop_frames > self.span_frames:
            raise ValueError(
                f"hop_frames {self.hop_frames} leaves frames no window covers: it must be 1..{self.span_frames} "
                f"(a window of {self.clip_length_frames} frames, {self.stride_frames} apart, covers "
                f"{self.span_frames})"
            )

    @property
    def span_frames(self) -> int:
        """Frames from a window's first frame to its last, inclusive: the frames it covers."""
        return (self.clip_length_frames - 1) * self.stride_frames + 1

    def window_count(self, num_frames: int) -> int:
        """Windows in a video of ``num_frames``: one every ``hop_frames``, plus one ending at the last frame."""
        if num_frames < 1:
            raise ValueError(f"a video of {num_frames} frames has no window")
        last = max(0, num_frames - self.span_frames)
        return last // self.hop_frames + 1 + (1 if last % self.hop_frames else 0)

    def start_of(self, window: int, num_frames: int) -> int:
        """First frame of window ``window`` (0-based) of a video of ``num_frames``."""
        return min(window * self.hop_frames, max(0, num_frames - self.span_frames))

    def starts(self, num_frames: int) -> np.ndarray:
        """Every window's start, ascending (:meth:`window_count` of them; for small videos and tests)."""
        count = self.window_count(num_frames)
        return np.minimum(np.arange(count, dtype=np.int64) * self.hop_frames, max(0, num_frames - self.span_frames))

    def frames_of(self, start: int, num_frames: int) -> np.ndarray:
        """The frame indices window ``start`` reads (past the end: the last frame again)."""
        frames = start + np.arange(self.clip_length_frames, dtype=np.int64) * self.stride_frames
        return np.minimum(frames, num_frames - 1)

    def _starts_between(self, first: int, end: int, num_frames: int) -> np.ndarray:
        # Windows first..end - 1 only: the scorer's batches, so memory stays a batch's whatever the length.
        windows = np.arange(first, end, dtype=np.int64)
        return np.minimum(windows * self.hop_frames, max(0, num_frames - self.span_frames))

    def _frames_of_starts(self, starts: np.ndarray, num_frames: int) -> np.ndarray:
        # frames_of for many windows at once: (N, T), row k the frames window starts[k] reads.
        offsets = np.arange(self.clip_length_frames, dtype=np.int64) * self.stride_frames
        return np.minimum(starts[:, None] + offsets, num_frames - 1)

    def covered_end(self, start: int, num_frames: int) -> int:
        """One past the last frame window ``start`` covers."""
        return min(start + self.span_frames, num_frames)

    def coverage(self, num_frames: int) -> np.ndarray:
        """How many windows cover each frame (every entry >= 1)."""
        counts = np.zeros(num_frames + 1, dtype=np.int64)
        starts = self.starts(num_frames)
        np.add.at(counts, starts, 1)
        np.add.at(counts, np.minimum(starts + self.span_frames, num_frames), -1)
        return np.cumsum(counts)[:num_frames]
