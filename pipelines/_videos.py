"""The video index: per-video frame facts (count, rate, keyframes) and per-frame labels.

Opening a video folder demuxes every video once (packets only, no decoding) to learn its codec,
size, frame count, presentation timestamps, keyframe positions and whether its frame rate is
constant. The result is cached beside the data (``.gpufeed/videos-index.json``) keyed by each
file's size and modification time, so it is rebuilt exactly when a file changes.

Frame ``i`` of a video is the ``i``-th frame in presentation order (timestamps sorted), which is
what every decoder here returns and what row ``i`` of the label CSV describes. Video ids are
positions in the sorted list of video files.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from gpufeed.core import DataPath, ObjectPath, data_path, join, media_source, progress_bar, stat_key, walk
from gpufeed.pipelines._cache import index_cache_path, read_json_cache, usable_ids, write_json_atomic
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._frame_stores import label_path, probe_store
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._label_csv import read_label_csv
from gpufeed.pipelines._mp4 import mp4_box_problem
from gpufeed.pipelines._shards import is_shard_dir, read_manifest
from gpufeed.pipelines._store_kinds import ShardStore, is_frame_folder, store_extensions, store_kind

__all__ = [
    "DALI_CPU_CODECS",
    "SUPPORTED_CODECS",
    "VIDEO_EXTENSIONS",
    "VideoDataset",
    "VideoInfo",
    "index_videos",
    "labels_for",
    "list_videos",
    "probe_video",
    "read_label_csv",
]

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".mov", ".avi", ".webm", ".m4v")
# What gpufeed reads (PyAV decodes all of these on the CPU); which of them NVDEC takes depends on
# profile, pixel format and GPU (see gpufeed.pipelines._nvdec).
SUPPORTED_CODECS = ("h264", "hevc", "vp8", "vp9", "av1", "mpeg4", "mjpeg")
# What DALI's CPU video decoder handles (measured: not h264/hevc/mpeg4).
DALI_CPU_CODECS = ("vp8", "vp9", "mjpeg")
_INDEX_VERSION = 5  # 4: profile, frame stores; 5: both together
_MP4_LIKE = (".mp4", ".mov", ".m4v")


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
        return VideoInfo(str(path), problem=f"unreadable: {err.strerror or err}")
    if size == 0:
        return VideoInfo(str(path), problem="zero-byte file")
    if path.suffix.lower() in _MP4_LIKE:
        boxed = mp4_box_problem(path, size)
        if boxed:
            return VideoInfo(str(path), problem=boxed)
    try:
        with av.open(media_source(path), "r") as container:
            if not container.streams.video:
                what = "audio only" if container.streams.audio else "no stream at all"
                return VideoInfo(str(path), problem=f"no video stream in the file ({what})")
            stream = container.streams.video[0]
            # The codec, not the decoder PyAV picked for it (AV1 opens as "libdav1d").
            codec = getattr(stream.codec_context.codec, "canonical_name", "") or stream.codec_context.name
            width, height = stream.codec_context.width, stream.codec_context.height
            pix_fmt = stream.codec_context.pix_fmt or ""
            profile = stream.codec_context.profile or ""
            declared = int(stream.frames or 0)
            seconds = container.duration / 1e6 if container.duration and len(container.streams) == 1 else 0.0
            tb = stream.time_base
            pts_keys = []
            for packet in container.demux(stream):
                if packet.size == 0 or packet.pts is None:
                    continue  # the flush packet, or one without a timestamp (nothing to show)
                pts_keys.append((int(packet.pts), bool(packet.is_keyframe)))
    except av.FFmpegError as err:
        return VideoInfo(str(path), problem=f"cannot be read as a video: {err}")
    pts_keys.sort()
    pts = tuple(p for p, _ in pts_keys)
    keyframes = tuple(i for i, (_, key) in enumerate(pts_keys) if key)
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
    )
    return _finish_info(info)


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
    from dataclasses import replace

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
            0 < info.num_frames < info.declared_frames,
            f"truncated: the container declares {info.declared_frames} frames but only {info.num_frames} are present",
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


def list_videos(root: Path | ObjectPath) -> tuple[list[str], list[str]]:
    """(videos, other files) under ``root``, sorted, hidden files and folders skipped.

    Videos are video files, HDF5 frame files and frame folders (a folder of numbered images is one
    video; nothing inside it is listed).
    """
    videos: list[str]
    others: list[str]
    videos, others = [], []
    for dirpath, dirnames, filenames in walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        stores = [d for d in dirnames if is_frame_folder(join(dirpath, d))]
        dirnames[:] = [d for d in dirnames if d not in stores]
        here = [(n, True) for n in stores] + [(n, False) for n in filenames if not n.startswith(".")]
        for name, is_store in sorted(here):
            full = join(dirpath, name)
            (videos if is_store or name.lower().endswith(VIDEO_EXTENSIONS + store_extensions()) else others).append(
                full
            )
    return videos, others


@dataclass(frozen=True)
class VideoDataset:
    """An indexed folder of videos with per-frame labels.

    Attributes:
        paths: Video files; a video id is a position in this tuple.
        infos: One :class:`VideoInfo` per video.
        labels: (num_frames, K) uint8 per video (``None`` where it has no usable label file).
        behaviours: The K label column names, shared by every video.
        problems: Video id -> why it cannot be used (bad file, missing or mismatched labels).
        source: The folder the dataset came from.
        max_pixels: Frames of frame stores whose header declares more pixels are refused before
            any decode (``data.max_image_pixels``).
    """

    paths: tuple[str, ...]
    infos: tuple[VideoInfo, ...]
    labels: tuple[np.ndarray | None, ...]
    behaviours: tuple[str, ...]
    problems: dict[int, str] = field(default_factory=dict)
    source: str = ""
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def usable_ids(self) -> np.ndarray:
        """Video ids with no recorded problem (readable, supported, with matching labels)."""
        return usable_ids(len(self.paths), self.problems)

    @property
    def num_frames(self) -> np.ndarray:
        return np.array([info.num_frames for info in self.infos], dtype=np.int64)

    @property
    def codecs(self) -> set[str]:
        return {self.infos[i].codec for i in self.usable_ids}

    @classmethod
    def from_folder(
        cls,
        root: str | Path | ObjectPath,
        *,
        require_labels: bool = True,
        progress: bool = False,
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> VideoDataset:
        """Index every video under ``root`` (with its ``<name>.csv`` labels when ``require_labels``).

        ``max_pixels``: the frame pixel limit of its frame stores (``data.max_image_pixels``). A
        shard folder of clips (``gpufeed prepare --shards``) is read as its manifest says (:meth:`from_shards`).
        """
        root = data_path(root)
        if is_shard_dir(root):
            return cls.from_shards(root, max_pixels=max_pixels)
        if not root.is_dir():
            raise DatasetError(f"video folder {root} does not exist or is not a folder")
        paths, _ = list_videos(root)
        if not paths:
            raise DatasetError(
                f"no videos ({', '.join(VIDEO_EXTENSIONS + store_extensions())} files or folders of numbered frames) in {root}"
            )
        infos = index_videos(root, paths, progress)
        problems = {i: info.problem for i, info in enumerate(infos) if info.problem}
        labels: list[np.ndarray | None] = [None] * len(paths)
        behaviours: tuple[str, ...] = ()
        if require_labels:
            for i, path in enumerate(paths):
                labels[i], why, names = labels_for(data_path(path), infos[i])
                if why:
                    problems.setdefault(i, why)
                    continue
                if not behaviours:
                    behaviours = names
                elif names != behaviours:
                    problems.setdefault(
                        i, f"label columns {list(names)} differ from the other videos' {list(behaviours)}"
                    )
                    labels[i] = None
        problems = dict(sorted(problems.items()))
        return cls(tuple(paths), tuple(infos), tuple(labels), behaviours, problems, str(root), max_pixels)

    @classmethod
    def from_shards(cls, root: str | Path | ObjectPath, *, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> VideoDataset:
        """Index a shard folder of clips (:mod:`gpufeed.pipelines._shards`): one "video" per stored clip.

        Each clip is a frame store of kind ``shard``: its frames are tar members, all read in one
        ranged read of the clip's span; its labels come from the manifest. A clip loader over it
        with the shards' clip length reads each stored clip whole (one clip slot per sample id).
        """
        return _shard_clips(cls, root, max_pixels)


def _shard_clips(cls, root: str | Path | ObjectPath, max_pixels: int) -> VideoDataset:
    """:meth:`VideoDataset.from_shards` (kept out of the class body: the class stays short to read)."""
    manifest = read_manifest(root, "clips")
    paths, infos, problems = [], [], {}
    labels: list[np.ndarray | None] = []
    for i, row in enumerate(manifest.rows):
        frames = tuple(range(int(row["frames"])))
        path = manifest.ref(i)
        width, height = int(row["width"]), int(row["height"])
        info = VideoInfo(
            path,
            codec="jpeg" if row["ext"] == "jpg" else "png",
            width=width,
            height=height,
            num_frames=len(frames),
            pts=frames,
            keyframes=frames,
            declared_frames=len(frames),
            store=ShardStore.kind,
            frame_name=f"{row['key']}.f{{:04d}}.{row['ext']}",
        )
        if width * height > max_pixels:
            problems[i] = f"too many pixels: {width}x{height} frames, more than data.max_image_pixels ({max_pixels:,})"
        bits = row["labels"]
        if len(bits) != len(frames) or any(len(b) != len(manifest.names) for b in bits):
            problems[i] = (
                f"the manifest's labels of clip {row['key']} are not {len(frames)} rows of {len(manifest.names)}"
            )
            labels.append(None)
        else:
            labels.append(np.array([[c == "1" for c in b] for b in bits], dtype=np.uint8).reshape(len(frames), -1))
        paths.append(path)
        infos.append(info)
    source = f"clip shards in {manifest.root}"
    return cls(tuple(paths), tuple(infos), tuple(labels), manifest.names, problems, source, max_pixels)


def labels_for(
    path: DataPath, info: VideoInfo, csv_path: DataPath | None = None
) -> tuple[np.ndarray | None, str | None, tuple[str, ...]]:
    """(labels, why they cannot be used, column names) of a video; ``csv_path`` defaults to ``<name>.csv`` beside it."""
    csv_path = csv_path or label_path(path)
    if not csv_path.is_file():
        return None, f"no label file: expected {csv_path.name} beside the video", ()
    if info.problem:  # the video cannot be used: its labels are not read (nor bounded by its frames)
        return None, None, ()
    try:
        names, labels = read_label_csv(csv_path, max_rows=info.num_frames)
    except ValueError as err:
        return None, str(err), ()
    if len(labels) != info.num_frames:
        more = "more than " if len(labels) > info.num_frames else ""
        return (
            None,
            f"label file {csv_path.name} has {more}{min(len(labels), info.num_frames)} rows but the video has "
            f"{info.num_frames} frames",
            (),
        )
    return labels, None, names


def index_videos(root: Path | ObjectPath, paths: list[str], progress: bool = False) -> list[VideoInfo]:
    """:func:`probe_video` for every path, reusing the cache beside the data when a file is unchanged."""
    cache_path = index_cache_path(root, "videos-index.json")
    cached = read_json_cache(cache_path) or {}
    entries = cached.get("entries", {}) if cached.get("version") == _INDEX_VERSION else {}
    stats: list[list[int] | None]
    stats, todo, infos = [], [], {}
    for i, path in enumerate(paths):
        try:
            stats.append(list(stat_key(path)))
        except OSError:
            stats.append(None)
        # A frame store is probed every time: a folder's own timestamp misses a frame rewritten in
        # place, and probing reads one header.
        hit = None if store_kind(path) else entries.get(path)
        if stats[-1] is not None and hit is not None and hit[:2] == stats[-1]:
            infos[i] = VideoInfo.from_json(hit[2])
        else:
            todo.append(i)
    if todo:
        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 2)) as pool:
            probed = pool.map(probe_video, (paths[i] for i in todo))
            bar = progress_bar(
                probed, total=len(todo), desc="indexing videos", unit="video", disable=not progress, leave=False
            )
            for i, info in zip(todo, bar, strict=True):
                infos[i] = info
        fresh = {
            p: [*s, infos[i].to_json()]
            for i, (p, s) in enumerate(zip(paths, stats, strict=True))
            if s and not infos[i].store
        }
        write_json_atomic(cache_path, {"version": _INDEX_VERSION, "entries": fresh})
    return [infos[i] for i in range(len(paths))]
