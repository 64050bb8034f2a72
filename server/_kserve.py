"""KServe v2 / Open Inference Protocol over HTTP: request parsing and response encoding, HTTP-free.

Requests are parsed here; responses are encoded by :mod:`._kserve_response`.

Supported: JSON tensors (``data``, flat or nested, row-major) and the binary tensor data
extension: with header ``Inference-Header-Content-Length: L`` the body's first L bytes are the JSON
header and each input with ``parameters.binary_data_size`` takes that many bytes of the rest, in
input order; a BYTES element is a 4-byte little-endian length followed by its bytes. Responses
are binary per output when the request says ``binary_data_output`` or an output's
``binary_data``, JSON otherwise. The classification extension (``parameters.classification: K``
on an output) returns the top K as ``"value:index:label"`` BYTES, as Triton does. Shared-memory
parameters are refused (the server shares no memory with clients).

Every problem is a :class:`RequestError` naming the field at fault. Nothing a client sends can
make parsing fail otherwise: integer literals longer than Python converts (4,300 digits) are
refused naming their field, dimensions must fit an unsigned 64-bit integer, strings that are not
valid Unicode (a lone surrogate such as ``"\\ud800"``) are refused naming the element, and a
declared element count over ``max_elements`` is refused before any data is converted.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from gpufeed.server._errors import RequestError, shown

__all__ = [
    "BASE64",
    "DTYPES",
    "InferInput",
    "InferRequest",
    "RequestedOutput",
    "content_type_of",
    "decode_base64",
    "parse_request",
    "split_bytes",
]

DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}
# content_type values meaning "each BYTES element is base64": MLServer's and KServe's "base64", and
# "pillow_image" of MLServer's HuggingFace runtime (base64 of the encoded image file).
BASE64 = frozenset({"base64", "pillow_image"})
_MAX_DIMS = 8
_MAX_DIM = 2**64 - 1  # "each dimension must be an integer representable as an unsigned 64-bit integer"


class LongInteger:
    """Stands for an integer literal too long for Python to convert (over 4,300 digits): never a valid value."""

    __slots__ = ("digits",)

    def __init__(self, literal: str) -> None:
        self.digits = len(literal.lstrip("-"))

    def __repr__(self) -> str:
        return f"<an integer of {self.digits:,} digits>"


def _bounded_int(literal: str):
    try:
        return int(literal)
    except ValueError:
        return LongInteger(literal)


def _loads(head: bytes):
    """``json.loads``, with integer literals Python refuses to convert kept as :class:`LongInteger`."""
    try:
        return json.loads(head)
    except json.JSONDecodeError:
        raise
    except ValueError:  # "Exceeds the limit (4300 digits) for integer string conversion"
        # Parse again, slower, so the over-long literal can be named by the field that holds it.
        return json.loads(head, parse_int=_bounded_int)


@dataclass
class InferInput:
    """One input tensor: numeric ``array`` (numpy, shaped) or ``elements`` (BYTES, flat list).

    ``content_type`` is the one the input (or the request) declared, if any; ``text`` is true when
    the BYTES elements came as JSON strings with no content type (their UTF-8 bytes).
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray | None = None
    elements: list[bytes] | None = None
    content_type: str | None = None
    text: bool = False


@dataclass
class RequestedOutput:
    name: str
    binary: bool | None = None
    classification: int = 0


@dataclass
class InferRequest:
    id: str | None
    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None
    binary_output: bool = False
    parameters: dict = field(default_factory=dict)


def _bad(message: str, reason: str = "malformed_request") -> RequestError:
    return RequestError(reason, message)


def _shape(raw, where: str) -> tuple[int, ...]:
    ok = isinstance(raw, list) and len(raw) <= _MAX_DIMS
    if ok:
        ok = all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= _MAX_DIM for d in raw)
    if not ok:
        raise _bad(
            f"{where} 'shape' must be a list of at most {_MAX_DIMS} non-negative integers below 2**64, got {shown(raw)}"
        )
    return tuple(raw)


def split_bytes(blob: bytes, count: int, where: str) -> list[bytes]:
    elements, pos = [], 0
    while pos < len(blob):
        if pos + 4 > len(blob):
            raise _bad(f"{where}: BYTES data ends inside an element's 4-byte length prefix")
        (length,) = struct.unpack_from("<I", blob, pos)
        pos += 4
        if pos + length > len(blob):
            raise _bad(f"{where}: a BYTES element claims {length} bytes but only {len(blob) - pos} remain")
        elements.append(blob[pos : pos + length])
        pos += length
    if len(elements) != count:
        raise RequestError("bad_shape", f"{where}: shape holds {count} elements but the BYTES data has {len(elements)}")
    return elements


def _utf8(value: str, k: int, where: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\\ud800") is JSON but not text
        raise _bad(f"{where}: BYTES element {k} is not valid Unicode text: {shown(value, 60)}") from None


def decode_base64(elements: list[bytes], where: str) -> list[bytes]:
    """Decode base64 BYTES elements (standard or URL-safe alphabet; line breaks and missing padding allowed).

    Raises:
        RequestError: ``malformed_request`` naming ``where`` and the element that is not base64.
    """
    out = []
    for k, element in enumerate(elements):
        text = b"".join(bytes(element).split())  # `base64` wraps its output at 76 columns
        altchars = b"-_" if (b"-" in text or b"_" in text) else None
        text += b"=" * (-len(text) % 4)
        try:
            out.append(base64.b64decode(text, altchars=altchars, validate=True))
        except (binascii.Error, ValueError) as err:
            raise _bad(f"{where}: BYTES element {k} is not valid base64 ({err}): {shown(bytes(element), 60)}") from None
    return out


def content_type_of(tensor_params: dict, request_params: dict, datatype: str, where: str) -> str | None:
    """The content type that applies to one input: its own, else the request's (BYTES inputs only).

    Raises:
        RequestError: The content type is not a string, or base64 is declared for a non-BYTES input.
    """
    value = tensor_params.get("content_type")
    if value is None and datatype == "BYTES":
        value = request_params.get("content_type")
    if value is None:
        return None
    if not isinstance(value, str):
        raise _bad(f"{where}: parameters.content_type must be a string, got {shown(value, 60)}")
    if value in BASE64 and datatype != "BYTES":
        raise RequestError("bad_dtype", f"{where}: content_type {value!r} is for BYTES inputs, not {datatype}")
    return value


def _json_elements(data, datatype: str, count: int, where: str):
    flat = _flatten(data, count, where)
    if len(flat) != count:
        raise RequestError("bad_shape", f"{where}: shape holds {count} elements but 'data' has {len(flat)}")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise _bad(f"{where}: BYTES 'data' must be strings in JSON; send binary data for raw bytes")
        return [_utf8(v, k, where) for k, v in enumerate(flat)]
    dtype = DTYPES[datatype]
    # JSON true/false for BOOL, integers for integer types (1.5 is not silently truncated), any number for floats.
    allowed = {"b": "b", "u": "iu", "i": "iu", "f": "iuf"}[dtype.kind]
    try:
        values = np.asarray(flat) if flat else np.zeros(0, dtype)
    except (TypeError, ValueError, OverflowError):
        values = None
    if values is None or values.dtype.kind not in allowed:
        raise _bad(f"{where}: 'data' holds values that are not {datatype} numbers")
    if dtype.kind in "ui":
        info = np.iinfo(dtype)
        if len(values) and (values.min() < info.min or values.max() > info.max):
            raise _bad(f"{where}: 'data' values must lie in [{info.min}, {info.max}] for {datatype}")
    return values.astype(dtype)


def _params(node: dict) -> dict:
    """``node["parameters"]`` (absent or null: empty); anything but an object is refused by the caller."""
    value = node.get("parameters")
    return {} if value is None else value


def _flatten(data, count: int, where: str) -> list:
    """The values of ``data`` (flat or nested), row-major; stops once it holds more than ``count``."""
    if not isinstance(data, list):
        raise _bad(f"{where} 'data' must be a list, got {type(data).__name__}")
    if len(data) > count:  # more values than the shape holds, even before looking inside
        raise RequestError("bad_shape", f"{where}: shape holds {count} elements but 'data' has more")
    out, stack = [], [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            out.append(value)
            if len(out) > count:
                raise RequestError("bad_shape", f"{where}: shape holds {count} elements but 'data' has more")
        else:
            stack.pop()
    return out


def _header_length(raw: str, body_bytes: int) -> int:
    try:
        size = int(raw)
    except ValueError:
        raise _bad(f"header Inference-Header-Content-Length must be an integer, got {shown(raw, 60)}") from None
    if not 0 < size <= body_bytes:
        raise _bad(f"header Inference-Header-Content-Length {size} is outside the body's {body_bytes} bytes")
    return size


def _request_id(doc: dict) -> str | None:
    value = doc.get("id")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # clients that send numbers get them back as strings
    raise _bad(f"'id' must be a string, got {shown(value, 60)}")


def parse_request(body: bytes, header_length: str | None, max_elements: int | None = None) -> InferRequest:
    """Parse an infer request body (JSON, or JSON header plus binary tensor data).

    Args:
        body: The whole (decompressed) request body.
        header_length: The ``Inference-Header-Content-Length`` header, if any.
        max_elements: Most elements one input may declare; a larger ``shape`` is refused
            (``bad_shape``) before its data is looked at.
    """
    if header_length is not None:
        size = _header_length(header_length, len(body))
        head, binary = body[:size], memoryview(body)[size:]
    else:
        head, binary = body, memoryview(b"")
    try:
        doc = _loads(head)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _bad(f"the request's JSON header is not valid JSON: {err}") from None
    except RecursionError:  # "[[[[...": deeper than the parser's stack, never a real request
        raise _bad("the request's JSON header is nested too deeply") from None
    if not isinstance(doc, dict):
        raise _bad(f"the request must be a JSON object, got {type(doc).__name__}")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _bad("the request needs a non-empty 'inputs' list")
    params = _params(doc)
    if not isinstance(params, dict):
        raise _bad("'parameters' must be an object")
    request_id = _request_id(doc)
    inputs, offset = [], 0
    for k, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise _bad(f"inputs[{k}] must be an object with a string 'name'")
        where = f"input {shown(raw['name'], 80)}"
        datatype = raw.get("datatype")
        if not isinstance(datatype, str) or (datatype != "BYTES" and datatype not in DTYPES):
            raise RequestError(
                "bad_dtype",
                f"{where}: datatype {shown(datatype, 40)} is not a KServe v2 datatype; allowed: BYTES, {', '.join(DTYPES)}",
            )
        shape = _shape(raw.get("shape"), where)
        count = math.prod(shape)  # Python integers: a shape like [2**62, 4] cannot wrap around
        if max_elements is not None and count > max_elements:
            raise RequestError(
                "bad_shape",
                f"{where}: shape {list(shape)} holds {count:,} elements; the limit is {max_elements:,} "
                "(serve.max_images_per_request rows of the model's input)",
            )
        p = _params(raw)
        if not isinstance(p, dict):
            raise _bad(f"{where}: 'parameters' must be an object")
        if any(key.startswith("shared_memory") for key in p):
            raise _bad(f"{where}: shared memory inputs are not supported; send the data in the request")
        tensor = InferInput(raw["name"], datatype, shape, content_type=content_type_of(p, params, datatype, where))
        if "binary_data_size" in p:
            size = p["binary_data_size"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(binary):
                raise _bad(
                    f"{where}: binary_data_size {shown(size, 60)} does not fit the {len(binary) - offset} "
                    "binary bytes left"
                )
            blob = bytes(binary[offset : offset + size])
            offset += size
            if datatype == "BYTES":
                tensor.elements = split_bytes(blob, count, where)
            else:
                dtype = DTYPES[datatype]
                if size != count * dtype.itemsize:
                    raise RequestError(
                        "bad_shape",
                        f"{where}: {size} binary bytes do not match shape {list(shape)} of {datatype} "
                        f"({count * dtype.itemsize} bytes)",
                    )
                tensor.array = np.frombuffer(blob, dtype=dtype).reshape(shape)
        elif "data" in raw:
            values = _json_elements(raw["data"], datatype, count, where)
            if datatype == "BYTES":
                tensor.elements = values
                tensor.text = tensor.content_type is None
            else:
                tensor.array = values.reshape(shape)
        else:
            raise _bad(f"{where} has neither 'data' nor parameters.binary_data_size")
        if tensor.content_type in BASE64 and tensor.elements is not None:  # BYTES only (content_type_of)
            tensor.elements = decode_base64(tensor.elements, where)
        inputs.append(tensor)
    if offset != len(binary):
        raise _bad(f"{len(binary) - offset} bytes of binary data after the inputs belong to no input")
    outputs = None
    if doc.get("outputs") is not None:
        if not isinstance(doc["outputs"], list):
            raise _bad("'outputs' must be a list")
        outputs = []
        for k, raw in enumerate(doc["outputs"]):
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise _bad(f"outputs[{k}] must be an object with a string 'name'")
            where = f"output {shown(raw['name'], 80)}"
            p = _params(raw)
            if not isinstance(p, dict):
                raise _bad(f"{where}: 'parameters' must be an object")
            if any(key.startswith("shared_memory") for key in p):
                raise _bad(f"{where}: shared memory outputs are not supported")
            classes = p.get("classification", 0)
            if not isinstance(classes, int) or isinstance(classes, bool) or classes < 0:
                raise _bad(f"{where}: parameters.classification must be a non-negative integer")
            binary_flag = p.get("binary_data")
            outputs.append(RequestedOutput(raw["name"], None if binary_flag is None else bool(binary_flag), classes))
    return InferRequest(
        id=request_id,
        inputs=inputs,
        outputs=outputs,
        binary_output=bool(params.get("binary_data_output", False)),
        parameters=params,
    )
