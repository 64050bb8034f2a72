"""The server benchmark's moving parts, briefly: the load generator against a real server, and one tiny
sweep with all three contenders (each a real server process) so the baselines keep working."""

from __future__ import annotations

import os

import numpy as np
import pytest
from _serving import IMAGE_MODEL, encode, exported_repo
from conftest import DEVICES

from gpufeed.bench._loadgen import run_load
from gpufeed.bench._loadgen_grpc import run_grpc_load
from gpufeed.bench._server_report import batch_usage, verdicts
from gpufeed.bench.server import print_server_result, run_server_bench, session_cpu_seconds
from gpufeed.config import SizePx, parse_config
from gpufeed.device import DeviceChoice
from gpufeed.server import start_server

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

IMAGES = [encode(np.random.default_rng(k).integers(0, 256, (72, 96, 3), dtype=np.uint8)) for k in range(4)]

# The refused calls' runs: counted from the first call on (no warm-up) over 2 s, so the first call,
# sent at the window's start, is a figure even when a loaded machine takes a second to answer it
# (with a 1 s warm-up and a 0.5 s window, a CI run at load 8 had 6 answers and none inside).
_ONE_CALLER = {"concurrency": 1, "seconds": 2.0, "warmup_s": 0.0}


def test_load_generator_counts_answers_and_latencies():
    cfg = parse_config({"device": "cpu", "serve": {"max_delay_ms": 2, "warmup_batches": 1}})
    server = start_server(repo=exported_repo(), cfg=cfg, port=0, device=DeviceChoice("cpu", None, "test"))
    try:
        ok = run_load("127.0.0.1", server.port, f"/v1/models/{IMAGE_MODEL}/predict", IMAGES, concurrency=3, seconds=1.0)
        assert ok.ok > 0 and ok.errors == 0 and ok.statuses == {200: ok.ok}
        assert ok.answered >= ok.ok and 0 < ok.percentile_ms(50) <= ok.percentile_ms(99)
        missing = run_load("127.0.0.1", server.port, "/v1/models/nope/predict", IMAGES, **_ONE_CALLER)
        assert missing.ok == 0 and set(missing.statuses) == {404}
    finally:
        server.stop()
    assert session_cpu_seconds(os.getsid(0)) > 0, "this test's own session used CPU"


def test_grpc_load_generator_counts_answers_and_statuses():
    cfg = parse_config({"device": "cpu", "serve": {"max_delay_ms": 2, "warmup_batches": 1}})
    server = start_server(repo=exported_repo(), cfg=cfg, port=0, device=DeviceChoice("cpu", None, "test"), grpc_port=0)
    try:
        ok = run_grpc_load("127.0.0.1", server.grpc_port, IMAGE_MODEL, IMAGES, concurrency=3, seconds=1.0)
        assert ok.ok > 0 and ok.errors == 0 and ok.statuses == {200: ok.ok}
        assert ok.answered >= ok.ok and 0 < ok.percentile_ms(50) <= ok.percentile_ms(99)
        missing = run_grpc_load("127.0.0.1", server.grpc_port, "nope", IMAGES, **_ONE_CALLER)
        assert missing.ok == 0 and set(missing.statuses) == {404} and set(missing.reasons) == {"not_found"}
        bad = run_grpc_load("127.0.0.1", server.grpc_port, IMAGE_MODEL, [b"not an image"], **_ONE_CALLER)
        assert bad.ok == 0 and set(bad.statuses) == {400}
    finally:
        server.stop()


def _tiny_sweep(tmp_path, **options) -> dict:
    """A one-second sweep at 2 clients of smallcnn at 32 px, batch 2, on the CPU."""
    return run_server_bench(
        architecture="smallcnn",
        images=IMAGES,
        cache=tmp_path,
        size_px=SizePx(32, 32),
        batch_size=2,
        concurrency=(2,),
        seconds=1.0,
        warmup_s=0.5,
        device="cpu",
        **options,
    )


def test_tiny_sweep_over_grpc(tmp_path):
    result = _tiny_sweep(tmp_path, contenders=("gpufeed",), protocol="grpc")
    point = result["results"]["gpufeed"]["2"]
    assert result["protocol"] == "grpc" and point["throughput_rps"] > 0 and point["errors"] == 0, point
    assert point["batch_usage"]["batches"] > 0, "the gRPC requests ran through gpufeed's batcher"


def test_tiny_sweep_with_every_contender(tmp_path, capsys):
    result = _tiny_sweep(tmp_path)
    for name in ("gpufeed", "plain", "litserve"):
        point = result["results"][name]["2"]
        assert point["throughput_rps"] > 0 and point["errors"] == 0, (name, point)
        assert point["server_cpu_ms_per_request"] > 0
    assert result["batch_sizes"] == [1, 2]
    usage = result["results"]["gpufeed"]["2"]["batch_usage"]  # read from gpufeed's own /metrics
    assert usage["batches"] > 0 and sum(usage["by_size"].values()) == usage["batches"]
    assert 1.0 <= usage["mean_rows"] <= 2.0
    assert [t["verdict"] for t in result["targets"]] == ["not measured"] * 2, "no target is at 2 clients"
    print_server_result(result)
    out = capsys.readouterr().out
    assert "req/s vs plain" in out and "gpufeed's batches by the batch size they ran at" in out
    assert "CPU, 32 clients: >= 1.5x: not measured in this run" in out


def test_batch_usage_and_verdicts_from_figures():
    # Cumulative histogram counts (le -> batches) before and after a point: 3 batches of 1 row,
    # 2 of 3 rows (run at 4), 5 of 8 rows.
    before = {1.0: 10, 2.0: 10, 3.0: 10, 4.0: 10, 8.0: 12, float("inf"): 12}
    after = {1.0: 13, 2.0: 13, 3.0: 15, 4.0: 15, 8.0: 22, float("inf"): 22}
    usage = batch_usage(before, after, (1, 2, 4, 8))
    assert usage["by_size"] == {"1": 3, "2": 0, "4": 2, "8": 5} and usage["batches"] == 10
    assert usage["mean_rows"] == (3 * 1 + 2 * 3 + 5 * 8) / 10

    def point(rps, p50, p99):
        return {"throughput_rps": rps, "p50_ms": p50, "p99_ms": p99}

    def got(gpufeed, plain):
        result = {"architecture": "resnet18", "machine": {"device": "cpu"}}
        result["results"] = {"gpufeed": gpufeed, "plain": plain}
        return {(v["target"]["device"], v["target"]["clients"]): v["verdict"] for v in verdicts(result)}

    # At one client: as fast and a p50 no higher; at 32: 1.1x and a lower p99.
    plain = {"1": point(40.0, 24.0, 29.0), "32": point(40.0, 700.0, 800.0)}
    assert got({"1": point(40.0, 24.0, 35.0), "32": point(44.5, 600.0, 790.0)}, plain) == {
        ("cpu", 1): "MET",
        ("cpu", 32): "MET",
        ("gpu", 32): "not measured",
    }
    missed = got({"1": point(41.0, 25.0, 29.0), "32": point(50.0, 600.0, 801.0)}, plain)
    assert missed == {("cpu", 1): "MISSED", ("cpu", 32): "MISSED", ("gpu", 32): "not measured"}, "p50 and p99 higher"
    assert got({"1": point(39.0, 20.0, 25.0), "32": point(43.0, 500.0, 600.0)}, plain)[("cpu", 1)] == "MISSED"


@pytest.mark.parametrize("device", DEVICES, indirect=True)
def test_a_gpu_baseline_runs_on_cuda_without_tf32_or_stops(device):
    """onnxruntime falls back to its CPU provider with a line on stdout, which the bench discards: a
    baseline that did so would be timed on the CPU against gpufeed on the GPU, so it stops instead.
    On a GPU it runs on CUDA with TF32 off, as gpufeed's server does (onnxruntime's default is on)."""
    import torch

    from gpufeed.bench.peers._common import onnx_session

    path = str(exported_repo() / IMAGE_MODEL / "model.onnx")
    assert onnx_session(path, "cpu").get_providers() == ["CPUExecutionProvider"]
    if device.is_gpu:
        session = onnx_session(path, "gpu")
        assert session.get_providers()[0] == "CUDAExecutionProvider"
        assert session.get_provider_options()["CUDAExecutionProvider"]["use_tf32"] == "0"
    elif torch.cuda.is_available():
        pytest.skip("CUDA starts here: the gpu case checks the baseline")
    else:
        with pytest.raises(SystemExit, match=r"model\.onnx: onnxruntime did not start its CUDA provider"):
            onnx_session(path, "gpu")
