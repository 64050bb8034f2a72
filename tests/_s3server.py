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
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufeed._storage import S3Path

_START_S = 60.0


@dataclass(frozen=True)
class S3Server:
    """The running server: its endpoint and the secret access key the session uses."""

    endpoint: str
    secret: str
    process: subprocess.Popen


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_until_up(endpoint: str, process: subprocess.Popen) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    deadline = time.monotonic() + _START_S
    while True:
        try:
            client.list_buckets()
            return
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's S3 server did not start at {endpoint} (exit {process.poll()})") from None
            time.sleep(0.2)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1, this process's AWS settings pointed at it (see the module docs)."""
    pytest.importorskip("moto", reason="the s3 tests need moto[server] (the test extra)")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    secret = "gpufeed-sentinel-" + secrets.token_hex(12)
    settings = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "gpufeed-test-key",
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(log.parent / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(log.parent / "no-aws-credentials"),
    }
    saved = {name: os.environ.get(name) for name in [*settings, "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"]}
    os.environ.update(settings)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    try:
        _wait_until_up(endpoint, process)
        yield S3Server(endpoint, secret, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_buckets = iter(range(1, 1_000_000))


@pytest.fixture
def s3_bucket(s3_server) -> S3Path:
    """A new, empty bucket on the session's server."""
    from gpufeed import _s3

    bucket = S3Path(f"s3://gpufeed-test-{os.getpid()}-{next(_buckets)}")
    _s3.client().create_bucket(Bucket=bucket.bucket)
    return bucket


def upload_tree(local: Path, dest: S3Path) -> list[S3Path]:
    """Copy every file under ``local`` to the same relative keys under ``dest``; the keys written."""
    from gpufeed import _s3

    written = []
    for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
        target = dest / path.relative_to(local).as_posix()
        _s3.upload_file(path, target)
        written.append(target)
    return written
