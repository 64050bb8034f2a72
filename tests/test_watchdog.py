"""A test that pytest-timeout's signal cannot stop still ends, with its stacks written and its name printed.

Each case runs this suite's own conftest.py in a separate pytest process (pytester) over a test that
blocks SIGALRM (pytest-timeout's signal) and then waits: the stand-in for a thread stuck in C.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_tiers import SUPPORT

pytestmark = pytest.mark.process  # each case runs pytest in a child process

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

HANG = """
import signal
import time

import pytest


@pytest.mark.timeout(1)
def test_stuck_where_the_signal_cannot_reach():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(60)


def test_after_it():
    pass
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    """The suite's conftest beside the hanging test; the child's stacks go to ``inflight``, 2 s past a limit."""
    for name in SUPPORT:
        shutil.copy(HERE / name, pytester.path / name)
    pytester.makepyfile(test_hang=HANG)
    monkeypatch.setenv("GPUFEED_TEST_INFLIGHT_DIR", str(pytester.path / "inflight"))
    monkeypatch.setenv("GPUFEED_TEST_WATCHDOG_GRACE_S", "2")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # the child is one process: its worker is "main"
    return pytester


@pytest.mark.timeout(120)
def test_a_test_its_signal_cannot_stop_ends_its_worker_with_stacks_and_its_name(suite):
    inflight = suite.path / "inflight"
    started = time.monotonic()
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", timeout=90)
    took = time.monotonic() - started
    assert result.ret != 0
    assert took < 45, f"the hung test was not ended by the watchdog ({took:.0f} s)"
    stacks = (inflight / "main.stacks").read_text()
    assert "Timeout (0:00:03)!" in stacks and "test_stuck_where_the_signal_cannot_reach" in stacks, stacks
    failures = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "failures"), str(suite.path / "no-report.xml"), str(inflight)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ},
    )
    out = failures.stdout
    assert "worker main stopped while running test_hang.py::test_stuck_where_the_signal_cannot_reach" in out, out
    assert "worker main was ended past its test's timeout; its threads' stacks:" in out, out
    assert "test_stuck_where_the_signal_cannot_reach" in out.split("its threads' stacks:")[1], out


@pytest.mark.timeout(120)
def test_a_test_that_ends_in_time_leaves_no_stacks(suite):
    inflight = suite.path / "inflight"
    suite.makepyfile(test_hang="import time\n\ndef test_quick():\n    time.sleep(4)\n")
    suite.makeini("[pytest]\ntimeout = 3\n")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider", timeout=90)
    result.assert_outcomes(passed=0, failed=1)  # pytest-timeout stopped it at 3 s, as before
    assert (inflight / "main.stacks").read_text() == ""
