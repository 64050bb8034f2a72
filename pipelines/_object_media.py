"""Where the clip decoders meet object storage: which decoder reads ``s3://`` videos, and how.

* PyAV (the CPU path) opens an object as a ranged-read file (:func:`gpufeed.core._storage.media_source`):
  a clip fetches the blocks of its GOP, never the whole video.
* DALI's video reader (NVDEC on a GPU, VP8/VP9/MJPEG on a CPU) opens local files only (it has no
  ``s3://`` support, unlike DALI's file and webdataset readers): with ``storage.cache_dir`` set, the
  videos it reads are copied whole into the cache first (:func:`reader_local_paths`); without a
  cache, ``video.decoder: auto`` takes the PyAV source for a dataset in object storage
  (:func:`object_storage_reason`).

The hooks :func:`~gpufeed.pipelines._clip_sources.choose_clip_source` and the reader source call are
these two functions; both leave local datasets untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufeed.core import is_object_url, local_file, storage_cache

__all__ = ["object_storage_reason", "reader_local_paths"]


def object_storage_reason(requested: str, infos, where: str) -> str | None:
    """Why PyAV's ranged reads decode: ``video.decoder: auto``, encoded videos only, in object storage, no cache; else ``None``.

    Args:
        requested: ``video.decoder``.
        infos: The videos' :class:`~gpufeed.pipelines._videos.VideoInfo`.
        where: The dataset, for the reason.
    """
    remote = any(is_object_url(info.path) for info in infos)
    if requested != "auto" or not remote or any(info.store for info in infos) or storage_cache() is not None:
        return None
    return (
        f"video.decoder: auto; {where} is in object storage and storage.cache_dir is unset: PyAV worker processes "
        "read each clip's GOP by ranged reads (DALI's video reader opens local files only)"
    )


def reader_local_paths(paths: Sequence[str]) -> list[str]:
    """The paths DALI's video reader is given: local ones as they are, objects as their cached copies.

    Raises:
        OSError: An object, but no ``storage.cache_dir`` (the message says so), or it cannot be copied.
    """
    return [local_file(path) if is_object_url(path) else path for path in paths]
