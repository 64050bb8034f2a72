"""Per-frame class probabilities from a clip model: windows over a video's frames, and the rule that joins them.

The one scoring path of ``gpufeed predict`` and of the server's video input: frames arrive in
order (the sequential reader's chunks), windows of the model's clip are cut from them and scored in
batches by whatever runs the model, and each frame gets its probabilities as soon as no later window
can cover it. Nothing here knows where the frames come from or where the model runs; the tests hold
it exactly on tagged videos with a model that reads the tags.

**Windows** (:class:`WindowPlan`). A window starting at frame ``s`` holds the model's
``clip_length_frames`` frames ``s, s + d, ..., s + (T - 1) * d`` (``d``: ``stride_frames``, the
gap the model was trained with, ``video.stride_frames``) and *covers* the ``span = (T - 1) * d + 1``
frames from ``s`` to its last. Windows start every ``hop_frames`` (1: a window at every frame),
and one more is aligned to the video's end when the hop does not land there, so every frame is
covered; ``hop_frames`` may not exceed the span (frames between windows would be covered by none).
A video shorter than one span is one window at frame 0 whose frames past the end repeat the last
frame.

**The rule.** Frame ``i``'s probabilities are the **mean of the probabilities of every window that
covers it** (the head's sigmoid or softmax of each window's logits; means in float64, stored as
float32); its logits likewise. Why the mean over covering windows rather than the window centred on
each frame: the first and last ``span // 2`` frames have no centred window without inventing
frames, and the mean gives them real windows; with ``hop_frames`` 1 and an odd span, the windows
covering frame ``i`` are centred on frames ``i - span // 2 .. i + span // 2`` in equal number
(away from the ends), so the mean is centred on ``i`` too: a box smoothing of width ``span`` of the
centred predictions a model trained on centre-frame labels makes; a larger hop trades that
smoothing for fewer windows (``hop_frames = span``: each frame in one window, ``span`` times fewer).

**Streaming.** :class:`WindowScorer` keeps only the frames the next windows need and the sums of the
frames not yet final, so memory is bounded by ``span + batch_windows * hop_frames`` frames and
whatever a chunk holds, whatever the video's length. :func:`score_frames` runs the whole loop for
a scoring callable (``predict`` calls it with its model runner, the server with a callable that
queues the windows on the model's batcher).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gpufeed.models._window_plan import WindowPlan

__all__ = ["FrameScores", "WindowBatch", "WindowPlan", "WindowScorer", "gather_clips", "score_frames"]


@dataclass(frozen=True)
class WindowBatch:
    """Windows ready to score, in start order.

    Attributes:
        number: Position of this batch in the video (0, 1, ...): scores go back in this order.
        starts: (N,) int64 first frame of each window.
        clips: (N, 3, T, H, W) uint8, contiguous, on the frames' device; ``None`` when ``run`` holds
            the windows instead.
        run: For a scorer asked for runs (see :class:`WindowScorer`), windows at consecutive frames
            whose frames are all in the video: their frames, ``starts[0] .. starts[-1] + span - 1``,
            (F, 3, H, W) uint8 (window ``i`` is ``run[i :: stride][:T]``); else ``None``.
    """

    number: int
    starts: np.ndarray
    clips: torch.Tensor | None
    run: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.starts)


@dataclass(frozen=True)
class FrameScores:
    """Consecutive frames whose windows are all scored: their final probabilities.

    Attributes:
        first_frame: Index of the first frame here.
        probabilities: (F, C) float32, the mean over covering windows.
        logits: (F, C) float32, likewise.
        window_starts, window_probabilities: The windows scored since the previous block (when the
            scorer keeps them): (W,) int64 and (W, C) float32.
    """

    first_frame: int
    probabilities: np.ndarray
    logits: np.ndarray
    window_starts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    window_probabilities: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.probabilities)


def gather_clips(frames: torch.Tensor, index: np.ndarray) -> torch.Tensor:
    """Clips (N, 3, T, H, W), contiguous, of ``frames`` (F, 3, H, W): row ``k`` holds frames ``index[k]`` ((N, T))."""
    host = torch.from_numpy(np.ascontiguousarray(index).reshape(-1))
    if frames.device.type == "cuda":  # from pageable memory the copy would wait for the work queued on the GPU
        host = host.pin_memory()
    gather = host.to(frames.device, non_blocking=True)
    picked = frames.index_select(0, gather)  # (N * T, 3, H, W)
    n, t = index.shape
    return picked.view(n, t, *frames.shape[1:]).permute(0, 2, 1, 3, 4).contiguous()


class WindowScorer:
    """Cut windows from frames as they arrive and join the windows' scores into per-frame ones.

    Feed frames in order with :meth:`add_frames` (it returns the batches now complete), then
    :meth:`finish` (the last, partial batch); hand each batch's logits back, in batch order, to
    :meth:`add_scores`, which returns the frames that became final. See the module docs.

    Args:
        plan: The windows.
        num_frames: Frames in the video (the last window is aligned to its end).
        batch_windows: Windows per batch.
        class_scores: Logits (N, C) float32 -> probabilities (the head's ``class_scores``).
        keep_windows: Also return each window's probabilities.
        runs: Give a batch of windows at consecutive frames (``hop_frames`` 1) as the run of frames
            they read (:attr:`WindowBatch.run`) rather than cut out one by one, for a model that
            scores a run at once (:mod:`gpufeed.models._sliding_stem`); windows that repeat the
            last frame (a video shorter than a span) are still cut.
    """

    def __init__(
        self,
        plan: WindowPlan,
        num_frames: int,
        batch_windows: int,
        class_scores: Callable[[np.ndarray], np.ndarray],
        keep_windows: bool = False,
        runs: bool = False,
    ) -> None:
        if batch_windows < 1:
            raise ValueError(f"batch_windows {batch_windows} must be >= 1")
        self.plan, self.num_frames, self.batch_windows = plan, num_frames, batch_windows
        self.class_scores, self.keep_windows = class_scores, keep_windows
        self.runs = runs and plan.hop_frames == 1
        self.windows = plan.window_count(num_frames)  # starts are computed, never listed: O(1) memory
        self._frames: torch.Tensor | None = None  # frames [self._base, self._have)
        self._base = self._have = 0
        self._next_window = 0  # first window not yet put in a batch
        self._batches_made = self._batches_scored = 0
        self._batch_ends: dict[int, int] = {}  # per batch not yet scored: one past its last window
        self._sums: np.ndarray | None = None  # float64 (F, 2, C): probabilities and logits of frames [_final, ...)
        self._counts = np.zeros(0, dtype=np.int64)
        self._final = 0  # frames before this are returned
        self.windows_scored = 0

    @property
    def frames_held(self) -> int:
        """Frames kept for windows not yet cut (the memory bound's frame count)."""
        return self._have - self._base

    def _start(self, window: int) -> int:
        return self.plan.start_of(window, self.num_frames)

    def add_frames(self, frames: torch.Tensor, first_frame: int | None = None) -> list[WindowBatch]:
        """Add the next frames, (C, 3, H, W) uint8; returns the batches of windows now complete.

        Raises:
            ValueError: ``first_frame`` is not the next frame expected (frames out of order), or
                more frames arrive than the video has.
        """
        if first_frame is not None and first_frame != self._have:
            raise ValueError(f"frames arrived from frame {first_frame}; frame {self._have} was expected next")
        if self._have + len(frames) > self.num_frames:
            raise ValueError(f"{self._have + len(frames)} frames arrived for a video of {self.num_frames}")
        # Always a copy: a reader may reuse its chunk's memory for the next chunk.
        if self._frames is None:
            self._frames, self._base = frames.clone(), self._have
        else:
            self._frames = torch.cat([self._frames, frames])
        self._have += len(frames)
        return self._cut(final=False)

    def finish(self) -> list[WindowBatch]:
        """The remaining windows (the last batch may be short) once every frame has arrived.

        Raises:
            ValueError: Fewer frames arrived than the video has.
        """
        if self._have != self.num_frames:
            raise ValueError(f"the video ended after {self._have} frames; {self.num_frames} were expected")
        return self._cut(final=True)

    def _cut(self, final: bool) -> list[WindowBatch]:
        batches = []
        total = self.windows
        while self._next_window < total:
            first = self._next_window
            starts = self.plan._starts_between(first, min(total, first + self.batch_windows), self.num_frames)
            last_frames = np.minimum(starts + self.plan.span_frames - 1, self.num_frames - 1)  # frames_of's last
            # Last frames never decrease with the window: the windows whose frames have all arrived
            # are a prefix, counted in one search rather than window by window.
            count = int(np.searchsorted(last_frames, self._have, side="left"))
            ready = first + count
            if count == 0 or (count < self.batch_windows and not final and ready < total):
                break
            batches.append(self._batch(starts[:count], ready))
            self._next_window = ready
        if self._next_window < total:  # keep the frames from the next window's first on
            self._drop_before(self._start(self._next_window))
        else:
            self._drop_before(self._have)
        return batches

    def _batch(self, starts: np.ndarray, end: int) -> WindowBatch:
        assert self._frames is not None
        last = int(starts[-1]) + self.plan.span_frames  # one past the last window's frames
        clips, run = None, None
        if self.runs and last <= self.num_frames and int(starts[-1] - starts[0]) == len(starts) - 1:
            run = self._frames[int(starts[0]) - self._base : last - self._base]  # a view: no copy
        else:
            clips = gather_clips(self._frames, self.plan._frames_of_starts(starts, self.num_frames) - self._base)
        batch = WindowBatch(self._batches_made, starts, clips, run)
        self._batches_made += 1
        self._batch_ends[batch.number] = end
        return batch

    def _drop_before(self, frame: int) -> None:
        frame = min(frame, self._have)
        if frame <= self._base:
            return
        if self._frames is not None:
            keep = self._frames[frame - self._base :]
            self._frames = keep.clone() if len(keep) else None  # a copy: the older frames' memory goes
        self._base = frame

    def add_scores(self, batch: WindowBatch, logits: np.ndarray) -> FrameScores | None:
        """Join one batch's logits (N, C) into the frames; the frames now final, or ``None``.

        Raises:
            ValueError: A batch out of order, or logits of another shape.
        """
        if batch.number != self._batches_scored:
            raise ValueError(f"scores of batch {batch.number} arrived; batch {self._batches_scored} was expected")
        logits = np.asarray(logits, dtype=np.float32)
        if logits.ndim != 2 or len(logits) != len(batch):
            raise ValueError(f"{len(batch)} windows got logits of shape {tuple(logits.shape)}; expected (N, classes)")
        probabilities = np.asarray(self.class_scores(logits), dtype=np.float32)
        end = self.plan.covered_end(int(batch.starts[-1]), self.num_frames)
        self._grow(end, logits.shape[1])
        assert self._sums is not None
        both = np.stack([probabilities, logits], axis=1).astype(np.float64)  # (N, 2, C)
        lows = batch.starts - self._final
        highs = np.minimum(batch.starts + self.plan.span_frames, self.num_frames) - self._final
        # One slice add per window, in start order: each frame's float64 sum adds its windows in the
        # same order whatever the batching (a cumulative-sum trick would round differently).
        for lo, hi, row in zip(lows.tolist(), highs.tolist(), both, strict=True):
            self._sums[lo:hi] += row
        # Counts are integers, exact in any order: +1 where each window's frames begin, -1 past their end.
        steps = np.zeros(len(self._counts) + 1, dtype=np.int64)
        np.add.at(steps, lows, 1)
        np.add.at(steps, highs, -1)
        self._counts += np.cumsum(steps[:-1])
        self._batches_scored += 1
        self.windows_scored += len(batch)
        ended = self._batch_ends.pop(batch.number)
        # Frames before the next window's start are covered by no window still to come.
        done_until = self.num_frames if ended >= self.windows else self._start(ended)
        return self._emit(done_until, batch.starts, probabilities)

    def _grow(self, end: int, classes: int) -> None:
        rows = end - self._final
        if self._sums is None:
            self._sums = np.zeros((rows, 2, classes), dtype=np.float64)
            self._counts = np.zeros(rows, dtype=np.int64)
        elif rows > len(self._sums):
            extra = rows - len(self._sums)
            self._sums = np.concatenate([self._sums, np.zeros((extra, 2, classes), dtype=np.float64)])
            self._counts = np.concatenate([self._counts, np.zeros(extra, dtype=np.int64)])

    def _emit(self, until: int, starts: np.ndarray, probabilities: np.ndarray) -> FrameScores | None:
        assert self._sums is not None
        count = until - self._final
        windows = probabilities if self.keep_windows else None
        if count <= 0:
            if not self.keep_windows:
                return None
            empty = np.zeros((0, probabilities.shape[1]), dtype=np.float32)
            return FrameScores(self._final, empty, empty, starts.copy(), windows)
        if (self._counts[:count] == 0).any():  # cannot happen for a valid plan: say so rather than divide by 0
            raise RuntimeError(f"frame {self._final + int(np.argmin(self._counts[:count]))} has no window")
        means = (self._sums[:count] / self._counts[:count, None, None]).astype(np.float32)
        block = FrameScores(
            self._final,
            np.ascontiguousarray(means[:, 0]),
            np.ascontiguousarray(means[:, 1]),
            starts.copy() if self.keep_windows else np.zeros(0, dtype=np.int64),
            windows,
        )
        self._sums, self._counts = self._sums[count:].copy(), self._counts[count:].copy()
        self._final = until
        return block

    @property
    def done(self) -> bool:
        """Every frame is final."""
        return self._final == self.num_frames


def score_frames(
    chunks: Iterable[Any],
    num_frames: int,
    plan: WindowPlan,
    score: Callable[[torch.Tensor], np.ndarray],
    class_scores: Callable[[np.ndarray], np.ndarray],
    batch_windows: int,
    keep_windows: bool = False,
    score_run: Callable[[torch.Tensor], np.ndarray] | None = None,
) -> Iterator[FrameScores]:
    """Per-frame probabilities of one video, block by block, in frame order: the scoring path.

    Args:
        chunks: The video's frames in order: objects with ``frames`` ((C, 3, H, W) uint8 tensor)
            and ``frame_indices`` (the sequential reader's :class:`~gpufeed.pipelines.FrameChunk`).
        num_frames: Frames in the video.
        plan: The windows.
        score: Clips (N, 3, T, H, W) uint8 -> logits (N, C) float32 (the model, wherever it runs).
        class_scores: Logits -> probabilities (the head's).
        batch_windows: Windows per call of ``score`` (the last may hold fewer).
        keep_windows: Also give each window's probabilities (:attr:`FrameScores.window_probabilities`).
        score_run: With ``hop_frames`` 1: a run of frames (F, 3, H, W) uint8 -> the logits of its
            ``F - span + 1`` windows at consecutive frames (:attr:`WindowBatch.run`); windows it
            cannot take (a video shorter than a span) still go to ``score``.

    Yields:
        :class:`FrameScores` blocks covering frames ``0 .. num_frames - 1`` once each, in order.

    Raises:
        ValueError: The chunks hold other frames than ``0 .. num_frames - 1`` in order.
    """
    scorer = WindowScorer(plan, num_frames, batch_windows, class_scores, keep_windows, runs=score_run is not None)

    def scored(batches: list[WindowBatch]) -> Iterator[FrameScores]:
        for batch in batches:
            if batch.run is not None:
                assert score_run is not None
                logits = score_run(batch.run)
            else:
                assert batch.clips is not None
                logits = score(batch.clips)
            block = scorer.add_scores(batch, logits)
            if block is not None:
                yield block

    for chunk in chunks:
        first = int(chunk.frame_indices[0]) if len(chunk.frame_indices) else None
        yield from scored(scorer.add_frames(chunk.frames, first))
    yield from scored(scorer.finish())
    if not scorer.done:  # pragma: no cover - finish() scores every window
        raise RuntimeError(f"scoring ended with frames {scorer._final}..{num_frames - 1} not final")
