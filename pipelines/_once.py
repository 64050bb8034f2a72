"""Once a process: the warnings every loader of a run would repeat (a train and a val loader over one folder).

A training builds two loaders over what is often one folder, and a notebook builds them again and
again: the warnings about the data itself (files ignored for their extension, split folders read
as classes, videos of a variable frame rate) are said the first time only.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

__all__ = ["first_time"]

_MAX_KEYS = 10_000  # a process that builds loaders all day remembers this many, then says them again
_said: set[tuple[str, Hashable]] = set()
_lock = threading.Lock()


def first_time(topic: str, key: Hashable) -> bool:
    """True the first time ``(topic, key)`` is asked in this process: then say it."""
    with _lock:
        if (topic, key) in _said:
            return False
        if len(_said) < _MAX_KEYS:
            _said.add((topic, key))
        return True
