"""The suite splits over pytest-xdist workers as ``_xdist.py`` says: whole files, the files of a costly session fixture together."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from _xdist import SHARED_FIXTURE_USERS, SHARED_SESSION_FIXTURES, unit_of
from test_tiers import SUPPORT

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent


def test_a_file_is_one_unit_and_the_files_of_a_shared_fixture_are_one_together():
    assert unit_of("tests/test_size.py::test_a[224-x]") == "tests/test_size.py"
    assert unit_of("tests/test_size.py::TestB::test_c") == "tests/test_size.py"
    wheel = unit_of("tests/test_package_install.py::test_synth_then_check")
    assert wheel == unit_of("tests/test_dense_wheel.py::test_depth_pairs")
    assert wheel == "tests/test_package_install.py" and unit_of("test_dense_wheel.py::t") == "test_package_install.py"


def test_every_collected_file_using_a_shared_session_fixture_is_listed(pytestconfig):
    """A file that uses one and is left out would build it again on the other worker; listed, it runs beside the others."""
    using = pytestconfig.stash[SHARED_FIXTURE_USERS]  # every collected file, before -k or -m
    missing = sorted(f"{file} uses {name}" for name, file in using if file not in SHARED_SESSION_FIXTURES[name])
    assert not missing, f"add them to _xdist.SHARED_SESSION_FIXTURES: {missing}"


@pytest.mark.process  # runs pytest and its two workers in child processes, as make test does
def test_loadfile_sends_each_file_whole_and_the_shared_fixture_files_together_to_one_worker(pytester):
    """5 + 4 + 3 tests: xdist's own loadfile would give the 5 to gw0 and the 4 to gw1."""
    for name in SUPPORT:
        shutil.copy(HERE / name, pytester.path / name)
    pytester.makeini("[pytest]\nmarkers =\n    gpu: g\n    slow: s\n    unit: u\n    process: p\n    live: l\n")
    tests = "".join(f"def test_{i}():\n    pass\n\n\n" for i in range(5))
    pytester.makepyfile(test_package_install=tests, test_dense_wheel=tests.replace("def test_4", "def _4"))
    pytester.makepyfile(test_other=tests.replace("def test_4", "def _4").replace("def test_3", "def _3"))
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile", "-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    workers: dict[str, set[str]] = {}
    for worker, file in re.findall(r"^\[(gw\d)\] .*PASSED (test_\w+\.py)::", result.stdout.str(), re.M):
        workers.setdefault(file, set()).add(worker)
    assert set(workers) == {"test_package_install.py", "test_dense_wheel.py", "test_other.py"}, workers
    assert all(len(seen) == 1 for seen in workers.values()), f"a file split over workers: {workers}"
    assert workers["test_package_install.py"] == workers["test_dense_wheel.py"], workers
    assert workers["test_other.py"] != workers["test_package_install.py"], "two units, two workers"
