"""Request payloads for the corpus: malformed JSON and binary framing, wrong tensors, bad names,
broken query strings and multipart bodies, wrong methods, oversized bodies."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np

from gpufeed.reliability._probe import Builder, bytes_blob

__all__ = ["json_probes", "name_probes", "oversized_probes", "rest_probes", "tensor_probes"]


MALFORMED = ("malformed_request",)


def json_probes(b: Builder, rng: np.random.Generator) -> None:
    t = b.t
    pixels_doc = {"inputs": [{"name": t.input_name, "datatype": "UINT8", "shape": [1, *t.sample_shape],
                              "data": [0] * int(np.prod(t.sample_shape))}]}  # fmt: skip
    small_doc = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["abc"]}]}
    for doc in (pixels_doc, small_doc):
        text = json.dumps(doc).encode()
        for cut in np.unique(np.linspace(1, len(text) - 1, 60).astype(int)):
            b.kserve_doc("malformed_json", text[:cut], (400,), MALFORMED, ("not valid json",))

    def inp(**fields):
        base = {"name": "image", "datatype": "BYTES", "shape": [1], "data": ["abc"]}
        return {"inputs": [{**base, **fields}]}

    def px(values, datatype="UINT8"):
        count = int(np.prod(t.sample_shape))
        data = (values * (count // len(values) + 1))[:count]
        return {"inputs": [{"name": t.input_name, "datatype": datatype, "shape": [1, *t.sample_shape], "data": data}]}

    cases = [
        (b"[]", "object"), (b"42", "object"), (b'"inputs"', "object"), (b"null", "object"), (b"true", "object"),
        (b"\xff\xfe{}", "not valid json"), (b"\xef\xbb\xbf{}", "inputs"), (b"{'inputs': []}", "not valid json"),
        (b'{"inputs": [}', "not valid json"), (b"{" * 50, "not valid json"), (b"[" * 100000, "nested too deeply"),
        (b'{"inputs": ' + b"[" * 60000 + b"]" * 60000 + b"}", "nested too deeply"),
        (rng.bytes(64), "not valid json"), (b"\x00" * 16, "not valid json"),
        ({"inputs": None}, "inputs"), ({"inputs": []}, "inputs"), ({"inputs": {}}, "inputs"), ({"inputs": "x"}, "inputs"),
        ({"input": []}, "inputs"), ({"inputs": [1]}, "inputs[0]"), ({"inputs": [None]}, "inputs[0]"),
        ({"inputs": [{"name": 5}]}, "inputs[0]"), ({"inputs": [{}]}, "inputs[0]"),
        (inp(shape="1"), "shape"), (inp(shape=[-1]), "shape"), (inp(shape=[1.5]), "shape"), (inp(shape=[True]), "shape"),
        (inp(shape=[[1]]), "shape"), (inp(shape=[1] * 9), "shape"), (inp(shape=None), "shape"),
        ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1]}]}, "neither 'data'"),
        (inp(data="abc"), "must be a list"), (inp(data=[1]), "strings"), (inp(data={"a": 1}), "must be a list"),
        (inp(data=[["abc", None]], shape=[1, 2]), "strings"),
        (inp(parameters="x"), "parameters"), (inp(parameters=[1]), "parameters"),
        ({**small_doc, "parameters": []}, "parameters"), ({**small_doc, "parameters": "x"}, "parameters"),
        ({**small_doc, "outputs": "x"}, "outputs"), ({**small_doc, "outputs": [5]}, "outputs[0]"),
        ({**small_doc, "outputs": [{"name": 3}]}, "outputs[0]"),
        ({**small_doc, "outputs": [{"name": "scores", "parameters": "x"}]}, "parameters"),
        ({**small_doc, "outputs": [{"name": "scores", "parameters": [1, 2]}]}, "parameters"),
        ({**small_doc, "outputs": [{"name": "scores", "parameters": {"classification": -1}}]}, "classification"),
        ({**small_doc, "outputs": [{"name": "scores", "parameters": {"classification": "2"}}]}, "classification"),
        ({**small_doc, "outputs": [{"name": "scores", "parameters": {"shared_memory_region": "r"}}]}, "shared memory"),
        (inp(parameters={"shared_memory_region": "r", "shared_memory_byte_size": 4}), "shared memory"),
        ({"inputs": small_doc["inputs"] * 3}, "exactly one input"),
        ({"inputs": small_doc["inputs"] * 400}, "exactly one input"),
        (px([256]), "lie in [0, 255]"), (px([-1]), "lie in [0, 255]"), (px([1.5]), "not uint8 numbers"),
        (px(["1"]), "not uint8 numbers"), (px([True]), "not uint8 numbers"), (px([None]), "not uint8 numbers"),
        (px([{"a": 1}]), "not uint8 numbers"), (json.dumps(px([0])).replace("[0, 0", f"[{2**70}, 0", 1).encode(), "not uint8 numbers"),
        (json.dumps(px([0])).replace("[0, 0", "[NaN, 0", 1).encode(), "not uint8 numbers"),
        (json.dumps(px([0])).replace("[0, 0", "[1e400, 0", 1).encode(), "not uint8 numbers"),
        (json.dumps(px([0])).replace("[0, 0", "[Infinity, 0", 1).encode(), "not uint8 numbers"),
    ]  # fmt: skip
    for doc, words in cases:
        b.kserve_doc("malformed_json", doc, (400,), MALFORMED, (words,))
    # The binary extension's framing.
    blob = bytes_blob([b"abc"])
    header = {
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(blob)}}]
    }
    head_len = len(json.dumps(header))
    for length, words in (("abc", "integer"), ("0", "outside"), ("-5", "outside"), ("99999999", "outside"),
                          (str(head_len - 3), "not valid json"), ("1.5", "integer")):  # fmt: skip
        b.kserve_binary("malformed_json", header, blob, (400,), MALFORMED, (words,), length=length)
    for size, words in (
        (len(blob) + 1, "does not fit"),
        (-1, "does not fit"),
        ("7", "does not fit"),
        (None, "does not fit"),
    ):
        bad = {"inputs": [{**header["inputs"][0], "parameters": {"binary_data_size": size}}]}
        b.kserve_binary("malformed_json", bad, blob, (400,), MALFORMED, (words,))
    b.kserve_binary("malformed_json", header, blob + b"extra", (400,), MALFORMED, ("belong to no input",))
    for broken, words in ((struct.pack("<I", 10) + b"abc", "claims"), (b"\x01\x00", "length prefix")):
        bad = {"inputs": [{**header["inputs"][0], "parameters": {"binary_data_size": len(broken)}}]}
        b.kserve_binary("malformed_json", bad, broken, (400,), MALFORMED, (words,))


def tensor_probes(b: Builder, max_images: int, max_body_bytes: int) -> None:
    t, shape = b.t, list(b.t.sample_shape)
    bad_shapes = [
        [1, *shape[:-1], shape[-1] + 1], [1, *shape[::-1]], shape, [1, 1, *shape], [1], [2, 2], [1, int(np.prod(shape))],
        [1, shape[0] + 1, *shape[1:]], [1, *shape, 1], [1, *shape[:-2], shape[-2] // 2, shape[-1] * 2],
    ]  # fmt: skip
    for k, bad in enumerate(bad_shapes):
        b.pixels("wrong_shape", bad, binary=k % 2 == 0, reasons=("bad_shape",), words=("shape",))
    for rows in (0, max_images + 1):
        if rows * int(np.prod(shape)) + 4096 < max_body_bytes:  # else it would be refused as too large first
            b.pixels("wrong_shape", [rows, *shape], reasons=("bad_shape",), words=("no images", "limit"))
    count = int(np.prod(shape))
    b.kserve_doc("wrong_shape", {"inputs": [{"name": t.input_name, "datatype": "UINT8", "shape": [2, *shape],
                                             "data": [0] * count}]}, (400,), ("bad_shape",), ("elements",))  # fmt: skip
    header = {"inputs": [{"name": t.input_name, "datatype": "UINT8", "shape": [1, *shape],
                          "parameters": {"binary_data_size": count - 1}}]}  # fmt: skip
    b.kserve_binary("wrong_shape", header, bytes(count - 1), (400,), ("bad_shape",), ("do not match",))
    huge = {"inputs": [{"name": t.input_name, "datatype": "UINT8", "shape": [2**62, 4, *shape[2:]], "data": [0]}]}
    b.kserve_doc("wrong_shape", huge, (400,), ("bad_shape",), ("elements",))
    if t.accepts_images:
        for bad in ([2, 2], [1, 2], [], [1, 1, 1]):
            doc = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": bad, "data": ["x"] * int(np.prod(bad))}]}
            b.kserve_doc("wrong_shape", doc, (400,), ("bad_shape",), ("shape",))
        b.kserve_doc("wrong_shape", {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [0], "data": []}]},
                     (400,), ("bad_shape",), ("no images",))  # fmt: skip
        b.kserve_doc("wrong_shape", {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [2], "data": ["x"]}]},
                     (400,), ("bad_shape",), ("elements",))  # fmt: skip
    # Datatypes.
    for k, datatype in enumerate(("BOOL", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                                  "FP16", "FP32", "FP64")):  # fmt: skip
        for binary in (True, False):
            if not binary and k % 2:
                continue
            b.pixels("wrong_dtype", [1, *shape], datatype, binary=binary, reasons=("bad_dtype",), words=("uint8",))
    b.kserve_doc("wrong_dtype", {"inputs": [{"name": t.input_name, "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
                 (400,), ("bad_dtype",), ("uint8",))  # fmt: skip
    for wrong in ("uint8", "FLOAT32", "", "STRING", "BF16", 5, None, ["UINT8"], {"t": 1}, "UINT8 "):
        wrong_doc: dict[str, Any] = {"inputs": [{"name": t.input_name, "datatype": wrong, "shape": [1], "data": [0]}]}
        b.kserve_doc("wrong_dtype", wrong_doc, (400,), ("bad_dtype",), ("datatype",))
    if t.accepts_images:
        for datatype in ("UINT8", "FP32", "INT64"):
            doc = {"inputs": [{"name": "image", "datatype": datatype, "shape": [1], "data": [1]}]}
            b.kserve_doc("wrong_dtype", doc, (400,), ("bad_dtype",), ("bytes",))
    else:
        b.kserve_images("wrong_dtype", [b"\xff\xd8\xff"], (400,), ("bad_dtype",), ("clip model",))


UNKNOWN = ("unknown_model",)
NOT_HERE = ("not served here", "no such model", "only version 1")


def name_probes(b: Builder, served: list[str], jpeg: bytes) -> None:
    t = b.t
    small_doc = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}).encode()
    names = ["nope", t.name.upper(), t.name + "%20", t.name[:-1], t.name + "2", "model.onnx", "model_card.json", "0",
             "-", "_", "%20", "n%C3%A4me", "%E2%98%83", "a.b", "resnet50", "%2A", "*", "null", "undefined", "%7B%7D"]  # fmt: skip
    path_like = ["..", "../x", "..%2fx", "%2e%2e%2f", "%2e%2e", "..%2f..%2fetc%2fpasswd", "%252e%252e%252f", "..%5cx",
                 "%00", "x%00.onnx", ".", "...", "....//", "~root", "%24(id)", "%3Bls", "a%0d%0aSet-Cookie:%20x",
                 "%2fetc%2fpasswd", f"{t.name}%2f..%2f{t.name}", "..%00"]  # fmt: skip
    names = [n for n in names if n not in served]

    def each(category, name, words, k):
        endpoint = k % 5
        if endpoint == 0:
            b.add(
                category,
                "POST",
                f"/v1/models/{name}/predict",
                jpeg,
                {404},
                UNKNOWN,
                words,
                (("Content-Type", "image/jpeg"),),
            )
        elif endpoint == 1:
            b.add(category, "POST", f"/v2/models/{name}/infer", small_doc, {404}, UNKNOWN, words)
        elif endpoint == 2:
            b.add(category, "GET", f"/v2/models/{name}", b"", {404}, UNKNOWN, words)
        elif endpoint == 3:
            b.add(category, "GET", f"/v2/models/{name}/ready", b"", {404}, UNKNOWN, words)
        else:
            b.add(category, "POST", f"/v2/models/{name}/versions/1/infer", small_doc, {404}, UNKNOWN, words)

    for k, name in enumerate(names * 2):
        each("unknown_model", name, NOT_HERE, k)
    for k, name in enumerate(path_like * 4):
        each("path_like", name, NOT_HERE, k)
    for k, length in enumerate((65, 100, 256, 1000, 2000, 4000, 8000) * 3):
        each("long_names", "n" * length, NOT_HERE, k)
    for version in ("2", "0", "latest", "..", "%2e%2e", "1.0", "-1"):
        b.add(
            "unknown_model",
            "POST",
            f"/v2/models/{t.name}/versions/{version}/infer",
            small_doc,
            {404},
            UNKNOWN,
            NOT_HERE,
        )
        b.add("unknown_model", "GET", f"/v2/models/{t.name}/versions/{version}", b"", {404}, UNKNOWN, NOT_HERE)
        b.add("unknown_model", "GET", f"/v2/models/{t.name}/versions/{version}/ready", b"", {404}, UNKNOWN, NOT_HERE)


def rest_probes(b: Builder, jpeg: bytes) -> None:
    # No "99999": a top_k above the model's classes is capped to them, an answer, not a malformed request.
    for value in ("0", "-1", "abc", "1.5", "", "1e3", "%00", "4x", "NaN", "0x2", "%E2%98%83"):
        headers = (("Content-Type", "image/jpeg"),)
        b.add("bad_query", "POST", f"{b.predict}?top_k={value}", jpeg, {400}, MALFORMED, ("top_k",), headers)
    part = b'--bnd\r\nContent-Disposition: form-data; name="image"; filename="a.jpg"\r\n\r\n' + jpeg
    note = b'--bnd\r\nContent-Disposition: form-data; name="note"\r\n\r\nhello\r\n--bnd--\r\n'
    bodies = [
        (b"--other\r\n" + part[7:] + b"\r\n--other--\r\n", "bnd", "boundary"),
        (b"--bndXX" + part[5:] + b"\r\n--bnd--\r\n", "bnd", "crlf"),
        (b'--bnd\r\nContent-Disposition: form-data; name="image"' + jpeg, "bnd", "end of headers"),
        (part, "bnd", "not terminated"),
        (b"--bnd\r\nContent-Type: image/jpeg\r\n\r\n" + jpeg + b"\r\n--bnd--\r\n", "bnd", "content-disposition"),
        (b"--bnd\r\nbroken header line\r\n\r\n" + jpeg + b"\r\n--bnd--\r\n", "bnd", "without ':'"),
        (note, "bnd", "no file part"),
        (b"".join(b'--bnd\r\nContent-Disposition: form-data; name="f"\r\n\r\nx\r\n' for _ in range(300)) + b"--bnd--\r\n",
         "bnd", "256 parts"),
        (part + b"\r\n--bnd--\r\n", "b" * 201, "boundary"),
        (b"", "bnd", "boundary"),
        (part + b"\r\n--bnd--\r\n", '"bnd', "boundary"),
        (b"\r\n" * 100, "bnd", "boundary"),
    ]  # fmt: skip
    for body, boundary, words in bodies:
        b.rest("multipart", body, f"multipart/form-data; boundary={boundary}", (400,), MALFORMED, (words, "multipart"))
    for method, path in (("GET", b.predict), ("PUT", b.predict), ("DELETE", b.predict), ("PATCH", b.predict),
                         ("GET", b.infer), ("PUT", b.infer), ("DELETE", b.infer), ("POST", f"/v2/models/{b.t.name}"),
                         ("POST", "/v2/health/ready"), ("POST", "/metrics"), ("DELETE", "/v1/models"),
                         ("POST", f"/v2/models/{b.t.name}/ready"), ("PUT", "/v2"), ("POST", "/openapi.json")):  # fmt: skip
        b.add("wrong_method", method, path, b"", {405}, MALFORMED, ("method not allowed",))


def oversized_probes(b: Builder, limit: int, jpeg: bytes) -> None:
    over = [limit + 1, limit + 4096, 2 * limit]
    for size in over:
        b.rest("oversized", b"\xff" * size, "image/jpeg", (413,), ("body_too_large",), ("limit",), close_after=True)
        padded = b'{"inputs": []' + b" " * size + b"}"
        b.kserve_doc("oversized", padded, (413,), ("body_too_large",), ("limit",), close_after=True)
        b.multipart("oversized", jpeg + b"\x00" * size, (413,), ("body_too_large",), ("limit",), close_after=True)
    for size in (limit + 1, 3 * limit):
        b.rest("oversized", b"\xff" * size, "image/jpeg", (413,), ("body_too_large",), ("limit",), chunked=True,
               close_after=True)  # fmt: skip
        b.kserve_doc("oversized", b" " * size, (413,), ("body_too_large",), ("limit",), chunked=True, close_after=True)
    for declared in (limit + 1, 10**12):  # the header alone is enough to refuse; the body never comes
        b.add("oversized", "POST", b.predict, b"\xff" * 16, {413}, {"body_too_large"}, ("limit",),
              (("Content-Type", "image/jpeg"), ("Content-Length", str(declared))), close_after=True)  # fmt: skip
