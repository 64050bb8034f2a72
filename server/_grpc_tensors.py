"""KServe v2 tensors over gRPC: a ``ModelInferRequest`` into the HTTP side's :class:`InferRequest`, and back.

The gRPC front end validates exactly as the HTTP one: :func:`infer_request` turns the protobuf
message into the same :class:`~gpufeed.server._kserve.InferRequest` that
:func:`~gpufeed.server._kserve.parse_request` makes of a JSON body, with the same checks and
messages (datatype, shape, element-count limit, BYTES framing, ``content_type: "base64"``), and
:func:`~gpufeed.server._requests.items_from_kserve` takes it from there. Tensor data may come as
``raw_input_contents`` (what tritonclient.grpc and KServe's SDK send: one entry per input, in input
order, BYTES elements 4-byte length prefixed) or as typed ``contents`` (``uint_contents``,
``bytes_contents``...). Responses always use ``raw_output_contents``, as Triton's do.

Nothing here imports grpc; the message classes come from tritonclient's generated
``service_pb2``, passed in by :mod:`._grpc`.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from gpufeed.server._errors import RequestError, shown
from gpufeed.server._kserve import InferRequest, RequestedOutput
from gpufeed.server._kserve_response import classification
from gpufeed.server._kserve_tensors import (
    DTYPES,
    InferInput,
    content_type_of,
    datatype_of,
    decode_content,
    element_count,
    fill_from_bytes,
)

__all__ = ["infer_request", "infer_response", "parameter_values"]

_MAX_DIMS = 8
# Which typed field of InferTensorContents holds each datatype (FP16 has none: raw only).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _bad(message: str, reason: str = "malformed_request") -> RequestError:
    return RequestError(reason, message)


def parameter_values(params) -> dict:
    """A protobuf ``map<string, InferParameter>`` as a plain dict of Python values."""
    out = {}
    for key, value in params.items():
        which = value.WhichOneof("parameter_choice")
        out[key] = None if which is None else getattr(value, which)
    return out


def _typed(contents, datatype: str, count: int, where: str):
    field = _CONTENTS.get(datatype)
    values = getattr(contents, field) if field else ()
    if len(values) != count:
        raise RequestError("bad_shape", f"{where}: shape holds {count} elements but contents has {len(values)}")
    if datatype == "BYTES":
        return [bytes(v) for v in values]
    dtype = DTYPES[datatype]
    array = np.asarray(list(values), dtype=np.float64 if dtype.kind == "f" else None)
    if dtype.kind in "ui" and len(array):
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:  # uint_contents holds 32 bits; UINT8 wants 8
            raise _bad(f"{where}: contents values must lie in [{info.min}, {info.max}] for {datatype}")
    return array.astype(dtype)


def _input(tensor, raw: bytes | None, request_params: dict, max_elements: int | None) -> InferInput:
    """One ``InferInputTensor``, checked, its data from ``raw`` (its ``raw_input_contents``) or its ``contents``."""
    where = f"input {shown(tensor.name, 80)}"
    datatype = datatype_of(tensor.datatype, where)
    shape = tuple(tensor.shape)
    if len(shape) > _MAX_DIMS or any(d < 0 for d in shape):
        raise _bad(f"{where} 'shape' must be a list of at most {_MAX_DIMS} non-negative integers, got {list(shape)}")
    count = element_count(shape, max_elements, where)
    params = parameter_values(tensor.parameters)
    if any(key.startswith("shared_memory") for key in params):
        raise _bad(f"{where}: shared memory inputs are not supported; send the data in the request")
    result = InferInput(
        tensor.name, datatype, shape, content_type=content_type_of(params, request_params, datatype, where)
    )
    if raw is not None:
        if tensor.HasField("contents"):
            raise _bad(f"{where}: send its data in raw_input_contents or in contents, not both")
        fill_from_bytes(result, raw, count, where, "raw")
    elif tensor.HasField("contents"):
        values = _typed(tensor.contents, datatype, count, where)
        if datatype == "BYTES":
            result.elements = values
        else:
            result.array = values.reshape(shape)
    else:
        raise _bad(f"{where} has no data: send raw_input_contents or contents")
    decode_content(result, where)
    return result


def _output(out) -> RequestedOutput:
    """One ``InferRequestedOutputTensor``: always binary (``raw_output_contents``), optionally top K classes."""
    where = f"output {shown(out.name, 80)}"
    params = parameter_values(out.parameters)
    if any(key.startswith("shared_memory") for key in params):
        raise _bad(f"{where}: shared memory outputs are not supported")
    classes = params.get("classification", 0)
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 0:
        raise _bad(f"{where}: parameters.classification must be a non-negative integer")
    return RequestedOutput(out.name, True, classes)


def infer_request(message, max_elements: int | None = None) -> InferRequest:
    """Validate a ``ModelInferRequest`` into an :class:`InferRequest` (the HTTP parser's checks and messages).

    Args:
        message: The ``inference.ModelInferRequest``.
        max_elements: Most elements one input may declare (checked before any data is converted).

    Raises:
        RequestError: Naming the input or output at fault.
    """
    if not message.inputs:
        raise _bad("the request needs at least one input")
    request_params = parameter_values(message.parameters)
    raw = list(message.raw_input_contents)
    if raw and len(raw) != len(message.inputs):
        raise _bad(f"raw_input_contents has {len(raw)} entries for {len(message.inputs)} inputs; send one per input")
    inputs = [
        _input(tensor, raw[k] if raw else None, request_params, max_elements) for k, tensor in enumerate(message.inputs)
    ]
    outputs = [_output(out) for out in message.outputs] if message.outputs else None
    return InferRequest(id=message.id or None, inputs=inputs, outputs=outputs, parameters=request_params)


def infer_response(pb2, model_name: str, request: InferRequest, tensors: Mapping[str, np.ndarray], labels) -> object:
    """A ``ModelInferResponse`` with the requested outputs (all by default) as ``raw_output_contents``.

    Raises:
        RequestError: An output the model does not produce was requested.
    """
    response = pb2.ModelInferResponse(model_name=model_name, model_version="1", id=request.id or "")
    for out in request.outputs or [RequestedOutput(name) for name in tensors]:
        if out.name not in tensors:
            raise _bad(f"output {out.name!r} is not produced by model {model_name!r}; outputs: {', '.join(tensors)}")
        values = tensors[out.name]
        if out.classification:
            values = classification(values, out.classification, labels)
            blob = b"".join(len(v).to_bytes(4, "little") + v for v in values.ravel())
            datatype = "BYTES"
        else:
            datatype = "INT64" if values.dtype == np.int64 else "FP32"  # INT64: a video's window_starts
            blob = np.ascontiguousarray(values, dtype=np.int64 if datatype == "INT64" else np.float32).tobytes()
        response.outputs.add(name=out.name, datatype=datatype, shape=list(values.shape))
        response.raw_output_contents.append(blob)
    return response
