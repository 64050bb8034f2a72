"""HTTP plumbing shared by the endpoints: bounded body reading and multipart/form-data parsing.

The body limit is enforced twice: a declared ``Content-Length`` over the limit is refused before a
byte is read, and a chunked body is counted while it streams, so neither can make the server
buffer more than ``serve.max_body_bytes``.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from gpufeed.server._errors import RequestError

__all__ = ["Part", "content_type_of", "parse_multipart", "read_body"]

_PARAM = re.compile(r';\s*([A-Za-z0-9_\-.]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')
MAX_PARTS = 256


@dataclass(frozen=True)
class Part:
    """One part of a multipart body."""

    name: str
    filename: str | None
    content_type: str
    data: bytes


def content_type_of(header: str | None) -> tuple[str, dict[str, str]]:
    """``"multipart/form-data; boundary=x"`` -> ``("multipart/form-data", {"boundary": "x"})``."""
    if not header:
        return "", {}
    main, _, rest = header.partition(";")
    params = {}
    for key, value in _PARAM.findall(";" + rest):
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1].replace('\\"', '"')
        params[key.lower()] = value
    return main.strip().lower(), params


async def read_body(request, limit: int, timeout_s: float | None = None) -> bytes:
    """The whole request body, refusing (413 ``body_too_large``) anything over ``limit`` bytes.

    Args:
        request: The Starlette request.
        limit: Most bytes accepted (``serve.max_body_bytes``).
        timeout_s: Longest wait for the whole body; a slower client (a trickled, "slowloris" body)
            gets 408 with reason ``timeout`` instead of holding a request slot forever.
    """
    if timeout_s is None:
        return await _read_body(request, limit)
    try:
        return await asyncio.wait_for(_read_body(request, limit), max(timeout_s, 0.001))
    except asyncio.TimeoutError:
        raise RequestError(
            "timeout",
            f"the request body did not arrive within {timeout_s:.3g} s (serve.request_timeout_seconds)",
            status=408,
        ) from None


async def _read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError("malformed_request", f"header Content-Length is not a number: {declared!r}") from None
        if size > limit:
            raise RequestError(
                "body_too_large", f"the body is {size:,} bytes; the limit is {limit:,} (serve.max_body_bytes)"
            )
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise RequestError(
                "body_too_large", f"the body exceeds the limit of {limit:,} bytes (serve.max_body_bytes)"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _part_headers(block: bytes, index: int) -> dict[str, str]:
    headers = {}
    for line in block.split(b"\r\n"):
        if not line:
            continue
        key, sep, value = line.partition(b":")
        if not sep:
            raise RequestError("malformed_request", f"multipart part {index} has a header line without ':'")
        headers[key.strip().lower().decode("latin-1")] = value.strip().decode("utf-8", "replace")
    return headers


def parse_multipart(body: bytes, boundary: str | None) -> list[Part]:
    """Split a ``multipart/form-data`` body into parts (RFC 7578), without copying file data twice.

    Raises:
        RequestError: ``malformed_request`` naming what is missing or broken.
    """
    if not boundary or len(boundary) > 200:
        raise RequestError("malformed_request", "multipart/form-data needs a boundary parameter in Content-Type")
    delimiter = b"--" + boundary.encode("latin-1")
    start = body.find(delimiter)
    if start < 0:
        raise RequestError("malformed_request", "the multipart body does not contain its boundary")
    pos = start + len(delimiter)
    parts: list[Part] = []
    while True:
        if body.startswith(b"--", pos):
            return parts  # closing delimiter
        if not body.startswith(b"\r\n", pos):
            raise RequestError("malformed_request", f"multipart part {len(parts)}: expected CRLF after the boundary")
        pos += 2
        head_end = body.find(b"\r\n\r\n", pos)
        if head_end < 0:
            raise RequestError("malformed_request", f"multipart part {len(parts)} has no end of headers")
        headers = _part_headers(body[pos:head_end], len(parts))
        data_start = head_end + 4
        data_end = body.find(b"\r\n" + delimiter, data_start)
        if data_end < 0:
            raise RequestError("malformed_request", f"multipart part {len(parts)} is not terminated by the boundary")
        disposition, params = content_type_of(headers.get("content-disposition"))
        if disposition != "form-data" or "name" not in params:
            raise RequestError(
                "malformed_request", f"multipart part {len(parts)} needs 'Content-Disposition: form-data; name=...'"
            )
        parts.append(
            Part(
                name=params["name"],
                filename=params.get("filename"),
                content_type=content_type_of(headers.get("content-type"))[0] or "text/plain",
                data=body[data_start:data_end],
            )
        )
        if len(parts) > MAX_PARTS:
            raise RequestError("malformed_request", f"the multipart body has more than {MAX_PARTS} parts")
        pos = data_end + 2 + len(delimiter)
