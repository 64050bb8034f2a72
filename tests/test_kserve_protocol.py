"""KServe v2 request parsing and response encoding, checked against tritonclient's own encoder/decoder."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.http import InferResult
from tritonclient.http._utils import _get_inference_request

from gpufeed.server import RequestError
from gpufeed.server._http import content_type_of, parse_multipart
from gpufeed.server._kserve import parse_request
from gpufeed.server._kserve_response import encode_response


def _triton_body(inputs, outputs=None):
    body, header_length = _get_inference_request(
        inputs=inputs,
        request_id="req-1",
        outputs=outputs,
        sequence_id=0,
        sequence_start=False,
        sequence_end=False,
        priority=0,
        timeout=None,
        custom_parameters=None,
    )
    return body, None if header_length is None else str(header_length)


def test_binary_bytes_and_uint8_tensors_as_tritonclient_sends_them():
    blobs = np.array([b"\xff\xd8jpeg", b"", b"\x89PNG..."], dtype=object)
    pixels = np.arange(2 * 3 * 4 * 4, dtype=np.uint8).reshape(2, 3, 4, 4)
    a = triton.InferInput("image", [3], "BYTES").set_data_from_numpy(blobs, binary_data=True)
    b = triton.InferInput("pixels", list(pixels.shape), "UINT8").set_data_from_numpy(pixels, binary_data=True)
    request = parse_request(*_triton_body([a, b]))
    assert request.id == "req-1" and request.binary_output is True, "no outputs named: binary outputs requested"
    assert request.inputs[0].elements == list(blobs)
    np.testing.assert_array_equal(request.inputs[1].array, pixels)


def test_json_tensors_nested_or_flat():
    pixels = np.arange(12, dtype=np.uint8).reshape(1, 3, 2, 2)
    a = triton.InferInput("pixels", [1, 3, 2, 2], "UINT8").set_data_from_numpy(pixels, binary_data=False)
    request = parse_request(*_triton_body([a], [triton.InferRequestedOutput("scores", binary_data=False)]))
    np.testing.assert_array_equal(request.inputs[0].array, pixels)
    assert request.outputs[0].name == "scores" and request.outputs[0].binary is False
    nested = {"inputs": [{"name": "x", "datatype": "UINT8", "shape": [2, 2], "data": [[1, 2], [3, 4]]}]}
    np.testing.assert_array_equal(parse_request(json.dumps(nested).encode(), None).inputs[0].array, [[1, 2], [3, 4]])


@pytest.mark.parametrize(
    ("body", "header", "reason", "words"),
    [
        (b"{not json", None, "malformed_request", "not valid JSON"),
        (b"[1, 2]", None, "malformed_request", "must be a JSON object"),
        (b'{"inputs": []}', None, "malformed_request", "non-empty 'inputs'"),
        (b'{"inputs": [{"name": "x", "datatype": "FP99", "shape": [1], "data": [1]}]}', None, "bad_dtype", "FP99"),
        (b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [2], "data": [1]}]}', None, "bad_shape", "holds 2"),
        (
            b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "data": [300]}]}',
            None,
            "malformed_request",
            "[0, 255]",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [-1], "data": [1]}]}',
            None,
            "malformed_request",
            "non-negative",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1]}]}',
            None,
            "malformed_request",
            "neither 'data'",
        ),
        (b'{"inputs": []}', "abc", "malformed_request", "must be an integer"),
        (b'{"inputs": []}', "999", "malformed_request", "outside the body"),
        (
            b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [4], "parameters": {"binary_data_size": 4}}]}ab',
            "101",
            "malformed_request",
            "does not fit",
        ),
        (
            b'{"inputs": [{"name": "x", "datatype": "UINT8", "shape": [1], "parameters": {"shared_memory_region": "r"}}]}',
            None,
            "malformed_request",
            "shared memory",
        ),
    ],
)
def test_malformed_requests_name_the_problem(body, header, reason, words):
    with pytest.raises(RequestError) as info:
        parse_request(body, header)
    assert info.value.reason == reason and words in info.value.message, info.value.message
    assert 400 <= info.value.status < 500


def test_truncated_bytes_element_and_trailing_binary_data():
    head = b'{"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 8}}]}'
    with pytest.raises(RequestError, match="claims 100 bytes"):
        parse_request(head + (100).to_bytes(4, "little") + b"abcd", str(len(head)))
    with pytest.raises(RequestError, match="belong to no input"):
        parse_request(head + (4).to_bytes(4, "little") + b"abcdEXTRA", str(len(head)))


def test_responses_decode_with_tritonclient_binary_json_and_classification():
    logits = np.array([[0.5, -1.0, 2.0], [3.0, 0.0, 1.0]], dtype=np.float32)
    tensors = {"logits": logits, "scores": logits * 2}
    a = triton.InferInput("pixels", [1], "UINT8").set_data_from_numpy(np.zeros(1, np.uint8))
    request = parse_request(*_triton_body([a]))  # no outputs named: all, binary
    body, headers = encode_response("m", request, tensors, ("a", "b", "c"))
    result = InferResult.from_response_body(body, header_length=int(headers["inference-header-content-length"]))
    np.testing.assert_array_equal(result.as_numpy("logits"), logits)
    np.testing.assert_array_equal(result.as_numpy("scores"), logits * 2)

    outputs = [triton.InferRequestedOutput("logits", binary_data=False, class_count=2)]
    request = parse_request(*_triton_body([a], outputs))
    body, headers = encode_response("m", request, tensors, ("a", "b", "c"))
    assert headers["content-type"] == "application/json"
    top = InferResult.from_response_body(body).as_numpy("logits")
    assert top.tolist() == [["2.000000:2:c", "0.500000:0:a"], ["3.000000:0:a", "1.000000:2:c"]]

    request = parse_request(*_triton_body([a], [triton.InferRequestedOutput("probs")]))
    with pytest.raises(RequestError, match="output 'probs' is not produced by model 'm'; outputs: logits, scores"):
        encode_response("m", request, tensors, ("a", "b", "c"))


def test_multipart_parsing():
    kind, params = content_type_of('multipart/form-data; boundary="xyz"')
    assert kind == "multipart/form-data" and params["boundary"] == "xyz"
    body = (
        b'--xyz\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n'
        b'--xyz\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n'
        b"Content-Type: image/jpeg\r\n\r\n\xff\xd8\r\n--not-the-boundary\xff\xd9\r\n--xyz--\r\n"
    )
    note, image = parse_multipart(body, "xyz")
    assert (note.name, note.filename, note.data) == ("note", None, b"hello")
    assert image.filename == "a.jpg" and image.content_type == "image/jpeg"
    assert image.data == b"\xff\xd8\r\n--not-the-boundary\xff\xd9"
    with pytest.raises(RequestError, match="not terminated by the boundary"):
        parse_multipart(body[:-12], "xyz")
    with pytest.raises(RequestError, match="needs a boundary"):
        parse_multipart(body, None)
