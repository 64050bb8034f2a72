"""The corpus's building blocks: what a probe is, the served model it targets, and request builders.

A :class:`Probe` is one complete request (method, raw path, headers, body) plus the answers that
are acceptable; :class:`Builder` turns payloads into probes for one :class:`Target` (REST raw
bodies, multipart files, KServe JSON, KServe binary tensors).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Builder", "Probe", "Target", "bytes_blob"]


@dataclass(frozen=True)
class Target:
    """A served model as the corpus needs it."""

    name: str
    input_name: str
    sample_shape: tuple[int, ...]
    accepts_images: bool

    @classmethod
    def from_card(cls, card) -> Target:
        head = card.spec.head  # an image classifier: JPEG/PNG in, top-k classes out over REST
        return cls(card.name, card.input_name, tuple(card.sample_shape), head.accepts_encoded and head.classifies)


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


def bytes_blob(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


class Builder:
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
        blob = bytes_blob(blobs)
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
