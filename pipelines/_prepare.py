"""``gpufeed prepare``: re-encode videos so random clip reads are cheap and exact.

Every video under the source folder is decoded once and re-encoded to:

* **h264** (default; NVDEC decodes it) in ``.mp4`` with the index at the front, or **vp9** in
  ``.webm`` (DALI's CPU decoder reads it, for machines without a GPU);
* **yuv420p**, BT.601 limited range and tagged so: converted from the source's own colour matrix
  (the one PyAV's readers convert with) to BT.601, the one DALI's video readers convert every video
  with (:mod:`gpufeed.pipelines._nvdec`), so both read the colours PyAV reads from the source;
* **constant frame rate** (frames are kept one for one, so labels stay aligned; their timestamps
  become evenly spaced at the source's average rate, or ``fps``), **no audio**, no B-frames
  (display order equals decode order);
* a **short GOP**: a keyframe every ``gop_frames``, by default twice the span of one clip
  (``2 * ((clip_length_frames - 1) * stride_frames + 1)``, at least 8: 22 frames for the default
  11-frame clips). A random clip then decodes on average about one clip's worth of frames it does
  not use, instead of half a long GOP (250 frames is a common encoder default). Shorter GOPs do
  not pay: keyframes cost more to decode than they save (measured on the 256 px benchmark videos:
  the same time per clip for GOPs of 11 to 32 frames, while files at GOP 11 are 1.6x those at 22);
* h264 only: ``crf`` 23 (x264's default quality; re-encoding an already lossy video at a lower
  crf mostly spends bits on its artifacts) and ``tune fastdecode`` (no CABAC, no deblocking: files
  somewhat larger, CPU decoding markedly cheaper; ``tune none`` turns it off).

With ``store: folder`` or ``hdf5`` every frame is written as one JPEG/PNG image instead, in the
layouts DeepEthogram's ``vidio`` writes (a random clip then costs only its own decodes).

Label CSVs are copied beside their videos after checking that they have one row per frame. At
the end, each video's random-seek cost (milliseconds per random clip with the keyframe-seek
reader) is measured before and after and printed as a table.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np

from gpufeed.core import SizePx, atomic_path, format_table, progress_bar
from gpufeed.pipelines._clips import ClipGeometry
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._frame_fit import FrameFitter, orient_yuv420p
from gpufeed.pipelines._frame_stores import label_path
from gpufeed.pipelines._prepare_stores import IMAGE_FORMATS, VIDEO, measure_store_seek_cost, store_choices, write_store
from gpufeed.pipelines._pyav import ClipDecodeError, ClipDecoder, VideoRef
from gpufeed.pipelines._store_kinds import FrameStore, frame_store
from gpufeed.pipelines._streams import main_video_stream
from gpufeed.pipelines._videos import list_videos, probe_video, read_label_csv

__all__ = ["PrepareOptions", "PrepareReport", "PreparedVideo", "measure_seek_cost", "prepare_videos"]

_CODECS = {"h264": ("libx264", ".mp4"), "vp9": ("libvpx-vp9", ".webm")}
_SMPTE170M = 6  # FFmpeg's AVCOL_SPC_SMPTE170M: BT.601, the matrix swscale writes for Colorspace.ITU601
_UNSAID = (0, 2, 3)  # FFmpeg's reserved and unspecified primaries and transfer numbers


def _tag_bt601(stream, source) -> None:
    """Tag the output ``stream`` as what its frames hold: BT.601 limited-range YUV.

    Untagged, decoders would read it so by default only; the tag says it to every decoder and
    player, and the index records it. The RGB stays the source's, in its primaries and transfer,
    which are carried over where the source names them.
    """
    from av.video.reformatter import ColorRange

    context = stream.codec_context
    context.colorspace, context.color_range = _SMPTE170M, ColorRange.MPEG.value
    if source.codec_context.color_primaries not in _UNSAID:
        context.color_primaries = source.codec_context.color_primaries
    if source.codec_context.color_trc not in _UNSAID:
        context.color_trc = source.codec_context.color_trc


@dataclass(frozen=True)
class PrepareOptions:
    """How ``prepare`` encodes.

    Attributes:
        codec: ``h264`` or ``vp9``.
        gop_frames: Keyframe interval; 0 picks twice the clip span (at least 8).
        crf: Constant-quality setting (lower is better quality and bigger files).
        fps: Output frame rate; 0 keeps the source's average rate.
        preset: x264 speed preset (h264 only).
        tune: x264 tuning (h264 only): ``fastdecode`` or ``none``.
        clip_length_frames, stride_frames: The clips that will be read (default GOP, seek probe).
        probe_clips: Random clips timed per video before and after (0 skips the measurement).
        seed: Seeds the probe's clip starts.
        store: ``video`` (re-encode, as above), or a frame store kind (``folder`` / ``hdf5``): every
            frame as one image in DeepEthogram's vidio layouts (:mod:`gpufeed.pipelines._prepare_stores`).
        image_format: ``jpeg`` or ``png``, the frames' encoding in a store.
        jpeg_quality: JPEG quality of a store's frames (1-100).
    """

    codec: str = "h264"
    gop_frames: int = 0
    crf: int = 23
    fps: float = 0.0
    preset: str = "medium"
    tune: str = "fastdecode"
    clip_length_frames: int = 11
    stride_frames: int = 1
    probe_clips: int = 20
    seed: int = 0
    store: str = VIDEO
    image_format: str = "jpeg"
    jpeg_quality: int = 95

    def __post_init__(self) -> None:
        if self.codec not in _CODECS:
            raise ValueError(f"codec {self.codec!r} is not allowed; allowed: {', '.join(_CODECS)}")
        if self.tune not in ("fastdecode", "none"):
            raise ValueError(f"tune {self.tune!r} is not allowed; allowed: fastdecode, none")
        if self.store not in store_choices():
            raise ValueError(f"store {self.store!r} is not allowed; allowed: {', '.join(store_choices())}")
        if self.image_format not in IMAGE_FORMATS:
            raise ValueError(f"image format {self.image_format!r} is not allowed; allowed: {', '.join(IMAGE_FORMATS)}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality {self.jpeg_quality} is not allowed; allowed: 1..100")
        if self.gop_frames < 0 or self.crf < 0 or self.fps < 0 or self.probe_clips < 0:
            raise ValueError("gop_frames, crf, fps and probe_clips must not be negative")

    @property
    def geometry(self) -> ClipGeometry:
        return ClipGeometry(self.clip_length_frames, self.stride_frames)

    @property
    def frame_store(self) -> FrameStore | None:
        """The frame store kind written (``None``: videos re-encoded)."""
        return None if self.store == VIDEO else frame_store(self.store)

    @property
    def resolved_gop_frames(self) -> int:
        return self.gop_frames or max(8, 2 * self.geometry.span_frames)


@dataclass
class PreparedVideo:
    """One video's outcome: paths, frames, GOP before/after, seek cost before/after, or the problem."""

    source: str
    output: str = ""
    frames: int = 0
    gop_before: float = 0.0
    gop_after: float = 0.0
    ms_per_clip_before: float = float("nan")
    ms_per_clip_after: float = float("nan")
    labels: str = "none"
    problem: str | None = None


@dataclass
class PrepareReport:
    """Everything ``prepare`` did."""

    options: PrepareOptions
    videos: list[PreparedVideo] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(v.problem is None for v in self.videos)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "options": asdict(self.options), "videos": [asdict(v) for v in self.videos]}

    def table(self) -> str:
        rows = []
        for v in self.videos:
            if v.problem:
                continue
            timed = v.ms_per_clip_before > 0 and v.ms_per_clip_after > 0  # NaN (not timed) fails both
            name = Path(v.output).name
            rows.append([name, v.frames, v.gop_before, v.gop_after])
            if timed:
                speedup = v.ms_per_clip_before / v.ms_per_clip_after
                rows[-1] += [v.ms_per_clip_before, v.ms_per_clip_after, f"{speedup:.1f}x"]
            else:  # shorter than one clip, or no clips asked for: nothing to time
                rows[-1] += ["-", "-", "-"]
        headers = ["video", "frames", "GOP before", "GOP after", "ms/clip before", "ms/clip after", "speed-up"]
        lines = [format_table(headers, rows)] if rows else []
        done = [v for v in self.videos if not v.problem and v.ms_per_clip_before > 0 and v.ms_per_clip_after > 0]
        if done and self.options.probe_clips:
            before = float(np.mean([v.ms_per_clip_before for v in done]))
            after = float(np.mean([v.ms_per_clip_after for v in done]))
            short = sum(1 for v in self.videos if not v.problem) - len(done)
            lines.append(
                f"random {self.options.clip_length_frames}-frame clip (stride {self.options.stride_frames}), "
                f"keyframe-seek reader, mean over {len(done)} video(s): {before:.2f} ms before, {after:.2f} ms "
                f"after ({before / after:.1f}x)" + (f"; {short} shorter than a clip, not timed" if short else "")
            )
        lines += [f"FAILED {v.source}: {v.problem}" for v in self.videos if v.problem]
        return "\n".join(lines)


def measure_seek_cost(path: str, clips: int, geometry: ClipGeometry, seed: int = 0, size_px: int = 112) -> float:
    """Milliseconds per random clip with the keyframe-seek reader, frames converted to ``size_px`` RGB.

    The file stays open between clips, as in the loader's workers.
    """
    info = probe_video(path)
    if info.problem or geometry.max_start(info.num_frames) < 0 or clips == 0:
        return float("nan")
    ref = VideoRef.from_info(info)
    starts = np.random.default_rng(seed).integers(0, geometry.max_start(info.num_frames) + 1, clips)
    decoder = ClipDecoder(fitter=FrameFitter(SizePx(size_px, size_px)))
    decoder.read(ref, geometry.frames(int(starts[0])))  # open the file outside the timing
    begin = time.perf_counter()
    for s in starts:
        decoder.read(ref, geometry.frames(int(s)))
    decoder.close()
    return (time.perf_counter() - begin) * 1000.0 / clips


def _encode(src: str, dst: Path, opts: PrepareOptions, info, bar) -> int:
    import av
    from av.video.frame import PictureType
    from av.video.reformatter import ColorRange, Colorspace, Interpolation, VideoReformatter
    from av.video.stream import VideoStream

    encoder, _ = _CODECS[opts.codec]
    gop = opts.resolved_gop_frames
    rate = Fraction(opts.fps).limit_denominator(1001) if opts.fps else Fraction(info.fps).limit_denominator(1001)
    count = 0
    reformatter = VideoReformatter()  # reused: a new one per frame costs more than the conversion
    container_opts = {"movflags": "+faststart"} if dst.suffix == ".mp4" else {}
    with (
        atomic_path(dst) as tmp,
        av.open(src) as source,
        av.open(str(tmp), "w", format=dst.suffix[1:], options=container_opts) as out,
    ):
        stream_in = main_video_stream(source)
        stream_in.thread_type = "AUTO"
        stream = out.add_stream(encoder, rate=rate)
        if not isinstance(stream, VideoStream):
            raise ValueError(f"encoder {encoder!r} is not a video encoder")
        # Written upright (as shown; the display rotation baked in, none declared), so every decoder,
        # NVDEC included, returns the frames PyAV's turn gives the original.
        shown_w, shown_h = info.display_size
        stream.width, stream.height, stream.pix_fmt = shown_w // 2 * 2, shown_h // 2 * 2, "yuv420p"
        stored_w, stored_h = info.orientation.shown_size(stream.width, stream.height)
        _tag_bt601(stream, stream_in)
        # swscale converts the YUV from the frame's own matrix and range (as PyAV reads it) to BT.601
        # limited range, and hands limited-range BT.601 frames of the output's size back untouched.
        # The flags keep it within 2 levels of PyAV's RGB (up to 5 without, on BT.709 colour bars).
        exact = Interpolation.BILINEAR | Interpolation.ACCURATE_RND | Interpolation.FULL_CHR_H_INT
        exact |= Interpolation.FULL_CHR_H_INP
        if opts.codec == "h264":
            stream.options = {
                "crf": str(opts.crf),
                "preset": opts.preset,
                "g": str(gop),
                "keyint_min": str(gop),
                "sc_threshold": "0",
                "bf": "0",
            }
            if opts.tune != "none":
                stream.options = {**stream.options, "tune": opts.tune}
        else:
            stream.options = {
                "crf": str(opts.crf),
                "b": "0",
                "g": str(gop),
                "keyint_min": str(gop),
                "auto-alt-ref": "0",  # no hidden frames: one packet per shown frame
                "lag-in-frames": "0",
                "deadline": "good",
                "cpu-used": "4",
                "row-mt": "1",
            }
        for frame in source.decode(stream_in):
            frame = reformatter.reformat(
                frame,
                width=stored_w,
                height=stored_h,
                format="yuv420p",
                dst_colorspace=Colorspace.ITU601,
                dst_color_range=ColorRange.MPEG,
                interpolation=exact,
            )
            frame = orient_yuv420p(frame, info.orientation)
            frame.pts, frame.time_base = count, Fraction(1) / rate
            frame.pict_type = PictureType.NONE  # a decoded frame keeps its type; an I here would force a keyframe
            for packet in stream.encode(frame):
                out.mux(packet)
            count += 1
            bar.update(1)
        for packet in stream.encode():
            out.mux(packet)
    return count


def prepare_videos(src: str | Path, dst: str | Path, options: PrepareOptions = PrepareOptions(), progress=True):
    """Re-encode every video under ``src`` into ``dst`` (same relative paths); see the module docs.

    Problems with one video (unreadable, labels not matching its frames) are recorded in the
    report with the path and reason; the other videos are still prepared.

    Raises:
        DatasetError: ``src`` is missing or holds no videos, or ``dst`` is ``src``.
    """

    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise DatasetError(f"video folder {src} does not exist or is not a folder")
    if dst.resolve() == src.resolve() or src.resolve() in dst.resolve().parents:
        raise DatasetError(f"--out {dst} must not be {src} or inside it")
    paths, _ = list_videos(src)
    if not paths:
        raise DatasetError(f"no videos in {src}")
    infos = [probe_video(p) for p in paths]
    report = PrepareReport(options)
    total = sum(i.num_frames for i in infos if not i.problem)
    _, ext = _CODECS[options.codec]
    with progress_bar(total=total, desc="prepare", unit="frame", disable=not progress, leave=False) as bar:
        for path, info in zip(paths, infos, strict=True):
            item = PreparedVideo(source=path, gop_before=round(info.gop_frames, 1))
            report.videos.append(item)
            if info.problem or info.store:
                item.problem = info.problem or "already a frame store; prepare reads encoded video files"
                continue
            relative = Path(path).relative_to(src)
            store = options.frame_store
            out = dst / (relative.with_suffix(ext) if store is None else store.output_path(relative))
            csv_in = Path(path).with_suffix(".csv")
            labels = None
            if csv_in.is_file():
                try:
                    labels = read_label_csv(csv_in)[1]
                except ValueError as err:
                    item.problem = str(err)
                    continue
                if len(labels) != info.num_frames:
                    item.problem = (
                        f"label file {csv_in} has {len(labels)} rows but the video has {info.num_frames} frames"
                    )
                    continue
            out.parent.mkdir(parents=True, exist_ok=True)
            try:
                if store is None:
                    count = _encode(path, out, options, info, bar)
                else:
                    count = write_store(path, out, options.store, options.image_format, options.jpeg_quality, bar)
            except Exception as err:  # FFmpeg and PyAV raise several types; the partial file is gone
                item.problem = f"re-encoding failed: {err}"
                continue
            after = probe_video(out)
            item.output, item.frames, item.gop_after = str(out), after.num_frames, round(after.gop_frames, 1)
            if after.problem or after.num_frames != info.num_frames or count != info.num_frames:
                item.problem = (
                    f"the output {out} has {after.num_frames} frames, the source {info.num_frames}"
                    f"{': ' + after.problem if after.problem else ''}"
                )
                continue
            if labels is not None:
                shutil.copyfile(csv_in, Path(str(label_path(out))))  # out is a local file
                item.labels = "copied, one row per frame"
    if options.probe_clips:
        done = [v for v in report.videos if not v.problem]
        for v in progress_bar(done, desc="seek cost", unit="video", disable=not progress, leave=False):
            try:
                v.ms_per_clip_before = measure_seek_cost(v.source, options.probe_clips, options.geometry, options.seed)
                measure = measure_seek_cost if options.frame_store is None else measure_store_seek_cost
                v.ms_per_clip_after = measure(v.output, options.probe_clips, options.geometry, options.seed)
            except ClipDecodeError as err:
                v.problem = f"seek probe failed: {err}"
    return report
