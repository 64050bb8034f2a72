"""A PyAV worker's open decoders: which one continues to a clip, which one seeks, which stay where they stand.

A decoder that stands inside a GOP is worth keeping there when a later clip of the plan starts
further on in that GOP: the later clip is then decoded on from it, from where it stands, instead
of from the keyframe (:meth:`DecoderPool.for_seek` opens another decoder of the file for a clip
elsewhere rather than move it). In long-GOP video most of a clip's cost is the decoding from the
keyframe to it, and the plan's next batches often hold several clips of one GOP (the benchmark's
2-minute videos with a keyframe every 250 frames: 58 GOPs, 128 clips in a worker's look-ahead).

Imported by DALI's worker processes (through :mod:`gpufeed.pipelines._pyav`): numpy and PyAV only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from gpufeed.core import media_source
from gpufeed.pipelines._streams import main_video_stream

__all__ = ["DECODER_BYTES", "DecoderPool", "OpenDecoder"]

# Decoded-picture memory a decoder may hold, in frames of its video (h264's 16 references, the
# frames being decoded, the frames handed out): the estimate that bounds the decoders kept open.
_FRAMES_PER_DECODER = 24
# The demuxer's index of a file, per frame (an mp4's sample tables as FFmpeg holds them, about 20-30 bytes).
_INDEX_BYTES_PER_FRAME = 32
# Memory the open decoders of one worker may take by that estimate: as many decoders as that
# allows, and one per file up to max_open whatever they take (2-minute 256 px video: 54; 1080p: 1).
DECODER_BYTES = 128 << 20


class VideoRef(Protocol):
    """What a decoder pool reads of a video (:class:`gpufeed.pipelines._pyav.VideoRef` has it)."""

    path: str
    width: int
    height: int
    num_frames: int

    def keyframe_before(self, frame: int) -> int: ...


class OpenDecoder:
    """One open file, its decoder, and where the decoder stands, so that a later clip can continue from there.

    Attributes:
        path: The file.
        nbytes: The estimate of its memory (:func:`_decoder_bytes`).
        packets: The demuxer's packet iterator since the last seek (``None``: seek before decoding).
        pending: Frames the decoder already returned that no read has taken yet (one packet can
            give several), in output order.
        last: Index of the last frame taken from the decoder (-1 after a seek).
    """

    __slots__ = ("container", "last", "nbytes", "packets", "path", "pending", "serial", "stream")

    def __init__(self, path: str, container, stream, nbytes: int, serial: int) -> None:
        self.path, self.container, self.stream, self.nbytes = path, container, stream, nbytes
        self.serial = serial  # its key in the pool
        self.packets: Iterator | None = None
        self.pending: list = []
        self.last = -1

    def invalidate(self) -> None:
        self.packets, self.pending, self.last = None, [], -1

    def continues_to(self, video: VideoRef, frame: int) -> bool:
        """Whether decoding on from here reaches ``frame`` with no keyframe between (cheaper than seeking)."""
        return self.packets is not None and video.keyframe_before(frame) <= self.last + 1 <= frame

    def awaited(self, video: VideoRef, ahead: np.ndarray | None) -> bool:
        """Whether a later clip (first frames ``ahead``, sorted) would continue from where this decoder stands."""
        if ahead is None or self.packets is None:
            return False
        pos = int(np.searchsorted(ahead, self.last + 1))  # the nearest later start: any further one is no nearer
        return pos < len(ahead) and self.continues_to(video, int(ahead[pos]))


class DecoderPool:
    """The open decoders of one process, least recently used first.

    Args:
        max_open: Files kept open with one decoder each (least recently used closed first).
        threads: FFmpeg decoding threads per decoder.
        max_bytes: Decoders beyond ``max_open`` (more files, and more decoders of a file, one left
            where a later clip continues from it) while all of them fit this estimate of their
            memory (:func:`_decoder_bytes`).

    Attributes:
        opened: Decoders opened so far (the files' opens; each costs 1-3 ms at 256 px).
    """

    def __init__(self, max_open: int = 8, threads: int = 1, max_bytes: int = DECODER_BYTES) -> None:
        self.max_open, self.threads, self.max_bytes = max_open, threads, max_bytes
        self._open: OrderedDict[int, OpenDecoder] = OrderedDict()
        self._serial = 0
        self.opened = 0

    def of(self, path: str) -> list[OpenDecoder]:
        """``path``'s open decoders, least recently used first."""
        return [hit for hit in self._open.values() if hit.path == path]

    def forward(self, video: VideoRef, frame: int) -> OpenDecoder | None:
        """The decoder of ``video`` that reaches ``frame`` by decoding on (the nearest), or ``None``."""
        hits = [hit for hit in self.of(video.path) if hit.continues_to(video, frame)]
        if not hits:
            return None
        hit = max(hits, key=lambda h: h.last)
        self._use(hit)
        return hit

    def for_seek(self, video: VideoRef, ahead: np.ndarray | None) -> OpenDecoder:
        """A decoder of ``video`` to seek: one no later clip awaits, else a new one while they fit, else the oldest."""
        mine = self.of(video.path)
        free = [hit for hit in mine if not hit.awaited(video, ahead)]
        if free:
            hit = free[0]
        elif mine and not self._fits(video):
            hit = mine[0]
        else:
            hit = self._new(video)
        self._use(hit)
        return hit

    def drop(self, path: str) -> None:
        """Close ``path``'s decoders (after a failed read)."""
        for key in [key for key, hit in self._open.items() if hit.path == path]:
            self._open.pop(key).container.close()

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].container.close()

    def _use(self, hit: OpenDecoder) -> None:
        self._open.move_to_end(hit.serial)

    def _fits(self, video: VideoRef) -> bool:
        """Whether one more decoder of ``video`` fits beside the open ones (closing none)."""
        used = sum(hit.nbytes for hit in self._open.values())
        return len(self._open) < self.max_open or used + _decoder_bytes(video) <= self.max_bytes

    def _new(self, video: VideoRef) -> OpenDecoder:
        import av

        nbytes = _decoder_bytes(video)
        # Oldest first, close decoders until the new one fits: the files' own (max_open) and the memory estimate.
        while self._open and not self._fits(video):
            self._open.popitem(last=False)[1].container.close()
        container = av.open(media_source(video.path), "r")  # s3://: a ranged-read file (gpufeed.core._storage)
        stream = main_video_stream(container)
        stream.thread_count = self.threads
        self._serial += 1
        hit = OpenDecoder(video.path, container, stream, nbytes, self._serial)
        self._open[hit.serial] = hit
        self.opened += 1
        return hit


def _decoder_bytes(video: VideoRef) -> int:
    """The estimate of one open decoder's memory for ``video``: its decoded pictures (8-bit 4:2:0) and the demuxer's index."""
    width, height = max(video.width, 16), max(video.height, 16)
    return width * height * 3 // 2 * _FRAMES_PER_DECODER + video.num_frames * _INDEX_BYTES_PER_FRAME
