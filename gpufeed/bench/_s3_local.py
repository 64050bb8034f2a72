"""A local S3-compatible server for ``gpufeed bench storage --local-server``: moto's server mode on 127.0.0.1.

The benchmark measures object-storage reading without a cloud account: moto (``pip install
'moto[server]'``) serves S3's API from a child process, and this process's standard AWS settings
point at it while the benchmark runs (``AWS_ENDPOINT_URL``, throwaway credentials), then are put
back. The server is a child process: DALI's S3 reader and PyAV's reads hold the GIL while they
wait, so a server thread in this process could not answer them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

from gpufeed.core import s3_client

__all__ = ["local_s3_server"]

_START_S = 60.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def local_s3_server(
    *,
    access_key: str = "gpufeed-bench",
    secret_key: str = "gpufeed-bench",
    log_path: str | os.PathLike | None = None,
    settings: dict[str, str] | None = None,
) -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1 and point this process's AWS settings at it; yields the endpoint.

    The settings are put back, and the server stopped, when the block ends (the tests' session
    fixture uses this too, with a secret of its own to look for in outputs).

    Args:
        access_key, secret_key: The throwaway credentials set while the server runs.
        log_path: Where the server's output goes (default: discarded).
        settings: More environment settings for the while (the tests hide the user's AWS files).

    Raises:
        RuntimeError: moto is not installed, or its server did not answer within a minute.
    """
    if importlib.util.find_spec("moto") is None:
        raise RuntimeError("a local S3 server needs moto's server mode: pip install 'moto[server]'")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with open(log_path or os.devnull, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wanted = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        **(settings or {}),
    }
    saved = {name: os.environ.get(name) for name in [*wanted, "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"]}
    os.environ.update(wanted)
    os.environ.pop("AWS_PROFILE", None)
    os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    try:
        _wait_until_up(process)
        yield endpoint
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


def _wait_until_up(process: subprocess.Popen) -> None:
    deadline = time.monotonic() + _START_S
    while True:
        try:
            s3_client().list_buckets()
            return
        except Exception:  # not up yet: refused connections until it listens
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto's S3 server did not start (exit status {process.poll()})") from None
            time.sleep(0.2)
