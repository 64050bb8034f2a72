"""KServe v2 over gRPC against real clients: tritonclient.grpc (sync and aio) and KServe's SDK
(``kserve.InferenceGRPCClient``, in a subprocess) classify the same JPEG and PNG files with exactly the
scores tritonclient.http gets; Triton's config, statistics and repository index over gRPC are the HTTP
documents; hostile requests get the right status codes (never INTERNAL) with the HTTP side's messages;
the token, the metrics and the drain are shared with HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.grpc.aio as tgrpc_aio
import tritonclient.http as thttp
from _serving import CLIP_MODEL, IMAGE_MODEL, encode, exported_repo, run_kserve_client
from google.protobuf import json_format
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice
from gpufeed.server import ServerStartError, start_server
from gpufeed.synth._damaged import png_declaring

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]

CPU = DeviceChoice("cpu", None, "test")
TOKEN = "grpc-test-token-0123456789abcdef"
AUTH = {"authorization": f"Bearer {TOKEN}"}
RNG = np.random.default_rng(5)
IMAGES = [
    encode(RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8)),
    encode(RNG.integers(0, 256, (40, 40, 3), dtype=np.uint8), "PNG"),
    encode(RNG.integers(0, 256, (72, 56, 3), dtype=np.uint8)),
]
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    cfg = parse_config(
        {
            "device": "cpu",
            "serve": {"max_delay_ms": 5, "warmup_batches": 1, "decode_threads": 2, "auth_token_file": str(token_file)},
        }
    )
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU, grpc_port=0)
    yield running
    running.stop()


def _grpc_client(server) -> tgrpc.InferenceServerClient:
    return tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")


def _stub(server):
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def reference(server) -> dict[str, np.ndarray]:
    """tritonclient.http's answer for IMAGES (binary tensors): every gRPC client must get exactly this."""
    client = thttp.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = thttp.InferInput("image", [len(IMAGES)], "BYTES")
    tensor.set_data_from_numpy(np.array(IMAGES, dtype=object))
    result = client.infer(IMAGE_MODEL, [tensor], headers=dict(AUTH))
    return {name: result.as_numpy(name) for name in ("logits", "scores")}


def _images(module, blobs) -> object:
    tensor = module.InferInput("image", [len(blobs)], "BYTES")
    tensor.set_data_from_numpy(np.array(blobs, dtype=object))
    return tensor


def _refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() != Code.INTERNAL, info.value.details()
    return info.value


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_tritonclient_grpc_classifies_exactly_as_http(server, reference, compression):
    client = _grpc_client(server)
    result = client.infer(IMAGE_MODEL, [_images(tgrpc, IMAGES)], headers=dict(AUTH), compression_algorithm=compression)
    np.testing.assert_array_equal(result.as_numpy("scores"), reference["scores"])
    np.testing.assert_array_equal(result.as_numpy("logits"), reference["logits"])
    assert result.get_response().model_name == IMAGE_MODEL and result.get_response().model_version == "1"


def test_tritonclient_grpc_aio_classifies_exactly_as_http(server, reference):
    async def run():
        client = tgrpc_aio.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            results = await asyncio.gather(
                *[client.infer(IMAGE_MODEL, [_images(tgrpc_aio, [b])], headers=dict(AUTH)) for b in IMAGES]
            )
            return [r.as_numpy("scores")[0] for r in results]
        finally:
            await client.close()

    # One image per call, concurrently: batched together or not, each row's scores are the same.
    np.testing.assert_allclose(np.stack(asyncio.run(run())), reference["scores"], rtol=1e-5, atol=1e-6)


def test_classification_extension_and_requested_outputs(server, reference):
    wanted = [tgrpc.InferRequestedOutput("scores", class_count=2)]
    result = _grpc_client(server).infer(IMAGE_MODEL, [_images(tgrpc, IMAGES)], outputs=wanted, headers=dict(AUTH))
    top = result.as_numpy("scores")
    assert top.shape == (len(IMAGES), 2)
    labels = json.loads(json.dumps([[v.decode().split(":") for v in row] for row in top]))
    for row, scores in zip(labels, reference["scores"], strict=True):
        assert int(row[0][1]) == int(np.argmax(scores))
        assert float(row[0][0]) == pytest.approx(float(scores.max()), abs=1e-6)
    assert [o.name for o in result.get_response().outputs] == ["scores"]


def test_decoded_pixels_as_raw_and_as_typed_contents(server):
    pixels = RNG.integers(0, 256, (2, 3, 48, 48), dtype=np.uint8)
    tensor = tgrpc.InferInput("pixels", list(pixels.shape), "UINT8")
    tensor.set_data_from_numpy(pixels)
    raw = _grpc_client(server).infer(IMAGE_MODEL, [tensor], headers=dict(AUTH)).as_numpy("scores")
    request = service_pb2.ModelInferRequest(model_name=IMAGE_MODEL)
    request.inputs.add(name="pixels", datatype="UINT8", shape=list(pixels.shape))
    request.inputs[0].contents.uint_contents.extend(pixels.ravel().tolist())
    response = _stub(server).ModelInfer(request, metadata=tuple(AUTH.items()))
    typed = np.frombuffer(response.raw_output_contents[1], np.float32).reshape(2, 4)
    assert [o.name for o in response.outputs] == ["logits", "scores"]
    np.testing.assert_array_equal(typed, raw)


def test_bytes_contents_and_base64_content_type(server, reference):
    import base64

    stub = _stub(server)
    plain = service_pb2.ModelInferRequest(model_name=IMAGE_MODEL)
    plain.inputs.add(name="image", datatype="BYTES", shape=[len(IMAGES)]).contents.bytes_contents.extend(IMAGES)
    coded = service_pb2.ModelInferRequest(model_name=IMAGE_MODEL)
    coded.parameters["content_type"].string_param = "base64"
    coded.inputs.add(name="image", datatype="BYTES", shape=[len(IMAGES)]).contents.bytes_contents.extend(
        base64.b64encode(b) for b in IMAGES
    )
    for request in (plain, coded):
        response = stub.ModelInfer(request, metadata=tuple(AUTH.items()))
        scores = np.frombuffer(response.raw_output_contents[1], np.float32).reshape(len(IMAGES), 4)
        np.testing.assert_array_equal(scores, reference["scores"])


def test_health_and_metadata(server):
    client = _grpc_client(server)
    open_client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    assert open_client.is_server_live() and open_client.is_server_ready()  # probes need no token
    assert all(client.is_model_ready(name, headers=dict(AUTH)) for name in (IMAGE_MODEL, CLIP_MODEL))
    meta = client.get_server_metadata(headers=dict(AUTH))
    http_meta = httpx.get(f"{server.url}/v2", headers=dict(AUTH)).json()
    assert (meta.name, list(meta.extensions)) == (http_meta["name"], http_meta["extensions"])
    model = client.get_model_metadata(IMAGE_MODEL, headers=dict(AUTH), as_json=True)
    http_model = httpx.get(f"{server.url}/v2/models/{IMAGE_MODEL}", headers=dict(AUTH)).json()
    for key in ("name", "versions", "platform"):
        assert model[key] == http_model[key]
    shapes = [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in model["inputs"] + model["outputs"]]
    assert shapes == [(t["name"], t["datatype"], t["shape"]) for t in http_model["inputs"] + http_model["outputs"]]


def test_config_statistics_and_index_are_the_http_documents(server, reference):
    client = _grpc_client(server)
    for name in (IMAGE_MODEL, CLIP_MODEL):
        config = client.get_model_config(name, headers=dict(AUTH)).config
        http_doc = httpx.get(f"{server.url}/v2/models/{name}/config", headers=dict(AUTH)).json()
        assert config == json_format.ParseDict(http_doc, model_config_pb2.ModelConfig())
        # An encoded input first (an image; a clip model's one encoded video), then the pixels.
        encoded = "video" if name == CLIP_MODEL else "image"
        assert config.max_batch_size > 0 and [i.name for i in config.input] == [encoded, "pixels"]
    stats = client.get_inference_statistics(IMAGE_MODEL, headers=dict(AUTH))
    http_stats = httpx.get(f"{server.url}/v2/models/{IMAGE_MODEL}/stats", headers=dict(AUTH)).json()
    assert stats == json_format.ParseDict(http_stats, service_pb2.ModelStatisticsResponse())
    assert stats.model_stats[0].inference_stats.success.count >= 1
    every = client.get_inference_statistics(headers=dict(AUTH))
    assert sorted(s.name for s in every.model_stats) == sorted([IMAGE_MODEL, CLIP_MODEL])
    index = client.get_model_repository_index(headers=dict(AUTH))
    assert [(m.name, m.version, m.state) for m in index.models] == [
        (m["name"], m["version"], m["state"])
        for m in httpx.post(f"{server.url}/v2/repository/index", headers=dict(AUTH), json={}).json()
    ]


def _infer_request(name="image", datatype="BYTES", shape=None, raw=None, model=IMAGE_MODEL, version=""):
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(name=name, datatype=datatype, shape=[1] if shape is None else shape)
    request.raw_input_contents.append(len(IMAGES[0]).to_bytes(4, "little") + IMAGES[0] if raw is None else raw)
    return request


@pytest.mark.parametrize(
    "request_, code, words",
    [
        (_infer_request(raw=b"\x05\x00\x00"), Code.INVALID_ARGUMENT, "ends inside an element's 4-byte length prefix"),
        (_infer_request(raw=b"\xff\x00\x00\x00abc"), Code.INVALID_ARGUMENT, "claims 255 bytes but only 3 remain"),
        (_infer_request(shape=[2**40]), Code.INVALID_ARGUMENT, "the limit is"),
        (_infer_request(shape=[2**40, 2**40]), Code.INVALID_ARGUMENT, "the limit is"),
        (_infer_request(datatype="FP32", raw=b"\x00" * 4), Code.INVALID_ARGUMENT, "must be BYTES"),
        (_infer_request(datatype="FLOAT"), Code.INVALID_ARGUMENT, "is not a KServe v2 datatype"),
        (
            _infer_request(name="pixels", datatype="UINT8", shape=[1, 3, 48], raw=b"\x00" * 144),
            Code.INVALID_ARGUMENT,
            "must have shape",
        ),
        (
            _infer_request(name="pixels", datatype="UINT8", shape=[1, 3, 48, 48], raw=b"\x00" * 5),
            Code.INVALID_ARGUMENT,
            "raw bytes do not match",
        ),
        (_infer_request(raw=(12).to_bytes(4, "little") + b"not an image"), Code.INVALID_ARGUMENT, "not a JPEG or PNG"),
        (
            _infer_request(raw=(len(b := png_declaring(60000, 60000))).to_bytes(4, "little") + b),
            Code.INVALID_ARGUMENT,
            "serve.max_image_pixels",
        ),
        (_infer_request(name="nope"), Code.INVALID_ARGUMENT, "has no input 'nope'"),
        (_infer_request(model="nope"), Code.NOT_FOUND, "model 'nope' is not served here"),
        (_infer_request(version="7"), Code.NOT_FOUND, "has only version 1"),
        (service_pb2.ModelInferRequest(model_name=IMAGE_MODEL), Code.INVALID_ARGUMENT, "at least one input"),
    ],
    ids=[
        "short-prefix",
        "long-element",
        "huge-shape",
        "huge-2d-shape",
        "wrong-datatype",
        "not-a-datatype",
        "wrong-shape",
        "short-raw",
        "not-an-image",
        "pixel-bomb",
        "unknown-input",
        "unknown-model",
        "unknown-version",
        "no-inputs",
    ],
)
def test_hostile_requests_get_the_right_status_never_internal(server, request_, code, words):
    error = _refusal(lambda: _stub(server).ModelInfer(request_, metadata=tuple(AUTH.items())))
    assert error.code() == code and words in error.details(), (error.code(), error.details())


def test_refusals_carry_the_http_message_word_for_word(server):
    request = _infer_request(datatype="FP32", raw=b"\x00" * 4)
    error = _refusal(lambda: _stub(server).ModelInfer(request, metadata=tuple(AUTH.items())))
    doc = {"inputs": [{"name": "image", "datatype": "FP32", "shape": [1], "data": [0.0]}]}
    http = httpx.post(f"{server.url}/v2/models/{IMAGE_MODEL}/infer", json=doc, headers=dict(AUTH))
    assert http.status_code == 400 and error.details() == http.json()["error"]


@pytest.mark.parametrize(
    "metadata, words",
    [
        ((), "needs metadata 'authorization: Bearer <token>'"),
        ((("authorization", "Bearer wrong-token-0123456789"),), "not valid"),
    ],
    ids=["missing", "wrong"],
)
def test_missing_or_wrong_token_is_unauthenticated(server, metadata, words):
    stub = _stub(server)
    for call in (
        lambda: stub.ModelInfer(_infer_request(), metadata=metadata),
        lambda: stub.ModelMetadata(service_pb2.ModelMetadataRequest(name=IMAGE_MODEL), metadata=metadata),
        lambda: stub.ModelStatistics(service_pb2.ModelStatisticsRequest(), metadata=metadata),
        lambda: stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(), metadata=metadata),
    ):
        error = _refusal(call)
        assert error.code() == Code.UNAUTHENTICATED and words in error.details(), error.details()


def test_grpc_requests_are_counted_with_their_protocol(server):
    client = _grpc_client(server)
    client.infer(IMAGE_MODEL, [_images(tgrpc, IMAGES[:1])], headers=dict(AUTH))
    with pytest.raises(InferenceServerException):
        client.infer(IMAGE_MODEL, [_images(tgrpc, [b"not an image at all"])], headers=dict(AUTH))
    series = {}
    text = httpx.get(f"{server.url}/metrics", headers=dict(AUTH)).text
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            series[(s.name, tuple(sorted(s.labels.items())))] = s.value
    ok = series[("gpufeed_server_requests_total", (("code", "200"), ("model", IMAGE_MODEL), ("protocol", "grpc")))]
    bad = series[("gpufeed_server_requests_total", (("code", "400"), ("model", IMAGE_MODEL), ("protocol", "grpc")))]
    assert ok >= 1 and bad >= 1
    assert series[("gpufeed_server_request_seconds_count", (("model", IMAGE_MODEL), ("protocol", "grpc")))] >= ok + bad
    assert series[("gpufeed_server_errors_total", (("model", IMAGE_MODEL), ("reason", "corrupt_image")))] >= 1


def _kserve(server, mode: str, files: list[Path]) -> tuple[int, dict]:
    return run_kserve_client("grpc", f"127.0.0.1:{server.grpc_port}", mode, files, token=TOKEN)


@pytest.mark.parametrize("mode", ["binary", "base64", "base64-request"])
def test_kserve_grpc_client_classifies_exactly_as_http(server, reference, tmp_path, mode):
    files = []
    for k, blob in enumerate(IMAGES):
        files.append(tmp_path / f"{k}.img")
        files[-1].write_bytes(blob)
    code, result = _kserve(server, mode, files)
    assert code == 0, result
    np.testing.assert_array_equal(np.array(result["scores"], np.float32), reference["scores"])
    np.testing.assert_array_equal(np.array(result["logits"], np.float32), reference["logits"])


def test_kserve_grpc_client_sees_invalid_argument(server, tmp_path):
    note = tmp_path / "note.jpg"
    note.write_bytes(b"plain text" * 8)
    code, result = _kserve(server, "binary", [note])
    assert code == 1 and result["status"] == "INVALID_ARGUMENT" and "input 'image'" in result["error"], result


@pytest.fixture(scope="module")
def small_queue_server():
    cfg = parse_config(
        {"device": "cpu", "serve": {"max_delay_ms": 5, "warmup_batches": 1, "decode_threads": 2, "queue_capacity": 2}}
    )
    running = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU, grpc_port=0)
    yield running
    running.stop()


def test_queue_full_then_draining_are_unavailable(small_queue_server):
    server = small_queue_server
    client = _grpc_client(server)
    with pytest.raises(InferenceServerException) as info:
        client.infer(IMAGE_MODEL, [_images(tgrpc, IMAGES)])  # 3 images, 2 queue slots
    assert info.value.status() == "StatusCode.UNAVAILABLE" and "at capacity" in info.value.message()
    assert client.infer(IMAGE_MODEL, [_images(tgrpc, IMAGES[:2])]).as_numpy("scores").shape == (2, 4)
    server.state.begin_drain()
    assert client.is_server_live() and not client.is_server_ready() and not client.is_model_ready(IMAGE_MODEL)
    with pytest.raises(InferenceServerException) as info:
        client.infer(IMAGE_MODEL, [_images(tgrpc, IMAGES[:1])])
    assert info.value.status() == "StatusCode.UNAVAILABLE" and "shutting down" in info.value.message()


def test_grpc_port_without_the_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "tritonclient.grpc", None)  # as if tritonclient[grpc] were not installed
    monkeypatch.delitem(
        sys.modules, "gpufeed.server._grpc", raising=False
    )  # imported afresh, as in a process without it
    with pytest.raises(ServerStartError, match=r"pip install 'gpufeed\[grpc\]'"):
        start_server(repo=exported_repo(), cfg=parse_config({"device": "cpu"}), port=0, device=CPU, grpc_port=0)


def test_grpc_port_config_key():
    assert parse_config({}).serve.grpc_port is None
    assert parse_config({"serve": {"grpc_port": 8001}}).serve.grpc_port == 8001
    with pytest.raises(ValueError, match=r"serve\.grpc_port"):
        parse_config({"serve": {"grpc_port": 70000}})


def test_a_grpc_port_in_use_is_a_start_error_naming_it():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        cfg = parse_config({"device": "cpu", "serve": {"warmup_batches": 1}})
        with pytest.raises(ServerStartError, match=rf"cannot listen for gRPC on 127\.0\.0\.1:{port}"):
            start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU, grpc_port=port, ready_timeout=60)


def test_drain_answers_grpc_calls_in_flight():
    # Batches run only at size 4 and wait up to 5 s to fill: a lone image is in flight until the drain
    # expedites its batch, so the drain must wait for the gRPC call and the call must get its answer.
    cfg = parse_config(
        {"device": "cpu", "serve": {"max_delay_ms": 5000, "batch_sizes": [4], "warmup_batches": 1, "decode_threads": 2}}
    )
    server = start_server(repo=exported_repo(), cfg=cfg, port=0, device=CPU, grpc_port=0)

    async def call_then_drain():
        client = tgrpc_aio.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
        try:
            call = asyncio.ensure_future(client.infer(IMAGE_MODEL, [_images(tgrpc_aio, IMAGES[:1])]))
            while server.state.inflight == 0:
                await asyncio.sleep(0.01)
            started = asyncio.get_running_loop().time()
            stopping = asyncio.get_running_loop().run_in_executor(None, server.stop)
            result = await call
            waited = asyncio.get_running_loop().time() - started
            await stopping
            return result, waited
        finally:
            await client.close()

    result, waited = asyncio.run(call_then_drain())
    assert result.as_numpy("scores").shape == (1, 4) and waited < 4.0, waited
    assert server.state.inflight == 0 and not server.thread.is_alive()


def test_a_video_over_grpc_is_scored_as_over_http(server, tmp_path):
    """A clip model's encoded video over gRPC (tritonclient and KServe's SDK): HTTP's per-frame scores."""
    from videohelp import encode_tagged_video

    path = tmp_path / "clip.mp4"
    encode_tagged_video(path, 2, 30, options={"bf": "2"}, labels=False)
    body = np.array([path.read_bytes()], dtype=object)
    http = thttp.InferenceServerClient(server.url.removeprefix("http://"))
    reference = http.infer(
        CLIP_MODEL, [thttp.InferInput("video", [1], "BYTES").set_data_from_numpy(body)], headers=dict(AUTH)
    ).as_numpy("scores")
    assert reference.shape == (30, 4)
    outputs = [tgrpc.InferRequestedOutput(name) for name in ("scores", "window_starts")]
    result = _grpc_client(server).infer(
        CLIP_MODEL,
        [tgrpc.InferInput("video", [1], "BYTES").set_data_from_numpy(body)],
        headers=dict(AUTH),
        outputs=outputs,
    )
    # Batches may form differently (sessions of other thread counts): equal to float32 rounding.
    np.testing.assert_allclose(result.as_numpy("scores"), reference, atol=1e-6)
    assert result.as_numpy("window_starts").tolist() == list(range(27))
    status, answer = run_kserve_client(
        "grpc", f"127.0.0.1:{server.grpc_port}", "video", [path], token=TOKEN, model=CLIP_MODEL
    )
    assert status == 0, answer
    np.testing.assert_allclose(np.array(answer["scores"], np.float32), reference, atol=1e-6)
