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

import errno
from collections.abc import Sequence

from gpufeed.core import ObjectPath, is_object_url, local_file, storage_cache

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


def reader_local_paths(paths: Sequence[str], keep: list | None = None) -> list[str]:
    """The paths DALI's video reader is given: local ones as they are, objects as pinned cached copies.

    DALI opens every file of its list while the pipeline builds and reads them all the time it
    runs, so the copies are pinned (:meth:`~gpufeed.core._blob_cache.BlockCache.pin`): copying
    the next object must not evict one already listed, nor may another process's eviction.
    Pinned copies cannot be evicted, so this reader's, with those every other reader of the cache
    holds pinned (the same file counted once), must fit in ``storage.cache_max_bytes``, which is
    checked as they are copied.

    Args:
        paths: The reader's videos.
        keep: Where the pin folder goes (the reader's resources, cleaned up when it closes);
            ``None``: the copies are the cache's own entries, unpinned.

    Raises:
        OSError: An object, but no ``storage.cache_dir`` (the message says so); it cannot be
            copied; or the objects do not fit in the cache beside the other readers' (``EFBIG``).
    """
    remote = [p for p in paths if is_object_url(p)]
    cache = storage_cache() if remote else None
    if cache is None or keep is None:  # local only, or no cache (local_file says what to set)
        return [local_file(path) if is_object_url(path) else path for path in paths]
    folder = cache.pin_folder()
    keep.append(folder)
    held = cache.pinned()  # every reader's pins, by inode: a video other readers pin costs nothing more
    others = held_bytes = sum(held.values())
    pinned: dict[str, str] = {}
    for path in dict.fromkeys(remote):
        link = cache.pin(ObjectPath(path), folder.name)
        pinned[path] = str(link)
        st = link.stat()
        if (st.st_dev, st.st_ino) in held:  # a link to a file a reader already pins (another rank's): no more disk
            continue
        held[st.st_dev, st.st_ino] = st.st_size
        held_bytes += st.st_size
        if held_bytes > cache.max_bytes:
            others_too = f", with the {others:,} bytes other readers of {cache.root} hold pinned," if others else ""
            raise OSError(
                errno.EFBIG,
                f"the {len(set(remote))} videos of this reader from {ObjectPath(path).parent}{others_too} hold more "
                f"than storage.cache_max_bytes ({cache.max_bytes:,} bytes), and DALI's reader needs them all on disk "
                "at once: raise storage.cache_max_bytes, or set video.decoder: pyav (ranged reads, no copies)",
            )
    return [pinned.get(path, path) for path in paths]
