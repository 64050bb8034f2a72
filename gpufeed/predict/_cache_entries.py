"""The entries of ``gpufeed predict``'s export cache: what is there, when each was last used, and the size bound.

**What is an entry.** A folder of the cache whose name is the digest of the key in its
``export_key.json`` (:func:`entry_name`); that file is written last, by gpufeed, so a folder
without it, with another key, a plain file, a link or a hidden build folder is not an entry and
nothing here removes it (:attr:`ExportCacheListing.others` names them).

**Last use.** A load from the cache writes ``last_used.json`` in the entry (the time and the
checkpoint's path), atomically; an export writes it before its folder is renamed into place. File
access times are not used: ``noatime`` and ``relatime`` mounts do not keep them. An entry without
the file (written before gpufeed kept it) counts as used when its key file was written.

**In use.** A process that checks and loads an entry holds a shared ``flock`` on its
``in_use.lock`` (:func:`hold_entry`) until its onnxruntime sessions are made (they read the graph
once; later the files are not needed). Removing an entry takes that lock exclusively without
waiting, so an entry being loaded is skipped, and renames the folder aside under the lock before
deleting it: a loader that opened the lock file before the rename finds, once it holds the lock,
that the path no longer leads to it, and exports again rather than read half a folder.

**The bound** (:func:`prune_export_cache`): after a new export lands, the least recently used
entries are removed, one line logged for each (name, size, last use, checkpoint), until the
entries hold at most the limit (``$GPUFEED_EXPORT_CACHE_MAX_MB``, default 2048 MB of 10^6 bytes,
``none`` for no bound). The entry just made is never removed, even alone over the limit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from gpufeed.core import parse_limit_mb, process_alive, write_json

__all__ = [
    "DEFAULT_MAX_MB",
    "ENV_EXPORT_CACHE_MAX_MB",
    "ExportCacheEntry",
    "ExportCacheListing",
    "ExportCachePrune",
    "entry_name",
    "export_cache_max_bytes",
    "hold_entry",
    "list_export_cache",
    "prune_export_cache",
    "record_use",
    "removal_aside",
]

log = logging.getLogger("gpufeed.predict")

KEY_FILE = "export_key.json"
USE_FILE = "last_used.json"
LOCK_FILE = "in_use.lock"
ENV_EXPORT_CACHE_MAX_MB = "GPUFEED_EXPORT_CACHE_MAX_MB"
DEFAULT_MAX_MB = 2048.0
_MB = 1_000_000
_NAME = re.compile(r"[0-9a-f]{32}")
_REMOVING = re.compile(r"\.([0-9a-f]{32})\.removing-(\d+)")
_LOCK_WAIT_S = 10.0  # a remover holds the lock only for a rename


def entry_name(key: dict) -> str:
    """The folder name of the entry of ``key``: a digest of it (32 hex digits)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def export_cache_max_bytes(max_mb: float | None = None) -> float:
    """The cache's bound in bytes: ``max_mb``, else ``$GPUFEED_EXPORT_CACHE_MAX_MB``, else 2048 MB.

    ``math.inf`` is no bound. A bad environment value is one warning line and the default.
    """
    if max_mb is None:
        text = os.environ.get(ENV_EXPORT_CACHE_MAX_MB, "").strip()
        try:
            max_mb = parse_limit_mb(text) if text else DEFAULT_MAX_MB
        except ValueError as err:
            log.warning("predict: $%s: %s; using %g MB", ENV_EXPORT_CACHE_MAX_MB, err, DEFAULT_MAX_MB)
            max_mb = DEFAULT_MAX_MB
    return max_mb * _MB


@dataclass(frozen=True)
class ExportCacheEntry:
    """One export in the cache.

    Attributes:
        folder: The entry's folder.
        size_bytes: The bytes of its files.
        last_used_unix_s: When it was last loaded or made (its key file's time when it holds no record).
        checkpoint: The checkpoint path of that last use (``None`` when unrecorded).
        checkpoint_sha256: The SHA-256 of the checkpoint it was exported from.
        batch_sizes: The export's batch sizes.
    """

    folder: Path
    size_bytes: int
    last_used_unix_s: float
    checkpoint: str | None
    checkpoint_sha256: str
    batch_sizes: tuple[int, ...]

    @property
    def name(self) -> str:
        """The folder's name: the digest of the export's key."""
        return self.folder.name

    def describe(self) -> str:
        """``<name> (<MB> MB, last used <UTC time>, <checkpoint>)``: how a removal is logged."""
        used = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.last_used_unix_s))
        source = self.checkpoint or f"checkpoint sha256 {self.checkpoint_sha256[:12]}"
        return f"{self.name} ({self.size_bytes / _MB:,.1f} MB, last used {used}, {source})"


@dataclass(frozen=True)
class ExportCacheListing:
    """What a cache folder holds.

    Attributes:
        cache_dir: The folder.
        entries: gpufeed's exports, least recently used first.
        others: Everything else in it, with why it is not an entry (never removed by gpufeed);
            hidden build and removal folders are not listed.
    """

    cache_dir: Path
    entries: list[ExportCacheEntry] = field(default_factory=list)
    others: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        """The bytes of the entries (what the bound counts)."""
        return sum(e.size_bytes for e in self.entries)


@dataclass(frozen=True)
class ExportCachePrune:
    """What :func:`prune_export_cache` did.

    Attributes:
        removed: The entries removed, in the order they went.
        in_use: Entries that were due but being loaded by another process (kept).
        failed: Entries that were due but could not be removed, with why.
        left_bytes: The bytes the entries hold now.
    """

    removed: list[ExportCacheEntry]
    in_use: list[ExportCacheEntry]
    failed: list[tuple[ExportCacheEntry, str]]
    left_bytes: int


def _folder_bytes(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _last_use(folder: Path) -> tuple[float, str | None]:
    """The recorded last use and its checkpoint, or the key file's time and ``None``."""
    try:
        record = json.loads((folder / USE_FILE).read_text(encoding="utf-8"))
        return float(record["unix_s"]), str(record["checkpoint"])
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError):
        return (folder / KEY_FILE).stat().st_mtime, None


def _read_entry(path: Path) -> ExportCacheEntry | str:
    """The entry at ``path``, or why it is not one of gpufeed's exports."""
    if path.is_symlink() or not path.is_dir():
        return "not a folder"
    if not _NAME.fullmatch(path.name):
        return "not named as an export"
    try:
        key = json.loads((path / KEY_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"its {KEY_FILE} is unreadable ({type(err).__name__})"
    if not isinstance(key, dict) or not isinstance(key.get("checkpoint_sha256"), str) or entry_name(key) != path.name:
        return f"its {KEY_FILE} is not the key its name was made from"
    try:
        used, checkpoint = _last_use(path)
        sizes = tuple(int(n) for n in key.get("batch_sizes") or ())
    except (OSError, ValueError, TypeError) as err:
        return f"unreadable ({type(err).__name__})"
    return ExportCacheEntry(path, _folder_bytes(path), used, checkpoint, key["checkpoint_sha256"], sizes)


def list_export_cache(cache_dir: str | Path) -> ExportCacheListing:
    """The exports in ``cache_dir`` (least recently used first) and what else is there.

    A missing folder is an empty cache.

    Raises:
        OSError: The folder cannot be listed.
    """
    cache_dir = Path(cache_dir)
    listing = ExportCacheListing(cache_dir)
    try:
        paths = sorted(cache_dir.iterdir())
    except FileNotFoundError:
        return listing
    for path in paths:
        if path.name.startswith("."):  # builds, removals, temporary files: the processes' own
            continue
        found = _read_entry(path)
        if isinstance(found, str):
            listing.others.append((path, found))
        else:
            listing.entries.append(found)
    listing.entries.sort(key=lambda e: (e.last_used_unix_s, e.name))
    return listing


def record_use(folder: Path, checkpoint: str | Path) -> None:
    """Write the entry's last use (now, by ``checkpoint``); a cache that cannot be written is one warning line."""
    try:
        write_json(folder / USE_FILE, {"unix_s": time.time(), "checkpoint": str(checkpoint)}, atomic=True)
    except OSError as err:
        log.warning(
            "predict: cannot record the use of the cached export %s (%s); the size bound may remove it sooner",
            folder,
            err.strerror or type(err).__name__,
        )


def _open_lock(folder: Path) -> int | None:
    try:
        return os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        return None
    except OSError:  # a read-only cache: the lock file may already be there
        try:
            return os.open(folder / LOCK_FILE, os.O_RDONLY)
        except OSError:
            return None


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, held = os.stat(path), os.fstat(fd)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def hold_entry(folder: Path) -> Iterator[bool]:
    """Hold the entry at ``folder`` in use (a shared lock) for the block: no pruner removes it meanwhile.

    Yields:
        Whether it is held: ``False`` when the folder is gone (or was removed while this waited for
        the lock) or its lock file cannot be opened (a read-only cache, which nobody prunes).
    """
    fd = _open_lock(folder)
    if fd is None:
        yield False
        return
    try:
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    held = False
                    break
                time.sleep(0.01)
            except OSError:  # a filesystem without locks
                held = False
                break
        yield held and _same_file(fd, folder / LOCK_FILE)
    finally:
        os.close(fd)


def removal_aside(folder: Path) -> Path:
    """Where an entry is renamed before it is deleted: hidden, and cleaned up by a later prune if this process dies first."""
    return folder.with_name(f".{folder.name}.removing-{os.getpid()}")


def _remove(entry: ExportCacheEntry) -> str | None:
    """Remove ``entry`` unless in use; ``None`` when removed, else why not (``"in use"`` when being loaded)."""
    fd = _open_lock(entry.folder)
    if fd is None:
        return "gone" if not entry.folder.exists() else "its lock file cannot be opened"
    aside = removal_aside(entry.folder)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "in use"
        if not _same_file(fd, entry.folder / LOCK_FILE):
            return "gone"
        if _last_use(entry.folder)[0] != entry.last_used_unix_s:
            return "in use"  # loaded since it was listed
        os.rename(entry.folder, aside)  # under the lock: a loader waiting for it finds the path gone
    except OSError as err:
        return err.strerror or type(err).__name__
    finally:
        os.close(fd)
    shutil.rmtree(aside, ignore_errors=True)
    return None


def _remove_abandoned(cache_dir: Path) -> None:
    """Folders set aside for removal by a process that died before deleting them."""
    for path in cache_dir.glob(".*.removing-*"):
        found = _REMOVING.fullmatch(path.name)
        if found and int(found[2]) != os.getpid() and not process_alive(int(found[2])):
            shutil.rmtree(path, ignore_errors=True)


def prune_export_cache(cache_dir: str | Path, max_bytes: float, keep: Collection[str] = ()) -> ExportCachePrune:
    """Remove the least recently used exports of ``cache_dir`` until they hold at most ``max_bytes``.

    Only gpufeed's exports are counted and removed (:func:`list_export_cache`); one that another
    process is loading is skipped. Each removal is one log line.

    Args:
        cache_dir: The cache folder.
        max_bytes: The bound (``math.inf``: none; 0: remove every entry not kept or in use).
        keep: Entry names never removed (the export just made).

    Raises:
        OSError: The folder cannot be listed.
    """
    cache_dir = Path(cache_dir)
    listing = list_export_cache(cache_dir)
    with contextlib.suppress(OSError):
        _remove_abandoned(cache_dir)
    total = listing.total_bytes
    removed: list[ExportCacheEntry] = []
    in_use: list[ExportCacheEntry] = []
    failed: list[tuple[ExportCacheEntry, str]] = []
    limit = "no" if math.isinf(max_bytes) else f"{max_bytes / _MB:,.0f} MB"
    for entry in listing.entries:
        if total <= max_bytes:
            break
        if entry.name in keep:
            continue
        why = _remove(entry)
        if why is None or why == "gone":
            total -= entry.size_bytes
            if why is None:
                removed.append(entry)
                log.info("predict: export cache over its %s limit: removed %s", limit, entry.describe())
        elif why == "in use":
            in_use.append(entry)
            log.info("predict: export cache: kept %s, in use by another process", entry.name)
        else:
            failed.append((entry, why))
            log.warning("predict: export cache: cannot remove %s (%s)", entry.folder, why)
    if total > max_bytes and listing.others:
        names = ", ".join(p.name for p, _ in listing.others[:5])
        log.info("predict: export cache: %d item(s) gpufeed did not write left alone (%s)", len(listing.others), names)
    return ExportCachePrune(removed, in_use, failed, total)
