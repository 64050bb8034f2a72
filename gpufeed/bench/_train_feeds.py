"""The two ways ``gpufeed bench train`` feeds a training step: gpufeed's loaders and torch's DataLoader.

A *feed* turns one training run into a single stream of ``(epoch, batch index, batch)`` over
every epoch, with batches of gpufeed's own types (:class:`~gpufeed.pipelines.ImageBatch`,
:class:`~gpufeed.pipelines.ClipBatch`) on the training device, so one
:class:`~gpufeed.train._step.Stepper` consumes either. The loader is built inside the stream, on
its first ``next``: whatever a loader costs to start (a DALI pipeline, forking DataLoader workers)
lands in the first batch's wait, as it does in a real run. The loader lives as long as its
stream: dropping the stream (and collecting it) shuts its pipeline or worker processes down.

The DataLoader side is what a careful user writes, doing the same work per sample as gpufeed:

* images: PIL decodes the file, crops the epoch's window (the very windows gpufeed decodes:
  :func:`gpufeed.pipelines._windows.train_windows`, a pure function of (seed, epoch, id)), resizes it
  bilinearly, flips it, and returns uint8 HWC; the collated (N, S, S, 3) batch viewed as
  (N, 3, S, S) is channels_last, like gpufeed's, at no cost;
* clips: PyAV, files kept open per worker, seeks to the keyframe at or before the clip, decodes
  forward to its last frame, converts and resizes each wanted frame in one swscale pass (the
  filter gpufeed's PyAV path uses).

Both sides read the same samples in the same order (gpufeed's epoch plan). The DataLoader runs
one worker per core, pinned memory on a GPU, persistent workers and ``prefetch_factor``; its
batch is copied to the GPU inside the timed wait, asynchronously from its pinned memory: the step
is queued one ahead (:mod:`gpufeed.train._timeline`), and a blocking copy would wait for it to end.
The copies go to a CUDA stream of their own (:func:`to_device`), as gpufeed's loader's do
(:class:`~gpufeed.pipelines._pipeline_session.SideStreamCopies`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from gpufeed.core import SizePx, write_atomic
from gpufeed.pipelines import ClipBatch, ImageBatch, train_windows
from gpufeed.synth import make_bench_images

if TYPE_CHECKING:  # PyAV loads in the DataLoader's workers only
    from av.video.reformatter import VideoReformatter

__all__ = [
    "EpochKeys",
    "PilTrainImages",
    "PyAvSeekClips",
    "clip_batch",
    "copy_stream",
    "dataloader_feed",
    "epoch_window",
    "generated_image_list",
    "gpufeed_feed",
    "image_batch",
    "to_device",
]


class EpochKeys(torch.utils.data.Sampler):
    """The DataLoader's sampler: the keys gpufeed reads in each epoch, in its order.

    Lives in the main process (persistent workers only receive keys), so :meth:`set_epoch` works.
    """

    def __init__(self, keys_by_epoch: list[list]) -> None:
        self.keys_by_epoch = keys_by_epoch
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.keys_by_epoch[self.epoch])

    def __iter__(self):
        return iter(self.keys_by_epoch[self.epoch])


def epoch_window(
    dataset_sizes, sample_id: int, epoch: int, seed: int, image_cfg
) -> tuple[tuple[int, int, int, int], bool]:
    """``(PIL crop box, flip)`` of ``sample_id``'s training window in ``epoch``: the very window gpufeed decodes."""
    ids = np.array([sample_id], dtype=np.int64)
    size = image_cfg.size_px
    aspect = size.width_px / size.height_px
    window = train_windows(
        dataset_sizes[ids], ids, seed, epoch, image_cfg.crop_area, image_cfg.crop_aspect_ratio, image_cfg.flip, aspect
    )
    (x, y), (w, h) = window.anchor[0].tolist(), window.shape[0].tolist()
    return (x, y, x + w, y + h), bool(window.flip[0])


class PilTrainImages(torch.utils.data.Dataset):
    """PIL decode, the epoch's crop window, bilinear resize, flip; ``(uint8 (H, W, 3), label, id)``.

    Keys are ``(sample id, epoch)``: the window of a sample depends on the epoch, and workers
    cannot see an epoch counter set in the main process.
    """

    def __init__(self, dataset, image_cfg, seed: int) -> None:
        self.paths, self.sizes, self.labels = dataset.paths, dataset.sizes, dataset.labels
        self.image_cfg, self.size, self.seed = image_cfg, image_cfg.size_px, seed

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, key):
        from PIL import Image

        sample_id, epoch = key
        box, flip = epoch_window(self.sizes, sample_id, epoch, self.seed, self.image_cfg)
        with Image.open(self.paths[sample_id]) as img:
            out = img.convert("RGB").crop(box).resize(self.size, Image.BILINEAR)
        if flip:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(out).copy()), int(self.labels[sample_id]), sample_id


class PyAvSeekClips(torch.utils.data.Dataset):
    """Clips by keyframe seek with PyAV; ``(uint8 (T, H, W, 3), frame labels (T, K), video, start)``.

    Keys are ``(video id, start frame)``. Frame numbers come from timestamps and the stream's
    constant frame rate, as a user without gpufeed's index would compute them; a seek that lands
    after the clip's first frame is an error rather than a silently wrong clip.
    """

    def __init__(self, dataset, clip_length_frames: int, stride_frames: int, size_px: SizePx) -> None:
        self.paths, self.labels = dataset.paths, dataset.labels
        self.offsets = np.arange(clip_length_frames) * stride_frames
        self.size = size_px
        self._open: dict = {}
        self._reformatter: VideoReformatter | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self):
        return {**self.__dict__, "_open": {}, "_reformatter": None}  # open files stay in their process

    def _stream(self, path: str):
        import av

        if path not in self._open:
            container = av.open(path)
            stream = container.streams.video[0]
            stream.thread_count = 1  # one decoder per worker, one worker per core
            self._open[path] = (container, stream)
        return self._open[path]

    def _resize(self, frame) -> np.ndarray:
        if self._reformatter is None:
            from av.video.reformatter import Interpolation, VideoReformatter

            self._reformatter = VideoReformatter()
            self._flags = (
                Interpolation.AREA
                | Interpolation.ACCURATE_RND
                | Interpolation.FULL_CHR_H_INT
                | Interpolation.FULL_CHR_H_INP
            )
        width, height = self.size
        rgb = self._reformatter.reformat(
            frame, width=width, height=height, format="rgb24", interpolation=self._flags, threads=1
        )
        return rgb.to_ndarray()

    def __getitem__(self, key):
        video, start = key
        path = self.paths[video]
        container, stream = self._stream(path)
        frames_per_tick = float(stream.average_rate * stream.time_base)
        first_pts = stream.start_time or 0
        wanted = (start + self.offsets).tolist()
        container.seek(first_pts + round(start / frames_per_tick), stream=stream, backward=True, any_frame=False)
        out: list[np.ndarray] = []
        for frame in container.decode(stream):
            index = round((frame.pts - first_pts) * frames_per_tick)
            if not out and index > start:
                raise RuntimeError(f"{path}: seeking to frame {start} landed on frame {index}")
            if index == wanted[len(out)]:
                out.append(self._resize(frame))
                if len(out) == len(wanted):
                    break
        if len(out) != len(wanted):
            raise RuntimeError(f"{path}: decoded {len(out)} of the {len(wanted)} frames from {start}")
        labels = self.labels[video][wanted].astype(np.float32)
        return torch.from_numpy(np.stack(out)), torch.from_numpy(labels), video, start


def gpufeed_feed(make_loader, epochs: int):
    """gpufeed's loader over ``epochs`` epochs: ``(epoch, batch index, batch)``; built on the first ``next``."""
    loader = make_loader()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for index, batch in enumerate(loader):
            yield epoch, index, batch


@functools.cache
def copy_stream(device: torch.device) -> torch.cuda.Stream:
    """The DataLoader side's copy stream on ``device`` (one per device; high priority, as the loader's)."""
    return torch.cuda.Stream(device=device, priority=-1)


def to_device(device: torch.device, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """A collated batch's tensors on ``device``, without waiting on the host.

    On a GPU they are copied on :func:`copy_stream`, and the current stream waits for the copies
    there, on the GPU. On the current stream they would queue behind the step launched ahead and
    hold the device for their time (a batch of 256 images of 224 px is 38.5 MB: about 1.5 ms at
    PCIe 4's 25 GB/s), a cost gpufeed's loader, copying on a stream of its own, does not pay. Each
    copy is marked as used on the current stream, so its block is not reused before that use ends.
    """
    if device.type != "cuda":
        return [t.to(device, non_blocking=True) for t in tensors]
    side = copy_stream(device)
    with torch.cuda.stream(side):
        copies = [t.to(device, non_blocking=True) for t in tensors]
    consumer = torch.cuda.current_stream(device)
    consumer.wait_stream(side)
    for copy in copies:
        copy.record_stream(consumer)
    return copies


def image_batch(raw, device, valid) -> ImageBatch:
    """A collated ``(hwc, labels, ids)`` of :class:`PilTrainImages` as an :class:`ImageBatch` on ``device``."""
    hwc, labels, ids = raw
    # Asynchronous from pinned memory: the previous step is still queued on the stream (launch ahead).
    images, labels, ids = to_device(device, hwc, labels, ids)
    images = images.permute(0, 3, 1, 2)  # (N, 3, S, S) channels_last: a view
    return ImageBatch(images, labels, ids, valid[: len(images)])


def clip_batch(raw, device, valid, behaviours, centre: int) -> ClipBatch:
    """A collated batch of :class:`PyAvSeekClips` as a :class:`ClipBatch` on ``device``."""
    frames, frame_labels, videos, starts = raw
    clips, frame_labels, videos, starts = to_device(device, frames, frame_labels, videos, starts)
    return ClipBatch(
        clips=clips.permute(0, 4, 1, 2, 3),  # (N, 3, T, S, S): channels_last_3d
        frame_labels=frame_labels,
        centre_labels=frame_labels[:, centre].contiguous(),
        video_ids=videos,
        start_frames=starts,
        valid=valid[: len(clips)],
        behaviours=behaviours,
    )


def dataloader_feed(
    dataset, keys_by_epoch: list[list], *, batch_size, workers, prefetch_factor, device, to_batch=image_batch
):
    """torch's DataLoader over the same keys: ``(epoch, batch index, batch)`` on ``device``.

    Args:
        dataset: :class:`PilTrainImages`, :class:`PyAvSeekClips` or
            :class:`~gpufeed.bench._dense_feeds.PilDensePairs`.
        keys_by_epoch: Each epoch's keys, in gpufeed's order.
        to_batch: ``(collated, torch device, valid) -> batch`` of gpufeed's type for the dataset
            (:func:`image_batch`, :func:`clip_batch` with its behaviours and centre bound, ...).
    """
    torch_device = device.torch_device
    sampler = EpochKeys(keys_by_epoch)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=device.is_gpu,
        persistent_workers=True,
        prefetch_factor=prefetch_factor,
        drop_last=True,
    )
    valid = torch.ones(batch_size, dtype=torch.bool, device=torch_device)
    for epoch in range(len(keys_by_epoch)):
        sampler.set_epoch(epoch)
        for index, raw in enumerate(loader):
            yield epoch, index, to_batch(raw, torch_device, valid)


def generated_image_list(cache: Path, count: int, image_size: tuple[int, int], classes: int) -> Path:
    """``gpufeed bench loader``'s generated photos as a list file with labels ``i % classes``."""
    folder = make_bench_images(cache, count, *image_size)
    listing = folder / f"labels-{classes}.txt"
    if not listing.exists():
        photos = sorted((folder / "photos").glob("*.jpg"))
        write_atomic(listing, "".join(f"photos/{p.name} {i % classes}\n" for i, p in enumerate(photos)))
    return listing
