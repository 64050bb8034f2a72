"""The optional local cache of object-store reads, bounded in bytes (``storage.cache_dir``, ``storage.cache_max_bytes``).

Three kinds of entry live under the cache folder:

* ``blocks/``: blocks of ranged reads (:class:`gpufeed.core._ranged.RangedFile`), named by a hash of
  the object's URL, size and entity tag, the block size and the block's number, so a changed
  object never serves old bytes;
* ``objects/``: whole objects, for readers that open local files only (DALI's video reader):
  :meth:`BlockCache.materialize`;
* ``readers/``: one folder per reader that opened whole objects (:meth:`BlockCache.pin`), holding
  hard links to them, or copies where the file system has no hard links. A pinned entry (more
  than one link) is never evicted: removing its name would free nothing, and the reader's next
  open of it would copy it again. A folder is named by its process and :func:`host_tag`; one of
  this host's whose process is gone is removed, one of another host (a container sharing a
  hostPath cache, a node sharing it on NFS) only once it has not changed for a day.

**The bound.** Each process keeps a running total of what it wrote; when a write would take it
past ``max_bytes`` it lists the folder, and deletes the least recently used unpinned entries (a read
touches an entry's time) until the folder holds at most 90% of the bound with the new entry. Every
file counts once: a pin's link adds nothing to its entry's bytes, a pin's copy adds its own. Several
processes share a folder; each enforces the bound on what it sees, so the folder exceeds it by at
most the entries being written at that moment. Entries are written to a temporary name and renamed,
so a reader never sees half an entry; an entry deleted under a reader is fetched again. Pinned
bytes can fill the bound: blocks are then not cached, and the folder is listed again only after a
few seconds rather than on every block.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import shutil
import socket
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

log = logging.getLogger("gpufeed")

_KEEP_FRACTION = 0.9
_COPY_BYTES = 8 << 20
_READERS = "readers"
# A temporary file this much older than its last write is a crashed writer's, not one being written.
_TMP_IN_FLIGHT_S = 3600.0
# Another host's pid means nothing here, and a reader there leaves its folder unchanged while it reads
# (DALI holds every file open; its host's processes touch it only when they list the cache): only
# a day's silence says that host's reader is gone. Its pins count against the bound meanwhile.
_FOREIGN_PIN_IDLE_S = 24 * 3600.0
# Blocks are optional: with pinned bytes holding the room, listing the folder for each would cost
# more than the block saves.
_FULL_RELIST_S = 10.0
# Each try copies the object again; losing the race this often means the bound is far too small
# for the processes sharing the folder.
_PIN_TRIES = 5
# link(2)'s answers where the file system has no hard links (vfat/exFAT, many FUSE mounts, SMB), the
# folder is another mount, or the entry has its file system's most links: a copy does instead.
_NO_LINK = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK})


@functools.cache
def host_tag() -> str:
    """This host, boot and PID namespace, as part of a file name: where a pin folder's pid names a process.

    A pid names a process only in one PID namespace of one boot of one host; containers sharing a
    hostPath cache, or hosts sharing one on NFS, would read each other's pids as gone (or as
    another process). The host name is the one a person reads; the boot id and the namespace's
    inode tell apart what shares it (a reboot, a container with the host's name).
    """
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:16])
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid").strip("pid:[]"))
    return re.sub(r"[^A-Za-z0-9.-]+", "-", ".".join(parts))[:160]


def _owner(folder: str) -> tuple[int | None, str]:
    """A pin folder's (pid, host tag) from its name ``<pid>@<host tag>@<random>``; (None, "") for others."""
    parts = folder.split("@")
    if len(parts) == 3 and parts[0].isdigit():
        return int(parts[0]), parts[1]
    return None, ""  # not a pin folder of this layout (an older gpufeed's): judged as another host's


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
        self._full_until = 0.0  # monotonic time before which a block does not list the folder again
        self._told_no_links = False
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
        """Store ``data`` as ``name``; no room (a full disk, pinned bytes) is not an error: it is fetched again."""
        if len(data) > self.max_bytes:
            return
        path = self._entry("blocks", name)
        if not self._make_room(len(data), optional=True):
            return
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
        return tempfile.TemporaryDirectory(prefix=f"{os.getpid()}@{host_tag()}@", dir=readers)

    def pin(self, source: ObjectPath, folder: str | os.PathLike) -> Path:
        """A local copy of the whole object that no eviction removes: a hard link in ``folder`` to its entry.

        Where link(2) is refused (:data:`_NO_LINK`: no hard links on the file system), the entry is
        copied into ``folder`` instead: its own bytes, counted against the bound; the first such
        copy says why in one warning.

        Args:
            source: The object.
            folder: A :meth:`pin_folder` (on the cache's file system, as a hard link needs).

        Raises:
            OSError: As :meth:`materialize`; or other processes evicted its entry before it was
                pinned, each of :data:`_PIN_TRIES` times.
        """
        for _ in range(_PIN_TRIES):
            path = self.materialize(source)
            link = Path(folder) / path.name
            try:
                self._link(path, link)
            except FileNotFoundError:
                if not Path(folder).is_dir():  # the folder itself is gone: no retry brings it back
                    raise
                continue  # the entry was evicted by another process between the copy and the link
            return link
        raise OSError(
            errno.EAGAIN,
            f"{source}: other processes evicted its copy in {self.root} {_PIN_TRIES} times before it was pinned; "
            "storage.cache_max_bytes is too small for the processes sharing the cache",
        )

    def _link(self, entry: Path, link: Path) -> None:
        """``link`` as a hard link to ``entry``, or a copy of it where link(2) is refused."""
        try:
            os.link(entry, link)
            return
        except FileExistsError:  # listed twice
            return
        except OSError as err:
            if err.errno not in _NO_LINK:
                raise
            if not self._told_no_links:
                self._told_no_links = True
                log.warning(
                    "storage cache %s: hard links are refused there (%s: %s), so each DALI reader's videos are "
                    "copied into readers/ rather than linked: twice the disk, counted against storage.cache_max_bytes",
                    self.root,
                    errno.errorcode.get(err.errno, err.errno),
                    err.strerror,
                )
        with open(entry, "rb") as src:  # held open: making room may evict the entry under the copy
            size = os.fstat(src.fileno()).st_size
            self._make_room(size)
            tmp = link.with_name(f".{link.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            try:
                with open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out, _COPY_BYTES)
                os.replace(tmp, link)
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()
        self._add(size)

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

    def _entries(self) -> tuple[list[tuple[float, int, str]], int]:
        """The entries eviction may remove, as (last used, bytes, path), and the bytes of every file held.

        Each file counts once, by its inode (a pin's link is its entry's bytes). Left out of the
        first: pinned entries (more than one link; removing a name frees nothing), readers' copies,
        and files another writer is still writing.
        """
        self._remove_orphan_pins()
        readers = os.path.join(self.root, _READERS)
        evictable, held = [], {}
        now = time.time()
        for dirpath, _dirs, files in os.walk(self.root):
            pinned = dirpath == readers or dirpath.startswith(readers + os.sep)
            for name in files:
                full = os.path.join(dirpath, name)
                with contextlib.suppress(OSError):
                    st = os.stat(full)
                    held[st.st_dev, st.st_ino] = st.st_size
                    if pinned or st.st_nlink > 1:
                        continue
                    if name.endswith(".tmp") and now - st.st_mtime < _TMP_IN_FLIGHT_S:
                        continue  # another writer's, in flight: its rename would fail
                    evictable.append((st.st_mtime, st.st_size, full))
        return evictable, sum(held.values())

    def pinned(self) -> dict[tuple[int, int], int]:
        """What every reader of this folder holds pinned under ``readers/`` (any process or host): bytes by (device, inode)."""
        self._remove_orphan_pins()
        held = {}
        for dirpath, _dirs, files in os.walk(self.root / _READERS):
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.stat(os.path.join(dirpath, name))
                    held[st.st_dev, st.st_ino] = st.st_size
        return held

    def _remove_orphan_pins(self) -> None:
        """Remove the pin folders of readers that are gone: this host's by pid, another host's once long idle.

        As :func:`~gpufeed.core._files.remove_stale_temps` does for a writer elsewhere, a folder
        whose pid means nothing here (:func:`host_tag` differs) goes only when it has not changed
        for :data:`_FOREIGN_PIN_IDLE_S`; this host's live folders are touched, so that a host
        sharing the cache sees them change.
        """
        here, now = host_tag(), time.time()
        with contextlib.suppress(OSError):
            for folder in os.scandir(self.root / _READERS):
                pid, tag = _owner(folder.name)
                with contextlib.suppress(OSError):
                    if pid is not None and tag == here:
                        if _runs(pid):
                            os.utime(folder.path)
                            continue
                    elif now - folder.stat(follow_symlinks=False).st_mtime < _FOREIGN_PIN_IDLE_S:
                        continue
                    shutil.rmtree(folder.path, ignore_errors=True)

    def _make_room(self, incoming: int, *, optional: bool = False) -> bool:
        """Evict least recently used unpinned entries when ``incoming`` would pass the bound; whether it fits.

        Args:
            incoming: The bytes about to be written.
            optional: A block, skipped when it does not fit: while pinned bytes hold the room, the
                folder is not listed again for each (:data:`_FULL_RELIST_S`).
        """
        with self._lock:
            if self._total is not None and self._total + incoming <= self.max_bytes:
                return True
            if optional and time.monotonic() < self._full_until:
                return False
            entries, total = self._entries()
            target = int(self.max_bytes * _KEEP_FRACTION) - incoming
            for _, size, full in sorted(entries):
                if total <= target:
                    break
                with contextlib.suppress(OSError):
                    os.unlink(full)
                    total -= size
                    self.evicted += 1
            self._total = total
            fits = total + incoming <= self.max_bytes
            self._full_until = 0.0 if fits else time.monotonic() + _FULL_RELIST_S
            return fits

    def total_bytes(self) -> int:
        """What the folder holds now (listed; pinned entries and readers' copies included)."""
        return self._entries()[1]

    def describe(self) -> str:
        """A line for logs: where, how full, hits and misses."""
        return (
            f"storage cache {self.root}: {self.total_bytes() / 2**20:,.1f} of {self.max_bytes / 2**20:,.1f} MiB, "
            f"{self.hits} hit(s), {self.misses} miss(es), {self.evicted} evicted ({time.strftime('%H:%M:%S')})"
        )
