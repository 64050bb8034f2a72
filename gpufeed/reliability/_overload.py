"""``gpufeed reliability overload``: offer far more load than the server can take, and watch it refuse cleanly.

A ``gpufeed serve`` child process with a small queue (``serve.queue_capacity``) is driven by many
more closed-loop clients than the queue holds. Clients do not back off: a 503 is followed at once
by the next request, so the offered load stays well above capacity for the whole run. Meanwhile
``/metrics`` is scraped every 50 ms for ``gpufeed_server_queue_depth``.

What it checks (:class:`OverloadReport`): the queue depth never exceeds its capacity; every
refusal is 503 ``queue_full`` with Retry-After; admitted requests are answered (200) within
``serve.request_timeout_seconds``; no request goes unanswered (the client's own timeout never
fires); afterwards the server is ready and answers a request exactly as before the overload.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufeed.bench import run_load
from gpufeed.core import Check
from gpufeed.models import read_model_card
from gpufeed.reliability._serve_proc import ServeProcess
from gpufeed.reliability._server_runs import ServerRunReport, exit_check

__all__ = ["OverloadReport", "predict_scores", "run_overload"]

QUEUE_METRIC = "gpufeed_server_queue_depth"


def _scrape(url: str, headers: dict[str, str]) -> dict[tuple[str, tuple], float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", headers=headers, timeout=10).text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _watch_depth(url: str, model: str, headers, depths: list[float], stop: threading.Event) -> None:
    import httpx

    key = (QUEUE_METRIC, (("model", model),))
    while not stop.is_set():
        with contextlib.suppress(httpx.TransportError, KeyError):
            depths.append(_scrape(url, headers)[key])
        stop.wait(0.05)


def predict_scores(url: str, model: str, image: bytes, num_classes: int, headers: dict[str, str]) -> list[float]:
    """Every class score for ``image`` through REST, in class order (raises unless 200)."""
    import httpx

    response = httpx.post(
        f"{url}/v1/models/{model}/predict?top_k={num_classes}",
        files={"image": ("image.jpg", image, "image/jpeg")},
        headers=headers,
        timeout=60,
    )
    if response.status_code != 200:
        raise RuntimeError(f"a valid request got {response.status_code}: {response.text[:300]}")
    (prediction,) = response.json()["predictions"]
    return [t["score"] for t in sorted(prediction["top_k"], key=lambda t: t["index"])]


def _watched_load(server: ServeProcess, model: str, images: list[bytes], headers, depths: list[float], **load) -> tuple:
    """Drive ``server`` with :func:`~gpufeed.bench.run_load` (``load``: its keywords) while a thread scrapes
    its queue depth into ``depths``; the load's result and its seconds."""
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_depth, args=(server.url, model, headers, depths, stop), daemon=True)
    watcher.start()
    started = time.perf_counter()
    try:
        result = run_load(server.host, server.port, f"/v1/models/{model}/predict", images, **load)
    finally:
        stop.set()
        watcher.join(10)
    return result, time.perf_counter() - started


def _counted_errors(before: dict, after: dict, model: str) -> dict[str, float]:
    """The server's error counts by reason, from its metrics scraped before and after the load."""
    key = "gpufeed_server_errors_total"
    return {
        reason: after.get((key, (("model", model), ("reason", reason))), 0.0)
        - before.get((key, (("model", model), ("reason", reason))), 0.0)
        for reason in ("queue_full", "timeout", "internal")
    }


def run_overload(
    model_dir: Path,
    images: list[bytes],
    *,
    clients: int = 64,
    seconds: float = 10.0,
    warmup_s: float = 2.0,
    queue_capacity: int = 16,
    request_timeout_s: float = 5.0,
    overrides: tuple[str, ...] = (),
    device: str = "cpu",
) -> OverloadReport:
    """Serve ``model_dir`` with a ``queue_capacity`` queue, drive it with ``clients`` connections; return figures."""
    import httpx

    card = read_model_card(model_dir)
    settings = [
        f"serve.queue_capacity={queue_capacity}",
        f"serve.request_timeout_seconds={request_timeout_s}",
        "serve.retry_after_seconds=1",
        *overrides,
    ]
    depths: list[float] = []
    with ServeProcess(model_dir, settings, device=device) as server:
        headers: dict[str, str] = {}
        num_classes = card.spec.num_classes
        before = predict_scores(server.url, card.name, images[0], num_classes, headers)
        errors_before = _scrape(server.url, headers)
        result, load_seconds = _watched_load(
            server,
            card.name,
            images,
            headers,
            depths,
            concurrency=clients,
            seconds=seconds,
            warmup_s=warmup_s,
            response_timeout_s=request_timeout_s + 10.0,
        )
        ready_after = httpx.get(server.url + "/v2/health/ready", timeout=10).status_code
        after = predict_scores(server.url, card.name, images[0], num_classes, headers)
        errors_after = _scrape(server.url, headers)
    answered = sum(result.statuses.values())
    refused = result.statuses.get(503, 0)
    figures = {
        "benchmark": "overload",
        "model": {
            "name": card.name,
            "architecture": card.spec.name,
            "size_px": card.spec.size_px.label,
            "batch_size": card.batch_size,
        },
        "clients": clients,
        "seconds": seconds,
        "queue_capacity": queue_capacity,
        "request_timeout_seconds": request_timeout_s,
        "device": device,
        "load": result.to_dict(),
        "offered_rps": answered / seconds,
        "admitted_rps": result.throughput,
        "refused_share": refused / answered if answered else float("nan"),
        "admitted_max_ms": max(result.latencies_s, default=float("nan")) * 1000,
        "queue_depth_max": max(depths, default=float("nan")),
        "queue_depth_samples": len(depths),
        "counted_errors": _counted_errors(errors_before, errors_after, card.name),
        "ready_after": ready_after,
        "same_answer_after": bool(np.allclose(before, after, atol=1e-6)) and len(before) == num_classes,
        "exit_status": server.exit_status,
        "load_seconds": load_seconds,
    }
    return OverloadReport(figures)


@dataclass
class OverloadReport(ServerRunReport):
    """An overload run's figures; what it must show is in the module docs."""

    def checks(self) -> list[Check]:
        result, load = self.figures, self.figures["load"]
        statuses = {int(k): v for k, v in load["statuses"].items()}
        refused = statuses.get(503, 0)
        return [
            Check(
                "some requests refused", refused > 0, "no request was refused: the offered load did not exceed capacity"
            ),
            Check("some requests admitted", load["ok"] > 0, "no request was admitted"),
            Check("only 200 and 503", not set(statuses) - {200, 503}, f"statuses other than 200 and 503: {statuses}"),
            Check(
                "refused only for queue_full",
                not (load["reasons"] and set(load["reasons"]) != {"queue_full"}),
                f"refusal reasons other than queue_full: {load['reasons']}",
            ),
            Check(
                "Retry-After on every 503",
                load["retry_after"] == refused,
                f"{refused - load['retry_after']} of {refused} 503s came without Retry-After",
            ),
            Check(
                "every request answered",
                not load["no_answer"],
                f"{load['no_answer']} request(s) got no answer (hung or dropped)",
            ),
            Check(
                "queue depth within capacity",
                result["queue_depth_max"] <= result["queue_capacity"],
                f"queue depth reached {result['queue_depth_max']:g} > capacity {result['queue_capacity']}",
            ),
            Check(
                "admitted requests within the request timeout",
                result["admitted_max_ms"] <= result["request_timeout_seconds"] * 1000,
                f"an admitted request took {result['admitted_max_ms']:.0f} ms, over the request timeout",
            ),
            Check(
                "ready and the same answer afterwards",
                result["ready_after"] == 200 and result["same_answer_after"],
                f"after the overload: ready {result['ready_after']}, same answer {result['same_answer_after']}",
            ),
            exit_check(result["exit_status"]),
        ]

    def lines(self) -> list[str]:
        result = self.figures
        load, model = result["load"], result["model"]
        return [
            f"\noverload: {result['clients']} clients without back-off x {result['seconds']:g} s against gpufeed serve "
            f"({model['architecture']} {model['size_px']} px batch {model['batch_size']}, {result['device']}), "
            f"queue capacity {result['queue_capacity']} images, request timeout {result['request_timeout_seconds']:g} s",
            f"  offered {result['offered_rps']:,.0f} req/s; admitted {result['admitted_rps']:,.1f} req/s (200); "
            f"refused {result['refused_share']:.1%} with 503 (reasons {load['reasons']}, Retry-After on "
            f"{load['retry_after']:,}); unanswered {load['no_answer']}",
            f"  admitted latency p50 {load['p50_ms']:,.1f} ms, p99 {load['p99_ms']:,.1f} ms, max "
            f"{result['admitted_max_ms']:,.1f} ms (timeout {result['request_timeout_seconds'] * 1000:,.0f} ms)",
            f"  queue depth: max {result['queue_depth_max']:g} of {result['queue_capacity']} over "
            f"{result['queue_depth_samples']} scrapes; counted errors {result['counted_errors']}",
            f"  after: ready {result['ready_after']}, same answer as before {result['same_answer_after']}, "
            f"exit status on SIGTERM {result['exit_status']}",
        ]
