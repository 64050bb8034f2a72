"""How the suite splits over pytest-xdist workers: whole test files, and the files of a costly session fixture together.

``make test`` runs ``pytest -n 2 --dist loadfile``. Each test file is one unit of work, run whole
on one worker, so a module-scoped fixture (a trained checkpoint, an exported model, written media)
is built once, as in a serial run. Session-scoped fixtures are built once per worker; most take a
second or a few, but the ones in :data:`SHARED_SESSION_FIXTURES` take far longer, so the files that
use one of them form a single unit (:class:`FileScheduling` below, which ``conftest.py`` hands to
xdist in place of its own ``loadfile`` scheduler).

Not ``xdist_group`` marks with ``--dist loadgroup``, the usual way: with pytest 9.2 and
pytest-xdist 3.8 it silently stops grouping (xdist writes the group into a node id field that
pytest no longer reads; pytest-xdist issue 1386), and xdist's scheduler sees node ids only, never
fixtures, so the files are named here.
"""

from __future__ import annotations

from typing import Any

import pytest

# Session fixtures built once per run rather than once per worker: name -> the files that use it.
# tests/test_xdist.py checks that every file of the session that uses one is listed.
SHARED_SESSION_FIXTURES = {
    # sdist, wheel and a new venv: 9.3 s of the serial run (load average 3-7).
    "installed": ("test_package_install.py", "test_dense_wheel.py"),
}


def file_of(nodeid: str) -> str:
    """The test file of a node id (the part before ``::``)."""
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The unit of work of a test: its file, or the first file of the shared fixture its file uses."""
    path = file_of(nodeid)
    name = path.rpartition("/")[2]
    for files in SHARED_SESSION_FIXTURES.values():
        if name in files:
            return path[: len(path) - len(name)] + files[0]
    return path


# The (fixture, file name) pairs of SHARED_SESSION_FIXTURES in use among the collected tests, set by
# conftest.py before any test is deselected.
SHARED_FIXTURE_USERS = pytest.StashKey[set[tuple[str, str]]]()


def shared_fixture_users(items: list[pytest.Item]) -> set[tuple[str, str]]:
    """Which files of ``items`` use which fixture of :data:`SHARED_SESSION_FIXTURES`: (fixture, file name) pairs."""
    return {
        (name, file_of(item.nodeid).rpartition("/")[2])
        for item in items
        for name in SHARED_SESSION_FIXTURES
        if name in getattr(item, "fixturenames", ())
    }


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """For ``--dist loadfile``: xdist's file scheduler with the units of :func:`unit_of`; otherwise ``None``."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # only ever called by xdist, so it is installed

    class FileScheduling(LoadFileScheduling):
        """``loadfile``, except that the files sharing a costly session fixture are one unit."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return FileScheduling(config, log)
