"""What ``gpufeed predict`` scores, and where each answer goes.

``SOURCE`` is one of:

* a video: an encoded file (``.mp4``, ``.avi`` ...), a frame folder (numbered images) or an HDF5
  file of encoded frames;
* a folder of videos, walked as a training folder is (:func:`~gpufeed.pipelines._videos.list_videos`),
  minus files ``predict`` itself wrote (``*_outputs.h5``, which an HDF5 frame store's suffix would
  otherwise make a video);
* a DeepEthogram project (``project_config.yaml`` and ``DATA/``): each record's ``rgb.default``
  video, read with the containment rules of training (a record that names a file outside the project
  is a failed video, named by its record, and the others are still scored);
* for an image model, an image or a folder of images (JPEG/PNG, walked recursively).

Each video's output is ``<name>_predictions.csv`` (``--format hdf5``: ``<name>_outputs.h5``, the
name DeepEthogram gives its output files), ``<name>`` the video's file name without its suffix (a
frame folder's own name): beside the video by default, so in a project inside its record's folder;
under ``--out DIR`` at the same place relative to the source (a project: ``DIR/<record>/``). An
image folder's answer is one ``predictions.csv``. Neither name holds ``label`` or ``score``, which
DeepEthogram would take for a label file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gpufeed.core import DataPath, is_object_url
from gpufeed.pipelines import (
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    DatasetError,
    is_frame_folder,
    is_project,
    list_videos,
    raw_stream_hint,
    read_project,
    store_extensions,
)

__all__ = ["FORMATS", "OUTPUT_SUFFIXES", "Target", "find_images", "find_videos", "local_source", "output_path"]

FORMATS = ("csv", "hdf5")
OUTPUT_SUFFIXES = {"csv": "_predictions.csv", "hdf5": "_outputs.h5"}
_FILE_SUFFIXES = {"csv": ".csv", "hdf5": ".h5"}  # of an output file --out names for a single video
IMAGES_OUTPUT = "predictions.csv"


@dataclass(frozen=True)
class Target:
    """One video to score.

    Attributes:
        path: The video file or frame store.
        name: How messages and the summary name it (its path relative to the source, or
            ``record KEY (file)`` in a project).
        out_base: Its output's path without the format's suffix (``.../mouse01`` ->
            ``.../mouse01_predictions.csv``).
        problem: Why it cannot be scored before anything is read (a project record's problem), or ``None``.
        labels: Its label file where it is not ``<name>.csv`` beside it (a project record's), for the
            picture (``--plot``); ``None``: that default.
        out_file: The output file itself, where ``--out`` named one for a single video.
    """

    path: DataPath
    name: str
    out_base: Path
    problem: str | None = None
    labels: DataPath | None = None
    out_file: Path | None = None  # ``--out x.csv`` for one video: that file, not a folder named so


def output_path(target: Target, fmt: str) -> Path:
    """Where ``target``'s output in format ``fmt`` (``csv`` or ``hdf5``) goes.

    Raises:
        ValueError: ``--out`` named a file whose suffix is another format's.
    """
    if target.out_file is not None:
        if target.out_file.suffix.lower() != _FILE_SUFFIXES[fmt]:
            raise ValueError(f"--out {target.out_file}: a {fmt} output is a {_FILE_SUFFIXES[fmt]} file")
        return target.out_file
    return target.out_base.with_name(target.out_base.name + OUTPUT_SUFFIXES[fmt])


def _stem(path: DataPath) -> str:
    return path.name if path.is_dir() else path.stem


def _is_video_file(path: Path) -> bool:
    return path.name.lower().endswith(VIDEO_EXTENSIONS + store_extensions())


def _own_output(path: str) -> bool:
    return os.path.basename(path).endswith(OUTPUT_SUFFIXES["hdf5"])


def local_source(source: str | Path) -> Path:
    """``source`` as a local path; an ``s3://`` URL is refused in one line (before ``Path`` makes it ``s3:/``).

    Raises:
        DatasetError: ``source`` is in object storage.
    """
    if is_object_url(str(source)):
        raise DatasetError(
            f"{source}: gpufeed predict reads local videos and images; copy the objects to a local folder first "
            "(object storage is read by train, check and prepare)"
        )
    return Path(source)


def find_videos(source: str | Path, out: str | Path | None = None, allowed_roots: tuple = ()) -> list[Target]:
    """The videos under ``source`` (see the module docs), sorted, each with its output's place.

    Args:
        source: A video, a folder of videos or a DeepEthogram project.
        out: The output folder (``None``: beside each video).
        allowed_roots: Folders outside a project its records may name (``data.allowed_roots``).

    Raises:
        DatasetError: ``source`` does not exist, or holds no video (one line naming it).
    """
    source = local_source(source)
    if not source.exists():
        raise DatasetError(f"{source} does not exist")
    out_dir = Path(out) if out is not None else None
    if source.is_dir() and is_project(source):
        return _project_targets(source, out_dir, allowed_roots)
    if source.is_file() or is_frame_folder(source):
        if source.is_file() and not _is_video_file(source):
            raw = raw_stream_hint(str(source))
            raise DatasetError(
                f"{source} is {raw}"
                if raw
                else f"{source} is not a video: expected {', '.join(VIDEO_EXTENSIONS + store_extensions())}, a frame "
                "folder, a folder of videos or a DeepEthogram project"
            )
        if out_dir is not None and out_dir.suffix.lower() in _FILE_SUFFIXES.values() and not out_dir.is_dir():
            return [Target(source, source.name, out_dir.with_suffix(""), out_file=out_dir)]  # `--out mouse1.csv`
        base = (out_dir or source.parent) / _stem(source)
        return [Target(source, source.name, base)]
    paths, _ = list_videos(source)
    paths = [p for p in paths if not _own_output(p)]
    if not paths:
        raise DatasetError(
            f"no videos ({', '.join(VIDEO_EXTENSIONS + store_extensions())} files or folders of numbered frames) in "
            f"{source}"
        )
    targets = []
    for text in paths:
        path = Path(text)
        relative = path.relative_to(source)
        folder = (out_dir / relative.parent) if out_dir is not None else path.parent
        targets.append(Target(path, str(relative), folder / _stem(path)))
    return targets


def _project_targets(root: Path, out_dir: Path | None, allowed_roots: tuple) -> list[Target]:
    project = read_project(root, allowed_roots)
    targets = []
    for record in project.records:
        folder = root / project.data_dir.name / record.key  # the project is local: so are the outputs beside it
        video = record.video
        # A record's label file is not needed to score its video: only a problem with the video counts.
        problem = record.problem if video is None or "'rgb" in (record.problem or "") else None
        stem = _stem(video) if video is not None else record.key
        base = (out_dir / record.key if out_dir is not None else folder) / stem
        name = f"record {record.key} ({video.name})" if video is not None else f"record {record.key}"
        targets.append(Target(video if video is not None else folder, name, base, problem, record.labels))
    return targets


def find_images(source: str | Path, out: str | Path | None = None) -> tuple[list[Path], Path]:
    """The images under ``source`` (one image, or a folder walked recursively, sorted) and the CSV to write.

    The CSV is ``out/predictions.csv``, or ``out`` itself where it names a ``.csv`` file; without
    ``out``, beside the images (``<stem>_predictions.csv`` for a single image).

    Raises:
        DatasetError: ``source`` does not exist or holds no JPEG/PNG image.
    """
    source = local_source(source)
    if not source.exists():
        raise DatasetError(f"{source} does not exist")
    if source.is_file():
        images = [source]
        root = source.parent
    else:
        root = source
        images = sorted(
            Path(dirpath) / name
            for dirpath, dirnames, filenames in os.walk(source)
            for name in filenames
            if name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith(".")
            if not any(part.startswith(".") for part in Path(dirpath).relative_to(source).parts)
        )
    if not images:
        raise DatasetError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) in {source}")
    if out is not None and Path(out).suffix.lower() == ".csv" and not Path(out).is_dir():
        return images, Path(out)  # --out scores.csv: the CSV itself (it made a folder named scores.csv)
    base = Path(out) if out is not None else root
    if source.is_file() and out is None:
        return images, base / f"{source.stem}_{IMAGES_OUTPUT}"
    return images, base / IMAGES_OUTPUT
