"""HTTP plumbing shared by the endpoints: bounded body reading, content codings, multipart/form-data.

**Body limit** (``serve.max_body_bytes``), enforced three times: a declared ``Content-Length`` over
the limit is refused before a byte is read; a chunked body is counted while it streams; and a
compressed body (``Content-Encoding: gzip`` or ``deflate``, as tritonclient's
``request_compression_algorithm`` sends it) is inflated in bounded steps and refused as soon as
its decompressed size passes the limit, so a zip bomb is never inflated whole.

**Response compression**: a 200 answer of at least :data:`MIN_COMPRESSED_BYTES` is compressed when
the request's ``Accept-Encoding`` asks for gzip or deflate (tritonclient's
``response_compression_algorithm``); errors never are, so every client can read them.

**multipart/form-data** is parsed by python-multipart's streaming parser; the limits (parts,
header lines and sizes) and the messages, which name the part at fault, are this module's.

A client that hangs up before its body has arrived gets no answer (nobody is listening), and
the request is counted with reason ``client_disconnect``, not as a server error.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import re
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, MultipartState
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from gpufeed.server._errors import RequestError, json_bytes, shown

if TYPE_CHECKING:
    from python_multipart.multipart import MultipartCallbacks  # defined for type checkers only

__all__ = [
    "CODINGS",
    "JSONAnswer",
    "Part",
    "compress_response",
    "content_type_of",
    "decode_body",
    "parse_multipart",
    "read_body",
    "response_coding",
]

_PARAM = re.compile(r';\s*([A-Za-z0-9_\-.]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^;]*)')
MAX_PARTS = 256
MAX_PART_HEADERS = 16
MAX_PART_HEADER_BYTES = 8192
MAX_BOUNDARY_CHARS = 200
# Content codings a request body may use; "deflate" is the zlib format (RFC 9110), as tritonclient sends it.
CODINGS = ("gzip", "deflate")
INFLATE_STEP_BYTES = 1 << 20
# Smaller answers are sent as they are even when compression is welcome (as Starlette's GZipMiddleware):
# a few hundred bytes gain nothing on the wire and cost both sides CPU.
MIN_COMPRESSED_BYTES = 512

# python-multipart logs a warning for every malformed body; the client already gets a 400 saying why.
logging.getLogger("python_multipart.multipart").setLevel(logging.ERROR)


class JSONAnswer(Response):
    """A JSON response that renders any document, request text included (:func:`~gpufeed.server._errors.json_bytes`)."""

    media_type = "application/json"

    def render(self, content) -> bytes:
        return json_bytes(content)


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


async def read_body(
    request, limit: int, timeout_s: float | None = None, setting: str = "serve.max_body_bytes"
) -> bytes:
    """The whole request body as sent (still compressed, if it is), refusing more than ``limit`` bytes.

    Args:
        request: The Starlette request.
        limit: Most bytes accepted (``serve.max_body_bytes``).
        timeout_s: Longest wait for the whole body; a slower client (a trickled, "slowloris" body)
            gets 408 with reason ``timeout`` instead of holding a request slot forever.
        setting: The config key the 413 message names (a clip model's bodies: ``serve.max_video_bytes``).

    Raises:
        RequestError: ``body_too_large`` (413), ``timeout`` (408), ``client_disconnect`` (the
            client closed the connection first), ``malformed_request`` (a broken Content-Length).
    """
    try:
        if timeout_s is None:
            return await _read_body(request, limit, setting)
        return await asyncio.wait_for(_read_body(request, limit, setting), max(timeout_s, 0.001))
    except asyncio.TimeoutError:
        raise RequestError(
            "timeout",
            f"the request body did not arrive within {timeout_s:.3g} s (serve.request_timeout_seconds)",
            status=408,
        ) from None
    except ClientDisconnect:
        raise RequestError(
            "client_disconnect", "the client closed the connection before sending the whole body"
        ) from None


async def _read_body(request, limit: int, setting: str) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise RequestError(
                "malformed_request", f"header Content-Length is not a number: {shown(declared, 60)}"
            ) from None
        if size > limit:
            raise RequestError("body_too_large", f"the body is {size:,} bytes; the limit is {limit:,} ({setting})")
    chunks, total = [], 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise RequestError("body_too_large", f"the body exceeds the limit of {limit:,} bytes ({setting})")
        chunks.append(chunk)
    return b"".join(chunks)


def decode_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """``body`` with its content coding undone, never inflating more than ``limit`` + 1 bytes.

    Args:
        content_encoding: The request's ``Content-Encoding`` header (``None``, ``identity``,
            ``gzip``, ``x-gzip`` or ``deflate``; one coding, case-insensitive).
        limit: Most decompressed bytes accepted (``serve.max_body_bytes``).

    Raises:
        RequestError: 415 for a coding not in :data:`CODINGS`, 413 when the decompressed body
            passes ``limit``, 400 when the data is not what the coding says.
    """
    coding = (content_encoding or "identity").strip().lower()
    if coding == "identity":
        return body
    if coding == "x-gzip":
        coding = "gzip"
    if coding not in CODINGS:
        raise RequestError(
            "unsupported_media_type",
            f"Content-Encoding {shown(content_encoding, 60)} is not accepted; send the body as it is "
            f"(identity) or compressed with one of: {', '.join(CODINGS)}",
        )
    # gzip: wbits 16+; deflate is the zlib format, but some clients send raw deflate: try both.
    attempts = (16 + zlib.MAX_WBITS,) if coding == "gzip" else (zlib.MAX_WBITS, -zlib.MAX_WBITS)
    problem = ""
    for wbits in attempts:
        try:
            return _inflate(body, wbits, limit, coding)
        except zlib.error as err:
            problem = str(err)
    raise RequestError("malformed_request", f"the {coding} request body is not valid {coding} data ({problem})")


def _inflate(body: bytes, wbits: int, limit: int, coding: str) -> bytes:
    """Inflate step by step; stop as soon as the output passes ``limit`` (a zip bomb is never inflated whole)."""
    inflater = zlib.decompressobj(wbits)
    out, total, pending = [], 0, body
    while not inflater.eof:
        piece = inflater.decompress(pending, INFLATE_STEP_BYTES)
        total += len(piece)
        if total > limit:
            raise RequestError(
                "body_too_large",
                f"the {coding} body inflates to more than the limit of {limit:,} bytes (serve.max_body_bytes)",
            )
        out.append(piece)
        pending = inflater.unconsumed_tail
        if not piece and not pending and not inflater.eof:
            raise zlib.error("the compressed data ends before its end marker")
    if inflater.unused_data:
        raise RequestError(
            "malformed_request",
            f"the {coding} request body has {len(inflater.unused_data):,} bytes after the end of its compressed data",
        )
    return b"".join(out)


def response_coding(accept_encoding: str | None) -> str | None:
    """The coding to compress a response with, from ``Accept-Encoding`` (gzip preferred); ``None``: none."""
    if not accept_encoding:
        return None
    wanted = {}
    for item in accept_encoding.split(","):
        name, _, params = item.strip().partition(";")
        quality = 1.0
        match = re.search(r"q\s*=\s*([0-9.]+)", params)
        if match:
            try:
                quality = float(match.group(1))
            except ValueError:
                quality = 0.0
        wanted[name.strip().lower()] = quality
    for coding in ("gzip", "deflate"):
        if wanted.get(coding, wanted.get("*", 0.0)) > 0:
            return coding
    return None


def compress_response(payload: bytes, coding: str | None) -> tuple[bytes, dict[str, str]]:
    """``payload`` compressed with ``coding`` (and the headers saying so), or as it is when unwanted or small."""
    if coding is None or len(payload) < MIN_COMPRESSED_BYTES:
        return payload, {}
    data = gzip.compress(payload, compresslevel=5) if coding == "gzip" else zlib.compress(payload, 5)
    return data, {"content-encoding": coding, "vary": "Accept-Encoding"}


@dataclass
class _PartInProgress:
    headers: list[tuple[str, str]] = field(default_factory=list)
    header_name: bytearray = field(default_factory=bytearray)
    header_value: bytearray = field(default_factory=bytearray)
    chunks: list[bytes] = field(default_factory=list)
    disposition: tuple[str, dict[str, str]] = ("", {})


def _bad_part(index: int, problem: str) -> RequestError:
    return RequestError("malformed_request", f"multipart part {index}: {problem}")


def parse_multipart(body: bytes, boundary: str | None) -> list[Part]:
    """The parts of a ``multipart/form-data`` body (RFC 7578), parsed by python-multipart.

    Raises:
        RequestError: ``malformed_request`` naming the part and what is missing or broken.
    """
    if not boundary or len(boundary) > MAX_BOUNDARY_CHARS:
        raise RequestError(
            "malformed_request",
            f"multipart/form-data needs a boundary parameter of 1 to {MAX_BOUNDARY_CHARS} characters in Content-Type",
        )
    try:
        delimiter = boundary.encode("latin-1")
    except UnicodeEncodeError:
        raise RequestError("malformed_request", "the multipart boundary must be ASCII") from None
    if not body.lstrip(b"\r\n").startswith(b"--" + delimiter):
        raise RequestError(
            "malformed_request", f"the multipart body does not start with its boundary --{shown(boundary, 60)[1:-1]}"
        )
    parts: list[Part] = []
    current = _PartInProgress()

    def part_begin() -> None:
        nonlocal current
        if len(parts) >= MAX_PARTS:
            raise RequestError("malformed_request", f"the multipart body has more than {MAX_PARTS} parts")
        current = _PartInProgress()

    def header_end() -> None:
        name = bytes(current.header_name).strip().lower().decode("latin-1")
        current.headers.append((name, bytes(current.header_value).strip().decode("utf-8", "replace")))
        current.header_name.clear()
        current.header_value.clear()

    def headers_finished() -> None:
        headers = dict(current.headers)
        disposition, params = content_type_of(headers.get("content-disposition"))
        if disposition != "form-data" or "name" not in params:
            raise _bad_part(len(parts), "needs a header 'Content-Disposition: form-data; name=...'")
        current.disposition = (disposition, params)

    def part_end() -> None:
        headers, params = dict(current.headers), current.disposition[1]
        parts.append(
            Part(
                name=params["name"],
                filename=params.get("filename"),
                content_type=content_type_of(headers.get("content-type"))[0] or "text/plain",
                data=b"".join(current.chunks),
            )
        )

    callbacks: MultipartCallbacks = {
        "on_part_begin": part_begin,
        "on_header_field": lambda data, start, end: current.header_name.extend(data[start:end]),
        "on_header_value": lambda data, start, end: current.header_value.extend(data[start:end]),
        "on_header_end": header_end,
        "on_headers_finished": headers_finished,
        "on_part_data": lambda data, start, end: current.chunks.append(data[start:end]),
        "on_part_end": part_end,
    }
    parser = MultipartParser(
        delimiter, callbacks, max_header_count=MAX_PART_HEADERS, max_header_size=MAX_PART_HEADER_BYTES
    )
    try:
        parser.write(body)
    except MultipartParseError as err:
        raise _bad_part(len(parts), f"{err} (the body is not valid multipart/form-data)") from None
    if parser.state != MultipartState.END:
        raise RequestError(
            "malformed_request",
            f"multipart part {len(parts)} is not terminated by the boundary: the body ends before "
            f"--{delimiter.decode('latin-1')}--",
        )
    return parts
