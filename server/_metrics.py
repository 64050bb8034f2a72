"""The server's Prometheus metrics.

Names and labels are a contract with the dashboards and rules in ``gpufeed/obs`` (see ``docs/monitoring.md``).

All series live in one :class:`prometheus_client.CollectorRegistry` per server, so several servers
(tests, benchmarks) can share a process. Label values come from small fixed sets: ``model`` is a
loaded model's name or ``"unknown"``, never text taken from a request; ``stage`` and ``protocol``
come from :mod:`gpufeed.core._metric_values` (shared with the trainer and the metrics contract, as are
the latency buckets), ``reason`` from :data:`~gpufeed.server._errors.REASONS`; ``code`` is an HTTP
status the server itself chose (499 for a client that closed the connection before its request was
read, or cancelled its gRPC call, nginx's convention); a gRPC answer is counted with the HTTP
status the same answer gets over HTTP (200 for OK, 400 for INVALID_ARGUMENT ...; see
:mod:`._grpc`).

Every observation is also passed to :class:`~gpufeed.server._stats.InferenceStats` (``stats``),
which answers Triton's statistics endpoint from the very same calls.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpufeed.core import PROTOCOLS, SERVER_SECONDS_BUCKETS, STAGES
from gpufeed.server._errors import REASONS
from gpufeed.server._stats import InferenceStats

__all__ = ["PROTOCOLS", "STAGES", "UNKNOWN_MODEL", "ServerMetrics"]

UNKNOWN_MODEL = "unknown"


def _batch_buckets(batch_sizes: list[int]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    largest = max(batch_sizes, default=1)
    sizes = tuple(float(n) for n in range(1, largest + 1)) if largest <= 64 else (1, 2, 4, 8, 16, 32, 64, 128, 256)
    ratios = sorted({round(k / n, 6) for n in batch_sizes for k in range(1, n + 1)})
    if len(ratios) > 40:
        ratios = [round(k / 10, 1) for k in range(1, 11)]
    return tuple(float(s) for s in sizes), tuple(ratios)


class ServerMetrics:
    """Every serving metric, pre-created for each loaded model so dashboards see zeros, not gaps.

    Args:
        batch_sizes: Loaded model name -> its fixed batch size N.
    """

    def __init__(self, batch_sizes: dict[str, int]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.models = frozenset(batch_sizes)
        self.stats = InferenceStats(self.models)
        size_buckets, ratio_buckets = _batch_buckets(list(batch_sizes.values()))
        r = self.registry
        self.stage_seconds = Histogram(
            "gpufeed_server_stage_seconds",
            "Time in one serving stage: preprocess (parse and validate), queue_wait (in the batcher), decode "
            "(DALI decode+resize of a batch), inference (onnxruntime on a batch), postprocess (scores to a response)",
            ["model", "stage"],
            buckets=SERVER_SECONDS_BUCKETS,
            registry=r,
        )
        self.request_seconds = Histogram(
            "gpufeed_server_request_seconds",
            "Whole inference request, first byte read to response ready",
            ["model", "protocol"],
            buckets=SERVER_SECONDS_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "gpufeed_server_batch_size",
            "Real rows (not padding) per executed batch",
            ["model"],
            buckets=size_buckets,
            registry=r,
        )
        self.batch_fill_ratio = Histogram(
            "gpufeed_server_batch_fill_ratio",
            "Real rows / the batch size the batch ran at (the rest is padding), per executed batch",
            ["model"],
            buckets=ratio_buckets,
            registry=r,
        )
        self.queue_depth = Gauge(
            "gpufeed_server_queue_depth", "Images waiting in the model's batcher", ["model"], registry=r
        )
        self.inflight = Gauge("gpufeed_server_inflight_requests", "Inference requests being handled", registry=r)
        self.model_ready = Gauge(
            "gpufeed_server_model_ready", "1 when the model is loaded and warmed up, else 0", ["model"], registry=r
        )
        self.requests_total = Counter(
            "gpufeed_server_requests", "Inference requests by HTTP status", ["model", "protocol", "code"], registry=r
        )
        self.errors_total = Counter(
            "gpufeed_server_errors", "Refused or failed requests by reason", ["model", "reason"], registry=r
        )
        for model in sorted(self.models):
            for stage in STAGES:
                self.stage_seconds.labels(model, stage)
            for protocol in PROTOCOLS:
                self.request_seconds.labels(model, protocol)
            for reason in REASONS:
                self.errors_total.labels(model, reason)
            self.batch_size.labels(model)
            self.batch_fill_ratio.labels(model)
            self.model_ready.labels(model).set(0)

    def model_label(self, name: str) -> str:
        """``name`` if it is a loaded model, else ``"unknown"`` (requests cannot mint label values)."""
        return name if name in self.models else UNKNOWN_MODEL

    def observe_stage(self, model: str, stage: str, seconds: float) -> None:
        if stage not in STAGES:
            raise ValueError(f"stage {stage!r} is not allowed; allowed: {', '.join(STAGES)}")
        self.stage_seconds.labels(self.model_label(model), stage).observe(seconds)
        self.stats.stage(model, stage, seconds)

    def observe_answer(self, model: str, items, postprocess_s: float) -> None:
        """A request's answer is written: its ``postprocess`` stage, and its rows' compute times for Triton's statistics."""
        self.observe_stage(model, "postprocess", postprocess_s)
        rows = [(item.times.get("input_s", 0.0), item.times.get("inference_s", 0.0)) for item in items]
        self.stats.answered(model, rows, postprocess_s)

    def observe_request(self, model: str, protocol: str, code: int, seconds: float) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol {protocol!r} is not allowed; allowed: {', '.join(PROTOCOLS)}")
        label = self.model_label(model)
        self.request_seconds.labels(label, protocol).observe(seconds)
        self.requests_total.labels(label, protocol, str(int(code))).inc()
        self.stats.request(model, code, seconds)

    def count_error(self, model: str, reason: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"reason {reason!r} is not allowed; allowed: {', '.join(REASONS)}")
        self.errors_total.labels(self.model_label(model), reason).inc()

    def observe_batch(
        self,
        model: str,
        rows: int,
        batch_size: int,
        *,
        decode_s: float | None = None,
        inference_s: float | None = None,
    ) -> None:
        """A batch of ``rows`` real rows ran; its decode and inference times feed Triton's ``batch_stats``."""
        label = self.model_label(model)
        self.stats.batch(model, rows, decode_s, inference_s)
        self.batch_size.labels(label).observe(rows)
        self.batch_fill_ratio.labels(label).observe(rows / batch_size)

    def track_queue_depth(self, model: str, depth: Callable[[], float]) -> None:
        """Read the queue depth from ``depth()`` at every scrape."""
        self.queue_depth.labels(self.model_label(model)).set_function(depth)

    def set_ready(self, model: str, ready: bool) -> None:
        self.model_ready.labels(self.model_label(model)).set(1 if ready else 0)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition format and its content type, for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
