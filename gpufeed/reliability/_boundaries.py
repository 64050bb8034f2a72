"""Kill -9 a training run at each kind of boundary, resume it, compare bit for bit with an uninterrupted run.

``run_boundary_kills(config, out)`` takes any training config (any loader kind: images, clips,
frame stores, DeepEthogram projects, dense pairs) and:

1. runs it once, uninterrupted, as a ``gpufeed train`` process (the reference);
2. runs it again as ``gpufeed train`` processes (``--resume`` after the first), each sent SIGKILL
   at one boundary, in run order:

   * **before the first checkpoint**: once step 1 is logged (the resume starts from scratch);
   * **mid-epoch, after a checkpoint**: once the step after the first checkpoint that is not an
     epoch's end is logged and that checkpoint's file is on disk (the resume repeats that step);
   * **right after an end-of-epoch checkpoint**: the moment the checkpoint file of an epoch's
     last step appears (the resume must start the next epoch, not the finished one again);

   after every kill it records the newest checkpoint (where ``--resume`` continues) with its
   loader position, and checks that every process the killed run had started (DALI and PyAV
   workers, multiprocessing's helpers) is gone within :data:`ORPHAN_GRACE_S`;
3. lets the last attempt finish and compares, with ``torch.equal``, its final weights and buffers,
   its optimiser state, every step's loss and every evaluation with the reference's: exact resume
   means no tolerance at all.

Both runs are separate processes started the same way, so they use the same threads; CPU kernels
are deterministic for a fixed thread count (see ``docs/training-reliability.md``).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpufeed.core import Checklist, descendants, format_table, process_alive
from gpufeed.models import list_checkpoints
from gpufeed.reliability._common import gpufeed_argv, step_records, write_train_yaml

__all__ = ["BOUNDARIES", "ORPHAN_GRACE_S", "BoundaryKill", "BoundaryReport", "run_boundary_kills"]

BOUNDARIES = ("before the first checkpoint", "mid-epoch, after a checkpoint", "right after an end-of-epoch checkpoint")
ORPHAN_GRACE_S = 5.0
_POLL_S = 0.002
_SCAN_S = 0.1


@dataclass
class BoundaryKill:
    """One SIGKILL and what it left.

    Attributes:
        boundary: Which of :data:`BOUNDARIES` it was aimed at.
        steps_done: Steps in the step log when the process died.
        resumed_from: Step of the newest checkpoint (0: none), where ``--resume`` continues.
        loader: That checkpoint's loader position, ``(epoch, batch)`` (``None`` without one).
        orphans: Processes the killed run had started that were still alive after the grace time.
        workers: How many processes the killed run had started (seen just before the kill).
    """

    boundary: str
    steps_done: int
    resumed_from: int
    loader: tuple[int, int] | None
    orphans: list[int] = field(default_factory=list)
    workers: int = 0


@dataclass
class BoundaryReport(Checklist):
    """The figures of a boundary kill run (see the module docs)."""

    name: str
    steps_per_epoch: int
    num_steps: int
    kills: list[BoundaryKill]
    completed: bool
    steps_logged: list[int]
    weights_equal: bool
    optimizer_equal: bool
    losses_equal: bool
    evaluations_equal: bool
    differing: list[str]
    seconds: float
    first_loss_difference: str = ""

    def checks(self) -> list[tuple[str, bool]]:
        """Each expectation of the module docs, and whether it held."""
        s = self.steps_per_epoch
        by_kind = {k.boundary: k for k in self.kills}
        first, mid, end = (by_kind.get(b) for b in BOUNDARIES)
        return [
            ("the killed run completed every step", self.completed),
            ("every step logged once, in order", self.steps_logged == list(range(1, self.num_steps + 1))),
            ("a kill before the first checkpoint resumed from scratch", first is not None and first.resumed_from == 0),
            (
                "a mid-epoch kill resumed from a mid-epoch checkpoint",
                mid is not None and mid.resumed_from % s != 0 and mid.steps_done > mid.resumed_from,
            ),
            (
                "an end-of-epoch checkpoint resumes at the next epoch's first batch",
                end is not None
                and end.resumed_from > 0
                and end.resumed_from % s == 0
                and end.loader == (end.resumed_from // s, 0),
            ),
            ("no process of a killed run outlived it", all(not k.orphans for k in self.kills)),
            ("final weights and buffers bit-identical to the uninterrupted run", self.weights_equal),
            ("optimizer state bit-identical", self.optimizer_equal),
            ("every step's loss identical", self.losses_equal),
            ("every evaluation written once, identical", self.evaluations_equal),
        ]

    def table(self) -> str:
        rows = [
            [
                i,
                k.boundary,
                k.steps_done,
                k.resumed_from,
                "-" if k.loader is None else f"epoch {k.loader[0]}, batch {k.loader[1]}",
                f"{k.workers} / {len(k.orphans)}",
            ]
            for i, k in enumerate(self.kills, 1)
        ]
        headers = ["kill", "aimed at", "steps done", "resumed from", "its loader position", "children / left"]
        return "\n".join(
            [
                f"kill -9 at each boundary: {self.name}, {self.num_steps} steps of {self.steps_per_epoch} per epoch",
                format_table(headers, rows),
                f"weights {'bit-identical' if self.weights_equal else 'DIFFER'}"
                + (f" ({', '.join(self.differing[:5])})" if self.differing else "")
                + f"; optimizer {'identical' if self.optimizer_equal else 'DIFFERS'}; "
                f"losses {'identical' if self.losses_equal else 'DIFFER'} over {len(self.steps_logged)} logged steps"
                + (f" ({self.first_loss_difference})" if self.first_loss_difference else "")
                + "; "
                f"evaluations {'identical' if self.evaluations_equal else 'DIFFER'}",
                f"wall time {self.seconds:.1f} s",
                self.verdict(),
            ]
        )


def _newest(run_dir: Path) -> tuple[int, tuple[int, int] | None]:
    import torch

    for path in reversed(list_checkpoints(run_dir)):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # an unloadable one is skipped by --resume too; kill-resume checks loading
            continue
        loader = state["loader"][0]
        return int(state["step"]), (int(loader["epoch"]), int(loader["batch"]))
    return 0, None


def _differences(reference: Path, resumed: Path) -> tuple[list[str], bool]:
    """Names of the state-dict entries that differ in any bit, and whether the optimiser states are equal."""
    import torch

    a = torch.load(reference, map_location="cpu", weights_only=True)
    b = torch.load(resumed, map_location="cpu", weights_only=True)
    differing = [k for k in a["model"] if k not in b["model"] or not torch.equal(a["model"][k], b["model"][k])]
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    same = sa.keys() == sb.keys() and all(
        sa[i].keys() == sb[i].keys()
        and all(torch.equal(torch.as_tensor(sa[i][n]), torch.as_tensor(sb[i][n])) for n in sa[i])
        for i in sa
    )
    return differing, same


def _evaluations(run_dir: Path) -> list[dict]:
    """The run's evaluation records without their timing (which no two runs share)."""
    path = run_dir / "eval.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


def _kill_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout_s: float) -> list[int]:
    """SIGKILL ``proc`` once ``ready()``; returns every descendant it had (raises if the moment never came)."""
    deadline = time.monotonic() + timeout_s
    children: set[int] = set()
    scanned = 0.0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the training process exited with status {proc.returncode} before its kill")
        if ready():
            proc.kill()
            proc.wait(timeout=60)
            return sorted(children)
        # Reading all of /proc takes milliseconds: often enough to see every worker, not every poll.
        if time.monotonic() - scanned > _SCAN_S:
            children.update(descendants(proc.pid))
            scanned = time.monotonic()
        time.sleep(_POLL_S)
    raise RuntimeError(f"the kill moment did not come within {timeout_s:g} s")


def _logged(run_dir: Path, since: float, step: int) -> bool:
    """Whether a process started at ``since`` has logged ``step``."""
    return any(r["step"] >= step for r in step_records(run_dir, since))


def _orphans(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + ORPHAN_GRACE_S
    while time.monotonic() < deadline:
        alive = [p for p in pids if process_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if process_alive(p)]


@dataclass
class _Job:
    """How each ``gpufeed train`` process of the experiment starts."""

    config: Path
    logs: Path
    env: dict[str, str]
    timeout_s: float

    def launch(self, run: Path, log_name: str, resume: bool) -> subprocess.Popen:
        argv = gpufeed_argv("train", "--config", str(self.config), "--out", str(run), *(["--resume"] if resume else []))
        with open(self.logs / log_name, "w", encoding="utf-8") as log_file:
            return subprocess.Popen(argv, env=self.env, stdout=log_file, stderr=subprocess.STDOUT)

    def kill_at(self, run_dir: Path, attempt: int, boundary: str, ready: Callable[[float], Callable[[], bool]]):
        """Start attempt ``attempt``, SIGKILL it when ``ready(start time)()`` says so; what the kill left."""
        since = time.time()
        proc = self.launch(run_dir, f"attempt-{attempt}.log", attempt > 1)
        try:
            children = _kill_when(proc, ready(since), self.timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        records = step_records(run_dir)
        resumed_from, loader = _newest(run_dir)
        return BoundaryKill(
            boundary=boundary,
            steps_done=records[-1]["step"] if records else 0,
            resumed_from=resumed_from,
            loader=loader,
            orphans=_orphans(children),
            workers=len(children),
        )


def run_boundary_kills(
    config: dict,
    out: str | Path,
    *,
    name: str = "",
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
) -> BoundaryReport:
    """Run the experiment of the module docs for ``config`` (a training config mapping) in ``out``.

    The config needs a checkpoint interval (``train.checkpoint_every_steps``) of at least 2 steps
    and at least two epochs, so that every boundary comes before the end.

    Args:
        config: The training config, as ``config.yaml`` would hold it.
        out: Work folder: ``train.yaml``, ``reference/``, ``killed/``, ``logs/`` (replaced).
        name: What the run is called in its table.
        timeout_s: Longest wait for one process.
        env: Extra environment variables for the training processes.
    """
    started = time.perf_counter()
    out = Path(out)
    reference_dir, run_dir, logs = out / "reference", out / "killed", out / "logs"
    for folder in (reference_dir, run_dir, logs):
        shutil.rmtree(folder, ignore_errors=True)
    logs.mkdir(parents=True)
    job = _Job(write_train_yaml(out / "train.yaml", config), logs, {**os.environ, **(env or {})}, timeout_s)
    reference = job.launch(reference_dir, "reference.log", False)
    if reference.wait(timeout=timeout_s) != 0:
        raise RuntimeError(f"the uninterrupted run failed (status {reference.returncode}); see {logs}/reference.log")
    ref_records = step_records(reference_dir)
    num_steps = len(ref_records)
    per_epoch = sum(r["epoch"] == ref_records[0]["epoch"] for r in ref_records)
    every = int(config.get("train", {}).get("checkpoint_every_steps", 0))
    mid_checkpoint = next((s for s in range(every, num_steps, every) if s % per_epoch), 0) if every >= 2 else 0
    if not mid_checkpoint or num_steps < 2 * per_epoch:
        raise ValueError(
            f"train.checkpoint_every_steps {every} with {per_epoch} steps per epoch and {num_steps} steps: the run "
            "needs a checkpoint in the middle of an epoch, at least 2 steps in (an interval of 2 or more that is not "
            "a multiple of the steps per epoch), and at least two epochs"
        )

    kills = [job.kill_at(run_dir, 1, BOUNDARIES[0], lambda since: functools.partial(_logged, run_dir, since, 1))]
    # The step after the first mid-epoch checkpoint: lost by the kill, redone by the resume.
    # And its file on disk: rank 0 writes checkpoints in the background, so the next step can log first.
    mid_file = run_dir / "checkpoints" / f"ckpt-{mid_checkpoint:09d}.pt"
    kills.append(
        job.kill_at(
            run_dir,
            2,
            BOUNDARIES[1],
            lambda since: lambda: _logged(run_dir, since, mid_checkpoint + 1) and mid_file.exists(),
        )
    )
    end = next(e for e in range(per_epoch, num_steps, per_epoch) if e > kills[-1].resumed_from)
    kills.append(
        job.kill_at(run_dir, 3, BOUNDARIES[2], lambda _: (run_dir / "checkpoints" / f"ckpt-{end:09d}.pt").exists)
    )
    completed = job.launch(run_dir, "final.log", True).wait(timeout=timeout_s) == 0
    records = step_records(run_dir)
    ref_ckpt, last = list_checkpoints(reference_dir), list_checkpoints(run_dir)
    differing, optimizer_equal = ["no final checkpoint"], False
    if completed and ref_ckpt and last:
        differing, optimizer_equal = _differences(ref_ckpt[-1], last[-1])
    return BoundaryReport(
        name=name or str(config.get("model", {}).get("name", "")),
        steps_per_epoch=per_epoch,
        num_steps=num_steps,
        kills=kills,
        completed=completed and bool(last) and last[-1].name == ref_ckpt[-1].name,
        steps_logged=[r["step"] for r in records],
        weights_equal=not differing,
        optimizer_equal=optimizer_equal,
        losses_equal=[r["loss"] for r in records] == [r["loss"] for r in ref_records],
        evaluations_equal=_evaluations(run_dir) == _evaluations(reference_dir),
        differing=differing,
        seconds=time.perf_counter() - started,
        first_loss_difference=_first_loss_difference(records, ref_records),
    )


def _first_loss_difference(records: list[dict], reference: list[dict]) -> str:
    """Where the resumed run's losses first part from the reference's, in words ("" where they never do)."""
    theirs = {r["step"]: r["loss"] for r in reference}
    for record in records:
        step, loss = record["step"], record["loss"]
        if theirs.get(step) != loss:
            return f"first at step {step}: {loss!r} against {theirs.get(step)!r}"
    return ""
