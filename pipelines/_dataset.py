"""The image dataset index: which files, which labels, and each file's facts.

Opening a dataset lists the files (class folders or a list file), then reads every image's facts
with :func:`~gpufeed.pipelines.read_image_facts`: format, stored size, EXIF orientation and the
oriented size DALI decodes to, and whether its structure is whole (JPEG markers walked through the
scans to the end-of-image marker, PNG chunks and CRCs to ``IEND``; bytes after the end marker are
fine). Truncated and damaged files and pixel bombs (``max_pixels``, the config key
``data.max_image_pixels``) are caught before any decoding. The facts are cached beside the data
(``.gpufeed/``) keyed by each file's size and modification time, and refreshed when files change;
the pixel limit is applied to the cached facts, so changing it needs no re-indexing. Sample ids
are positions in this index: class folders sorted by name, files sorted within each.

**List files** hold one ``path label`` per line: the label is the last whitespace-separated
word, the path everything before it (spaces and ``#`` included). A line whose first non-blank
character is ``#`` is a comment; blank lines are skipped. There are no comments after an entry,
since ``#`` is an ordinary character of file names. List files and ``classes.txt`` are UTF-8, a
leading byte-order mark dropped (:mod:`gpufeed.pipelines._list_text`).

**Class folders** contribute their ``.jpg``/``.jpeg``/``.png`` files; other files are ``ignored``
and a class left with no image is recorded in ``empty_classes``
(:mod:`gpufeed.pipelines._class_folders`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from gpufeed.core import DataPath, ObjectPath, data_path, is_object_url, join, progress_bar, quoted, stat_key, walk
from gpufeed.pipelines._cache import index_cache_path, read_json_cache, usable_ids, write_json_atomic
from gpufeed.pipelines._class_folders import IMAGE_EXTENSIONS, EmptyClass, walk_class_folders
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS, ImageFacts, image_format, read_image_facts
from gpufeed.pipelines._list_text import read_list_text
from gpufeed.pipelines._shards import is_shard_dir, read_manifest

__all__ = ["IMAGE_EXTENSIONS", "ImageDataset", "parse_list_line"]

_INDEX_VERSION = 2
MAX_PIXELS_KEY = "data.max_image_pixels"


def parse_list_line(line: str) -> tuple[str, str] | None:
    """``(path, label)`` of one list-file line, ``None`` for a blank or comment line (see the module docs).

    Raises:
        ValueError: The line has a path but no label, or a label but no path.
    """
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    parts = text.rsplit(maxsplit=1)
    if len(parts) != 2:
        raise ValueError("expected 'path label'")
    return parts[0], parts[1]


@dataclass(frozen=True)
class ImageDataset:
    """An indexed image split.

    Attributes:
        paths: Absolute file paths; a sample id is a position in this tuple.
        labels: int64 class index per sample (-1 where the label is unknown).
        sizes: (N, 2) int array of each image's decoded (width, height): the EXIF orientation
            applied, as DALI decodes it and as crop windows are computed (0 for unusable files).
        classes: Class names in label order.
        problems: Sample id -> why that file cannot be used (bad file, too many pixels, unknown label).
        ignored: Files in the dataset's folders that are not images (by extension).
        source: The folder or list file the dataset came from.
        orientations: (N,) uint8 EXIF orientation of each file (1: none).
        max_pixels: The pixel limit the index applied (``data.max_image_pixels``).
        empty_classes: Classes with no image in their class folder, or no folder (class folders only;
            :mod:`gpufeed.pipelines._class_folders`): a training loader refuses them.
    """

    paths: tuple[str, ...]
    labels: np.ndarray
    sizes: np.ndarray
    classes: tuple[str, ...]
    problems: dict[int, str] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    source: str = ""
    orientations: np.ndarray | None = None
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    empty_classes: tuple[EmptyClass, ...] = ()

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def usable_ids(self) -> np.ndarray:
        """Sample ids of the files that can be decoded and have a known label."""
        return usable_ids(len(self.paths), self.problems)

    @classmethod
    def from_folder(
        cls,
        root: str | Path | ObjectPath,
        classes: tuple[str, ...] | None = None,
        progress: bool = False,
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ):
        """Index ``root/<class>/<image>`` (hidden files and folders are skipped); ``root`` may be ``s3://bucket/prefix``.

        A shard folder (``shards.json``, written by ``gpufeed prepare --shards``) is read as its
        manifest says (:meth:`from_shards`).
        """
        root = data_path(root)
        if is_shard_dir(root):
            return cls.from_shards(root, classes, max_pixels)
        if not root.is_dir():
            if root.is_file():  # a 'path label' list given where the class folders go
                raise DatasetError(
                    f"dataset folder {root} is a file: a file of 'path label' lines goes in list_file "
                    "(data.train.list_file), a folder of class folders in root"
                )
            raise DatasetError(f"dataset folder {root} does not exist or is not a folder")
        _top, subfolders, top_files = next(walk(root))
        folders = sorted(name for name in subfolders if not name.startswith("."))
        stray = sorted(join(root, name) for name in top_files if not name.startswith("."))
        names = tuple(classes) if classes else tuple(folders)
        found = walk_class_folders(root, folders, names)
        source = f"class folders under {root}"
        loose = [path for path in stray if str(path).lower().endswith(IMAGE_EXTENSIONS)]
        if not found.paths and loose:  # a folder of photos, as a phone or camera leaves them
            raise DatasetError(
                f"dataset is empty: no .jpg, .jpeg or .png files in {source}, but {len(loose)} lie in {root} "
                f"itself: the folder's sub-folders are the classes, so put each class's images in "
                f"{join(root, '<class>')}"
            )
        dataset = cls._finish(
            root, source, found.paths, found.labels, names, found.problems, stray + found.ignored, progress, max_pixels
        )
        return replace(dataset, empty_classes=tuple(found.empty)) if found.empty else dataset

    @classmethod
    def from_shards(
        cls,
        root: str | Path | ObjectPath,
        classes: tuple[str, ...] | None = None,
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> ImageDataset:
        """Index a shard folder of images (:mod:`gpufeed.pipelines._shards`): its manifest's rows, in order.

        Paths are the members' byte ranges (``shard-000000.tar#<offset>:<size>:<key>.jpg``); sizes,
        orientations and labels come from the manifest, nothing is read from the tars. With
        ``classes``, labels are mapped by class name (a class the shards hold but ``classes`` does not
        name is a problem of its samples).
        """
        manifest = read_manifest(root, "images")
        names = tuple(classes) if classes else manifest.names
        problems: dict[int, str] = {}
        paths, labels, sizes, orientations = [], [], [], []
        for i, row in enumerate(manifest.rows):
            paths.append(manifest.ref(i))
            name = manifest.names[row["label"]] if 0 <= row["label"] < len(manifest.names) else str(row["label"])
            label = names.index(name) if name in names else -1
            if label < 0:
                problems[i] = f"unknown label: class {quoted(name)} is not one of the classes {list(names)}"
            width, height = int(row["width"]), int(row["height"])
            if width * height > max_pixels:
                problems[i] = (
                    f"too many pixels: {width}x{height} is more than {MAX_PIXELS_KEY} ({max_pixels:,}); refused"
                )
                width = height = 0
            labels.append(label)
            sizes.append((width, height))
            orientations.append(int(row["orientation"]))
        return cls(
            paths=tuple(paths),
            labels=np.asarray(labels, dtype=np.int64),
            sizes=np.asarray(sizes, dtype=np.int64).reshape(-1, 2),
            classes=names,
            problems=problems,
            source=f"image shards in {manifest.root}",
            orientations=np.asarray(orientations, dtype=np.uint8),
            max_pixels=max_pixels,
        )

    @classmethod
    def from_list(
        cls,
        list_file: str | Path | ObjectPath,
        classes: tuple[str, ...] | None = None,
        progress: bool = False,
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ):
        """Index a list file of ``path label`` lines (grammar in the module docs); it may be ``s3://bucket/key``,
        its relative paths then keys beside it."""
        list_file = data_path(list_file)
        if list_file.suffix.lower() in IMAGE_EXTENSIONS:  # one photo given where the dataset goes
            raise DatasetError(_an_image(list_file, "list file", list_file.suffix.lower()))
        lines = _read_lines(list_file, "list file")
        base = list_file.parent
        if classes is None and (base / "classes.txt").is_file():
            classes = tuple(c.strip() for c in _read_lines(base / "classes.txt", "class list") if c.strip())
        paths: list[str]
        labels: list[int]
        problems: dict[int, str]
        paths, labels, problems = [], [], {}
        for number, line in enumerate(lines, start=1):
            try:
                entry = parse_list_line(line)
            except ValueError as err:
                raise DatasetError(f"{list_file}:{number}: {err}, got {quoted(line)}") from None
            if entry is None:
                continue
            rel, label_text = entry
            full = rel if os.path.isabs(rel) or is_object_url(rel) else str(base / rel)
            label, why = _parse_label(label_text, classes)
            if why:
                if " #" in line:
                    why += " (comments go on lines of their own: '#' after an entry is read as part of it)"
                problems[len(paths)] = f"unknown label {quoted(label_text)} ({list_file}:{number}): {why}"
            paths.append(full)
            labels.append(label)
        names = tuple(classes) if classes else tuple(str(i) for i in range(max(labels, default=-1) + 1))
        source = f"list file {list_file}"
        return cls._finish(base, source, paths, labels, names, problems, [], progress, max_pixels, list_file.stem)

    @classmethod
    def from_config(
        cls,
        dataset_cfg,
        classes: tuple[str, ...] | None = None,
        progress: bool = False,
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ):
        """Index the split a :class:`gpufeed.config.DatasetConfig` points at.

        Args:
            max_pixels: ``data.max_image_pixels``: files whose header declares more are problems.
        """
        if dataset_cfg.root is not None:
            return cls.from_folder(dataset_cfg.root, classes, progress, max_pixels)
        return cls.from_list(dataset_cfg.list_file, classes, progress, max_pixels)

    @classmethod
    def _finish(cls, base, source, paths, labels, classes, problems, ignored, progress, max_pixels, stem="images"):
        if not paths:
            raise DatasetError(f"dataset is empty: no .jpg, .jpeg or .png files in {source}")
        facts = index_image_facts(base, stem, paths, progress)
        sizes = np.zeros((len(paths), 2), dtype=np.int64)
        orientations = np.ones(len(paths), dtype=np.uint8)
        for i, fact in enumerate(facts):
            refused = fact.refusal(max_pixels, MAX_PIXELS_KEY)
            if refused:
                problems.setdefault(i, refused[1])
            else:
                sizes[i] = (fact.width, fact.height)
            orientations[i] = fact.orientation
        return cls(
            paths=tuple(paths),
            labels=np.asarray(labels, dtype=np.int64),
            sizes=sizes,
            classes=tuple(classes),
            problems=dict(sorted(problems.items())),
            ignored=tuple(ignored),
            source=source,
            orientations=orientations,
            max_pixels=max_pixels,
        )


def _read_lines(path: DataPath, what: str) -> list[str]:
    """The lines of a hand-written text file, a Windows editor's byte-order mark dropped."""
    try:
        return read_list_text(path).splitlines()
    except OSError as err:
        raise DatasetError(f"cannot read {what} {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        kind = image_format(bytes(err.object[:16]))
        # An image under another name: say so, not which byte is not text. BMP's magic is the letters
        # "BM", which a list's first path may begin with; it is left to the byte.
        if kind and kind != "BMP":
            raise DatasetError(_an_image(path, what, kind)) from None
        raise DatasetError(f"{what} {path} is not UTF-8 text (byte {err.start})") from None


def _an_image(path: DataPath, what: str, kind: str) -> str:
    """The one line for an image file given where a text file (a list file, ``classes.txt``) goes."""
    return (
        f"{what} {path} is a {kind} image, not a text file: a dataset is a folder of class folders "
        "(<root>/<class>/<image>) or a list file of 'path label' lines"
    )


def _parse_label(text: str, classes: tuple[str, ...] | None) -> tuple[int, str | None]:
    if classes and text in classes:
        return classes.index(text), None
    try:
        value = int(text)
    except ValueError:
        known = f"one of {list(classes)}" if classes else "an integer (no classes.txt names the classes)"
        return -1, f"expected {known}"
    if value < 0 or (classes and value >= len(classes)):
        return -1, f"label index {value} is out of range [0, {len(classes) if classes else 'inf'})"
    return value, None


def index_image_facts(base: DataPath, stem: str, paths: list[str], progress: bool = False) -> list[ImageFacts]:
    """:func:`read_image_facts` for every path, reusing the cache beside the data for unchanged files."""
    cache_path = index_cache_path(base, f"{stem}-index.json")
    cached = read_json_cache(cache_path) or {}
    entries = cached.get("entries", {}) if cached.get("version") == _INDEX_VERSION else {}
    stats: list[tuple[int, int] | None] = []
    results: dict[int, ImageFacts] = {}
    todo = []
    for i, path in enumerate(paths):
        try:
            stats.append(stat_key(path))
        except OSError:
            stats.append(None)
        hit = entries.get(path)
        if stats[-1] is None or hit is None or tuple(hit[:2]) != stats[-1]:
            todo.append(i)
        else:
            results[i] = ImageFacts.from_row(hit[2:])
    if todo:
        # Reading is I/O-bound (the structure walk runs at memory speed): threads overlap the reads.
        with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 2) * 2)) as pool:
            probed = pool.map(read_image_facts, (paths[i] for i in todo))
            bar = progress_bar(
                probed, total=len(todo), desc="indexing images", unit="file", disable=not progress, leave=False
            )
            for i, facts in zip(todo, bar, strict=True):
                results[i] = facts
        fresh = {
            p: [*s, *results[i].to_row()] for i, (p, s) in enumerate(zip(paths, stats, strict=True)) if s is not None
        }
        write_json_atomic(cache_path, {"version": _INDEX_VERSION, "entries": fresh})
    return [results[i] for i in range(len(paths))]
