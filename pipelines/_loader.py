"""The image loader: DALIGenericIterator behind a small typed batch, epochs, resume, bad files.

Usage::

    loader = ImageLoader(dataset, train=True, image_cfg=cfg.image, loader_cfg=cfg.loader,
                         device=resolve_device("auto"), shard_id=rank, num_shards=world)
    for epoch in range(epochs):
        for batch in loader:          # one epoch per iteration over the loader
            batch.images              # (N, 3, S, S) uint8, channels_last, on the device
            batch.labels, batch.sample_ids, batch.valid
    state = loader.state_dict()       # {"epoch", "batch", ...}: resume exactly here

The loader builds its DALI pipeline once and feeds it epoch after epoch (see
:mod:`gpufeed.pipelines._epochs`); ``loader.pipeline_builds`` counts builds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.pipelines._augment import LoaderAugment
from gpufeed.pipelines._dataset import ImageDataset
from gpufeed.pipelines._epochs import EpochLoader, Session
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._image_pipeline import ImageFeed, PathTable, build_image_pipeline, gpu_decoder_options
from gpufeed.pipelines._image_verify import find_bad_files
from gpufeed.pipelines._quarantine import quarantined_ids
from gpufeed.pipelines._sampler import PlanStream, StreamBatch
from gpufeed.pipelines._windows import Windows, eval_windows, train_windows

if TYPE_CHECKING:
    import torch

__all__ = ["ImageBatch", "ImageLoader", "find_bad_files"]

log = logging.getLogger("gpufeed")


@dataclass(frozen=True)
class ImageBatch:
    """One batch from :class:`ImageLoader`.

    Attributes:
        images: (N, 3, S, S) torch.uint8 RGB, channels_last memory format, on the loader's device.
        labels: (N,) torch.int64 class indices, same device.
        sample_ids: (N,) torch.int64 positions in the dataset index, same device.
        valid: (N,) torch.bool, False for padding rows (``last_batch: pad`` only).
    """

    images: torch.Tensor
    labels: torch.Tensor
    sample_ids: torch.Tensor
    valid: torch.Tensor

    def __len__(self) -> int:
        return int(self.images.shape[0])


@dataclass(frozen=True, eq=False)
class CropPolicy:
    """The crop windows of a split: ``policy(sample_ids, epoch) -> Windows``, a pure function.

    Training: random-resized crops and flips from (seed, epoch, sample id); evaluation: centre
    windows of the output's shape (``output_aspect``: width / height). Held by the pipeline's
    feed, so it carries only what it needs.
    """

    sizes: np.ndarray
    train: bool
    seed: int
    crop_area: tuple[float, float]
    crop_aspect_ratio: tuple[float, float]
    flip: bool
    eval_crop_fraction: float
    output_aspect: float = 1.0

    def __call__(self, ids: np.ndarray, epoch: int) -> Windows:
        sizes = self.sizes[ids]
        if self.train:
            return train_windows(
                sizes, ids, self.seed, epoch, self.crop_area, self.crop_aspect_ratio, self.flip, self.output_aspect
            )
        return eval_windows(sizes, self.eval_crop_fraction, self.output_aspect)


class ImageLoader(EpochLoader):
    """Batches of decoded, cropped, resized images from an :class:`ImageDataset`.

    Epochs, resume and bad-file handling come from :class:`~gpufeed.pipelines._epochs.EpochLoader`.

    Args:
        dataset: The indexed split.
        train: Random-resized crops and flips (and ``loader_cfg.shuffle``) when True; centre crops
            in sample-id order when False.
        image_cfg: :class:`gpufeed.config.ImagePipelineConfig`.
        loader_cfg: :class:`gpufeed.config.LoaderConfig`. Evaluation always keeps every sample,
            so ``drop`` is read as ``partial`` there.
        device: :class:`gpufeed.device.DeviceChoice`.
        shard_id, num_shards: This rank's shard (see :mod:`gpufeed.pipelines._sampler`).
        seed: Seeds order, crop windows and augmentation.
        augment: Colour jitter, grayscale and flips to apply inside the DALI graph when training
            (:class:`~gpufeed.pipelines._augment.LoaderAugment`); ``None`` or empty: none.
    """

    def __init__(
        self,
        dataset: ImageDataset,
        *,
        train: bool,
        image_cfg,
        loader_cfg,
        device,
        shard_id: int = 0,
        num_shards: int = 1,
        seed: int = 0,
        augment: LoaderAugment | None = None,
    ) -> None:
        self.dataset = dataset
        self.image_cfg = image_cfg
        self.augment = augment if train and augment else None
        self._setup_epochs(
            train=train, loader_cfg=loader_cfg, device=device, shard_id=shard_id, num_shards=num_shards, seed=seed
        )
        self.quarantined = quarantined_ids(dataset.paths, getattr(loader_cfg, "quarantine_file", None), dataset.source)
        self._leave_out({i: why for i, why in dataset.problems.items() if i not in self.quarantined}, "file")
        self.skipped.update(self.quarantined)
        self._labels = dataset.labels
        # Identical on every rank: the index and the quarantine list are deterministic.
        usable = dataset.usable_ids
        self._usable = usable[~np.isin(usable, list(self.quarantined))] if self.quarantined else usable
        if self._plan(0).num_batches == 0:
            usable_count = len(self._usable) - len(self.read_failures)
            raise DatasetError(
                f"shard {self.shard_id} of {self.num_shards} gets no batches: {usable_count} usable samples in "
                f"{self.dataset.source}, batch_size {self.batch_size}, last_batch '{self.last_batch}'. "
                "Use a smaller batch_size or last_batch: partial."
            )
        c = image_cfg
        out = c.output_size
        self.crops = CropPolicy(
            np.asarray(dataset.sizes),
            train,
            seed,
            c.crop_area,
            c.crop_aspect_ratio,
            c.flip,
            c.eval_crop_fraction,
            out.width_px / out.height_px,
        )
        # Encoded once: the feed hands DALI each batch's paths as bytes for fn.io.file.read.
        self._path_table = PathTable(list(dataset.paths))

    # -- EpochLoader hooks --------------------------------------------------------------------
    def _plan_ids(self) -> np.ndarray:
        return self._usable

    def _excluded_plan_ids(self) -> list[int]:
        return sorted(self.read_failures)

    def _decoder_options(self) -> dict:
        usable = self._usable
        sizes = np.asarray(self.dataset.sizes)[usable] if len(usable) else np.ones((1, 2), dtype=np.int64)
        options, self.decoder_memory = gpu_decoder_options(
            sizes, getattr(self.cfg, "hw_decoder_load", 0.9), train=self.train, num_threads=self.num_threads
        )
        if self.device.is_gpu:
            log.info("%s loader: %s", "train" if self.train else "eval", self.decoder_memory)
        return options

    def _open_session(self, stream: PlanStream) -> Session:
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        feed = ImageFeed(stream, self._path_table, self._labels, self.crops, augment=self.augment, seed=self.seed)
        pipe = build_image_pipeline(
            feed,
            size_px=self.image_cfg.output_size,
            batch_size=self.batch_size,
            device_id=self.device.device_id,
            num_threads=self.num_threads,
            prefetch_queue_depth=self.cfg.prefetch_queue_depth,
            seed=self.seed,
            gpu_options=self._decoder_options(),
        )
        names = ["images", "meta", "meta_gpu"] if self.device.is_gpu else ["images", "meta"]
        # No reader and no size: the iterator runs as long as the feed does, epoch after epoch.
        iterator = DALIGenericIterator(pipe, names, auto_reset=False, prepare_first_batch=False)
        return Session(iterator, stream, feed=feed)

    def _batch(self, out: dict, batch: StreamBatch, iteration: int) -> ImageBatch:
        meta = out["meta"]
        n = len(batch)
        expected = np.stack([np.full(n, iteration), np.arange(n)], axis=1)
        self._check_rows(meta[:, :2].numpy(), expected)
        on_device = out.get("meta_gpu", meta)
        return ImageBatch(
            out["images"].permute(0, 3, 1, 2),
            on_device[:, 3].contiguous(),
            on_device[:, 2].contiguous(),
            on_device[:, 4].bool(),
        )

    def _suspects(self, batches: list[StreamBatch]) -> list[tuple[int, str, None]]:
        ids = dict.fromkeys(int(i) for batch in batches for i in batch.sample_ids)
        return [(i, self.dataset.paths[i], None) for i in ids]

    def _recheck(self, suspects) -> dict[int, str]:
        by_path = {path: sample_id for sample_id, path, _ in suspects}
        return {by_path[path]: why for path, why in find_bad_files(list(by_path), self.dataset.max_pixels)}
