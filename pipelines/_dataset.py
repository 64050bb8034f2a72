"""The image dataset index: which files, which labels, and each file's header facts.

Opening a dataset lists the files (class folders or a list file), then reads every image's header
(format, width, height) and checks its tail (a JPEG ends in an EOI marker, a PNG in an IEND
chunk), so truncated copies are caught before any decoding. The results are cached beside the data
(``.gpufeed/``) keyed by each file's size and modification time, and refreshed when files change.
Sample ids are positions in this index: class folders sorted by name, files sorted within each.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from gpufeed.pipelines._cache import index_cache_path, read_json_cache, write_json_atomic
from gpufeed.pipelines._errors import DatasetError

__all__ = ["IMAGE_EXTENSIONS", "ImageDataset", "probe_image_file"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
_INDEX_VERSION = 1
Image.MAX_IMAGE_PIXELS = None  # headers only here; pixel limits belong to the server


def _tail_problem(path: Path, fmt: str, size: int) -> str | None:
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 64))
        tail = fh.read()
    if fmt == "JPEG" and b"\xff\xd9" not in tail:
        return "truncated JPEG: no end-of-image marker (FFD9) at the end of the file"
    if fmt == "PNG" and b"IEND" not in tail[-12:]:
        return "truncated PNG: the file does not end with an IEND chunk"
    return None


def probe_image_file(path: str | Path) -> tuple[int, int, str, str | None]:
    """Read an image's header and tail without decoding its pixels.

    Returns:
        ``(width, height, format, problem)``: format is ``"JPEG"`` or ``"PNG"``; ``problem`` is
        ``None`` or why the file cannot be used (zero bytes, unreadable, not an image, unsupported
        format, truncated), in words that name what is wrong.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        return 0, 0, "", f"unreadable: {err.strerror or err}"
    if size == 0:
        return 0, 0, "", "zero-byte file"
    try:
        with Image.open(path) as img:
            fmt, (width, height) = img.format or "", img.size
    except UnidentifiedImageError:
        return 0, 0, "", "not an image: no JPEG or PNG header"
    except OSError as err:
        return 0, 0, "", f"unreadable: {err.strerror or err}"
    if fmt not in ("JPEG", "PNG"):
        return width, height, fmt, f"unsupported image format {fmt} (JPEG and PNG are supported)"
    if width <= 0 or height <= 0:
        return width, height, fmt, f"image header declares an empty size {width}x{height}"
    return width, height, fmt, _tail_problem(path, fmt, size)


@dataclass(frozen=True)
class ImageDataset:
    """An indexed image split.

    Attributes:
        paths: Absolute file paths; a sample id is a position in this tuple.
        labels: int64 class index per sample (-1 where the label is unknown).
        sizes: (N, 2) int array of (width, height) from the headers.
        classes: Class names in label order.
        problems: Sample id -> why that file cannot be used (bad file or unknown label).
        ignored: Files in the dataset's folders that are not images (by extension).
        source: The folder or list file the dataset came from.
    """

    paths: tuple[str, ...]
    labels: np.ndarray
    sizes: np.ndarray
    classes: tuple[str, ...]
    problems: dict[int, str] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    source: str = ""

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def usable_ids(self) -> np.ndarray:
        """Sample ids of the files that can be decoded and have a known label."""
        ok = np.ones(len(self.paths), dtype=bool)
        ok[list(self.problems)] = False
        return np.flatnonzero(ok)

    @classmethod
    def from_folder(cls, root: str | Path, classes: tuple[str, ...] | None = None, progress: bool = False):
        """Index ``root/<class>/<image>`` (hidden files and folders are skipped)."""
        root = Path(root)
        if not root.is_dir():
            raise DatasetError(f"dataset folder {root} does not exist or is not a folder")
        folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
        stray = sorted(str(p) for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
        names = tuple(classes) if classes else tuple(folders)
        paths, labels, problems, ignored = [], [], {}, list(stray)
        for folder in folders:
            label = names.index(folder) if folder in names else -1
            for dirpath, dirnames, filenames in os.walk(root / folder):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in sorted(filenames):
                    if name.startswith("."):
                        continue
                    full = os.path.join(dirpath, name)
                    if not name.lower().endswith(IMAGE_EXTENSIONS):
                        ignored.append(full)
                        continue
                    if label < 0:
                        problems[len(paths)] = (
                            f"unknown label: folder '{folder}' is not one of the classes {list(names)}"
                        )
                    paths.append(full)
                    labels.append(label)
        return cls._finish(root, f"class folders under {root}", paths, labels, names, problems, ignored, progress)

    @classmethod
    def from_list(cls, list_file: str | Path, classes: tuple[str, ...] | None = None, progress: bool = False):
        """Index a list file of ``path label`` lines (see :class:`gpufeed.config.DatasetConfig`)."""
        list_file = Path(list_file)
        try:
            lines = list_file.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise DatasetError(f"cannot read list file {list_file}: {err.strerror or err}") from None
        base = list_file.parent
        if classes is None and (base / "classes.txt").is_file():
            classes = tuple(
                c.strip() for c in (base / "classes.txt").read_text(encoding="utf-8").splitlines() if c.strip()
            )
        paths, labels, problems = [], [], {}
        for number, line in enumerate(lines, start=1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            parts = text.rsplit(maxsplit=1)
            if len(parts) != 2:
                raise DatasetError(f"{list_file}:{number}: expected 'path label', got {line!r}")
            rel, label_text = parts
            full = rel if os.path.isabs(rel) else str(base / rel)
            label, why = _parse_label(label_text, classes)
            if why:
                problems[len(paths)] = f"unknown label {label_text!r} ({list_file}:{number}): {why}"
            paths.append(full)
            labels.append(label)
        names = tuple(classes) if classes else tuple(str(i) for i in range(max(labels, default=-1) + 1))
        return cls._finish(base, f"list file {list_file}", paths, labels, names, problems, [], progress, list_file.stem)

    @classmethod
    def from_config(cls, dataset_cfg, classes: tuple[str, ...] | None = None, progress: bool = False):
        """Index the split a :class:`gpufeed.config.DatasetConfig` points at."""
        if dataset_cfg.root is not None:
            return cls.from_folder(dataset_cfg.root, classes, progress)
        return cls.from_list(dataset_cfg.list_file, classes, progress)

    @classmethod
    def _finish(cls, base, source, paths, labels, classes, problems, ignored, progress, stem="images"):
        if not paths:
            raise DatasetError(f"dataset is empty: no .jpg, .jpeg or .png files in {source}")
        sizes, header_problems = _index_headers(base, stem, paths, progress)
        for sample_id, why in header_problems.items():
            problems.setdefault(sample_id, why)
        return cls(
            paths=tuple(paths),
            labels=np.asarray(labels, dtype=np.int64),
            sizes=sizes,
            classes=tuple(classes),
            problems=dict(sorted(problems.items())),
            ignored=tuple(ignored),
            source=source,
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


def _index_headers(base: Path, stem: str, paths: list[str], progress: bool) -> tuple[np.ndarray, dict[int, str]]:
    cache_path = index_cache_path(base, f"{stem}-index.json")
    cached = read_json_cache(cache_path) or {}
    entries = cached.get("entries", {}) if cached.get("version") == _INDEX_VERSION else {}
    stats: list[tuple[int, int] | None] = []
    todo = []
    for i, path in enumerate(paths):
        try:
            st = os.stat(path)
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append(None)
        hit = entries.get(path)
        if stats[-1] is None or hit is None or tuple(hit[:2]) != stats[-1]:
            todo.append(i)
    pending = set(todo)
    results = {i: entries[paths[i]][2:] for i in range(len(paths)) if i not in pending}
    if todo:
        from tqdm import tqdm

        with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 2) * 2)) as pool:
            probed = pool.map(probe_image_file, (paths[i] for i in todo))
            bar = tqdm(probed, total=len(todo), desc="indexing images", unit="file", disable=not progress, leave=False)
            for i, res in zip(todo, bar, strict=True):
                results[i] = list(res)
        fresh = {p: [*s, *results[i]] for i, (p, s) in enumerate(zip(paths, stats, strict=True)) if s is not None}
        write_json_atomic(cache_path, {"version": _INDEX_VERSION, "entries": fresh})
    sizes = np.zeros((len(paths), 2), dtype=np.int64)
    problems = {}
    for i in range(len(paths)):
        width, height, _fmt, problem = results[i]
        sizes[i] = (width, height)
        if problem:
            problems[i] = problem
    return sizes, problems
