"""KServe v2 input tensors' data, for both fronts: datatypes, element counts, JSON values, raw bytes, base64.

The HTTP parser (:mod:`._kserve`) and the gRPC one (:mod:`._grpc_tensors`) check an input's
datatype and element count, frame its BYTES elements and decode its base64 here, so both refuse
the same input with the same message.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from dataclasses import dataclass

import numpy as np

from gpufeed.server._errors import RequestError, shown

__all__ = [
    "BASE64",
    "DTYPES",
    "InferInput",
    "content_type_of",
    "datatype_of",
    "decode_base64",
    "decode_content",
    "element_count",
    "fill_from_bytes",
    "json_elements",
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


def _bad(message: str, reason: str = "malformed_request") -> RequestError:
    return RequestError(reason, message)


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


def json_elements(data, datatype: str, count: int, where: str):
    """A JSON ``data`` field's ``count`` values: UTF-8 bytes for BYTES, else a flat array of ``datatype``."""
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


def datatype_of(value, where: str) -> str:
    """``value`` when it is a KServe v2 datatype (``BYTES`` or one of :data:`DTYPES`).

    Raises:
        RequestError: ``bad_dtype`` naming ``where``, the value and the allowed datatypes.
    """
    if not isinstance(value, str) or (value != "BYTES" and value not in DTYPES):
        raise RequestError(
            "bad_dtype",
            f"{where}: datatype {shown(value, 40)} is not a KServe v2 datatype; allowed: BYTES, {', '.join(DTYPES)}",
        )
    return value


def element_count(shape: tuple[int, ...], max_elements: int | None, where: str) -> int:
    """The elements ``shape`` holds, refused (``bad_shape``) over ``max_elements`` before any data is read."""
    count = math.prod(shape)  # Python integers: a shape like [2**62, 4] cannot wrap around
    if max_elements is not None and count > max_elements:
        raise RequestError(
            "bad_shape",
            f"{where}: shape {list(shape)} holds {count:,} elements; the limit is {max_elements:,} "
            "(serve.max_images_per_request rows of the model's input)",
        )
    return count


def fill_from_bytes(tensor: InferInput, blob: bytes, count: int, where: str, source: str) -> None:
    """Set ``tensor``'s data from its raw bytes: 4-byte length prefixed BYTES elements, else a numeric array.

    Args:
        tensor: The input, its datatype and shape already checked.
        blob: Its bytes.
        count: The elements its shape holds.
        where: Names the input in errors.
        source: Names the bytes in errors (``binary``, ``raw``).
    """
    if tensor.datatype == "BYTES":
        tensor.elements = split_bytes(blob, count, where)
        return
    dtype = DTYPES[tensor.datatype]
    if len(blob) != count * dtype.itemsize:
        raise RequestError(
            "bad_shape",
            f"{where}: {len(blob)} {source} bytes do not match shape {list(tensor.shape)} of {tensor.datatype} "
            f"({count * dtype.itemsize} bytes)",
        )
    tensor.array = np.frombuffer(blob, dtype=dtype).reshape(tensor.shape)


def decode_content(tensor: InferInput, where: str) -> None:
    """Decode ``tensor``'s BYTES elements in place when its content type says base64."""
    if tensor.content_type in BASE64 and tensor.elements is not None:  # BYTES only (content_type_of)
        tensor.elements = decode_base64(tensor.elements, where)
