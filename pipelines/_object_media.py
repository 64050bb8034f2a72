"""Where the clip decoders meet object storage: which decoder reads ``s3://`` videos, and how.

* PyAV (the CPU path) opens an object as a ranged-read file (:func:`gpufeed._storage.media_source`):
  a clip fetches the blocks of its GOP, never the whole video.
* DALI's video reader (NVDEC on a GPU, VP8/VP9/MJPEG on a CPU) opens local files only (it has no
  ``s3://`` support, unlike DALI's file and webdataset readers): with ``storage.cache_dir`` set, the
  videos it reads are copied whole into the cache first (:func:`reader_local_paths`); without a
  cache, ``video.decoder: auto`` takes PyAV for a dataset in object storage
  (:func:`object_source_choice`).

The hooks the clip sources call are these two functions; both leave local datasets untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpufeed._object_path import is_object_url
from gpufeed._storage import local_file, storage_cache

__all__ = ["object_source_choice", "reader_local_paths"]


def object_source_choice(requested: str, infos, where: str) -> tuple[str, str] | None:
    """``("pyav", why)`` when ``video.decoder: auto`` meets encoded videos in object storage and no cache; else ``None``.

    Args:
        requested: ``video.decoder``.
        infos: The videos' :class:`~gpufeed.pipelines._videos.VideoInfo`.
        where: The dataset, for the reason.
    """
    remote = any(is_object_url(info.path) and not info.store for info in infos)
    if requested != "auto" or not remote or storage_cache() is not None:
        return None
    return "pyav", (
        f"video.decoder: auto; {where} is in object storage and storage.cache_dir is unset: PyAV worker processes "
        "read each clip's GOP by ranged reads (DALI's video reader opens local files only)"
    )


def reader_local_paths(paths: Sequence[str]) -> list[str]:
    """The paths DALI's video reader is given: local ones as they are, objects as their cached copies.

    Raises:
        OSError: An object, but no ``storage.cache_dir`` (the message says so), or it cannot be copied.
    """
    return [local_file(path) if is_object_url(path) else path for path in paths]
