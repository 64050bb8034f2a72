"""The image loader: DALIGenericIterator behind a small typed batch, epochs, resume, bad files.

Usage::

    loader = ImageLoader(dataset, train=True, image_cfg=cfg.image, loader_cfg=cfg.loader,
                         device=resolve_device("auto"), shard_id=rank, num_shards=world)
    for epoch in range(epochs):
        for batch in loader:          # one epoch per iteration over the loader
            batch.images              # (N, 3, S, S) uint8, channels_last, on the device
            batch.labels, batch.sample_ids, batch.valid
    state = loader.state_dict()       # {"epoch", "batch", ...}: resume exactly here
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from gpufeed.pipelines._augment import AugmentRows, LoaderAugment
from gpufeed.pipelines._dataset import ImageDataset
from gpufeed.pipelines._epochs import EpochLoader
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._image_pipeline import READER_NAME, build_image_pipeline
from gpufeed.pipelines._quarantine import quarantined_ids
from gpufeed.pipelines._sampler import EpochPlan
from gpufeed.pipelines._windows import Windows, eval_windows, train_windows

__all__ = ["ImageBatch", "ImageLoader", "find_bad_files"]


@dataclass(frozen=True)
class ImageBatch:
    """One batch from :class:`ImageLoader`.

    Attributes:
        images: (N, 3, S, S) torch.uint8 RGB, channels_last memory format, on the loader's device.
        labels: (N,) torch.int64 class indices, same device.
        sample_ids: (N,) torch.int64 positions in the dataset index, same device.
        valid: (N,) torch.bool, False for padding rows (``last_batch: pad`` only).
    """

    images: object
    labels: object
    sample_ids: object
    valid: object

    def __len__(self) -> int:
        return int(self.images.shape[0])


def find_bad_files(paths: list[str]) -> list[tuple[str, str]]:
    """Fully decode each file with PIL and return ``(path, reason)`` for those that fail."""
    from PIL import Image

    bad = []
    for path in dict.fromkeys(paths):
        try:
            with Image.open(path) as img:
                img.load()
        except Exception as err:  # PIL raises several types for damaged data; all mean "bad"
            bad.append((path, f"cannot be decoded: {err}"))
    return bad


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

    def _windows(self, ids: np.ndarray) -> Windows:
        sizes = self.dataset.sizes[ids]
        if self.train:
            c = self.image_cfg
            return train_windows(sizes, ids, self.seed, self.epoch, c.crop_area, c.crop_aspect_ratio, c.flip)
        return eval_windows(sizes, self.image_cfg.eval_crop_fraction)

    # -- EpochLoader hooks --------------------------------------------------------------------
    def _plan_ids(self) -> np.ndarray:
        return self._usable

    def _excluded_plan_ids(self) -> list[int]:
        return sorted(self.read_failures)

    def _open_epoch(self, plan: EpochPlan):
        import torch

        # Looked up on the CPU (DALI returns positions there), then moved with the batch.
        return (
            torch.as_tensor(plan.sample_ids),
            torch.as_tensor(self._labels[plan.sample_ids]),
            torch.as_tensor(plan.valid),
        )

    def _iterator(self, plan: EpochPlan, ctx):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        windows, rows = self._windows(plan.sample_ids), None
        if self.augment is not None:  # augmentation seam: flips toggle the windows', colour goes to the graph
            rows = self.augment.rows(self.seed, plan.epoch, plan.sample_ids)
            if rows.flip is not None:
                windows = replace(windows, flip=windows.flip ^ rows.flip.astype(np.uint8))
            rows = AugmentRows(colour=rows.colour)
        pipe = build_image_pipeline(
            [self.dataset.paths[i] for i in plan.sample_ids],
            windows,
            size_px=self.image_cfg.size_px,
            batch_size=self.batch_size,
            device_id=self.device.device_id,
            num_threads=self.num_threads,
            prefetch_queue_depth=self.cfg.prefetch_queue_depth,
            seed=self.seed,
            augment=rows,
        )
        return DALIGenericIterator(
            pipe,
            ["images", "positions"],
            reader_name=READER_NAME,
            last_batch_policy=LastBatchPolicy.PARTIAL,
            auto_reset=False,
        )

    def _batch(self, out: dict, plan: EpochPlan, ctx) -> ImageBatch:
        ids_t, labels_t, valid_t = ctx
        device = self.device.torch_device
        pos = out["positions"].view(-1).long().cpu()
        return ImageBatch(
            out["images"].permute(0, 3, 1, 2),
            labels_t[pos].to(device, non_blocking=True),
            ids_t[pos].to(device, non_blocking=True),
            valid_t[pos].to(device, non_blocking=True),
        )

    def _suspects(self, plan: EpochPlan, ctx, rows: slice) -> list[tuple[int, str, None]]:
        return [(int(i), self.dataset.paths[i], None) for i in dict.fromkeys(plan.sample_ids[rows].tolist())]

    def _recheck(self, suspects) -> dict[int, str]:
        by_path = {path: sample_id for sample_id, path, _ in suspects}
        return {by_path[path]: why for path, why in find_bad_files(list(by_path))}
