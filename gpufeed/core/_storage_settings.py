"""Object storage settings (the ``storage`` config section) and this process's disk cache.

Settings reach every process through the environment: :func:`configure_storage` writes them there,
and DALI's worker processes, forked or spawned, inherit them (:func:`storage_settings` reads them
back). :mod:`gpufeed.core._storage` re-exports these names.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpufeed.core._blob_cache import BlockCache

__all__ = [
    "DEFAULT_BLOCK_BYTES",
    "DEFAULT_CACHE_MAX_BYTES",
    "ENV_BLOCK_BYTES",
    "ENV_CACHE_DIR",
    "ENV_CACHE_MAX_BYTES",
    "StorageSettings",
    "configure_storage",
    "storage_cache",
    "storage_settings",
]

ENV_CACHE_DIR = "GPUFEED_STORAGE_CACHE_DIR"
ENV_CACHE_MAX_BYTES = "GPUFEED_STORAGE_CACHE_MAX_BYTES"
ENV_BLOCK_BYTES = "GPUFEED_STORAGE_BLOCK_BYTES"
# The ``storage`` section's defaults (gpufeed.config reads them from here, the layer below it).
DEFAULT_CACHE_MAX_BYTES = 20 << 30
DEFAULT_BLOCK_BYTES = 1 << 20


class StorageSection(Protocol):
    """What :func:`configure_storage` reads of the config's ``storage`` section (``gpufeed.config.StorageConfig``,
    a layer above this one)."""

    @property
    def cache_dir(self) -> Path | None: ...
    @property
    def cache_max_bytes(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...


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


def configure_storage(cfg: StorageSection) -> None:
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
    return StorageSettings(
        os.environ.get(ENV_CACHE_DIR) or None,
        max(1, _int_env(ENV_CACHE_MAX_BYTES, DEFAULT_CACHE_MAX_BYTES)),
        max(4096, _int_env(ENV_BLOCK_BYTES, DEFAULT_BLOCK_BYTES)),
    )


_cache_lock = threading.Lock()
_caches: dict[tuple, BlockCache] = {}


def storage_cache() -> BlockCache | None:
    """This process's disk cache for the current settings, or ``None`` when ``storage.cache_dir`` is unset."""
    settings = storage_settings()
    if settings.cache_dir is None:
        return None
    key = (os.getpid(), settings.cache_dir, settings.cache_max_bytes)
    with _cache_lock:
        cache = _caches.get(key)
        if cache is None:
            cache = _caches[key] = BlockCache(settings.cache_dir, settings.cache_max_bytes)
        return cache
