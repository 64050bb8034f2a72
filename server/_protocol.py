"""Bounds on the request head, below the ASGI app (which only sees heads once they are parsed).

uvicorn's httptools protocol buffers a request's URL and headers without limit (measured: five
connections sending 20 MB of headers each grew the server by 100 MB) and waits for them
forever, so a client could exhaust memory or connection slots without ever sending a body.
:func:`http_protocol` returns that protocol with two bounds on each request head (request line
plus headers, through the blank line that ends them):

* **size**, ``serve.max_header_bytes``: a head of exactly the limit is accepted, one byte more is
  refused with 431 (JSON, reason ``malformed_request``) before the parser is fed the excess, and
  the connection is closed. A chunk is checked before it reaches the parser: the bytes up to the
  end of the head (``CRLF CRLF``, also when split across reads) count, the body after it does not.
  (A head that starts inside a read after a pipelined neighbour's body is counted from the next
  read on, so it may overshoot by at most one read.)
* **time**, ``serve.header_timeout_seconds``: a head must be complete that long after its first
  byte (or after the connection opened); a slower one ("slowloris") gets 408 (reason ``timeout``)
  and the connection is closed. A connection that never sends a byte is closed silently.
  Between requests, uvicorn's keep-alive timeout closes idle connections as before.

Both refusals are counted (``on_refused(reason)``) and sent with a lingering close: the answer,
then FIN, then reading and dropping until the client hangs up (at most two seconds), since
closing at once with unread data makes the kernel send RST and the client lose the answer.

This subclasses uvicorn's ``HttpToolsProtocol``, whose methods it extends (``connection_made``,
``connection_lost``, ``data_received``, ``on_headers_complete``, ``on_message_complete``) and
whose attributes it reads (``transport``, ``loop``, ``cycle.response_complete``): the uvicorn
versions it is written against are pinned in ``pyproject.toml``, and ``tests/test_server_access.py``
checks these members exist. Without httptools, uvicorn's h11 protocol is used with its own size
limit (``h11_max_incomplete_event_size``) and no head timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Protocol
else:
    # The bounds are a mixin placed before HttpToolsProtocol, which needs httptools (imported only
    # in http_protocol); the type checker sees the protocol they extend.
    _Protocol = object

__all__ = ["HTTPTOOLS_MEMBERS", "http_protocol"]

log = logging.getLogger("gpufeed.server")
LINGER_SECONDS = 2.0
_HEAD_END = b"\r\n\r\n"
# The members of uvicorn's HttpToolsProtocol this module extends or reads (checked by a test).
HTTPTOOLS_MEMBERS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_headers_complete",
    "on_message_complete",
)


def _answer(status: str, message: str, reason: str) -> bytes:
    body = json.dumps({"error": message, "reason": reason}, separators=(",", ":")).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


def _head_end(tail: bytes, data: bytes) -> int:
    """How many bytes of ``data`` end the head whose last bytes so far are ``tail``; -1: not in ``data``."""
    for k in (3, 2, 1):  # the blank line split across two reads
        if tail.endswith(_HEAD_END[:k]) and data.startswith(_HEAD_END[k:]):
            return 4 - k
    at = data.find(_HEAD_END)
    return -1 if at < 0 else at + 4


@dataclass(frozen=True)
class _HeadLimits:
    """What :class:`_HeadBounds` enforces: the two bounds, their refusals, and who counts each refusal."""

    max_head_bytes: int
    header_timeout_s: float
    on_refused: Callable[[str], None]
    too_large: bytes
    too_slow: bytes

    @classmethod
    def of(cls, max_head_bytes: int, header_timeout_s: float, on_refused: Callable[[str], None]) -> _HeadLimits:
        too_large = _answer(
            "431 Request Header Fields Too Large",
            f"the request line and headers exceed {max_head_bytes:,} bytes (serve.max_header_bytes)",
            "malformed_request",
        )
        too_slow = _answer(
            "408 Request Timeout",
            f"the request line and headers did not arrive within {header_timeout_s:g} s (serve.header_timeout_seconds)",
            "timeout",
        )
        return cls(max_head_bytes, header_timeout_s, on_refused, too_large, too_slow)


class _HeadBounds(_Protocol):
    """A size (431) and a time (408) bound on each request head, mixed in before uvicorn's httptools protocol."""

    _head_limits: _HeadLimits  # set by the class http_protocol makes

    def connection_made(self, transport) -> None:
        self._in_head, self._head_bytes, self._head_started, self._tail = True, 0, False, b""
        self._heads_done, self._refused = 0, False
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()  # a connection that never completes a head is not held forever either

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes, self._head_started, self._tail = False, 0, False, b""
        self._heads_done += 1
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # The next head's clock starts with its first byte (idle keep-alive is uvicorn's timeout).
        self._in_head, self._head_bytes, self._head_started, self._tail = True, 0, False, b""

    def data_received(self, data: bytes) -> None:
        if self._refused:  # lingering after a refusal: read and drop until the client hangs up
            return
        max_head_bytes = self._head_limits.max_head_bytes
        was_in_head, heads_done = self._in_head, self._heads_done
        if was_in_head:
            self._head_started = True
            self._arm()
            end = _head_end(self._tail, data)
            if self._head_bytes + (len(data) if end < 0 else end) > max_head_bytes:
                self._refuse(self._head_limits.too_large, "malformed_request")
                return
        super().data_received(data)
        if not self._in_head or self.transport.is_closing():
            return
        if was_in_head and heads_done == self._heads_done:  # the whole read lies inside one unfinished head
            self._head_bytes += len(data)
            if self._head_bytes > max_head_bytes:  # (only when a blank line was mistaken for the end)
                self._refuse(self._head_limits.too_large, "malformed_request")
                return
            self._head_started = True
        self._tail = (self._tail + data[-3:])[-3:]

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._head_limits.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._refused or not self._in_head or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm()  # still answering the previous request on this connection: wait for that first
            return
        if not self._head_started:  # not a byte of a request: just close the idle connection
            self.transport.close()
            return
        self._refuse(self._head_limits.too_slow, "timeout")

    def _refuse(self, answer: bytes, reason: str) -> None:
        what = "is too large" if reason == "malformed_request" else "was too slow"
        log.warning("refused a request whose head %s (serve.max_header_bytes / header_timeout_seconds)", what)
        self._head_limits.on_refused(reason)
        self._refused = True
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:  # never interleave with a response
            self.transport.close()
            return
        self.transport.write(answer)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)


def http_protocol(max_head_bytes: int, header_timeout_s: float, on_refused: Callable[[str], None]) -> dict:
    """uvicorn.Config keyword arguments that bound request heads in size and time.

    Args:
        max_head_bytes: Largest request line plus headers accepted, in bytes.
        header_timeout_s: Longest time a request head may take to arrive.
        on_refused: Called with the reason of each refusal (``malformed_request`` or ``timeout``).
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: h11 enforces the size bound itself
        return {"http": "h11", "h11_max_incomplete_event_size": max_head_bytes}
    limits = _HeadLimits.of(max_head_bytes, header_timeout_s, on_refused)

    class BoundedHttpToolsProtocol(_HeadBounds, HttpToolsProtocol):
        """uvicorn's httptools protocol with a size (431) and a time (408) bound on each request head."""

        _head_limits = limits

    return {"http": BoundedHttpToolsProtocol}
