"""What the image and video indexes share: where they are cached (beside the data, or in the user
cache when that is read-only), and which of their ids are usable."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.core import ObjectPath, write_json

__all__ = ["index_cache_path", "read_json_cache", "usable_ids", "write_json_atomic"]

CACHE_DIR_NAME = ".gpufeed"


def _user_cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpufeed" / "index"


def index_cache_path(data_dir: Path | ObjectPath, name: str) -> Path:
    """``data_dir/.gpufeed/name`` if that folder is writable, else a per-folder user cache path.

    A bucket prefix (``s3://...``) always takes the user cache path, keyed by its URL: gpufeed
    never writes into a dataset's bucket.
    """
    if isinstance(data_dir, ObjectPath):
        digest = hashlib.sha1(str(data_dir).encode()).hexdigest()[:16]
        return _user_cache_root() / digest / name
    beside = data_dir / CACHE_DIR_NAME
    try:
        beside.mkdir(exist_ok=True)
        if os.access(beside, os.W_OK):
            return beside / name
    except OSError:
        pass
    digest = hashlib.sha1(str(data_dir.resolve()).encode()).hexdigest()[:16]
    return _user_cache_root() / digest / name


def read_json_cache(path: Path) -> Any | None:
    """The cached JSON document, or ``None`` when missing or unreadable (it is then rebuilt)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json_atomic(path: Path, document: Any) -> None:
    """Write JSON through a temporary file and a rename, so readers never see half a file.

    Failing to write a cache is not an error: the index is rebuilt next time.
    """
    with contextlib.suppress(OSError):
        write_json(path, document, compact=True, atomic=True)


def usable_ids(count: int, problems: Iterable[int]) -> np.ndarray:
    """Ids ``0 .. count - 1`` of an index's entries, less those with a recorded problem, ascending."""
    ok = np.ones(count, dtype=bool)
    ok[list(problems)] = False
    return np.flatnonzero(ok)
