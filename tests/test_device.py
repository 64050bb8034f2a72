"""device: auto|gpu|cpu resolves to a concrete, explained choice."""

from __future__ import annotations

import pytest

from gpufeed.device import DeviceUnavailableError, cuda_builds, cuda_builds_line, cuda_status, resolve_device


def test_cpu_is_always_available():
    choice = resolve_device("cpu")
    assert choice.kind == "cpu" and choice.device_id is None and "requested" in choice.reason
    assert str(choice.torch_device) == "cpu"


def test_auto_says_which_it_chose_and_why(caplog):
    caplog.set_level("INFO", logger="gpufeed")
    choice = resolve_device("auto")
    usable, why = cuda_status(0)
    assert choice.kind == ("gpu" if usable else "cpu")
    assert why in choice.reason
    assert "using" in caplog.text and choice.describe() in caplog.text


def test_gpu_without_cuda_is_a_clear_error():
    usable, _ = cuda_status(0)
    if usable:
        pytest.skip("this machine has a usable GPU")
    with pytest.raises(DeviceUnavailableError, match="device: gpu was requested but is not usable"):
        resolve_device("gpu")


def test_unknown_device_names_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: auto, gpu, cpu"):
        resolve_device("tpu")


@pytest.mark.gpu
def test_gpu_resolves_on_a_gpu_machine():
    choice = resolve_device("gpu")
    assert choice.is_gpu and choice.torch_device.type == "cuda"


def test_start_up_names_the_cuda_build_of_torch_dali_and_onnxruntime(caplog):
    from importlib import metadata

    import torch
    from onnxruntime.capi import build_and_package_info

    builds = cuda_builds()
    assert set(builds) == {"torch", "DALI", "onnxruntime"}
    assert builds["torch"] == torch.version.cuda
    dali = next(d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("nvidia-dali"))
    assert builds["DALI"].split(".")[0] == dali.rsplit("cuda", 1)[1][:2], (dali, builds)
    assert builds["onnxruntime"] == (getattr(build_and_package_info, "cuda_version", None) or None)
    caplog.set_level("INFO", logger="gpufeed")
    resolve_device("cpu")
    assert cuda_builds_line()[0] in caplog.text


def test_mixed_cuda_majors_are_called_out():
    line, mixed = cuda_builds_line({"torch": "12.8", "DALI": "12.9", "onnxruntime": "12.6"})
    assert not mixed and line == "CUDA builds: torch 12.8, DALI 12.9, onnxruntime 12.6"
    line, mixed = cuda_builds_line({"torch": None, "DALI": "12.9", "onnxruntime": "13.0"})
    assert mixed and line.startswith("CUDA builds: torch CPU build, DALI 12.9, onnxruntime 13.0: CUDA majors 12, 13")
