"""Warm-up's batches side by side (server/_warmup.run_together), as a pure function without a server."""

from __future__ import annotations

import threading
import time

import pytest

from gpufeed.server._warmup import run_together


class _Inside:
    """How many calls are inside their shared part now, and the most there were at once."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()

    def call(self, name: str, delay_s: float):
        def work(meet):
            time.sleep(delay_s)  # before the shared part: calls arrive at different times
            meet()
            with self.lock:
                self.now += 1
                self.most = max(self.most, self.now)
            time.sleep(0.05)
            with self.lock:
                self.now -= 1
            return name

        return work


def test_every_call_is_inside_its_shared_part_at_once_and_results_keep_their_order():
    inside = _Inside()
    # The slowest call comes first: without the meeting the others would have left their shared part.
    calls = [inside.call("a", 0.3), inside.call("b", 0.0), inside.call("c", 0.1)]
    assert run_together(calls) == ["a", "b", "c"]
    assert inside.most == 3


def test_a_call_that_fails_before_meeting_neither_hangs_the_others_nor_is_lost():
    inside = _Inside()

    def broken(meet):
        raise RuntimeError("lane 1 could not decode its warm-up batch")

    began = time.perf_counter()
    with pytest.raises(RuntimeError, match="lane 1 could not decode"):
        run_together([inside.call("a", 0.0), broken, inside.call("c", 0.0)], timeout_s=60)
    assert time.perf_counter() - began < 30, "the others waited for a call that could not come"
    assert inside.now == 0, "the other calls ran to their end before the error was raised"


def test_a_call_with_nothing_to_run_lets_the_others_through():
    inside = _Inside()
    assert run_together([inside.call("a", 0.0), lambda meet: "nothing", inside.call("c", 0.0)], timeout_s=60) == [
        "a",
        "nothing",
        "c",
    ]
    assert inside.most == 2
