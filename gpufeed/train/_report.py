"""``gpufeed report RUN_DIR``: a PNG of loader wait against compute over a run.

Top panel: each step's time split into loader wait, augmentation, compute and the rest of its
period (on a GPU, where a step's device work overlaps the host's wait, the parts can add up to
more than the period), as stacked bars, so stalls show up where they happen (epoch starts,
evaluations, slow files). It shows one rank, named in its title: under DDP the rank that waited
most for data (on the others that wait is booked as compute: they wait for its gradients), with
the job's loader-wait share (:func:`~gpufeed.train._summary.job_loader_wait`).
Bottom panel: the share of step time spent waiting for data, per rank and, under DDP, for the
job (each step's longest wait over its longest period), as a rolling mean; the dashed line is the
5% a well-fed GPU stays under.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpufeed.train._errors import TrainError
from gpufeed.train._summary import JobSteps, format_job, format_summary, summarize
from gpufeed.train._telemetry import read_step_logs

__all__ = ["draw_report"]

_COLOURS = {"loader_wait_s": "#d62728", "augment_s": "#ff7f0e", "compute_s": "#1f77b4", "rest": "#bbbbbb"}
_LABELS = {"loader_wait_s": "loader wait", "augment_s": "augment", "compute_s": "compute", "rest": "rest of the step"}


def _rolling(values: np.ndarray, window: int) -> np.ndarray:
    if len(values) < window or window <= 1:
        return values
    kernel = np.ones(window) / window
    head = np.cumsum(values[: window - 1]) / np.arange(1, window)
    return np.concatenate([head, np.convolve(values, kernel, mode="valid")])


def draw_report(run_dir: str | Path, out: str | Path | None = None, window: int = 10) -> tuple[Path, str]:
    """Draw the report of ``run_dir`` into ``out`` (default ``RUN_DIR/report.png``).

    Returns:
        ``(png_path, text)``: where the PNG went, and the loader-vs-compute table of each rank
        (under DDP followed by the job's line, :func:`~gpufeed.train._summary.format_job`).

    Raises:
        FileNotFoundError: ``run_dir`` has no step log.
        TrainError: A step log is damaged or empty (file and line named), or ``out`` is not a
            ``.png``, ``.pdf`` or ``.svg`` file (an existing folder gets ``report.png`` inside).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    logs = read_step_logs(run_dir)
    out = _report_path(run_dir, out)
    job_steps = JobSteps(r for records in logs.values() for r in records)
    job = job_steps.summary()
    # Under DDP the slow rank's wait is the others' compute (the gradient all-reduce waits for it):
    # the rank that waited most is the one whose bars show where the job's time went.
    shown = job["worst_rank"] if len(logs) > 1 else min(logs)
    title = f"{run_dir.name}: loader wait vs compute (rank {shown}, {len(logs[shown])} steps)"
    if len(logs) > 1:
        title = (
            f"{run_dir.name}: loader wait vs compute, rank {shown} (waited most of {len(logs)} ranks, "
            f"{len(logs[shown])} steps)\njob loader wait {job['loader_wait_share'] * 100:.1f}% "
            "(each step's longest wait over its longest period)"
        )

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    _draw_stages(top, logs[shown])
    top.set_title(title)
    for rank, rank_records in sorted(logs.items()):
        wait = np.array([r["loader_wait_s"] for r in rank_records])
        share = _rolling_share(wait, np.array([r["step_s"] for r in rank_records]), window)
        bottom.plot([r["step"] for r in rank_records], share, label=f"rank {rank}", linewidth=1.2)
    if len(logs) > 1:
        share = _rolling_share(job_steps.wait, job_steps.period, window)
        # Wide and pale, under the ranks' lines: it lies on the waiting rank's line where one rank waits.
        bottom.plot(job_steps.steps, share, label="job (longest wait)", color="black", alpha=0.3, linewidth=4, zorder=1)
    bottom.axhline(5.0, color="black", linestyle="--", linewidth=0.8, label="5% target")
    bottom.set_ylabel(f"loader wait share (%)\nrolling mean of {window} steps")
    bottom.set_xlabel("step")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="upper right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)

    text = "\n\n".join(format_summary(summarize(r), f"rank {rank}") for rank, r in sorted(logs.items()))
    if len(logs) > 1:
        text += "\n\n" + format_job(job)
    return out, text


def _rolling_share(wait: np.ndarray, period: np.ndarray, window: int) -> np.ndarray:
    """The loader-wait share of step time in percent, each a rolling mean over ``window`` steps."""
    return _rolling(wait, window) / np.maximum(_rolling(period, window), 1e-12) * 100


def _draw_stages(top, records: list[dict]) -> None:
    """One rank's steps as stacked bars of wait, augment, compute and the rest of the period."""
    steps = np.array([r["step"] for r in records])
    base = np.zeros(len(records))
    for key in ("loader_wait_s", "augment_s", "compute_s", "rest"):
        if key == "rest":  # the step's period beyond its parts (logging, the host's own work)
            values = np.maximum(np.array([r["step_s"] for r in records]) * 1e3 - base, 0.0)
        else:
            values = np.array([r[key] for r in records]) * 1e3
        top.bar(steps, values, bottom=base, width=1.0, color=_COLOURS[key], label=_LABELS[key], linewidth=0)
        base += values
    # A pipeline start-up can take 100x a normal step; clip it so the normal steps stay readable.
    ceiling = np.percentile(base, 95) * 3 if len(base) >= 10 else base.max()
    if base.max() > ceiling > 0:
        top.set_ylim(0, ceiling)
        for step, height in zip(steps, base, strict=True):
            if height > ceiling:
                top.annotate(f"{height:,.0f} ms", (step, ceiling), ha="center", va="top", fontsize=8, rotation=90)
    top.set_ylabel("time per step (ms)")
    top.legend(loc="upper right")
    epoch_starts = [r["step"] for r in records if r.get("batch") == 0]
    for step in epoch_starts:
        top.axvline(step - 0.5, color="grey", linewidth=0.6, linestyle=":")


def _report_path(run_dir: Path, out: str | Path | None) -> Path:
    """Where the figure goes, checked before the logs are drawn: matplotlib picks the format by suffix."""
    if out is None:
        return run_dir / "report.png"
    out = Path(out)
    if out.is_dir():
        return out / "report.png"
    if out.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise TrainError(f"report --out {out}: expected a .png, .pdf or .svg file, or a folder")
    return out
