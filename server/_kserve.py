"""KServe v2 / Open Inference Protocol over HTTP: request parsing and response encoding, HTTP-free.

Requests are parsed here, an input's data by :mod:`._kserve_tensors` (shared with the gRPC front);
responses are encoded by :mod:`._kserve_response`.

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

import json
from dataclasses import dataclass, field

from gpufeed.server._errors import RequestError, shown

# BASE64, DTYPES, content_type_of, decode_base64 and split_bytes are re-exported: the server's
# modules import the request's parts from here.
from gpufeed.server._kserve_tensors import (
    BASE64,
    DTYPES,
    InferInput,
    content_type_of,
    datatype_of,
    decode_base64,
    decode_content,
    element_count,
    fill_from_bytes,
    json_elements,
    split_bytes,
)

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


def _params(node: dict) -> dict:
    """``node["parameters"]`` (absent or null: empty); anything but an object is refused by the caller."""
    value = node.get("parameters")
    return {} if value is None else value


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


class _BinaryData:
    """The binary tensor data after the JSON header, handed to the inputs in input order."""

    def __init__(self, data: memoryview) -> None:
        self.data, self.offset = data, 0

    def take(self, size, where: str) -> bytes:
        """The next ``size`` bytes (an input's ``binary_data_size``), refused unless they are there."""
        left = len(self.data) - self.offset
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or size > left:
            raise _bad(f"{where}: binary_data_size {shown(size, 60)} does not fit the {left} binary bytes left")
        blob = bytes(self.data[self.offset : self.offset + size])
        self.offset += size
        return blob

    def check_all_taken(self) -> None:
        if self.offset != len(self.data):
            raise _bad(f"{len(self.data) - self.offset} bytes of binary data after the inputs belong to no input")


def _document(body: bytes, header_length: str | None) -> tuple[dict, _BinaryData]:
    """The request's JSON header as an object, and the binary data after it (none without the header)."""
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
    return doc, _BinaryData(binary)


def _named(raw, k: int, kind: str) -> str:
    """How errors name ``inputs[k]`` or ``outputs[k]``: ``input 'name'`` (refused without a string name)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise _bad(f"{kind}s[{k}] must be an object with a string 'name'")
    return f"{kind} {shown(raw['name'], 80)}"


def _tensor_params(raw: dict, where: str, shared_memory: str) -> dict:
    """A tensor's ``parameters``, refused when not an object or when they ask for shared memory."""
    params = _params(raw)
    if not isinstance(params, dict):
        raise _bad(f"{where}: 'parameters' must be an object")
    if any(key.startswith("shared_memory") for key in params):
        raise _bad(f"{where}: {shared_memory}")
    return params


def _input(k: int, raw, request_params: dict, binary: _BinaryData, max_elements: int | None) -> InferInput:
    """``inputs[k]``: checked, its data from JSON ``data`` or its share of the binary data."""
    where = _named(raw, k, "input")
    datatype = datatype_of(raw.get("datatype"), where)
    shape = _shape(raw.get("shape"), where)
    count = element_count(shape, max_elements, where)
    p = _tensor_params(raw, where, "shared memory inputs are not supported; send the data in the request")
    tensor = InferInput(raw["name"], datatype, shape, content_type=content_type_of(p, request_params, datatype, where))
    if "binary_data_size" in p:
        fill_from_bytes(tensor, binary.take(p["binary_data_size"], where), count, where, "binary")
    elif "data" in raw:
        values = json_elements(raw["data"], datatype, count, where)
        if datatype == "BYTES":
            tensor.elements = values
            tensor.text = tensor.content_type is None
        else:
            tensor.array = values.reshape(shape)
    else:
        raise _bad(f"{where} has neither 'data' nor parameters.binary_data_size")
    decode_content(tensor, where)
    return tensor


def _outputs(raw_outputs) -> list[RequestedOutput] | None:
    """The request's ``outputs`` (``None``: absent, every output answered)."""
    if raw_outputs is None:
        return None
    if not isinstance(raw_outputs, list):
        raise _bad("'outputs' must be a list")
    outputs = []
    for k, raw in enumerate(raw_outputs):
        where = _named(raw, k, "output")
        p = _tensor_params(raw, where, "shared memory outputs are not supported")
        classes = p.get("classification", 0)
        if not isinstance(classes, int) or isinstance(classes, bool) or classes < 0:
            raise _bad(f"{where}: parameters.classification must be a non-negative integer")
        binary_flag = p.get("binary_data")
        outputs.append(RequestedOutput(raw["name"], None if binary_flag is None else bool(binary_flag), classes))
    return outputs


def parse_request(body: bytes, header_length: str | None, max_elements: int | None = None) -> InferRequest:
    """Parse an infer request body (JSON, or JSON header plus binary tensor data).

    Args:
        body: The whole (decompressed) request body.
        header_length: The ``Inference-Header-Content-Length`` header, if any.
        max_elements: Most elements one input may declare; a larger ``shape`` is refused
            (``bad_shape``) before its data is looked at.
    """
    doc, binary = _document(body, header_length)
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _bad("the request needs a non-empty 'inputs' list")
    params = _params(doc)
    if not isinstance(params, dict):
        raise _bad("'parameters' must be an object")
    request_id = _request_id(doc)
    inputs = [_input(k, raw, params, binary, max_elements) for k, raw in enumerate(raw_inputs)]
    binary.check_all_taken()
    return InferRequest(
        id=request_id,
        inputs=inputs,
        outputs=_outputs(doc.get("outputs")),
        binary_output=bool(params.get("binary_data_output", False)),
        parameters=params,
    )
