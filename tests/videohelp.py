"""Helpers for the video tests: tagged videos in unusual encodings, and reading tags back."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from gpufeed.synth import behaviour_labels, read_tag, render_frame
from gpufeed.synth._videos import write_label_csv


def encode_tagged_video(
    path: Path,
    video_id: int,
    num_frames: int,
    *,
    codec: str = "libx264",
    width: int = 96,
    height: int = 64,
    pix_fmt: str = "yuv420p",
    options: dict | None = None,
    durations_ms: tuple[int, ...] = (),
    audio: bool = False,
    labels: bool = True,
    label_seed: int | None = None,
) -> np.ndarray:
    """Encode a video whose every frame carries its :mod:`gpufeed.synth` tag (frame index, video id).

    Args:
        codec, width, height, pix_fmt, options: The encoder and its settings (``options`` are the
            encoder's own, e.g. x264's ``bf``).
        durations_ms: Cycle of frame durations for a variable-frame-rate video (empty: 30 fps CFR).
        audio: Also mux a silent AAC track as long as the video.
        labels: Write the per-frame label CSV beside the video.
        label_seed: Seed of the behaviour labels (default: ``video_id``).

    Returns:
        The per-frame label rows.
    """
    import av  # the video extra's PyAV; only the video tests need it

    rows = behaviour_labels(num_frames, seed=video_id if label_seed is None else label_seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=Fraction(30, 1))
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if durations_ms:
            stream.codec_context.time_base = Fraction(1, 1000)
        stream.options = dict(options or {})
        sound = container.add_stream("aac", rate=16000) if audio else None
        t_ms = 0
        for index in range(num_frames):
            rgb = render_frame(index, video_id, rows[index], width, height)
            frame = av.VideoFrame.from_ndarray(rgb, format="rgb24")
            if durations_ms:
                frame.pts, frame.time_base = t_ms, Fraction(1, 1000)
                t_ms += durations_ms[index % len(durations_ms)]
            else:
                frame.pts = index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        if sound is not None:
            mux_silence(container, sound, int(16000 * num_frames / 30))
    if labels:
        write_label_csv(path.with_suffix(".csv"), rows)
    return rows


def mux_silence(container, sound, samples: int) -> None:
    """Encode ``samples`` of mono silence into the AAC stream ``sound`` (16 kHz) and mux them."""
    import av

    for start in range(0, samples, 1024):
        chunk = np.zeros((1, min(1024, samples - start)), dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(chunk, format="fltp", layout="mono")
        frame.sample_rate, frame.pts = 16000, start
        for packet in sound.encode(frame):
            container.mux(packet)
    for packet in sound.encode():
        container.mux(packet)


def write_odd_video(
    path: Path,
    video_id: int,
    num_frames: int,
    *,
    codec: str = "libx264",
    gop: int = 30,
    durations_ms: tuple[int, ...] = (),
    audio: bool = False,
    labels: bool = True,
) -> np.ndarray:
    """A tagged 96x64 video with a fixed GOP of ``gop`` frames (near-lossless x264 by default).

    Args:
        durations_ms: Cycle of frame durations for a variable-frame-rate video (empty: 30 fps CFR).
        audio: Also mux a silent AAC track.
    """
    if codec == "libx264":
        options = {"crf": "16", "g": str(gop), "keyint_min": str(gop), "sc_threshold": "0"}
    else:
        options = {"g": str(gop)}
    return encode_tagged_video(
        path, video_id, num_frames, codec=codec, options=options, durations_ms=durations_ms, audio=audio, labels=labels
    )


def frame_tags(frames, layout: str) -> list[tuple[int, int]]:
    """(frame index, video id) read from each frame of a clip (3, T, H, W) or a chunk (T, 3, H, W)."""
    if layout == "CTHW":
        frames = frames.permute(1, 0, 2, 3)
    return [(tag.ident, tag.aux) for tag in (read_tag(f, "CHW") for f in frames)]


def decode_all(path) -> list[np.ndarray]:
    """Every frame of a file, decoded from the start with PyAV (the reference), converted as gpufeed does."""
    import av

    from gpufeed.pipelines._pyav import FrameFitter

    to_rgb = FrameFitter()
    with av.open(str(path)) as container:
        return [to_rgb(f) for f in container.decode(container.streams.video[0])]
