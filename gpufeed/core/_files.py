"""Atomic file writes and JSON output, shared by every part of gpufeed that writes results.

A reader (a resumed run, Prometheus reading a target list) may open a file at any moment, and a
process may be killed mid-write. An atomic write therefore goes to a hidden temporary file beside
the target, is flushed to disk, and is renamed over the target: the target is either the old file,
the complete new one, or absent.

The bottom layer: anything in gpufeed may import it, and it imports nothing of gpufeed's.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "finite", "fsync_dir", "remove_stale_temps", "temp_path", "write_atomic", "write_json"]


def temp_path(path: str | Path) -> Path:
    """The hidden temporary file a write of ``path`` goes through: ``.<name>.tmp-<pid>``.

    The leading dot keeps it out of globs of the real files (``ckpt-*.pt``, ``*.mp4``); the pid
    keeps two processes writing the same target apart, and tells whose write a stale one was.
    """
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


def remove_stale_temps(path: str | Path, idle_s: float = 600.0) -> list[Path]:
    """Remove the temporary files of writes of ``path`` whose writer was killed; return them.

    A write killed before its rename leaves ``.<name>.tmp-<pid>`` behind. One counts as stale when no
    process of that pid runs here and it has not changed for ``idle_s`` seconds: a writer on another
    machine sharing the folder (whose pid means nothing here) keeps its file changing while it writes.
    """
    path = Path(path)
    prefix = f".{path.name}.tmp-"
    removed: list[Path] = []
    try:
        entries = list(os.scandir(path.parent))
    except OSError:
        return removed
    now = time.time()
    for entry in entries:
        pid = entry.name[len(prefix) :] if entry.name.startswith(prefix) else ""
        if not pid.isdigit() or int(pid) == os.getpid() or _runs(int(pid)):
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime < idle_s:
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(Path(entry.path))
    return removed


def fsync_dir(folder: str | Path) -> None:
    """``fsync`` a folder, so a rename inside it survives a power cut (a no-op where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | Path, *, sync_dir: bool = False) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to, renamed over ``path`` on success.

    For writers that want a file name rather than bytes (an encoder, an exporter). The folder must
    exist. When the block raises, the temporary file is removed and ``path`` is untouched.

    Args:
        path: The file to replace.
        sync_dir: Also ``fsync`` the folder after the rename, so the rename itself is durable
            (checkpoints, which a resume must find after a crash).

    Yields:
        The temporary path (:func:`temp_path`); the block creates and closes the file.
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def write_atomic(path: str | Path, data: str | bytes, *, sync_dir: bool = False) -> Path:
    """Write ``data`` (text as UTF-8, or bytes) to ``path`` atomically, creating missing folders.

    Args:
        path: The file to write.
        data: Its whole new content.
        sync_dir: ``fsync`` the folder after the rename (see :func:`atomic_path`).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    with atomic_path(path, sync_dir=sync_dir) as tmp, open(tmp, "wb") as fh:
        fh.write(raw)
    return path


def write_json(
    path: str | Path, document: Any, *, compact: bool = False, allow_nan: bool = True, atomic: bool = False
) -> Path:
    """Write ``document`` as JSON to ``path``, creating missing folders.

    The text is built before the file is opened, so a document ``json`` rejects leaves no file.

    Args:
        path: The file to write.
        document: Anything ``json.dumps`` takes.
        compact: One line without spaces (caches); otherwise indented by two with a final newline
            (documents people read).
        allow_nan: ``False`` raises on NaN or infinity rather than writing JSON other tools reject.
        atomic: Write through :func:`write_atomic` (for files others read while they change).
            Otherwise the file is written in place, so a symlink is written through and a write
            error (a full disk) is the caller's to report.

    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    """
    if compact:
        text = json.dumps(document, separators=(",", ":"), allow_nan=allow_nan)
    else:
        text = json.dumps(document, indent=2, allow_nan=allow_nan) + "\n"
    if atomic:
        return write_atomic(path, text)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def finite(tree: Any) -> Any:
    """``tree`` with NaN and infinities as ``None``, so it is standard JSON (which has neither).

    Args:
        tree: Dicts, lists and tuples (tuples become lists) of JSON-able leaves.

    Returns:
        A copy of ``tree``; non-finite floats are ``None``, other leaves are unchanged.
    """
    if isinstance(tree, dict):
        return {k: finite(v) for k, v in tree.items()}
    if hasattr(tree, "config_value"):  # a SizePx stays one value: a --json report spells it as the config does
        return tree
    if isinstance(tree, (list, tuple)):
        return [finite(v) for v in tree]
    if isinstance(tree, float) and not math.isfinite(tree):
        return None
    return tree
