"""Several DALI pipelines taking turns over one stream of plan batches (``loader.pipelines``).

A DALI image decoder runs one batch at a time, and nvImageCodec submits its hardware-JPEG share of
a batch from a single thread: one pipeline's decoder can be the ceiling while the GPU's JPEG
engines and the CPU still have room. With ``pipelines: P`` the image loader builds P pipelines,
pipeline ``j`` fed plan batches ``j, j + P, j + 2P, ...`` (:class:`StreamSlice`), and reads them in
turn (:class:`RoundRobin`): the loader hands over the same batches in the same order as with one,
each decoded by the same graph, while P decoders work at once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpufeed.pipelines._pipeline_session import start_prefetch

__all__ = ["RoundRobin", "StreamSlice"]


class StreamSlice:
    """Every ``step``-th plan batch of a stream from ``offset``: ``slice[k] == stream[offset + k * step]``.

    What one of several pipelines' feeds reads; a feed asks for nothing but ``[k]``.
    """

    def __init__(self, stream: Any, offset: int, step: int) -> None:
        if not 0 <= offset < step:
            raise ValueError(f"StreamSlice: offset {offset} is not in [0, {step})")
        self.stream, self.offset, self.step = stream, offset, step

    def __getitem__(self, k: int):
        return self.stream[self.offset + k * self.step]


class RoundRobin:
    """The outputs of several pipelines' iterators in turn: output ``n`` is iterator ``n % P``'s next.

    The first ``next()`` starts every pipeline's prefetch (:func:`start_prefetch`), so that all P
    decoders work on the session's first batches.

    Args:
        iterators: One per pipeline, pipeline ``j`` over ``StreamSlice(stream, j, P)``.
    """

    def __init__(self, iterators: list[Iterator]) -> None:
        self.iterators = list(iterators)
        self.turn = 0
        self.started = False

    def __iter__(self) -> RoundRobin:
        return self

    def __next__(self):
        if not self.started:
            self.started = True
            for iterator in self.iterators:
                start_prefetch(iterator)
        out = next(self.iterators[self.turn])
        self.turn = (self.turn + 1) % len(self.iterators)
        return out
