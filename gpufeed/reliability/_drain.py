"""``gpufeed reliability drain``: SIGTERM a busy ``gpufeed serve`` and account for every request.

Scenario, against a ``gpufeed serve`` child process:

1. ``N - 1`` requests are sent together (N: the model's batch size) and held in the batcher by a
   long ``serve.max_delay_ms``, so they are certainly in flight; the server's
   ``gpufeed_server_inflight_requests`` gauge confirms it before anything else happens;
2. SIGTERM. From then on, a readiness probe and a client sending new predictions (each on a fresh
   connection) run every 50 ms until 70 % of ``serve.shutdown_delay_seconds`` has passed, as a
   load balancer would until it sees the readiness change;
3. the process must exit by itself, with status 0.

Every request sent is accounted for: answered (with its status), refused at connect (never sent,
so never dropped), or dropped (sent, no answer). What it checks (:class:`DrainReport`): no
request dropped; the in-flight requests answered 200 with the scores the same images got before the signal;
readiness false (400, the KServe v2 "4xx for false") from the first probe after the signal; new
requests 503 ``not_ready`` with Retry-After and ``Connection: close``; exit status 0.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufeed.core import Check
from gpufeed.models import read_model_card
from gpufeed.reliability._serve_proc import ServeProcess
from gpufeed.reliability._server_runs import ServerRunReport, exit_check

__all__ = ["DrainReport", "run_drain"]


class _Tally:
    """Every request sent, by outcome; thread-safe."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = self.dropped = self.refused_connect = 0
        self.statuses: dict[str, int] = {}

    def send(self, call):
        """Run ``call()`` (one HTTP request); return its response or None, counting the outcome."""
        import httpx

        with self.lock:
            self.sent += 1
        try:
            response = call()
        except httpx.ConnectError:
            with self.lock:
                self.refused_connect += 1
            return None
        except httpx.TransportError:
            with self.lock:
                self.dropped += 1
            return None
        with self.lock:
            key = str(response.status_code)
            self.statuses[key] = self.statuses.get(key, 0) + 1
        return response


def _predict(url: str, model: str, image: bytes, num_classes: int):
    import httpx

    return lambda: httpx.post(
        f"{url}/v1/models/{model}/predict?top_k={num_classes}",
        content=image,
        headers={"content-type": "image/jpeg"},
        timeout=60,
    )


def _scores(response) -> list[float]:
    (prediction,) = response.json()["predictions"]
    return [t["score"] for t in sorted(prediction["top_k"], key=lambda t: t["index"])]


def _inflight(url: str) -> float:
    import httpx

    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("gpufeed_server_inflight_requests "):
            return float(line.split()[1])
    return float("nan")


def run_drain(
    model_dir: Path,
    images: list[bytes],
    *,
    hold_ms: float = 2000.0,
    shutdown_delay_s: float = 2.0,
    device: str = "cpu",
) -> DrainReport:
    """SIGTERM a server with requests in flight; return how every request ended (see module docs)."""
    import httpx

    card = read_model_card(model_dir)
    held = card.batch_size - 1
    if held < 1 or len(images) < held:
        raise ValueError(f"need a model with batch size >= 2 and >= {held} images")
    # Only the largest batch size: the held requests wait for a full batch (or hold_ms) together.
    settings = [
        f"serve.max_delay_ms={hold_ms}",
        f"serve.shutdown_delay_seconds={shutdown_delay_s}",
        f"serve.batch_sizes=[{card.batch_size}]",
    ]
    tally = _Tally()
    probes: dict[str, list[tuple[float, int]]] = {"ready": [], "predict": []}
    headers_seen: list[dict] = []
    with ServeProcess(model_dir, settings, device=device) as server, ThreadPoolExecutor(held + 2) as pool:
        url, n = server.url, card.spec.num_classes
        reference = [_scores(r) for r in pool.map(lambda b: _predict(url, card.name, b, n)(), images[:held])]
        flights = [pool.submit(tally.send, _predict(url, card.name, b, n)) for b in images[:held]]
        deadline = time.monotonic() + 30
        while _inflight(url) < held and time.monotonic() < deadline:
            time.sleep(0.02)
        inflight_at_signal = _inflight(url)
        t_signal = time.monotonic()
        server.send_signal(signal.SIGTERM)

        def probe(kind: str, call) -> None:
            while time.monotonic() < t_signal + 0.7 * shutdown_delay_s:
                response = tally.send(call)
                if response is not None:
                    probes[kind].append((time.monotonic() - t_signal, response.status_code))
                    if kind == "predict":
                        headers_seen.append({**response.headers, "reason": response.json().get("reason")})
                time.sleep(0.05)

        ready_probe = pool.submit(probe, "ready", lambda: httpx.get(url + "/v2/health/ready", timeout=30))
        predict_probe = pool.submit(probe, "predict", _predict(url, card.name, images[0], n))
        answers = [f.result(timeout=120) for f in flights]
        ready_probe.result(timeout=120)
        predict_probe.result(timeout=120)
        try:
            exit_status = server.wait(timeout=120)
        except subprocess.TimeoutExpired:  # reported as a failure below, not raised mid-accounting
            exit_status = None
        exit_seconds = time.monotonic() - t_signal
        log = server.log()
    same = [
        r is not None and r.status_code == 200 and np.allclose(_scores(r), a, atol=1e-6)
        for r, a in zip(answers, reference, strict=True)
    ]
    figures = {
        "benchmark": "drain",
        "model": {"name": card.name, "architecture": card.spec.name, "batch_size": card.batch_size},
        "hold_ms": hold_ms,
        "shutdown_delay_seconds": shutdown_delay_s,
        "device": device,
        "inflight_at_signal": inflight_at_signal,
        "inflight_answered_correctly": sum(same),
        "inflight_sent": held,
        "requests_sent": tally.sent,
        "statuses": dict(sorted(tally.statuses.items())),
        "dropped": tally.dropped,
        "refused_at_connect": tally.refused_connect,
        "ready_probes": probes["ready"],
        "predict_probes": probes["predict"],
        "drain_responses": headers_seen,
        "exit_status": exit_status,
        "seconds_to_exit": exit_seconds,
        "log_says_drained": "model(s) drained" in log,
    }
    return DrainReport(figures)


@dataclass
class DrainReport(ServerRunReport):
    """A drain run's figures; what it must show is in the module docs."""

    def checks(self) -> list[Check]:
        result = self.figures
        ready = [status for _, status in result["ready_probes"]]
        predicts = result["drain_responses"]
        wrong = [
            answer
            for answer in predicts
            if answer.get("reason") != "not_ready" or "retry-after" not in answer or answer.get("connection") != "close"
        ]
        return [
            Check(
                "every held request in flight at the signal",
                not result["inflight_at_signal"] < result["inflight_sent"],  # a failed scrape (nan) passes
                f"only {result['inflight_at_signal']:g} of {result['inflight_sent']} requests were in flight",
            ),
            Check(
                "in-flight requests answered with their own scores",
                result["inflight_answered_correctly"] == result["inflight_sent"],
                f"{result['inflight_sent'] - result['inflight_answered_correctly']} in-flight request(s) not answered "
                "200 with their own scores",
            ),
            Check(
                "no request dropped or refused at connect",
                not (result["dropped"] or result["refused_at_connect"]),
                f"{result['dropped']} dropped, {result['refused_at_connect']} refused at connect",
            ),
            Check(
                "not ready from the signal on",
                bool(ready) and set(ready) == {400},
                f"readiness after SIGTERM: {ready} (expected 400, not ready, only)",
            ),
            Check("new requests tried during the drain", bool(predicts), "no new request was tried during the drain"),
            Check(
                "new requests refused not_ready, with Retry-After and close",
                not wrong,
                f"a request during the drain got {wrong[0] if wrong else None} (expected not_ready, Retry-After, close)",
            ),
            exit_check(result["exit_status"]),
            Check(
                "the log says the models drained",
                result["log_says_drained"],
                "the server's log does not say the models were drained",
            ),
        ]

    def lines(self) -> list[str]:
        result = self.figures
        ready = result["ready_probes"]
        first = f"{ready[0][0] * 1000:.0f} ms" if ready else "-"
        return [
            f"\ndrain: SIGTERM to gpufeed serve ({result['model']['architecture']}, batch "
            f"{result['model']['batch_size']}, {result['device']}) with {result['inflight_at_signal']:g} requests in "
            f"flight (held by max_delay_ms {result['hold_ms']:g}), shutdown_delay_seconds "
            f"{result['shutdown_delay_seconds']:g}",
            f"  in flight: {result['inflight_answered_correctly']} of {result['inflight_sent']} answered 200 with the "
            f"scores the same images got before the signal",
            f"  during the drain: readiness {sorted({s for _, s in ready})} from the first probe ({first} after the "
            f"signal); new predictions {sorted({s for _, s in result['predict_probes']})} (not_ready, Retry-After, "
            "Connection: close)",
            f"  every request: {result['requests_sent']} sent, statuses {result['statuses']}, dropped "
            f"{result['dropped']}, refused at connect {result['refused_at_connect']}",
            f"  exit status {result['exit_status']} after {result['seconds_to_exit']:.2f} s",
        ]
