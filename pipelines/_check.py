"""``gpufeed check``: find every file that would stop or poison training, before training.

For images it reports zero-byte, unreadable, non-image and unsupported files, truncated or
damaged JPEG/PNG (by their structure: markers, chunks and CRCs up to the end marker; bytes after
it are fine), pixel bombs (by their header, never decoded; ``max_pixels``), files whose data fails
a strict decode (:func:`~gpufeed.pipelines.decode_problem`: a JPEG cut short with a new end marker
is found here), unknown labels, and non-image files sitting in the dataset's folders (which the
loader ignores). Each finding names the path and the reason, and has a kind: ``image``, ``label``,
``video`` (the file is bad: it is listed for quarantine and makes the check fail), ``class`` (a
class folder with no .jpg/.jpeg/.png image, e.g. only WebP files or none: the check fails, and a
folder is never quarantined), ``warning`` (usable, but worth knowing, e.g. a variable frame rate),
``decoder`` (which decoder a video gets on a GPU, and why) or ``ignored`` (not read at all).
``check_path`` works out what a path is (list file, class folders, a folder of splits such as
``gpufeed synth``'s output) and checks all of it.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufeed.core import DataPath, ObjectPath, data_path, listdir, prime_listing, progress_bar
from gpufeed.pipelines._dataset import IMAGE_EXTENSIONS, ImageDataset
from gpufeed.pipelines._epochs import default_num_threads
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._image_verify import decode_problem
from gpufeed.pipelines._split_folders import split_folders, split_warning
from gpufeed.pipelines._videos import RAW_STREAM_SUFFIXES, VIDEO_EXTENSIONS

__all__ = ["CHECKERS", "NOT_BAD", "CheckReport", "Finding", "check_images", "check_path"]

# Finding kinds that do not make a file bad: noted in the report, never quarantined.
NOT_BAD = ("ignored", "warning", "decoder")
# Problems that fail the check but name a folder, not a file: never written to a quarantine list.
_NOT_FILES = ("class",)


@dataclass(frozen=True)
class Finding:
    """One finding: the file (or class folder), what is wrong, and its kind (image, label, video, class, warning, ...)."""

    path: str
    reason: str
    kind: str


@dataclass
class CheckReport:
    """Everything ``check`` looked at and found."""

    sources: list[str] = field(default_factory=list)
    checked: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing would stop or poison training (warnings and ignored files are only noted)."""
        return not any(f.kind not in NOT_BAD for f in self.findings)

    def merge(self, other: CheckReport) -> CheckReport:
        self.sources += other.sources
        self.checked += other.checked
        self.findings += other.findings
        return self

    def bad_paths(self) -> list[str]:
        """Paths to leave out of training (a quarantine list)."""
        return sorted({f.path for f in self.findings if f.kind not in NOT_BAD + _NOT_FILES})

    def to_json(self) -> str:
        return json.dumps({"ok": self.ok, **asdict(self)}, indent=2)

    def table(self) -> str:
        lines = [f"checked {self.checked} file(s) in: {', '.join(self.sources)}"]
        for f in self.findings:
            lines.append(f"  [{f.kind}] {f.path}: {f.reason}")
        problems = sum(f.kind not in NOT_BAD for f in self.findings)
        warnings = sum(f.kind == "warning" for f in self.findings)
        notes = sum(f.kind == "decoder" for f in self.findings)  # which decoder, not a problem
        ignored = len(self.findings) - problems - warnings - notes
        lines.append(
            f"{problems} problem(s), {warnings} warning(s), {ignored} ignored file(s)"
            if problems or warnings or ignored
            else "no problems found"
        )
        return "\n".join(lines)


def check_images(dataset: ImageDataset, progress: bool = True) -> CheckReport:
    """Check an indexed image split, strictly decoding every file whose structure is whole.

    Files the index refused (damaged structure, too many pixels, unknown label) are reported as
    it found them and never decoded.
    """

    report = CheckReport(sources=[dataset.source], checked=len(dataset))
    for sample_id, reason in dataset.problems.items():
        kind = "label" if reason.startswith("unknown label") else "image"
        report.findings.append(Finding(dataset.paths[sample_id], reason, kind))
    todo = [dataset.paths[i] for i in dataset.usable_ids]
    with ThreadPoolExecutor(max_workers=default_num_threads()) as pool:
        results = pool.map(lambda p: decode_problem(p, max_pixels=dataset.max_pixels), todo, chunksize=16)
        bar = progress_bar(results, total=len(todo), desc="decoding", unit="img", disable=not progress, leave=False)
        report.findings += [Finding(p, why, "image") for p, why in zip(todo, bar, strict=True) if why]
    report.findings += [
        Finding(p, "not a .jpg/.jpeg/.png file; the loader ignores it", "ignored") for p in dataset.ignored
    ]
    report.findings += [
        Finding(e.folder, f"{e.sentence()}: a class with no image cannot be trained", "class")
        for e in dataset.empty_classes
    ]
    return report


def _check_image_source(path: DataPath, progress: bool, max_pixels: int) -> CheckReport:
    if path.is_file():
        dataset = ImageDataset.from_list(path, progress=progress, max_pixels=max_pixels)
    else:
        dataset = ImageDataset.from_folder(path, progress=progress, max_pixels=max_pixels)
    return check_images(dataset, progress)


# Checkers for other kinds of data (videos) register here: (recognise(path) -> bool,
# check(path, progress, clip_span_frames=...)); the clip span matters to videos only.
CHECKERS: list[tuple] = []


def _holds_videos(path: DataPath) -> bool:
    # A folder of raw streams counts too: the video check then says what they are and what to do.
    return any(p.suffix.lower() in VIDEO_EXTENSIONS + RAW_STREAM_SUFFIXES for p in path.iterdir() if p.is_file())


def check_path(
    path: str | Path | ObjectPath,
    progress: bool = True,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    clip_span_frames: int | None = None,
) -> CheckReport:
    """Check whatever ``path`` holds.

    * an image file (``.jpg``, ``.jpeg``, ``.png``): that image alone;
    * any other file: an image list file;
    * a folder with ``*.txt`` list files beside split folders (``images/`` of ``gpufeed synth``):
      each list file;
    * a folder with ``images/``, ``videos/`` or ``dense/`` inside: each of those;
    * a folder a registered checker recognises (videos, frame stores, DeepEthogram projects, paired
      splits), or a file one does (one video file or frame store, an image of a format gpufeed
      does not read);
    * a folder whose sub-folders are all split folders (``train/``, ``val/`` ...): each of them,
      with a warning naming them (:mod:`gpufeed.pipelines._split_folders`);
    * a shard folder (``shards.json``): its images, each read from its byte range of the tar;
    * otherwise: class folders.

    ``path`` may be ``s3://bucket/prefix``: the same layouts, read from object storage.

    Args:
        max_pixels: Images whose header declares more pixels are bad (``data.max_image_pixels``).
        clip_span_frames: Videos with fewer frames are bad: training cannot cut one clip from them
            (``None``: the span of the default ``video.clip_length_frames`` and ``stride_frames``).

    Raises:
        DatasetError: The path does not exist or holds no data.
    """
    path = data_path(path)
    prime_listing(path)  # s3://: one listing answers the layout questions below
    if not path.exists():
        raise DatasetError(f"{path} does not exist")
    if path.is_file() and path.name.lower().endswith(IMAGE_EXTENSIONS):
        # One image (a user checking a file they suspect), not a list file to parse as text.
        why = decode_problem(path, max_pixels=max_pixels)
        return CheckReport(sources=[str(path)], checked=1, findings=[Finding(str(path), why, "image")] if why else [])
    for recognise, check in CHECKERS:
        if path.is_file() and recognise(path):  # a file a checker reads whole (an HDF5 video), not a list file
            return check(path, progress, clip_span_frames=clip_span_frames)
    if path.is_file():
        return _check_image_source(path, progress, max_pixels)
    parts = [path / name for name in ("images", "videos", "dense") if (path / name).is_dir()]
    if parts:
        report = CheckReport()
        for part in parts:
            report.merge(check_path(part, progress, max_pixels, clip_span_frames))
        return report
    for recognise, check in CHECKERS:
        if recognise(path):
            return check(path, progress, clip_span_frames=clip_span_frames)
    splits = split_folders(path)  # DATA/train/, DATA/val/: each split alone, and a warning
    if splits:
        report = CheckReport(findings=[Finding(str(path), split_warning(path, splits), "warning")])
        for split in splits:
            report.merge(check_path(split, progress, max_pixels, clip_span_frames))
        return report
    if _holds_videos(path):
        return CheckReport(sources=[f"{path} (videos: no video checker is installed)"])
    lists = sorted(p for p in path.glob("*.txt") if p.name != "classes.txt")
    if lists and all((path / p.stem).is_dir() for p in lists):
        report = CheckReport()
        for list_file in lists:
            report.merge(_check_image_source(list_file, progress, max_pixels))
        return report
    if not listdir(path):
        raise DatasetError(f"{path} is an empty folder: nothing to check")
    return _check_image_source(path, progress, max_pixels)
