"""PyAV decoding for the CPU clip path: from where the decoder stands, or from the keyframe before a clip.

DALI's CPU video decoder does not handle h264/hevc, so on a machine without NVDEC these readers
feed the same DALI graph (resize, layout) through ``external_source``. They never decode from the
start of a file: :class:`ClipDecoder` continues from where a file's decoder stands when the clip
is further on in the same GOP, else seeks to the keyframe at or before the clip's first frame
(known from the video index), and decodes forward only as far as the clip's last frame; open
files stay open between clips of the same video (per process), because reopening costs more
than a short seek. :class:`~gpufeed.pipelines._pyav_clips.PyAVClips` reads each batch by
(video, start) so that a worker meets a video's clips in order, and names to its decoder the
clips of the plan's next batches: the frames of those it decodes whole on the way to a clip are
kept, fitted, and such a clip is later read from them without decoding
(:mod:`gpufeed.pipelines._clip_read_plan`; in one-GOP videos, 9 decoded frames a clip instead of
32, two workers simulated over 64 batches of 4 videos). The sequential reader's decoding is
:mod:`gpufeed.pipelines._pyav_sequential`.

This module is imported by DALI's parallel ``external_source`` worker processes, so it stays light:
numpy, PyAV and ``gpufeed.core._size`` (standard library only), and the feeds are plain picklable objects. The
frames' conversion and fit is :class:`gpufeed.pipelines._frame_fit.FrameFitter`.
"""

from __future__ import annotations

import numpy as np

from gpufeed.pipelines._clip_read_plan import clip_read_order, plan_read_order
from gpufeed.pipelines._frame_fit import FrameFitter
from gpufeed.pipelines._frame_sizes import frame_size_problem
from gpufeed.pipelines._frame_stores import FrameBytesReader, decode_frame
from gpufeed.pipelines._pyav_decoders import DECODER_BYTES, DecoderPool, OpenDecoder
from gpufeed.pipelines._store_kinds import frame_store

# Keyframes to step back when a seek lands past a clip, before reading the file from its first packet.
_SEEK_STEPS_BACK = 2

__all__ = [
    "ClipDecodeError",
    "ClipDecoder",
    "VideoRef",
    "clip_read_order",
    "plan_read_order",
]


class ClipDecodeError(RuntimeError):
    """A clip could not be decoded; the message starts with the file's path."""


class VideoRef:
    """The few index facts a decoder needs for one video (cheap to pickle)."""

    __slots__ = ("frame_name", "height", "keyframes", "num_frames", "path", "pts", "store", "width")

    def __init__(
        self,
        path: str,
        pts,
        keyframes,
        num_frames: int,
        width: int = 0,
        height: int = 0,
        store: str = "",
        frame_name: str = "",
    ) -> None:
        self.path = path
        self.pts = np.asarray(pts, dtype=np.int64)
        self.keyframes = np.asarray(keyframes, dtype=np.int64)
        self.num_frames = int(num_frames)
        self.width, self.height = int(width), int(height)
        self.store, self.frame_name = store, frame_name  # a frame store's kind and file names ("" for a video)

    @classmethod
    def from_info(cls, info) -> VideoRef:
        return cls(
            info.path, info.pts, info.keyframes, info.num_frames, info.width, info.height, info.store, info.frame_name
        )

    def index_of(self, pts: int) -> int:
        """Frame index of a presentation timestamp (-1 when the index does not know it)."""
        pos = int(np.searchsorted(self.pts, pts))
        return pos if pos < len(self.pts) and self.pts[pos] == pts else -1

    def keyframe_before(self, frame: int) -> int:
        pos = int(np.searchsorted(self.keyframes, frame, side="right")) - 1
        return int(self.keyframes[pos]) if pos >= 0 else 0


class ClipDecoder:
    """Decode frames by index, keeping a few files open; each clip forward from the decoder or from a keyframe.

    A read continues from where one of the file's decoders stands when that is before the clip's
    first frame and no keyframe lies between (the same GOP): the frames between are fewer than from
    the keyframe, and nothing is decoded twice. Otherwise it seeks to the keyframe at or before the
    clip. Either way the frames are the ones asked for: each frame's index comes from its
    timestamp, and a read that would not start at or before the clip falls back to a seek.

    Args:
        max_open: Files kept open, one decoder each (least recently used closed first).
        threads: FFmpeg decoding threads per file; 1 suits one decoder per core.
        fitter: Converts each wanted frame (default: RGB at the decoded size).
        max_bytes: Decoders beyond ``max_open`` while their decoded pictures fit this estimate
            (:class:`~gpufeed.pipelines._pyav_decoders.DecoderPool`).

    A read may also name the frames of this video that later clips read (``ahead``): those it
    decodes on its way are fitted and kept, and a later clip whose frames are all kept is read from
    them without decoding (:meth:`retain` drops the ones no later clip reads). In a one-GOP video,
    a clip before where the decoder stands would otherwise decode again from the keyframe. And a
    decoder from which a later clip (``awaited``, default ``ahead``) would continue is left where it
    stands: a read that must seek takes another decoder of the file, opening one while they fit
    (long-GOP bench videos, two workers simulated over 120 batches: 58 decoded frames a clip
    instead of 71, 9.6 ms of CPU instead of 10.7; camera-like B-frame video: 39 instead of 52).

    Attributes:
        frames_decoded: Frames the decoder produced, wanted or not (the cost of the reads).
        forward_reads, seek_reads: Reads that continued from the decoder, and those that seeked.
        kept_reads: Reads served from kept frames (no decoding).
    """

    def __init__(
        self, max_open: int = 8, threads: int = 1, fitter: FrameFitter | None = None, max_bytes: int = DECODER_BYTES
    ) -> None:
        self.fitter = fitter or FrameFitter()
        self._stores: FrameBytesReader | None = None  # frame stores' open HDF5 files
        self._decoders = DecoderPool(max_open, threads, max_bytes)
        self._kept: dict[str, dict[int, np.ndarray]] = {}  # path -> frame index -> fitted frame a later clip reads
        self.frames_decoded = 0
        self.forward_reads = 0
        self.seek_reads = 0
        self.kept_reads = 0

    @property
    def decoders_opened(self) -> int:
        """Decoders (files' opens) made so far: one per file, more where a decoder was left for a later clip."""
        return self._decoders.opened

    def close(self) -> None:
        self._decoders.close()
        if self._stores is not None:
            self._stores.close()

    def read(
        self, video: VideoRef, frames: np.ndarray, ahead: np.ndarray | None = None, awaited: np.ndarray | None = None
    ) -> np.ndarray:
        """RGB frames ``frames`` (ascending indices) of ``video`` as (T, H, W, 3) uint8 (after the fitter).

        Args:
            ahead: Sorted first frames of later clips of ``video``: the frames of those this read decodes
                whole on its way are kept, fitted (see :meth:`_on_way`).
            awaited: Sorted first frames of later clips of ``video`` (default: ``ahead``): a decoder
                one of them would continue from is left where it stands and, if the read must seek,
                another decoder of the file seeks (:class:`~gpufeed.pipelines._pyav_decoders.DecoderPool`).

        Raises:
            ClipDecodeError: The file cannot be decoded there, or the frames are not all present.
        """
        import av

        frames = np.asarray(frames, dtype=np.int64)
        if len(frames) == 0 or frames[0] < 0 or frames[-1] >= video.num_frames:
            raise ClipDecodeError(f"{video.path}: frames {frames.tolist()} are outside [0, {video.num_frames})")
        if video.store:
            return self._read_store(video, frames)
        kept = self._kept.get(video.path)
        if kept is not None and all(f in kept for f in frames.tolist()):
            self.kept_reads += 1
            return np.stack([kept[f] for f in frames.tolist()])
        key = video.keyframe_before(int(frames[0]))
        awaited = ahead if awaited is None else awaited
        try:
            got = self._decode_forward(video, key, frames, ahead)
            steps = 0
            while got is None:
                top = steps > _SEEK_STEPS_BACK
                got = self._decode_from(video, key, frames, ahead, awaited, top=top)
                if got is not None or top:
                    break
                # The seek landed late (MPEG-TS has no index: FFmpeg's seek there can land a GOP
                # after the timestamp asked for): seek from the keyframe before, then from the top.
                if key > 0 and steps < _SEEK_STEPS_BACK:
                    key, steps = video.keyframe_before(key - 1), steps + 1
                else:
                    steps = _SEEK_STEPS_BACK + 1
        except av.FFmpegError as err:
            self._drop(video.path)
            raise ClipDecodeError(f"{video.path}: cannot decode frames {frames[0]}..{frames[-1]}: {err}") from None
        if got is None or len(got) != len(frames):
            self._drop(video.path)
            have = 0 if got is None else len(got)
            raise ClipDecodeError(
                f"{video.path}: decoded {have} of the {len(frames)} frames {frames[0]}..{frames[-1]} "
                "(the file is damaged or truncated)"
            )
        return np.stack(got)

    def retain(self, ahead: dict[str, frozenset[int]]) -> None:
        """Keep only the kept frames that ``ahead`` (path -> frame indices later clips read) still names."""
        for path in list(self._kept):
            wanted, kept = ahead.get(path, frozenset()), self._kept[path]
            for index in [f for f in kept if f not in wanted]:
                del kept[index]
            if not kept:
                del self._kept[path]

    def _read_store(self, video: VideoRef, frames: np.ndarray) -> np.ndarray:
        """A frame store's frames decoded with Pillow, fitted like video frames (a folder mixing stores and videos)."""
        import av

        if self._stores is None:
            self._stores = FrameBytesReader()
        try:
            encoded = self._stores.read(video.path, video.store, video.frame_name, frames)
        except Exception as err:  # OSError, h5py's errors
            raise ClipDecodeError(f"{video.path}: cannot read frames {frames[0]}..{frames[-1]}: {err}") from None
        out = []
        for index, data in zip(frames, encoded, strict=True):
            try:
                rgb = decode_frame(data.tobytes(), video.store)
            except Exception as err:  # Pillow raises several types for damaged data
                raise ClipDecodeError(f"{video.path}: frame {index} cannot be decoded: {err}") from None
            if rgb.shape[:2] != (video.height, video.width):  # the fitter is set for the store's size
                where = frame_store(video.store).frame_label(video.frame_name, int(index))
                why = frame_size_problem(data.tobytes(), where, video.width, video.height)
                raise ClipDecodeError(f"{video.path}: {why or f'{where} is not {video.width}x{video.height}'}")
            self.frames_decoded += 1
            out.append(self.fitter(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        return np.stack(out)

    def _drop(self, path: str) -> None:
        self._kept.pop(path, None)
        self._decoders.drop(path)

    def _decode_forward(
        self, video: VideoRef, key: int, frames: np.ndarray, ahead: np.ndarray | None
    ) -> list[np.ndarray] | None:
        """The clip decoded on from where the file's decoder stands; ``None`` when a seek is the cheaper way.

        Cheaper means: the decoder has not passed the clip's first frame, and the clip's keyframe
        is at or before the next frame it will give (no keyframe between, which a seek would start from).
        """
        hit = self._decoders.forward(video, int(frames[0]))
        if hit is None:
            return None
        got = self._take(hit, video, key, frames, ahead)
        if got is None:
            hit.invalidate()
        else:
            self.forward_reads += 1
        return got

    def _decode_from(
        self,
        video: VideoRef,
        key: int,
        frames: np.ndarray,
        ahead: np.ndarray | None,
        awaited: np.ndarray | None,
        top: bool = False,
    ) -> list[np.ndarray] | None:
        """Decode from keyframe ``key``; ``None`` if the first frame decoded lies after ``frames[0]``.

        ``top``: from the first packet of a newly opened file, no seek (the file's decoders are
        closed first), where even a seek to the first keyframe lands late.
        """
        if top:
            self._decoders.drop(video.path)
        hit = self._decoders.for_seek(video, awaited)
        if not top:
            hit.container.seek(int(video.pts[key]), stream=hit.stream, backward=True, any_frame=False)
        hit.invalidate()
        hit.packets = hit.container.demux(hit.stream)
        self.seek_reads += 1
        got = self._take(hit, video, key, frames, ahead)
        if got is None:
            hit.invalidate()
        return got

    def _take(
        self, hit: OpenDecoder, video: VideoRef, key: int, frames: np.ndarray, ahead: np.ndarray | None
    ) -> list[np.ndarray] | None:
        """The wanted frames from the decoder's next output on; ``None`` if that output is past ``frames[0]``, or none.

        Until the first packet (in decode order) whose timestamp reaches the clip (or the first
        frame kept on the way, :meth:`_on_way`), the decoder skips non-reference frames: they show
        before and nothing later depends on them, so with B-frames this saves a large share of the
        decoding before the clip. Frames kept on the way are fitted into the kept frames.
        Frames a packet gave beyond the clip's last stay in ``hit.pending`` for the next read.
        """
        context = hit.stream.codec_context
        first_index = int(frames[0])
        last = int(frames[-1])
        keep = self._on_way(video, frames, ahead, max(key, hit.last + 1))
        kept = self._kept.setdefault(video.path, {}) if keep else {}
        needed_from = min(first_index, min(keep, default=first_index))
        target = int(video.pts[needed_from])
        context.skip_frame = "NONREF" if hit.last + 1 < needed_from and not hit.pending else "DEFAULT"
        wanted = set(frames.tolist())
        out: list[np.ndarray] = []
        first = True
        for frame in self._frames(hit, target):
            index = video.index_of(frame.pts) if frame.pts is not None else -1
            if first:
                first = False
                if index < 0 or index > first_index:
                    return None
            hit.last = max(hit.last, index)
            if index in wanted:
                out.append(self.fitter(frame))
                if index in keep:
                    kept[index] = out[-1]
            elif index in keep:
                kept[index] = self.fitter(frame)
            if index >= last:
                return out
        hit.invalidate()  # the stream ended: the decoder is drained, the next read seeks
        return None if first else out  # no frame at all: the seek landed past the end (MPEG-TS)

    def _on_way(self, video: VideoRef, frames: np.ndarray, ahead: np.ndarray | None, start: int) -> set[int]:
        """Frames to keep: those of the later clips (first frames ``ahead``) decoded whole from ``start`` to ``frames[-1]``.

        A clip that starts before ``start`` would be kept in part, which serves nothing (and
        would stop the non-reference skipping from the start; camera-like B-frame video, simulated
        over 64 batches: 11.7-12.3 ms a clip keeping whole clips only, 13.5-13.9 keeping none).
        """
        if ahead is None or len(ahead) == 0:
            return set()
        offsets = frames - frames[0]
        whole = ahead[(ahead >= start) & (ahead + offsets[-1] <= int(frames[-1]))]
        kept = self._kept.get(video.path, {})
        return {f for f in (whole[:, None] + offsets).ravel().tolist() if f not in kept}

    def _frames(self, hit: OpenDecoder, target: int):
        """The decoder's frames in output order: those pending first, then from the next packets."""
        context = hit.stream.codec_context
        while hit.pending:
            yield hit.pending.pop(0)
        if hit.packets is None:
            return
        for packet in hit.packets:
            if context.skip_frame != "DEFAULT" and (packet.pts is None or packet.pts >= target):
                context.skip_frame = "DEFAULT"
            hit.pending.extend(packet.decode())
            self.frames_decoded += len(hit.pending)
            while hit.pending:
                yield hit.pending.pop(0)
