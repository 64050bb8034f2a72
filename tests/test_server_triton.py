"""Triton's tools against gpufeed serve, unmodified: tritonclient.http (sync and aio), its binary tensors,
request and response compression, model configuration (checked against Triton's own ModelConfig proto),
inference statistics (checked against the Prometheus series they share their observations with), the
repository index, and KServe v2 health answers (200 true, 4xx false)."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from _serving import CLIP_BATCH, CLIP_MODEL, IMAGE_BATCH, IMAGE_MODEL, encode, exported_repo
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families

from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice
from gpufeed.models import read_model_card
from gpufeed.server._app import build_app
from gpufeed.server._repo import load_repository
from gpufeed.server._state import ServingState
from gpufeed.server._triton import EXTENSIONS, batch_sizes_of, model_config_of

pytestmark = pytest.mark.timeout(300)

CPU = DeviceChoice("cpu", None, "test")
RNG = np.random.default_rng(3)
JPEGS = [encode(RNG.integers(0, 256, (40 + 8 * k, 56, 3), dtype=np.uint8)) for k in range(5)]


@pytest.fixture(scope="module")
def server(kserve_server):
    """The session's shared CPU server (tests/conftest.py)."""
    return kserve_server


def _client(server) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.url.removeprefix("http://"))


def _images(blobs, binary=True) -> triton.InferInput:
    tensor = triton.InferInput("image", [len(blobs)], "BYTES")
    return tensor.set_data_from_numpy(np.array(blobs, dtype=object), binary_data=binary)


def _triton_model_config_proto():
    """Triton's ModelConfig message class, from the model_config_pb2 that tritonclient ships."""
    path = Path(tritonclient.__file__).parent / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location("triton_model_config_pb2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # imports only google.protobuf, not tritonclient.grpc (which needs grpcio)
    return module.ModelConfig


def _series(url: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_server_metadata_advertises_what_is_implemented(server):
    meta = _client(server).get_server_metadata()
    assert meta["name"] == "gpufeed" and meta["extensions"] == list(EXTENSIONS)
    assert {"binary_tensor_data", "classification", "model_configuration", "statistics"} <= set(meta["extensions"])
    assert "model_repository" not in meta["extensions"], "load/unload are refused, so the extension is not claimed"


def test_model_config_is_tritons_model_config_for_the_card(server):
    client, proto = _client(server), _triton_model_config_proto()
    for name, batch, inputs in (
        (IMAGE_MODEL, IMAGE_BATCH, ["image", "pixels"]),
        (CLIP_MODEL, CLIP_BATCH, ["video", "pixels"]),  # a clip model also takes one encoded video
    ):
        card = read_model_card(exported_repo() / name)
        config = client.get_model_config(name)
        # Every field is one of Triton's (unknown fields or wrong types make ParseDict raise).
        message = json_format.ParseDict(config, proto())
        assert message.name == name and message.platform == "onnxruntime_onnx" and message.backend == "onnxruntime"
        assert message.max_batch_size == batch == max(batch_sizes_of(card))
        assert [i.name for i in message.input] == inputs
        pixels = message.input[inputs.index("pixels")]
        assert list(pixels.dims) == list(card.sample_shape) and proto.DESCRIPTOR.fields_by_name["input"]
        assert pixels.data_type == 2  # TYPE_UINT8
        assert [i.optional for i in message.input] == [len(inputs) > 1] * len(inputs), "send exactly one of two"
        if name == IMAGE_MODEL:
            image = message.input[0]
            assert image.data_type == 13 and list(image.dims) == [1]  # TYPE_STRING, one encoded image per row
            assert pixels.format == 2  # FORMAT_NCHW
        outputs = [("logits", [4]), ("scores", [4])]
        if name == CLIP_MODEL:  # a video request's per-window outputs (server/_video.py)
            outputs += [("window_scores", [4]), ("window_starts", [])]
            assert message.input[0].data_type == 13 and list(message.input[0].dims) == [1]  # one encoded video
        assert [(o.name, list(o.dims)) for o in message.output] == outputs
        batching = message.dynamic_batching
        assert list(batching.preferred_batch_size) == list(batch_sizes_of(card))
        assert batching.max_queue_delay_microseconds == 20_000  # serve.max_delay_ms 20
        assert batching.default_queue_policy.max_queue_size == 256
        assert batching.default_queue_policy.default_timeout_microseconds == 30_000_000
        assert message.instance_group[0].kind == 2 and message.instance_group[0].count == 2  # KIND_CPU, two lanes
        assert message.parameters["labels"].string_value == ",".join(card.labels)
        assert config["max_batch_size"] == batch and isinstance(
            config["dynamic_batching"]["max_queue_delay_microseconds"], int
        )
    same = httpx.get(f"{server.url}/v2/models/{IMAGE_MODEL}/versions/1/config").json()
    assert same == client.get_model_config(IMAGE_MODEL)
    missing = httpx.get(f"{server.url}/v2/models/nope/config")
    assert missing.status_code == 404 and missing.json()["reason"] == "unknown_model"


@pytest.mark.parametrize("provider", ["auto", "cpu"])
def test_a_gpu_hosts_config_says_where_a_model_not_yet_loaded_will_run(provider):
    """Before loading, the configuration follows the provider: a GPU host set to the CPU one says KIND_CPU."""
    cfg = parse_config({"serve": {"execution_provider": provider}})
    state = ServingState.from_config(load_repository(exported_repo()), cfg, DeviceChoice("gpu", 0, "test"))
    (group,) = model_config_of(state, IMAGE_MODEL)["instance_group"]
    assert group["kind"] == ("KIND_GPU" if provider == "auto" else "KIND_CPU")
    assert group["gpus"] == ([0] if provider == "auto" else [])


def test_model_metadata_lists_exactly_the_inputs_a_request_may_send(server):
    client = _client(server)
    meta = client.get_model_metadata(IMAGE_MODEL)
    assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("image", "BYTES"), ("pixels", "UINT8")]
    assert meta["parameters"]["inputs_per_request"] == 1
    pixels = np.zeros((2, *meta["inputs"][1]["shape"][1:]), np.uint8)
    for tensor in (
        _images(JPEGS[:2]),
        triton.InferInput("pixels", list(pixels.shape), "UINT8").set_data_from_numpy(pixels),
    ):
        assert client.infer(IMAGE_MODEL, [tensor]).as_numpy("logits").shape == (2, 4), "each listed input is taken"
    with pytest.raises(triton.InferenceServerException, match="exactly one input"):
        client.infer(
            IMAGE_MODEL,
            [_images(JPEGS[:2]), triton.InferInput("pixels", list(pixels.shape), "UINT8").set_data_from_numpy(pixels)],
        )
    assert [i["name"] for i in client.get_model_metadata(CLIP_MODEL)["inputs"]] == ["video", "pixels"]


def test_compressed_requests_and_responses(server):
    client = _client(server)
    plain = client.infer(IMAGE_MODEL, [_images(JPEGS)]).as_numpy("logits")
    for request_coding in (None, "gzip", "deflate"):
        for response_coding in (None, "gzip", "deflate"):
            for binary in (True, False):
                outputs = [triton.InferRequestedOutput("logits", binary_data=binary)]
                result = client.infer(
                    IMAGE_MODEL,
                    [_images(JPEGS, binary=True)],
                    outputs=outputs,
                    request_compression_algorithm=request_coding,
                    response_compression_algorithm=response_coding,
                )
                np.testing.assert_allclose(result.as_numpy("logits"), plain, rtol=1e-6, atol=1e-6)
    # The response really is compressed when asked for.
    body = json.dumps({"inputs": [{"name": "pixels", "datatype": "UINT8", "shape": [16, 3, 48, 48],
                                   "data": [7] * (16 * 3 * 48 * 48)}],
                       "outputs": [{"name": "logits", "parameters": {"classification": 4}}]}).encode()  # fmt: skip
    answer = httpx.post(
        f"{server.url}/v2/models/{IMAGE_MODEL}/infer",
        content=gzip.compress(body),
        headers={"content-encoding": "gzip", "accept-encoding": "gzip"},
    )
    assert answer.status_code == 200 and answer.headers["content-encoding"] == "gzip"
    assert len(answer.json()["outputs"][0]["data"]) == 64  # httpx inflated it: it is valid gzip
    # Errors are never compressed, so any client can read them.
    bad = httpx.post(f"{server.url}/v2/models/{IMAGE_MODEL}/infer", content=b"{", headers={"accept-encoding": "gzip"})
    assert bad.status_code == 400 and "content-encoding" not in bad.headers


def test_async_client_binary_compressed_config_and_statistics(server):
    async def run():
        client = triton_aio.InferenceServerClient(server.url.removeprefix("http://"))
        try:
            assert await client.is_server_live() and await client.is_server_ready()
            assert await client.is_model_ready(IMAGE_MODEL)
            config = await client.get_model_config(IMAGE_MODEL)
            stats = await client.get_inference_statistics(IMAGE_MODEL)
            results = await asyncio.gather(
                *[
                    client.infer(
                        IMAGE_MODEL,
                        [_images([blob])],
                        request_compression_algorithm="gzip",
                        response_compression_algorithm="deflate",
                    )
                    for blob in JPEGS
                ]
            )
            index = await client.get_model_repository_index()
            return config, stats, [r.as_numpy("logits")[0] for r in results], index
        finally:
            await client.close()

    config, stats, logits, index = asyncio.run(run())
    assert config["name"] == IMAGE_MODEL and stats["model_stats"][0]["name"] == IMAGE_MODEL
    alone = _client(server).infer(IMAGE_MODEL, [_images(JPEGS)]).as_numpy("logits")
    np.testing.assert_allclose(np.stack(logits), alone, rtol=1e-5, atol=1e-5)
    assert {m["name"] for m in index} == {IMAGE_MODEL, CLIP_MODEL}


def test_statistics_count_what_happened_and_agree_with_prometheus(server):
    client = _client(server)
    before, series_before = client.get_inference_statistics(IMAGE_MODEL)["model_stats"][0], _series(server.url)
    for k in range(1, 4):
        client.infer(IMAGE_MODEL, [_images(JPEGS[:k])])  # 3 requests, 6 images
    for _ in range(2):
        with pytest.raises(triton.InferenceServerException):
            client.infer(IMAGE_MODEL, [_images([b"not an image"])])
    after, series_after = client.get_inference_statistics(IMAGE_MODEL)["model_stats"][0], _series(server.url)

    def delta(field):
        return {
            key: after["inference_stats"][field][key] - before["inference_stats"][field][key] for key in ("count", "ns")
        }

    def prom(name, **labels):
        key = (name, tuple(sorted({"model": IMAGE_MODEL, **labels}.items())))
        return series_after.get(key, 0.0) - series_before.get(key, 0.0)

    assert delta("success")["count"] == 3 and delta("fail")["count"] == 2
    assert delta("queue")["count"] == 6, "one queue observation per image"
    assert after["inference_count"] - before["inference_count"] == 6
    executions = after["execution_count"] - before["execution_count"]
    assert executions == prom("gpufeed_server_batch_size_count") >= 1
    # Triton's unit for the compute fields: one per inference (row) of an answered request, each
    # with its batch's time, all three recorded together (perf_analyzer refuses unequal counts).
    for field in ("compute_input", "compute_infer", "compute_output"):
        assert delta(field)["count"] == 6, field
    count = prom("gpufeed_server_stage_seconds_count", stage="queue_wait")
    assert delta("queue")["count"] == count
    assert abs(delta("queue")["ns"] - prom("gpufeed_server_stage_seconds_sum", stage="queue_wait") * 1e9) <= count + 1e3
    # A batch's time counts once per row it held, a request's postprocess once per row it answered:
    # between 1x and (rows per batch or request)x the histogram sums of the same observations.
    for field, stage, most in (("compute_infer", "inference", IMAGE_BATCH), ("compute_output", "postprocess", 3)):
        total_ns = prom("gpufeed_server_stage_seconds_sum", stage=stage) * 1e9
        assert total_ns - 1e3 <= delta(field)["ns"] <= most * total_ns + 1e3, field
    assert delta("compute_input")["ns"] >= prom("gpufeed_server_stage_seconds_sum", stage="decode") * 1e9 - 1e3
    assert delta("success")["ns"] > 0 and after["last_inference"] >= before["last_inference"] > 0
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert sum(sizes.values()) == after["execution_count"] and set(sizes) <= set(range(1, IMAGE_BATCH + 1))
    everything = client.get_inference_statistics()["model_stats"]
    assert [m["name"] for m in everything] == [CLIP_MODEL, IMAGE_MODEL]
    assert (
        httpx.get(f"{server.url}/v2/models/{IMAGE_MODEL}/versions/1/stats").json()["model_stats"][0]["name"]
        == IMAGE_MODEL
    )
    assert httpx.get(f"{server.url}/v2/models/nope/stats").status_code == 404


def test_repository_index_and_refused_load_unload(server):
    client = _client(server)
    index = client.get_model_repository_index()
    assert index == [
        {"name": CLIP_MODEL, "version": "1", "state": "READY", "reason": ""},
        {"name": IMAGE_MODEL, "version": "1", "state": "READY", "reason": ""},
    ]
    ready_only = httpx.post(server.url + "/v2/repository/index", json={"ready": True})
    assert ready_only.json() == index
    for body in (b"[1]", b'{"ready": "yes"}', b"{"):
        bad = httpx.post(server.url + "/v2/repository/index", content=body)
        assert bad.status_code == 400 and bad.json()["reason"] == "malformed_request"
    for action in (client.load_model, client.unload_model):
        with pytest.raises(triton.InferenceServerException, match="not supported") as info:
            action(IMAGE_MODEL)
        assert info.value.status() == "400"


def test_health_while_loading_is_4xx_as_kserve_v2_says():
    """The app before its models load (no lifespan run): readiness false is a 4xx, inference a 503."""
    cfg = parse_config({"device": "cpu"}).serve
    state = ServingState(load_repository(exported_repo()), cfg, CPU)
    app = build_app(state)

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gpufeed") as client:
            return {
                "live": await client.get("/v2/health/live"),
                "ready": await client.get("/v2/health/ready"),
                "model_ready": await client.get(f"/v2/models/{IMAGE_MODEL}/ready"),
                "unknown_ready": await client.get("/v2/models/nope/ready"),
                "infer": await client.post(f"/v2/models/{IMAGE_MODEL}/infer", content=b"{}"),
                "config": await client.get(f"/v2/models/{IMAGE_MODEL}/config"),
                "index": await client.post("/v2/repository/index"),
            }

    answers = asyncio.run(run())
    assert answers["live"].status_code == 200
    assert answers["ready"].status_code == 400 and answers["ready"].json() == {"ready": False}
    assert answers["model_ready"].status_code == 400 and answers["model_ready"].json()["ready"] is False
    assert answers["unknown_ready"].status_code == 404
    infer = answers["infer"]
    assert infer.status_code == 503 and infer.json()["reason"] == "not_ready" and "retry-after" in infer.headers
    assert answers["config"].status_code == 200 and answers["config"].json()["max_batch_size"] == IMAGE_BATCH
    assert {m["state"] for m in answers["index"].json()} == {"LOADING"}
