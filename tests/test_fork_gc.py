"""Forked workers never finalise an object their parent left unreachable (``gc_frozen_for_fork``).

DALI's Python workers are forked inside ``Pipeline.build()``; a DALI pipeline the parent dropped in
a reference cycle, not yet collected, is copied into them, and a worker whose collector finalises
it crashes. The loader forks its workers inside :func:`gpufeed.core.gc_frozen_for_fork` (instead of
a ``gc.collect()`` before every build, which cost 0.07-0.28 s). This test forks a child the same
way and has it collect: the parent's garbage must not be finalised there (it would report so
through a pipe), while the parent still collects it afterwards.
"""

from __future__ import annotations

import contextlib
import gc
import os

import pytest

from gpufeed.core import gc_frozen_for_fork

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]


class _Finalised:
    """Writes its tag to ``fd`` when finalised (a stand-in for a DALI pipeline's destructor)."""

    def __init__(self, fd: int, tag: bytes) -> None:
        self.fd, self.tag = fd, tag
        self.cycle = self  # reachable only through itself: freed by the collector, not by refcounts

    def __del__(self) -> None:
        os.write(self.fd, self.tag)


def _fork_and_collect(protect: bool) -> bytes:
    """What a forked child that collects finalises of garbage its parent left (b'' if nothing)."""
    read_fd, write_fd = os.pipe()
    gc.disable()  # the garbage must still be there when the child is forked
    try:
        _Finalised(write_fd, b"finalised in the child")
        with gc_frozen_for_fork() if protect else contextlib.nullcontext():
            pid = os.fork()
            if pid == 0:  # the child: collect, then leave without running the parent's finalisers again
                gc.enable()
                gc.collect()
                os._exit(0)
        os.waitpid(pid, 0)
    finally:
        gc.enable()
    os.set_blocking(read_fd, False)
    try:
        seen = os.read(read_fd, 100)
    except BlockingIOError:
        seen = b""
    gc.collect()  # the parent's own collection still frees it (and writes once, here)
    os.set_blocking(read_fd, False)
    parent = os.read(read_fd, 100)
    os.close(read_fd)
    os.close(write_fd)
    assert parent == b"finalised in the child", "the parent collects its garbage after the fork"
    return seen


def test_a_child_forked_inside_gc_frozen_for_fork_does_not_finalise_the_parents_garbage():
    assert _fork_and_collect(protect=True) == b""


def test_without_it_the_child_finalises_the_parents_garbage():
    """The hazard is real: the same child, forked unprotected, runs the finaliser."""
    assert _fork_and_collect(protect=False) == b"finalised in the child"
