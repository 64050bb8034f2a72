"""Serving dense models: KServe v2 maps, and PNG maps on the simple REST route at the model's or the input's size."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from _serving import DENSE_SIZE, encode, exported_dense_repo, kserve_image_outputs
from PIL import Image

from gpufeed.config import parse_config
from gpufeed.device import DeviceChoice
from gpufeed.server import start_server
from gpufeed.synth import render_pair

pytestmark = [pytest.mark.live, pytest.mark.timeout(300)]
SIZE = DENSE_SIZE  # model input, square; the test image is 96 x 72, so the window is the centre 72 x 72 (x 12..83)
W, H, X0 = 96, 72, 12


@pytest.fixture(scope="module")
def server():
    cfg = parse_config({"device": "cpu", "serve": {"max_delay_ms": 5, "decode_threads": 2, "warmup_batches": 1}})
    cpu = DeviceChoice("cpu", None, "test")
    running = start_server(repo=exported_dense_repo(), cfg=cfg, port=0, device=cpu, grpc_port=0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def image() -> bytes:
    return encode(render_pair(0, W, H, seed=0)[0])


def _kserve(server, model: str, image: bytes) -> dict:
    return {name: values for name, (_, values) in kserve_image_outputs(server.url, model, image).items()}


def _png(server, model: str, image: bytes, size: str) -> np.ndarray:
    answer = httpx.post(
        f"{server.url}/v1/models/{model}/predict?size={size}",
        content=image,
        headers={"content-type": "image/jpeg", "accept": "image/png"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "image/png"
    return np.asarray(Image.open(io.BytesIO(answer.content)))


def _nearest_back(model_map: np.ndarray) -> np.ndarray:
    """The model's map (SIZE x SIZE) resized to the 72 x 72 window with nearest: pixel u takes floor((u + 0.5) * 64 / 72)."""
    index = np.floor((np.arange(H) + 0.5) * SIZE / H).astype(int)
    return model_map[np.ix_(index, index)]


def test_depth_is_fp32_n_h_w_and_a_16_bit_png_in_map_units(server, image):
    depth = _kserve(server, "depth", image)["depth"]
    assert depth.shape == (1, SIZE, SIZE)
    png = _png(server, "depth", image, "model")
    assert png.dtype == np.uint16 and png.shape == (SIZE, SIZE)  # a 16-bit single-channel PNG
    # Metres back to the maps' millimetres; a prediction never takes the no-data code 0 (1 at the least).
    want = np.clip(np.rint(depth[0] / 0.001), 1, 65535)
    np.testing.assert_array_equal(png, want.astype(np.uint16))
    at_input = _png(server, "depth", image, "input")
    assert at_input.shape == (H, W) and at_input.dtype == np.uint16
    assert (at_input[:, :X0] == 0).all() and (at_input[:, X0 + H :] == 0).all()  # no data outside the window
    inside = at_input[:, X0 : X0 + H].astype(np.int64)
    assert abs(inside.mean() - png.mean()) <= 0.02 * max(1.0, png.mean())  # the same map, resized back


def test_a_json_map_past_the_cap_is_refused_and_the_png_answers(server):
    big = encode(np.zeros((2100, 2100, 3), np.uint8))  # 4,410,000 values at ?size=input, over 4,194,304
    answer = httpx.post(
        f"{server.url}/v1/models/depth/predict?size=input", content=big, headers={"content-type": "image/jpeg"}
    )
    assert answer.status_code == 400 and answer.json()["reason"] == "too_many_pixels"
    assert "a JSON answer of 4,410,000 map values (2100x2100 at ?size=input)" in answer.json()["error"]
    assert "serve.max_json_map_pixels" in answer.json()["error"]
    png = _png(server, "depth", big, "input")
    assert png.shape == (2100, 2100) and (png > 0).all(), "every pixel is in the window: all predictions, none 0"
    doc = httpx.post(
        f"{server.url}/v1/models/depth/predict?size=model", content=big, headers={"content-type": "image/jpeg"}
    ).json()
    assert np.array(doc["predictions"][0]["depth"]).shape == (SIZE, SIZE)


def test_segmentation_scores_and_an_8_bit_mask_png(server, image):
    out = _kserve(server, "seg", image)
    scores = out["scores"]
    assert scores.shape == (1, 4, SIZE, SIZE) and out["logits"].shape == (1, 4, SIZE, SIZE)
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, atol=1e-5)
    png = _png(server, "seg", image, "model")
    assert png.dtype == np.uint8 and png.shape == (SIZE, SIZE)
    np.testing.assert_array_equal(png, scores[0].argmax(axis=0))
    at_input = _png(server, "seg", image, "input")
    assert at_input.shape == (H, W)
    assert (at_input[:, :X0] == 255).all() and (at_input[:, X0 + H :] == 255).all()  # the ignore id outside
    np.testing.assert_array_equal(at_input[:, X0 : X0 + H], _nearest_back(png))


def test_metadata_names_the_map_outputs(server):
    meta = httpx.get(f"{server.url}/v2/models/depth", timeout=30).json()
    assert meta["outputs"] == [{"name": "depth", "datatype": "FP32", "shape": [-1, SIZE, SIZE]}]
    assert meta["parameters"]["task"] == "depth"
    meta = httpx.get(f"{server.url}/v2/models/seg", timeout=30).json()
    assert [o["name"] for o in meta["outputs"]] == ["scores", "logits"]
    assert meta["outputs"][0]["shape"] == [-1, 4, SIZE, SIZE]


def test_bad_map_requests_are_named(server, image):
    files = [("files", (f"{i}.jpg", image, "image/jpeg")) for i in range(2)]
    answer = httpx.post(f"{server.url}/v1/models/depth/predict", files=files, headers={"accept": "image/png"})
    assert answer.status_code == 400 and "one map" in answer.text and "not 2" in answer.text
    answer = httpx.post(
        f"{server.url}/v1/models/depth/predict?size=huge", content=image, headers={"content-type": "image/jpeg"}
    )
    assert answer.status_code == 400 and "query parameter size" in answer.text and "'huge'" in answer.text
    # JSON (no Accept: image/png): both images' maps, named by index.
    answer = httpx.post(f"{server.url}/v1/models/seg/predict?size=model", files=files, timeout=60)
    doc = answer.json()
    assert answer.status_code == 200 and doc["task"] == "segmentation"
    assert [(p["image"], p["width"], p["height"]) for p in doc["predictions"]] == [(0, SIZE, SIZE), (1, SIZE, SIZE)]
    assert np.array(doc["predictions"][0]["mask"]).max() < 4


def test_grpc_answers_the_same_maps_as_http(server, image):
    import tritonclient.grpc as tgrpc

    client = tgrpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    tensor = tgrpc.InferInput("image", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([image], dtype=object))
    result = client.infer("depth", [tensor])
    np.testing.assert_array_equal(result.as_numpy("depth"), _kserve(server, "depth", image)["depth"])
    outputs = client.get_model_metadata("seg").outputs
    assert [(o.name, list(o.shape)) for o in outputs] == [
        ("scores", [-1, 4, SIZE, SIZE]),
        ("logits", [-1, 4, SIZE, SIZE]),
    ]
    with pytest.raises(Exception, match="no classification output"):
        client.infer("seg", [tensor], outputs=[tgrpc.InferRequestedOutput("scores", class_count=2)])
