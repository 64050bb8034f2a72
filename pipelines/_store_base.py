"""The frame store base: :class:`FrameStore`, what probing one learns, and the registry of kinds.

A storage kind is one :class:`FrameStore` subclass registered with :func:`register_store`; the kinds
gpufeed reads (frame folders, HDF5 files, clips in tar shards) and their registration are in
:mod:`gpufeed.pipelines._store_kinds`, which re-exports every name here. The index, the feeds, the
PyAV decoder, ``check`` and ``prepare`` ask :func:`frame_store` for a kind, never compare its name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from gpufeed.core import DataPath, ObjectPath, data_path
from gpufeed.pipelines._containment import Roots
from gpufeed.pipelines._image_facts import read_image_facts

__all__ = [
    "FrameStore",
    "StoreFacts",
    "StoreReader",
    "frame_store",
    "register_store",
    "store_extensions",
    "store_kind",
    "store_kinds",
]


@dataclass(frozen=True)
class StoreFacts:
    """What probing a frame store learns (see :func:`probe_store`).

    Attributes:
        kind: The store's :attr:`FrameStore.kind` (``"folder"``, ``"hdf5"``).
        codec: ``"png"`` or ``"jpeg"``: the format of frame 0.
        width, height: Frame 0's size in pixels.
        num_frames: Frames in the store.
        frame_name: Folders: a ``str.format`` pattern of frame file names (``"{:09d}.png"``).
        problem: Why the store cannot be used, naming the frame; ``None`` when fine.
    """

    kind: str
    codec: str = ""
    width: int = 0
    height: int = 0
    num_frames: int = 0
    frame_name: str = ""
    problem: str | None = None


class StoreReader(Protocol):
    """Reads encoded frames of one kind's stores by index, keeping what it opened until ``close()``."""

    def read(self, path: str, frame_name: str, frames) -> list[np.ndarray]: ...
    def close(self) -> None: ...


class FrameStore:
    """One storage kind of frame stores: how to find, probe, read, name, write and contain one.

    Instances hold no state (they pickle by class, so worker processes get them); their readers
    do (:meth:`open_reader`, one per process).

    Attributes:
        kind: The name the index records (``VideoInfo.store``) and ``gpufeed prepare --store`` takes.
        described: How messages name stores of this kind, plural (``"frame folders"``).
        extensions: File suffixes of stores of this kind (lower case; empty for folders): the video
            listing takes such files as videos.
        channels_reversed: The stored images hold their channels in reverse order (BGR).
        per_video: A store holds one whole video, which ``gpufeed prepare --store`` writes
            (:meth:`write`); False for a kind written otherwise (shards).
    """

    kind: ClassVar[str] = ""
    described: ClassVar[str] = ""
    extensions: ClassVar[tuple[str, ...]] = ()
    channels_reversed: ClassVar[bool] = False
    per_video: ClassVar[bool] = True

    def holds(self, path: DataPath) -> bool:
        """Whether ``path``, as named, is a store of this kind (its contents are judged by :meth:`probe`)."""
        return path.suffix.lower() in self.extensions

    def probe(self, path: DataPath) -> StoreFacts:
        """Frame count, frame 0's format and size; problems described, not raised."""
        raise NotImplementedError

    def open_reader(self, max_open: int) -> StoreReader:
        """A reader of this kind's frames, keeping up to ``max_open`` files open (one reader per process)."""
        raise NotImplementedError

    def frame_label(self, frame_name: str, index: int) -> str:
        """How messages name frame ``index`` of a store (``frame 7``, or its file name)."""
        return f"frame {int(index)}"

    def label_path(self, path: DataPath) -> DataPath:
        """The store's label CSV: ``<name>.csv`` beside it."""
        return path.with_suffix(".csv")

    def link_problem(self, path: DataPath, roots: Roots) -> str | None:
        """Why the store reaches outside ``roots`` (a link out), or ``None``."""
        return None

    def output_path(self, relative: Path) -> Path:
        """Where ``gpufeed prepare --store`` writes the store of the video at ``relative``."""
        return relative.with_suffix(self.extensions[0] if self.extensions else "")

    def write(self, dst: Path, encoded: Iterable[bytes], ext: str) -> int:
        """Write images (suffix ``ext``, channels in the store's order) as a new store at ``dst``; return the count."""
        raise NotImplementedError


def _facts_of_first(kind: str, data_or_path, count: int, frame_name: str, what: str) -> StoreFacts:
    facts = read_image_facts(data_or_path)
    if facts.problem or facts.format not in ("PNG", "JPEG"):
        why = facts.problem or f"a {facts.format} image; frames must be PNG or JPEG"
        return StoreFacts(kind, num_frames=count, frame_name=frame_name, problem=f"{what} is not usable: {why}")
    return StoreFacts(kind, facts.format.lower(), facts.width, facts.height, count, frame_name)


_STORES: dict[str, FrameStore] = {}


def register_store(store: FrameStore) -> FrameStore:
    """Make a storage kind known to the index, the loaders, ``check`` and ``prepare``; returns ``store``.

    Raises:
        ValueError: ``store.kind`` is empty or already registered.
    """
    if not store.kind or store.kind in _STORES:
        raise ValueError(f"frame store kind {store.kind!r} is empty or registered already ({', '.join(_STORES)})")
    _STORES[store.kind] = store
    return store


def frame_store(kind: str) -> FrameStore:
    """The registered :class:`FrameStore` of ``kind``.

    Raises:
        ValueError: No such kind is registered (the message names the known ones).
    """
    try:
        return _STORES[kind]
    except KeyError:
        raise ValueError(f"frame store kind {kind!r} is not known; known: {', '.join(_STORES)}") from None


def store_kinds() -> tuple[str, ...]:
    """The registered kinds, in registration order."""
    return tuple(_STORES)


def store_extensions() -> tuple[str, ...]:
    """File suffixes of every registered kind (stores that are files)."""
    return tuple(ext for store in _STORES.values() for ext in store.extensions)


def store_kind(path: str | Path | ObjectPath) -> str:
    """The kind of the frame store at ``path`` (``"folder"``, ``"hdf5"`` ...), or ``""`` (an encoded video file, or nothing gpufeed reads).

    Kinds with file suffixes are asked first: a suffix names its kind before a folder is taken for
    a frame folder.
    """
    path = data_path(path)
    ordered = sorted(_STORES.values(), key=lambda store: not store.extensions)  # stable: registration order kept
    return next((store.kind for store in ordered if store.holds(path)), "")
