"""Runs of windows for served videos: the runs ``gpufeed predict`` scores, on the model's lanes.

A clip model served on onnxruntime's CPU provider scores a video with a window at every frame
(``hop_frames`` 1) in runs of :data:`~gpufeed.models.RUN_WINDOWS` windows through its
sliding-window graph (:class:`~gpufeed.models.SlidingRunner`), as ``gpufeed predict`` does: the
windows of a run share the first convolution, about 0.6 of their CPU time one by one for a clip
ResNet-18. Other hops, models that are not stacked-frame (``r3d_small``), a GPU, and
``serve.video_window_runs: false`` score windows one by one through the batcher, as before; so
does a run of few windows (a short video, a video's last run), which costs a whole run's work.

A run is a batch of its own: it holds one of the model's lanes while it runs, so runs and the
batcher's batches together keep to ``serve.workers_per_model`` at a time, and counts in the thread
budget's batches and its batches in onnxruntime (one that starts alone gets the lone batch's
threads, as the plain sessions do, and a plain batch beside it keeps to its share). It is observed as a batch of its windows (inference time, rows per batch). It does
not wait in the batcher's queue (its video already holds one of ``serve.video_streams``); between
runs the request's time and its client are checked, as between batches of windows.

At warm-up the sliding graph must give the plain graph's logits (the export's tolerance) for the
first windows of a run of noise frames, through the model's own batches; else one warning and the
model's videos go window by window.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from gpufeed.models import ClipSampling, SlidingRunner, sliding_runner

__all__ = ["VideoRuns"]

_CHECK_WINDOWS = 4  # windows of the warm-up run compared with the plain graph, in the model's own batches


class VideoRuns:
    """A served clip model's runs of windows (see the module docs).

    Args:
        model: The :class:`~gpufeed.server._model.ServedModel` (its lanes, budget, metrics, batches).
        sliding: Its sliding-window graph's runner.
    """

    def __init__(self, model, sliding: SlidingRunner) -> None:
        self.model, self.sliding = model, sliding

    @classmethod
    def load(cls, model) -> VideoRuns | None:
        """The runs of ``model``, or ``None`` where its windows go one by one (the reason logged)."""
        card, cfg = model.card, model.cfg
        if not cfg.video_window_runs or not card.spec.head.accepts_video:
            return None
        threads = model.runner.threads
        sliding = sliding_runner(
            model.on_gpu,
            card.spec,
            ClipSampling.from_card(card),
            model.runner.path,
            threads["shared"],
            threads_alone=threads["alone"],
            owner=f"model {model.name}",
        )
        return cls(model, sliding) if sliding is not None else None

    @property
    def windows(self) -> int:
        """Windows per run."""
        return self.sliding.windows

    def windows_for(self, hop_frames: int) -> int:
        """Windows per run for windows ``hop_frames`` apart; 0: they go one by one."""
        return self.sliding.windows if hop_frames == 1 else 0

    def is_short(self, run: torch.Tensor) -> bool:
        """Whether ``run``'s windows cost less one by one (:meth:`~gpufeed.models.SlidingRunner.is_short`)."""
        return self.sliding.is_short(self.sliding.count(run))

    def windows_of(self, run: torch.Tensor) -> torch.Tensor:
        """Every window of ``run`` as clips, as the plain graph takes them (a short run's, one by one)."""
        return self.sliding.windows_of(run, self.sliding.count(run))

    def check(self, plain) -> bool:
        """At warm-up: whether the sliding graph agrees with ``plain`` (clips -> logits) on a noise run.

        Args:
            plain: Clips (N, 3, T, H, W) uint8 -> logits (N, C), through the model's plain graph.
        """
        shape = self.sliding.shape
        noise = np.random.default_rng(0).integers(
            0, 256, (shape.span_frames + _CHECK_WINDOWS - 1, 3, shape.height_px, shape.width_px)
        )
        run = torch.from_numpy(noise.astype(np.uint8))
        want = plain(self.sliding.windows_of(run, _CHECK_WINDOWS))
        return self.sliding.first_run(run, want, str(self.model.runner.path)) is not None

    def __call__(self, run: torch.Tensor) -> tuple[np.ndarray, dict]:
        """Logits (windows, C) of ``run``'s windows, and the times its windows report (input, inference)."""
        model = self.model
        with model.on_lane() as alone:
            start = time.perf_counter()
            logits = self.sliding(run, alone)
            seconds = time.perf_counter() - start
        if model.ready:  # the warm-up check is not traffic
            model.metrics.observe_stage(model.name, "inference", seconds)
            model.metrics.observe_batch(model.name, len(logits), len(logits), decode_s=None, inference_s=seconds)
        return logits, {"input_s": 0.0, "inference_s": seconds}
