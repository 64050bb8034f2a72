"""One video's facts: demux a file (packets only, no decoding) into a :class:`VideoInfo`.

:func:`probe_video` learns a video's codec, size, frame count, presentation timestamps, keyframe
positions and whether its frame rate is constant, and names the first reason the file cannot be
used (empty, damaged, truncated, an unsupported codec); a frame store gets the same facts from its
first frame's header. The folder index (:mod:`gpufeed.pipelines._videos`) probes every file once and
caches the result.

Frame ``i`` of a video is the ``i``-th frame in presentation order (timestamps sorted), which is
what every decoder here returns and what row ``i`` of the label CSV describes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from gpufeed.core import ObjectPath, data_path, is_outage, media_source
from gpufeed.pipelines._containers import header_problem
from gpufeed.pipelines._frame_stores import probe_store
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._mp4 import mp4_box_problem
from gpufeed.pipelines._orientation import UPRIGHT, Orientation, frame_orientation
from gpufeed.pipelines._store_kinds import store_kind
from gpufeed.pipelines._streams import is_still_picture, main_video_stream, still_picture_count, video_stream_count

__all__ = ["DALI_CPU_CODECS", "SUPPORTED_CODECS", "VideoInfo", "probe_video"]

# What gpufeed reads (PyAV decodes all of these on the CPU); which of them NVDEC takes depends on
# profile, pixel format and GPU (see gpufeed.pipelines._nvdec).
SUPPORTED_CODECS = ("h264", "hevc", "vp8", "vp9", "av1", "mpeg4", "mjpeg")
# What DALI's CPU video decoder handles (measured: not h264/hevc/mpeg4).
DALI_CPU_CODECS = ("vp8", "vp9", "mjpeg")
_MP4_LIKE = (".mp4", ".mov", ".m4v")
# FFmpeg's AVColorSpace and AVColorRange numbers -> av_color_space_name's / av_color_range_name's
# names (PyAV hands over the numbers only), "unspecified" for FFmpeg's "unknown".
_MATRICES = (
    "gbr bt709 unspecified reserved fcc bt470bg smpte170m smpte240m ycgco bt2020nc bt2020c smpte2085 "
    "chroma-derived-nc chroma-derived-c ictcp ipt-c2 ycgco-re ycgco-ro"
)
_RANGES = ("unspecified", "tv", "pc")
# FFmpeg's AVFieldOrder numbers of an interlaced stream: tt, bb, tb, bt (0 unknown, 1 progressive).
_FIELD_ORDERS = (2, 3, 4, 5)


def _colour_names(matrix: int, colour_range: int) -> tuple[str, str]:
    """FFmpeg's names of a colour matrix and range number (``matrix 99`` for one this FFmpeg's table lacks)."""
    names = _MATRICES.split()
    name = names[matrix] if 0 <= matrix < len(names) else f"matrix {matrix}"
    return name, _RANGES[colour_range] if 0 <= colour_range < len(_RANGES) else f"range {colour_range}"


@dataclass(frozen=True)
class VideoInfo:
    """What the index knows about one video file.

    Attributes:
        path: The file.
        codec: FFmpeg codec name (``h264``, ``vp9`` ...).
        width, height: Frame size in pixels.
        num_frames: Frames present (packets demuxed), in presentation order.
        fps: Average frames per second.
        cfr: True when every frame lasts the same (within 1%).
        time_base: (numerator, denominator) of the stream's timestamp unit.
        pts: Presentation timestamp of every frame, in frame order.
        keyframes: Frame indices of the keyframes (where decoding can start), ascending.
        declared_frames: Frame count the container declares (0 when it does not say).
        declared_seconds: Duration the container declares when it holds only this stream (else 0).
        problem: Why the file cannot be used, or ``None``.
        pix_fmt: FFmpeg pixel format of the decoded frames (``yuv420p``, ``yuv444p`` ...).
        profile: FFmpeg's name of the codec profile (``High``, ``High 10``, ``Main 10`` ...; may be empty).
        store: ``""`` for an encoded video file; ``"folder"`` or ``"hdf5"`` for a frame store
            (:mod:`gpufeed.pipelines._frame_stores`), whose ``codec`` is ``png`` or ``jpeg`` and
            whose every frame is a keyframe.
        frame_name: A frame folder's file name pattern (``"{:09d}.png"``).
        rotation_degrees, mirrored: How the display matrix shows the stored frames: turned
            counterclockwise (0, 90, 180 or 270; a phone held upright records 90 or 270), then
            mirrored left-right (:mod:`gpufeed.pipelines._orientation`). ``width`` and ``height``
            are the stored frames'; every reader hands frames over as shown (:attr:`display_size`),
            PyAV turning them, so DALI's decoders, which return the stored frames, leave such a
            video to PyAV.
        video_streams: Video streams in the file, cover pictures not counted; every fact here is
            of the one FFmpeg calls best (:mod:`gpufeed.pipelines._streams`), which every PyAV
            path reads; DALI's readers leave a file of several to PyAV.
        hidden_frames: Packets before an edit list's start (a file trimmed without re-encoding):
            decoded for the frames after them and never shown, so not frames here, as in every
            player; ``keyframes`` then starts at 0, reached by a seek to the hidden keyframe before
            it. DALI's readers, which count packets, leave such a file to PyAV.
        container: FFmpeg's name of the file's format (``mov,mp4,m4a,3gp,3g2,mj2``, ``mpegts`` ...).
            An MPEG transport stream has no index, and FFmpeg's seeks in it can land a GOP after
            the timestamp asked for: PyAV's reads step back to the keyframe before, and DALI's
            readers leave such a file to PyAV.
        still_pictures: Cover pictures (``attached_pic`` streams: an MP4's ``covr``, an MKV's
            attached image), which ``video_streams`` leaves out and no path here reads. DALI's
            readers ask FFmpeg for the best stream before it has counted any frames, so might open
            one, and leave such a file to PyAV.
        colour_matrix, colour_range: How the frames' YUV turns into RGB: FFmpeg's names of the
            matrix (``bt709``, ``bt470bg``, ``smpte170m``, ``bt2020nc`` ...; ``unspecified`` where
            the file says nothing, which ffprobe prints as ``unknown``) and range (``tv``
            limited, ``pc`` full, ``unspecified``), as the first decoded frame carries them, which
            is what PyAV converts with (the stream's where no frame was decoded). ``""``: not
            probed (a frame store). DALI's video readers convert with BT.601 whatever the
            matrix, so leave other matrices to PyAV (:mod:`gpufeed.pipelines._nvdec`).
        interlaced: The first decoded frame is flagged interlaced (FFmpeg's ``AV_FRAME_FLAG_INTERLACED``:
            coded as fields, as field pictures (PAFF) or field macroblock pairs (MBAFF), or so timed
            by the stream; an HEVC field stream's pictures are single fields, each a frame here),
            else the stream's field order where no frame was decoded. PyAV hands over the frames
            FFmpeg assembles, h264's two fields woven into one; DALI's readers leave such a video to
            PyAV (:mod:`gpufeed.pipelines._nvdec`).
    """

    path: str
    codec: str = ""
    width: int = 0
    height: int = 0
    num_frames: int = 0
    fps: float = 0.0
    cfr: bool = True
    time_base: tuple[int, int] = (1, 1)
    pts: tuple[int, ...] = ()
    keyframes: tuple[int, ...] = ()
    declared_frames: int = 0
    declared_seconds: float = 0.0
    problem: str | None = None
    pix_fmt: str = ""
    profile: str = ""
    store: str = ""
    frame_name: str = ""
    rotation_degrees: int = 0
    mirrored: bool = False
    video_streams: int = 1
    hidden_frames: int = 0
    container: str = ""
    still_pictures: int = 0
    colour_matrix: str = ""
    colour_range: str = ""
    interlaced: bool = False

    @property
    def orientation(self) -> Orientation:
        """How the frames are shown (:class:`~gpufeed.pipelines._orientation.Orientation`)."""
        return Orientation(self.rotation_degrees // 90 % 4, self.mirrored)

    @property
    def display_size(self) -> tuple[int, int]:
        """(width, height) of the frames as shown: the stored size, its sides swapped by a quarter turn."""
        return self.orientation.shown_size(self.width, self.height)

    @property
    def gop_frames(self) -> float:
        """Median distance between keyframes in frames (the whole video when it has one keyframe)."""
        if len(self.keyframes) < 2:
            return float(self.num_frames)
        return float(np.median(np.diff(self.keyframes)))

    def keyframe_at_or_before(self, frame: int) -> int:
        """The last keyframe index <= ``frame`` (0 when there is none before it)."""
        pos = int(np.searchsorted(np.asarray(self.keyframes), frame, side="right")) - 1
        return self.keyframes[pos] if pos >= 0 else 0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> VideoInfo:
        data = dict(data)
        for key in ("time_base", "pts", "keyframes"):
            data[key] = tuple(data[key])
        return cls(**data)


def probe_video(path: str | Path | ObjectPath) -> VideoInfo:
    """Demux a video (no decoding) and return its :class:`VideoInfo`; problems are described, not raised.

    An object (``s3://...``) is demuxed through ranged reads: the index reads it once, and caches what it learns.
    """
    import av

    path = data_path(path)
    if store_kind(path):
        return _store_info(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        if is_outage(err):  # the store or the machine, not the file: never recorded as a bad file
            raise
        return VideoInfo(str(path), problem=f"unreadable: {err.strerror or err}")
    if size == 0:
        return VideoInfo(str(path), problem="zero-byte file")
    boxed = mp4_box_problem(path, size) if path.suffix.lower() in _MP4_LIKE else None
    if boxed:
        return VideoInfo(str(path), problem=boxed)
    try:
        with av.open(media_source(path), "r") as container:
            stream = main_video_stream(container)
            if stream is None or is_still_picture(stream):
                what = "audio only" if container.streams.audio else "no stream at all"
                what = "a cover picture only" if stream is not None else what
                return VideoInfo(str(path), problem=f"no video stream in the file ({what})")
            streams, stills = video_stream_count(container), still_picture_count(container)
            fmt = container.format.name or ""
            # The codec, not the decoder PyAV picked for it (AV1 opens as "libdav1d").
            codec = getattr(stream.codec_context.codec, "canonical_name", "") or stream.codec_context.name
            width, height = stream.codec_context.width, stream.codec_context.height
            pix_fmt = stream.codec_context.pix_fmt or ""
            profile = stream.codec_context.profile or ""
            declared = int(stream.frames or 0)
            seconds = container.duration / 1e6 if container.duration and len(container.streams) == 1 else 0.0
            tb = stream.time_base
            pts_keys = []
            shown = _FirstFrameOrientation(stream, width * height)
            hidden, hidden_key = 0, False
            for packet in container.demux(stream):
                if packet.size == 0 or packet.pts is None:
                    continue  # the flush packet, or one without a timestamp (nothing to show)
                shown.feed(packet)
                if packet.is_discard:
                    # Before an edit list's start (a file trimmed without re-encoding): decoded for
                    # the frames after it, never shown; every decoder drops it, so it is no frame.
                    hidden, hidden_key = hidden + 1, hidden_key or bool(packet.is_keyframe)
                    continue
                pts_keys.append((int(packet.pts), bool(packet.is_keyframe)))
        first_frame = shown.finish(path)
    except av.FFmpegError as err:
        return VideoInfo(str(path), problem=header_problem(path) or f"cannot be read as a video: {err}")
    pts_keys.sort()
    pts = tuple(p for p, _ in pts_keys)
    keyframes = tuple(i for i, (_, key) in enumerate(pts_keys) if key)
    if hidden_key and pts and (not keyframes or keyframes[0] != 0):
        # A seek to frame 0 lands on the hidden keyframe before it, so decoding can start there.
        keyframes = (0, *keyframes)
    info = VideoInfo(
        str(path),
        codec=codec,
        width=width,
        height=height,
        num_frames=len(pts),
        time_base=(tb.numerator, tb.denominator) if tb else (1, 1),
        pts=pts,
        keyframes=keyframes,
        declared_frames=declared,
        declared_seconds=seconds,
        pix_fmt=pix_fmt,
        profile=str(profile),
        **first_frame,
        video_streams=streams,
        hidden_frames=hidden,
        container=fmt,
        still_pictures=stills,
    )
    return _finish_info(info)


class _FirstFrameOrientation:
    """How a video is shown (display matrix), its colour matrix and range, and interlacing, from its first keyframe.

    PyAV hands a stream's display matrix over on its frames only (their side data), so the
    first keyframe in the file is decoded, alone (one thread, the decoder flushed after it), and
    nothing else: the probe of a 10 s 1080p h264 file took 22 ms instead of 8 (measured; the index
    probes a file once and caches what it learns). Skipped when the stream declares more than
    :attr:`MAX_PIXELS` pixels a frame, the images' decompression-bomb limit (a hostile header must
    not make the index, or the server probing an upload before its own limit refuses it, allocate); a
    decoding error leaves it upright (the check's full decode names damage). Unknown is upright:
    the stored frames as they are; unknown colours and interlacing are the stream's.
    """

    MAX_PIXELS = DEFAULT_MAX_IMAGE_PIXELS  # 8K UHD (33.2 million) fits

    def __init__(self, stream, pixels: int) -> None:
        self.stream, self.orientation = stream, UPRIGHT
        # (AVColorSpace, AVColorRange): the stream's until a frame is decoded, then the frame's, with
        # which PyAV converts it (FFmpeg fills both from the bitstream, else from the container).
        context = stream.codec_context
        self.colour = (int(context.colorspace), int(context.color_range))
        # The stream's field order says it for h264 (the container's, else the first headers'), not
        # for HEVC, whose fields only the frames' flags tell (measured: x265's field stream says 0).
        self.interlaced = int(getattr(context, "field_order", 0) or 0) in _FIELD_ORDERS  # else the frame decides
        self._done = not 0 < pixels <= self.MAX_PIXELS
        self._hidden = False  # the first keyframe lies before an edit list's start

    def feed(self, packet) -> None:
        if self._done or not packet.is_keyframe:
            return
        self._done = True
        if packet.is_discard:  # the decoder would drop its frame: read again, edit list ignored (finish)
            self._hidden = True
        else:
            self._take(self._decode(self.stream, packet))

    def finish(self, path) -> dict:
        """:class:`VideoInfo`'s orientation and colour fields.

        A file whose first keyframe is hidden (an edit list) is opened once more to decode it.
        """
        if self._hidden:
            import av

            with av.open(media_source(path), "r", options={"ignore_editlist": "1"}) as container:
                stream = main_video_stream(container)
                for packet in container.demux(stream):
                    if packet.is_keyframe and packet.size:
                        self._take(self._decode(stream, packet))
                        break
        matrix, colour_range = _colour_names(*self.colour)
        return {
            "rotation_degrees": self.orientation.degrees,
            "mirrored": self.orientation.mirrored,
            "colour_matrix": matrix,
            "colour_range": colour_range,
            "interlaced": self.interlaced,
        }

    def _take(self, frame) -> None:
        if frame is not None:
            self.orientation = frame_orientation(frame)
            self.colour = (int(frame.colorspace), int(frame.color_range))
            self.interlaced = bool(frame.interlaced_frame)

    @staticmethod
    def _decode(stream, packet):
        """The packet's frame, or ``None`` when it decodes to none or fails."""
        import av

        context = stream.codec_context
        context.thread_count = 1  # frame threads would hold the frame back for more packets
        try:
            frames = context.decode(packet) or context.decode(None)  # B-frame reordering may hold it: flush
        except (av.FFmpegError, ValueError):
            return None
        return frames[0] if frames else None


def _store_info(path: Path | ObjectPath) -> VideoInfo:
    """A frame store's :class:`VideoInfo`: frame ``i`` has timestamp ``i`` and is a keyframe."""
    facts = probe_store(path)
    frames = tuple(range(facts.num_frames))
    return VideoInfo(
        str(path),
        codec=facts.codec,
        width=facts.width,
        height=facts.height,
        num_frames=facts.num_frames,
        pts=frames,
        keyframes=frames,
        declared_frames=facts.num_frames,
        problem=facts.problem,
        store=facts.kind,
        frame_name=facts.frame_name,
    )


def _finish_info(info: VideoInfo) -> VideoInfo:
    """Derive the frame rate and constancy from the timestamps, and name the first problem found."""
    deltas = np.diff(np.asarray(info.pts, dtype=np.int64))
    fps, cfr, covered, typical, gap, gap_at = 0.0, True, 0.0, 0.0, 0.0, 0
    unit = info.time_base[0] / info.time_base[1]
    if len(deltas):
        step = float(deltas.mean())  # mean, not median: millisecond time bases alternate 33/34
        fps = 1.0 / (step * unit) if step > 0 else 0.0
        cfr = bool(np.all(np.abs(np.subtract(deltas, step)) <= max(1.0, 0.01 * step)))
        typical = float(np.median(deltas)) * unit
        covered = float(info.pts[-1] - info.pts[0]) * unit + typical
        gap_at = int(np.argmax(deltas))
        gap = float(deltas[gap_at]) * unit
    checks = (
        (info.num_frames == 0, "no frames: the video stream holds no packets"),
        (bool((deltas <= 0).any()), "broken timestamps: two frames share a presentation time"),
        (
            0 < info.num_frames + info.hidden_frames < info.declared_frames,
            f"truncated: the container declares {info.declared_frames} frames but only "
            f"{info.num_frames + info.hidden_frames} are present",
        ),
        (
            # Containers without a frame count (webm, mkv) still declare their duration.
            not info.declared_frames and covered and covered < info.declared_seconds - max(2 * typical, 0.1),
            f"truncated: the container lasts {info.declared_seconds:.2f} s but its frames end at {covered:.2f} s",
        ),
        (
            gap > max(8 * typical, 0.25),
            f"damaged: frames are missing, a gap of {gap:.2f} s between frames {gap_at} and {gap_at + 1}",
        ),
        (
            info.codec not in SUPPORTED_CODECS,
            f"unsupported codec {info.codec!r}; supported: {', '.join(SUPPORTED_CODECS)} "
            "('gpufeed prepare' re-encodes it to h264)",
        ),
        (not info.keyframes, "no keyframe: the video cannot be decoded from any position"),
    )
    problem = next((why for failed, why in checks if failed), None)
    return replace(info, fps=round(fps, 6), cfr=cfr, problem=info.problem or problem)
