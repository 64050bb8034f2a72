"""The S3 client behind every object-store read gpufeed makes itself: standard AWS settings, one-line errors.

**Settings** are AWS's own, read by botocore; gpufeed passes none of them: the endpoint from
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` (or ``endpoint_url`` in the profile), credentials
from the environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``), the
profile (``AWS_PROFILE``, ``~/.aws/credentials`` and ``config``) or an instance role, the region
from ``AWS_REGION`` / ``AWS_DEFAULT_REGION``. DALI's own S3 reader (the AWS SDK for C++) reads the
same variables and files, so both see one configuration.

**One client per process** (and per set of settings): DALI's Python workers are forked or spawned
processes, and a client's connection pool must not cross a fork.

**Errors** are :class:`StorageError` (an ``OSError``: callers that name an unreadable file name
this one), a line naming the URL and what failed: not found, access denied, no credentials, the
endpoint cannot be reached. It is built from the error's code and HTTP status alone, never from a
request's headers, its signature or the credentials, so no secret reaches a log or a message.

**Listing snapshots.** Indexing a prefix lists it once (:func:`list_tree`); for a minute after,
questions about keys under it (does ``mouse1.csv`` exist, how large is it) are answered from that
listing instead of one request each.

**Keys gpufeed cannot name** (an empty, ``.`` or ``..`` part: ``data//a.mp4``) are left out of every
listing, each named once in a warning: read through a normalised path they would be another object
(:func:`~gpufeed.core._object_path.nameable_key`), or a folder outside the prefix listed. **Retries.**
botocore retries a request up to its response headers; a body that breaks while it streams (a
reset, a read timeout, fewer bytes than announced) is fetched again here, a few times. **One
version.** A file read in ranges sends each GET with the entity tag it was opened at (``If-Match``):
an object overwritten meanwhile fails the read in one line, instead of joining two versions' bytes
(and caching them under the first version's name).

**Accounting.** Every ranged or whole read counts its request and bytes in this process
(:func:`fetch_stats`): the benchmarks print bytes fetched per clip from it.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpufeed.core._object_path import ObjectPath, nameable_key

__all__ = [
    "FetchStats",
    "ObjectStat",
    "StorageError",
    "client",
    "endpoint_label",
    "fetch_stats",
    "has_children",
    "list_level",
    "list_tree",
    "lookup",
    "put_bytes",
    "read_object",
    "read_range",
    "stat",
    "upload_file",
]

ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
# What a new client is told besides AWS's settings: connections for the readers' threads, retries.
_MAX_CONNECTIONS, _SNAPSHOT_S = 64, 60.0
_BODY_TRIES, _BODY_BACKOFF_S = 4, 0.25  # a body that fails mid-stream: tries, first pause (doubled each time)
_lock = threading.Lock()
_clients: dict[tuple, object] = {}
_sessions: dict[tuple, object] = {}


class StorageError(OSError):
    """An object-store read failed; ``strerror`` is one line naming the URL and why (no credential ever)."""

    def __str__(self) -> str:
        return str(self.strerror)  # the line itself, without OSError's "[Errno N]"


@dataclass(frozen=True)
class ObjectStat:
    """What a listing or a HEAD request says of one object.

    Attributes:
        url: ``s3://bucket/key``.
        st_size: Bytes.
        st_mtime_ns: Last modification, nanoseconds since the epoch (the index caches key on it).
        etag: The object's entity tag (changes with its content).
    """

    url: str
    st_size: int
    st_mtime_ns: int
    etag: str = ""


@dataclass(frozen=True)
class FetchStats:
    """Reads made by this process: ``requests`` GETs that returned ``bytes`` bytes."""

    requests: int = 0
    bytes: int = 0

    def __sub__(self, other: FetchStats) -> FetchStats:
        return FetchStats(self.requests - other.requests, self.bytes - other.bytes)


_counts = [0, 0]  # requests, bytes
_snapshots: dict[tuple[str, str], tuple[float, dict[str, ObjectStat]]] = {}


def fetch_stats() -> FetchStats:
    """GETs made and bytes received by this process so far (subtract two readings for an interval)."""
    with _lock:
        return FetchStats(_counts[0], _counts[1])


def _count(received: int) -> None:
    with _lock:
        _counts[0] += 1
        _counts[1] += received


def endpoint_label() -> str:
    """Where requests go, for messages: the endpoint URL without any user part, or ``"AWS S3"``."""
    for name in ENDPOINT_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value:
            parts = urlsplit(value)
            host = parts.hostname or ""
            port = f":{parts.port}" if parts.port else ""
            return f"{parts.scheme}://{host}{port}" if parts.scheme else host or "the configured endpoint"
    return "AWS S3"


def client():
    """This process's S3 client for the current AWS settings (see the module docs).

    The botocore session behind it is kept per settings, not per process: a worker forked from a
    process that made one builds its own client (its own connections) from the session's
    already-loaded service model, a few milliseconds instead of the few hundred that loading
    botocore's model files costs a fresh session.
    """
    settings = (
        *(os.environ.get(name, "") for name in ENDPOINT_VARIABLES),
        os.environ.get("AWS_PROFILE", ""),
        os.environ.get("AWS_ACCESS_KEY_ID", ""),
    )
    key = (os.getpid(), *settings)
    with _lock:
        hit = _clients.get(key)
    if hit is not None:
        return hit
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise StorageError(errno.EIO, "reading s3:// needs boto3: pip install 'gpufeed[s3]'") from None
    config = Config(
        max_pool_connections=_MAX_CONNECTIONS,
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=10,
        read_timeout=60,
    )
    try:
        with _lock:
            session = _sessions.get(settings)
            if session is None:
                session = _sessions[settings] = boto3.session.Session()
        made = session.client("s3", config=config)
    except Exception as err:  # a malformed profile or endpoint setting; botocore names which
        raise StorageError(errno.EINVAL, f"the AWS settings cannot make an S3 client: {type(err).__name__}") from None
    with _lock:
        _clients[key] = made
    return made


def _error(err: Exception, url: str, doing: str) -> StorageError:
    """The :class:`StorageError` for a failed request: code and status only (see the module docs)."""
    if isinstance(err, StorageError):  # already one line (boto3 missing: botocore cannot be imported either)
        return err
    from botocore import exceptions as bex

    if isinstance(err, bex.ClientError):
        code = str(err.response.get("Error", {}).get("Code", "") or "")
        status = int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code in ("NoSuchKey", "NoSuchBucket", "404", "NotFound") or status == 404:
            what = "no such bucket" if code == "NoSuchBucket" else "not found"
            return StorageError(errno.ENOENT, f"{url}: {what} ({endpoint_label()})")
        if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return StorageError(errno.EACCES, f"{url}: access denied while {doing} ({code or status})")
        if code == "PreconditionFailed" or status == 412:
            return StorageError(
                errno.ESTALE, f"{url}: it changed while it was being read (a new version); read it again"
            )
        if code == "InvalidRange":
            return StorageError(errno.EINVAL, f"{url}: the byte range asked for is outside the object")
        return StorageError(errno.EIO, f"{url}: {doing} failed ({code or 'HTTP'} {status})")
    if isinstance(err, bex.NoCredentialsError):
        return StorageError(
            errno.EACCES,
            f"{url}: no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)",
        )
    if isinstance(err, (bex.EndpointConnectionError, bex.ConnectTimeoutError, bex.ReadTimeoutError)):
        return StorageError(errno.EHOSTUNREACH, f"{url}: cannot reach the object store at {endpoint_label()}")
    if isinstance(err, bex.BotoCoreError) or type(err).__module__.startswith(("boto3", "s3transfer")):
        return StorageError(errno.EIO, f"{url}: {doing} failed ({type(err).__name__})")
    raise err


def _key_dir(path: ObjectPath) -> str:
    return f"{path.key}/" if path.key else ""


def _remember(path: ObjectPath, entries: dict[str, ObjectStat]) -> None:
    now = time.monotonic()
    with _lock:  # expired listings go: a long-lived process (a server, a notebook) lists many prefixes
        for stale in [k for k, (until, _) in _snapshots.items() if until < now]:
            del _snapshots[stale]
        _snapshots[(path.bucket, _key_dir(path))] = (now + _SNAPSHOT_S, entries)


def _snapshot_of(path: ObjectPath, of_key: bool = False) -> dict[str, ObjectStat] | None:
    """A fresh listing that covers the keys under ``path``, or (``of_key``) the object ``path`` itself.

    The listing of ``KEY/`` never holds an object ``KEY``: an empty one says nothing of it (a check
    of ``s3://b/one.jpg`` lists first, and the image "did not exist"); a non-empty one makes it a folder.
    """
    now = time.monotonic()
    with _lock:
        for (bucket, prefix), (expires, entries) in _snapshots.items():
            if bucket != path.bucket or expires <= now or not (path.key + "/").startswith(prefix):
                continue
            if of_key and not entries and prefix == _key_dir(path):
                continue
            return entries
    return None


def list_tree(path: ObjectPath) -> list[ObjectStat]:
    """Every object under the prefix ``path`` (keys continuing it with ``/``), sorted by key.

    The listing is remembered for a minute (see the module docs).
    """
    prefix = _key_dir(path)
    found: dict[str, ObjectStat] = {}
    try:
        pages = client().get_paginator("list_objects_v2").paginate(Bucket=path.bucket, Prefix=prefix)
        for page in pages:
            for item in page.get("Contents", ()):
                key = item["Key"]
                if key.endswith("/") or not nameable_key(path.bucket, key):
                    continue  # a "folder marker" some tools write (no data), or a key no path can name
                url = f"s3://{path.bucket}/{key}"
                stamp = int(item["LastModified"].timestamp() * 1e9)
                found[key] = ObjectStat(url, int(item["Size"]), stamp, str(item.get("ETag", "")).strip('"'))
    except Exception as err:
        raise _error(err, str(path), "listing") from None
    _remember(path, found)
    return [found[key] for key in sorted(found)]


def list_level(path: ObjectPath) -> tuple[list[str], list[str]]:
    """(sub-prefix names, object names) one level below ``path``, each sorted."""
    prefix = _key_dir(path)
    snapshot = _snapshot_of(path)
    folders: set[str] = set()
    files: set[str] = set()
    if snapshot is not None:
        for key in snapshot:
            if key.startswith(prefix):
                head, sep, _ = key[len(prefix) :].partition("/")
                (folders if sep else files).add(head)
        return sorted(folders), sorted(files)
    try:
        pages = client().get_paginator("list_objects_v2").paginate(Bucket=path.bucket, Prefix=prefix, Delimiter="/")
        for page in pages:
            below = (p["Prefix"] for p in page.get("CommonPrefixes", ()))  # each ends with the "/"
            folders.update(k[len(prefix) : -1] for k in below if nameable_key(path.bucket, k, "key prefix"))
            keys = (i["Key"] for i in page.get("Contents", ()) if not i["Key"].endswith("/"))
            files.update(k[len(prefix) :] for k in keys if nameable_key(path.bucket, k))
    except Exception as err:
        raise _error(err, str(path), "listing") from None
    return sorted(folders), sorted(files)


def has_children(path: ObjectPath) -> bool:
    """Whether any key continues ``path`` with ``/`` (a "folder"); ``False`` when it cannot be listed."""
    snapshot = _snapshot_of(path)
    prefix = _key_dir(path)
    if snapshot is not None:
        return any(key.startswith(prefix) for key in snapshot)
    try:
        reply = client().list_objects_v2(Bucket=path.bucket, Prefix=prefix, MaxKeys=1)
    except Exception as err:
        failure = _error(err, str(path), "listing")
        if failure.errno == errno.ENOENT:
            return False
        raise failure from None
    return int(reply.get("KeyCount", 0)) > 0


def lookup(path: ObjectPath) -> ObjectStat | None:
    """The object's :class:`ObjectStat`, or ``None`` when there is no object with this key."""
    snapshot = _snapshot_of(path, of_key=True)
    if snapshot is not None:
        return snapshot.get(path.key)
    try:
        head = client().head_object(Bucket=path.bucket, Key=path.key)
    except Exception as err:
        failure = _error(err, str(path), "asking for its size")
        if failure.errno == errno.ENOENT:
            return None
        raise failure from None
    stamp = int(head["LastModified"].timestamp() * 1e9)
    return ObjectStat(str(path), int(head["ContentLength"]), stamp, str(head.get("ETag", "")).strip('"'))


def stat(path: ObjectPath) -> ObjectStat:
    """:func:`lookup`, raising ``StorageError`` (``ENOENT``) when there is no such object."""
    found = lookup(path)
    if found is None:
        raise StorageError(errno.ENOENT, f"{path}: not found ({endpoint_label()})")
    return found


def read_range(path: ObjectPath, start: int, length: int, etag: str = "") -> bytes:
    """``length`` bytes of the object from byte ``start`` (fewer at its end): one ranged GET.

    Args:
        etag: The version the caller's earlier reads came from (``ObjectStat.etag``): another
            version fails the read (``StorageError``, ``ESTALE``) rather than answer with its bytes.
    """
    if length <= 0:
        return b""
    version = {"IfMatch": f'"{etag}"'} if etag else {}
    return _get(path, Range=f"bytes={start}-{start + length - 1}", **version)


def _get(path: ObjectPath, **ranged: str) -> bytes:
    """One GET's body, the GET made again when the body breaks while it streams (see the module docs)."""
    s3 = client()  # first: without boto3, its one line (botocore cannot be imported either)
    from botocore import exceptions as bex

    broken = (bex.ResponseStreamingError, bex.IncompleteReadError, bex.ReadTimeoutError)
    for attempt in range(_BODY_TRIES):
        try:  # botocore has already retried this request up to its headers
            reply = s3.get_object(Bucket=path.bucket, Key=path.key, **ranged)
        except Exception as err:
            raise _error(err, str(path), "reading") from None
        body, announced = reply["Body"], int(reply.get("ContentLength", -1))
        try:
            data = body.read()
        except broken as err:
            failure: Exception = err
        except Exception as err:
            raise _error(err, str(path), "reading") from None
        else:
            if len(data) >= announced:
                _count(len(data))
                return data
            failure = StorageError(
                errno.EIO, f"{path}: reading failed (the body ended after {len(data):,} of {announced:,} bytes)"
            )
        body.close()
        if attempt + 1 < _BODY_TRIES:
            time.sleep(_BODY_BACKOFF_S * 2**attempt)
    raise _error(failure, str(path), "reading") from None  # a StorageError as it is


def read_object(path: ObjectPath, max_bytes: int | None = None) -> bytes:
    """The whole object (one GET).

    Args:
        max_bytes: Refuse, unread, an object larger than this (a label file cannot be a gigabyte).

    Raises:
        StorageError: It cannot be read, or it is larger than ``max_bytes``.
    """
    if max_bytes is not None:
        size = stat(path).st_size
        if size > max_bytes:
            raise StorageError(errno.EFBIG, f"{path}: {size:,} bytes, more than the {max_bytes:,} allowed here")
    return _get(path)


def put_bytes(path: ObjectPath, data: bytes) -> None:
    """Write ``data`` as the object ``path`` (``gpufeed prepare --shards s3://...``, the tests' fixtures)."""
    try:
        client().put_object(Bucket=path.bucket, Key=path.key, Body=data)
    except Exception as err:
        raise _error(err, str(path), "writing") from None


def upload_file(local: str | os.PathLike, path: ObjectPath) -> None:
    """Upload a local file as the object ``path`` (multipart for large files, by boto3's transfer manager)."""
    try:
        client().upload_file(os.fspath(local), path.bucket, path.key)
    except Exception as err:
        raise _error(err, str(path), "writing") from None
