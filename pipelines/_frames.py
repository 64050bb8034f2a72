"""The sequential reader: every frame of a video once, in order, in chunks (inference, features).

Like DeepEthogram's ``VideoIterable``, but decoded on NVDEC where there is a GPU::

    reader = VideoFrameReader("mouse.mp4", size_px=SizePx(224, 224), chunk_frames=64, device=resolve_device("auto"))
    for chunk in reader:
        chunk.frames          # (C, 3, H, W) uint8 on the device; C = chunk_frames except at the end
        chunk.frame_indices   # (C,) int64, consecutive, starting at 0 for the first chunk

The reader asks its :class:`~gpufeed.pipelines._clip_source.ClipSource` (picked as for the clip
loader) for the pipeline of a pass (:meth:`~gpufeed.pipelines._clip_source.ClipSource.open_ranges`):
DALI's video reader reads consecutive ``chunk_frames`` ranges (the last range aligned to the
video's end; frames already returned are dropped); PyAV decodes the file once from start to end (no
seeks at all); frame stores (frame folders, HDF5 files) decode each range's images as the reader
reads ranges. All go through the clip graphs, so frames match the clip loader's frames for the same
``size_px``, ``fit`` and decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.core import SizePx
from gpufeed.pipelines._clip_pipeline import new_work_dir
from gpufeed.pipelines._clip_source import ClipSource, RangeJob
from gpufeed.pipelines._clip_sources import choose_clip_source
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._nvdec import gpu_capability
from gpufeed.pipelines._pipeline_session import SideStreamCopies
from gpufeed.pipelines._videos import VideoInfo, probe_video

if TYPE_CHECKING:
    import torch

__all__ = ["FrameChunk", "VideoFrameReader"]


@dataclass(frozen=True)
class FrameChunk:
    """Consecutive frames of one video.

    Attributes:
        frames: (C, 3, H, W) torch.uint8 RGB, contiguous NCHW, on the reader's device.
        frame_indices: (C,) torch.int64 frame numbers (presentation order), on the host whatever the
            frames' device: a reader of them waits for no GPU work.
    """

    frames: torch.Tensor
    frame_indices: torch.Tensor

    def __len__(self) -> int:
        return int(self.frames.shape[0])


class VideoFrameReader:
    """Read one video's frames in order.

    Args:
        video: A path, or its :class:`VideoInfo` from the index.
        size_px, fit: Output size (a :class:`~gpufeed.config.SizePx`) and ``stretch`` / ``centre_crop``, as
            ``video.size_px`` / ``video.fit``.
        chunk_frames: Frames per chunk.
        device: :class:`gpufeed.device.DeviceChoice`.
        decoder: ``auto`` / ``dali`` / ``pyav``, chosen as for the clip loader.
        num_threads: DALI CPU threads.
        hw_decoder_load: ``loader.hw_decoder_load`` of the run (frame stores on a GPU): the JPEG frames
            take evaluation's decoder for it, all of them the hardware one unless it is 0.

    Raises:
        DatasetError: The video cannot be used (the reason names the file).
    """

    def __init__(
        self,
        video,
        *,
        size_px: SizePx = SizePx(112, 112),
        fit: str = "stretch",
        chunk_frames: int = 64,
        device,
        decoder="auto",
        num_threads=1,
        hw_decoder_load: float = 0.9,
    ):
        info = video if isinstance(video, VideoInfo) else probe_video(video)  # a path, or s3://
        if info.problem:
            raise DatasetError(f"{info.path}: {info.problem}")
        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
        self.info = info
        self.size, self.fit, self.device, self.num_threads = size_px, fit, device, num_threads
        self.hw_decoder_load = hw_decoder_load
        self.chunk_frames = min(chunk_frames, info.num_frames)
        self.clip_source: ClipSource = choose_clip_source(
            decoder, device.is_gpu, [info], info.path, gpu_capability(device), whole_clips=False
        )
        n, c = info.num_frames, self.chunk_frames
        starts = np.arange(0, n, c, dtype=np.int64)
        if self.clip_source.full_ranges:
            starts[-1] = min(starts[-1], n - c)  # every range holds c frames; the last one ends at the end
        self._starts = starts

    @property
    def source(self) -> str:
        """The name of the source that decodes: ``dali``, ``pyav`` or ``frames``."""
        return self.clip_source.name

    @property
    def decoder_reason(self) -> str:
        """Why that source."""
        return self.clip_source.reason

    def __len__(self) -> int:
        return len(self._starts)

    def __iter__(self):
        """Every frame once, in order. Each pass builds one pipeline for this video (tens of ms)."""
        import torch
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        work = new_work_dir()
        try:
            rows = len(self._starts)
            pipe = self._pipeline(Path(work.name))
            torch_device = self.device.torch_device
            # Exactly one output per range: the reader's list and the feed both wrap or repeat after it.
            # On a GPU the copies run on a stream of their own, and the tags are read there: on the
            # current stream they would queue behind the model's work (the loaders' SideStreamCopies).
            copies = SideStreamCopies(pipe, ["frames", "rows"], torch_device) if self.device.is_gpu else None
            iterator = copies or DALIGenericIterator(pipe, ["frames", "rows"], auto_reset=False)
            done = 0  # frames already yielded: the end-aligned last range overlaps them
            by_frame = self.clip_source.ranges_tagged_by_frame
            for expected in range(rows):
                out = next(iterator)[0]
                tags = out["rows"].view(-1)  # one per range, or one per frame of it (frame stores)
                if copies is not None and tags.is_cuda:
                    with torch.cuda.stream(copies.stream):
                        tags = tags.cpu()  # waits for this chunk's copy only
                want = int(self._starts[expected]) if by_frame else expected
                if int(tags.min()) != want or int(tags.max()) != want:
                    what = f"the range from frame {want}" if by_frame else f"frame range {expected}"
                    raise RuntimeError(f"{self.info.path}: tag {int(tags.min())} arrived where {what} was expected")
                frames = out["frames"] if self.clip_source.frames_flat else out["frames"][0]
                first = int(self._starts[expected])
                skip = max(0, done - first)
                frames = frames[skip:]
                indices = torch.arange(first + skip, first + skip + len(frames))  # host: reading them never syncs
                done = first + skip + len(frames)
                yield FrameChunk(frames.to(torch_device).contiguous(), indices)
            if done != self.info.num_frames:
                raise DatasetError(f"{self.info.path}: read {done} frames, the index lists {self.info.num_frames}")
        finally:
            work.cleanup()

    def _pipeline(self, work: Path, build: bool = True):
        """The pipeline of one pass: one output per range (the reader's list and the feeds wrap or repeat).

        ``build=False``: defined, not built (the tests read its graph).
        """
        job = RangeJob(
            self.info,
            self._starts,
            self.chunk_frames,
            self.size,
            self.fit,
            self.device.device_id,
            self.num_threads,
            work,
            self.hw_decoder_load,
        )
        return self.clip_source.open_ranges(job, build=build)
