"""Kill -9 a training run at random moments, resume it each time, compare with an uninterrupted run.

``run_kill_resume(out)`` (``gpufeed reliability kill-resume``):

1. trains the small CPU job (:func:`~gpufeed.reliability._common.tiny_train_mapping`: smallcnn,
   4 epochs of 6 steps, a checkpoint every 4 steps and at each epoch end) without interruption;
2. draws the kill moments from a seeded RNG: ``kills - 1`` positions uniform over the run's
   steps (``13.4`` = 40% of a step after step 13 finished, timed with the uninterrupted run's
   median step) and one checkpoint write, chosen among the run's checkpoints;
3. runs the same job as a real ``gpufeed train`` process (``--resume`` after the first), with
   checkpoint writes slowed by ``GPUFEED_CHECKPOINT_CHUNK_DELAY_MS`` as on a slow disk, and sends
   SIGKILL at each moment: after the step log shows the step, or as soon as the temporary file of the
   chosen checkpoint holds data; after every kill it records where the kill landed (steps done, a
   write in progress when a temporary file was left) and loads **every** checkpoint on disk with
   ``torch.load(weights_only=True)``;
4. lets the last attempt finish and compares its final weights, optimiser moments and per-step
   losses with the uninterrupted run's.

Tolerance: data order, crops and augmentation draws are pure functions of (seed, epoch, sample) or
restored generator states, and CPU kernels are deterministic for a fixed thread count, so the
weights are expected to be bit-identical (measured: 0). :data:`WEIGHT_TOLERANCE` (1e-6) only
allows for last-bit differences of a differently threaded machine; one optimiser step moves
weights by about the learning rate (1e-2), so a replayed or skipped batch, or a different
augmentation draw, would exceed it by orders of magnitude.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from gpufeed.config import load_config
from gpufeed.core import Checklist, format_table, progress_bar
from gpufeed.models import list_checkpoints
from gpufeed.reliability._common import ensure_synth, step_records, tiny_train_mapping, write_train_yaml
from gpufeed.reliability._kill_attempts import Kill, KilledRun, KillTarget
from gpufeed.train import TrainResult, train

__all__ = ["WEIGHT_TOLERANCE", "Kill", "KillResumeReport", "KillTarget", "draw_targets", "run_kill_resume"]

WEIGHT_TOLERANCE = 1e-6


def draw_targets(num_steps: int, checkpoint_steps: list[int], kills: int, seed: int) -> list[KillTarget]:
    """``kills - 1`` step moments uniform over the run and one checkpoint write, in run order.

    The write is one of the checkpoints from step 2 to the second-to-last step (the final one is
    followed by nothing to resume).
    """
    if kills < 1:
        raise ValueError(f"kills must be at least 1, got {kills}")
    rng = random.Random(seed)
    targets = [KillTarget(rng.uniform(1.0, num_steps - 1.0), "step") for _ in range(kills - 1)]
    writes = [s for s in checkpoint_steps if 2 <= s < num_steps]
    if not writes:
        raise ValueError(f"no checkpoint between step 2 and {num_steps - 1} to kill a write of")
    targets.append(KillTarget(float(rng.choice(writes)), "write"))
    # A write of checkpoint s sorts before the step kills just after s, so its attempt still writes it.
    return sorted(targets, key=lambda t: (t.position, t.kind == "step"))


@dataclass
class KillResumeReport(Checklist):
    """The figures of a kill-and-resume run (see the module docs)."""

    num_steps: int
    seed: int
    kills: list[Kill]
    completed: bool
    final_step: int
    max_weight_diff: float
    max_moment_diff: float
    max_loss_diff: float
    steps_logged: list[int]
    reference_s: float
    killed_run_s: float
    attempts: int
    tolerance: float = WEIGHT_TOLERANCE

    @property
    def checkpoint_loads(self) -> tuple[int, int]:
        """(loaded, on disk) summed over every kill."""
        return sum(k.loaded for k in self.kills), sum(len(k.checkpoints) for k in self.kills)

    def checks(self) -> list[tuple[str, bool]]:
        """Each expectation of the module docs, and whether it held."""
        loaded, total = self.checkpoint_loads
        return [
            ("the killed run completed every step", self.completed and self.final_step == self.num_steps),
            ("every checkpoint left by a kill loads", loaded == total),
            ("final weights match the uninterrupted run", self.max_weight_diff <= self.tolerance),
            ("every step logged once, in order", self.steps_logged == list(range(1, self.num_steps + 1))),
        ]

    def table(self) -> str:
        rows = [
            [
                i,
                k.aimed,
                k.landed,
                k.steps_done,
                k.resumed_from,
                k.steps_redone,
                f"{k.loaded}/{len(k.checkpoints)}",
            ]
            for i, k in enumerate(self.kills, 1)
        ]
        headers = ["kill", "aimed at", "landed", "steps done", "resumed from", "redone", "checkpoints load"]
        loaded, total = self.checkpoint_loads
        writes = sum(k.writing is not None for k in self.kills)
        lines = [
            f"kill -9 and resume: smallcnn on the CPU, {self.num_steps} steps, kill moments from seed {self.seed}",
            format_table(headers, rows),
            f"{len(self.kills)} kills ({writes} during a checkpoint write), {self.attempts} starts; run "
            f"{'completed' if self.completed else 'did NOT complete'} at step {self.final_step} of {self.num_steps}",
            f"checkpoints on disk after each kill that load with torch.load(weights_only=True): {loaded} of {total}",
            f"max |weight difference| from the uninterrupted run: {self.max_weight_diff:.3g} (tolerance "
            f"{self.tolerance:g}); optimizer moments {self.max_moment_diff:.3g}; per-step losses "
            f"{self.max_loss_diff:.3g} over {len(self.steps_logged)} logged steps",
            f"wall time: uninterrupted {self.reference_s:.1f} s, killed and resumed {self.killed_run_s:.1f} s",
            self.verdict(),
        ]
        return "\n".join(lines)


def _checkpoint_steps(num_steps: int, steps_per_epoch: int, every: int) -> list[int]:
    ends = set(range(steps_per_epoch, num_steps + 1, steps_per_epoch)) | {num_steps}
    return sorted(ends | (set(range(every, num_steps + 1, every)) if every else set()))


def _compare(reference: Path, resumed: Path) -> tuple[float, float]:
    import torch

    a = torch.load(reference, map_location="cpu", weights_only=True)
    b = torch.load(resumed, map_location="cpu", weights_only=True)

    def gap(x, y) -> float:
        return float((x.double() - y.double()).abs().max()) if x.numel() else 0.0

    weights = max(gap(a["model"][k], b["model"][k]) for k in a["model"])
    moments = [
        gap(sa[name], sb[name])
        for key, sa in a["optimizer"]["state"].items()
        for sb in [b["optimizer"]["state"][key]]
        for name in sa
        if name != "step"
    ]
    return weights, max(moments, default=0.0)


@dataclass(frozen=True)
class _Reference:
    """The uninterrupted run: what the kills are timed by and the resumed run is compared with."""

    result: TrainResult
    seconds: float
    records: list[dict]  # its step log
    num_steps: int
    step_s: float  # its median step
    checkpoint_steps: list[int]  # the steps it wrote a checkpoint at


def _reference_run(config: Path, folder: Path, epochs: int, checkpoint_every_steps: int) -> _Reference:
    """Train the job without interruption in ``folder``."""
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its summary table is not a figure here
        result = train(load_config(config), folder)
    seconds = time.perf_counter() - started
    records = step_records(folder)
    num_steps = result.step
    checkpoint_steps = _checkpoint_steps(num_steps, num_steps // epochs, checkpoint_every_steps)
    return _Reference(
        result, seconds, records, num_steps, statistics.median(r["step_s"] for r in records), checkpoint_steps
    )


def _report(
    reference: _Reference, run_dir: Path, kills: list[Kill], completed: bool, seed: int, killed_run_s: float
) -> KillResumeReport:
    """The killed run's outcome against the uninterrupted one."""
    final = list_checkpoints(run_dir)
    records = step_records(run_dir)
    weights = moments = float("inf")
    if completed and final and reference.result.checkpoint is not None:
        weights, moments = _compare(reference.result.checkpoint, final[-1])
    ref_losses = {r["step"]: r["loss"] for r in reference.records}
    loss_gaps = [abs(r["loss"] - ref_losses[r["step"]]) for r in records if r["step"] in ref_losses]
    return KillResumeReport(
        num_steps=reference.num_steps,
        seed=seed,
        kills=kills,
        completed=completed,
        final_step=int(final[-1].stem.split("-")[1]) if final else 0,
        max_weight_diff=weights,
        max_moment_diff=moments,
        max_loss_diff=max(loss_gaps, default=float("inf")),
        steps_logged=[r["step"] for r in records],
        reference_s=reference.seconds,
        killed_run_s=killed_run_s,
        attempts=len(kills) + 1,
    )


def run_kill_resume(
    out: str | Path,
    *,
    kills: int = 5,
    seed: int = 0,
    epochs: int = 4,
    checkpoint_every_steps: int = 4,
    chunk_delay_ms: int = 100,
    timeout_s: float = 240.0,
    data: str | Path | None = None,
    progress: bool = True,
) -> KillResumeReport:
    """Run the whole experiment in ``out`` (replacing an earlier one); return its figures.

    Args:
        out: Work folder: ``data/`` (unless ``data`` is given), ``reference/``, ``killed/``, ``logs/``.
        kills: SIGKILLs to send (one of them during a checkpoint write).
        seed: Seeds the kill moments.
        epochs, checkpoint_every_steps: Length of the job and its checkpoint interval.
        chunk_delay_ms: Pause after each 256 KiB of a checkpoint write in the killed runs.
        timeout_s: Longest wait for one attempt.
        data: An existing ``gpufeed synth`` folder to train on.
        progress: Show a progress bar over the attempts.
    """
    out = Path(out)
    data_dir = ensure_synth(Path(data) if data else out / "data")
    reference_dir, run_dir, logs = out / "reference", out / "killed", out / "logs"
    for folder in (reference_dir, run_dir, logs):
        shutil.rmtree(folder, ignore_errors=True)
    logs.mkdir(parents=True)
    config = write_train_yaml(out / "train.yaml", tiny_train_mapping(data_dir, epochs, checkpoint_every_steps))
    reference = _reference_run(config, reference_dir, epochs, checkpoint_every_steps)
    targets = draw_targets(reference.num_steps, reference.checkpoint_steps, kills, seed)

    env = {**os.environ, "GPUFEED_CHECKPOINT_CHUNK_DELAY_MS": str(chunk_delay_ms)}
    run = KilledRun(
        config, run_dir, logs, env, reference.num_steps, reference.step_s, reference.checkpoint_steps, timeout_s
    )
    results: list[Kill] = []
    bar = progress_bar(total=kills + 1, desc="kill -9 and resume", unit="start", disable=not progress, leave=True)
    started = time.perf_counter()
    for attempt, target in enumerate(targets):
        results.append(run.kill(attempt, target, results[-1].resumed_from if results else 0))
        bar.update(1)
    completed = run.finish(len(targets))
    bar.update(1)
    bar.close()
    return _report(reference, run_dir, results, completed, seed, time.perf_counter() - started)
