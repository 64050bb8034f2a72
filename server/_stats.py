"""Triton's statistics extension (``GET /v2/models[/NAME]/stats``), fed by the Prometheus observation points.

:class:`InferenceStats` keeps, per model, the cumulative counts and durations Triton reports. It
is not a second timing system: :class:`gpufeed.server._metrics.ServerMetrics` passes it every observation
it records (request, stage, batch), so the statistics and the Prometheus series always agree:

=====================  ================================================================================
Triton field           gpufeed observation
=====================  ================================================================================
success / fail         ``gpufeed_server_request_seconds`` of inference requests answered 200 / anything else
                       (every refusal and error of a request naming this model)
queue                  ``gpufeed_server_stage_seconds{stage="queue_wait"}``: one per image or tensor row
compute_input          one per row of an answered request, with its batch's input time (DALI decode of
                       the encoded rows plus the copy of pixel rows into the input buffer)
compute_infer          one per row of an answered request, with its batch's ``stage="inference"`` time
compute_output         one per row of an answered request, with the request's ``stage="postprocess"`` time
inference_count        real rows executed (``gpufeed_server_batch_size`` sum)
execution_count        batches executed (``gpufeed_server_batch_size`` count)
batch_stats            per real-rows count: compute_input and compute_infer of the batches of that size
                       (the decode and inference times ``observe_batch`` reports with each batch)
last_inference         wall clock (ms since the epoch) of the last answered inference request
=====================  ================================================================================

Durations are integer nanoseconds. The three ``compute_*`` fields count one unit, the inference
(row), and are recorded together when a request is answered, as Triton records a request's
statistics when it releases it: a reader never sees one counted ahead of the others. perf_analyzer
refuses statistics whose three compute counts differ ("Server side statistics compute counts must
be the same") and divides each duration by its count for the per-inference figures it prints.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

__all__ = ["InferenceStats"]

_INFER_FIELDS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
_BATCH_FIELDS = ("compute_input", "compute_infer", "compute_output")


class _Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count, self.ns = 0, 0

    def add(self, seconds: float, times: int = 1) -> None:
        self.count += times
        self.ns += times * max(0, round(seconds * 1e9))

    def to_json(self) -> dict:
        return {"count": self.count, "ns": self.ns}


class _ModelStats:
    def __init__(self) -> None:
        self.infer = {name: _Duration() for name in _INFER_FIELDS}
        self.batches: dict[int, dict[str, _Duration]] = defaultdict(lambda: {f: _Duration() for f in _BATCH_FIELDS})
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0


class InferenceStats:
    """Per-model cumulative statistics in the shape of Triton's statistics extension.

    Args:
        models: The served model names (others are never recorded: requests cannot add entries).
    """

    def __init__(self, models) -> None:
        self._models = {name: _ModelStats() for name in models}
        self._lock = threading.Lock()

    def request(self, model: str, code: int, seconds: float) -> None:
        """An inference request was answered with ``code`` after ``seconds``."""
        stats = self._models.get(model)
        if stats is None:
            return
        with self._lock:
            stats.infer["success" if code == 200 else "fail"].add(seconds)
            if code == 200:
                stats.last_inference_ms = int(time.time() * 1000)

    def stage(self, model: str, stage: str, seconds: float) -> None:
        """One observation of a serving stage (the same call that feeds ``gpufeed_server_stage_seconds``).

        Only ``queue_wait`` (one per row) is kept here; the compute stages arrive per answered
        request, in :meth:`answered`.
        """
        stats = self._models.get(model)
        if stats is None or stage != "queue_wait":
            return
        with self._lock:
            stats.infer["queue"].add(seconds)

    def answered(self, model: str, rows: list[tuple[float, float]], output_s: float) -> None:
        """A request was answered: each row's ``(input_s, inference_s)`` (its batch's) and the request's output time."""
        stats = self._models.get(model)
        if stats is None:
            return
        with self._lock:
            for input_s, inference_s in rows:
                stats.infer["compute_input"].add(input_s)
                stats.infer["compute_infer"].add(inference_s)
            stats.infer["compute_output"].add(output_s, len(rows))

    def batch(self, model: str, rows: int, decode_s: float | None, inference_s: float | None) -> None:
        """A batch of ``rows`` real rows ran: its decode (``None``: nothing to decode) and inference times."""
        stats = self._models.get(model)
        if stats is None:
            return
        with self._lock:
            stats.inference_count += rows
            stats.execution_count += 1
            fields = stats.batches[rows]
            if decode_s is not None:
                fields["compute_input"].add(decode_s)
            if inference_s is not None:
                fields["compute_infer"].add(inference_s)

    def model_stats(self, model: str) -> dict:
        """One ``$model_stat`` object of Triton's statistics response."""
        stats = self._models[model]
        with self._lock:
            return {
                "name": model,
                "version": "1",
                "last_inference": stats.last_inference_ms,
                "inference_count": stats.inference_count,
                "execution_count": stats.execution_count,
                "inference_stats": {name: d.to_json() for name, d in stats.infer.items()},
                "response_stats": {},
                "batch_stats": [
                    {"batch_size": rows, **{name: d.to_json() for name, d in fields.items()}}
                    for rows, fields in sorted(stats.batches.items())
                ],
                "memory_usage": [],
            }

    def response(self, models) -> dict:
        """Triton's ``$stats_model_response`` for ``models`` (names of served models)."""
        return {"model_stats": [self.model_stats(m) for m in models]}
