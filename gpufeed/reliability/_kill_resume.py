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
import signal
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufeed.config import load_config
from gpufeed.core import Checklist, format_table, progress_bar
from gpufeed.models import list_checkpoints
from gpufeed.reliability._common import ensure_synth, gpufeed_argv, step_records, tiny_train_mapping, write_train_yaml
from gpufeed.train import train

__all__ = ["WEIGHT_TOLERANCE", "Kill", "KillResumeReport", "KillTarget", "draw_targets", "run_kill_resume"]

WEIGHT_TOLERANCE = 1e-6
_POLL_S = 0.005


@dataclass(frozen=True)
class KillTarget:
    """Where a kill is aimed: ``kind`` "step" at ``position`` steps, or "write" of checkpoint ``position``."""

    position: float
    kind: str

    def describe(self) -> str:
        if self.kind == "write":
            return f"write of ckpt {int(self.position)}"
        done = int(self.position)
        return f"step {done + 1}, {self.position - done:.0%} in"


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
class Kill:
    """One SIGKILL and what it left.

    Attributes:
        aimed: The target, in words.
        steps_done: Steps in the step log when the process died.
        writing: The checkpoint being written at the kill (its temporary file was left), or ``None``.
        resumed_from: Step of the newest loadable checkpoint, where ``--resume`` continues.
        steps_redone: ``steps_done - resumed_from``: steps the next attempt repeats.
        checkpoints: Checkpoint files on disk after the kill.
        loaded: How many of them loaded with ``torch.load(weights_only=True)`` and hold their step.
        unreadable: ``name: reason`` of any that did not (the test demands none).
        alive_s: How long the killed process ran.
    """

    aimed: str
    steps_done: int
    writing: str | None
    resumed_from: int
    steps_redone: int
    checkpoints: list[str]
    loaded: int
    unreadable: list[str] = field(default_factory=list)
    alive_s: float = 0.0

    @property
    def landed(self) -> str:
        """Where the kill hit: after which logged step, and in which checkpoint write if one was under way."""
        return f"after step {self.steps_done}" + (f", writing {self.writing}" if self.writing else "")


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


def _wait_and_kill(proc, run_dir: Path, target: KillTarget, launched_unix: float, step_s: float, timeout_s: float):
    """SIGKILL ``proc`` at ``target``; False if it exited first or the target never came."""
    folder = run_dir / "checkpoints"
    deadline = time.monotonic() + timeout_s
    temp_name = f".ckpt-{int(target.position):09d}.pt.tmp-{proc.pid}"
    need = int(target.position)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if target.kind == "write":
            temp = folder / temp_name
            with contextlib.suppress(FileNotFoundError):
                if temp.stat().st_size > 0:
                    proc.send_signal(signal.SIGKILL)
                    return True
        else:
            records = step_records(run_dir, launched_unix)
            if records and records[-1]["step"] >= need:
                time.sleep((target.position - need) * step_s)
                # A step kill is meant to land between checkpoint writes: on a loaded machine a write
                # (slowed by the chunk delay) can still be running when the moment comes, so wait it out.
                while any(folder.glob(f".ckpt-*.pt.tmp-{proc.pid}")) and time.monotonic() < deadline:
                    time.sleep(_POLL_S)
                proc.send_signal(signal.SIGKILL)
                return True
        time.sleep(_POLL_S)
    return False


def _inspect(
    run_dir: Path, launched_unix: float, resumed_from: int, pid: int
) -> tuple[int, str | None, list, int, list, int]:
    """After a kill: steps done, the checkpoint the killed process ``pid`` was writing, every checkpoint loaded."""
    import torch

    records = step_records(run_dir, launched_unix)
    done = records[-1]["step"] if records else resumed_from
    # Only this process's temporary file: an earlier kill's may still lie there.
    temps = sorted((run_dir / "checkpoints").glob(f".ckpt-*.pt.tmp-{pid}"))
    writing = temps[-1].name[1:].split(".tmp-")[0] if temps else None
    names, unreadable, loaded, newest = [], [], 0, 0
    for path in list_checkpoints(run_dir):
        names.append(path.name)
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
            if int(state["step"]) != int(path.stem.split("-")[1]) or "model" not in state:
                raise ValueError("holds another step or no weights")
        except Exception as err:  # any failure to load is the finding
            unreadable.append(f"{path.name}: {err}")
            continue
        loaded += 1
        newest = max(newest, int(state["step"]))
    return done, writing, names, loaded, unreadable, newest


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

    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # its summary table is not a figure here
        reference = train(load_config(config), reference_dir)
    reference_s = time.perf_counter() - started
    ref_records = step_records(reference_dir)
    num_steps = reference.step
    steps_per_epoch = num_steps // epochs
    step_s = statistics.median(r["step_s"] for r in ref_records)
    checkpoint_steps = _checkpoint_steps(num_steps, steps_per_epoch, checkpoint_every_steps)
    targets = draw_targets(num_steps, checkpoint_steps, kills, seed)

    env = {**os.environ, "GPUFEED_CHECKPOINT_CHUNK_DELAY_MS": str(chunk_delay_ms)}
    base = ["train", "--config", str(config), "--out", str(run_dir)]
    results: list[Kill] = []
    resumed_from, completed = 0, False
    bar = progress_bar(total=kills + 1, desc="kill -9 and resume", unit="start", disable=not progress, leave=True)
    started = time.perf_counter()
    for attempt in range(kills + 1):
        argv = gpufeed_argv(*base, *(["--resume"] if attempt else []))
        with open(logs / f"attempt-{attempt + 1}.log", "w", encoding="utf-8") as log_file:
            launched_unix, launched = time.time(), time.perf_counter()
            proc = subprocess.Popen(argv, env=env, stdout=log_file, stderr=subprocess.STDOUT)
            try:
                if attempt == kills:
                    completed = proc.wait(timeout=timeout_s) == 0
                    bar.update(1)
                    break
                target = targets[attempt]
                if target.kind == "write" and target.position <= resumed_from:
                    # The previous kill landed after this checkpoint was written: aim at the next write.
                    later = [s for s in checkpoint_steps if resumed_from < s < num_steps]
                    target = KillTarget(float(later[0]), "write") if later else KillTarget(num_steps - 0.5, "step")
                killed = _wait_and_kill(proc, run_dir, target, launched_unix, step_s, timeout_s)
                proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if not killed:
            raise RuntimeError(
                f"attempt {attempt + 1} exited with status {proc.returncode} before kill {attempt + 1} "
                f"({target.describe()}); see {logs / f'attempt-{attempt + 1}.log'}"
            )
        done, writing, names, loaded, unreadable, newest = _inspect(run_dir, launched_unix, resumed_from, proc.pid)
        results.append(
            Kill(
                aimed=target.describe(),
                steps_done=done,
                writing=writing,
                resumed_from=newest,
                steps_redone=max(0, done - newest),
                checkpoints=names,
                loaded=loaded,
                unreadable=unreadable,
                alive_s=time.perf_counter() - launched,
            )
        )
        resumed_from = newest
        bar.update(1)
    bar.close()
    killed_run_s = time.perf_counter() - started

    final = list_checkpoints(run_dir)
    records = step_records(run_dir)
    final_step = int(final[-1].stem.split("-")[1]) if final else 0
    weights = moments = float("inf")
    if completed and final and reference.checkpoint is not None:
        weights, moments = _compare(reference.checkpoint, final[-1])
    ref_losses = {r["step"]: r["loss"] for r in ref_records}
    loss_gaps = [abs(r["loss"] - ref_losses[r["step"]]) for r in records if r["step"] in ref_losses]
    return KillResumeReport(
        num_steps=num_steps,
        seed=seed,
        kills=results,
        completed=completed,
        final_step=final_step,
        max_weight_diff=weights,
        max_moment_diff=moments,
        max_loss_diff=max(loss_gaps, default=float("inf")),
        steps_logged=[r["step"] for r in records],
        reference_s=reference_s,
        killed_run_s=killed_run_s,
        attempts=kills + 1,
    )
