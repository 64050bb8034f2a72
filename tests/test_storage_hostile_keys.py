"""Object-store keys and objects that used to hang, escape or exhaust gpufeed, against a real S3 server (moto's).

A key with an empty, ``.`` or ``..`` part is skipped by every listing, named once in a warning; an
image object is read by ranges, never whole; a body that breaks while it streams is fetched again.
"""

from __future__ import annotations

import errno
import io
import itertools
import logging
import tracemalloc

import pytest
from PIL import Image

from gpufeed.core import _s3
from gpufeed.core._storage import S3Path, data_path, read_range, walk
from gpufeed.pipelines import check_path, read_image_facts
from gpufeed.pipelines._videos import list_videos

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]


def _put(bucket: S3Path, key: str, body: bytes = b"junk") -> None:
    """Write an object under a raw key: ``ObjectPath`` would normalise the hostile ones away."""
    _s3.client().put_object(Bucket=bucket.bucket, Key=key, Body=body)


def _jpeg(size: tuple[int, int] = (32, 24)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 90)).save(out, "JPEG")
    return out.getvalue()


def _warnings(caplog, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and repr(key) in r.getMessage()]


def test_walk_of_a_prefix_holding_an_empty_key_part_ends_and_skips_that_key(s3_bucket, caplog):
    _put(s3_bucket, "data/m1.mp4")
    _put(s3_bucket, "data//a.mp4")
    root = s3_bucket / "data"
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        listed = list(itertools.islice(walk(root), 10))  # it used to yield the root forever
        assert listed == [(str(root), [], ["m1.mp4"])]
        assert list(data_path(root).iterdir()) == [root / "m1.mp4"]
        assert list_videos(root)[0] == [str(root / "m1.mp4")]
    named = _warnings(caplog, "data//a.mp4")
    assert len(named) == 1, [r.getMessage() for r in caplog.records]
    assert s3_bucket.bucket in named[0] and "empty part" in named[0] and "skipped" in named[0]


def test_keys_with_dot_dot_parts_never_take_a_listing_outside_its_prefix(s3_bucket, caplog):
    _put(s3_bucket, "videos/ok.mp4")
    _put(s3_bucket, "videos/../../evil.mp4")
    _put(s3_bucket, "data/x/../../private/secret.mp4")
    _put(s3_bucket, "data/./y.mp4")
    _put(s3_bucket, "private/secret.mp4", b"another object")
    videos, data = s3_bucket / "videos", s3_bucket / "data"
    with caplog.at_level(logging.WARNING, logger="gpufeed"):
        _s3._snapshots.clear()  # list one level through the server, not a remembered listing
        assert list(data_path(videos).iterdir()) == [videos / "ok.mp4"]  # was [s3://bucket, ...]
        assert list(data_path(videos).glob("*.mp4")) == [videos / "ok.mp4"]
        assert list(walk(videos)) == [(str(videos), [], ["ok.mp4"])]
        assert list(walk(data)) == [(str(data), [], [])]  # was s3://bucket and s3://bucket/private
        assert list(data_path(videos).iterdir()) == [videos / "ok.mp4"]  # now from the snapshot
    assert len(_warnings(caplog, "data/x/../../private/secret.mp4")) == 1
    assert any("'..' part" in m and "gpufeed cannot address it" in m for m in _warnings(caplog, "videos/../"))
    assert any("'.' part" in m for m in _warnings(caplog, "data/./y.mp4"))


def test_check_of_a_prefix_with_an_escaping_key_reports_instead_of_raising(s3_bucket):
    _put(s3_bucket, "videos/bad.mp4")
    _put(s3_bucket, "videos/../../evil.mp4")
    report = check_path(str(s3_bucket / "videos"), progress=False)  # raised ValueError: s3://... has an empty name
    assert report is not None


def test_an_image_object_is_read_by_ranges_never_whole(s3_bucket):
    head = _jpeg()
    sos = head.index(b"\xff\xda")
    header = head[: sos + 2 + int.from_bytes(head[sos + 2 : sos + 4], "big")]
    huge = header + bytes(64 * 1024 * 1024)  # a header, then 64 MiB with no end marker
    _put(s3_bucket, "img/a/huge.jpg", huge)
    _put(s3_bucket, "img/a/fine.jpg", head + b"trailing video" * 100)
    url = str(s3_bucket / "img/a/huge.jpg")

    tracemalloc.start()
    try:
        quick = read_image_facts(url, header_only=True)
        _, quick_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        full = read_image_facts(url)
        _, full_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert quick.problem is None and (quick.width, quick.height) == (32, 24) and quick.size_bytes == len(huge)
    assert quick_peak < 8 * 1024 * 1024, quick_peak
    assert full.problem is not None and f"{len(huge):,}-byte object" in full.problem and "\n" not in full.problem
    assert full_peak < 16 * 1024 * 1024, full_peak  # whole, it was 64 MiB and more

    fine = read_image_facts(str(s3_bucket / "img/a/fine.jpg"))
    assert fine == read_image_facts(head + b"trailing video" * 100)


@pytest.fixture
def broken_bodies(s3_server, monkeypatch):
    """Make the next ``n`` GET bodies of this process's real client fail while streaming (the network's part)."""
    from botocore.exceptions import ResponseStreamingError

    failing = [0]

    class Broken:
        def read(self, *args):
            raise ResponseStreamingError(error="Connection reset by peer")

        def close(self):
            pass

    def break_body(parsed, **_):
        if failing[0] > 0:
            failing[0] -= 1
            parsed["Body"] = Broken()

    monkeypatch.setattr(_s3, "_BODY_BACKOFF_S", 0.0, raising=False)
    events = _s3.client().meta.events
    events.register("after-call.s3.GetObject", break_body, unique_id="gpufeed-test-broken-body")
    yield failing
    events.unregister("after-call.s3.GetObject", unique_id="gpufeed-test-broken-body")


def test_a_body_that_breaks_mid_stream_is_fetched_again(s3_bucket, broken_bodies):
    payload = bytes(range(256)) * 40
    _put(s3_bucket, "v.mp4", payload)
    path = s3_bucket / "v.mp4"
    broken_bodies[0] = 1
    assert read_range(path, 100, 1000) == payload[100:1100]
    broken_bodies[0] = 2
    assert path.read_bytes() == payload
    assert broken_bodies[0] == 0


def test_a_body_that_never_streams_is_one_line_after_the_last_try(s3_bucket, broken_bodies):
    _put(s3_bucket, "v.mp4", b"x" * 100)
    broken_bodies[0] = 1000
    with pytest.raises(OSError) as caught:
        read_range(s3_bucket / "v.mp4", 0, 10)
    assert str(caught.value) == f"{s3_bucket / 'v.mp4'}: reading failed (ResponseStreamingError)"
    assert 1000 - broken_bodies[0] > 1  # tried again before giving up


def test_without_boto3_every_request_is_the_one_line_install_hint(monkeypatch):
    """A wheel installed without the s3 extra: ``gpufeed check s3://...`` printed botocore's ImportError traceback."""
    import sys

    for name in ("boto3", "botocore", "botocore.config", "botocore.exceptions"):
        monkeypatch.setitem(sys.modules, name, None)  # as if not installed: importing raises ImportError
    monkeypatch.setattr(_s3, "_clients", {})
    for call in (lambda: _s3.list_tree(S3Path("s3://bucket/img")), lambda: read_range("s3://bucket/a.jpg", 0, 10)):
        with pytest.raises(OSError, match=r"^reading s3:// needs boto3: pip install 'gpufeed\[s3\]'$"):
            call()


def test_expired_listings_are_let_go_in_a_long_lived_process(monkeypatch):
    """A server or a notebook lists many prefixes: each listing is kept a minute, not for the process's life."""
    clock = [1000.0]
    monkeypatch.setattr(_s3.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(_s3, "_snapshots", {})
    for k in range(100):
        _s3._remember(S3Path(f"s3://bucket/prefix-{k}"), {})
        clock[0] += 10.0  # ten seconds between listings
    assert len(_s3._snapshots) <= 7, "at most the listings of the last minute"
    assert _s3._snapshot_of(S3Path("s3://bucket/prefix-99")) == {}


def test_an_object_overwritten_while_open_fails_its_next_read_instead_of_mixing_versions(
    s3_bucket, monkeypatch, tmp_path
):
    """Each ranged GET carries the version the file was opened at: the new version's bytes are never joined on."""
    from gpufeed.core import _storage_settings

    monkeypatch.setenv(_storage_settings.ENV_BLOCK_BYTES, "4096")
    monkeypatch.setenv(_storage_settings.ENV_CACHE_DIR, str(tmp_path / "cache"))
    first, second = bytes(range(256)) * 64, bytes(255 - b for b in range(256)) * 64  # 16 KiB each
    _put(s3_bucket, "v/a.mp4", first)
    path = s3_bucket / "v/a.mp4"
    with path.open() as fh:
        assert fh.read(100) == first[:100]  # one block read, at the first version
        _put(s3_bucket, "v/a.mp4", second)  # the same size: only the version says they differ
        fh.seek(9000)
        with pytest.raises(OSError) as caught:
            fh.read(100)  # it returned second[9000:9100], and cached it as the first version's
    assert caught.value.errno == errno.ESTALE
    assert str(caught.value) == f"{path}: it changed while it was being read (a new version); read it again"
    _s3._snapshots.clear()
    with path.open() as fh:  # opened again: the new version, whole
        assert fh.read() == second


def test_a_cached_copy_is_never_made_of_two_versions(s3_bucket, monkeypatch, tmp_path):
    from gpufeed.core._blob_cache import BlockCache

    _put(s3_bucket, "v/b.mp4", b"a" * 5000)
    path = s3_bucket / "v/b.mp4"
    old = _s3.stat(path)
    _put(s3_bucket, "v/b.mp4", b"b" * 5000)
    monkeypatch.setattr(_s3, "stat", lambda _p: old)  # the version it listed, overwritten before the copy
    cache = BlockCache(tmp_path / "cache", 1 << 20)
    with pytest.raises(OSError) as caught:
        cache.materialize(path)
    assert caught.value.errno == errno.ESTALE
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()], "no copy, whole or partial, is left"
