"""Reading a dataset wherever it is: local paths and ``s3://`` URLs through the same few calls.

The indexes, ``gpufeed check`` and the decoders that gpufeed feeds itself (PyAV, h5py, frame
folders, shards) read through these functions; each takes a path as text (``"/data/x.mp4"`` or
``"s3://bucket/data/x.mp4"``), a :class:`~pathlib.Path` or an :class:`~gpufeed.core._object_path.ObjectPath`:

* :func:`walk` is :func:`os.walk` (a bucket listed once, its keys grouped into "folders" by ``/``);
* :func:`stat_key` is ``(size, version)``: a file's modification time, an object's;
* :func:`open_binary` is ``open(path, "rb")``: an object opens as a
  :class:`~gpufeed.core._ranged.RangedFile`, read by ranges;
* :func:`media_source` is what ``av.open`` and ``h5py.File`` take: the path itself when local;
* :func:`local_file` is a local path for readers that open only local files (DALI's video
  reader): an object is copied whole into the cache (``storage.cache_dir``).

DALI's own readers of encoded images (``fn.io.file.read``) and shards read ``s3://`` URLs
themselves (its AWS SDK build), so the image loaders hand DALI the URLs unchanged.

**Settings** (the ``storage`` config section) reach every process through the environment:
:func:`configure_storage` writes them there, and DALI's worker processes, forked or spawned,
inherit them (:func:`storage_settings` reads them back; both live in
:mod:`gpufeed.core._storage_settings`, re-exported here).
"""

from __future__ import annotations

import errno
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path, PurePath
from typing import TypeAlias

from gpufeed.core import _s3
from gpufeed.core._object_path import OBJECT_SCHEMES, ObjectPath, is_object_url, nameable_key, url_scheme
from gpufeed.core._ranged import RangedFile

# The settings' environment names too: the storage bench and its tests set them.
from gpufeed.core._storage_settings import ENV_BLOCK_BYTES as ENV_BLOCK_BYTES
from gpufeed.core._storage_settings import ENV_CACHE_DIR as ENV_CACHE_DIR
from gpufeed.core._storage_settings import ENV_CACHE_MAX_BYTES as ENV_CACHE_MAX_BYTES
from gpufeed.core._storage_settings import (
    StorageSettings,
    configure_storage,
    storage_cache,
    storage_settings,
)
from gpufeed.core._text import quoted

__all__ = [
    "DataPath",
    "S3Path",
    "StorageSettings",
    "configure_storage",
    "data_path",
    "file_size",
    "is_remote",
    "join",
    "listdir",
    "local_file",
    "media_source",
    "member_ref",
    "open_binary",
    "prime_listing",
    "read_bytes",
    "read_range",
    "split_member",
    "stat_key",
    "storage_cache",
    "storage_settings",
    "walk",
]

PathArg = str | PurePath | ObjectPath
# What open_binary returns: a local file, or an object's ranged-read file; both read, seek and close.
BinaryFile: TypeAlias = io.BufferedReader | RangedFile


class S3Path(ObjectPath):
    """An :class:`~gpufeed.core._object_path.ObjectPath` that reads its bucket: what the indexes ask of a ``Path``.

    ``is_dir()``: some key continues this one with ``/``; ``is_file()``: an object has exactly this
    key; ``iterdir()``: one level below the prefix; ``open("rb")``: a ranged-read file
    (:class:`~gpufeed.core._ranged.RangedFile`). Every failure is an ``OSError`` naming the URL, never a
    credential (:mod:`gpufeed.core._s3`).
    """

    __slots__ = ()

    def stat(self) -> _s3.ObjectStat:
        """Size and version (``st_size``, ``st_mtime_ns``, ``etag``); ``FileNotFoundError``-like ``OSError`` when absent."""
        return _s3.stat(self)

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_file(self) -> bool:
        return bool(self.key) and _s3.lookup(self) is not None

    def is_dir(self) -> bool:
        return _s3.has_children(self)

    def iterdir(self) -> Iterator[S3Path]:
        """The keys and sub-prefixes one level below this prefix, sorted (never one outside it)."""
        folders, files = _s3.list_level(self)
        return iter(sorted(child for name in folders + files if (child := self / name).parent == self))

    def glob(self, pattern: str) -> Iterator[S3Path]:
        """The keys one level below this prefix whose names match ``pattern`` (no ``/`` in it)."""
        if "/" in pattern:
            raise ValueError(f"{self}: glob pattern {pattern!r} spans levels; only one level is read here")
        import fnmatch

        _folders, files = _s3.list_level(self)
        matches = (self / name for name in sorted(files) if fnmatch.fnmatchcase(name, pattern))
        return (child for child in matches if child.parent == self)

    def read_bytes(self) -> bytes:
        return _s3.read_object(self)

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def open(self, mode: str = "rb") -> RangedFile:
        """A read-only, seekable binary file read by ranges, with this process's block size and cache.

        Raises:
            ValueError: A mode other than ``"rb"``: objects are read, never written here.
            OSError: The object does not exist or cannot be reached.
        """
        if mode != "rb":
            raise ValueError(f"{self}: mode {mode!r} is not allowed; objects open read-only ('rb')")
        found = _s3.stat(self)
        settings = storage_settings()
        return RangedFile(
            str(self),
            found.st_size,
            lambda start, length: _s3.read_range(self, start, length, found.etag),
            block_bytes=settings.block_bytes,
            cache=storage_cache(),
            cache_key=f"{self}\n{found.st_size}\n{found.etag or found.st_mtime_ns}",
        )


# Where a dataset can be: a local path or a key prefix in a bucket.
DataPath: TypeAlias = Path | S3Path


def data_path(value: str | PurePath | ObjectPath) -> DataPath:
    """``value`` as an :class:`S3Path` when it is an ``s3://`` URL (or an ``ObjectPath``), else as a ``Path``.

    Raises:
        ValueError: A URL of a scheme gpufeed does not read (``gs://``, ``http://``), or a bad S3 URL.
    """
    if isinstance(value, S3Path):
        return value
    if isinstance(value, ObjectPath):
        return S3Path(str(value))
    if isinstance(value, PurePath):
        return Path(value)
    text = str(value)
    scheme = url_scheme(text)
    if scheme is None:
        return Path(text)
    if scheme in OBJECT_SCHEMES:
        return S3Path(text)
    raise ValueError(f"{quoted(text)}: {scheme}:// is not read here; supported: local paths and s3://bucket/prefix")


def _split(path: PathArg) -> tuple[S3Path | None, str]:
    """``(the object, "")`` for an object, ``(None, the local path as text)`` otherwise."""
    if isinstance(path, ObjectPath):
        return (path if isinstance(path, S3Path) else S3Path(str(path))), ""
    if isinstance(path, str) and is_object_url(path):
        return S3Path(path), ""
    return None, os.fspath(path)


def is_remote(path: object) -> bool:
    """Whether ``path`` names an object in a bucket (an ``s3://`` URL or an :class:`ObjectPath`)."""
    return is_object_url(path)


def join(base: PathArg, *names: str) -> str:
    """``os.path.join`` for a local ``base``, key joining for a URL; the result as text."""
    obj, local = _split(base)
    return str(obj.joinpath(*names)) if obj is not None else os.path.join(local, *names)


def walk(root: PathArg) -> Iterator[tuple[str, list[str], list[str]]]:
    """:func:`os.walk` of a folder or of a bucket prefix: ``(dirpath, dirnames, filenames)``, top-down.

    As with ``os.walk``, removing names from ``dirnames`` prunes them. A bucket prefix is listed in
    one paginated request series; its "folders" are the key parts before a ``/``.

    Raises:
        OSError: The bucket cannot be listed (the message names the URL).
    """
    top, local = _split(root)
    if top is None:
        yield from os.walk(local)
        return
    children: dict[str, tuple[set[str], list[str]]] = {"": (set(), [])}
    base = f"{top.key}/" if top.key else ""
    for found in _s3.list_tree(top):
        key = found.url.split("/", 3)[3]
        if not key.startswith(base) or not nameable_key(top.bucket, key):
            continue  # an empty part would make the root its own child, a ".." a folder outside it
        parts = key[len(base) :].split("/")
        for depth in range(len(parts) - 1):
            parent, child = "/".join(parts[:depth]), parts[depth]
            children.setdefault(parent, (set(), []))[0].add(child)
            children.setdefault("/".join(parts[: depth + 1]), (set(), []))
        children["/".join(parts[:-1])][1].append(parts[-1])
    pending = [""]
    while pending:
        rel = pending.pop()
        folders, files = children.get(rel, (set(), []))
        dirnames = sorted(folders)
        yield (str(top / rel) if rel else str(top)), dirnames, sorted(files)
        pending.extend(f"{rel}/{name}" if rel else name for name in reversed(dirnames))


def prime_listing(path: PathArg) -> None:
    """List a bucket prefix once, so the questions an index asks about its keys for the next minute
    are answered from that listing (:mod:`gpufeed.core._s3`); nothing for a local folder."""
    obj, _ = _split(path)
    if obj is not None:
        _s3.list_tree(obj)


def listdir(path: PathArg) -> list[str]:
    """:func:`os.listdir`: the names of the files and folders in a folder or one level below a prefix.

    Raises:
        OSError: It cannot be listed.
    """
    obj, local = _split(path)
    if obj is not None:
        folders, files = _s3.list_level(obj)
        return folders + files
    return os.listdir(local)


def stat_key(path: PathArg) -> tuple[int, int]:
    """``(size, version)`` of a file or object: what the index caches compare to know it is unchanged.

    Raises:
        OSError: It does not exist or cannot be read.
    """
    obj, local = _split(path)
    if obj is not None:
        found = obj.stat()
        return found.st_size, found.st_mtime_ns
    st = os.stat(local)
    return st.st_size, st.st_mtime_ns


def file_size(path: PathArg) -> int:
    """Bytes in a file or object (raises ``OSError`` when it cannot be asked)."""
    return stat_key(path)[0]


def open_binary(path: PathArg) -> BinaryFile:
    """``open(path, "rb")``; an object opens as a ranged-read file (see the module docs)."""
    obj, local = _split(path)
    if obj is not None:
        return obj.open("rb")
    return open(local, "rb")  # the caller closes it, as it would close open()'s


def media_source(path: PathArg) -> str | RangedFile:
    """What ``av.open`` and ``h5py.File`` are given: the local path as text, or an object's ranged-read file."""
    obj, local = _split(path)
    return obj.open("rb") if obj is not None else local


# A member of a tar shard, named by its byte range: "<tar>#<offset>:<size>:<member name>".
_MEMBER = re.compile(r"^(?P<tar>.+\.tar)#(?P<offset>\d+):(?P<size>\d+):(?P<name>[^/#:]+)$")


def member_ref(tar: PathArg, offset: int, size: int, name: str) -> str:
    """The text naming ``size`` bytes at ``offset`` of the tar file ``tar`` (a shard member, or a clip's span)."""
    return f"{tar}#{int(offset)}:{int(size)}:{name}"


def split_member(text: object) -> tuple[str, int, int, str] | None:
    """``(tar path, offset, size, name)`` of a :func:`member_ref`, or ``None`` for any other path."""
    match = _MEMBER.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    return match["tar"], int(match["offset"]), int(match["size"]), match["name"]


def read_range(path: PathArg, start: int, length: int) -> bytes:
    """``length`` bytes from byte ``start`` of a file or object (fewer at its end): one ranged read."""
    obj, local = _split(path)
    if obj is not None:
        return _s3.read_range(obj, start, length)
    with open(local, "rb", buffering=0) as fh:
        return os.pread(fh.fileno(), length, start)


def read_bytes(path: PathArg, max_bytes: int | None = None) -> bytes:
    """The whole file or object; ``max_bytes`` refuses a larger one unread (``OSError``, ``EFBIG``).

    A shard member (:func:`member_ref`) is its byte range of the tar file, one ranged read.
    """
    member = split_member(path)
    if member is not None:
        tar, offset, size, _name = member
        if max_bytes is not None and size > max_bytes:
            import errno

            raise OSError(errno.EFBIG, f"{path}: {size:,} bytes, more than the {max_bytes:,} allowed here")
        data = read_range(tar, offset, size)
        if len(data) != size:
            raise OSError(f"{path}: the shard ends {size - len(data):,} bytes before the member does")
        return data
    obj, local = _split(path)
    if obj is not None:
        return _s3.read_object(obj, max_bytes)
    if max_bytes is not None:
        size = os.stat(local).st_size
        if size > max_bytes:
            import errno

            raise OSError(errno.EFBIG, f"{local}: {size:,} bytes, more than the {max_bytes:,} allowed here")
    return Path(local).read_bytes()


def local_file(path: PathArg) -> str:
    """A local path for a reader that opens only local files: the path itself, or an object's cached copy.

    Raises:
        OSError: An object, but no ``storage.cache_dir`` to copy it into, or it cannot be read.
    """
    obj, local = _split(path)
    if obj is None:
        return local
    cache = storage_cache()
    if cache is None:
        raise _s3.StorageError(
            errno.EINVAL,
            f"{path}: this reader opens local files only; set storage.cache_dir to copy objects into a local "
            "cache first (or use video.decoder: pyav, which reads objects by ranges)",
        )
    return str(cache.materialize(obj))
