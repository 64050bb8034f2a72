"""The server benchmark's moving parts, briefly: the load generator against a real server, and one tiny
sweep with all three contenders (each a real server process) so the baselines keep working."""

from __future__ import annotations

import os

import numpy as np
import pytest
from _serving import IMAGE_MODEL, encode, exported_repo

from gpufeed.bench._loadgen import run_load
from gpufeed.bench.server import print_server_result, run_server_bench, session_cpu_seconds
from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice
from gpufeed.server import start_server

pytestmark = pytest.mark.timeout(300)

IMAGES = [encode(np.random.default_rng(k).integers(0, 256, (72, 96, 3), dtype=np.uint8)) for k in range(4)]


def test_load_generator_counts_answers_and_latencies():
    cfg = parse_config({"device": "cpu", "serve": {"max_delay_ms": 2, "warmup_batches": 1}})
    server = start_server(repo=exported_repo(), cfg=cfg, port=0, device=DeviceChoice("cpu", None, "test"))
    try:
        ok = run_load("127.0.0.1", server.port, f"/v1/models/{IMAGE_MODEL}/predict", IMAGES, concurrency=3, seconds=1.0)
        assert ok.ok > 0 and ok.errors == 0 and ok.statuses == {200: ok.ok}
        assert ok.answered >= ok.ok and 0 < ok.percentile_ms(50) <= ok.percentile_ms(99)
        missing = run_load("127.0.0.1", server.port, "/v1/models/nope/predict", IMAGES, concurrency=1, seconds=0.5)
        assert missing.ok == 0 and set(missing.statuses) == {404}
    finally:
        server.stop()
    assert session_cpu_seconds(os.getsid(0)) > 0, "this test's own session used CPU"


def test_tiny_sweep_with_every_contender(tmp_path, capsys):
    result = run_server_bench(
        architecture="smallcnn",
        images=IMAGES,
        cache=tmp_path,
        size_px=32,
        batch_size=2,
        concurrency=(2,),
        seconds=1.0,
        warmup_s=0.5,
        device="cpu",
    )
    for name in ("gpufeed", "plain", "litserve"):
        point = result["results"][name]["2"]
        assert point["throughput_rps"] > 0 and point["errors"] == 0, (name, point)
        assert point["server_cpu_ms_per_request"] > 0
    print_server_result(result)
    assert "req/s vs plain" in capsys.readouterr().out
