"""A training loop waiting long for its loader says so (a store that stopped answering left a run silent).

The probe behind it: moto stopped with SIGSTOP mid-run; training printed nothing for 8 minutes, and
SIGTERM then said "stopping after this step" of a step that could not come.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from types import SimpleNamespace

import pytest

from gpufeed.train._stall import StallWatch

pytestmark = pytest.mark.timeout(60)


def test_a_long_wait_is_one_warning_then_one_each_interval(caplog):
    caplog.set_level(logging.WARNING, logger="gpufeed")
    stop = SimpleNamespace(signum=None)
    watch = StallWatch(stop, after_s=0.3, every_s=1.5, poll_s=0.05)  # margins of 0.7 s for a busy machine
    with watch.watch(1, 2):
        time.sleep(0.15)  # a short wait says nothing
    assert watch.warnings == 0
    with watch.watch(1, 2):  # warned at 0.3 s and 1.8 s
        time.sleep(1.0)
        stop.signum = 15
        time.sleep(1.6)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and watch.warnings == 2, said
    assert said[0].startswith("the training loader has waited 0 s for batch 3 of epoch 2: its data is not arriving")
    assert "A stop was asked" not in said[0] and said[1].endswith("a second signal stops at once.")
    time.sleep(0.3)
    assert watch.warnings == 2, "nothing once the batch came"


def test_its_thread_ends_with_the_loop_that_held_it():
    before = set(threading.enumerate())
    watch = StallWatch(after_s=10, poll_s=0.02)
    (thread,) = [t for t in set(threading.enumerate()) - before if t.name == "gpufeed-stall"]
    del watch
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()
