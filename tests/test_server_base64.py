"""Images as base64 in KServe v2 JSON: MLServer's and KServe's ``parameters.content_type: "base64"``
(on the input or on the request), bare base64 strings, and KServe's own Python SDK
(``kserve.InferenceRESTClient``, run in a subprocess) classifying the same JPEG and PNG files with the
same scores as tritonclient.http's binary tensors."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from _serving import IMAGE_MODEL, encode, run_kserve_client

pytestmark = pytest.mark.timeout(300)

RNG = np.random.default_rng(11)
IMAGES = [
    encode(RNG.integers(0, 256, (44, 60, 3), dtype=np.uint8)),
    encode(RNG.integers(0, 256, (52, 40, 3), dtype=np.uint8), "PNG"),
    encode(RNG.integers(0, 256, (64, 64, 3), dtype=np.uint8)),
]


@pytest.fixture(scope="module")
def server(kserve_server):
    """The session's shared CPU server (tests/conftest.py)."""
    return kserve_server


@pytest.fixture(scope="module")
def reference(server) -> dict[str, np.ndarray]:
    """Scores and logits from tritonclient.http with binary tensors: what every other way must match."""
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    tensor = triton.InferInput("image", [len(IMAGES)], "BYTES")
    tensor.set_data_from_numpy(np.array(IMAGES, dtype=object), binary_data=True)
    result = client.infer(IMAGE_MODEL, [tensor])
    return {name: result.as_numpy(name) for name in ("logits", "scores")}


@pytest.fixture(scope="module")
def image_files(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("images")
    paths = []
    for k, blob in enumerate(IMAGES):
        suffix = "png" if blob.startswith(b"\x89PNG") else "jpg"
        path = folder / f"{k}.{suffix}"
        path.write_bytes(blob)
        paths.append(path)
    return paths


def _post(server, doc: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/{IMAGE_MODEL}/infer", json=doc, timeout=30)


def _outputs(response: httpx.Response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    out = response.json()["outputs"]
    return {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in out}


def _b64(blobs, encoder=base64.b64encode) -> list[str]:
    return [encoder(b).decode() for b in blobs]


@pytest.mark.parametrize(
    "tensor_params, request_params, encoder",
    [
        ({"content_type": "base64"}, None, base64.b64encode),
        (None, {"content_type": "base64"}, base64.b64encode),
        (None, None, base64.b64encode),  # bare strings: UTF-8 text is never an image, so base64
        ({"content_type": "base64"}, None, base64.urlsafe_b64encode),
        ({"content_type": "base64"}, None, base64.encodebytes),  # MIME: line breaks every 76 characters
        ({"content_type": "pillow_image"}, None, base64.b64encode),  # MLServer's HuggingFace runtime
    ],
    ids=["on-input", "on-request", "bare", "urlsafe", "mime-lines", "pillow-image"],
)
def test_base64_json_strings_classify_as_the_binary_tensors_do(
    server, reference, tensor_params, request_params, encoder
):
    tensor = {"name": "image", "datatype": "BYTES", "shape": [len(IMAGES)], "data": _b64(IMAGES, encoder)}
    if tensor_params:
        tensor["parameters"] = tensor_params
    doc = {"inputs": [tensor]}
    if request_params:
        doc["parameters"] = request_params
    got = _outputs(_post(server, doc))
    np.testing.assert_array_equal(got["scores"], reference["scores"])
    np.testing.assert_array_equal(got["logits"], reference["logits"])


def test_base64_in_binary_data_is_decoded_when_declared(server, reference):
    text = [base64.b64encode(b) for b in IMAGES]
    blob = b"".join(len(t).to_bytes(4, "little") + t for t in text)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "BYTES",
                    "shape": [len(IMAGES)],
                    "parameters": {"binary_data_size": len(blob), "content_type": "base64"},
                }
            ]
        }
    ).encode()
    response = httpx.post(
        f"{server.url}/v2/models/{IMAGE_MODEL}/infer",
        content=head + blob,
        headers={"inference-header-content-length": str(len(head)), "content-type": "application/octet-stream"},
    )
    np.testing.assert_array_equal(_outputs(response)["scores"], reference["scores"])


@pytest.mark.parametrize(
    "data, params, reason, words",
    [
        (["!!not base64!!"], {"content_type": "base64"}, "malformed_request", "BYTES element 0 is not valid base64"),
        (["hello, this is text"], None, "corrupt_image", "BYTES element 0 is not valid base64"),
        ([base64.b64encode(b"hello, plain text").decode()], None, "corrupt_image", "not a JPEG or PNG"),
        (["QUJD", "@@"], {"content_type": "base64"}, "malformed_request", "BYTES element 1 is not valid base64"),
        (["QUJD"], {"content_type": 3}, "malformed_request", "content_type must be a string"),
    ],
    ids=["bad-declared", "bad-bare", "base64-of-text", "second-element", "non-string"],
)
def test_bad_base64_is_a_400_naming_the_input_and_element(server, data, params, reason, words):
    tensor = {"name": "image", "datatype": "BYTES", "shape": [len(data)], "data": data}
    if params:
        tensor["parameters"] = params
    response = _post(server, {"inputs": [tensor]})
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["reason"] == reason and "input 'image'" in body["error"] and words in body["error"], body


def test_base64_declared_on_a_numeric_input_is_refused(server):
    tensor = {"name": "pixels", "datatype": "UINT8", "shape": [1, 3, 48, 48], "data": [0] * (3 * 48 * 48)}
    tensor["parameters"] = {"content_type": "base64"}
    response = _post(server, {"inputs": [tensor]})
    assert response.status_code == 400 and "content_type 'base64' is for BYTES inputs" in response.json()["error"]
    # On the request, base64 concerns BYTES inputs only: the pixels are read as numbers.
    response = _post(server, {"inputs": [{**tensor, "parameters": {}}], "parameters": {"content_type": "base64"}})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("mode", ["binary", "base64", "base64-request", "base64-bare"])
def test_kserve_rest_client_classifies_like_tritonclient(server, reference, image_files, mode):
    code, result = run_kserve_client("rest", server.url, mode, image_files)
    assert code == 0, result
    np.testing.assert_array_equal(np.array(result["scores"], np.float32), reference["scores"])
    np.testing.assert_array_equal(np.array(result["logits"], np.float32), reference["logits"])


def test_kserve_rest_client_sees_the_servers_message(server, tmp_path):
    text = tmp_path / "note.jpg"
    text.write_bytes(b"plain text, not an image" * 4)
    code, result = run_kserve_client("rest", server.url, "base64", [text])
    assert code == 1 and result["status"] == 400 and "input 'image'" in result["error"], result
