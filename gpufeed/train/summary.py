"""The loader-vs-compute table printed at the end of training (and by ``gpufeed report``)."""

from __future__ import annotations

import numpy as np

__all__ = ["STAGES", "format_summary", "summarize"]

# (record field, table name) in the order they happen within a step.
STAGES = (
    ("loader_wait_s", "loader wait"),
    ("augment_s", "augment"),
    ("compute_s", "compute"),
    ("step_s", "step"),
)


def summarize(records: list[dict]) -> dict:
    """Figures over a rank's step records (dicts with the :class:`StepRecord` fields).

    Returns:
        ``{"steps", "samples", "samples_per_s", "stages": {field: {p50_s, p95_s, mean_s,
        total_s, share}}, "loader_wait_share", "steady_loader_wait_share"}``. ``share`` is the
        stage's total over the total step time. ``steady_loader_wait_share`` leaves out the first
        batch of each epoch, whose wait includes starting the epoch's pipeline.
    """
    if not records:
        return {"steps": 0, "samples": 0, "samples_per_s": 0.0, "stages": {}, "loader_wait_share": float("nan")}
    step_total = float(sum(r["step_s"] for r in records))
    stages = {}
    for key, _name in STAGES:
        values = np.array([r[key] for r in records], dtype=np.float64)
        stages[key] = {
            "p50_s": float(np.percentile(values, 50)),
            "p95_s": float(np.percentile(values, 95)),
            "mean_s": float(values.mean()),
            "total_s": float(values.sum()),
            "share": float(values.sum() / step_total) if step_total > 0 else float("nan"),
        }
    steady = [r for r in records if r.get("batch", 1) > 0]
    steady_total = sum(r["step_s"] for r in steady)
    samples = int(sum(r["samples"] for r in records))
    return {
        "steps": len(records),
        "samples": samples,
        "samples_per_s": samples / step_total if step_total > 0 else float("nan"),
        "stages": stages,
        "loader_wait_share": stages["loader_wait_s"]["share"],
        "steady_loader_wait_share": (
            sum(r["loader_wait_s"] for r in steady) / steady_total if steady_total > 0 else float("nan")
        ),
    }


def format_summary(summary: dict, title: str = "") -> str:
    """The summary as a text table: p50/p95/mean in milliseconds and each stage's share of step time."""
    from gpufeed.bench._common import format_table

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
