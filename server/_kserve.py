"""KServe v2 / Open Inference Protocol over HTTP: request parsing and response encoding, HTTP-free.

Supported: JSON tensors (``data``, flat or nested, row-major) and the binary tensor data
extension: with header ``Inference-Header-Content-Length: L`` the body's first L bytes are the JSON
header and each input with ``parameters.binary_data_size`` takes that many bytes of the rest, in
input order; a BYTES element is a 4-byte little-endian length followed by its bytes. Responses
are binary per output when the request says ``binary_data_output`` or an output's
``binary_data``, JSON otherwise. The classification extension (``parameters.classification: K``
on an output) returns the top K as ``"value:index:label"`` BYTES, as Triton does. Shared-memory
parameters are refused (the server shares no memory with clients).

Every problem is a :class:`RequestError` naming the field at fault.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

import numpy as np

from gpufeed.server._errors import RequestError

__all__ = ["DTYPES", "InferInput", "InferRequest", "RequestedOutput", "encode_response", "parse_request"]

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
_MAX_DIMS = 8


@dataclass
class InferInput:
    """One input tensor: numeric ``array`` (numpy, shaped) or ``elements`` (BYTES, flat list)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray | None = None
    elements: list[bytes] | None = None


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
        ok = all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in raw)
    if not ok:
        raise _bad(f"{where} 'shape' must be a list of at most {_MAX_DIMS} non-negative integers, got {raw!r}")
    return tuple(raw)


def _split_bytes(blob: bytes, count: int, where: str) -> list[bytes]:
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


def _json_elements(data, datatype: str, count: int, where: str):
    if datatype == "BYTES":
        flat = _flatten(data, where)
        if not all(isinstance(v, str) for v in flat):
            raise _bad(f"{where}: BYTES 'data' must be strings in JSON; send binary data for raw bytes")
        if len(flat) != count:
            raise RequestError("bad_shape", f"{where}: shape holds {count} elements but 'data' has {len(flat)}")
        return [v.encode("utf-8") for v in flat]
    flat = _flatten(data, where)
    if len(flat) != count:
        raise RequestError("bad_shape", f"{where}: shape holds {count} elements but 'data' has {len(flat)}")
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


def _flatten(data, where: str) -> list:
    if not isinstance(data, list):
        raise _bad(f"{where} 'data' must be a list, got {type(data).__name__}")
    out, stack = [], [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            out.append(value)
        else:
            stack.pop()
    return out


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse an infer request body (JSON, or JSON header plus binary tensor data)."""
    if header_length is not None:
        try:
            size = int(header_length)
        except ValueError:
            raise _bad(f"header Inference-Header-Content-Length must be an integer, got {header_length!r}") from None
        if not 0 < size <= len(body):
            raise _bad(f"header Inference-Header-Content-Length {size} is outside the body's {len(body)} bytes")
        head, binary = body[:size], memoryview(body)[size:]
    else:
        head, binary = body, memoryview(b"")
    try:
        doc = json.loads(head)
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
    inputs, offset = [], 0
    for k, raw in enumerate(raw_inputs):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise _bad(f"inputs[{k}] must be an object with a string 'name'")
        where = f"input '{raw['name']}'"
        datatype = raw.get("datatype")
        if not isinstance(datatype, str) or (datatype != "BYTES" and datatype not in DTYPES):
            raise RequestError(
                "bad_dtype",
                f"{where}: datatype {str(datatype)[:40]!r} is not a KServe v2 datatype; allowed: BYTES, {', '.join(DTYPES)}",
            )
        shape = _shape(raw.get("shape"), where)
        count = math.prod(shape)  # Python integers: a shape like [2**62, 4] cannot wrap around
        p = _params(raw)
        if not isinstance(p, dict):
            raise _bad(f"{where}: 'parameters' must be an object")
        if any(key.startswith("shared_memory") for key in p):
            raise _bad(f"{where}: shared memory inputs are not supported; send the data in the request")
        tensor = InferInput(raw["name"], datatype, shape)
        if "binary_data_size" in p:
            size = p["binary_data_size"]
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise _bad(
                    f"{where}: binary_data_size {size!r} does not fit the {len(binary) - offset} binary bytes left"
                )
            blob = bytes(binary[offset : offset + size])
            offset += size
            if datatype == "BYTES":
                tensor.elements = _split_bytes(blob, count, where)
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
            else:
                tensor.array = values.reshape(shape)
        else:
            raise _bad(f"{where} has neither 'data' nor parameters.binary_data_size")
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
            p = _params(raw)
            if not isinstance(p, dict):
                raise _bad(f"output '{raw['name']}': 'parameters' must be an object")
            if any(key.startswith("shared_memory") for key in p):
                raise _bad(f"output '{raw['name']}': shared memory outputs are not supported")
            classes = p.get("classification", 0)
            if not isinstance(classes, int) or classes < 0:
                raise _bad(f"output '{raw['name']}': parameters.classification must be a non-negative integer")
            binary_flag = p.get("binary_data")
            outputs.append(RequestedOutput(raw["name"], None if binary_flag is None else bool(binary_flag), classes))
    request_id = doc.get("id")
    return InferRequest(
        id=str(request_id) if request_id is not None else None,
        inputs=inputs,
        outputs=outputs,
        binary_output=bool(params.get("binary_data_output", False)),
        parameters=params,
    )


def _classification(values: np.ndarray, k: int, labels: tuple[str, ...]) -> np.ndarray:
    k = min(k, values.shape[-1])
    top = np.argsort(-values, axis=-1, kind="stable")[:, :k]
    rows = [[f"{values[r, i]:f}:{i}:{labels[i]}".encode() for i in top[r]] for r in range(len(values))]
    return np.array(rows, dtype=object)


def encode_response(
    model_name: str,
    request: InferRequest,
    tensors: dict[str, np.ndarray],
    labels: tuple[str, ...],
) -> tuple[bytes, dict[str, str]]:
    """Body and headers of an infer response holding the requested ``tensors`` (name -> array)."""
    wanted = request.outputs or [RequestedOutput(name) for name in tensors]
    header_outputs, blobs = [], []
    for out in wanted:
        if out.name not in tensors:
            raise _bad(f"output {out.name!r} is not produced by model {model_name!r}; outputs: {', '.join(tensors)}")
        values = tensors[out.name]
        datatype = "FP32"
        if out.classification:
            values, datatype = _classification(values, out.classification, labels), "BYTES"
        entry = {"name": out.name, "datatype": datatype, "shape": list(values.shape)}
        binary = request.binary_output if out.binary is None else out.binary
        if binary:
            if datatype == "BYTES":
                blob = b"".join(struct.pack("<I", len(v)) + v for v in values.ravel())
            else:
                blob = np.ascontiguousarray(values, dtype=np.float32).tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            flat = values.ravel().tolist()
            entry["data"] = [v.decode() for v in flat] if datatype == "BYTES" else flat
        header_outputs.append(entry)
    doc = {"model_name": model_name, "model_version": "1", "outputs": header_outputs}
    if request.id is not None:
        doc["id"] = request.id
    head = json.dumps(doc, separators=(",", ":")).encode()
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(head)),
    }
