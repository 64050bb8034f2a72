"""Sets of files to replay loads over: an installed environment, or the wheels of a resolution.

Both answer the same three questions: which files exist and which distribution holds each, what a
shared library's dynamic section says (:func:`gpufeed.stack._elf.read_elf`), and what a small text
file holds. Paths are relative to site-packages, ``/``-separated.
"""

from __future__ import annotations

import csv
import importlib.metadata
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path, PurePosixPath

from gpufeed.stack._elf import ElfInfo, Symbol, read_elf
from gpufeed.stack._wheels import RemoteWheel, wheel_path

__all__ = ["FileSet", "InstalledSet", "RemoteSet", "elf_from_json", "elf_to_json"]

_SHARED_OBJECT = re.compile(r"\.so(\.\d+)*$")


def elf_to_json(info: ElfInfo) -> dict:
    """An :class:`ElfInfo` as JSON-able data (the cache's format)."""
    data = asdict(info)
    data["defined"] = sorted(info.defined)
    data["defined_versions"] = sorted(list(v) for v in info.defined_versions)
    data["undefined"] = [list(asdict(s).values()) for s in info.undefined]
    return data


def elf_from_json(data: dict) -> ElfInfo:
    """The inverse of :func:`elf_to_json`."""
    return ElfInfo(
        machine=data["machine"],
        bits=data["bits"],
        soname=data["soname"],
        needed=tuple(data["needed"]),
        runpath=tuple(data["runpath"]),
        rpath=tuple(data["rpath"]),
        defined=frozenset(data["defined"]),
        defined_versions=frozenset(tuple(v) for v in data["defined_versions"]),
        undefined=tuple(Symbol(*s) for s in data["undefined"]),
    )


class FileSet:
    """The files of a set of distributions (the base class: answers from ``files`` and two readers)."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}  # path -> distribution name
        self.versions: dict[str, str] = {}  # distribution name -> version
        self.collisions: list[str] = []  # shared libraries two distributions both install
        self._elf: dict[str, ElfInfo] = {}

    def _add(self, distribution: str, paths: Iterable[str]) -> None:
        for path in paths:
            other = self.files.get(path)
            if other is not None and other != distribution and _SHARED_OBJECT.search(path):
                self.collisions.append(f"{path} is installed by both {other} and {distribution}")
            self.files.setdefault(path, distribution)

    def elf(self, path: str) -> ElfInfo:
        """What the dynamic linker reads from ``path`` (cached per set)."""
        if path not in self._elf:
            self._elf[path] = self._read_elf(path)
        return self._elf[path]

    def _read_elf(self, path: str) -> ElfInfo:
        raise NotImplementedError

    def text(self, path: str) -> str:
        """A small text file of the set."""
        raise NotImplementedError


class InstalledSet(FileSet):
    """The distributions installed in site-packages folders, read from their RECORD files.

    With several folders (Python's import path: a ``PYTHONPATH`` or ``pip install --target`` folder
    before the venv's own), a distribution, or a file, in an earlier folder shadows one of the same
    name in a later folder, as it does at import; :attr:`shadowed` names what was passed over.

    Args:
        site_packages: The folder (a venv's ``lib/pythonX.Y/site-packages``), or the folders in
            import order.
    """

    def __init__(self, site_packages: Path | Sequence[Path]):
        super().__init__()
        roots = [Path(site_packages)] if isinstance(site_packages, (str, Path)) else [Path(p) for p in site_packages]
        self.root = roots[0]
        self.shadowed: list[str] = []  # "name version (folder)" passed over for an earlier folder's
        self.location: dict[str, Path] = {}  # distribution name -> its folder
        self._root_of: dict[str, Path] = {}
        for root in roots:
            for dist in importlib.metadata.distributions(path=[str(root)]):
                metadata = dist.metadata  # parsed once: dist.version parses the file again
                name, version = metadata["Name"], metadata["Version"]
                if name in self.versions:
                    self.shadowed.append(f"{name} {version} ({root})")
                    continue
                paths = _listed_paths(dist)
                packages = sorted((p for p in paths if p.endswith("/__init__.py")), key=len)
                if packages and self._root_of.get(packages[0], root) != root:
                    # Its package is imported from an earlier folder (onnxruntime there, onnxruntime-gpu here).
                    self.shadowed.append(f"{name} {version} ({root})")
                    continue
                self.versions[name] = version
                self.location[name] = root
                paths = [p for p in paths if self._root_of.setdefault(p, root) == root]
                self._add(name, paths)

    def _read_elf(self, path: str) -> ElfInfo:
        with open(self._root_of.get(path, self.root) / path, "rb") as f:
            return read_elf(f)

    def text(self, path: str) -> str:
        return (self._root_of.get(path, self.root) / path).read_text(encoding="utf-8")


def _listed_paths(dist: importlib.metadata.Distribution) -> list[str]:
    """The files a distribution lists, ``/``-separated, those outside its folder (``..``) left out.

    The strings ``str(f)`` of ``dist.files`` gives, read from the RECORD text: ``dist.files`` builds a
    path object per file (half a second of CPU for a CUDA venv's 100k files, most of the set's cost).
    """
    text = dist.read_text("RECORD")
    if text:
        names = [_pure_posix(row[0]) for row in csv.reader(text.splitlines()) if row]
    else:  # no RECORD (egg-info): the general reader
        names = [str(f) for f in dist.files or ()]
    return [name.replace("\\", "/") for name in names if not name.startswith("..")]


def _pure_posix(name: str) -> str:
    """``str(PurePosixPath(name))``, without building the path where that is ``name`` itself."""
    if "//" in name or "/./" in name or name.startswith("./") or name.endswith(("/", "/.")) or name in ("", "."):
        return str(PurePosixPath(name))  # empty or "." parts: the path's rules drop them
    return name


def import_path_folders() -> list[Path]:
    """The folders Python imports from, in order, that exist (the current folder left out)."""
    seen: list[Path] = []
    for entry in sys.path:
        if entry and Path(entry).is_dir() and Path(entry) not in seen:
            seen.append(Path(entry))
    return seen


class RemoteSet(FileSet):
    """The files of wheels on an index, read with range requests (see :class:`RemoteWheel`).

    Args:
        wheels: (distribution name, version, wheel URL) of each wheel in the set.
        cache: The cache folder (file lists and ELF facts, as JSON; temporary members while read).
    """

    def __init__(self, wheels: Iterable[tuple[str, str, str]], cache: Path):
        super().__init__()
        self.cache = Path(cache)
        self._wheel_of: dict[str, tuple[RemoteWheel, str]] = {}
        self.downloaded_bytes = 0
        for name, version, url in wheels:
            self.versions[name] = version
            wheel = RemoteWheel(url, self.cache)
            paths = {}
            for member in wheel.members():
                path = wheel_path(member)
                if path is not None and not member.endswith("/"):
                    paths[path] = member
                    self._wheel_of.setdefault(path, (wheel, member))
            self._add(name, paths)

    def _read_elf(self, path: str) -> ElfInfo:
        wheel, member = self._wheel_of[path]
        key = f"elf-{member}"
        cached = wheel.cached_json(key)
        if cached is not None:
            return elf_from_json(cached)
        with wheel.open_member(member, self.cache / "tmp") as f:
            info = read_elf(f)
        self.downloaded_bytes += wheel.members()[member].compressed_bytes
        wheel.cache_json(key, elf_to_json(info))
        return info

    def text(self, path: str) -> str:
        wheel, member = self._wheel_of[path]
        cached = wheel.cached_json(f"text-{member}")
        if cached is None:
            cached = wheel.read(member).decode("utf-8")
            wheel.cache_json(f"text-{member}", cached)
        return cached
