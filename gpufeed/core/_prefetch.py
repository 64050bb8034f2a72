"""Read ahead: an iterator run on a thread of its own, a bounded queue between it and its consumer.

Used by ``gpufeed predict`` and the server's video input (a core helper, so both layers reach it).

Decoding the next frames while the model scores the current ones: the sequential reader's DALI
pipeline (NVDEC, or PyAV through its source) and onnxruntime or PyTorch release Python's lock
while they work, so the two overlap. The queue holds ``depth`` items, so memory is bounded by
them; the producer stops when the consumer leaves early (an error, a closed generator), and an
exception in the producer reaches the consumer at the point it happened, after the items before it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["prefetch"]

T = TypeVar("T")
_END = object()


def prefetch(items: Iterable[T], depth: int = 2, name: str = "gpufeed-prefetch") -> Iterator[T]:
    """``items`` in order, produced on a thread ``depth`` items ahead of the consumer.

    Args:
        items: Any iterable; it is iterated (and its resources made and freed) on the thread.
        depth: Items produced ahead at most.
        name: The thread's name.
    """
    box: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
        except BaseException as err:  # handed to the consumer, raised there
            put((_END, err))
            return
        finally:
            close = getattr(items, "close", None)
            if stop.is_set() and callable(close):
                close()
        put((_END, None))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            item, err = box.get()
            if item is _END:
                if err is not None:
                    raise err
                return
            yield item
    finally:
        stop.set()
        thread.join()
