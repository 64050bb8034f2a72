"""The test tiers hold: a unit test that starts a child process or a server fails, naming what it started.

Each case runs this suite's own conftest.py and the modules it imports in a separate pytest process (pytester),
over test files written here, and reads the outcome that run reports.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # each case runs pytest in a child process

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent
# What conftest.py needs beside it: the tier guard, the GPU tests' collection checks, the xdist scheduler,
# the shared fixtures (S3 server, wheel venv), the hard stop of a hung test.
SUPPORT = (
    "conftest.py",
    "_tiers.py",
    "_gpu_checks.py",
    "_gpu_source.py",
    "_s3server.py",
    "_wheel_venv.py",
    "_xdist.py",
    "_watchdog.py",
)

CASES = """
import multiprocessing
import random
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch


def test_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_worker_process():
    worker = multiprocessing.get_context("fork").Process(target=int)
    worker.start()
    worker.join()


def test_listening_socket():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()


def test_listening_in_a_thread_that_swallows_the_error():
    def serve():
        try:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                sock.listen()
        except Exception:
            pass

    thread = threading.Thread(target=serve)
    thread.start()
    thread.join()


def test_in_process_work_passes():
    assert sum(range(10)) == 45


@pytest.mark.process
def test_marked_process_may_start_one():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


BEFORE = {}


def test_seeding_everything():
    BEFORE.update(python=random.getstate(), numpy=np.random.get_state()[1].copy(), torch=torch.random.get_rng_state())
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)


def test_the_next_test_sees_the_state_from_before():
    assert random.getstate() == BEFORE["python"]
    assert (np.random.get_state()[1] == BEFORE["numpy"]).all()
    assert torch.equal(torch.random.get_rng_state(), BEFORE["torch"])
"""


@pytest.fixture
def outcome(pytester):
    for name in SUPPORT:
        shutil.copy(HERE / name, pytester.path / name)
    pytester.makeini(
        "[pytest]\nmarkers =\n    gpu: g\n    slow: s\n    unit: u\n    process: p\n    live: l\naddopts = -p no:randomly\n"
    )
    pytester.makepyfile(test_cases=CASES)
    result = pytester.runpytest_subprocess("-rA", "-p", "no:cacheprovider")
    return result


def test_unit_tests_that_start_processes_or_servers_fail_by_name(outcome):
    text = outcome.stdout.str()
    outcome.assert_outcomes(passed=4, failed=4)
    for name, started in (
        ("test_subprocess", "start a subprocess"),
        ("test_worker_process", "start a worker process"),
        ("test_listening_socket", "listen on a socket"),
        ("test_listening_in_a_thread_that_swallows_the_error", "listen on a socket"),
    ):
        assert f"FAILED test_cases.py::{name}" in text, name
        assert f"test_cases.py::{name} is in the unit tier but its body tried to {started}" in text, name
    for name in (
        "test_in_process_work_passes",
        "test_marked_process_may_start_one",
        "test_seeding_everything",
        "test_the_next_test_sees_the_state_from_before",
    ):
        assert f"PASSED test_cases.py::{name}" in text, name


def test_the_tier_markers_select_apart(pytester):
    for name in SUPPORT:
        shutil.copy(HERE / name, pytester.path / name)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: g\n    slow: s\n    unit: u\n    process: p\n    live: l\n")
    pytester.makepyfile(
        test_marks="import pytest\n\n"
        "def test_a():\n    pass\n\n"
        "@pytest.mark.process\ndef test_b():\n    pass\n\n"
        "@pytest.mark.live\ndef test_c():\n    pass\n"
    )
    for expression, selected in (("unit", "test_a"), ("process", "test_b"), ("live", "test_c")):
        result = pytester.runpytest_subprocess("-m", expression, "--collect-only", "-q", "-p", "no:cacheprovider")
        ids = [line for line in result.stdout.lines if "::" in line]
        assert ids == [f"test_marks.py::{selected}"], (expression, ids)
