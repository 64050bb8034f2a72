"""Object-store paths, ranged reads and the bounded disk cache, in process (no server: see test_s3_storage.py)."""

from __future__ import annotations

import logging
import pickle
import random
from pathlib import Path, PurePosixPath

import pytest

from gpufeed.config import parse_config
from gpufeed.core._blob_cache import BlockCache
from gpufeed.core._object_path import ObjectPath, is_object_url
from gpufeed.core._ranged import RangedFile
from gpufeed.core._schema import ConfigError
from gpufeed.core._storage import data_path


def test_object_path_joins_and_names_like_a_path():
    root = ObjectPath("s3://my-bucket/data/videos/")
    assert str(root) == "s3://my-bucket/data/videos"
    clip = root / "mouse.day1" / "m1.mp4"
    assert str(clip) == "s3://my-bucket/data/videos/mouse.day1/m1.mp4"
    assert (clip.name, clip.stem, clip.suffix) == ("m1.mp4", "m1", ".mp4")
    assert str(clip.with_suffix(".csv")) == "s3://my-bucket/data/videos/mouse.day1/m1.csv"
    assert clip.parent.parent == root
    assert clip.relative_to(root) == PurePosixPath("mouse.day1/m1.mp4")
    assert clip.is_relative_to(root) and not ObjectPath("s3://my-bucket/data/videosX").is_relative_to(root)
    assert str(root / "a/./b//c/../d") == "s3://my-bucket/data/videos/a/b/d"
    assert sorted([root / "b", root / "a"]) == [root / "a", root / "b"]
    assert pickle.loads(pickle.dumps(clip)) == clip  # DALI's workers receive them pickled


def test_object_path_refuses_what_s3_cannot_name():
    with pytest.raises(ValueError, match="climbs above the bucket"):
        ObjectPath("s3://my-bucket/../other/key")
    with pytest.raises(ValueError, match="is not a bucket name"):
        ObjectPath("s3://My_Bucket/key")
    with pytest.raises(ValueError, match="not an object-store URL"):
        ObjectPath("/local/path")
    with pytest.raises(ValueError, match="climbs above the bucket"):
        ObjectPath("s3://my-bucket/a") / "../../b"


def test_data_path_keeps_urls_that_pathlib_would_mangle():
    assert data_path("s3://bucket-1/x/y") == ObjectPath("s3://bucket-1/x/y")
    assert str(Path("s3://bucket-1/x")) == "s3:/bucket-1/x"  # why data_path exists
    assert data_path("rel/dir") == Path("rel/dir")
    assert is_object_url("s3://bucket-1/k") and not is_object_url("/s3/bucket")
    with pytest.raises(ValueError, match=r"gs:// is not read here"):
        data_path("gs://bucket-1/x")


def test_config_reads_s3_roots_and_refuses_urls_where_a_local_path_is_needed(tmp_path):
    cfg = parse_config(
        {"data": {"train": {"root": "s3://bucket-1/images/train"}}, "video": {"train": "s3://bucket-1/videos"}},
        base_dir=tmp_path,
    )
    assert cfg.data.train.root == ObjectPath("s3://bucket-1/images/train")  # not resolved against base_dir
    assert cfg.video.train == ObjectPath("s3://bucket-1/videos")
    with pytest.raises(ConfigError, match=r"loader\.quarantine_file.*local path"):
        parse_config({"loader": {"quarantine_file": "s3://bucket-1/q.txt"}})


def _source(data: bytes):
    calls = []

    def fetch(start: int, length: int) -> bytes:
        calls.append((start, length))
        return data[start : start + length]

    return fetch, calls


def test_ranged_file_reads_exactly_the_bytes_at_any_position():
    data = random.Random(0).randbytes(1_000_003)
    fetch, _ = _source(data)
    file = RangedFile("mem", len(data), fetch, block_bytes=4096, max_blocks=4)
    rng = random.Random(1)
    for _ in range(300):
        start = rng.randrange(0, len(data) + 10)
        length = rng.randrange(0, 20_000)
        file.seek(start)
        assert file.read(length) == data[start : start + length]  # exact: bytes
    file.seek(-5, 2)
    assert file.read() == data[-5:]


def test_ranged_file_fetches_a_clip_not_the_file():
    """A seek and a GOP-sized read fetch the blocks around it; a sequential pass grows its fetches."""
    data = bytes(64 << 20)
    fetch, calls = _source(data)
    file = RangedFile("mem", len(data), fetch, block_bytes=256 << 10)
    file.seek(40 << 20)
    for _ in range(10):
        file.read(32 << 10)  # how FFmpeg reads: 32 KiB at a time
    assert file.bytes_fetched <= 512 << 10 and file.requests <= 2
    calls.clear()
    whole = RangedFile("mem", len(data), fetch, block_bytes=256 << 10)
    while whole.read(32 << 10):
        pass
    assert whole.bytes_fetched == len(data)
    assert whole.requests < 30  # read-ahead doubles to 4 MiB: 256 one-block requests otherwise
    assert max(length for _, length in calls) == 4 << 20


def test_block_cache_serves_blocks_again_and_holds_its_bound(tmp_path):
    cache = BlockCache(tmp_path / "cache", max_bytes=100_000)
    data = random.Random(2).randbytes(300_000)
    fetch, calls = _source(data)
    first = RangedFile("mem", len(data), fetch, block_bytes=10_000, cache=cache, cache_key="k1")
    first.seek(50_000)
    assert first.read(25_000) == data[50_000:75_000]  # exact: bytes
    fetched = len(calls)
    second = RangedFile("mem", len(data), fetch, block_bytes=10_000, cache=cache, cache_key="k1")
    second.seek(50_000)
    assert second.read(25_000) == data[50_000:75_000]  # exact: bytes
    assert len(calls) == fetched and second.cache_hits == 3  # from the disk cache, nothing fetched
    for k in range(40):  # far more than the bound
        cache.put(f"other-{k}", bytes(10_000))
    assert cache.total_bytes() <= 100_000
    assert cache.evicted > 0


def test_a_read_larger_than_the_blocks_kept_in_memory_still_gets_every_byte():
    data = random.Random(3).randbytes(50_000)
    fetch, _ = _source(data)
    file = RangedFile("mem", len(data), fetch, block_bytes=1000, read_ahead_bytes=2000)  # 8 blocks kept
    file.seek(1500)
    assert file.read(40_000) == data[1500:41_500]  # exact: bytes; 41 blocks in one read
    assert file.read(100) == data[41_500:41_600]  # exact: bytes; the read-ahead blocks follow on


def test_unaddressable_keys_are_named_once_each_up_to_a_bound_then_once_in_all(monkeypatch, caplog):
    """A bucket of millions of ``a//b`` keys must not grow the process, nor the log, by a line each."""
    from gpufeed.core import _object_path

    monkeypatch.setattr(_object_path, "_warned", set())
    keys = [f"frames//{k:05d}.jpg" for k in range(_object_path._WARNED_MAX + 500)]
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        for _ in range(2):  # a second listing of the same keys names none of them again
            assert not any(_object_path.nameable_key("bucket", key) for key in keys)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == _object_path._WARNED_MAX + 1
    assert lines[0] == "key 'frames//00000.jpg' of s3://bucket has an empty part; gpufeed cannot address it, skipped"
    assert lines[-1].startswith("more keys gpufeed cannot address") and "s3://bucket" in lines[-1]
    assert len(_object_path._warned) == _object_path._WARNED_MAX + 1
