"""Shared fixtures: the synthetic dataset, device parametrisation and the `gpu` mark's rules.

A test marked ``gpu`` (or parametrised with ``DEVICES``' "gpu" entry) is skipped when CUDA or
DALI's GPU operators are not usable, unless ``GPUFEED_REQUIRE_GPU=1``: then it fails instead, so
a GPU run can never pass by skipping.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufeed.device import DeviceChoice, cuda_status

REQUIRE_GPU = os.environ.get("GPUFEED_REQUIRE_GPU", "") == "1"

# Parametrise a test over devices with: @pytest.mark.parametrize("device", DEVICES, indirect=True)
DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run only when a ``-m`` expression names them (``-m slow``), as the marker promises."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]
