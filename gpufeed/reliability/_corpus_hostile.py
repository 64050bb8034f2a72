"""Requests a hostile client sends to break the parser rather than the model: each must get a 4xx.

=====================  ============================================================================
category               what is sent
=====================  ============================================================================
long_integers          integer literals of 4,301 to 50,000 digits (over Python's conversion limit)
                       in ``id``, ``shape``, ``binary_data_size``, ``data``, ``classification`` and
                       ``Inference-Header-Content-Length``; dimensions beyond 2**64
bad_unicode            lone surrogates (``"\\ud800"``) in BYTES data, input and output names,
                       ``id``, parameters; invalid UTF-8 in model names and JSON
content_encoding       gzip/deflate bombs (inflating past the body limit), truncated, corrupt or
                       trailing-garbage compressed bodies, unknown and stacked codings, on the
                       KServe and the REST endpoint
large_json             bodies just under the limit made of what JSON parsers find expensive: ``[],``
                       and ``{},`` runs, deep-but-legal nesting, declared shapes over the
                       per-request element limit, more values than the shape holds
large_heads            request heads from one byte over ``serve.max_header_bytes`` to 100 KB (431)
=====================  ============================================================================
"""

from __future__ import annotations

import gzip
import json
import zlib

from gpufeed.reliability._probe import Builder, bytes_blob

__all__ = ["hostile_probes", "large_head_probes"]

MALFORMED = ("malformed_request",)
LONG = "9" * 4301  # one digit over CPython's int/str conversion limit


def _long_integer_probes(b: Builder) -> None:
    t, shape = b.t, list(b.t.sample_shape)
    count = 1
    for d in shape:
        count *= d
    pixels = {"name": t.input_name, "datatype": "UINT8", "shape": [1, *shape], "data": [0] * count}
    base = json.dumps({"inputs": [pixels]})
    cases = [
        (base.replace('{"inputs"', '{"id": 0, "inputs"', 1).replace('"id": 0', f'"id": {LONG}'), "'id'"),
        (base.replace('{"inputs"', '{"id": -0, "inputs"', 1).replace('"id": -0', f'"id": -{"7" * 50_000}'), "'id'"),
        (base.replace('"shape": [1,', f'"shape": [{LONG},', 1), "shape"),
        (base.replace('"shape": [1,', f'"shape": [{"1" + "0" * 4000},', 1), "shape"),  # converts, but over 2**64
        (base.replace('"shape": [1,', f'"shape": [{2**64},', 1), "shape"),
        (base.replace('"data": [0,', f'"data": [{LONG},', 1), "not uint8 numbers"),
        (base[:-1] + f', "outputs": [{{"name": "scores", "parameters": {{"classification": {LONG}}}}}]}}', "classification"),
    ]  # fmt: skip
    for text, words in cases:
        b.kserve_doc("long_integers", text.encode(), (400,), (*MALFORMED, "bad_shape"), (words,))
    blob = bytes(count)
    header = {"inputs": [{"name": t.input_name, "datatype": "UINT8", "shape": [1, *shape],
                          "parameters": {"binary_data_size": 0}}]}  # fmt: skip
    head = json.dumps(header).replace('"binary_data_size": 0', f'"binary_data_size": {LONG}').encode()
    b.add("long_integers", "POST", b.infer, head + blob, {400}, MALFORMED, ("binary_data_size",),
          (("Content-Type", "application/octet-stream"), ("Inference-Header-Content-Length", str(len(head)))))  # fmt: skip
    b.kserve_binary("long_integers", header, blob, (400,), MALFORMED, ("Inference-Header-Content-Length",),
                    length=LONG)  # fmt: skip


def _unicode_probes(b: Builder) -> None:
    t = b.t
    lone = "\ud800"
    docs = [
        ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [lone]}]}, "unicode"),
        ({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [2], "data": ["ok", "a" + lone]}]}, "element 1"),
        ({"inputs": [{"name": lone, "datatype": "UINT8", "shape": [1], "data": [0]}]}, "no input"),
        ({"inputs": [{"name": t.input_name + lone, "datatype": "BYTES", "shape": [1], "data": ["x"]}]}, "input"),
        ({"inputs": [{"name": "image", "datatype": lone, "shape": [1], "data": ["x"]}]}, "datatype"),
        ({"id": lone, "inputs": [{"name": lone, "datatype": "BYTES", "shape": [1], "data": [lone]}]}, "input"),
    ]
    for doc, words in docs:
        text = json.dumps(doc).encode()  # ASCII: the surrogate travels as the escape \ud800
        reasons = (*MALFORMED, "bad_dtype", "bad_shape", "unsupported_media_type")
        b.kserve_doc("bad_unicode", text, (400, 415), reasons, (words,))
    for raw in (b'{"inputs": [{"name": "\xed\xa0\x80", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}',
                b'{"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["\xff\xfe"]}]}'):  # fmt: skip
        # json.loads reads the encoded surrogate (ED A0 80) as "\ud800"; FF FE is not UTF-8 at all.
        b.kserve_doc("bad_unicode", raw, (400,), MALFORMED, ("not valid json", "no input"))
    for name in ("%ED%A0%80", "%FF%FE", "%C0%AF"):
        b.add("bad_unicode", "POST", f"/v2/models/{name}/infer", b"{}", {404}, {"unknown_model"}, ("not served",))


def _encoding_probes(b: Builder, limit: int, jpeg: bytes) -> None:
    t = b.t
    small = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}).encode()
    bomb = bytes(limit * 4)  # inflates to four times the body limit from a few hundred bytes
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    raw_bomb = raw.compress(bomb) + raw.flush()
    cases = [
        (gzip.compress(bomb), "gzip", 413, ("body_too_large",), "inflates"),
        (zlib.compress(bomb), "deflate", 413, ("body_too_large",), "inflates"),
        (raw_bomb, "deflate", 413, ("body_too_large",), "inflates"),
        (gzip.compress(bomb), "x-gzip", 413, ("body_too_large",), "inflates"),
        (gzip.compress(small)[:-12], "gzip", 400, MALFORMED, "gzip"),
        (gzip.compress(small) + b"trailing", "gzip", 400, MALFORMED, "after the end"),
        (small, "gzip", 400, MALFORMED, "gzip"),
        (b"\x1f\x8b" + bytes(40), "gzip", 400, MALFORMED, "gzip"),
        (b"", "gzip", 400, MALFORMED, "gzip"),
        (small, "deflate", 400, MALFORMED, ("deflate", "not valid json")),
        (zlib.compress(small), "br", 415, ("unsupported_media_type",), "content-encoding"),
        (gzip.compress(gzip.compress(small)), "gzip, gzip", 415, ("unsupported_media_type",), "content-encoding"),
        (small, "compress", 415, ("unsupported_media_type",), "content-encoding"),
        (small, "zstd", 415, ("unsupported_media_type",), "content-encoding"),
        (small, "gzip;q=1", 415, ("unsupported_media_type",), "content-encoding"),
    ]
    for body, coding, status, reasons, words in cases:
        headers = (("Content-Type", "application/json"), ("Content-Encoding", coding))
        words = (words,) if isinstance(words, str) else words
        b.add("content_encoding", "POST", b.infer, body, {status}, reasons, words, headers)
    if t.accepts_images:
        for body, coding, status, reasons, words in cases[:7]:
            headers = (("Content-Type", "image/jpeg"), ("Content-Encoding", coding))
            b.add("content_encoding", "POST", b.predict, body, {status}, reasons, words, headers)
        # Compressed bytes are never taken for an image: a gzip'd JPEG sent without its coding is refused.
        b.rest("content_encoding", gzip.compress(jpeg), "image/jpeg", (400,), ("corrupt_image",), ("not a jpeg",))


def _large_json_probes(b: Builder, limit: int, max_images: int) -> None:
    t, shape = b.t, list(b.t.sample_shape)
    count = 1
    for d in shape:
        count *= d
    room = limit - 200

    def pixels_doc(data_text: str, rows: int = 1) -> bytes:
        return (f'{{"inputs": [{{"name": "{t.input_name}", "datatype": "UINT8", "shape": [{rows}, '
                f'{", ".join(map(str, shape))}], "data": {data_text}}}]}}').encode()  # fmt: skip

    for unit, words in (("[],", "elements"), ("{},", "elements"), ("null,", "elements"), ('"",', "elements"),
                        ("7,", "elements"), ("[[7]],", "elements")):  # fmt: skip
        text = "[" + unit * (room // len(unit)) + "0]"
        b.kserve_doc("large_json", pixels_doc(text), (400,), ("bad_shape",), (words,))
    deep = "[" * 900 + "0" + "]" * 900  # nested, but within the parser's reach
    b.kserve_doc("large_json", pixels_doc(deep), (400,), ("bad_shape",), ("elements",))
    over = max_images + 1
    b.kserve_doc("large_json", pixels_doc("[0]", rows=over * 1000), (400,), ("bad_shape",), ("the limit is",))
    spaced = pixels_doc("[" + ", ".join(["0"] * count) + "]" + " " * (room - 4 * count))
    if len(spaced) < limit:
        b.kserve_doc("large_json", spaced.replace(b'"shape": [1,', b'"shape": [2,', 1), (400,), ("bad_shape",),
                     ("elements",))  # fmt: skip
    strings = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x" * room]}]}
    statuses = (400, 415) if t.accepts_images else (400,)
    b.kserve_doc("large_json", strings, statuses, ("corrupt_image", "bad_dtype"), ("image", "clip"))
    many = bytes_blob([b"x"] * (room // 5))
    header = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [room // 5],
                          "parameters": {"binary_data_size": len(many)}}]}  # fmt: skip
    b.kserve_binary("large_json", header, many, (400,), ("bad_shape", "bad_dtype"), ("limit", "elements", "clip"))


def _large_head_probes(b: Builder, max_header_bytes: int) -> None:
    for size in (max_header_bytes + 1, 66 * 1024, 80 * 1024, 100 * 1024):
        filler = "a" * (size - len(b.infer) - 60)  # the request line and the other headers take the rest
        b.add("large_heads", "GET", "/v2/health/live", b"", {431}, MALFORMED, ("serve.max_header_bytes",),
              (("X-Filler", filler),), close_after=True)  # fmt: skip


def hostile_probes(b: Builder, *, max_body_bytes: int, max_images: int, jpeg: bytes) -> None:
    """Add the per-model hostile categories to ``b`` (sized against the server's limits)."""
    _long_integer_probes(b)
    _unicode_probes(b)
    _encoding_probes(b, max_body_bytes, jpeg)
    _large_json_probes(b, max_body_bytes, max_images)


def large_head_probes(b: Builder, max_header_bytes: int) -> None:
    """Request heads over ``serve.max_header_bytes`` (server-wide: one target is enough)."""
    _large_head_probes(b, max_header_bytes)
