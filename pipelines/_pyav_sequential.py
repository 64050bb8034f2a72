"""PyAV decoding in order, no seeks: the sequential reader's CPU path and ``gpufeed check``'s full decode.

Kept apart from :mod:`gpufeed.pipelines._pyav` (random-access clips), which DALI's worker
processes import; these run in the loader's own process.
"""

from __future__ import annotations

import numpy as np

from gpufeed.core import SizePx, media_source
from gpufeed.pipelines._frame_fit import FrameFitter
from gpufeed.pipelines._pyav import ClipDecodeError, VideoRef
from gpufeed.pipelines._streams import main_video_stream

__all__ = ["SequentialFeed", "decode_all_frames", "iter_frame_chunks"]


class SequentialFeed:
    """Per-sample iterable for a (non-parallel) ``external_source``: consecutive frame chunks.

    Yields ``(frames (C, H, W, 3) uint8, chunk number (1,) int32)``, then repeats the last chunk
    (DALI may prefetch past the end; the reader's iterator stops at the chunk count).
    """

    def __init__(self, video: VideoRef, chunk_frames: int, size_px: SizePx | None = None, fit: str = "stretch") -> None:
        self.video, self.chunk_frames = video, chunk_frames
        self.fitter = FrameFitter(size_px, fit)

    def __iter__(self):
        last = None
        for number, (_, chunk) in enumerate(iter_frame_chunks(self.video, self.chunk_frames, fitter=self.fitter)):
            last = (chunk, np.array([number], dtype=np.int32))
            yield last
        while last is not None:
            yield last


def iter_frame_chunks(video: VideoRef, chunk_frames: int, threads: int = 0, fitter: FrameFitter | None = None):
    """Decode a whole video once, in order, yielding ``(first index, (C, H, W, 3) uint8)`` chunks.

    No seeks: this is the sequential reader's CPU path (inference, feature extraction).
    """
    import av

    fitter = fitter or FrameFitter()
    chunk: list[np.ndarray] = []
    first = 0
    count = 0
    try:
        with av.open(media_source(video.path), "r") as container:
            stream = main_video_stream(container)
            stream.thread_type = "AUTO"
            stream.thread_count = threads
            for frame in container.decode(stream):
                chunk.append(fitter(frame))
                count += 1
                if len(chunk) == chunk_frames:
                    yield first, np.stack(chunk)
                    first, chunk = first + len(chunk), []
    except av.FFmpegError as err:
        raise ClipDecodeError(f"{video.path}: decoding stopped after {count} frames: {err}") from None
    if chunk:
        yield first, np.stack(chunk)
    if count != video.num_frames:
        raise ClipDecodeError(f"{video.path}: decoded {count} frames but the index lists {video.num_frames}")


def decode_all_frames(path: str) -> tuple[int, str | None]:
    """Decode every frame of a file: (frames decoded, problem or ``None``). For ``gpufeed check``."""
    import av

    count = 0
    try:
        with av.open(media_source(path), "r") as container:
            stream = main_video_stream(container)
            stream.thread_type = "AUTO"
            for _ in container.decode(stream):
                count += 1
    except av.FFmpegError as err:
        return count, f"decoding fails after {count} frames: {err}"
    return count, None
