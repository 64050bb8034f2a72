"""A closed-loop HTTP load generator: C keep-alive connections, each sending its next request when
the previous answer arrives. The same client, the same bytes, for every server under test.

It speaks just enough HTTP/1.1 (Content-Length bodies, keep-alive) over asyncio streams to stay
cheap: on a 2-core machine the client shares the CPU with the server, and a heavy client would
measure itself. Latency is counted for requests sent inside the measurement window; throughput is
the answers received inside it, per second.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

__all__ = ["LoadResult", "multipart_request", "run_load"]

RESPONSE_TIMEOUT_S = 60.0


def multipart_request(
    host: str, port: int, path: str, image: bytes, field_name: str = "image", headers: dict[str, str] | None = None
) -> bytes:
    """A complete ``POST path`` carrying ``image`` as a multipart/form-data file (plus extra ``headers``)."""
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="{field_name}"; filename="image.jpg"\r\n'
            f"Content-Type: image/jpeg\r\n\r\n"
        ).encode()
        + image
        + f"\r\n--{boundary}--\r\n".encode()
    )
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: gpufeed-bench\r\n{extra}"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head + body


@dataclass
class LoadResult:
    """What one load run measured."""

    concurrency: int
    seconds: float
    ok: int = 0
    errors: int = 0
    answered: int = 0  # every answer, warm-up included (for CPU time per request)
    latencies_s: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    reasons: dict[str, int] = field(default_factory=dict)  # the JSON "reason" of refusals in the window
    retry_after: int = 0  # refusals in the window that carried a Retry-After header
    no_answer: int = 0  # requests that got no response (connection dropped or RESPONSE_TIMEOUT_S passed)
    done_s: list[float] = field(default_factory=list)  # when each success arrived, seconds into the window

    @property
    def throughput(self) -> float:
        """Successful answers per second inside the window."""
        return self.ok / self.seconds

    def record(
        self, status: int, sent: float, done: float, window: tuple[float, float], retry_after: bool, reason: str | None
    ) -> None:
        """Count one answer; only those sent and answered inside ``window`` (start, end) are figures."""
        self.answered += 1
        start, end = window
        if not (start <= sent and done <= end):
            return
        self.statuses[status] = self.statuses.get(status, 0) + 1
        if status == 200:
            self.ok += 1
            self.latencies_s.append(done - sent)
            self.done_s.append(done - start)
        else:
            self.errors += 1
            self.no_answer += status == 599
            self.retry_after += retry_after
            if reason is not None:
                self.reasons[reason] = self.reasons.get(reason, 0) + 1

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1000) if self.latencies_s else float("nan")

    def to_dict(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "seconds": self.seconds,
            "ok": self.ok,
            "errors": self.errors,
            "throughput_rps": self.throughput,
            "p50_ms": self.percentile_ms(50),
            "p99_ms": self.percentile_ms(99),
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "reasons": dict(sorted(self.reasons.items())),
            "retry_after": self.retry_after,
            "no_answer": self.no_answer,
        }


@dataclass
class _Answer:
    status: int
    close: bool
    retry_after: bool = False
    reason: str | None = None


async def _read_response(reader: asyncio.StreamReader) -> _Answer:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    answer = _Answer(int(lines[0].split(" ", 2)[1]), False)
    length = None
    for line in lines[1:]:
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "content-length":
            length = int(value)
        elif key == "connection" and value.strip().lower() == "close":
            answer.close = True
        elif key == "retry-after":
            answer.retry_after = True
        elif key == "transfer-encoding":
            raise RuntimeError("the load generator reads Content-Length bodies only")
    if length is None:
        raise RuntimeError("a response without Content-Length")
    body = await reader.readexactly(length)
    if answer.status != 200:  # refusals are small JSON {"error", "reason"}; successes are not parsed
        try:
            answer.reason = str(json.loads(body).get("reason"))
        except (ValueError, AttributeError):
            answer.reason = "(not JSON)"
    return answer


async def _connection(host, port, requests, offset, window, result: LoadResult, timeout_s: float) -> None:
    _, end = window
    reader, writer = await asyncio.open_connection(host, port)
    k = offset
    try:
        while time.perf_counter() < end:
            request = requests[k % len(requests)]
            k += 1
            sent = time.perf_counter()
            writer.write(request)
            try:
                answer = await asyncio.wait_for(_read_response(reader), timeout_s)
            except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
                answer = _Answer(599, True)  # no answer: counted as an error, and a fresh connection
            done = time.perf_counter()
            close = answer.close
            result.record(answer.status, sent, done, window, answer.retry_after, answer.reason)
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection(host, port)
    finally:
        writer.close()


async def _run(host, port, requests, concurrency, warmup_s, seconds, timeout_s) -> LoadResult:
    now = time.perf_counter()
    window = (now + warmup_s, now + warmup_s + seconds)
    result = LoadResult(concurrency, seconds)
    await asyncio.gather(
        *[_connection(host, port, requests, k * 7, window, result, timeout_s) for k in range(concurrency)]
    )
    return result


def run_load(
    host: str,
    port: int,
    path: str,
    images: list[bytes],
    *,
    concurrency: int,
    seconds: float,
    warmup_s: float = 1.0,
    headers: dict[str, str] | None = None,
    response_timeout_s: float = RESPONSE_TIMEOUT_S,
) -> LoadResult:
    """Drive ``POST path`` with ``concurrency`` connections for ``warmup_s + seconds``.

    Args:
        headers: Extra request headers (``Authorization``).
        response_timeout_s: A request without an answer by then counts as status 599 (``no_answer``).
    """
    requests = [multipart_request(host, port, path, image, headers=headers) for image in images]
    run = _run(host, port, requests, concurrency, warmup_s, seconds, response_timeout_s)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        return asyncio.run(run)
    return uvloop.run(run)
