"""Runs of windows through a stacked-frame model's sliding-window graph (:mod:`gpufeed.models._sliding_stem`).

With a window at every frame, ``gpufeed predict`` and the server's video input hand a clip model on
onnxruntime's CPU provider the frames of :data:`RUN_WINDOWS` consecutive windows at once, and the
rewritten graph shares its first convolution between them: measured on a 2-core CPU, clip ResNet-18
at 112 px, 11 frames, 3.8-4.3 ms a window against 6.8-7.1 for the same windows one by one, logits
within 2e-7.

:class:`SlidingRunner` makes the graph from the model's own ``model.onnx`` (an exported folder, or
a checkpoint's cached export) and runs it; a run shorter than the graph's block (a video's last)
is padded with black frames, whose windows are dropped. Its users check it against the plain graph
before trusting it (:meth:`SlidingRunner.first_run`): the predictor on its first run
(:meth:`gpufeed.predict.Predictor.run_logits`), the server at warm-up.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from gpufeed.models._export import parity_tolerance
from gpufeed.models._frame_scores import gather_clips
from gpufeed.models._sliding_stem import SlidingStemError, sliding_window_graph
from gpufeed.pipelines import first_line

__all__ = ["RUN_WINDOWS", "SlidingRunner", "sliding_runner"]

log = logging.getLogger("gpufeed.models")

RUN_WINDOWS = 32
"""Windows per run: 32 and 64 measured the same per window (3.8-4.3 ms, clip ResNet-18 at 112 px,
2 cores); 32 holds half the memory (a run's per-frequency products: 35 MB)."""


class SlidingRunner:
    """onnxruntime's CPU session of a model's sliding-window graph.

    Args:
        onnx_path: The model's ``model.onnx``.
        clip_length_frames, stride_frames: The windows' frames.
        threads: Intra-op threads (0: onnxruntime's default).
        windows: Windows per run.
        threads_alone: Intra-op threads of a run that starts while nothing else of its owner runs
            (the server's lone-batch budget); 0 or not above ``threads``: one session for both.
        owner: How log lines name the user (``"predict"``, ``"model NAME"``).

    Raises:
        SlidingStemError: The graph is not a stacked-frame model (the message says why).
    """

    def __init__(
        self,
        onnx_path: Path,
        clip_length_frames: int,
        stride_frames: int,
        threads: int,
        windows: int = RUN_WINDOWS,
        threads_alone: int = 0,
        owner: str = "predict",
    ) -> None:
        import onnx
        import onnxruntime as ort

        graph, self.shape = sliding_window_graph(onnx.load(str(onnx_path)), clip_length_frames, stride_frames, windows)
        self.clip_length_frames, self.stride_frames = clip_length_frames, stride_frames
        self.owner = owner
        model = graph.SerializeToString()

        def session(count: int):
            options = ort.SessionOptions()
            options.log_severity_level = 3
            if count:
                options.intra_op_num_threads = count
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as the plain runner's
            return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])

        self.session = session(threads)
        self.session_alone = session(threads_alone) if threads_alone > threads > 0 else self.session
        self.input_name = self.session.get_inputs()[0].name
        # One run now, on black frames: a graph onnxruntime accepts but cannot run (a shape fixed somewhere
        # the rewrite did not reach) fails here, where the plain graph takes over, not mid-video.
        black = self._padded(np.empty((0, 3, self.shape.height_px, self.shape.width_px), np.uint8))
        for each in {id(s): s for s in (self.session, self.session_alone)}.values():
            logits = each.run(None, {self.input_name: black})[0]
            if logits.ndim != 2 or len(logits) != self.windows:
                raise RuntimeError(f"the sliding-window graph answers {logits.shape} for {self.windows} windows")

    @property
    def windows(self) -> int:
        return self.shape.windows

    def _padded(self, frames: np.ndarray) -> np.ndarray:
        """``frames`` followed by black ones, a whole block (a new array: runs may overlap in threads)."""
        block = np.zeros((self.shape.block_frames, 3, self.shape.height_px, self.shape.width_px), np.uint8)
        block[: len(frames)] = frames
        return block

    def count(self, run: torch.Tensor) -> int:
        """Windows in ``run`` (F, 3, H, W): one at each frame with a whole span after it."""
        return len(run) - self.shape.span_frames + 1

    def windows_of(self, run: torch.Tensor, count: int) -> torch.Tensor:
        """The first ``count`` windows of ``run`` as clips (N, 3, T, H, W), as the plain graph takes them."""
        offsets = np.arange(self.clip_length_frames, dtype=np.int64) * self.stride_frames
        return gather_clips(run, np.arange(count, dtype=np.int64)[:, None] + offsets)

    def is_short(self, count: int) -> bool:
        """A run of ``count`` windows costs less one by one: under 60 % of :attr:`windows` (a run costs
        about 0.6 of as many windows one by one: 3.8-4.3 ms a window against 6.8-7.1, measured above)."""
        return count * 5 < self.windows * 3

    def first_run(self, run: torch.Tensor, want: np.ndarray, source: str) -> np.ndarray | None:
        """``run``'s logits when its first windows agree with ``want`` (the plain graph's for them)
        within the export's tolerance; else ``None``, with one warning naming ``source``."""
        got = self(run)
        diff = float(np.abs(got[: len(want)] - want).max(initial=0.0))
        tolerance = parity_tolerance("fp32", want)
        if diff <= tolerance:  # NaN compares False: a NaN output disagrees
            log.info("%s: runs of windows agree with the plain graph (max |diff| %.3g)", self.owner, diff)
            return got
        log.warning(
            "%s: %s: its sliding-window graph disagrees with the plain one (max |diff| %.3g, tolerance %.3g); "
            "scoring windows one by one",
            self.owner,
            source,
            diff,
            tolerance,
        )
        return None

    def __call__(self, run: torch.Tensor, alone: bool = False) -> np.ndarray:
        """Logits (F - span + 1, C) of the windows at each frame of ``run`` (F, 3, H, W) uint8.

        ``alone``: the run starts while nothing else of its owner runs (:attr:`session_alone`).
        Threads may call it at once (the server's video streams).
        """
        count = self.count(run)
        if not 1 <= count <= self.windows:
            raise ValueError(f"a run of {len(run)} frames holds {count} windows; this graph scores 1 to {self.windows}")
        frames = run.cpu().numpy()
        if count < self.windows:  # the video's last run: black frames after it, their windows dropped
            frames = self._padded(frames)
        session = self.session_alone if alone else self.session
        return session.run(None, {self.input_name: np.ascontiguousarray(frames)})[0][:count]


def sliding_runner(
    on_gpu: bool, spec, sampling, onnx_path: Path, threads: int, threads_alone: int = 0, owner: str = "predict"
) -> SlidingRunner | None:
    """A :class:`SlidingRunner` for a clip model on onnxruntime's CPU provider, or ``None`` (the reason logged).

    Args:
        on_gpu: The model's plain runner is on a GPU (no runs there: not measured).
        spec: The model's :class:`~gpufeed.models.ModelSpec` (its clip length).
        sampling: Its :class:`~gpufeed.models.ClipSampling` (the frames' stride).
        onnx_path: Its ``model.onnx``.
        threads, threads_alone: Intra-op threads, as its plain runner's.
        owner: How log lines name the user.
    """
    if on_gpu or not spec.clip_length_frames:
        return None
    try:
        return SlidingRunner(
            onnx_path,
            spec.clip_length_frames,
            sampling.stride_frames,
            threads,
            threads_alone=threads_alone,
            owner=owner,
        )
    except SlidingStemError as err:  # another architecture: its windows go one by one, as always
        log.info("%s: windows are scored one by one: %s", owner, err)
    except Exception as err:  # onnx or onnxruntime refusing the rewritten graph: the plain one still runs
        log.warning(
            "%s: windows are scored one by one: the sliding-window graph failed: %s", owner, first_line(str(err))
        )
    return None
