"""Worker processes that die with their parent, and the process tree as Linux's ``/proc`` shows it.

A process killed with SIGKILL runs no cleanup: the worker processes it started (the server's
JSON parser, DALI's Python workers for PyAV clips and JPEG frame stores) would live on, orphaned,
blocked on a queue nobody will ever write to, holding their memory and shared-memory segments;
and multiprocessing's resource tracker, which exits only when every holder of its pipe has
closed it, would live on with them. :func:`die_with_parent` is what a worker runs first:

* a watchdog thread that exits the process (``os._exit``) once it has been re-parented, that is,
  once the process that started it is gone, checked every :data:`WATCH_INTERVAL_S`;
* on Linux, when the worker was started from the parent's main thread, also the kernel's
  parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``), which kills it the moment the
  parent exits. Only then: the signal fires when the *thread* that started the worker exits, so a
  worker started from a short-lived thread relies on the watchdog alone.

:func:`forked_children_die_with_me` arms it in every process ``multiprocessing`` forks while a
block runs (DALI starts its workers inside ``Pipeline.build()``); a spawned worker arms it itself,
from a pool initializer (:meth:`ParentWatch.arm`) or while its callback is unpickled
(:class:`WorkerCallback`).
:func:`descendants` lists a process's tree, which the reliability runs read before a kill and
check after it. :func:`module_argv` is the command line of a Python module run as a child.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import multiprocessing.util
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

__all__ = [
    "WATCH_INTERVAL_S",
    "ParentWatch",
    "WorkerCallback",
    "descendants",
    "die_with_parent",
    "forked_children_die_with_me",
    "gc_frozen_for_fork",
    "module_argv",
    "process_alive",
]

WATCH_INTERVAL_S = 0.5
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def module_argv(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS`` for this Python, without the working directory on the import path.

    ``-m`` puts the working directory first on the child's import path, so from a gpufeed checkout
    its ``gpufeed/`` folder (the core alone; ``pipelines``, ``models`` and ``server`` sit beside it)
    would shadow the installed package. ``-P`` (Python 3.11+) leaves it off; on 3.10 the child
    still imports from the working directory.
    """
    safe = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *safe, "-m", module, *args]


def _arm_parent_death_signal() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent_pid: int, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        if os.getppid() != parent_pid:
            os._exit(1)  # no cleanup to run: the parent that owned this worker's work is gone


def die_with_parent(parent_pid: int, *, from_main_thread: bool = False, interval_s: float = WATCH_INTERVAL_S) -> None:
    """Make this (worker) process exit when ``parent_pid``, the process that started it, is gone.

    Args:
        parent_pid: The parent's process id, taken in the parent (``os.getpid()`` there). If it
            is no longer this process's parent (it died before this ran), this process exits now.
        from_main_thread: The parent started this process from its main thread, so the
            parent-death signal (which fires when that thread exits) may be armed too.
        interval_s: How often the watchdog thread looks.
    """
    if from_main_thread:
        _arm_parent_death_signal()
    # Ctrl-C reaches the terminal's whole process group: the parent decides (gpufeed train stops
    # after a step, with a checkpoint its loader's workers must live for), and this process dies
    # with it. SIGTERM stays: DALI's pool stops a worker that does not leave in a second with it.
    with contextlib.suppress(ValueError):  # not this process's main thread: left as it is
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    # After arming: a parent that died before the prctl sends no signal, but has re-parented us.
    if os.getppid() != parent_pid:
        os._exit(1)
    watchdog = threading.Thread(target=_watch, args=(parent_pid, interval_s), name="gpufeed-parent-watch", daemon=True)
    watchdog.start()


class ParentWatch:
    """What a worker needs to die with this process, taken here, picklable: ``ParentWatch.here()``."""

    def __init__(self, parent_pid: int, from_main_thread: bool) -> None:
        self.parent_pid, self.from_main_thread = parent_pid, from_main_thread

    @classmethod
    def here(cls) -> ParentWatch:
        """This process and thread, as the parent of a worker started now."""
        return cls(os.getpid(), threading.current_thread() is threading.main_thread())

    def arm(self) -> None:
        """In the worker: :func:`die_with_parent` (once per process; nothing in the parent itself)."""
        if os.getpid() != self.parent_pid:
            _arm_once(self.parent_pid, self.from_main_thread)


@functools.cache
def _arm_once(parent_pid: int, from_main_thread: bool) -> None:
    die_with_parent(parent_pid, from_main_thread=from_main_thread)


class WorkerCallback:
    """Base of callbacks pickled into spawned worker processes: unpickled there, they arm :func:`die_with_parent`.

    Unpickled in the process that pickled it (a copy) it does nothing; anywhere else it takes that
    process for a worker of the pickling one, so it is meant for no other trip. A subclass that
    drops state for the trip (open files) extends ``__getstate__`` through ``super()``.
    """

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_parent_watch": ParentWatch.here()}

    def __setstate__(self, state: dict) -> None:
        watch = state.pop("_parent_watch", None)
        self.__dict__.update(state)
        if watch is not None:
            watch.arm()


def _after_fork(watch: ParentWatch, _token: object) -> None:
    _arm_once.cache_clear()  # a fork copies the parent's cache: this is a new process
    watch.arm()


class _Token:
    """Keeps an after-fork hook registered while it lives (multiprocessing holds it weakly)."""


@contextlib.contextmanager
def forked_children_die_with_me() -> Iterator[None]:
    """Every process ``multiprocessing`` forks while the block runs calls :func:`die_with_parent`.

    For libraries that start their worker processes themselves, inside one call (DALI's
    ``Pipeline.build()``); spawned workers are not forked and arm themselves instead.
    """
    token = _Token()
    multiprocessing.util.register_after_fork(token, functools.partial(_after_fork, ParentWatch.here()))
    try:
        yield
    finally:
        del token  # the registry's weak reference dies with it: later forks are left alone


@contextlib.contextmanager
def gc_frozen_for_fork() -> Iterator[None]:
    """Every object this process holds is out of reach of the garbage collectors of the processes forked in the block.

    A forked child that collects an unreachable object it inherited runs its finaliser there: a
    DALI pipeline's crashes a worker. ``gc.freeze()`` moves every tracked object to the permanent
    generation, which no collection examines, in the child too; the parent unfreezes them after the
    block. It costs next to nothing, where a ``gc.collect()`` before forking took 0.07-0.28 s in a
    benchmark process holding torch and DALI (2-core CPU, load 4-8), inside every pipeline build.
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """Process ids of every live descendant of ``pid`` (children, their children ...), from ``/proc``."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if name.isdigit():
            parent = _parent_of(int(name))
            if parent is not None:
                children.setdefault(parent, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return sorted(found)


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
