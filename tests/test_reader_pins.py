"""Objects copied for DALI's video reader stay on disk while it reads them (a real S3 server, moto's).

DALI's reader opens local files only, so videos in object storage are copied whole into the
bounded cache (``storage.cache_dir``). Copying a reader's videos one after another used to evict
the first copies to make room for the last, and DALI was handed paths that no longer existed;
another process's eviction could do the same, or remove a file that process was still writing.
Pinned copies are never evicted (that freed no disk and hid their bytes from the bound) and count
for every reader; where the file system has no hard links they are copies; a pin folder of
another host sharing the cache is not judged by its pid.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import time
from pathlib import Path

import pytest
from _s3server import upload_tree

from gpufeed.core import ObjectPath, storage_cache
from gpufeed.core._blob_cache import BlockCache, host_tag
from gpufeed.core._files import _runs
from gpufeed.core._storage_settings import ENV_CACHE_DIR, ENV_CACHE_MAX_BYTES
from gpufeed.pipelines._object_media import reader_local_paths

pytestmark = pytest.mark.live

SIZES = (5_300, 6_200, 4_300)


def _videos(tmp_path, s3_bucket, sizes=SIZES) -> list[str]:
    folder = tmp_path / "videos"
    folder.mkdir()
    for k, size in enumerate(sizes):
        (folder / f"m{k}.mp4").write_bytes(random.Random(k).randbytes(size))
    return [str(p) for p in upload_tree(folder, s3_bucket / "videos")]


def _use_cache(monkeypatch, folder, max_bytes: int) -> BlockCache:
    monkeypatch.setenv(ENV_CACHE_DIR, str(folder))
    monkeypatch.setenv(ENV_CACHE_MAX_BYTES, str(max_bytes))
    cache = storage_cache()
    assert cache is not None and cache.max_bytes == max_bytes
    return cache


def _on_disk(root) -> int:
    """The bytes of the files under ``root``, each once (a hard link is its file's own bytes)."""
    held = {}
    for path in Path(root).rglob("*"):
        if path.is_file():
            st = path.stat()
            held[st.st_dev, st.st_ino] = st.st_size
    return sum(held.values())


def _gone_pid() -> int:
    return next(pid for pid in range(4_000_000, 3_000_000, -997) if not _runs(pid))


def test_a_readers_copies_outlive_the_evictions_their_copying_makes(tmp_path, s3_bucket, monkeypatch):
    urls = _videos(tmp_path, s3_bucket)
    cache = _use_cache(monkeypatch, tmp_path / "cache", 16_000)
    cache.put("older", bytes(2_000))
    # The videos fit (15,800 of 16,000 bytes), but with the older entry the third copy passes the
    # bound: eviction takes the older entry, never a copy already pinned (that would free nothing).
    keep: list = []
    local = reader_local_paths(urls, keep)
    assert cache.evicted == 1, "the older entry was not evicted: the test shows nothing"
    for url, path, size in zip(urls, local, SIZES, strict=True):
        assert os.path.isfile(path), f"{url}: the reader's copy {path} is gone"
        assert os.path.getsize(path) == size
    assert len(list((tmp_path / "cache" / "objects").rglob("*.mp4"))) == 3, "a pinned entry was evicted"
    before = cache.total_bytes()
    assert before == sum(SIZES) == _on_disk(tmp_path / "cache"), "the readers' links are counted once"
    for folder in keep:
        folder.cleanup()
    assert not any(os.path.exists(p) for p in local)


def test_a_reader_whose_videos_cannot_fit_is_refused_in_one_line(tmp_path, s3_bucket, monkeypatch):
    urls = _videos(tmp_path, s3_bucket)
    _use_cache(monkeypatch, tmp_path / "cache", 14_000)
    with pytest.raises(OSError, match=r"storage\.cache_max_bytes \(14,000 bytes\)") as refused:
        reader_local_paths(urls, [])
    assert "\n" not in str(refused.value) and "video.decoder: pyav" in str(refused.value)


def test_a_readers_pins_stay_in_the_bound_and_a_reader_that_does_not_fit_beside_them_is_refused(
    tmp_path, s3_bucket, monkeypatch
):
    urls = _videos(tmp_path, s3_bucket, sizes=(5_000,) * 6)
    root = tmp_path / "cache"
    cache = _use_cache(monkeypatch, root, 16_000)
    train: list = []
    reader_local_paths(urls[:3], train)  # 15,000 of 16,000 bytes, pinned while the train reader runs
    val: list = []
    pattern = r"with the 15,000 bytes other readers of .* hold pinned, hold more than storage\.cache_max_bytes"
    with pytest.raises(OSError, match=pattern) as refused:
        reader_local_paths(urls[3:], val)  # alone it fits; beside the train reader's pins it does not
    assert "\n" not in str(refused.value)
    for folder in val:  # what the reader source does when its open fails
        folder.cleanup()
    assert cache.evicted == 0, "a pinned entry was evicted: it freed no disk, and its video is copied again"
    assert cache.total_bytes() == _on_disk(root)
    misses = cache.misses
    rank1: list = []
    assert reader_local_paths(urls[:3], rank1), "another rank's reader of the same videos shares their files"
    assert cache.misses == misses, "a pinned video was downloaded a second time"
    for folder in train + rank1:
        folder.cleanup()
    val = []
    local = reader_local_paths(urls[3:], val)  # fits once the train readers closed
    assert all(os.path.getsize(p) == 5_000 for p in local)
    assert cache.total_bytes() == _on_disk(root) <= 16_000


def test_without_hard_links_a_reader_gets_copies_counted_against_the_bound(tmp_path, s3_bucket, monkeypatch, caplog):
    urls = _videos(tmp_path, s3_bucket)
    root = tmp_path / "cache"
    cache = _use_cache(monkeypatch, root, 40_000)

    def no_link(src, dst, **_kw):  # what vfat/exFAT, many FUSE mounts and SMB answer link(2)
        raise OSError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))

    monkeypatch.setattr(os, "link", no_link)
    keep: list = []
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        local = reader_local_paths(urls, keep)
        again = reader_local_paths(urls[:1], keep)  # a second reader: a copy of its own, no second warning
    told = [r.getMessage() for r in caplog.records if "hard links" in r.getMessage()]
    assert len(told) == 1 and "EPERM" in told[0] and "storage.cache_max_bytes" in told[0], told
    for path, size in zip(local + again, SIZES + SIZES[:1], strict=True):
        assert Path(path).stat().st_size == size and Path(path).stat().st_nlink == 1
    assert cache.total_bytes() == _on_disk(root) == 2 * sum(SIZES) + SIZES[0], "a reader's copy is not counted"
    for k in range(10):  # past the bound: the entries go, the readers' copies stay
        cache.put(f"block-{k}", bytes(3_000))
    assert cache.evicted > 0 and all(Path(p).stat().st_size == s for p, s in zip(local, SIZES, strict=True))
    assert cache.total_bytes() == _on_disk(root) <= 40_000


def test_a_pin_copies_again_each_time_another_process_evicts_the_entry_first(tmp_path, s3_bucket, monkeypatch):
    urls = _videos(tmp_path, s3_bucket)
    cache = BlockCache(tmp_path / "cache", 100_000)
    real_link, lost, races = os.link, [], 2

    def evicted_first(src, dst, **kw):  # another process's eviction lands between the copy and the link
        if len(lost) < races:
            lost.append(src)
            os.unlink(src)
        return real_link(src, dst, **kw)

    monkeypatch.setattr(os, "link", evicted_first)
    folder = cache.pin_folder()
    link = cache.pin(ObjectPath(urls[0]), folder.name)
    assert len(lost) == 2 and link.stat().st_size == SIZES[0] and cache.misses == 3
    races = 1_000  # every time: refused in one line, not looping for ever
    with pytest.raises(OSError, match=r"evicted its copy .* storage\.cache_max_bytes") as refused:
        cache.pin(ObjectPath(urls[1]), folder.name)
    assert "\n" not in str(refused.value) and len(lost) < 20
    folder.cleanup()


def test_eviction_leaves_files_being_written_and_removes_a_crashed_readers_links(tmp_path):
    cache = BlockCache(tmp_path / "cache", max_bytes=30_000)
    cache.put("a", bytes(10_000))
    entry = next(p for p in (tmp_path / "cache" / "blocks").rglob("*") if p.is_file())
    writing = entry.with_name(f".{entry.name}.123.456.tmp")  # another process's copy in flight
    writing.write_bytes(bytes(10_000))
    crashed = tmp_path / "cache" / "readers" / f"{_gone_pid()}@{host_tag()}@x"  # no such process here
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


def test_a_pin_folder_of_another_host_is_kept_until_it_has_long_been_idle(tmp_path):
    cache = BlockCache(tmp_path / "cache", max_bytes=30_000)
    mine = cache.pin_folder()
    assert Path(mine.name).name.startswith(f"{os.getpid()}@{host_tag()}@")
    readers, gone = tmp_path / "cache" / "readers", _gone_pid()
    # A container sharing a hostPath cache, or a node sharing it on NFS: its pid means nothing here.
    elsewhere = readers / f"{gone}@other-node.0123456789abcdef.4026531836@a"
    older = readers / f"{gone}-b"  # an older gpufeed's name: its host is unknown
    dead_here = readers / f"{gone}@{host_tag()}@c"
    alive_here = readers / f"{os.getppid()}@{host_tag()}@d"
    for folder in (elsewhere, older, dead_here, alive_here):
        folder.mkdir()
    cache.total_bytes()  # lists the folder, as a write past the bound does
    assert elsewhere.exists() and older.exists(), "a live reader of another host lost its folder"
    assert not dead_here.exists() and alive_here.exists()
    idle = time.time() - 2 * 86_400
    for folder in (elsewhere, older, alive_here):
        os.utime(folder, (idle, idle))
    cache.total_bytes()
    assert not elsewhere.exists() and not older.exists(), "another host's folder idle for two days was kept"
    assert alive_here.stat().st_mtime > idle + 86_400, "a live reader's folder is not shown alive to other hosts"
    assert Path(mine.name).is_dir()
    mine.cleanup()
