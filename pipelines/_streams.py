"""Which stream of a container gpufeed reads: the one players and DALI's readers pick.

A file may hold more than one video stream: a cover picture (an MKV's or MP4's thumbnail, an
audio file's album art), a second camera, a preview. ``streams.video[0]`` is whichever the muxer
wrote first (an MKV with a thumbnail lists it first); FFmpeg's ``av_find_best_stream``, which
players and DALI's video readers use, prefers a stream with many frames over a still picture. Every
PyAV path here opens the stream this module names, so the index, the decoders and ``prepare``
agree. A file with several moving video streams, or a video and a cover picture, is left to PyAV:
DALI's reader asks FFmpeg before it has read any packets, when a still and a video look alike
(neither has frames counted yet), and so might pick another stream or open the cover.

Imported by DALI's worker processes (through :mod:`gpufeed.pipelines._pyav`): PyAV only.
"""

from __future__ import annotations

__all__ = ["is_still_picture", "main_video_stream", "still_picture_count", "video_stream_count"]

# FFmpeg's AV_DISPOSITION_ATTACHED_PIC: a cover picture, one frame, not a video.
_ATTACHED_PIC = 0x400


def is_still_picture(stream) -> bool:
    """Whether a PyAV stream is a cover picture (``attached_pic``) rather than a video."""
    return bool(int(stream.disposition) & _ATTACHED_PIC)


def main_video_stream(container):
    """The video stream to read from an open PyAV ``container`` (``None`` when it holds none)."""
    if not container.streams.video:
        return None
    return container.streams.best("video") or container.streams.video[0]


def video_stream_count(container) -> int:
    """How many of ``container``'s video streams are videos, not cover pictures."""
    return sum(1 for stream in container.streams.video if not is_still_picture(stream))


def still_picture_count(container) -> int:
    """How many of ``container``'s video streams are cover pictures (``attached_pic``)."""
    return sum(1 for stream in container.streams.video if is_still_picture(stream))
