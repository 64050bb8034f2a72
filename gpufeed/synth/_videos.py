"""Synthetic h264 behaviour videos: every frame carries its index; a CSV labels every frame.

Each video ``<name>.mp4`` (h264, yuv420p, constant frame rate) has a ``<name>.csv`` beside it with
a header ``frame,background,groom,rear,walk`` and one multi-hot row per frame, DeepEthogram style:
``background`` is 1 exactly when no other behaviour is active.

Frame layout (width > height): the central square holds the tag (frame index, video id); the left
margin shows one band per behaviour, bright while it is active, so a clip model can learn the
labels from the pixels; the right margin holds a bar that moves with time.
"""

from __future__ import annotations

import csv
from fractions import Fraction
from pathlib import Path

import numpy as np

from gpufeed.synth._tags import draw_tag

__all__ = ["BEHAVIOURS", "behaviour_labels", "render_frame", "write_label_csv", "write_video"]

BEHAVIOURS = ("background", "groom", "rear", "walk")
"""The behaviour columns of the synthetic videos' label CSVs."""


def behaviour_labels(num_frames: int, seed: int) -> np.ndarray:
    """A (num_frames, len(BEHAVIOURS)) uint8 multi-hot matrix of bouts of behaviour."""
    rng = np.random.default_rng(seed)
    active = np.zeros((num_frames, len(BEHAVIOURS) - 1), dtype=np.uint8)
    for k in range(active.shape[1]):
        t = int(rng.integers(0, 12))
        while t < num_frames:
            length = int(rng.integers(6, 24))
            active[t : t + length, k] = 1
            t += length + int(rng.integers(8, 40))
    background = (active.sum(axis=1) == 0).astype(np.uint8)[:, None]
    return np.concatenate([background, active], axis=1)


def render_frame(frame_index: int, video_id: int, labels: np.ndarray, width: int, height: int) -> np.ndarray:
    """One HWC uint8 RGB frame: tag in the central square, behaviour bands, a moving bar."""
    frame = np.full((height, width, 3), 40, dtype=np.uint8)
    margin = (width - height) // 2
    behaviours = len(labels) - 1
    band = max(1, height // behaviours)
    for k in range(behaviours):
        if labels[k + 1]:
            frame[k * band : (k + 1) * band, :margin] = (230, 230, 230)
    if margin > 0:
        y = (frame_index * 3) % height
        frame[y : y + 4, width - margin :] = (250, 200, 40)
    return draw_tag(frame, frame_index, video_id)


def write_label_csv(path: Path, labels: np.ndarray) -> None:
    """Write the per-frame label CSV (``frame`` column then one column per behaviour)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(("frame", *BEHAVIOURS))
        for index, row in enumerate(labels):
            writer.writerow((index, *map(int, row)))


def write_video(
    path: Path,
    video_id: int,
    num_frames: int,
    width: int = 96,
    height: int = 64,
    fps: int = 30,
    gop_frames: int = 30,
    seed: int = 0,
    progress=None,
) -> np.ndarray:
    """Encode a tagged h264 mp4 and its label CSV; return the label matrix.

    Args:
        gop_frames: Keyframe interval. Encoded with a fixed GOP (no scene-cut keyframes), so
            keyframes sit exactly at multiples of it.
    """
    import av  # PyAV: imported here so that reading images never needs it

    labels = behaviour_labels(num_frames, seed=seed * 1000 + video_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps, 1))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.options = {"crf": "16", "g": str(gop_frames), "keyint_min": str(gop_frames), "sc_threshold": "0"}
        for index in range(num_frames):
            rgb = render_frame(index, video_id, labels[index], width, height)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
            if progress is not None:
                progress.update(1)
        for packet in stream.encode():
            container.mux(packet)
    write_label_csv(path.with_suffix(".csv"), labels)
    return labels
