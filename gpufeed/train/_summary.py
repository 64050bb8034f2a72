"""The loader-vs-compute table printed at the end of training (and by ``gpufeed report``)."""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from gpufeed.core import format_table

__all__ = ["STAGES", "StepStats", "format_summary", "summarize"]

# (record field, table name) in the order they happen within a step.
STAGES = (
    ("loader_wait_s", "loader wait"),
    ("augment_s", "augment"),
    ("compute_s", "compute"),
    ("step_s", "step"),
)


class StepStats:
    """The per-step numbers a summary needs, kept compactly (8 bytes a number, not a dict a step).

    A long run keeps millions of steps; the full records are in the step log, not in memory.
    """

    _FIELDS = ("loader_wait_s", "augment_s", "compute_s", "step_s", "samples", "batch")

    def __init__(self) -> None:
        self._columns = {name: array("d") for name in self._FIELDS}

    def __len__(self) -> int:
        return len(self._columns["step_s"])

    def add(self, record) -> None:
        """Add a :class:`StepRecord` or a dict with its fields."""
        get: Callable[..., Any] = (
            record.get if isinstance(record, dict) else lambda name, default=None: getattr(record, name, default)
        )
        for name, column in self._columns.items():
            column.append(float(get(name, 1) if name == "batch" else get(name)))

    def summary(self) -> dict:
        return _summarize({name: np.frombuffer(column, dtype=np.float64) for name, column in self._columns.items()})


def summarize(records: list[dict]) -> dict:
    """Figures over a rank's step records (dicts with the :class:`StepRecord` fields).

    Returns:
        ``{"steps", "samples", "samples_per_s", "stages": {field: {p50_s, p95_s, mean_s,
        total_s, share}}, "loader_wait_share", "steady_loader_wait_share"}``. ``share`` is the
        stage's total over the total step time. ``steady_loader_wait_share`` leaves out the first
        batch of each epoch, whose wait includes starting the epoch's pipeline.
    """
    stats = StepStats()
    for record in records:
        stats.add(record)
    return stats.summary()


def _summarize(columns: dict[str, np.ndarray]) -> dict:
    nan = float("nan")
    steps = len(columns["step_s"])
    if steps == 0:
        return {"steps": 0, "samples": 0, "samples_per_s": nan, "stages": {}, "loader_wait_share": nan}
    step_total = float(columns["step_s"].sum())
    stages = {}
    for key, _name in STAGES:
        values = columns[key]
        stages[key] = {
            "p50_s": float(np.percentile(values, 50)),
            "p95_s": float(np.percentile(values, 95)),
            "mean_s": float(values.mean()),
            "total_s": float(values.sum()),
            "share": float(values.sum() / step_total) if step_total > 0 else nan,
        }
    steady = columns["batch"] > 0
    steady_total = float(columns["step_s"][steady].sum())
    samples = int(columns["samples"].sum())
    return {
        "steps": steps,
        "samples": samples,
        "samples_per_s": samples / step_total if step_total > 0 else nan,
        "stages": stages,
        "loader_wait_share": stages["loader_wait_s"]["share"],
        "steady_loader_wait_share": (
            float(columns["loader_wait_s"][steady].sum()) / steady_total if steady_total > 0 else nan
        ),
    }


def format_summary(summary: dict, title: str = "") -> str:
    """The summary as a text table: p50/p95/mean in milliseconds and each stage's share of step time."""
    if not summary.get("steps"):
        return f"{title}: no steps recorded" if title else "no steps recorded"
    rows = []
    for key, name in STAGES:
        s = summary["stages"][key]
        rows.append([name, s["p50_s"] * 1e3, s["p95_s"] * 1e3, s["mean_s"] * 1e3, f"{s['share'] * 100:.1f}%"])
    table = format_table(["stage", "p50 ms", "p95 ms", "mean ms", "share of step time"], rows)
    lines = [title] if title else []
    lines.append(table)
    lines.append(
        f"{summary['steps']} steps, {summary['samples']} samples, {summary['samples_per_s']:,.1f} samples/s; "
        f"loader wait {summary['loader_wait_share'] * 100:.1f}% of step time "
        f"({summary['steady_loader_wait_share'] * 100:.1f}% without each epoch's first batch)"
    )
    return "\n".join(lines)
