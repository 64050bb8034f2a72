"""``gpufeed check FILE`` on one video, one frame store, or an image of a format gpufeed does not read.

Any file that no checker recognised used to be parsed as an image list file, so one camera video
or one GIF was reported as "list file ... is not UTF-8 text". Registered in
:data:`gpufeed.pipelines._check.CHECKERS`:

* **one video** (``.mp4``, ``.mkv``, ``.mov``, ``.avi``, ``.webm``, ``.m4v``) or **one frame store**
  (a frame folder, an ``.h5`` file): indexed, its labels read, every frame decoded, as in a video
  folder. Its label CSV is ``<name>.csv`` beside it, or, in a DeepEthogram record folder, the one
  DeepEthogram wrote: the ``record.yaml``'s ``label.default``, else ``<name>_labels.csv`` (its GUI
  saves a video's labels under that name);
* **an image of another format** (GIF, BMP, WebP, TIFF, HEIC ..., by its first bytes or its
  extension): named as unsupported, a bad file.
"""

from __future__ import annotations

from pathlib import Path

from gpufeed.core import DataPath, ObjectPath, data_path, open_binary
from gpufeed.pipelines._check import CHECKERS, CheckReport, Finding
from gpufeed.pipelines._deepethogram import _load_yaml  # the project's own YAML reading (and its limits)
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._frame_stores import label_path
from gpufeed.pipelines._image_facts import read_image_facts
from gpufeed.pipelines._video_check import check_dataset, is_single_store
from gpufeed.pipelines._videos import VIDEO_EXTENSIONS, VideoDataset, labels_for, probe_video

__all__ = ["check_one_video", "is_one_video", "label_file", "unsupported_image"]

# Extensions of image formats the pipelines do not decode (their first bytes are checked too).
_OTHER_IMAGE_EXTENSIONS = {
    ".gif": "GIF",
    ".bmp": "BMP",
    ".webp": "WebP",
    ".tif": "TIFF",
    ".tiff": "TIFF",
    ".heic": "HEIC",
    ".heif": "HEIF",
    ".avif": "AVIF",
    ".jxl": "JPEG XL",
    ".jp2": "JPEG 2000",
}


def is_one_video(path: DataPath) -> bool:
    """True for one video file or one frame store named directly."""
    return (path.is_file() and path.suffix.lower() in VIDEO_EXTENSIONS) or is_single_store(path)


def _deepethogram_name(video: DataPath) -> DataPath:
    """DeepEthogram's label file of ``video``: ``<stem>_labels.csv`` beside it (its GUI's ``save``)."""
    stem = video.name if video.is_dir() else video.stem
    return video.with_name(f"{stem}_labels.csv")


def _record_labels(video: DataPath) -> DataPath | None:
    """The ``label.default`` file of the DeepEthogram record ``video`` sits in, when it names one that exists."""
    try:
        record = _load_yaml(video.parent / "record.yaml", "record")
    except DatasetError:
        return None  # an unreadable record: the file-name rule still finds DeepEthogram's labels
    entry = record.get("label")
    default = entry.get("default") if isinstance(entry, dict) else None
    found = video.parent / default if isinstance(default, str) and default else None
    return found if found is not None and found.is_file() else None


def label_file(video: str | Path | ObjectPath) -> tuple[DataPath | None, str | None]:
    """(the label CSV of one video or frame store named directly, or why there is none).

    ``<name>.csv`` beside it; in a DeepEthogram record folder (a ``record.yaml`` beside it), the
    record's ``label.default``; else DeepEthogram's ``<name>_labels.csv``.
    """
    video = data_path(video)
    plain = label_path(video)
    if plain.is_file():
        return plain, None
    if (video.parent / "record.yaml").is_file():
        found = _record_labels(video)
        if found is not None:
            return found, None
    deepethogram = _deepethogram_name(video)
    if deepethogram.is_file():
        return deepethogram, None
    return None, f"no label file: expected {plain.name} (or DeepEthogram's {deepethogram.name}) beside it"


def check_one_video(path: DataPath, progress: bool = True, clip_span_frames: int | None = None) -> CheckReport:
    """Check one video file or frame store as a video folder checks each of its videos (``clip_span_frames``: as
    :func:`~gpufeed.pipelines._video_check.check_dataset`)."""
    info = probe_video(path)
    csv, why = label_file(path)
    labels = None
    names: tuple[str, ...] = ()
    if csv is not None:
        labels, why, names = labels_for(path, info, csv)
    dataset = VideoDataset((str(path),), (info,), (labels,), names, {0: why} if why else {}, str(path))
    return check_dataset(dataset, f"{'frame store' if info.store else 'video'} {path}", progress, clip_span_frames)


def unsupported_image(path: DataPath) -> str | None:
    """Why ``path`` is an image gpufeed does not read (its format by its first bytes, or its extension), or ``None``."""
    try:
        with open_binary(path) as fh:
            head = fh.read(64)
    except OSError:
        return None
    found = read_image_facts(head).format  # the magic number alone names the format
    if found in ("JPEG", "PNG"):
        return None
    if found in ("RIFF", "PDF"):  # containers and documents, not images (a WebP is named as such)
        found = ""
    name = found or _OTHER_IMAGE_EXTENSIONS.get(path.suffix.lower())
    if not name:
        return None
    return f"a {name} image: gpufeed reads JPEG and PNG images only; convert it to one of those"


def _is_unsupported_image(path: DataPath) -> bool:
    return path.is_file() and unsupported_image(path) is not None


def _check_unsupported_image(path: DataPath, progress: bool = True, clip_span_frames: int | None = None) -> CheckReport:
    # clip_span_frames: every checker takes it (check_path passes it on); an image has no clips.
    reason = unsupported_image(path) or "not a JPEG or PNG image"
    return CheckReport(sources=[str(path)], checked=1, findings=[Finding(str(path), reason, "image")])


CHECKERS.append((is_one_video, check_one_video))
CHECKERS.append((_is_unsupported_image, _check_unsupported_image))
