"""Label values and histogram buckets of gpufeed's Prometheus metrics, defined once.

The trainer (``gpufeed.train._telemetry``), the server (``gpufeed.server._metrics``) and the
metrics contract the dashboards are checked against (``gpufeed.obs._contract``) all read these,
so a bucket or label value cannot differ between what is exported and what is contracted. They
sit in the core because it is the one layer all three may import.
"""

from __future__ import annotations

__all__ = ["PROTOCOLS", "SERVER_SECONDS_BUCKETS", "STAGES", "TRAIN_SECONDS_BUCKETS"]

# Server stages, in the order a request passes through them.
STAGES = ("preprocess", "queue_wait", "decode", "inference", "postprocess")
"""The per-stage latency labels (``stage`` of ``gpufeed_server_stage_seconds``), in request order."""
# ``kserve``: KServe v2 over HTTP; ``rest``: the simple REST endpoint; ``grpc``: KServe v2 over gRPC.
PROTOCOLS = ("kserve", "rest", "grpc")
"""The ``protocol`` label values of the server's request metrics (HTTP and gRPC)."""

# Training step stages: from 0.5 ms (a prefetched batch) to a minute (a pipeline start-up on a
# cold disk).
# fmt: off
TRAIN_SECONDS_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
# fmt: on

# Server latencies: from 100 µs (a batch of a tiny model on a GPU) to 30 s (a slow request on a
# busy CPU).
# fmt: off
SERVER_SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
# fmt: on
