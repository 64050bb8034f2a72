"""Objects copied for DALI's video reader stay on disk while it reads them (a real S3 server, moto's).

DALI's reader opens local files only, so videos in object storage are copied whole into the
bounded cache (``storage.cache_dir``). Copying a reader's videos one after another used to evict
the first copies to make room for the last, and DALI was handed paths that no longer existed;
another process's eviction could do the same, or remove a file that process was still writing.
"""

from __future__ import annotations

import os
import random
import time

import pytest
from _s3server import upload_tree

from gpufeed.core import storage_cache
from gpufeed.core._blob_cache import BlockCache
from gpufeed.core._storage_settings import ENV_CACHE_DIR, ENV_CACHE_MAX_BYTES
from gpufeed.pipelines._object_media import reader_local_paths

pytestmark = pytest.mark.live

SIZES = (5_300, 6_200, 4_300)


def _videos(tmp_path, s3_bucket) -> list[str]:
    folder = tmp_path / "videos"
    folder.mkdir()
    for k, size in enumerate(SIZES):
        (folder / f"m{k}.mp4").write_bytes(random.Random(k).randbytes(size))
    return [str(p) for p in upload_tree(folder, s3_bucket / "videos")]


def _use_cache(monkeypatch, folder, max_bytes: int) -> BlockCache:
    monkeypatch.setenv(ENV_CACHE_DIR, str(folder))
    monkeypatch.setenv(ENV_CACHE_MAX_BYTES, str(max_bytes))
    cache = storage_cache()
    assert cache is not None and cache.max_bytes == max_bytes
    return cache


def test_a_readers_copies_outlive_the_evictions_their_copying_makes(tmp_path, s3_bucket, monkeypatch):
    urls = _videos(tmp_path, s3_bucket)
    cache = _use_cache(monkeypatch, tmp_path / "cache", 16_000)
    cache.put("older", bytes(2_000))
    # The videos fit (15,800 of 16,000 bytes), but with the older entry the third copy passes the
    # bound, and eviction down to 90% takes the older entry and then the first copy.
    keep: list = []
    local = reader_local_paths(urls, keep)
    assert cache.evicted >= 2, "the first copy was not evicted: the test shows nothing"
    for url, path, size in zip(urls, local, SIZES, strict=True):
        assert os.path.isfile(path), f"{url}: the reader's copy {path} is gone"
        assert os.path.getsize(path) == size
    before = cache.total_bytes()
    assert before <= 16_000, "the readers' links are not counted twice against the bound"
    for folder in keep:
        folder.cleanup()
    assert not any(os.path.exists(p) for p in local)


def test_a_reader_whose_videos_cannot_fit_is_refused_in_one_line(tmp_path, s3_bucket, monkeypatch):
    urls = _videos(tmp_path, s3_bucket)
    _use_cache(monkeypatch, tmp_path / "cache", 14_000)
    with pytest.raises(OSError, match=r"storage\.cache_max_bytes \(14,000 bytes\)") as refused:
        reader_local_paths(urls, [])
    assert "\n" not in str(refused.value) and "video.decoder: pyav" in str(refused.value)


def test_eviction_leaves_files_being_written_and_removes_a_crashed_readers_links(tmp_path):
    cache = BlockCache(tmp_path / "cache", max_bytes=30_000)
    cache.put("a", bytes(10_000))
    entry = next(p for p in (tmp_path / "cache" / "blocks").rglob("*") if p.is_file())
    writing = entry.with_name(f".{entry.name}.123.456.tmp")  # another process's copy in flight
    writing.write_bytes(bytes(10_000))
    crashed = tmp_path / "cache" / "readers" / "999999999-x"  # no such process
    crashed.mkdir(parents=True)
    os.link(entry, crashed / entry.name)
    for k in range(6):
        cache.put(f"b{k}", bytes(10_000))
    assert writing.exists(), "a file being written was evicted under its writer"
    assert not crashed.exists(), "a dead process's reader folder was kept"
    old = time.time() - 2 * 3600
    os.utime(writing, (old, old))  # a crashed writer's leftover: evicted like any entry
    for k in range(6):
        cache.put(f"c{k}", bytes(10_000))
    assert not writing.exists()
