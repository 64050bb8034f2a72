"""A hard stop for a test that pytest-timeout's signal cannot stop: its stacks are written, and its worker ends.

pytest-timeout (``timeout`` in pyproject.toml, or a test's ``timeout`` mark) raises in the test's
main thread from a SIGALRM handler, and Python runs that handler only when the thread comes back to
the interpreter. A thread blocked in C that retries its call after the signal, or a process stopped
by the terminal, never does: a CI run was ended at its 90-minute limit by such a test, with no
name and no trace. So each test also arms faulthandler's own watchdog thread, ``GRACE_S`` after its
pytest-timeout limit. If it fires, every thread's stack is appended to ``<worker>.stacks`` in
``GPUFEED_TEST_INFLIGHT_DIR`` (``make test`` sets it; ``.ci/failures`` prints it beside the test that
worker was running) or, without it, to ``gpufeed-test-stacks-<worker>.txt`` in the temporary
folder, and the process exits: pytest-xdist reports the test as crashed and starts a new worker for
the rest of the files.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

# Long enough for a test stopped by pytest-timeout to run its teardown (servers stopping, their
# waits of up to 10 s each); short beside the CI limit.
GRACE_S = float(os.environ.get("GPUFEED_TEST_WATCHDOG_GRACE_S", "120"))

_files: dict[str, IO[str]] = {}


def inflight_path(suffix: str = "") -> Path | None:
    """This worker's file ``<worker><suffix>`` in ``GPUFEED_TEST_INFLIGHT_DIR`` (``None`` without it)."""
    folder = os.environ.get("GPUFEED_TEST_INFLIGHT_DIR")
    return Path(folder) / (os.environ.get("PYTEST_XDIST_WORKER", "main") + suffix) if folder else None


def stacks_path() -> Path:
    """Where this worker's stacks go if its watchdog fires."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return inflight_path(".stacks") or Path(tempfile.gettempdir()) / f"gpufeed-test-stacks-{worker}.txt"


def limit_s(item: pytest.Item) -> float:
    """The test's pytest-timeout limit in seconds (its mark, else the ini value); 0 means none."""
    mark = item.get_closest_marker("timeout")
    if mark is not None:
        value = mark.args[0] if mark.args else mark.kwargs.get("timeout", 0)
    else:
        try:
            value = item.config.getini("timeout")
        except ValueError:  # pytest-timeout is not installed: no such ini key
            return 0.0
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


@contextlib.contextmanager
def watchdog(item: pytest.Item) -> Iterator[None]:
    """Arms the hard stop for ``item``'s whole protocol (setup, call, teardown); disarms it after."""
    limit = limit_s(item)
    if limit <= 0:
        yield
        return
    path = stacks_path()
    handle = _files.get(str(path))
    if handle is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Kept open for the session: faulthandler writes to its descriptor from its own thread.
        handle = _files[str(path)] = open(path, "a", encoding="utf-8")  # noqa: SIM115
    faulthandler.dump_traceback_later(limit + GRACE_S, exit=True, file=handle)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def close_files() -> None:
    """Close the stacks files at the session's end (an open file at exit is Python's "Exception ignored")."""
    while _files:
        _files.popitem()[1].close()
