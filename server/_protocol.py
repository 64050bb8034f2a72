"""A bound on the request line and headers, below the ASGI app (which only sees them parsed).

uvicorn's httptools parser accumulates a request's URL and headers without limit (measured: five
connections sending 20 MB of headers each grew the server by 100 MB), so a client could exhaust
memory without ever sending a body; the body limit (``serve.max_body_bytes``) cannot help because
headers come first. :func:`http_protocol` returns uvicorn's httptools protocol with a byte count
on the head of each request: past ``serve.max_header_bytes`` the client gets 431 (JSON, reason
``malformed_request``) and the connection is closed. Without httptools, uvicorn's h11 protocol
is used with its own limit (``h11_max_incomplete_event_size``).

The count is of whole chunks that lie inside one request's head (incomplete before and after the
chunk is parsed, and no head completed by it), so a request that arrives whole in one read, or a
pipelined neighbour's body, is never counted; memory held for a head is bounded by the limit
plus two socket reads.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

__all__ = ["http_protocol"]

log = logging.getLogger("gpufeed.server")
LINGER_SECONDS = 2.0


def _refusal(limit: int) -> bytes:
    body = json.dumps(
        {
            "error": f"the request line and headers exceed {limit:,} bytes (serve.max_header_bytes)",
            "reason": "malformed_request",
        }
    ).encode()
    head = (
        "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def http_protocol(max_head_bytes: int, on_refused: Callable[[], None]) -> dict:
    """uvicorn.Config keyword arguments that bound request heads to ``max_head_bytes``.

    Args:
        max_head_bytes: Largest request line plus headers accepted.
        on_refused: Called for each refusal (to count it).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: h11 enforces the same bound itself
        return {"http": "h11", "h11_max_incomplete_event_size": max_head_bytes}
    refusal = _refusal(max_head_bytes)

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol, refusing heads over ``max_head_bytes`` with 431."""

        def connection_made(self, transport) -> None:
            self._in_head, self._head_bytes, self._heads_done, self._refused = True, 0, 0, False
            super().connection_made(transport)

        def on_headers_complete(self) -> None:
            self._in_head, self._head_bytes = False, 0
            self._heads_done += 1
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._in_head, self._head_bytes = True, 0

        def data_received(self, data: bytes) -> None:
            if self._refused:  # lingering after a 431: read and drop until the client hangs up
                return
            was_in_head, heads_done = self._in_head, self._heads_done
            super().data_received(data)
            # Count the chunk only if it lay wholly inside one head: a chunk that completed a head
            # (and perhaps the whole request, body included) is not head bytes.
            if not (was_in_head and self._in_head and heads_done == self._heads_done) or self.transport.is_closing():
                return
            self._head_bytes += len(data)
            if self._head_bytes <= max_head_bytes:
                return
            log.warning("refused a request whose head exceeds %d bytes (serve.max_header_bytes)", max_head_bytes)
            on_refused()
            if self.cycle is not None and not self.cycle.response_complete:  # never interleave with a response
                self.transport.close()
                return
            # Lingering close: answer, send FIN, drop what still comes, close after a grace period.
            # Closing at once with unread data makes the kernel send RST, and the client would
            # likely lose the 431 it was about to read.
            self._refused = True
            self.transport.write(refusal)
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)

    return {"http": BoundedHttpToolsProtocol}
