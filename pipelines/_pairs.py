"""Paired datasets for dense targets: an RGB image plus its depth map and/or segmentation mask.

**Split folders.** A split root holding ``rgb/`` with ``depth/`` and/or ``mask/`` beside it is a
paired dataset: ``rgb/a/x.jpg`` pairs with ``depth/a/x.png`` and ``mask/a/x.png`` (the same
relative path, any image extension). **List files** hold ``rgb_path map_path [map_path ...]``
per line (paths relative to the list file, no spaces; ``#`` starts a comment line); each map
column's kind is ``map_kinds`` when given, else the folder named ``depth`` or ``mask`` in its path.
Every path a list names must resolve inside the list file's folder or a folder of
``data.allowed_roots`` (no absolute path, ``..`` or symbolic link out:
:mod:`gpufeed.pipelines._containment`); a line that breaks the rule stops the list, naming it.

**Map kinds.** ``depth``: a single-channel (grayscale) PNG of 8 or 16 bits, its values kept
exactly (a 16-bit map stays uint16; every depth map of a split has the same bit depth).
``mask``: a single-channel 8-bit PNG of class ids. A map's size must equal its RGB's decoded
size (EXIF orientation applied to the RGB only: a PNG map is never re-oriented) unless
``scale_maps`` is set, in which case the loader scales the map to the RGB's size. A map is
refused by its header when it declares more pixels than ``max_pixels`` (``data.max_image_pixels``),
as an RGB is: a scaled map is decoded whole, so a small RGB does not bound it.

Every problem names the RGB file and the map file: a missing partner, a size mismatch, a map that
is not a single-channel PNG of an allowed bit depth, an unreadable or damaged file. A problem
leaves that one sample out (or stops the loader, per ``loader.on_bad_sample``); maps with no RGB
partner are listed in :attr:`PairedDataset.orphans` (``gpufeed check`` reports them).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpufeed.core import (
    DataPath,
    ObjectPath,
    data_path,
    is_object_url,
    is_outage,
    join,
    open_binary,
    prime_listing,
    quoted,
    walk,
)
from gpufeed.pipelines._cache import usable_ids
from gpufeed.pipelines._containment import Roots
from gpufeed.pipelines._dataset import IMAGE_EXTENSIONS, index_image_facts
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._list_text import read_list_text

__all__ = ["MAP_BITS", "MAP_KINDS", "PairedDataset", "infer_task", "is_paired_root", "png_layout"]

MAP_KINDS = ("depth", "mask")
# Bit depths each map kind may have (single-channel PNG).
MAP_BITS = {"depth": (8, 16), "mask": (8,)}
_TASKS = {"depth": "depth", "mask": "segmentation"}
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COLOUR_TYPES = {0: "grayscale", 2: "RGB", 3: "palette", 4: "grayscale+alpha", 6: "RGBA"}


def is_paired_root(root: str | Path | ObjectPath) -> bool:
    """True when ``root`` holds ``rgb/`` and at least one of ``depth/``, ``mask/`` (``root`` may be ``s3://``)."""
    root = data_path(root)
    return (root / "rgb").is_dir() and any((root / kind).is_dir() for kind in MAP_KINDS)


def infer_task(kinds: tuple[str, ...]) -> str:
    """The dense task a set of map kinds implies: ``depth`` when depth maps are present, else ``segmentation``."""
    for kind in MAP_KINDS:
        if kind in kinds:
            return _TASKS[kind]
    raise DatasetError(f"no target maps: expected at least one of {list(MAP_KINDS)}, got {list(kinds)}")


def png_layout(path: str) -> tuple[int, int, int, int] | None:
    """``(width, height, bit_depth, colour_type)`` from a PNG's header, ``None`` when it is not a PNG."""
    with open_binary(path) as fh:  # s3://: one ranged read of the header
        head = fh.read(29)
    if len(head) < 29 or not head.startswith(_PNG_SIGNATURE) or head[12:16] != b"IHDR":
        return None
    width, height, bits, colour = struct.unpack(">IIBB", head[16:26])
    return width, height, bits, colour


def _map_problem(
    kind: str, rgb: str, path: str, rgb_size, facts, scale_maps: bool, max_pixels: int
) -> tuple[str | None, int]:
    """(why the map cannot be used, naming both files; its bit depth)."""
    refused = facts.refusal(max_pixels, "data.max_image_pixels")  # a map bomb, before any decode
    if refused:
        return f"{kind} map {path} (of {rgb}): {refused[1]}", 0
    try:
        layout = png_layout(path)
    except OSError as err:
        if is_outage(err):  # the store or the machine, not the map: never recorded as a bad file
            raise
        return f"{kind} map {path} (of {rgb}): unreadable: {err.strerror or err}", 0
    if layout is None:
        return f"{kind} map {path} (of {rgb}) is a {facts.format or 'non-image'} file; maps must be PNG", 0
    width, height, bits, colour = layout
    if colour != 0 or bits not in MAP_BITS[kind]:
        allowed = " or ".join(f"{b}-bit" for b in MAP_BITS[kind])
        what = _PNG_COLOUR_TYPES.get(colour, f"colour type {colour}")
        return (
            f"{kind} map {path} (of {rgb}) is a {bits}-bit {what} PNG; a {kind} map must be a single-channel "
            f"(grayscale) {allowed} PNG",
            0,
        )
    if (width, height) != tuple(int(v) for v in rgb_size) and not scale_maps:
        return (
            f"size mismatch: {kind} map {path} is {width}x{height} but its RGB {rgb} is {rgb_size[0]}x{rgb_size[1]} "
            "(EXIF orientation applied); set data.scale_maps: true to scale maps to their RGB's size",
            0,
        )
    return None, bits


@dataclass(frozen=True)
class PairedDataset:
    """An indexed split of RGB images and their target maps.

    Attributes:
        paths: RGB file paths; a sample id is a position in this tuple.
        maps: Map kind -> the map path of every sample (``""`` where it is missing).
        sizes: (N, 2) int64 decoded (width, height) of each RGB (EXIF orientation applied).
        map_sizes: Map kind -> (N, 2) int64 (width, height) of each map as stored.
        map_bits: Map kind -> the bit depth of that kind's maps (8 or 16).
        problems: Sample id -> why the pair cannot be used (naming both files).
        orphans: Maps that have no RGB partner, each as a sentence naming the file.
        source: The folder or list file the dataset came from.
        max_pixels: The pixel limit the index applied (``data.max_image_pixels``).
        scale_maps: Maps whose size differs from their RGB's are scaled, not refused.
    """

    paths: tuple[str, ...]
    maps: dict[str, tuple[str, ...]]
    sizes: np.ndarray
    map_sizes: dict[str, np.ndarray]
    map_bits: dict[str, int]
    problems: dict[int, str] = field(default_factory=dict)
    orphans: tuple[str, ...] = ()
    source: str = ""
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    scale_maps: bool = False

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The map kinds of this split, in :data:`MAP_KINDS` order."""
        return tuple(kind for kind in MAP_KINDS if kind in self.maps)

    @property
    def task(self) -> str:
        """``depth`` or ``segmentation``, inferred from the maps present (see :func:`infer_task`)."""
        return infer_task(self.kinds)

    @property
    def usable_ids(self) -> np.ndarray:
        """Sample ids whose RGB and maps can all be used."""
        return usable_ids(len(self.paths), self.problems)

    @classmethod
    def from_root(
        cls, root: str | Path | ObjectPath, *, scale_maps: bool = False, max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    ) -> PairedDataset:
        """Index ``root/rgb/...`` with ``root/depth/...`` and/or ``root/mask/...`` (hidden files skipped)."""
        root = data_path(root)
        prime_listing(root)  # s3://: one listing answers the folder questions below
        if not is_paired_root(root):
            raise DatasetError(
                f"{root} is not a paired dataset: expected a folder 'rgb' and at least one of {list(MAP_KINDS)} in it"
            )
        rgb = _walk_images(root / "rgb")
        if not rgb:
            raise DatasetError(f"dataset is empty: no .jpg, .jpeg or .png files in {root / 'rgb'}")
        paths = [str(root / "rgb" / rel) for rel in rgb.values()]
        maps: dict[str, list[str]]
        problems: dict[int, str]
        orphans: list[str]
        maps, problems, orphans = {}, {}, []
        for kind in MAP_KINDS:
            if not (root / kind).is_dir():
                continue
            found = _walk_images(root / kind)
            column = []
            for i, stem in enumerate(rgb):
                hit = found.get(stem)
                if hit is None:
                    want = root / kind / (stem + ".png")
                    problems.setdefault(i, f"missing partner: no {kind} map for {paths[i]} (expected {want})")
                    column.append("")
                else:
                    column.append(str(root / kind / hit))
            orphans += [
                f"{root / kind / rel}: {kind} map with no RGB partner in {root / 'rgb'}"
                for stem, rel in found.items()
                if stem not in rgb
            ]
            maps[kind] = column
        return cls._finish(root, f"paired folders under {root}", paths, maps, problems, orphans, scale_maps, max_pixels)

    @classmethod
    def from_list(
        cls,
        list_file: str | Path | ObjectPath,
        *,
        map_kinds: tuple[str, ...] | None = None,
        scale_maps: bool = False,
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
        allowed_roots: tuple[str | Path | ObjectPath, ...] = (),
    ) -> PairedDataset:
        """Index a list file of ``rgb_path map_path [map_path ...]`` lines (see the module docs).

        ``allowed_roots``: folders outside the list file's folder its lines may name (``data.allowed_roots``).
        """
        list_file = data_path(list_file)
        try:
            lines = read_list_text(list_file).splitlines()  # a Windows editor's byte-order mark dropped
        except (OSError, UnicodeDecodeError) as err:
            raise DatasetError(f"cannot read list file {list_file}: {err}") from None
        base = list_file.parent
        roots = Roots.of(base, "the list file's folder", allowed_roots)
        kinds, rows = map_kinds, []
        for number, line in enumerate(lines, start=1):
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            outside = next((why for why in (roots.problem(w, base) for w in words) if why), None)
            if outside:
                raise DatasetError(f"{list_file}:{number}: names {outside}")
            full = [w if os.path.isabs(w) or is_object_url(w) else str(base / w) for w in words]
            if len(full) < 2:
                raise DatasetError(
                    f"{list_file}:{number}: expected 'rgb_path map_path [map_path ...]', got {quoted(line)}"
                )
            line_kinds = (
                tuple(map_kinds) if map_kinds else tuple(_kind_from_path(p, list_file, number) for p in full[1:])
            )
            if kinds is None:
                kinds = line_kinds
            if len(full) - 1 != len(kinds) or line_kinds != tuple(kinds):
                raise DatasetError(
                    f"{list_file}:{number}: this line's maps are {list(line_kinds)} ({len(full) - 1} paths); "
                    f"earlier lines (or data.map_kinds) have {list(kinds)}"
                )
            rows.append(full)
        if not rows:
            raise DatasetError(f"dataset is empty: no entries in list file {list_file}")
        assert kinds is not None, "the first row sets the kinds"
        bad = sorted(set(kinds) - set(MAP_KINDS))
        if bad or len(set(kinds)) != len(kinds):
            raise DatasetError(f"{list_file}: map kinds {list(kinds)}: each must be one of {list(MAP_KINDS)}, once")
        maps = {kind: [row[1 + c] for row in rows] for c, kind in enumerate(kinds)}
        source = f"paired list file {list_file}"
        return cls._finish(base, source, [row[0] for row in rows], maps, {}, [], scale_maps, max_pixels, list_file.stem)

    @classmethod
    def _finish(cls, base, source, paths, maps, problems, orphans, scale_maps, max_pixels, stem="pairs"):
        everything = list(paths) + [p for column in maps.values() for p in column if p]
        facts = dict(zip(everything, index_image_facts(data_path(base), f"{stem}-pairs", everything), strict=True))
        sizes = np.zeros((len(paths), 2), dtype=np.int64)
        for i, path in enumerate(paths):
            refused = facts[path].refusal(max_pixels, "data.max_image_pixels")
            if refused:
                problems.setdefault(i, f"RGB {path}: {refused[1]}")
            else:
                sizes[i] = (facts[path].width, facts[path].height)
        map_sizes, map_bits = {}, {}
        for kind, column in maps.items():
            kind_sizes = np.zeros((len(paths), 2), dtype=np.int64)
            bits_seen: dict[int, str] = {}
            for i, path in enumerate(column):
                if not path or i in problems:
                    continue
                why, bits = _map_problem(kind, paths[i], path, sizes[i], facts[path], scale_maps, max_pixels)
                if why is None and bits_seen and bits not in bits_seen:
                    ((other_bits, other),) = bits_seen.items()
                    why = (
                        f"{kind} map {path} (of {paths[i]}) is {bits}-bit but {other} is {other_bits}-bit; "
                        f"every {kind} map of a split must have the same bit depth"
                    )
                if why:
                    problems[i] = why
                    continue
                bits_seen.setdefault(bits, path)
                kind_sizes[i] = (facts[path].stored_width, facts[path].stored_height)
            map_sizes[kind] = kind_sizes
            map_bits[kind] = next(iter(bits_seen), 8)
        return cls(
            paths=tuple(paths),
            maps={kind: tuple(column) for kind, column in maps.items()},
            sizes=sizes,
            map_sizes=map_sizes,
            map_bits=map_bits,
            problems=dict(sorted(problems.items())),
            orphans=tuple(orphans),
            source=source,
            max_pixels=max_pixels,
            scale_maps=scale_maps,
        )


def _walk_images(folder: DataPath) -> dict[str, str]:
    """Relative path without extension -> relative path, for every image under ``folder`` (sorted)."""
    found: dict[str, str] = {}
    for dirpath, dirnames, filenames in walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or not name.lower().endswith(IMAGE_EXTENSIONS):
                continue
            full = join(dirpath, name)
            rel = (
                str(ObjectPath(full).relative_to(folder))
                if isinstance(folder, ObjectPath)
                else os.path.relpath(full, folder)
            )
            stem = os.path.splitext(rel)[0]
            if stem in found:
                raise DatasetError(
                    f"two files in {folder} pair with the same name: {folder / found[stem]} and {folder / rel}; "
                    "keep one of them"
                )
            found[stem] = rel
    return found


def _kind_from_path(path: str, list_file: DataPath, number: int) -> str:
    for part in reversed(data_path(path).parts[:-1]):
        if part in MAP_KINDS:
            return part
    raise DatasetError(
        f"{list_file}:{number}: cannot tell the kind of map {path}: no folder named one of {list(MAP_KINDS)} in its "
        "path; set data.map_kinds (e.g. [depth, mask]) to name the columns"
    )
