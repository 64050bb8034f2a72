"""Per-step telemetry: where each training step's time went, as Prometheus metrics and JSON lines.

Every step is split into three timed stages (four on a GPU) plus the whole:

* **loader wait**: host time blocked inside ``next(iterator)``. On a GPU the previous step may
  still be running meanwhile (below), so a wait shorter than that step costs the GPU nothing;
  DALI's output is already on the device when ``next`` returns.
* **augment**: Kornia augmentation on the device.
* **compute**: forward + backward + optimizer step (scaler and scheduler included).
* **launch** (GPU only): host time queueing the step's augment and compute. Python launching
  kernels one by one can take as long as the device runs them; when a step's wait plus launch
  exceed its device time, the host sets the pace, and a faster loader alone cannot close the gap.
* **step**: host time from the end of the previous step's record to the end of this one's (the
  first step of an epoch from the start of its wait): the steps of an epoch add up to its wall
  time (see :mod:`gpufeed.train._timeline`). On the CPU a step's period holds its own wait,
  augment and compute; on a GPU it holds the host's wait for the next batch, which overlaps the
  step's device work, and ends when that work is done.

On a GPU, augment and compute are measured with **CUDA events** recorded on the current stream
around each stage (created once and reused), and the loss is copied to pinned memory without
waiting. Nothing in a step waits for the GPU: the loop reads a step's events and loss after it has
queued the next step, so the wait is for work already done while the GPU runs the next one, and
each step's record is written one step late. On the CPU, where work is synchronous, stages are
timed with ``time.perf_counter``.

Prometheus metrics (all labelled ``rank``, served on ``telemetry.metrics_host:metrics_port``)::

    gpufeed_train_loader_wait_seconds, gpufeed_train_augment_seconds,
    gpufeed_train_compute_seconds, gpufeed_train_step_seconds          histograms
    gpufeed_train_samples_total, gpufeed_train_steps_total,
    gpufeed_train_skipped_samples_total                                  counters
    gpufeed_train_epoch, gpufeed_train_loss                              gauges

The JSON lines (one object per step, see :data:`STEP_FIELDS`) go to ``RUN_DIR/steps.jsonl`` for
rank 0 and ``RUN_DIR/steps-rank<r>.jsonl`` for the other ranks.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufeed.core import TRAIN_SECONDS_BUCKETS, write_atomic
from gpufeed.train._errors import TrainError

__all__ = [
    "STEP_FIELDS",
    "StageClock",
    "StageMarks",
    "StepLog",
    "StepRecord",
    "TrainMetrics",
    "cut_logs_of_missing_ranks",
    "step_log_path",
]

log = logging.getLogger("gpufeed")


@dataclass
class StepRecord:
    """One training step, as written to the step log.

    Attributes:
        step: Optimizer steps completed after this one (1 for the first step of a run).
        epoch: Epoch this step belongs to (0-based).
        batch: Batch index within the epoch (0-based).
        rank: The process's rank.
        time_unix: Wall-clock time at the end of the step's record (where its period ends).
        loader_wait_s, augment_s, compute_s, step_s: The stage timings and the step's period (see the module docs).
        samples: Rows in the batch (padding rows included: they are computed on).
        loss: Training loss of the step.
        lr: Learning rate used by the step.
        launch_s: Host time spent queueing the step's augment and compute on a GPU (``None`` on the
            CPU, where launching runs them). Wait plus launch above the device's step time means the
            host, not the device, sets the pace.
        sample_ids: The batch's sample ids, only with ``telemetry.record_sample_ids``.
        padding_rows: Positions in ``sample_ids`` of padding rows (``last_batch: pad``: repeats
            that even out the ranks' steps, not counted as reads), only with
            ``telemetry.record_sample_ids`` and when the batch has any.
    """

    step: int
    epoch: int
    batch: int
    rank: int
    time_unix: float
    loader_wait_s: float
    augment_s: float
    compute_s: float
    step_s: float
    samples: int
    loss: float
    lr: float
    launch_s: float | None = field(default=None)
    sample_ids: list[int] | None = field(default=None)
    padding_rows: list[int] | None = field(default=None)

    def to_json(self) -> str:
        data = asdict(self)
        for optional in ("launch_s", "sample_ids", "padding_rows"):
            if data[optional] is None:
                del data[optional]
        return json.dumps(data, separators=(",", ":"))


STEP_FIELDS = tuple(StepRecord.__dataclass_fields__)


class StageMarks:
    """One step's three marks (start, after augment, after compute), its loss and target fault, read when done.

    Returned by :meth:`StageClock.start`; :meth:`read` gives ``(augment_s, compute_s, loss,
    fault)`` and hands the marks' CUDA events back to the clock for a later step.
    """

    __slots__ = ("_clock", "_fault", "_loss", "_marks")

    def __init__(self, clock: StageClock, marks: list) -> None:
        self._clock, self._marks, self._loss, self._fault = clock, marks, None, None

    def mark(self, index: int) -> None:
        """Record mark ``index`` (1: after augment, 2: after compute) on the current stream."""
        self._clock.record(self._marks[index])

    def keep_loss(self, loss, fault=None) -> None:
        """Keep the step's loss (and its task's target fault, a device scalar) without waiting for them.

        On a GPU both go to pinned memory in one asynchronous copy.
        """
        if self._clock.on_gpu:
            stored = self._marks[4]
            if fault is None:
                stored[0].copy_(loss.detach().float(), non_blocking=True)
                stored[1].fill_(-1.0)  # pinned host memory: written here, no device access
            else:
                import torch

                stored.copy_(torch.stack([loss.detach().float(), fault.float()]), non_blocking=True)
            self._clock.record(self._marks[3])  # the copy is done when this event is
        else:
            self._loss, self._fault = loss, fault

    def read(self) -> tuple[float, float, float, int]:
        """(augment_s, compute_s, loss, fault); on a GPU waits for this step's own end only (not the queued ones).

        ``fault`` is -1 unless the task found targets it cannot train on.
        """
        start, after_augment, after_compute, copied, stored = self._marks
        if not self._clock.on_gpu:  # perf_counter readings
            assert self._loss is not None, "keep_loss() comes before read()"
            fault = -1 if self._fault is None else int(self._fault)
            return after_augment - start, after_compute - after_augment, float(self._loss.detach()), fault
        copied.synchronize()  # an event wait: the work queued after this step keeps the GPU busy
        timings = start.elapsed_time(after_augment) / 1e3, after_augment.elapsed_time(after_compute) / 1e3
        loss, fault = stored.tolist()  # pinned host memory, already written: no device access
        self._clock.give_back(self._marks)
        return (*timings, loss, int(fault))


class StageClock:
    """Times augment and compute per step: CUDA events on a GPU, ``perf_counter`` on the CPU.

    Usage per step: ``marks = clock.start()``, ``marks.mark(1)`` after augmentation,
    ``marks.mark(2)`` after the optimizer step, ``marks.keep_loss(loss)``; ``marks.read()`` later.
    Nothing here waits for the GPU until ``read``, which the training loop calls for the previous
    step after queueing the next one, so the GPU always has a step queued. Events are created once
    and reused (a step's four, and its pinned loss, go back to the pool when it is read).
    """

    def __init__(self, on_gpu: bool) -> None:
        self.on_gpu = on_gpu
        self._pool: list[list] = []
        self.events_created = 0

    def record(self, mark) -> None:
        if self.on_gpu:
            mark.record()

    def _take(self) -> list:
        import torch

        if not self._pool:
            # The last is the one read() waits on: blocking, so the training thread sleeps there. A
            # default event's wait spins (CUDA's automatic scheduling with fewer contexts than cores),
            # a core taken from the loader's decoding threads for most of every GPU-bound step.
            events = [*(torch.cuda.Event(enable_timing=True) for _ in range(3)), torch.cuda.Event(blocking=True)]
            # The step's loss and its target fault, copied together.
            self._pool.append([*events, torch.empty(2, dtype=torch.float32, pin_memory=True)])
            self.events_created += 4
        return self._pool.pop()

    def give_back(self, marks: list) -> None:
        self._pool.append(marks)

    def start(self) -> StageMarks:
        if self.on_gpu:
            marks = self._take()
            marks[0].record()
            return StageMarks(self, marks)
        return _CpuMarks(self)


class _CpuMarks(StageMarks):
    """The CPU's marks: ``perf_counter`` readings (work there is synchronous)."""

    def __init__(self, clock: StageClock) -> None:
        super().__init__(clock, [time.perf_counter(), 0.0, 0.0, 0.0, None])

    def mark(self, index: int) -> None:
        self._marks[index] = time.perf_counter()


class TrainMetrics:
    """The training metrics of one rank, in their own registry (several trainers can coexist)."""

    def __init__(self, rank: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        label = {"rank": str(rank)}

        def hist(name: str, doc: str):
            return Histogram(name, doc, ["rank"], registry=self.registry, buckets=TRAIN_SECONDS_BUCKETS).labels(**label)

        def counter(name: str, doc: str):
            return Counter(name, doc, ["rank"], registry=self.registry).labels(**label)

        def gauge(name: str, doc: str):
            return Gauge(name, doc, ["rank"], registry=self.registry).labels(**label)

        self.loader_wait = hist("gpufeed_train_loader_wait_seconds", "Time blocked waiting for the next batch.")
        self.augment = hist("gpufeed_train_augment_seconds", "Kornia augmentation on the device.")
        self.compute = hist("gpufeed_train_compute_seconds", "Forward + backward + optimizer step.")
        self.step = hist("gpufeed_train_step_seconds", "The step's period (an epoch's steps add up to its time).")
        self.samples = counter("gpufeed_train_samples_total", "Samples trained on (padding rows included).")
        self.steps = counter("gpufeed_train_steps_total", "Optimizer steps taken.")
        self.skipped = counter("gpufeed_train_skipped_samples_total", "Samples left out because they cannot be used.")
        self.epoch = gauge("gpufeed_train_epoch", "Epoch in progress (0-based).")
        self.loss = gauge("gpufeed_train_loss", "Training loss of the latest step.")

    def observe(self, record: StepRecord) -> None:
        self.loader_wait.observe(record.loader_wait_s)
        self.augment.observe(record.augment_s)
        self.compute.observe(record.compute_s)
        self.step.observe(record.step_s)
        self.samples.inc(record.samples)
        self.steps.inc()
        self.epoch.set(record.epoch)
        self.loss.set(record.loss)


def step_log_path(run_dir: Path, rank: int) -> Path:
    """Rank 0 logs to ``steps.jsonl``, rank r > 0 to ``steps-rank<r>.jsonl``."""
    return Path(run_dir) / ("steps.jsonl" if rank == 0 else f"steps-rank{rank}.jsonl")


def cut_logs_of_missing_ranks(run_dir: Path, world_size: int, step: int) -> list[Path]:
    """Cut the step logs of ranks ``>= world_size`` back to ``step`` (a resume on fewer ranks).

    Those ranks are not there to cut their own logs, and the steps they logged after the
    checkpoint are run again by the remaining ranks. Returns the logs cut.
    """
    cut = []
    for path in sorted(Path(run_dir).glob("steps-rank*.jsonl")):
        suffix = path.stem.removeprefix("steps-rank")
        if suffix.isdigit() and int(suffix) >= world_size:
            StepLog.truncate_after(path, step)
            cut.append(path)
    return cut


class StepLog:
    """Appends JSON lines (step records, evaluations) to a log, flushed at every line.

    On resume the log is first cut back to the resumed step, so steps that ran after the last
    checkpoint of a killed run are not counted twice.
    """

    def __init__(self, path: Path, resume_step: int | None = None) -> None:
        self.path = Path(path)
        if resume_step is not None and self.path.exists():
            self.truncate_after(self.path, resume_step)
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    @staticmethod
    def truncate_after(path: Path, step: int) -> None:
        kept = []
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue  # a line cut short by a kill: drop it
        write_atomic(path, "".join(line + "\n" for line in kept))

    def write(self, record: StepRecord | dict) -> None:
        """Append one record (a :class:`StepRecord` or a JSON-able dict with a ``step`` key)."""
        line = record.to_json() if isinstance(record, StepRecord) else json.dumps(record, separators=(",", ":"))
        self._fh.write(line + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_step_logs(run_dir: Path) -> dict[int, list[dict]]:
    """Every rank's step records from a run folder: ``{rank: [record, ...]}`` in step order.

    Raises:
        FileNotFoundError: The folder has no step log.
        TrainError: A log is not UTF-8, a line is not a step record (file and line named), or the
            logs hold no record (a run stopped before its first step).
    """
    run_dir = Path(run_dir)
    files = sorted(run_dir.glob("steps*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no step log in {run_dir}: expected {run_dir / 'steps.jsonl'} (written by training)")
    out: dict[int, list[dict]] = {}
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise TrainError(
                f"{path}: not a step log: byte {err.object[err.start]:#04x} at offset {err.start} is not UTF-8"
            ) from None
        lines = text.rstrip().splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                for key in ("step_s", "loader_wait_s"):  # what the report divides: 1e999 reads as inf
                    if not math.isfinite(record[key]):
                        raise ValueError(f"{key} is {record[key]}")
                out.setdefault(int(record["rank"]), []).append(record)
            except (ValueError, KeyError, TypeError) as err:
                if number == len(lines) and not text.endswith("\n"):  # a killed run's last write, cut short
                    log.warning("%s:%d: a step record cut short (the run was killed?): left out", path, number)
                    continue
                raise TrainError(f"{path}:{number}: not a step record ({err})") from None
    if not out:
        raise TrainError(f"{run_dir}: its step logs hold no step record (the run stopped before its first step)")
    for records in out.values():
        records.sort(key=lambda r: r["step"])
    return out
