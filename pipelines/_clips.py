"""Which clips an epoch reads: (video, start frame) pairs, decided in gpufeed, not in DALI.

A clip of length ``L`` and stride ``d`` starting at frame ``s`` holds frames ``s, s + d, ...,
s + (L - 1) * d``: it *spans* ``(L - 1) * d + 1`` frames and its valid starts are ``0 ..
num_frames - span``, so no clip ever runs past the end of its video.

**Clip slots.** Each usable video is tiled with non-overlapping clips every ``L * d`` frames, plus
one clip aligned to the video's end when the tiling stops short of the last valid start, so
evaluation reaches the last frame. A slot id is a position in that table (videos in id order, starts ascending).

* **Evaluation** reads each slot at its tiled start, in slot order: every clip in order.
* **Training** reads each slot at a random start drawn uniformly from the slot's whole video
  (``0 .. num_frames - span``), a pure function of (seed, epoch, slot id); with
  ``loader.shuffle`` the slot order is permuted per epoch (:func:`plan_epoch`), so batches mix
  random videos, each drawn in proportion to its length, at random positions.

Because the sampling is a function of (seed, epoch, slot) only, every decoder (DALI on the GPU,
DALI on the CPU, PyAV) reads the identical sequence of clips, and resuming mid-epoch replays it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpufeed.pipelines._windows import hash_uniforms

__all__ = ["ClipGeometry", "ClipTable"]


@dataclass(frozen=True)
class ClipGeometry:
    """Clip length and stride, and the frame arithmetic that follows from them."""

    clip_length_frames: int = 11
    stride_frames: int = 1

    def __post_init__(self) -> None:
        if self.clip_length_frames < 1 or self.stride_frames < 1:
            raise ValueError(
                f"clip_length_frames ({self.clip_length_frames}) and stride_frames ({self.stride_frames}) must be >= 1"
            )

    @property
    def span_frames(self) -> int:
        """Frames from a clip's first to its last frame, inclusive."""
        return (self.clip_length_frames - 1) * self.stride_frames + 1

    @property
    def hop_frames(self) -> int:
        """Distance between consecutive evaluation clips (``L * stride``)."""
        return self.clip_length_frames * self.stride_frames

    @property
    def centre_offset(self) -> int:
        """Position in the clip of its centre frame (``L // 2``; the later one for even ``L``)."""
        return self.clip_length_frames // 2

    def max_start(self, num_frames: int) -> int:
        """Last valid start in a video of ``num_frames`` (negative: too short for one clip)."""
        return num_frames - self.span_frames

    def frames(self, start: int) -> np.ndarray:
        """The frame indices of the clip starting at ``start``."""
        return start + np.arange(self.clip_length_frames, dtype=np.int64) * self.stride_frames

    def eval_starts(self, num_frames: int) -> np.ndarray:
        """Tiled starts every ``hop_frames``, plus the last valid start when the tiling misses it."""
        last = self.max_start(num_frames)
        if last < 0:
            return np.zeros(0, dtype=np.int64)
        starts = np.arange(0, last + 1, self.hop_frames, dtype=np.int64)
        if starts[-1] != last:
            starts = np.append(starts, last)
        return starts


@dataclass(frozen=True)
class ClipTable:
    """The clip slots of a set of videos.

    Attributes:
        geometry: Clip length and stride.
        slot_video: (S,) int64 video id of each slot.
        slot_start: (S,) int64 tiled (evaluation) start of each slot.
        max_start: (num_videos,) int64 last valid start per video (-1 for unusable videos).
    """

    geometry: ClipGeometry
    slot_video: np.ndarray
    slot_start: np.ndarray
    max_start: np.ndarray

    @classmethod
    def build(cls, num_frames: np.ndarray, usable_ids: np.ndarray, geometry: ClipGeometry) -> ClipTable:
        """Slots for the videos ``usable_ids`` whose frame counts are ``num_frames[video id]``."""
        videos, starts = [], []
        max_start = np.full(len(num_frames), -1, dtype=np.int64)
        for vid in np.asarray(usable_ids, dtype=np.int64):
            tiled = geometry.eval_starts(int(num_frames[vid]))
            if len(tiled):
                max_start[vid] = geometry.max_start(int(num_frames[vid]))
            videos.append(np.full(len(tiled), vid, dtype=np.int64))
            starts.append(tiled)
        cat = (lambda parts: np.concatenate(parts)) if videos else (lambda parts: np.zeros(0, np.int64))
        return cls(geometry, cat(videos), cat(starts), max_start)

    def __len__(self) -> int:
        return len(self.slot_video)

    def slots_of(self, video_ids) -> np.ndarray:
        """Slot ids belonging to the given videos."""
        return np.flatnonzero(np.isin(self.slot_video, np.asarray(list(video_ids), dtype=np.int64)))

    def clips(self, slots: np.ndarray, *, train: bool, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(video ids, start frames) of the given slots for this epoch (see the module docs)."""
        slots = np.asarray(slots, dtype=np.int64)
        videos = self.slot_video[slots]
        if not train:
            return videos, self.slot_start[slots].copy()
        u = hash_uniforms(seed, epoch, slots, 1)[:, 0]
        starts = np.floor(u * (self.max_start[videos] + 1)).astype(np.int64)
        return videos, np.minimum(starts, self.max_start[videos])
