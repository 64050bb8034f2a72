"""Live figures read through PromQL, exactly as the Grafana panels read them.

:func:`live_figures` reads loader wait against compute (the trainer) and per-stage latency (the
server) from a Prometheus that scrapes them with the stack's recording rules.
"""

from __future__ import annotations

import math

from gpufeed.obs._prometheus import PrometheusAPI

__all__ = ["live_figures"]


def _value(api: PrometheusAPI, expr: str) -> dict[str, float]:
    """The instant value of each series ``expr`` returns, keyed by its labels (less ``__name__``)."""
    out = {}
    for series in api.query(expr):
        labels = ",".join(f"{k}={v}" for k, v in sorted(series["metric"].items()) if k != "__name__")
        out[labels] = float(series["value"][1])
    return out


def live_figures(api: PrometheusAPI) -> list[list]:
    """Rows (figure, labels, value) of loader-vs-compute and per-stage latency, read through PromQL."""
    rows = []
    for title, expr, scale, unit in (
        ("loader-bound share", "rank:gpufeed_train_loader_bound:ratio_rate1m", 100, "%"),
        ("train p50", "rank_phase:gpufeed_train_seconds:p50_rate1m", 1000, "ms"),
        ("train p95", "rank_phase:gpufeed_train_seconds:p95_rate1m", 1000, "ms"),
        ("samples/s", "rank:gpufeed_train_samples:rate1m", 1, "/s"),
        ("server stage p50", "model_stage:gpufeed_server_stage_seconds:p50_rate1m", 1000, "ms"),
        ("server stage p99", "model_stage:gpufeed_server_stage_seconds:p99_rate1m", 1000, "ms"),
        ("requests/s", "model:gpufeed_server_requests:rate1m", 1, "/s"),
    ):
        for labels, value in sorted(_value(api, expr).items()):
            shown = f"{value * scale:,.1f} {unit}" if math.isfinite(value) else "n/a"
            rows.append([title, labels, shown])
    return rows
