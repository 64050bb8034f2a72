"""Shared fixtures: the synthetic dataset, the odd images, the shared server, device parametrisation, the test tiers.

A test marked ``gpu`` (or parametrised with ``DEVICES``' "gpu" entry) is skipped when CUDA or
DALI's GPU operators are not usable, unless ``GPUFEED_REQUIRE_GPU=1``: then it fails instead, so
a GPU run can never pass by skipping. Before that, on every machine, it fails if reading its source
at collection found what would fail it on a GPU (a start without its tier mark, a patch of a missing
attribute, a decoder its input has not, an exact comparison of two decoders: ``_gpu_checks.py``).

Tiers (markers in pyproject.toml): a test is ``unit`` unless it, its class or its module is marked
``process`` (starts child processes) or ``live`` (starts a server and talks to it). ``pytest -m unit``
runs the unit tier alone, and the tier is held, not only declared: a ``unit`` test that starts a
child process or opens a listening socket, in its setup or its body, fails naming what it started
(see ``_tiers.py``).

``make test`` runs the suite over two pytest-xdist workers, whole test files to a worker
(``_xdist.py``); every test must pass there as in one process.

Every test runs with Python's, numpy's and torch's global random state restored afterwards, so a
test that seeds them cannot change what a later test draws.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

# OpenMP's threads (torch's intra-op pool) wait for work by sleeping, not by spinning. GNU OpenMP
# spins first by default: on a busy machine a spinning thread burns the core its partner needs, and
# one training test took 28 s of CPU instead of 4.2 s (the same results: the threads and the split
# of work are unchanged). It is read when torch loads its OpenMP library, so it is set before torch
# is imported; a value set outside the tests wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import pytest
import torch
from _gpu_checks import item_problems
from _s3server import s3_bucket, s3_server  # noqa: F401  # the S3 tests' server, shared by the session
from _tiers import TIERS, unit_guard
from _watchdog import close_files, inflight_path, watchdog
from _wheel_venv import installed  # noqa: F401  # the wheel tests' venv, built once a session
from _xdist import SHARED_FIXTURE_USERS, make_scheduler, shared_fixture_users

from gpufeed.device import DeviceChoice, cuda_status

REQUIRE_GPU = os.environ.get("GPUFEED_REQUIRE_GPU", "") == "1"

# Parametrise a test over devices with: @pytest.mark.parametrize("device", DEVICES, indirect=True)
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


_GPU_PROBLEMS = pytest.StashKey[list]()


def _gpu_rules(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    problems = item.stash.get(_GPU_PROBLEMS, [])
    if problems:  # found reading its source at collection (_gpu_checks.py): fail on every machine, GPU or not
        pytest.fail(f"{item.nodeid} would fail on a GPU: " + "; ".join(problems), pytrace=False)
    ok, why = cuda_status(0)
    if ok:
        return
    if REQUIRE_GPU:
        pytest.fail(f"GPUFEED_REQUIRE_GPU=1 but the GPU is not usable: {why}")
    pytest.skip(f"needs CUDA and DALI GPU operators: {why}")


@pytest.fixture
def device(request) -> DeviceChoice:
    """A :class:`DeviceChoice` for the parametrised device name ("cpu" or "gpu")."""
    name = getattr(request, "param", "cpu")
    if name == "gpu":
        return DeviceChoice("gpu", 0, "test parametrisation")
    return DeviceChoice("cpu", None, "test parametrisation")


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    """The default synthetic dataset, written once per test session (read-only by convention)."""
    from gpufeed.synth import SynthSpec, write_synthetic_dataset

    return write_synthetic_dataset(tmp_path_factory.mktemp("synth"), SynthSpec(), progress=False)


@pytest.fixture(scope="module")
def train_set(synth_dir):
    """The synthetic dataset's training split, indexed from its class folders (once per module)."""
    from gpufeed.pipelines import ImageDataset

    return ImageDataset.from_folder(synth_dir / "images" / "train")


@pytest.fixture(scope="module")
def val_set(synth_dir):
    """The synthetic dataset's validation split, indexed from its list file (once per module)."""
    from gpufeed.pipelines import ImageDataset

    return ImageDataset.from_list(synth_dir / "images" / "val.txt")


@pytest.fixture(scope="session")
def odd_images(tmp_path_factory) -> tuple[Path, list]:
    """The odd-image corpus (``oddmedia.write_image_corpus``) under ``<root>/images``: ``(root, images)``.

    Written once per test session (read-only by convention): two modules read it, and its 4000x3000
    photo makes it the dearest set of files a unit test writes.
    """
    from oddmedia import write_image_corpus

    root = tmp_path_factory.mktemp("odd")
    return root, write_image_corpus(root / "images")


@pytest.fixture(autouse=True, scope="session")
def _export_cache(tmp_path_factory):
    """``gpufeed predict`` keeps a checkpoint's exports in the user's cache folder; the tests (and the
    commands they start, which inherit the environment) keep theirs in a folder of the test run."""
    os.environ.setdefault("GPUFEED_EXPORT_CACHE_DIR", str(tmp_path_factory.mktemp("exports")))


@pytest.fixture(autouse=True)
def _restore_random_state():
    """Puts back Python's, numpy's and torch's global random state after the test, whatever it seeded."""
    python, legacy_numpy, cpu = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    yield
    random.setstate(python)
    np.random.set_state(legacy_numpy)
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


@pytest.fixture(scope="session")
def kserve_server():
    """One CPU server on the exported test repository (both models), shared by the HTTP test modules.

    Tests that share it read metrics and statistics as differences (before and after their own
    requests), never as totals. Settings: 20 ms batching delay (test_server_triton reads it back
    from the model config), two decode threads, one warmup batch.
    """
    from _serving import exported_repo

    from gpufeed.config import parse_config
    from gpufeed.device import DeviceChoice
    from gpufeed.server import start_server

    cfg = parse_config({"device": "cpu", "serve": {"max_delay_ms": 20, "decode_threads": 2, "warmup_batches": 1}})
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=DeviceChoice("cpu", None, "test"))
    yield running
    running.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    _gpu_rules(item)
    with unit_guard(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with unit_guard(item, "body"):
        return (yield)


# Set in the xdist controller, which also gets its workers' logstart/logfinish: the workers keep
# their own files, and the controller's mirror of both would name whichever started last.
_XDIST_CONTROLLER = False


def pytest_configure(config: pytest.Config) -> None:
    global _XDIST_CONTROLLER
    _XDIST_CONTROLLER = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_unconfigure(config: pytest.Config) -> None:
    close_files()


def _inflight_file() -> Path | None:
    return None if _XDIST_CONTROLLER else inflight_path()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    """A test that outlives its pytest-timeout limit by ``_watchdog.GRACE_S`` ends its worker, stacks written."""
    with watchdog(item):
        return (yield)


def pytest_runtest_logstart(nodeid: str, location) -> None:
    """With ``GPUFEED_TEST_INFLIGHT_DIR`` set (``make test``), each worker's running test is kept in a file there.

    A worker that stops mid-test (an internal error, a crash) leaves its file behind, and
    ``.ci/failures`` names the test, which neither pytest's summary nor its JUnit report can.
    """
    if (path := _inflight_file()) is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{nodeid}\t{time.time():.0f}\n")


def pytest_runtest_logfinish(nodeid: str, location) -> None:
    if (path := _inflight_file()) is not None:
        path.unlink(missing_ok=True)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a venv without it lacks
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` (``make test``): whole test files per worker, the files of a costly session fixture together."""
    return make_scheduler(config, log)


@pytest.hookimpl(tryfirst=True)  # before the -m filter reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks every test outside the ``process`` and ``live`` tiers ``unit``; leaves ``slow`` tests out.

    Tests marked ``slow`` run only when a ``-m`` expression names them (``-m slow``), as the marker promises.
    """
    for item in items:
        if "kserve_server" in getattr(item, "fixturenames", ()):  # the shared server, directly or through a fixture
            item.add_marker(pytest.mark.live)
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)
        item.stash[_GPU_PROBLEMS] = item_problems(item)  # after the tier marks: the checks read them
    config.stash[SHARED_FIXTURE_USERS] = shared_fixture_users(items)  # before -k or -m leave any out
    if "slow" in (config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
