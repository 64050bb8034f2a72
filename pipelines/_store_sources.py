"""The clip sources of frame stores: one image decode per frame, the files read in worker processes.

* :class:`StoreSource`: every frame of a batch through one image decoder (nvJPEG / the hardware
  JPEG decoder on a GPU, DALI's CPU decoder otherwise), the graph of
  :mod:`gpufeed.pipelines._store_pipeline`, fed frame by frame by a
  :class:`~gpufeed.pipelines._store_feed.StoreFrameFeed` in DALI's worker processes; a clip comes
  out as ``T`` consecutive frames (:attr:`~gpufeed.pipelines._clip_source.ClipSource.frames_flat`).
* :class:`ScaledJpegSource`: on a CPU, stores of JPEG frames only, decoded DCT-scaled by
  libjpeg-turbo in the worker processes (:class:`~gpufeed.pipelines._store_feed.ScaledJpegClips`),
  one (T, h, w, 3) clip per sample, fitted to the output there too
  (:class:`~gpufeed.pipelines._clip_resize.ClipResizer`) unless a crop window starts or ends inside
  a decoded pixel (then the clip graph crops and resizes it).

Both read a batch's rows in plan order. The sequential reader reads one video's ranges through the
image-decoder graph in its own thread, either way.
"""

from __future__ import annotations

import numpy as np

from gpufeed.pipelines._clip_pipeline import FeedInput, build_clip_pipeline
from gpufeed.pipelines._clip_resize import ClipResizer, crop_boxes
from gpufeed.pipelines._clip_source import ClipJob, ClipSource, RangeJob, SourcePipeline, start_method
from gpufeed.pipelines._crop_windows import RoiFeed, centre_rois
from gpufeed.pipelines._decoder_options import gpu_decoder_options
from gpufeed.pipelines._epochs import worker_start_method
from gpufeed.pipelines._store_feed import ScaledJpegClips, StoreFrameFeed, StoreRef, channel_mode, jpeg_decode_sizes
from gpufeed.pipelines._store_pipeline import build_store_pipeline, store_read_workers

__all__ = ["ScaledJpegSource", "StoreSource"]


def _stores(job: ClipJob) -> list[StoreRef | None]:
    return [StoreRef.from_info(info) if info.store else None for info in job.infos]


def _decoder_options(sizes, share: float, train: bool, num_threads: int, on_gpu: bool) -> dict | None:
    """nvJPEG's arguments on a GPU, the image loader's (:func:`gpu_decoder_options`): threads unpinned,
    the hardware share in training and all or nothing in evaluation, buffers sized for the frames."""
    return gpu_decoder_options(sizes, share, train=train, num_threads=num_threads)[0] if on_gpu else None


def _shape(job: ClipJob) -> dict:
    return {"clip_length_frames": job.geometry.clip_length_frames, "stride_frames": job.geometry.stride_frames}


def _decode(job: ClipJob) -> dict:
    return {"max_pixels": job.max_pixels, "fast_idct": job.fast_idct}


class StoreSource(ClipSource):
    """Frame stores through one image decoder per pipeline (see the module docs)."""

    name = "frames"
    frames_flat = True

    def _crop(self, job: ClipJob, *, relative: bool) -> tuple[RoiFeed | None, np.ndarray]:
        """(the crop windows' feed or ``None``, (videos, 2) (width, height) of the part of each frame the resize reads)."""
        sizes = job.frame_sizes()
        if job.fit != "centre_crop":
            return None, sizes
        # Store frames are samples of their own here: a clip's window once per frame.
        aspect = job.size_px.width_px / job.size_px.height_px
        plan, repeat = job.plan, 1 if relative else job.geometry.clip_length_frames
        roi = RoiFeed(lambda k: plan[k].videos, sizes, aspect, relative=relative, repeat=repeat)
        starts, ends = centre_rois(sizes, aspect)
        return roi, (ends - starts)[:, ::-1]

    def open(self, job: ClipJob, *, build: bool = True) -> SourcePipeline:
        roi, _ = self._crop(job, relative=False)
        used = {job.infos[v].store for v in np.unique(job.plan.draw.table.slot_video)}
        feed = StoreFrameFeed(
            job.plan, _stores(job), batch_size=job.batch_size, mode=channel_mode(used), **_shape(job), **_decode(job)
        )
        if build:
            method = start_method(job, store_read_workers(job.num_threads), "frame-reading")
        else:
            method = worker_start_method(job.start_method)[0]
        args = {k: v for k, v in job.graph_args().items() if k not in ("clip_length_frames", "stride_frames")}
        args["gpu_options"] = _decoder_options(
            job.frame_sizes(), job.hw_decoder_load, job.train, job.num_threads, job.on_gpu
        )  # fmt: skip
        return SourcePipeline(build_store_pipeline(feed, roi_feed=roi, start_method=method, build=build, **args))

    def open_ranges(self, job: RangeJob, *, build: bool = True):
        """A range's frames are one batch of images through one decoder, read in this thread.

        Worker processes for one pass over one video would cost more than its reads.
        """
        starts, last = job.starts, len(job.starts) - 1  # DALI may prefetch past the end: repeat the last range
        feed = StoreFrameFeed(
            lambda k: (np.zeros(1, dtype=np.int64), starts[min(k, last) : min(k, last) + 1]),
            [StoreRef.from_info(job.info)],
            clip_length_frames=job.chunk_frames,
            stride_frames=1,
            batch_size=1,
            mode=channel_mode({job.info.store}),
        )
        args = job.graph_args()
        for key in ("clip_length_frames", "stride_frames"):
            del args[key]
        # Evaluation's rule (all or nothing): a frame's decoder never depends on the rest of its range,
        # and is the one evaluation gives it.
        sizes = np.array([job.info.display_size])
        args["gpu_options"] = _decoder_options(sizes, job.hw_decoder_load, False, job.num_threads, job.on_gpu)
        return build_store_pipeline(
            feed, roi_feed=job.roi_feed(repeat=job.chunk_frames), parallel=False, build=build, **args
        )


class ScaledJpegSource(StoreSource):
    """On a CPU, JPEG stores decoded DCT-scaled in worker processes (see the module docs)."""

    frames_flat = False

    @staticmethod
    def takes(on_gpu: bool, infos) -> bool:
        """Whether a set of videos decodes this way: no GPU, and every one a store of JPEG frames."""
        return not on_gpu and bool(infos) and all(info.store and info.codec == "jpeg" for info in infos)

    def open_ranges(self, job: RangeJob, *, build: bool = True):
        """Not this source's: the sequential reader reads a store through the image decoder (``whole_clips=False``)."""
        raise NotImplementedError("the sequential reader reads frame stores with StoreSource")

    def open(self, job: ClipJob, *, build: bool = True) -> SourcePipeline:
        roi, regions = self._crop(job, relative=True)
        decoded = jpeg_decode_sizes(job.frame_sizes(), regions, job.size_px)
        # Fitted in the workers where every crop window falls on whole decoded pixels (stretch always).
        boxes = crop_boxes(job.frame_sizes(), decoded, job.size_px, job.fit)
        resizer = None if boxes is None else ClipResizer(job.size_px, boxes)
        clips = ScaledJpegClips(
            job.plan, _stores(job), decoded, batch_size=job.batch_size, resizer=resizer, **_shape(job), **_decode(job)
        )
        method = start_method(job, job.num_threads, "JPEG decoding")
        graph = FeedInput(clips, parallel=True, fitted=resizer is not None)
        roi = None if resizer is not None else roi
        return SourcePipeline(
            build_clip_pipeline(clip_input=graph, roi_feed=roi, start_method=method, build=build, **job.graph_args())
        )
