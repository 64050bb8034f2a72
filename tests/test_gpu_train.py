"""Training and benchmarks on a GPU (issue 25): profiler traces with CUDA activity, ``bench augment``.

The ``gpu``-marked ones are skipped without CUDA and fail under ``GPUFEED_REQUIRE_GPU=1``.

DDP with NCCL across two processes on one GPU is not tested: NCCL refuses two ranks on the same
device ("Duplicate GPU detected"), so it needs a machine with two GPUs; gloo DDP on the CPU is
covered by ``tests/test_train_process.py``.
"""

from __future__ import annotations

import json

import pytest
from conftest import DEVICES
from train_support import train_config

from gpufeed.config import SizePx

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


@pytest.mark.parametrize("device", DEVICES)
def test_profile_steps_record_the_steps_and_cuda_kernels(synth_dir, tmp_path, device):
    """The trace window holds its steps although each step is read one step late (and kernels on a GPU)."""
    from gpufeed.train import train

    cfg = train_config(synth_dir, ["train.max_steps=5"], device=device)
    result = train(cfg, tmp_path / "run", profile_steps=(2, 3))
    trace = json.loads((tmp_path / "run" / "trace-steps2-3-rank0.json").read_text())
    events = trace["traceEvents"]
    names = [e.get("name") for e in events]
    assert {"augment", "forward", "backward", "optimizer"} <= set(names), "the step's ranges"
    forwards = [e for e in events if e.get("name") == "forward" and e.get("cat") == "user_annotation"]
    assert len(forwards) == 2, "steps 2 and 3, no more"
    assert (device == "gpu") == any(e.get("cat") == "kernel" for e in events), "CUDA kernels on a GPU"
    assert result.step == 5


@pytest.mark.gpu
def test_bench_augment_on_the_gpu(tmp_path):
    from gpufeed.bench.augment import run_augment_bench

    result = run_augment_bench(device="gpu", batch_size=16, size_px=SizePx(64, 64), rounds=3, graph_iterations=2)
    assert result["model_step_ms"] > 0 and result["amp"] in ("bfloat16", "float16")
    assert all(row for row in result["ops"])
