"""The :class:`ClipSource` type: one class per way the clips of a dataset are decoded.

A source is picked once per loader (or sequential reader) from the videos' facts by
:func:`gpufeed.pipelines._clip_sources.choose_clip_source`, and then asked, never named:

* its **graph input** (:meth:`ClipSource.open`: the DALI pipeline over one plan stream, with the
  file list or the callback it reads from; :meth:`ClipSource.open_ranges`: one video's
  consecutive ranges for :class:`~gpufeed.pipelines.VideoFrameReader`);
* its **row order** (:meth:`ClipSource.read_order`: which plan row each output row is, when it reads
  a batch out of plan order; :attr:`ClipSource.frames_flat`: whether a clip comes out as ``T``
  frames of its own);
* its **worker processes** (started with the pipeline, :func:`start_method`; their ids by
  :func:`worker_pids`) and its :meth:`ClipSource.close` (the file list's folder).

The sources themselves: DALI's video reader and the PyAV workers in
:mod:`gpufeed.pipelines._clip_sources`, the frame stores' in :mod:`gpufeed.pipelines._store_sources`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from gpufeed.core import SizePx
from gpufeed.pipelines._augment import StreamAugmentFeed
from gpufeed.pipelines._clip_plan import ClipPlan, PlanRows
from gpufeed.pipelines._clips import ClipGeometry
from gpufeed.pipelines._crop_windows import RoiFeed
from gpufeed.pipelines._epochs import worker_start_method
from gpufeed.pipelines._videos import VideoInfo

__all__ = ["ClipJob", "ClipSource", "RangeJob", "SourcePipeline", "start_method", "worker_pids"]

log = logging.getLogger("gpufeed")


@dataclass(frozen=True)
class ClipJob:
    """What one loader pipeline reads and how: made by the loader for each plan stream.

    Attributes:
        plan: The clips of each pipeline iteration.
        paths: The path of every video, by video id (the whole dataset).
        infos: :class:`~gpufeed.pipelines._videos.VideoInfo` per video id.
        geometry: Clip length and stride.
        size_px, fit: The output size and fit (``video.size_px``, ``video.fit``).
        device_id: CUDA device; ``None`` runs on the CPU.
        num_threads, prefetch_queue_depth, seed: The DALI pipeline's.
        start_method: ``loader.worker_start_method`` (``auto``, ``fork``, ``spawn``).
        max_pixels: Frame stores' frames declaring more are refused undecoded.
        fast_idct: JPEG frames with libjpeg-turbo's fast IDCT on a CPU (``video.jpeg_idct: fast``).
        augment: The loader's augmentation feed (in the order the source outputs rows), or ``None``.
        reader_builds: The loader's list of DALI reader builds, which a reader source appends to.
        hw_decoder_load: ``loader.hw_decoder_load``: the hardware JPEG decoder's share of frame
            stores' frames on a GPU (all or nothing in evaluation, as the image loader's).
        train: A training job (else evaluation).
        executor: ``loader.executor`` (:func:`~gpufeed.pipelines._executor.executor_args`).
    """

    plan: ClipPlan
    paths: Sequence[str]
    infos: Sequence[VideoInfo]
    geometry: ClipGeometry
    size_px: SizePx
    fit: str
    device_id: int | None
    num_threads: int
    prefetch_queue_depth: int
    seed: int
    start_method: str = "auto"
    max_pixels: int = 0
    fast_idct: bool = False
    augment: StreamAugmentFeed | None = None
    reader_builds: list = field(default_factory=list)
    hw_decoder_load: float = 0.9
    train: bool = True
    executor: str = "auto"

    @property
    def batch_size(self) -> int:
        return self.plan.batch_size

    @property
    def on_gpu(self) -> bool:
        return self.device_id is not None

    def frame_sizes(self) -> np.ndarray:
        """(videos, 2) (width, height) of every video's frames as shown (turned upright), by video id."""
        return np.array([info.display_size for info in self.infos]).reshape(-1, 2)

    def graph_args(self) -> dict:
        """The arguments every clip graph over this job shares (``build_clip_pipeline``'s)."""
        return {
            "clip_length_frames": self.geometry.clip_length_frames,
            "stride_frames": self.geometry.stride_frames,
            "size_px": self.size_px,
            "fit": self.fit,
            "batch_size": self.batch_size,
            "device_id": self.device_id,
            "num_threads": self.num_threads,
            "prefetch_queue_depth": self.prefetch_queue_depth,
            "seed": self.seed,
            "augment": self.augment,
            "executor": self.executor,
        }


@dataclass(frozen=True)
class RangeJob:
    """What one pass of the sequential reader reads: a video's ranges of ``chunk_frames`` frames.

    Attributes:
        info: The video.
        starts: First frame of each range, one range per pipeline iteration.
        chunk_frames: Frames per range.
        size_px, fit: The output size and fit.
        device_id, num_threads: The DALI pipeline's.
        work: A folder for the pass's file list (removed with the pass).
        hw_decoder_load: ``loader.hw_decoder_load``, taken by evaluation's all-or-nothing rule.
    """

    info: VideoInfo
    starts: np.ndarray
    chunk_frames: int
    size_px: SizePx
    fit: str
    device_id: int | None
    num_threads: int
    work: Path
    hw_decoder_load: float = 0.9

    @property
    def on_gpu(self) -> bool:
        return self.device_id is not None

    def graph_args(self) -> dict:
        """The clip graph's arguments for one range per iteration, frames first."""
        return {
            "clip_length_frames": self.chunk_frames,
            "stride_frames": 1,
            "size_px": self.size_px,
            "fit": self.fit,
            "batch_size": 1,
            "device_id": self.device_id,
            "num_threads": self.num_threads,
            "prefetch_queue_depth": 2,
            "seed": 0,
            "frames_first": True,
        }

    def roi_feed(self, repeat: int = 1) -> RoiFeed | None:
        """The crop window of every range (``centre_crop``), ``repeat`` times per range; else ``None``."""
        if self.fit != "centre_crop":
            return None
        sizes = np.array([self.info.display_size])
        aspect = self.size_px.width_px / self.size_px.height_px
        return RoiFeed(lambda _k: np.zeros(1, dtype=np.int64), sizes, aspect, repeat=repeat)


class SourcePipeline(NamedTuple):
    """A source's pipeline over one plan stream: the pipeline and how many iterations it can give (``None``: any)."""

    pipe: Any
    limit: int | None = None


class ClipSource:
    """How a dataset's clips are decoded (see the module docs); subclasses set the class attributes.

    Args:
        reason: Why the factory picked this source, in words (logs, run summaries).
        fell_back: Picked on a GPU because NVDEC cannot take the videos (a costlier path, logged louder).

    Attributes:
        name: The source's name in logs and ``ClipLoader.source`` (``dali``, ``pyav``, ``frames``).
        frames_flat: The pipeline outputs each clip as ``T`` consecutive samples of one frame
            (one image decode per frame); otherwise one (T, H, W, 3) sample per clip.
        in_plan_order: The pipeline outputs a batch's rows in plan order; otherwise in
            :meth:`read_order`.
        full_ranges: The sequential reader's ranges each hold ``chunk_frames`` frames, the last
            one aligned to the video's end; otherwise the video decodes front to back, the last
            range shorter.
        ranges_tagged_by_frame: The sequential reader's ranges come tagged with their first
            frame; otherwise with their index.
    """

    name: ClassVar[str] = ""
    frames_flat: ClassVar[bool] = False
    in_plan_order: ClassVar[bool] = True
    full_ranges: ClassVar[bool] = True
    ranges_tagged_by_frame: ClassVar[bool] = False

    def __init__(self, reason: str, *, fell_back: bool = False) -> None:
        self.reason, self.fell_back = reason, fell_back
        self._resources: list = []  # released by close(): folders of file lists

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reason!r})"

    def read_order(self, rows: PlanRows) -> np.ndarray:
        """The plan row of each row the pipeline outputs for ``rows`` (all ``batch_size`` of them)."""
        return np.arange(rows.batch_size)

    def row_order(self, plan: ClipPlan) -> Callable[[int], np.ndarray] | None:
        """``row_order(k)``: :meth:`read_order` of iteration ``k``, for the feeds beside the decode; ``None``: plan order."""
        return None if self.in_plan_order else (lambda k: self.read_order(plan[k]))

    def open(self, job: ClipJob, *, build: bool = True) -> SourcePipeline:
        """The pipeline that decodes ``job``'s clips (``build=False``: defined, not built or started)."""
        raise NotImplementedError

    def open_ranges(self, job: RangeJob, *, build: bool = True):
        """The sequential reader's pipeline: one range of ``job`` per iteration, frames first."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the last :meth:`open` made beside its pipeline (the pipeline and its workers go with it)."""
        while self._resources:
            self._resources.pop().cleanup()


def start_method(job: ClipJob, count: int, what: str) -> str:
    """``fork`` or ``spawn`` for a pipeline's ``count`` worker processes, logged with why."""
    method, why = worker_start_method(job.start_method)
    log.info("starting %d %s worker process(es) with %s (%s)", count, what, method, why)
    return method


def worker_pids(pipe) -> list[int]:
    """Process ids of a pipeline's Python workers (empty if this DALI does not tell, or it has none)."""
    pool = getattr(pipe, "_py_pool", None)
    try:
        return [int(pid) for pid in pool.pids()] if pool is not None else []
    except Exception:  # a private DALI detail: without it the check is skipped, nothing breaks
        return []
