"""The video index: a folder's videos, each one's frame facts (count, rate, keyframes) and per-frame labels.

Opening a video folder demuxes every video once (:func:`~gpufeed.pipelines._video_probe.probe_video`:
packets only, no decoding) to learn its codec, size, frame count, presentation timestamps, keyframe
positions and whether its frame rate is constant. The result is cached beside the data
(``.gpufeed/videos-index.json``) keyed by each file's size and modification time, so it is rebuilt
exactly when a file changes.

Frame ``i`` of a video is the ``i``-th frame in presentation order (timestamps sorted), which is
what every decoder here returns and what row ``i`` of the label CSV describes. Video ids are
positions in the sorted list of video files. One video's facts (:class:`VideoInfo`) and the codec
tables live in :mod:`gpufeed.pipelines._video_probe`; they are re-exported here, with the index
they make up.
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from gpufeed.core import DataPath, ObjectPath, data_path, join, open_binary, progress_bar, stat_key, walk
from gpufeed.pipelines._cache import index_cache_path, read_json_cache, usable_ids, write_json_atomic
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._frame_stores import label_path
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._label_csv import read_label_csv
from gpufeed.pipelines._shards import is_shard_dir, read_manifest
from gpufeed.pipelines._store_kinds import ShardStore, is_frame_folder, store_extensions, store_kind
from gpufeed.pipelines._video_probe import DALI_CPU_CODECS, SUPPORTED_CODECS, VideoInfo, probe_video

__all__ = [
    "DALI_CPU_CODECS",
    "RAW_STREAM_SUFFIXES",
    "SUPPORTED_CODECS",
    "VIDEO_EXTENSIONS",
    "VideoDataset",
    "VideoInfo",
    "index_videos",
    "labels_for",
    "list_videos",
    "probe_video",
    "raw_stream_hint",
    "read_label_csv",
]

# .ts/.mts/.m2ts: MPEG transport streams (AVCHD camcorders write .mts); read with PyAV (see _nvdec).
VIDEO_EXTENSIONS = (".mp4", ".mkv", ".mov", ".avi", ".webm", ".m4v", ".ts", ".mts", ".m2ts")
# 4: profile, frame stores; 5: both; 6: display matrix, video streams, edit lists, container; 7: cover pictures;
# 8: colour matrix and range; 9: interlacing; 10: a file that is no video is named by its first bytes
_INDEX_VERSION = 10


# Raw video elementary streams (a Raspberry Pi camera writes .h264): no container, so no timestamps
# and no index; a player guesses a frame rate. They are named, not read.
RAW_STREAM_SUFFIXES = (".h264", ".264", ".h265", ".265", ".hevc")


def raw_stream_hint(path: str) -> str | None:
    """What a raw H.264/H.265 stream file is and how to wrap it (``None`` for any other file).

    Phrased to follow "<path> is": ``f"{path} is {hint}"``.
    """
    name = str(path)
    if not name.lower().endswith(RAW_STREAM_SUFFIXES):
        return None
    wrapped = name.rsplit(".", 1)[0] + ".mp4"
    return (
        "a raw H.264/H.265 stream (a Raspberry Pi camera's, say): no container, so no timestamps or index "
        f"to seek by; wrap it first at its recording rate, e.g. ffmpeg -framerate 30 -i {name} -c copy {wrapped}"
    )


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
            video = is_store or name.lower().endswith(VIDEO_EXTENSIONS + store_extensions())
            if video and name.lower().endswith(".ts"):
                video = _is_transport_stream(full)  # .ts is also TypeScript's suffix
            (videos if video else others).append(full)
    return videos, others


def _is_transport_stream(path) -> bool:
    """Whether a ``.ts`` file starts as an MPEG transport stream does (the 0x47 sync byte), not as text."""
    try:
        with open_binary(path) as file:
            return file.read(1) == b"\x47"
    except OSError:
        return True  # unreadable: listed, so that the index names why


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

    def in_column_order(self, names: tuple[str, ...]) -> VideoDataset:
        """This dataset with its label columns reordered to ``names`` (the same behaviours, another order).

        A validation folder whose CSVs list training's behaviours in another order is read by name:
        its targets must line up with the model's outputs, which follow training's columns.

        Raises:
            ValueError: ``names`` are not exactly this dataset's behaviours.
        """
        if sorted(names) != sorted(self.behaviours):
            raise ValueError(f"label columns {list(names)} are not those of {self.source}: {list(self.behaviours)}")
        labels = tuple(None if rows is None else _columns_in(rows, self.behaviours, names) for rows in self.labels)
        return replace(self, labels=labels, behaviours=tuple(names))

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
        paths, others = list_videos(root)
        if not paths:
            raw = next((other for other in others if raw_stream_hint(other)), None)
            raise DatasetError(
                f"no videos ({', '.join(VIDEO_EXTENSIONS + store_extensions())} files or folders of numbered frames) in {root}"
                + (f"; {raw} is {raw_stream_hint(raw)}" if raw else "")
            )
        infos = index_videos(root, paths, progress)
        problems = {i: info.problem for i, info in enumerate(infos) if info.problem}
        labels: list[np.ndarray | None] = [None] * len(paths)
        behaviours: tuple[str, ...] = ()
        if require_labels:
            behaviours = _label_columns(paths, infos, labels, problems)
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


def _label_columns(paths, infos, labels: list, problems: dict) -> tuple[str, ...]:
    """Read every video's labels into ``labels``; the behaviours most of them name, in their order.

    A video naming the same behaviours in another order is read by name (its columns reordered);
    one naming others is a problem. The most common list is the reference, not the first video's,
    so that one odd file is the one named, not every other.
    """
    named: dict[int, tuple[str, ...]] = {}
    for i, path in enumerate(paths):
        labels[i], why, names = labels_for(data_path(path), infos[i])
        if why:
            problems.setdefault(i, why)
        elif labels[i] is not None:  # None without a reason: the video itself is bad, already named
            named[i] = tuple(names)
    if not named:
        return ()
    kinds, count = Counter(tuple(sorted(names)) for names in named.values()).most_common(1)[0]
    behaviours = Counter(names for names in named.values() if tuple(sorted(names)) == kinds).most_common(1)[0][0]
    for i, names in named.items():
        if names == behaviours:
            continue
        if sorted(names) == sorted(behaviours):
            labels[i] = _columns_in(labels[i], names, behaviours)
            continue
        problems.setdefault(i, f"label columns {list(names)} differ from {count} other video(s)' {list(behaviours)}")
        labels[i] = None
    return behaviours


def _columns_in(rows: np.ndarray, names: tuple[str, ...], order: tuple[str, ...]) -> np.ndarray:
    """``rows`` (label columns ``names``) with its columns in ``order``: the same behaviours, by name."""
    return rows[:, [names.index(name) for name in order]]
