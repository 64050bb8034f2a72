"""The loader-vs-compute table printed at the end of training (and by ``gpufeed report``).

One table per rank (:func:`summarize`), and under DDP the job's figure (:func:`job_loader_wait`):
a rank's own table books the time it spends waiting for a slower rank's gradients as compute.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.core import format_table

__all__ = [
    "HOST_LAUNCH",
    "STAGES",
    "JobSteps",
    "StepStats",
    "format_job",
    "format_summary",
    "job_loader_wait",
    "job_loader_wait_of_run",
    "summarize",
]

# (record field, table name) in the order they happen within a step.
STAGES = (
    ("loader_wait_s", "loader wait"),
    ("augment_s", "augment"),
    ("compute_s", "compute"),
    ("step_s", "step"),
)
# Recorded on a GPU only (``StepRecord.launch_s``): summarised, and shown, where a run has it.
HOST_LAUNCH = ("launch_s", "host launch")
_WITH_LAUNCH = (*STAGES[:3], HOST_LAUNCH, STAGES[3])  # the host queues the step after its wait
# What the job's figure needs of each step record (besides its rank).
_JOB_FIELDS = ("step", "batch", "loader_wait_s", "step_s")


class StepStats:
    """The per-step numbers a summary needs, kept compactly (8 bytes a number, not a dict a step).

    A long run keeps millions of steps; the full records are in the step log, not in memory.
    """

    _FIELDS = ("loader_wait_s", "augment_s", "compute_s", "launch_s", "step_s", "samples", "batch")

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
            value = get(name, 1) if name == "batch" else get(name)
            column.append(float("nan") if value is None else float(value))  # launch_s: None on the CPU

    def summary(self) -> dict:
        return _summarize({name: np.frombuffer(column, dtype=np.float64) for name, column in self._columns.items()})


def summarize(records: list[dict]) -> dict:
    """Figures over a rank's step records (dicts with the :class:`StepRecord` fields).

    Returns:
        ``{"steps", "samples", "samples_per_s", "stages": {field: {p50_s, p95_s, mean_s,
        total_s, share}}, "loader_wait_share", "steady_loader_wait_share"}``. ``share`` is the
        stage's total over the total step time. ``stages`` holds ``launch_s`` only where every
        step has one (a GPU run). ``steady_loader_wait_share`` leaves out the first
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
    launched = "launch_s" in columns and not np.isnan(columns["launch_s"]).any()
    for key, _name in _WITH_LAUNCH if launched else STAGES:
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
    for key, name in _WITH_LAUNCH:
        if key not in summary["stages"]:
            continue
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


class JobSteps:
    """Every rank's step records joined by step: the job's loader wait as the slowest rank sees it.

    Under DDP each step's gradient all-reduce waits for the last rank, so a rank whose loader is
    slow holds every rank up, and on the others that time shows as compute. Per step the job
    waited as long as its longest-waiting rank, over the step's longest period.

    Attributes:
        steps: The step numbers, ascending (a step any rank logged).
        wait: Per step, the longest loader wait of any rank (s).
        period: Per step, the longest period of any rank (s).
        batch: Per step, its batch index within its epoch (0: the epoch's first).
        rank_wait, rank_period: Each rank's total loader wait and total period (s).
    """

    def __init__(self, records: Iterable[Mapping]) -> None:
        columns: dict[int, dict[str, array]] = {}
        for record in records:
            own = columns.setdefault(int(record["rank"]), {name: array("d") for name in _JOB_FIELDS})
            for name, column in own.items():
                column.append(float(record.get(name, 1) if name == "batch" else record[name]))
        every = [np.frombuffer(c["step"], dtype=np.float64) for c in columns.values()]
        self.steps = np.unique(np.concatenate(every)) if every else np.zeros(0)
        # -inf, not 0: a step a rank did not log (its log cut at a resume on fewer ranks) takes no part.
        self.wait = np.full(len(self.steps), -np.inf)
        self.period = np.full(len(self.steps), -np.inf)
        self.batch = np.ones(len(self.steps))
        self.rank_wait: dict[int, float] = {}
        self.rank_period: dict[int, float] = {}
        for rank, fields in sorted(columns.items()):
            at = np.searchsorted(self.steps, np.frombuffer(fields["step"], dtype=np.float64))
            wait = np.frombuffer(fields["loader_wait_s"], dtype=np.float64)
            period = np.frombuffer(fields["step_s"], dtype=np.float64)
            np.maximum.at(self.wait, at, wait)
            np.maximum.at(self.period, at, period)
            self.batch[at] = np.frombuffer(fields["batch"], dtype=np.float64)
            self.rank_wait[rank] = float(wait.sum())
            self.rank_period[rank] = float(period.sum())

    def rank_shares(self) -> dict[int, float]:
        """Each rank's loader wait over its own step time (its summary's ``loader_wait_share``)."""
        return {rank: _share(self.rank_wait[rank], self.rank_period[rank]) for rank in self.rank_wait}

    def summary(self) -> dict:
        """The job's figures; see :func:`job_loader_wait`."""
        steady = self.batch > 0
        shares = self.rank_shares()
        worst = max(self.rank_wait, key=lambda rank: (self.rank_wait[rank], -rank)) if self.rank_wait else None
        return {
            "steps": len(self.steps),
            "loader_wait_share": _share(self.wait.sum(), self.period.sum()),
            "steady_loader_wait_share": _share(self.wait[steady].sum(), self.period[steady].sum()),
            "worst_rank": worst,
            "worst_rank_loader_wait_share": shares[worst] if worst is not None else float("nan"),
            "rank_loader_wait_share": {str(rank): share for rank, share in shares.items()},
        }


def _share(part: float, whole: float) -> float:
    return float(part / whole) if whole > 0 else float("nan")


def job_loader_wait(records: Iterable[Mapping]) -> dict:
    """The job's loader-wait share from every rank's step records (dicts with the :class:`StepRecord` fields).

    Per step ``k`` the job waited ``max_r loader_wait_s`` of a step that lasted ``max_r step_s``:
    a rank that waits holds the others in DDP's gradient all-reduce, where their timings count it
    as compute. A rank's own figures therefore show its own wait only; these show the job's.

    Returns:
        ``{"steps", "loader_wait_share", "steady_loader_wait_share", "worst_rank",
        "worst_rank_loader_wait_share", "rank_loader_wait_share": {rank: share}}``:
        ``loader_wait_share`` is ``sum_k max_r wait / sum_k max_r step_s``; the steady share leaves
        out each epoch's first batch; ``worst_rank`` is the rank with the most loader wait in
        total, and each rank's share is its wait over its own step time.
    """
    return JobSteps(records).summary()


def job_loader_wait_of_run(run_dir: str | Path) -> dict:
    """:func:`job_loader_wait` over the step logs of ``run_dir`` (every rank's, every run of a resumed one).

    Reads the logs a line at a time and keeps four numbers a step, not the records (a long run
    logs millions of steps, with sample ids). A line that does not parse (one a kill cut short)
    is left out: the figure must not stop a run that has finished training.
    """

    wanted = ("rank", "step", "loader_wait_s", "step_s")

    def records() -> Iterator[dict]:
        for path in sorted(Path(run_dir).glob("steps*.jsonl")):
            with open(path, encoding="utf-8") as lines:
                for line in lines:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(record, dict) and all(isinstance(record.get(k), (int, float)) for k in wanted):
                        yield {name: record[name] for name in (*wanted, "batch") if name in record}

    return job_loader_wait(records())


def format_job(job: dict) -> str:
    """The job's loader wait in one line (for runs on several ranks)."""
    if not job.get("steps"):
        return "job: no steps recorded"
    return (
        f"job ({len(job['rank_loader_wait_share'])} ranks, {job['steps']} steps): loader wait "
        f"{job['loader_wait_share'] * 100:.1f}% of step time, the longest-waiting rank at each step "
        f"({job['steady_loader_wait_share'] * 100:.1f}% without each epoch's first batch); rank "
        f"{job['worst_rank']} waited most ({job['worst_rank_loader_wait_share'] * 100:.1f}% of its step time). "
        "A rank that waits holds the others in the gradient all-reduce, where their tables count it as compute."
    )
