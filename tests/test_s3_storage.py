"""The storage layer against a real S3 server (moto's, on 127.0.0.1): listing, ranged reads, errors without secrets."""

from __future__ import annotations

import errno
import os
import random

import pytest
from _s3server import upload_tree

from gpufeed.core import _s3
from gpufeed.core._storage import S3Path, local_file, open_binary, stat_key, walk

pytestmark = pytest.mark.live


def _tree(root):
    (root / "a" / "deep").mkdir(parents=True)
    (root / "b").mkdir()
    (root / "top.txt").write_text("top")
    (root / "a" / "one.bin").write_bytes(random.Random(0).randbytes(300_000))
    (root / "a" / "deep" / "two.txt").write_text("two")
    (root / "b" / "three.txt").write_text("three")


def test_walk_of_a_bucket_is_os_walk_of_the_same_files(tmp_path, s3_bucket):
    _tree(tmp_path / "data")
    upload_tree(tmp_path / "data", s3_bucket / "data")
    local = [
        (os.path.relpath(d, tmp_path / "data"), sorted(ds), sorted(fs)) for d, ds, fs in os.walk(tmp_path / "data")
    ]
    remote = [(d, ds, fs) for d, ds, fs in walk(s3_bucket / "data")]
    prefix = str(s3_bucket / "data")
    remote_rel = [("." if d == prefix else d[len(prefix) + 1 :], ds, fs) for d, ds, fs in remote]
    assert sorted(remote_rel) == sorted(local)
    pruned = []
    for dirpath, dirnames, _ in walk(s3_bucket / "data"):
        pruned.append(dirpath)
        dirnames[:] = [d for d in dirnames if d != "a"]
    assert not any("/a" in p for p in pruned)
    one = s3_bucket / "data" / "a" / "one.bin"
    assert one.is_file() and (s3_bucket / "data" / "a").is_dir() and not (s3_bucket / "data" / "nope").exists()
    assert stat_key(one)[0] == 300_000


def test_a_listing_of_a_keys_children_does_not_hide_the_object_itself(s3_bucket):
    """The listing of ``one.jpg/`` is empty; the object ``one.jpg`` is still there (it "did not exist")."""
    _s3.put_bytes(s3_bucket / "one.jpg", b"jpeg")
    _s3.put_bytes(s3_bucket / "folder" / "a.jpg", b"a")
    assert _s3.list_tree(s3_bucket / "one.jpg") == [] and _s3.list_tree(s3_bucket / "folder")
    assert (s3_bucket / "one.jpg").is_file() and stat_key(s3_bucket / "one.jpg")[0] == 4
    assert (s3_bucket / "folder").is_dir() and not (s3_bucket / "folder").is_file()
    assert not (s3_bucket / "one.jpg.missing").exists()


def test_ranged_reads_fetch_what_is_read(tmp_path, s3_bucket):
    data = random.Random(1).randbytes(5 << 20)
    key = s3_bucket / "big.bin"
    _s3.put_bytes(key, data)
    before = _s3.fetch_stats()
    with open_binary(str(key)) as fh:
        fh.seek(2 << 20)
        assert fh.read(1000) == data[2 << 20 : (2 << 20) + 1000]  # exact: bytes
    spent = _s3.fetch_stats() - before
    assert spent.requests == 1 and spent.bytes == 1 << 20  # one block of the default size, not 5 MiB


def test_a_missing_object_and_an_unreachable_store_are_one_line_without_the_secret(s3_server, s3_bucket, monkeypatch):
    missing = s3_bucket / "no" / "such.mp4"
    with pytest.raises(OSError) as caught:
        open_binary(str(missing))
    assert caught.value.errno == errno.ENOENT
    assert str(missing) in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(OSError, match=r"set storage\.cache_dir"):
        local_file(str(s3_bucket / "x.mp4"))
    closed = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(OSError, match=r"cannot reach the object store at http://127\.0\.0\.1") as unreachable:
        S3Path(str(missing)).stat()
    for err in (caught.value, unreachable.value):
        assert s3_server.secret not in str(err) and s3_server.secret not in repr(err)
        assert err.__cause__ is None and (err.__context__ is None or err.__suppress_context__)  # no botocore traceback


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
