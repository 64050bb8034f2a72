"""Liveness while large bodies are refused: does ``/v2/health/live`` stay fast when clients send junk?

:func:`measure_liveness` runs ``senders`` clients that send, back to back, large request bodies
the server must refuse, each as close to ``serve.max_body_bytes`` as it gets:

==================  =======================================================================
kind                body
==================  =======================================================================
numbers             KServe JSON: one row declared, millions of small integers as its data
empty_arrays        KServe JSON: a ``data`` array of ``[],`` runs (what JSON parsers find slowest)
declared_shape      KServe JSON: a shape declaring more elements than a request may carry
gzip_bomb           a gzip body (a few KB) inflating to four times the body limit
==================  =======================================================================

Meanwhile one prober asks ``GET /v2/health/live`` every ``probe_interval_s`` on its own
keep-alive connection and records how long each answer took. The same probing runs first on an
idle server, for a baseline in the same run. The verdict is the slowest answer under load
against :data:`LIVENESS_TARGET_MS`.
"""

from __future__ import annotations

import gzip
import http.client
import threading
import time
from collections import Counter

import numpy as np

__all__ = ["LIVENESS_TARGET_MS", "liveness_bodies", "liveness_lines", "measure_liveness", "print_liveness"]

LIVENESS_TARGET_MS = 100.0


def liveness_bodies(input_name: str, sample_shape: tuple[int, ...], body_bytes: int) -> dict[str, tuple[bytes, dict]]:
    """kind -> (body, headers) of the large refused bodies, each at most ``body_bytes``."""
    dims = ", ".join(str(d) for d in sample_shape)

    def doc(rows: int, data: str) -> bytes:
        return f'{{"inputs": [{{"name": "{input_name}", "datatype": "UINT8", "shape": [{rows}, {dims}], "data": {data}}}]}}'.encode()

    room = body_bytes - len(doc(1, "[]")) - 16
    as_json = {"content-type": "application/json"}
    bomb = gzip.compress(bytes(4 * body_bytes), compresslevel=9)
    return {
        "numbers": (doc(1, "[" + "7," * (room // 2) + "7]"), as_json),
        "empty_arrays": (doc(1, "[" + "[]," * (room // 3) + "[]]"), as_json),
        "declared_shape": (doc(10**6, "[" + "0," * (room // 2) + "0]"), as_json),
        "gzip_bomb": (bomb, {**as_json, "content-encoding": "gzip"}),
    }


def _sender(host, port, path, bodies, first: int, stop: threading.Event, statuses: Counter, lock) -> None:
    conn, kinds, k = None, list(bodies), first
    while not stop.is_set():
        body, headers = bodies[kinds[k % len(kinds)]]
        k += 1
        try:
            if conn is None:
                conn = http.client.HTTPConnection(host, port, timeout=120)
            conn.request("POST", path, body=body, headers=headers)
            response = conn.getresponse()
            response.read()
            status = response.status
        except (OSError, http.client.HTTPException):
            status = 0
            if conn is not None:
                conn.close()
            conn = None
        with lock:
            statuses[status] += 1
    if conn is not None:
        conn.close()


def _probe(host, port, seconds: float, interval_s: float) -> list[float]:
    """Latencies (ms) of ``GET /v2/health/live`` every ``interval_s`` for ``seconds``."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    out, deadline = [], time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            conn.request("GET", "/v2/health/live")
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"/v2/health/live answered {response.status}")
            out.append((time.perf_counter() - started) * 1000)
            time.sleep(max(0.0, interval_s - (time.perf_counter() - started)))
    finally:
        conn.close()
    return out


def _figures(latencies_ms: list[float]) -> dict:
    values = np.array(latencies_ms or [float("nan")])
    return {
        "probes": len(latencies_ms),
        "p50_ms": float(np.percentile(values, 50)),
        "p99_ms": float(np.percentile(values, 99)),
        "max_ms": float(values.max()),
    }


def measure_liveness(
    host: str,
    port: int,
    model: str,
    input_name: str,
    sample_shape: tuple[int, ...],
    *,
    body_bytes: int,
    seconds: float = 6.0,
    senders: int = 4,
    probe_interval_s: float = 0.02,
) -> dict:
    """Probe liveness idle, then while ``senders`` clients send large refused bodies; the figures."""
    bodies = liveness_bodies(input_name, sample_shape, body_bytes)
    idle = _probe(host, port, min(2.0, seconds / 2), probe_interval_s)
    stop, lock = threading.Event(), threading.Lock()
    statuses: Counter[int] = Counter()
    path = f"/v2/models/{model}/infer"
    threads = [
        threading.Thread(target=_sender, args=(host, port, path, bodies, k, stop, statuses, lock), daemon=True)
        for k in range(senders)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # every sender has a body on the wire
    try:
        loaded = _probe(host, port, seconds, probe_interval_s)
    finally:
        stop.set()
        for thread in threads:
            thread.join(120)
    under_load = _figures(loaded)
    return {
        "senders": senders,
        "body_bytes": {kind: len(body) for kind, (body, _) in bodies.items()},
        "bodies_answered": dict(sorted(statuses.items())),
        "idle": _figures(idle),
        "under_load": under_load,
        "target_ms": LIVENESS_TARGET_MS,
        "ok": under_load["max_ms"] < LIVENESS_TARGET_MS and set(statuses) <= {400, 413, 415},
    }


def liveness_lines(result: dict) -> list[str]:
    """The figures of :func:`measure_liveness` as printed, ending with its own verdict."""
    idle, load = result["idle"], result["under_load"]
    verdict = "PASS" if result["ok"] else "FAIL"
    return [
        f"\nliveness while {result['senders']} clients send large bodies that are refused "
        f"({', '.join(f'{k} {v / 1e6:.1f} MB' for k, v in result['body_bytes'].items())}):",
        f"  bodies answered: {result['bodies_answered']}",
        f"  GET /v2/health/live idle: p50 {idle['p50_ms']:.1f} ms, max {idle['max_ms']:.1f} ms ({idle['probes']} probes); "
        f"under load: p50 {load['p50_ms']:.1f} ms, p99 {load['p99_ms']:.1f} ms, max {load['max_ms']:.1f} ms "
        f"({load['probes']} probes)",
        f"  liveness under {result['target_ms']:.0f} ms: {verdict} (slowest answer {load['max_ms']:.1f} ms)",
    ]


def print_liveness(result: dict) -> None:
    print("\n".join(liveness_lines(result)))
