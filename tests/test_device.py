"""device: auto|gpu|cpu resolves to a concrete, explained choice."""

from __future__ import annotations

import pytest

from gpufeed import device as device_module
from gpufeed.device import (
    DeviceUnavailableError,
    cuda_builds,
    cuda_builds_line,
    cuda_status,
    local_device_index,
    resolve_device,
)


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
    with pytest.raises(ValueError, match=r"allowed: auto, gpu \(or cuda\), cpu"):
        resolve_device("tpu")


def test_cuda_is_the_gpu():
    """torch's name for the device, as a DataLoader user writes it: the same request as ``gpu``."""
    usable, _ = cuda_status(0)
    if usable:
        assert resolve_device("cuda").is_gpu
        return
    with pytest.raises(DeviceUnavailableError, match="device: gpu was requested but is not usable"):
        resolve_device("cuda")


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


def test_each_rank_maps_to_its_own_visible_gpu():
    assert local_device_index(3, 8, None) == 3, "torchrun: every GPU visible, GPU LOCAL_RANK"
    assert local_device_index(3, 1, "5") == 0, "SLURM: one GPU per task, always index 0"
    with pytest.raises(DeviceUnavailableError, match=r"LOCAL_RANK=2 has no GPU of its own: 2 CUDA device\(s\)"):
        local_device_index(2, 2, None)
    with pytest.raises(DeviceUnavailableError, match="CUDA_VISIBLE_DEVICES=None"):
        local_device_index(1, 1, None)  # two ranks would share one GPU: NCCL refuses duplicates


def test_a_rank_without_its_gpu_fails_loudly_in_a_job_of_several(monkeypatch):
    """GPUs visible but this rank's unusable: alone it falls back to the CPU, in a job it stops."""
    if cuda_status(0)[0]:
        pytest.skip("this machine has a usable GPU")
    monkeypatch.setattr(device_module, "_visible_cuda_devices", lambda: 2)  # the machine's GPUs, as torch counts them
    assert resolve_device("auto", local_rank=1, world_size=1).kind == "cpu"
    with pytest.raises(DeviceUnavailableError, match="falling back to the CPU alone would leave the other ranks"):
        resolve_device("auto", local_rank=1, world_size=4)
    with pytest.raises(DeviceUnavailableError, match="LOCAL_RANK=5 has no GPU of its own"):
        resolve_device("auto", local_rank=5, world_size=8)
    assert resolve_device("cpu", local_rank=5, world_size=8).kind == "cpu", "device: cpu asks no GPU of anyone"


@pytest.mark.gpu
@pytest.mark.process  # the task runs as a child process
def test_a_task_shown_one_gpu_uses_it_whatever_its_local_rank():
    import os
    import subprocess
    import sys

    code = "from gpufeed.device import resolve_device; c = resolve_device('auto'); print(c.kind, c.device_id)"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "3", "WORLD_SIZE": "4", "RANK": "3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.split() == ["gpu", "0"], out.stdout + out.stderr
