"""The videos of ``gpufeed bench clips`` and ``bench train --task clips``, generated once and cached.

Synthetic 30 fps h264 videos with a long GOP (textured, noisy, with a moving blob, so decoding
costs what camera video costs; every frame tagged with its index), the same videos after
``gpufeed prepare``, and after ``gpufeed prepare --store folder|hdf5`` (JPEG frames).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpufeed._progress import progress_bar
from gpufeed.pipelines import PrepareOptions, prepare_videos
from gpufeed.synth._tags import tag_blocks
from gpufeed.synth._videos import behaviour_labels, write_label_csv

__all__ = ["make_bench_videos", "prepared_bench_videos", "stored_bench_videos"]


def _render(index: int, video_id: int, size: int, texture: np.ndarray, rng) -> np.ndarray:
    frame = texture.copy()
    t = index / 30.0
    cy, cx = size / 2 + size / 3 * np.sin(t * 0.7 + video_id), size / 2 + size / 3 * np.cos(t * 0.5)
    yy, xx = np.ogrid[:size, :size]
    blob = ((yy - cy) / (size / 10)) ** 2 + ((xx - cx) / (size / 7)) ** 2 < 1
    frame[blob] = (70, 50, 40)
    frame = np.clip(frame.astype(np.int16) + rng.integers(-6, 7, frame.shape), 0, 255).astype(np.uint8)
    blocks = tag_blocks(index, video_id)
    half = size // 2
    side = max(8, size * 3 // 16)  # flat squares around each quadrant centre, where read_tag samples
    for r in range(2):
        for c in range(2):
            y0, x0 = r * half + half // 2 - side // 2, c * half + half // 2 - side // 2
            frame[y0 : y0 + side, x0 : x0 + side] = blocks[r, c]
    return frame


def make_bench_videos(folder: Path, count=4, seconds=120, fps=30, size=256, gop=250, seed=0) -> Path:
    """Long-GOP tagged h264 videos (and label CSVs) in ``folder/<params>/videos``; reused when present."""
    from fractions import Fraction

    import av

    target = Path(folder) / f"clips-{count}x{seconds}s-{fps}fps-{size}px-gop{gop}-{seed}" / "videos"
    if (target / ".complete").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    frames = seconds * fps
    with progress_bar(total=count * frames, desc="bench videos", unit="frame", leave=False) as bar:
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
