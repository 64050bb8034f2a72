"""The optional local cache of object-store reads, bounded in bytes (``storage.cache_dir``, ``storage.cache_max_bytes``).

Two kinds of entry live under the cache folder:

* ``blocks/``: blocks of ranged reads (:class:`gpufeed.core._ranged.RangedFile`), named by a hash of
  the object's URL, size and entity tag, the block size and the block's number, so a changed
  object never serves old bytes;
* ``objects/``: whole objects, for readers that open local files only (DALI's video reader):
  :meth:`BlockCache.materialize`;
* ``readers/``: one folder per reader that opened whole objects (:meth:`BlockCache.pin`), holding
  hard links to them: eviction (this process's, while it copies the next object, or another's)
  removes the entry's name only, never a file a reader was handed. Not counted against the
  bound (they are the entries' own bytes); a folder whose process is gone is removed.

**The bound.** Each process keeps a running total of what it wrote; when a write would take it
past ``max_bytes`` it lists the folder, and deletes the least recently used entries (a read
touches an entry's time) until the folder holds at most 90% of the bound with the new entry. Several
processes share a folder; each enforces the bound on what it sees, so the folder exceeds it by at
most the entries being written at that moment. Entries are written to a temporary name and renamed,
so a reader never sees half an entry; an entry deleted under a reader is fetched again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpufeed.core import _s3
from gpufeed.core._files import _runs

if TYPE_CHECKING:
    from gpufeed.core._object_path import ObjectPath

__all__ = ["BlockCache"]

_KEEP_FRACTION = 0.9
_COPY_BYTES = 8 << 20
_READERS = "readers"
# A temporary file this much older than its last write is a crashed writer's, not one being written.
_TMP_IN_FLIGHT_S = 3600.0


class BlockCache:
    """Blocks and whole objects on local disk, least recently used evicted past ``max_bytes``.

    Args:
        root: The cache folder (created when missing).
        max_bytes: The bound on everything under it.
    """

    def __init__(self, root: str | os.PathLike, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._total: int | None = None  # unknown until the first write lists the folder
        self.hits = 0
        self.misses = 0
        self.evicted = 0

    def _entry(self, kind: str, name: str, suffix: str = "") -> Path:
        digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()
        return self.root / kind / digest[:2] / f"{digest}{suffix}"

    def get(self, name: str) -> bytes | None:
        """The block stored as ``name``, or ``None``."""
        path = self._entry("blocks", name)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # used now: the last to be evicted
        self.hits += 1
        return data

    def put(self, name: str, data: bytes) -> None:
        """Store ``data`` as ``name``; a failure to write (a full disk) is not an error: it is fetched again."""
        if len(data) > self.max_bytes:
            return
        path = self._entry("blocks", name)
        self._make_room(len(data))
        with contextlib.suppress(OSError):
            self._write(path, data)
            self._add(len(data))

    def materialize(self, source: ObjectPath) -> Path:
        """A local copy of the whole object (kept in ``objects/``, under the same bound).

        Raises:
            OSError: It cannot be read, or it is larger than the whole cache (``EFBIG``).
        """
        found = _s3.stat(source)
        path = self._entry("objects", f"{source}\n{found.st_size}\n{found.etag}", source.suffix)
        if path.is_file() and path.stat().st_size == found.st_size:
            with contextlib.suppress(OSError):
                os.utime(path)
            self.hits += 1
            return path
        if found.st_size > self.max_bytes:
            import errno

            raise OSError(
                errno.EFBIG,
                f"{source}: {found.st_size:,} bytes do not fit in storage.cache_max_bytes ({self.max_bytes:,})",
            )
        self.misses += 1
        self._make_room(found.st_size)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as out:
                for start in range(0, found.st_size, _COPY_BYTES):
                    out.write(_s3.read_range(source, start, min(_COPY_BYTES, found.st_size - start), found.etag))
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
        self._add(found.st_size)
        return path

    def pin_folder(self) -> tempfile.TemporaryDirectory:
        """A folder for one reader's :meth:`pin` links, under ``readers/``; clean it up when the reader closes."""
        readers = self.root / _READERS
        readers.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix=f"{os.getpid()}-", dir=readers)

    def pin(self, source: ObjectPath, folder: str | os.PathLike) -> Path:
        """A local copy of the whole object that no eviction removes: a hard link in ``folder`` to its entry.

        Args:
            source: The object.
            folder: A :meth:`pin_folder` (on the cache's file system, as a hard link needs).

        Raises:
            OSError: As :meth:`materialize`, or the file system has no hard links.
        """
        path = self.materialize(source)
        link = Path(folder) / path.name
        try:
            os.link(path, link)
        except FileExistsError:  # listed twice
            pass
        except FileNotFoundError:  # evicted by another process between the copy and the link: once more
            os.link(self.materialize(source), link)
        return link

    def _write(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()

    def _add(self, size: int) -> None:
        with self._lock:
            self._total = (self._total or 0) + size

    def _entries(self) -> list[tuple[float, int, str]]:
        """Every entry as (last used, bytes, path); readers' links and files being written left out."""
        found = []
        now = time.time()
        for dirpath, dirs, files in os.walk(self.root):
            if dirpath == str(self.root) and _READERS in dirs:
                dirs.remove(_READERS)
                self._remove_orphan_pins()
            for name in files:
                full = os.path.join(dirpath, name)
                with contextlib.suppress(OSError):
                    st = os.stat(full)
                    if name.endswith(".tmp") and now - st.st_mtime < _TMP_IN_FLIGHT_S:
                        continue  # another writer's, in flight: its rename would fail
                    found.append((st.st_mtime, st.st_size, full))
        return found

    def _remove_orphan_pins(self) -> None:
        """Remove the pin folders of processes that no longer run (a crash left them)."""
        with contextlib.suppress(OSError):
            for folder in (self.root / _READERS).iterdir():
                pid = folder.name.split("-", 1)[0]
                if pid.isdigit() and not _runs(int(pid)):
                    shutil.rmtree(folder, ignore_errors=True)

    def _make_room(self, incoming: int) -> None:
        """List the folder and evict least recently used entries when ``incoming`` would pass the bound."""
        with self._lock:
            if self._total is not None and self._total + incoming <= self.max_bytes:
                return
            entries = sorted(self._entries())
            total = sum(size for _, size, _ in entries)
            target = int(self.max_bytes * _KEEP_FRACTION) - incoming
            for _, size, full in entries:
                if total <= target:
                    break
                with contextlib.suppress(OSError):
                    os.unlink(full)
                    total -= size
                    self.evicted += 1
            self._total = total

    def total_bytes(self) -> int:
        """What the folder holds now (listed)."""
        return sum(size for _, size, _ in self._entries())

    def describe(self) -> str:
        """A line for logs: where, how full, hits and misses."""
        return (
            f"storage cache {self.root}: {self.total_bytes() / 2**20:,.1f} of {self.max_bytes / 2**20:,.1f} MiB, "
            f"{self.hits} hit(s), {self.misses} miss(es), {self.evicted} evicted ({time.strftime('%H:%M:%S')})"
        )
