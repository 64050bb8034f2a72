"""A real S3-compatible server for the tests: moto's server mode on 127.0.0.1, started by the fixture itself.

``s3_server`` (session scope, in ``conftest.py``) starts ``python -m moto.server`` on a free port of
127.0.0.1 and points the standard AWS settings of this process (and so of every child it starts)
at it: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` (a random sentinel the
secret tests look for in every output), ``AWS_DEFAULT_REGION``; the user's own AWS files and profile
are hidden. The server is a child process, never a thread of the test process: DALI's S3 reader
holds the GIL while it waits for an answer, so a server in a thread of the same process could not
answer it. The settings stay for the whole session because DALI makes its S3 client once per
process, from the settings it finds first.

``s3_bucket`` gives each test a bucket of its own; :func:`upload_tree` copies a local folder into one.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufeed.core._storage import S3Path

_START_S = 60.0


@dataclass(frozen=True)
class S3Server:
    """The running server: its endpoint and the secret access key the session uses."""

    endpoint: str
    secret: str


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1, this process's AWS settings pointed at it (see the module docs)."""
    pytest.importorskip("moto", reason="the s3 tests need moto[server] (the test extra)")
    from gpufeed.bench._s3_local import local_s3_server

    log = tmp_path_factory.mktemp("moto") / "server.log"
    secret = "gpufeed-sentinel-" + secrets.token_hex(12)
    hidden = {  # the user's own AWS files stay out of the tests
        "AWS_CONFIG_FILE": str(log.parent / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(log.parent / "no-aws-credentials"),
    }
    with local_s3_server(access_key="gpufeed-test-key", secret_key=secret, log_path=log, settings=hidden) as endpoint:
        yield S3Server(endpoint, secret)


_buckets = iter(range(1, 1_000_000))


@pytest.fixture
def s3_bucket(s3_server) -> S3Path:
    """A new, empty bucket on the session's server."""
    from gpufeed.core import _s3

    bucket = S3Path(f"s3://gpufeed-test-{os.getpid()}-{next(_buckets)}")
    _s3.client().create_bucket(Bucket=bucket.bucket)
    return bucket


def upload_tree(local: Path, dest: S3Path) -> list[S3Path]:
    """Copy every file under ``local`` to the same relative keys under ``dest``; the keys written."""
    from gpufeed.core import _s3

    written = []
    for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
        target = dest / path.relative_to(local).as_posix()
        _s3.upload_file(path, target)
        written.append(target)
    return written
