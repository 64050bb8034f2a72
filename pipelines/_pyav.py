"""PyAV decoding for the CPU clip path: from where the decoder stands, or from the keyframe before a clip.

DALI's CPU video decoder does not handle h264/hevc, so on a machine without NVDEC these readers
feed the same DALI graph (resize, layout) through ``external_source``. They never decode from the
start of a file: :class:`ClipDecoder` continues from where a file's decoder stands when the clip
is further on in the same GOP, else seeks to the keyframe at or before the clip's first frame
(known from the video index), and decodes forward only as far as the clip's last frame; open
files stay open between clips of the same video (per process), because reopening costs more
than a short seek. :class:`PyAVClips` reads each batch by (video, start) so that a worker meets
a video's clips in order, and tells its decoder the frames the plan's next batches read: those
decoded on the way to a clip are kept, fitted, and a later clip all of whose frames are kept is not
decoded again (:mod:`gpufeed.pipelines._clip_read_plan`; in one-GOP videos, 8 decoded frames a
clip instead of 32, simulated over 64 batches of 4 videos). The sequential reader's decoding is
:mod:`gpufeed.pipelines._pyav_sequential`.

This module is imported by DALI's parallel ``external_source`` worker processes, so it stays light:
numpy, PyAV and ``gpufeed.core._size`` (standard library only), and the feeds are plain picklable objects. The
frames' conversion and fit is :class:`gpufeed.pipelines._frame_fit.FrameFitter`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import numpy as np

from gpufeed.core import SizePx, WorkerCallback, media_source
from gpufeed.pipelines._clip_plan import ClipPlan
from gpufeed.pipelines._clip_read_plan import ahead_batches, clip_read_order, frames_ahead, plan_read_order
from gpufeed.pipelines._frame_fit import FrameFitter
from gpufeed.pipelines._frame_sizes import frame_size_problem
from gpufeed.pipelines._frame_stores import FrameBytesReader, decode_frame
from gpufeed.pipelines._store_kinds import frame_store

__all__ = [
    "ClipDecodeError",
    "ClipDecoder",
    "PyAVClips",
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


class _OpenVideo:
    """One open file and where its decoder stands, so that the next clip can continue from there.

    Attributes:
        packets: The demuxer's packet iterator since the last seek (``None``: seek before decoding).
        pending: Frames the decoder already returned that no read has taken yet (one packet can
            give several), in output order.
        last: Index of the last frame taken from the decoder (-1 after a seek).
    """

    __slots__ = ("container", "last", "packets", "pending", "stream")

    def __init__(self, container, stream) -> None:
        self.container, self.stream = container, stream
        self.packets: Iterator | None = None
        self.pending: list = []
        self.last = -1

    def invalidate(self) -> None:
        self.packets, self.pending, self.last = None, [], -1


class ClipDecoder:
    """Decode frames by index, keeping a few files open; each clip forward from the decoder or from a keyframe.

    A read continues from where the file's decoder stands when that is before the clip's first
    frame and no keyframe lies between (the same GOP): the frames between are fewer than from the
    keyframe, and nothing is decoded twice. Otherwise it seeks to the keyframe at or before the
    clip. Either way the frames are the ones asked for: each frame's index comes from its
    timestamp, and a read that would not start at or before the clip falls back to a seek.

    Args:
        max_open: Files kept open (least recently used closed first).
        threads: FFmpeg decoding threads per file; 1 suits one decoder per core.
        fitter: Converts each wanted frame (default: RGB at the decoded size).

    A read may also name the frames of this video that later clips read (``ahead``): those it
    decodes on its way are fitted and kept, and a later clip whose frames are all kept is read from
    them without decoding (:meth:`retain` drops the ones no later clip reads). In a one-GOP video,
    a clip before where the decoder stands would otherwise decode again from the keyframe.

    Attributes:
        frames_decoded: Frames the decoder produced, wanted or not (the cost of the reads).
        forward_reads, seek_reads: Reads that continued from the decoder, and those that seeked.
        kept_reads: Reads served from kept frames (no decoding).
    """

    def __init__(self, max_open: int = 8, threads: int = 1, fitter: FrameFitter | None = None) -> None:
        self.max_open = max_open
        self.threads = threads
        self.fitter = fitter or FrameFitter()
        self._stores: FrameBytesReader | None = None  # frame stores' open HDF5 files
        self._open: OrderedDict[str, _OpenVideo] = OrderedDict()
        self._kept: dict[str, dict[int, np.ndarray]] = {}  # path -> frame index -> fitted frame a later clip reads
        self.frames_decoded = 0
        self.forward_reads = 0
        self.seek_reads = 0
        self.kept_reads = 0

    def _container(self, path: str) -> _OpenVideo:
        import av

        hit = self._open.pop(path, None)
        if hit is None:
            container = av.open(media_source(path), "r")  # s3://: a ranged-read file (gpufeed.core._storage)
            stream = container.streams.video[0]
            stream.thread_count = self.threads
            hit = _OpenVideo(container, stream)
            while len(self._open) >= self.max_open:
                self._open.popitem(last=False)[1].container.close()
        self._open[path] = hit
        return hit

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].container.close()
        if self._stores is not None:
            self._stores.close()

    def read(self, video: VideoRef, frames: np.ndarray, ahead: frozenset[int] = frozenset()) -> np.ndarray:
        """RGB frames ``frames`` (ascending indices) of ``video`` as (T, H, W, 3) uint8 (after the fitter).

        Args:
            ahead: Frames of ``video`` that later clips read: kept, fitted, when this read decodes them.

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
        try:
            got = self._decode_forward(video, key, frames, ahead)
            if got is None:
                got = self._decode_from(video, key, frames, ahead)
            if got is None and key > 0:
                got = self._decode_from(video, 0, frames, ahead)  # the seek landed late: start from the top
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
        hit = self._open.pop(path, None)
        if hit is not None:
            hit.container.close()

    def _decode_forward(
        self, video: VideoRef, key: int, frames: np.ndarray, ahead: frozenset[int]
    ) -> list[np.ndarray] | None:
        """The clip decoded on from where the file's decoder stands; ``None`` when a seek is the cheaper way.

        Cheaper means: the decoder has not passed the clip's first frame, and the clip's keyframe
        is at or before the next frame it will give (no keyframe between, which a seek would start from).
        """
        hit = self._open.get(video.path)
        if hit is None or hit.packets is None or not key <= hit.last + 1 <= int(frames[0]):
            return None
        self._open.move_to_end(video.path)
        got = self._take(hit, video, frames, ahead)
        if got is None:
            hit.invalidate()
        else:
            self.forward_reads += 1
        return got

    def _decode_from(
        self, video: VideoRef, key: int, frames: np.ndarray, ahead: frozenset[int]
    ) -> list[np.ndarray] | None:
        """Decode from keyframe ``key``; ``None`` if the first frame decoded lies after ``frames[0]``."""
        hit = self._container(video.path)
        hit.container.seek(int(video.pts[key]), stream=hit.stream, backward=True, any_frame=False)
        hit.invalidate()
        hit.packets = hit.container.demux(hit.stream)
        self.seek_reads += 1
        got = self._take(hit, video, frames, ahead)
        if got is None:
            hit.invalidate()
        return got

    def _take(
        self, hit: _OpenVideo, video: VideoRef, frames: np.ndarray, ahead: frozenset[int]
    ) -> list[np.ndarray] | None:
        """The wanted frames from the decoder's next output on; ``None`` if that output is past ``frames[0]``.

        Until the first packet (in decode order) whose timestamp reaches the clip (or the first
        frame ``ahead`` names on the way), the decoder skips non-reference frames: they show before
        and nothing later depends on them, so with B-frames this saves a large share of the
        decoding before the clip. Frames of ``ahead`` on the way are fitted into the kept frames.
        Frames a packet gave beyond the clip's last stay in ``hit.pending`` for the next read.
        """
        context = hit.stream.codec_context
        first_index = int(frames[0])
        last = int(frames[-1])
        kept = self._kept.setdefault(video.path, {}) if ahead else {}
        on_way = [f for f in ahead if hit.last < f <= last and f not in kept]
        needed_from = min(first_index, min(on_way, default=first_index))
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
                if index in ahead:
                    kept[index] = out[-1]
            elif index in ahead and index not in kept:
                kept[index] = self.fitter(frame)
            if index >= last:
                return out
        hit.invalidate()  # the stream ended: the decoder is drained, the next read seeks
        return out

    def _frames(self, hit: _OpenVideo, target: int):
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


class PyAVClips(WorkerCallback):
    """Per-sample callback for DALI's parallel ``external_source``: the clips of a plan, decoded with PyAV.

    DALI's workers call it with ``sample_info``; sample ``idx_in_batch`` of pipeline iteration
    ``iteration`` is row ``order[idx_in_batch]`` of ``plan[iteration]`` (the
    :func:`clip_read_order`), so the workers start once and read epoch after epoch with no message
    from the loader: everything is a pure function of the (picklable) plan and video facts.
    Returns ``(frames (T, H, W, 3) uint8, tag (1,) int64)``, frames fitted to ``size_px`` (see
    :class:`FrameFitter`), tag ``iteration * batch_size + order[idx_in_batch]``. Rows past a short
    plan batch (DALI's batches here are always full) are black frames the loader drops. Each
    worker keeps its :class:`ClipDecoder` (open files, decoder positions) for as long as the
    pipeline lives, epoch after epoch, and tells it which frames the plan's next batches read
    (:func:`frames_ahead`), so that frames it decodes on the way to one clip serve later ones.

    Args:
        plan: The clips of each iteration (:class:`~gpufeed.pipelines._clip_plan.ClipPlan`).
        videos: :class:`VideoRef` per video id.
        clip_length_frames, stride_frames: Which frames a clip holds from its start.
        size_px, fit: The output size and fit (:class:`FrameFitter`).
    """

    def __init__(
        self,
        plan: ClipPlan,
        videos: list[VideoRef],
        *,
        clip_length_frames: int,
        stride_frames: int,
        size_px: SizePx,
        fit: str,
    ) -> None:
        self.plan, self.videos = plan, videos
        self.offsets = np.arange(clip_length_frames, dtype=np.int64) * stride_frames
        self.size, self.fit = size_px, fit
        self._decoder: ClipDecoder | None = None
        self._batch: tuple[int | None, tuple | None] = (None, None)  # (iteration, its rows): a worker reads many
        self._ahead: dict[int, frozenset[int]] = {}  # video id -> frames the next batches read
        self.ahead_batches = ahead_batches(plan.batch_size, len(self.offsets), size_px)
        # PyAV imported here, in the loader's process, so that forked workers inherit it instead of each
        # importing it inside its first clip (first batch 0.16-0.35 s against 0.24-0.6 s, prepared h264, load 5).
        import av.video.reformatter  # noqa: F401

    def __getstate__(self):
        state = super().__getstate__()
        state["_decoder"] = None  # open files do not travel to worker processes
        state["_batch"] = (None, None)
        state["_ahead"] = {}
        return state

    def _rows(self, iteration: int):
        """(video ids, starts, plan row of each) of ``iteration`` in :func:`clip_read_order`."""
        cached, rows = self._batch
        if cached != iteration:
            plan_rows = self.plan[iteration]
            videos, starts = plan_rows.clips()
            order = plan_read_order(plan_rows)
            n = plan_rows.count
            rows = (videos[order[:n]], starts[order[:n]], order)
            self._batch = (iteration, rows)
            self._look_ahead(iteration)
        return rows

    def _look_ahead(self, iteration: int) -> None:
        """On a worker's first clip of ``iteration``: the frames of the next batches, kept frames of older ones dropped."""
        if self._decoder is None:
            self._decoder = ClipDecoder(fitter=FrameFitter(self.size, self.fit))
        after = frames_ahead(self.plan, iteration + 1, self.ahead_batches, self.offsets)
        self._ahead = after
        still = frames_ahead(self.plan, iteration, 1, self.offsets)  # this batch's clips may be kept already
        for video, frames in after.items():
            still[video] = still.get(video, frozenset()) | frames
        self._decoder.retain({self.videos[v].path: frames for v, frames in still.items()})

    def __call__(self, sample_info):
        k, j = int(sample_info.iteration), int(sample_info.idx_in_batch)
        videos, starts, order = self._rows(k)
        tag = np.array([k * self.plan.batch_size + int(order[j])], dtype=np.int64)
        if j >= len(videos):
            return np.zeros((len(self.offsets), *self.size.hw, 3), dtype=np.uint8), tag
        assert self._decoder is not None, "made by _rows"
        video = int(videos[j])
        clip = self._decoder.read(
            self.videos[video], int(starts[j]) + self.offsets, self._ahead.get(video, frozenset())
        )
        return clip, tag
