"""The videos of ``gpufeed bench clips`` and ``bench train --task clips``, generated once and cached.

Synthetic 30 fps h264 videos with a long GOP (textured, noisy, with a moving blob, so decoding
costs what camera video costs; every frame tagged with its index), the same videos after
``gpufeed prepare``, and after ``gpufeed prepare --store folder|hdf5`` (JPEG frames).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpufeed.core import progress_bar
from gpufeed.pipelines import PrepareOptions, prepare_videos
from gpufeed.synth import behaviour_labels, tag_blocks, write_label_csv

__all__ = ["make_bench_videos", "make_camera_videos", "prepared_bench_videos", "stored_bench_videos"]


def _render(index: int, video_id: int, size: int, texture: np.ndarray, rng) -> np.ndarray:
    frame = texture.copy()
    t = index / 30.0
    cy, cx = size / 2 + size / 3 * np.sin(t * 0.7 + video_id), size / 2 + size / 3 * np.cos(t * 0.5)
    yy, xx = np.ogrid[:size, :size]
    blob = ((yy - cy) / (size / 10)) ** 2 + ((xx - cx) / (size / 7)) ** 2 < 1
    frame[blob] = (70, 50, 40)
    frame = np.clip(frame.astype(np.int16) + rng.integers(-6, 7, frame.shape), 0, 255).astype(np.uint8)
    return _tag(frame, index, video_id)


def _tag(frame: np.ndarray, index: int, video_id: int) -> np.ndarray:
    """The frame with its tag: flat squares around each quadrant centre, where read_tag samples."""
    blocks = tag_blocks(index, video_id)
    size = frame.shape[0]
    half = size // 2
    side = max(8, size * 3 // 16)
    for r in range(2):
        for c in range(2):
            y0, x0 = r * half + half // 2 - side // 2, c * half + half // 2 - side // 2
            frame[y0 : y0 + side, x0 : x0 + side] = blocks[r, c]
    return frame


def _camera_scene(size: int, rng) -> np.ndarray:
    """A still scene twice the frame's size: smooth light and shapes, a fine low-contrast texture."""
    side = 2 * size
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32)
    scene = np.zeros((side, side, 3), np.float32)
    for _ in range(12):
        cx, cy, r = rng.uniform(0, side), rng.uniform(0, side), rng.uniform(0.05, 0.3) * side
        scene += np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))[..., None] * rng.uniform(0, 255, 3)
    scene = scene / max(float(scene.max()), 1.0) * 200 + 20
    scene += 8 * np.sin(xx / 3.1 + yy / 4.7)[..., None]  # bedding, fur, floor texture
    return scene


def _camera_frame(index: int, video_id: int, size: int, scene: np.ndarray, rng) -> np.ndarray:
    """A camera-like frame: a slow pan over the scene, an animal moving, sensor noise, the tag."""
    t = index / 30.0
    oy = int(size / 2 + size / 3 * np.sin(t * 0.11 + video_id))
    ox = int(size / 2 + size / 3 * np.cos(t * 0.07))
    frame = scene[oy : oy + size, ox : ox + size].copy()
    cy, cx = size / 2 + size / 3 * np.sin(t * 0.9 + video_id), size / 2 + size / 3 * np.cos(t * 0.6)
    yy, xx = np.ogrid[:size, :size]
    body = ((yy - cy) / (size / 9)) ** 2 + ((xx - cx) / (size / 6)) ** 2
    frame -= np.clip(1.2 - body, 0, 1)[..., None] * 120
    frame += rng.normal(0, 4.0, frame.shape)
    return _tag(np.clip(frame, 0, 255).astype(np.uint8), index, video_id)


def make_camera_videos(folder: Path, count=4, seconds=60, fps=30, size=256, seed=0) -> Path:
    """Camera-like tagged h264 videos with B-frames and irregular GOPs, in ``folder/<params>/videos``.

    A slow pan over a smooth scene with a moving animal and sensor noise, encoded as a camera
    or a screen recorder does: x264's default B-frames (3, pyramid), scene-cut keyframes, and
    keyframes forced at irregular intervals (60 to 300 frames). Reused when present.
    """
    from fractions import Fraction

    import av

    target = Path(folder) / f"camera-{count}x{seconds}s-{fps}fps-{size}px-bframes-{seed}" / "videos"
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    frames = seconds * fps
    with progress_bar(total=count * frames, desc="camera videos", unit="frame") as bar:
        for video_id in range(count):
            rng = np.random.default_rng([seed, video_id, 1])
            scene = _camera_scene(size, rng)
            keys = set(np.cumsum(rng.integers(60, 301, frames)).tolist())
            path = target / f"camera_{video_id:03d}.mp4"
            with av.open(str(path), "w") as container:
                stream = container.add_stream("libx264", rate=Fraction(fps, 1))
                stream.width = stream.height = size
                stream.pix_fmt = "yuv420p"
                stream.options = {"crf": "20", "bf": "3", "b_pyramid": "normal", "g": "300", "keyint_min": "25"}
                for index in range(frames):
                    frame = av.VideoFrame.from_ndarray(_camera_frame(index, video_id, size, scene, rng), format="rgb24")
                    frame.pts = index
                    if index in keys:
                        frame.pict_type = av.video.frame.PictureType.I
                    for packet in stream.encode(frame):
                        container.mux(packet)
                    bar.update(1)
                for packet in stream.encode():
                    container.mux(packet)
            write_label_csv(path.with_suffix(".csv"), behaviour_labels(frames, seed=video_id))
    (target / ".complete").touch()
    return target


def make_bench_videos(folder: Path, count=4, seconds=120, fps=30, size=256, gop=250, seed=0) -> Path:
    """Long-GOP tagged h264 videos (and label CSVs) in ``folder/<params>/videos``; reused when present."""
    from fractions import Fraction

    import av

    target = Path(folder) / f"clips-{count}x{seconds}s-{fps}fps-{size}px-gop{gop}-{seed}" / "videos"
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    frames = seconds * fps
    with progress_bar(total=count * frames, desc="bench videos", unit="frame") as bar:
        for video_id in range(count):
            rng = np.random.default_rng([seed, video_id])
            texture = np.clip(rng.normal(128, 40, (size, size, 3)), 0, 255).astype(np.uint8)
            path = target / f"clip_{video_id:03d}.mp4"
            with av.open(str(path), "w") as container:
                stream = container.add_stream("libx264", rate=Fraction(fps, 1))
                stream.width = stream.height = size
                stream.pix_fmt = "yuv420p"
                stream.options = {"crf": "23", "g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"}
                for index in range(frames):
                    frame = av.VideoFrame.from_ndarray(_render(index, video_id, size, texture, rng), format="rgb24")
                    frame.pts = index
                    for packet in stream.encode(frame):
                        container.mux(packet)
                    bar.update(1)
                for packet in stream.encode():
                    container.mux(packet)
            write_label_csv(path.with_suffix(".csv"), behaviour_labels(frames, seed=video_id))
    (target / ".complete").touch()
    return target


def prepared_bench_videos(videos: Path, clip_length_frames: int, stride_frames: int) -> Path:
    """``gpufeed prepare`` of the bench videos (default options for the clip), cached beside them."""
    options = PrepareOptions(clip_length_frames=clip_length_frames, stride_frames=stride_frames, probe_clips=0)
    o = options
    target = videos.parent / f"prepared-{o.codec}-gop{o.resolved_gop_frames}-crf{o.crf}-{o.tune}"
    if (target / ".complete").exists():
        return target
    report = prepare_videos(videos, target, options)
    if not report.ok:
        raise RuntimeError(f"preparing the benchmark videos failed:\n{report.table()}")
    (target / ".complete").touch()
    return target


def stored_bench_videos(videos: Path, store: str, image_format: str = "jpeg") -> Path:
    """The bench videos as frame folders or HDF5 files (``gpufeed prepare --store``), cached beside them."""
    options = PrepareOptions(store=store, image_format=image_format, probe_clips=0)
    target = videos.parent / f"{store}-{image_format}-q{options.jpeg_quality}"
    if (target / ".complete").exists():
        return target
    report = prepare_videos(videos, target, options)
    if not report.ok:
        raise RuntimeError(f"storing the benchmark videos as {store} failed:\n{report.table()}")
    (target / ".complete").touch()
    return target
