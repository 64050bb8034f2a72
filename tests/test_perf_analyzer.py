"""Triton's perf_analyzer, unmodified, drives gpufeed serve: HTTP and gRPC, real JPEGs and raw pixels.

perf_analyzer is the C++ load generator under model_analyzer and genai-perf; it reads the model's
metadata and configuration, builds requests from ``--input-data``, and checks the server's
statistics (their three compute counts must agree). The binary comes from the manylinux
tritonclient 2.41.0 wheel, fetched once into ``.cache/perf_analyzer`` (no GPU needed). If it
cannot be had, these tests fail with the reason: they never skip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _serving import encode, write_checkpoint

from gpufeed.bench._perf_analyzer import ensure_perf_analyzer, run_perf_analyzer, write_image_data, write_pixel_data
from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice
from gpufeed.models import export_model, read_model_card
from gpufeed.server import start_server

pytestmark = [pytest.mark.live, pytest.mark.timeout(900)]

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "perf_analyzer"
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def perf_analyzer():
    return ensure_perf_analyzer(CACHE)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A smallcnn exported with gpufeed export's defaults, served over HTTP and gRPC."""
    root = tmp_path_factory.mktemp("perf")
    checkpoint = write_checkpoint(root / "run", "smallcnn", num_classes=3, size_px=[40, 32], labels=("a", "b", "c"))
    export_model(checkpoint, root / "repo" / "small")  # default batch sizes and precision
    cfg = parse_config({"device": "cpu", "serve": {"warmup_batches": 1}})
    running = start_server(repo=root / "repo", cfg=cfg, port=0, grpc_port=0, device=DeviceChoice("cpu", None, "test"))
    yield running, read_model_card(root / "repo" / "small"), root
    running.stop()


def _data(kind: str, card, folder: Path) -> Path:
    if kind == "images":  # photo-sized JPEGs and a PNG, decoded and cropped by the server
        blobs = [encode(RNG.integers(0, 256, (96 + 16 * k, 128, 3), dtype=np.uint8)) for k in range(3)]
        blobs.append(encode(RNG.integers(0, 256, (60, 80, 3), dtype=np.uint8), "PNG"))
        return write_image_data(blobs, folder / "images.json")
    rows = [RNG.integers(0, 256, card.sample_shape, dtype=np.uint8) for _ in range(3)]
    return write_pixel_data(rows, folder / "pixels.json", card.input_name)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("kind", ["images", "pixels"])
def test_perf_analyzer_runs_against_the_server_without_a_failed_request(perf_analyzer, served, protocol, kind):
    running, card, root = served
    url = running.url.removeprefix("http://") if protocol == "http" else f"127.0.0.1:{running.grpc_port}"
    stats = running.state.metrics.stats
    fails_before = stats.model_stats("small")["inference_stats"]["fail"]["count"]
    rows = run_perf_analyzer(
        perf_analyzer,
        model="small",
        url=url,
        protocol=protocol,
        input_data=_data(kind, card, root),
        concurrency=[1, 64],
        csv_path=root / f"{kind}-{protocol}.csv",
        requests_per_window=40,
    )
    assert [int(r["Concurrency"]) for r in rows] == [1, 64]
    for row in rows:
        assert float(row["Inferences/Second"]) > 0 and int(row["p50 latency"]) > 0, row
    after = stats.model_stats("small")["inference_stats"]
    assert after["fail"]["count"] == fails_before, "perf_analyzer's requests all succeeded"
    counts = {after[f]["count"] for f in ("compute_input", "compute_infer", "compute_output")}
    assert len(counts) == 1 and counts.pop() > 0, "Triton's statistics: one compute count"
