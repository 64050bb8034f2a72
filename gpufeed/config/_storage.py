"""Config section ``storage``: how gpufeed reads datasets kept in object storage (``s3://`` roots)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufeed.core import DEFAULT_BLOCK_BYTES, DEFAULT_CACHE_MAX_BYTES, option

__all__ = ["StorageConfig"]


@dataclass(frozen=True)
class StorageConfig:
    """Reading ``s3://bucket/prefix`` dataset roots (see the Object storage and shards page).

    The endpoint and credentials are AWS's standard settings (``AWS_ENDPOINT_URL`` or
    ``AWS_ENDPOINT_URL_S3``, ``AWS_PROFILE``, ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``), read
    by the AWS libraries themselves; nothing here names a credential.
    """

    cache_dir: Path | None = option(
        None,
        doc="local folder caching what gpufeed reads from object storage (blocks of ranged reads, whole videos "
        "for DALI's video reader); null: no disk cache, every epoch reads the store again",
    )
    cache_max_bytes: int = option(
        DEFAULT_CACHE_MAX_BYTES,
        ge=1 << 20,
        doc="bound on the cache folder: least recently used entries are deleted past it",
    )
    block_bytes: int = option(
        DEFAULT_BLOCK_BYTES,
        ge=4096,
        le=64 << 20,
        doc="unit of ranged reads of videos, HDF5 files and shards: a clip fetches the blocks around its GOP, "
        "not the file; sequential reads fetch ahead, up to 4 MiB at once. Each request costs CPU on both ends "
        "(1 MiB: 0.89x local disk's clips/s from a local S3 server, 256 KiB: 0.78x, 64 KiB: 0.60x; bench storage)",
    )
