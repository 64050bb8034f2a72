"""Reading a dataset wherever it is: local paths and ``s3://`` URLs through the same few calls.

The indexes, ``gpufeed check`` and the decoders that gpufeed feeds itself (PyAV, h5py, frame
folders, shards) read through these functions; each takes a path as text (``"/data/x.mp4"`` or
``"s3://bucket/data/x.mp4"``), a :class:`~pathlib.Path` or an :class:`~gpufeed._object_path.ObjectPath`:

* :func:`walk` is :func:`os.walk` (a bucket listed once, its keys grouped into "folders" by ``/``);
* :func:`stat_key` is ``(size, version)``: a file's modification time, an object's;
* :func:`open_binary` is ``open(path, "rb")``: an object opens as a
  :class:`~gpufeed._ranged.RangedFile`, read by ranges;
* :func:`media_source` is what ``av.open`` and ``h5py.File`` take: the path itself when local;
* :func:`local_file` is a local path for readers that open only local files (DALI's video
  reader): an object is copied whole into the cache (``storage.cache_dir``).

DALI's own readers of encoded images (``fn.io.file.read``) and shards read ``s3://`` URLs
themselves (its AWS SDK build), so the image loaders hand DALI the URLs unchanged.

**Settings** (the ``storage`` config section) reach every process through the environment:
:func:`configure_storage` writes them there, and DALI's worker processes, forked or spawned,
inherit them (:func:`storage_settings` reads them back).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import IO, TYPE_CHECKING

from gpufeed._config_storage import StorageConfig
from gpufeed._object_path import ObjectPath, is_object_url

if TYPE_CHECKING:
    from gpufeed._blob_cache import BlockCache

__all__ = [
    "StorageSettings",
    "configure_storage",
    "file_size",
    "is_remote",
    "join",
    "local_file",
    "media_source",
    "open_binary",
    "read_bytes",
    "stat_key",
    "storage_cache",
    "storage_settings",
    "walk",
]

ENV_CACHE_DIR = "GPUFEED_STORAGE_CACHE_DIR"
ENV_CACHE_MAX_BYTES = "GPUFEED_STORAGE_CACHE_MAX_BYTES"
ENV_BLOCK_BYTES = "GPUFEED_STORAGE_BLOCK_BYTES"

PathArg = str | PurePath | ObjectPath


@dataclass(frozen=True)
class StorageSettings:
    """The ``storage`` section as this process sees it (see the module docs).

    Attributes:
        cache_dir: The disk cache folder, or ``None``.
        cache_max_bytes: Its bound.
        block_bytes: The unit of ranged reads.
    """

    cache_dir: str | None
    cache_max_bytes: int
    block_bytes: int


def configure_storage(cfg: StorageConfig) -> None:
    """Make ``cfg`` this process's storage settings, and its future children's (through the environment)."""
    if cfg.cache_dir is not None:
        os.environ[ENV_CACHE_DIR] = str(cfg.cache_dir)
    else:
        os.environ.pop(ENV_CACHE_DIR, None)
    os.environ[ENV_CACHE_MAX_BYTES] = str(cfg.cache_max_bytes)
    os.environ[ENV_BLOCK_BYTES] = str(cfg.block_bytes)


def _int_env(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def storage_settings() -> StorageSettings:
    """This process's settings: what :func:`configure_storage` set, else the config's defaults."""
    defaults = StorageConfig()
    return StorageSettings(
        os.environ.get(ENV_CACHE_DIR) or None,
        max(1, _int_env(ENV_CACHE_MAX_BYTES, defaults.cache_max_bytes)),
        max(4096, _int_env(ENV_BLOCK_BYTES, defaults.block_bytes)),
    )


_cache_lock = threading.Lock()
_caches: dict[tuple, BlockCache] = {}


def storage_cache() -> BlockCache | None:
    """This process's disk cache for the current settings, or ``None`` when ``storage.cache_dir`` is unset."""
    settings = storage_settings()
    if settings.cache_dir is None:
        return None
    from gpufeed._blob_cache import BlockCache

    key = (os.getpid(), settings.cache_dir, settings.cache_max_bytes)
    with _cache_lock:
        cache = _caches.get(key)
        if cache is None:
            cache = _caches[key] = BlockCache(settings.cache_dir, settings.cache_max_bytes)
        return cache


def is_remote(path: object) -> bool:
    """Whether ``path`` names an object in a bucket (an ``s3://`` URL or an :class:`ObjectPath`)."""
    return is_object_url(path)


def join(base: PathArg, *names: str) -> str:
    """``os.path.join`` for a local ``base``, key joining for a URL; the result as text."""
    if is_object_url(base):
        return str(ObjectPath(str(base)).joinpath(*names))
    return os.path.join(base, *names)


def walk(root: PathArg) -> Iterator[tuple[str, list[str], list[str]]]:
    """:func:`os.walk` of a folder or of a bucket prefix: ``(dirpath, dirnames, filenames)``, top-down.

    As with ``os.walk``, removing names from ``dirnames`` prunes them. A bucket prefix is listed in
    one paginated request series; its "folders" are the key parts before a ``/``.

    Raises:
        OSError: The bucket cannot be listed (the message names the URL).
    """
    if not is_object_url(root):
        yield from os.walk(root)
        return
    from gpufeed import _s3  # Deferred: boto3 loads only when a bucket is read

    top = ObjectPath(str(root))
    children: dict[str, tuple[set[str], list[str]]] = {"": (set(), [])}
    base = f"{top.key}/" if top.key else ""
    for found in _s3.list_tree(top):
        parts = found.url.split("/", 3)[3][len(base) :].split("/")
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


def stat_key(path: PathArg) -> tuple[int, int]:
    """``(size, version)`` of a file or object: what the index caches compare to know it is unchanged.

    Raises:
        OSError: It does not exist or cannot be read.
    """
    if is_object_url(path):
        found = ObjectPath(str(path)).stat()
        return found.st_size, found.st_mtime_ns
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def file_size(path: PathArg) -> int:
    """Bytes in a file or object (raises ``OSError`` when it cannot be asked)."""
    return stat_key(path)[0]


def open_binary(path: PathArg) -> IO[bytes]:
    """``open(path, "rb")``; an object opens as a ranged-read file (see the module docs)."""
    if is_object_url(path):
        return ObjectPath(str(path)).open("rb")
    return open(path, "rb")  # the caller closes it, as it would close open()'s


def media_source(path: PathArg) -> str | IO[bytes]:
    """What ``av.open`` and ``h5py.File`` are given: the local path as text, or an object's ranged-read file."""
    if is_object_url(path):
        return open_binary(path)
    return os.fspath(path) if isinstance(path, PurePath) else str(path)


def read_bytes(path: PathArg, max_bytes: int | None = None) -> bytes:
    """The whole file or object; ``max_bytes`` refuses a larger one unread (``OSError``, ``EFBIG``)."""
    if is_object_url(path):
        from gpufeed import _s3  # Deferred: boto3 loads only when a bucket is read

        return _s3.read_object(ObjectPath(str(path)), max_bytes)
    if max_bytes is not None:
        size = os.stat(path).st_size
        if size > max_bytes:
            import errno

            raise OSError(errno.EFBIG, f"{path}: {size:,} bytes, more than the {max_bytes:,} allowed here")
    return Path(path).read_bytes()


def local_file(path: PathArg) -> str:
    """A local path for a reader that opens only local files: the path itself, or an object's cached copy.

    Raises:
        OSError: An object, but no ``storage.cache_dir`` to copy it into, or it cannot be read.
    """
    if not is_object_url(path):
        return os.fspath(path) if isinstance(path, PurePath) else str(path)
    cache = storage_cache()
    if cache is None:
        import errno

        raise OSError(
            errno.EINVAL,
            f"{path}: this reader opens local files only; set storage.cache_dir to copy objects into a local "
            "cache first (or use video.decoder: pyav, which reads objects by ranges)",
        )
    return str(cache.materialize(ObjectPath(str(path))))
