"""The Prometheus metric names gpufeed's trainer and server export: one table, checked everywhere.

The trainer (``gpufeed train``) and the server (``gpufeed serve``) export exactly these series,
and the Prometheus rules and Grafana dashboards under ``gpufeed/obs/stack/`` may query only them. Tests check that the dashboards and rules name only these series (plus the recording
rules they define), and the live test checks that a real trainer and server export all of them.

Label values come from small fixed sets (``STAGES``, ``PROTOCOLS``, ``ERROR_REASONS``, a rank, a
loaded model's name or ``"unknown"``), never from user input, so a request can never create a
new series.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpufeed.core import PROTOCOLS, STAGES

__all__ = [
    "DCGM_METRICS",
    "ERROR_REASONS",
    "METRICS",
    "PROTOCOLS",
    "STAGES",
    "MetricSpec",
    "exported_series_names",
    "metric_by_name",
]

MetricType = Literal["histogram", "counter", "gauge"]

ERROR_REASONS = (
    "corrupt_image",
    "unsupported_media_type",
    "bad_shape",
    "bad_dtype",
    "too_many_pixels",
    "corrupt_video",
    "video_too_long",
    "body_too_large",
    "malformed_request",
    "unknown_model",
    "queue_full",
    "timeout",
    "unauthorized",
    "client_disconnect",  # the client hung up before its request was read: counted, never a server error
    "internal",
)


@dataclass(frozen=True)
class MetricSpec:
    """One contracted metric.

    Attributes:
        name: The metric family name as exported (a counter's name includes ``_total``).
        type: ``histogram``, ``counter`` or ``gauge``.
        labels: Its label names (besides ``job``/``instance``, which Prometheus adds).
        component: ``train`` or ``server``: which process exports it.
        doc: What it measures.
    """

    name: str
    type: MetricType
    labels: tuple[str, ...]
    component: Literal["train", "server"]
    doc: str

    def series_names(self) -> tuple[str, ...]:
        """The sample names Prometheus stores: histograms are ``_bucket``, ``_sum`` and ``_count``."""
        if self.type == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


def _train(name: str, kind: MetricType, doc: str) -> MetricSpec:
    return MetricSpec(name, kind, ("rank",), "train", doc)


def _server(name: str, kind: MetricType, labels: tuple[str, ...], doc: str) -> MetricSpec:
    return MetricSpec(name, kind, labels, "server", doc)


METRICS: tuple[MetricSpec, ...] = (
    _train("gpufeed_train_loader_wait_seconds", "histogram", "time blocked waiting for the next batch"),
    _train("gpufeed_train_augment_seconds", "histogram", "Kornia augmentation on the device"),
    _train("gpufeed_train_compute_seconds", "histogram", "forward + backward + optimizer step"),
    _train(
        "gpufeed_train_step_seconds",
        "histogram",
        "the step's period: from the end of the previous step's record to the end of its own",
    ),
    _train("gpufeed_train_samples_total", "counter", "training samples consumed"),
    _train("gpufeed_train_steps_total", "counter", "optimizer steps taken"),
    _train("gpufeed_train_skipped_samples_total", "counter", "samples skipped because they failed to decode"),
    _train("gpufeed_train_epoch", "gauge", "current epoch"),
    _train("gpufeed_train_loss", "gauge", "latest training loss"),
    _server(
        "gpufeed_server_stage_seconds",
        "histogram",
        ("model", "stage"),
        "time per request in one stage: " + ", ".join(STAGES),
    ),
    _server("gpufeed_server_request_seconds", "histogram", ("model", "protocol"), "the whole request"),
    _server("gpufeed_server_batch_size", "histogram", ("model",), "real rows per executed batch"),
    _server(
        "gpufeed_server_batch_fill_ratio",
        "histogram",
        ("model",),
        "real rows / the batch size the batch ran at (the rest is padding)",
    ),
    _server("gpufeed_server_queue_depth", "gauge", ("model",), "requests waiting in the batcher"),
    _server("gpufeed_server_inflight_requests", "gauge", (), "requests being handled"),
    _server("gpufeed_server_model_ready", "gauge", ("model",), "1 when the model is loaded and warmed up"),
    _server("gpufeed_server_requests_total", "counter", ("model", "protocol", "code"), "answered requests"),
    _server("gpufeed_server_errors_total", "counter", ("model", "reason"), "failed requests by reason"),
)
"""Every Prometheus metric the trainer and the server export, as :class:`MetricSpec`: the naming contract."""

# NVIDIA dcgm-exporter's fields the dashboards use (percent, per GPU); only present on GPU hosts.
DCGM_METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_DEC_UTIL")


def metric_by_name() -> dict[str, MetricSpec]:
    """Every stored sample name (``..._bucket``, ``..._total`` ...) mapped to its metric."""
    return {series: spec for spec in METRICS for series in spec.series_names()}


def exported_series_names(component: str | None = None) -> set[str]:
    """The sample names a trainer (``"train"``), a server (``"server"``) or both (``None``) export."""
    return {s for spec in METRICS if component in (None, spec.component) for s in spec.series_names()}
