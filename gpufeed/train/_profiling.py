"""Named ranges for each stage of a step, and ``--profile-steps A:B`` Chrome traces.

Every step runs its stages inside ranges named ``loader_wait``, ``augment``, ``forward``,
``backward`` and ``optimizer``: ``torch.profiler.record_function`` ranges (visible in the Chrome
trace) and, on a GPU, NVTX ranges of the same names, so Nsight Systems
(``nsys profile -t cuda,nvtx gpufeed train ...``) shows the same stages without any flag.

``--profile-steps A:B`` records steps A to B (1-based, inclusive) with ``torch.profiler`` (CPU,
plus CUDA kernels on a GPU) and saves ``RUN_DIR/trace-steps<A>-<B>-rank<r>.json``, which
``chrome://tracing`` and https://ui.perfetto.dev open.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

__all__ = ["STAGE_NAMES", "ProfileWindow", "StageRanges", "parse_profile_steps"]

log = logging.getLogger("gpufeed")

STAGE_NAMES = ("loader_wait", "augment", "forward", "backward", "optimizer")


def parse_profile_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` -> ``(A, B)`` with ``1 <= A <= B``.

    Raises:
        ValueError: Naming the text and the expected form.
    """
    first, sep, last = text.partition(":")
    try:
        if not sep:
            raise ValueError
        start, stop = int(first), int(last)
    except ValueError:
        raise ValueError(f"--profile-steps {text!r}: expected A:B, two step numbers such as 10:15") from None
    if not 1 <= start <= stop:
        raise ValueError(f"--profile-steps {text!r}: need 1 <= A <= B (steps count from 1)")
    return start, stop


class StageRanges:
    """``with ranges("forward"): ...`` opens a profiler range and, on a GPU, an NVTX range."""

    def __init__(self, on_gpu: bool) -> None:
        self.on_gpu = on_gpu

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.on_gpu:
            torch.cuda.nvtx.range_push(name)
        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            if self.on_gpu:
                torch.cuda.nvtx.range_pop()


class ProfileWindow:
    """Starts ``torch.profiler`` before step ``start`` and saves the trace after step ``stop``.

    Args:
        steps: ``(A, B)`` from :func:`parse_profile_steps`, or ``None`` to never profile.
        run_dir, rank: Where the trace goes.
        on_gpu: Also record CUDA activity.
    """

    def __init__(self, steps: tuple[int, int] | None, run_dir: Path, rank: int, on_gpu: bool) -> None:
        self.steps = steps
        self.path = Path(run_dir) / f"trace-steps{steps[0]}-{steps[1]}-rank{rank}.json" if steps else None
        self.on_gpu = on_gpu
        self._profiler: torch.profiler.profile | None = None

    def before_step(self, step: int) -> None:
        """Call with the number of the step about to run (1-based)."""
        if self.steps and step == self.steps[0] and self._profiler is None:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if self.on_gpu:
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            self._profiler = torch.profiler.profile(activities=activities, record_shapes=False)
            self._profiler.__enter__()
            log.info("profiling steps %d to %d", *self.steps)

    def stops_at(self, step: int) -> bool:
        """True when the trace ends after ``step`` (the loop then finishes that step before going on)."""
        return self._profiler is not None and self.steps is not None and step >= self.steps[1]

    def after_step(self, step: int) -> None:
        """Call with the number of the step that just finished."""
        if self._profiler is not None and self.steps is not None and step >= self.steps[1]:
            self.close()

    def close(self) -> Path | None:
        """Stop and save (training ended inside the window, or it is complete); the trace's path."""
        if self._profiler is None or self.steps is None:  # a profiler exists only with steps
            return None
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(str(self.path))
        log.info("profile of steps %d to %d saved to %s", *self.steps, self.path)
        return self.path
