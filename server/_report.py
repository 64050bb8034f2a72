"""Reading the server's own ``/metrics`` back into a per-stage latency table (demo, benchmark).

Percentiles are estimated from the histogram buckets the way Prometheus' ``histogram_quantile``
does (linear interpolation inside the bucket that holds the rank), so the table shows what a
Grafana panel over the same series would.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from gpufeed.core import format_table
from gpufeed.server._metrics import PROTOCOLS, STAGES

__all__ = ["histogram_quantile", "stage_latency_rows", "stage_latency_table"]


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The ``q`` quantile from cumulative ``(upper_bound, count)`` buckets (``+Inf`` last)."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return math.nan
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # beyond the last finite bucket: its bound is all we know
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return buckets[-1][0]


def _histograms(text: str, name: str, model: str, key: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for s in family.samples:
            if s.labels.get("model") != model:
                continue
            entry = out.setdefault(s.labels[key], {"buckets": [], "sum": 0.0, "count": 0.0})
            if s.name.endswith("_bucket"):
                entry["buckets"].append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_sum"):
                entry["sum"] = s.value
            elif s.name.endswith("_count"):
                entry["count"] = s.value
    return out


def stage_latency_rows(metrics_text: str, model: str) -> list[list]:
    """Rows ``[what, count, mean ms, p50 ms, p99 ms]``: each stage, then each protocol's whole request."""
    rows = []
    stages = _histograms(metrics_text, "gpufeed_server_stage_seconds", model, "stage")
    requests = _histograms(metrics_text, "gpufeed_server_request_seconds", model, "protocol")
    for label, table in [(s, stages) for s in STAGES] + [(f"request ({p})", requests) for p in PROTOCOLS]:
        key = label.removeprefix("request (").removesuffix(")")
        entry = table.get(key)
        if not entry or not entry["count"]:
            continue
        rows.append(
            [
                label,
                int(entry["count"]),
                1000 * entry["sum"] / entry["count"],
                1000 * histogram_quantile(0.5, entry["buckets"]),
                1000 * histogram_quantile(0.99, entry["buckets"]),
            ]
        )
    return rows


def stage_latency_table(metrics_text: str, model: str) -> str:
    """The per-stage table as text (decode and inference are per batch; the rest per request or image)."""
    rows = stage_latency_rows(metrics_text, model)
    if not rows:
        return f"(no requests recorded for model {model!r})"
    cells = [[label, count, *(f"{v:8.2f}" for v in values)] for label, count, *values in rows]
    return format_table(["stage", "count", "mean ms", "p50 ms", "p99 ms"], cells)
