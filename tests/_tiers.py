"""The guard that holds the ``unit`` tier: no child process and no listening socket inside a unit test.

The patched entry points are the ones every way of starting a child goes through (``subprocess``,
``multiprocessing`` and so torch's DataLoader workers and process pools, ``os.system``,
``os.posix_spawn``) and the one call every server makes before it can answer (``socket.listen``).
They stay patched for the whole session but only act while a unit test's setup or body runs. A
start is both raised where it happens (so the test stops there) and recorded (so a start inside a
background thread, whose exception the thread swallows, still fails the test).

``GPUFEED_TIER_REPORT=<file>`` turns the guard into a survey: nothing is refused, and each unit test
that would have failed gets a line in ``<file>`` (test, phase, what it started). A whole-suite run
with it tells which tests to mark when the tiers are revised.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import platform
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

# The markers that take a test out of the unit tier (declared in pyproject.toml).
TIERS = ("process", "live")

_lock = threading.Lock()
_active = False
_seen: list[str] = []
REPORT = os.environ.get("GPUFEED_TIER_REPORT", "")


class TierViolation(RuntimeError):
    """A unit test started a child process or a server."""


def _note(what: str) -> None:
    with _lock:
        if not _active:
            return
        _seen.append(what)
    if REPORT:
        return
    raise TierViolation(f"a unit test may not {what}")


def _wrap(owner: object, name: str, describe) -> None:
    original = getattr(owner, name)

    def guarded(*args, **kwargs):
        _note(describe(*args, **kwargs))
        return original(*args, **kwargs)

    guarded.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(owner, name, guarded)


def _command(args) -> str:
    return " ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args)


def _install() -> None:
    # platform.processor() runs `uname -p` once, then caches it; libraries ask for it lazily (h5py
    # and the DeepEthogram fixtures' imports did), which is no test's child process: asked here first.
    platform.processor()
    _wrap(subprocess.Popen, "__init__", lambda self, args, *a, **k: f"start a subprocess ({_command(args)[:120]})")
    _wrap(
        multiprocessing.process.BaseProcess,
        "start",
        lambda self: f"start a worker process ({type(self).__name__} {self.name})",
    )
    _wrap(os, "system", lambda command: f"run os.system({command[:120]!r})")
    _wrap(os, "posix_spawn", lambda path, *a, **k: f"posix_spawn {path}")
    _wrap(socket.socket, "listen", lambda self, *a: f"listen on a socket ({self.getsockname()})")


_install()


@contextlib.contextmanager
def unit_guard(item: pytest.Item, phase: str) -> Iterator[None]:
    """Fails ``item``, a unit test, if ``phase`` (its setup or body) starts a child process or a server."""
    global _active
    if item.get_closest_marker("unit") is None:
        yield
        return
    with _lock:
        _seen.clear()
        _active = True
    try:
        yield
    except BaseException:
        _finish(item, phase)
        raise
    _finish(item, phase)


def _finish(item: pytest.Item, phase: str) -> None:
    global _active
    with _lock:
        _active = False
        seen = list(dict.fromkeys(_seen))
    if REPORT and seen:
        with open(REPORT, "a") as out:
            out.write(f"{item.nodeid}\t{phase}\t{'; '.join(seen)}\n")
        return
    if seen:
        pytest.fail(
            f"{item.nodeid} is in the unit tier but its {phase} tried to {'; '.join(seen)}. "
            "Mark it `process` (child processes) or `live` (a server), or keep it in-process.",
            pytrace=False,
        )
