"""The killed run of ``gpufeed reliability kill-resume`` (:mod:`._kill_resume`): its attempts.

Each attempt is a real ``gpufeed train`` process (``--resume`` after the first), sent SIGKILL at its
:class:`KillTarget`; what the kill left on disk (the step reached, a checkpoint write under way, every
checkpoint loaded) is its :class:`Kill`.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufeed.models import list_checkpoints
from gpufeed.reliability._common import gpufeed_argv, step_records

__all__ = ["Kill", "KillTarget", "KilledRun"]

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


@dataclass(frozen=True)
class KilledRun:
    """The interrupted run: its attempts, each a ``gpufeed train`` process (``--resume`` after the first)."""

    config: Path
    run_dir: Path
    logs: Path
    env: dict[str, str]  # with checkpoint writes slowed
    num_steps: int  # the uninterrupted run's steps,
    step_s: float  # its median step,
    checkpoint_steps: list[int]  # and the steps it wrote a checkpoint at
    timeout_s: float

    @contextlib.contextmanager
    def _launched(self, attempt: int):
        """Attempt ``attempt`` (from 0) started, its output in its log; (process, start in Unix and perf time)."""
        argv = gpufeed_argv(
            "train", "--config", str(self.config), "--out", str(self.run_dir), *(["--resume"] if attempt else [])
        )
        with open(self.logs / f"attempt-{attempt + 1}.log", "w", encoding="utf-8") as log_file:
            launched_unix, launched = time.time(), time.perf_counter()
            proc = subprocess.Popen(argv, env=self.env, stdout=log_file, stderr=subprocess.STDOUT)
            try:
                yield proc, launched_unix, launched
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()

    def finish(self, attempt: int) -> bool:
        """The last attempt, left to run to its end: whether it exited with status 0."""
        with self._launched(attempt) as (proc, _, _):
            return proc.wait(timeout=self.timeout_s) == 0

    def kill(self, attempt: int, target: KillTarget, resumed_from: int) -> Kill:
        """Attempt ``attempt`` killed at ``target`` (the previous one resumed from step ``resumed_from``)."""
        if target.kind == "write" and target.position <= resumed_from:
            # The previous kill landed after this checkpoint was written: aim at the next write.
            num_steps = self.num_steps
            later = [s for s in self.checkpoint_steps if resumed_from < s < num_steps]
            target = KillTarget(float(later[0]), "write") if later else KillTarget(num_steps - 0.5, "step")
        with self._launched(attempt) as (proc, launched_unix, launched):
            killed = _wait_and_kill(proc, self.run_dir, target, launched_unix, self.step_s, self.timeout_s)
            proc.wait(timeout=60)
        if not killed:
            raise RuntimeError(
                f"attempt {attempt + 1} exited with status {proc.returncode} before kill {attempt + 1} "
                f"({target.describe()}); see {self.logs / f'attempt-{attempt + 1}.log'}"
            )
        done, writing, names, loaded, unreadable, newest = _inspect(self.run_dir, launched_unix, resumed_from, proc.pid)
        return Kill(
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
