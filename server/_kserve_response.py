"""KServe v2 / Open Inference Protocol over HTTP: infer responses, HTTP-free (requests: :mod:`._kserve`).

Responses are binary per output when the request says ``binary_data_output`` or an output's
``binary_data``, JSON otherwise. The classification extension (``parameters.classification: K``
on an output) returns the top K as ``"value:index:label"`` BYTES, as Triton does (the gRPC front
encodes the same with :func:`classification`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpufeed.server._errors import RequestError
from gpufeed.server._kserve import InferRequest, RequestedOutput

__all__ = ["classification", "encode_response"]


def classification(values: np.ndarray, k: int, labels: tuple[str, ...]) -> np.ndarray:
    k = min(k, values.shape[-1])
    top = np.argsort(-values, axis=-1, kind="stable")[:, :k]
    rows = [[f"{values[r, i]:f}:{i}:{labels[i]}".encode() for i in top[r]] for r in range(len(values))]
    return np.array(rows, dtype=object)


def encode_response(
    model_name: str,
    request: InferRequest,
    tensors: Mapping[str, np.ndarray],
    labels: tuple[str, ...],
) -> tuple[bytes, dict[str, str]]:
    """Body and headers of an infer response holding the requested ``tensors`` (name -> array)."""
    wanted = request.outputs or [RequestedOutput(name) for name in tensors]
    header_outputs, blobs = [], []
    for out in wanted:
        if out.name not in tensors:
            raise RequestError(
                "malformed_request",
                f"output {out.name!r} is not produced by model {model_name!r}; outputs: {', '.join(tensors)}",
            )
        values = tensors[out.name]
        datatype = "INT64" if values.dtype == np.int64 else "FP32"  # INT64: a video's window_starts
        if out.classification:
            values, datatype = classification(values, out.classification, labels), "BYTES"
        entry: dict[str, Any] = {"name": out.name, "datatype": datatype, "shape": list(values.shape)}
        binary = request.binary_output if out.binary is None else out.binary
        if binary:
            if datatype == "BYTES":
                blob = b"".join(struct.pack("<I", len(v)) + v for v in values.ravel())
            else:
                blob = np.ascontiguousarray(values, dtype=np.int64 if datatype == "INT64" else np.float32).tobytes()
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
