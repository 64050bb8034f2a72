"""A generated corpus of malformed requests for the inference server (``gpufeed bench fuzz`` and its test).

:func:`malformed_corpus` returns well over a thousand :class:`Probe` s, deterministic for a seed,
each a complete request (method, raw path, headers, body) with what the server must answer: a
4xx status, the ``reason`` it must give and words its message must contain. Categories:

=====================  =====================================================================
category               what is wrong
=====================  =====================================================================
truncated_jpeg/png     cut at many points (REST body and KServe BYTES)
corrupt_image          garbage after a valid magic number, missing tables, damaged data
                       behind correct CRCs, zero-size headers, random bytes
bitflip_jpeg/png       1-8 flipped bits anywhere in the file
zero_bytes             empty bodies, empty files, empty BYTES elements
huge_dimensions        headers declaring up to 100000x100000 or 2^31-1 pixels (bombs)
wrong_content_type     a valid JPEG under the wrong Content-Type; GIF/BMP/TIFF/WebP/PDF bytes
malformed_json         truncated and invalid JSON, wrong field types, broken binary framing
oversized              bodies over serve.max_body_bytes (declared, and chunked)
wrong_shape/dtype      tensor shapes and datatypes the model does not take
unknown_model          names not served, other versions
path_like              ``../x``, ``%2e%2e%2f``, ``..%2f..%2fetc%2fpasswd``, NUL, CRLF, ...
long_names             65 to 8000 characters
bad_query, multipart   broken ``top_k``; malformed multipart bodies
wrong_method           GET on inference endpoints, DELETE, PUT
=====================  =====================================================================

A flipped bit inside JPEG entropy-coded data (or inside PNG data that a decoder tolerates) can
leave a file that still decodes, to different pixels: no checksum can tell. Those probes carry
``may_decode``: a 200 answer is then acceptable; every other answer must still be a proper 4xx.
"""

from __future__ import annotations

import io
import json
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Probe", "Target", "malformed_corpus"]


@dataclass(frozen=True)
class Target:
    """A served model as the corpus needs it."""

    name: str
    input_name: str
    sample_shape: tuple[int, ...]
    accepts_images: bool

    @classmethod
    def from_card(cls, card) -> Target:
        return cls(card.name, card.input_name, tuple(card.sample_shape), card.spec.task == "image")


@dataclass(frozen=True)
class Probe:
    """One malformed request and the answers that are acceptable."""

    category: str
    method: str
    path: str
    body: bytes
    statuses: frozenset[int]
    reasons: frozenset[str]
    words: tuple[str, ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    may_decode: bool = False
    chunked: bool = False
    close_after: bool = False  # the server may not read this body: use a fresh connection next
    note: str = field(default="", compare=False)


# -- building blocks ---------------------------------------------------------------------------------
def _images(rng: np.random.Generator) -> dict[str, bytes]:
    from PIL import Image

    yy, xx = np.mgrid[0:72, 0:96]
    base = np.stack([xx * 2, yy * 3, (xx + yy) * 2], -1) % 256
    pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
    out = {}
    for key, fmt, kwargs in (
        ("jpeg", "JPEG", {"quality": 90}),
        ("jpeg_progressive", "JPEG", {"quality": 85, "progressive": True}),
        ("png", "PNG", {}),
        ("png_small", "PNG", {"optimize": True}),
    ):
        buffer = io.BytesIO()
        Image.fromarray(pixels if key != "png_small" else pixels[:40, :50]).save(buffer, format=fmt, **kwargs)
        out[key] = buffer.getvalue()
    for fmt in ("GIF", "BMP", "TIFF", "WEBP"):
        buffer = io.BytesIO()
        Image.fromarray(pixels[:16, :16]).save(buffer, format=fmt)
        out[fmt.lower()] = buffer.getvalue()
    return out


def _png_chunk(kind: bytes, payload: bytes, crc: int | None = None) -> bytes:
    crc = zlib.crc32(kind + payload) if crc is None else crc
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc & 0xFFFFFFFF)


def png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares ``width x height`` (a decompression bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )


def jpeg_declaring(jpeg: bytes, width: int, height: int) -> bytes:
    """``jpeg`` with its SOF header rewritten to declare ``width x height`` (data unchanged)."""
    data = bytearray(jpeg)
    for marker in (b"\xff\xc0", b"\xff\xc2"):
        at = data.find(marker)
        if at >= 0:
            data[at + 5 : at + 9] = struct.pack(">HH", height, width)
            return bytes(data)
    raise ValueError("no SOF marker")


def _without_segment(jpeg: bytes, marker: int) -> bytes:
    data, pos, out = jpeg, 2, bytearray(jpeg[:2])
    while pos < len(data) and data[pos] == 0xFF and data[pos + 1] != 0xDA:
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if data[pos + 1] != marker:
            out += data[pos : pos + 2 + length]
        pos += 2 + length
    return bytes(out + data[pos:])


def _png_damaged_idat(png: bytes) -> bytes:
    data = bytearray(png)
    at = data.index(b"IDAT")
    (length,) = struct.unpack(">I", data[at - 4 : at])
    for k in range(at + 4 + 2, at + 4 + min(length, 80)):
        data[k] ^= 0x5A
    crc = zlib.crc32(bytes(data[at : at + 4 + length]))
    data[at + 4 + length : at + 8 + length] = struct.pack(">I", crc & 0xFFFFFFFF)
    return bytes(data)


def _bytes_blob(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


class _Builder:
    """Turns payloads into probes for one target model."""

    def __init__(self, target: Target) -> None:
        self.t = target
        self.probes: list[Probe] = []

    @property
    def predict(self) -> str:
        return f"/v1/models/{self.t.name}/predict"

    @property
    def infer(self) -> str:
        return f"/v2/models/{self.t.name}/infer"

    def add(self, category, method, path, body, statuses, reasons, words=(), headers=(), **kw) -> None:
        self.probes.append(
            Probe(
                category,
                method,
                path,
                body,
                frozenset(statuses),
                frozenset(reasons),
                tuple(words),
                tuple(headers),
                **kw,
            )
        )

    def rest(self, category, blob, content_type, statuses, reasons, words=(), **kw) -> None:
        self.add(
            category, "POST", self.predict, blob, statuses, reasons, words, (("Content-Type", content_type),), **kw
        )

    def multipart(self, category, blob, statuses, reasons, words=(), filename="a.jpg", **kw) -> None:
        body = (
            b'--bnd\r\nContent-Disposition: form-data; name="image"; filename="' + filename.encode() + b'"\r\n'
            b"Content-Type: image/jpeg\r\n\r\n" + blob + b"\r\n--bnd--\r\n"
        )
        self.rest(category, body, "multipart/form-data; boundary=bnd", statuses, reasons, words, **kw)

    def kserve_doc(self, category, doc, statuses, reasons, words=(), **kw) -> None:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        self.add(
            category, "POST", self.infer, body, statuses, reasons, words, (("Content-Type", "application/json"),), **kw
        )

    def kserve_binary(self, category, header: dict, blob: bytes, statuses, reasons, words=(), length=None, **kw):
        head = json.dumps(header).encode()
        headers = (
            ("Content-Type", "application/octet-stream"),
            ("Inference-Header-Content-Length", str(len(head) if length is None else length)),
        )
        self.add(category, "POST", self.infer, head + blob, statuses, reasons, words, headers, **kw)

    def kserve_images(self, category, blobs: list[bytes], statuses, reasons, words=(), **kw) -> None:
        blob = _bytes_blob(blobs)
        header = {
            "inputs": [
                {
                    "name": "image",
                    "datatype": "BYTES",
                    "shape": [len(blobs)],
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
        self.kserve_binary(category, header, blob, statuses, reasons, words, **kw)

    def pixels(
        self, category, shape, datatype="UINT8", *, binary=True, name=None, statuses=(400,), reasons=(), words=()
    ):
        name = name or self.t.input_name
        count = int(np.prod(shape)) if shape else 1
        if binary and datatype in ("UINT8", "INT8", "BOOL"):
            itemsize = 1
        else:
            itemsize = {"UINT16": 2, "INT16": 2, "FP16": 2, "UINT32": 4, "INT32": 4, "FP32": 4}.get(datatype, 8)
        if binary:
            blob = bytes(count * itemsize)
            header = {"inputs": [{"name": name, "datatype": datatype, "shape": list(shape),
                                  "parameters": {"binary_data_size": len(blob)}}]}  # fmt: skip
            self.kserve_binary(category, header, blob, statuses, reasons, words)
        else:
            zero = False if datatype == "BOOL" else 0  # valid JSON for the datatype: only the datatype is wrong
            doc = {"inputs": [{"name": name, "datatype": datatype, "shape": list(shape), "data": [zero] * count}]}
            self.kserve_doc(category, doc, statuses, reasons, words)


CORRUPT = ("corrupt_image",)
FORMAT_WORDS = ("truncated", "damaged", "not a jpeg or png", "empty", "no valid header")


def _image_probes(b: _Builder, rng: np.random.Generator, images: dict[str, bytes], max_pixels: int) -> None:
    # Truncated: cut points spread over each file, sent as a raw REST body and as a KServe BYTES element.
    for category, keys in (("truncated_jpeg", ("jpeg", "jpeg_progressive")), ("truncated_png", ("png", "png_small"))):
        for key in keys:
            blob = images[key]
            cuts = np.unique(np.linspace(1, len(blob) - 1, 50).astype(int))
            for k, cut in enumerate(cuts):
                part = blob[:cut]
                if k % 2 == 0:
                    b.rest(category, part, "image/png" if "png" in key else "image/jpeg", (400,), CORRUPT, FORMAT_WORDS)
                else:
                    b.kserve_images(category, [part], (400,), CORRUPT, FORMAT_WORDS)
    # Structurally corrupt.
    jpeg, png = images["jpeg"], images["png"]
    corrupt = [  # (bytes, may still decode)
        *((b"\xff\xd8\xff" + rng.bytes(n), False) for n in (1, 10, 100, 1000, 5000)),
        *((b"\x89PNG\r\n\x1a\n" + rng.bytes(n), False) for n in (1, 10, 100, 1000, 5000)),
        *((rng.bytes(n), False) for n in (1, 2, 16, 300, 4000)),
        (_without_segment(jpeg, 0xC4), True),  # no Huffman tables: decoders fall back to the standard ones
        (_without_segment(jpeg, 0xDB), False),  # no quantisation tables
        (jpeg_declaring(jpeg, 0, 72), False),
        (jpeg_declaring(jpeg, 96, 0), False),
        (jpeg[:620] + bytes(len(jpeg) - 622) + b"\xff\xd9", True),  # zeroed scan data is valid: a flat image
        (_png_damaged_idat(png), False),
        (png[:33] + _png_chunk(b"IDAT", b"not zlib at all" * 4) + _png_chunk(b"IEND", b""), False),
        (png[:16] + b"\x00" * 8 + png[24:], False),  # IHDR says 0x0 (and its CRC is now wrong)
        (png.replace(b"IEND", b"IENX"), False),
        (png[:8] + _png_chunk(b"IHDR", png[16:29], crc=0) + png[33:], False),
    ]
    statuses, reasons = (400, 415), (*CORRUPT, "unsupported_media_type")
    for k, (blob, may) in enumerate(corrupt):
        words = (*FORMAT_WORDS, "empty size", "supported formats")
        if k % 2 == 0:
            b.rest("corrupt_image", blob, "image/jpeg", statuses, reasons, words, may_decode=may)
        else:
            b.kserve_images("corrupt_image", [blob], statuses, reasons, words, may_decode=may)
    # Bit flips.
    for category, key in (("bitflip_jpeg", "jpeg"), ("bitflip_png", "png")):
        blob = images[key]
        for k in range(200):
            data = bytearray(blob)
            for _ in range(int(rng.integers(1, 9))):
                at = int(rng.integers(0, len(data) * 8))
                data[at // 8] ^= 1 << (at % 8)
            statuses, reasons = (400, 415), (*CORRUPT, "unsupported_media_type", "too_many_pixels")
            words = (*FORMAT_WORDS, "pixels", "supported formats", "empty size")
            ct = "image/png" if key == "png" else "image/jpeg"
            if k % 3 == 2:
                b.kserve_images(category, [bytes(data)], statuses, reasons, words, may_decode=True)
            else:
                b.rest(category, bytes(data), ct, statuses, reasons, words, may_decode=True)
    # Zero bytes.
    for ct in ("image/jpeg", "image/png", "image/jpg"):
        b.rest("zero_bytes", b"", ct, (400,), CORRUPT, ("empty",))
    b.multipart("zero_bytes", b"", (400,), CORRUPT, ("empty",))
    b.kserve_images("zero_bytes", [b""], (400,), CORRUPT, ("empty",))
    b.kserve_images("zero_bytes", [jpeg, b""], (400,), CORRUPT, ("empty",))
    b.kserve_doc("zero_bytes", {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": [""]}]},
                 (400,), CORRUPT, ("empty",))  # fmt: skip
    b.kserve_doc("zero_bytes", b"", (400,), ("malformed_request",), ("json",))
    b.rest("zero_bytes", b"", "multipart/form-data; boundary=bnd", (400,), ("malformed_request",), ("boundary",))
    b.kserve_doc("zero_bytes", {}, (400,), ("malformed_request",), ("inputs",))
    # Huge declared dimensions.
    side = int(max_pixels**0.5) + 1
    sizes = [(100000, 100000), (65535, 65535), (2**31 - 1, 1), (1, 2**31 - 1), (50000, 3000), (side, side)]
    for width, height in sizes:
        png_bomb = png_declaring(width, height)
        words = ("pixels",)
        b.rest("huge_dimensions", png_bomb, "image/png", (400,), ("too_many_pixels",), words)
        b.multipart("huge_dimensions", png_bomb, (400,), ("too_many_pixels",), words, filename="bomb.png")
        b.kserve_images("huge_dimensions", [png_bomb], (400,), ("too_many_pixels",), words)
        if width <= 65535 and height <= 65535:
            jpeg_bomb = jpeg_declaring(jpeg, width, height)
            b.rest("huge_dimensions", jpeg_bomb, "image/jpeg", (400,), ("too_many_pixels",), words)
            b.kserve_images("huge_dimensions", [jpeg_bomb], (400,), ("too_many_pixels",), words)
    # Wrong content types and formats.
    for ct in ("text/plain", "application/json", "application/octet-stream", "image/gif", "image/webp", "image/bmp",
               "image", "image/", "garbage", "multipart/mixed", "application/x-www-form-urlencoded",
               "text/html; charset=utf-8", "video/mp4", ";", "x" * 300):  # fmt: skip
        b.rest("wrong_content_type", jpeg, ct, (415,), ("unsupported_media_type",), ("content-type",))
    b.add("wrong_content_type", "POST", b.predict, jpeg, {415}, {"unsupported_media_type"}, ("content-type",))
    for fmt in ("gif", "bmp", "tiff", "webp"):
        words = ("supported formats",)
        b.rest("wrong_content_type", images[fmt], "image/jpeg", (415,), ("unsupported_media_type",), words)
        b.kserve_images("wrong_content_type", [images[fmt]], (415,), ("unsupported_media_type",), words)
    b.rest(
        "wrong_content_type", b"%PDF-1.4\n" + rng.bytes(200), "image/png", (415,), ("unsupported_media_type",), ("PDF",)
    )
    b.rest("wrong_content_type", jpeg, "multipart/form-data", (400,), ("malformed_request",), ("boundary",))
    header = {"inputs": [{"name": "image", "datatype": "BYTES", "shape": [1], "data": ["x"]}]}
    b.add("wrong_content_type", "POST", b.infer, json.dumps(header).encode(), {415}, {"unsupported_media_type"},
          ("content-encoding",), (("Content-Encoding", "gzip"),))  # fmt: skip


MALFORMED = ("malformed_request",)


def _json_probes(b: _Builder, rng: np.random.Generator) -> None:
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
    blob = _bytes_blob([b"abc"])
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


def _tensor_probes(b: _Builder, max_images: int, max_body_bytes: int) -> None:
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
    for datatype in ("uint8", "FLOAT32", "", "STRING", "BF16", 5, None, ["UINT8"], {"t": 1}, "UINT8 "):
        doc = {"inputs": [{"name": t.input_name, "datatype": datatype, "shape": [1], "data": [0]}]}
        b.kserve_doc("wrong_dtype", doc, (400,), ("bad_dtype",), ("datatype",))
    if t.accepts_images:
        for datatype in ("UINT8", "FP32", "INT64"):
            doc = {"inputs": [{"name": "image", "datatype": datatype, "shape": [1], "data": [1]}]}
            b.kserve_doc("wrong_dtype", doc, (400,), ("bad_dtype",), ("bytes",))
    else:
        b.kserve_images("wrong_dtype", [b"\xff\xd8\xff"], (400,), ("bad_dtype",), ("clip model",))


UNKNOWN = ("unknown_model",)
NOT_HERE = ("not served here", "no such model", "only version 1")


def _name_probes(b: _Builder, served: list[str], jpeg: bytes) -> None:
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


def _rest_probes(b: _Builder, jpeg: bytes) -> None:
    for value in ("0", "-1", "abc", "99999", "1.5", "", "1e3", "%00", "4x", "NaN", "0x2", "%E2%98%83"):
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


def _oversized_probes(b: _Builder, limit: int, jpeg: bytes) -> None:
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


def malformed_corpus(
    targets: list[Target], *, max_body_bytes: int, max_image_pixels: int, max_images_per_request: int, seed: int = 0
) -> list[Probe]:
    """Every malformed request of the corpus for the served ``targets`` (deterministic for ``seed``).

    Args:
        targets: The served models (image models get the image categories).
        max_body_bytes, max_image_pixels, max_images_per_request: The server's limits (``serve.*``):
            the oversized, huge-dimension and too-many-rows probes are sized against them.
    """
    rng = np.random.default_rng(seed)
    images = _images(rng)
    probes: list[Probe] = []
    served = [t.name for t in targets]
    for k, target in enumerate(targets):
        b = _Builder(target)
        if target.accepts_images:
            _image_probes(b, rng, images, max_image_pixels)
            _rest_probes(b, images["jpeg"])
        _json_probes(b, rng)
        _tensor_probes(b, max_images_per_request, max_body_bytes)
        if k == 0:
            _name_probes(b, served, images["jpeg"])
            _oversized_probes(b, max_body_bytes, images["jpeg"])
        probes += b.probes
    return probes
