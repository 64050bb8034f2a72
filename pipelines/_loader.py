"""The image loader: DALIGenericIterator behind a small typed batch, epochs, resume, bad files.

Usage::

    loader = ImageLoader("photos/train", batch_size=64, size_px=224, train=True)
    # or, for full control: ImageLoader(dataset, image_cfg=cfg.image, loader_cfg=cfg.loader,
    #                                   device=resolve_device("auto"), shard_id=rank, num_shards=world)
    for epoch in range(epochs):
        for batch in loader:          # one epoch per iteration over the loader
            batch.images              # (N, 3, S, S) uint8, channels_last, on the device
            batch.labels, batch.sample_ids, batch.valid
    state = loader.state_dict()       # {"epoch", "batch", ...}: resume exactly here

The loader builds its DALI pipeline once and feeds it epoch after epoch (see
:mod:`gpufeed.pipelines._epochs`); ``loader.pipeline_builds`` counts builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.core import DataPath, split_member
from gpufeed.device import DeviceChoice
from gpufeed.pipelines._alternate import RoundRobin, StreamSlice
from gpufeed.pipelines._augment import LoaderAugment
from gpufeed.pipelines._class_folders import announce_split
from gpufeed.pipelines._dataset import ImageDataset
from gpufeed.pipelines._image_pipeline import ImageFeed, PathTable, build_image_pipeline
from gpufeed.pipelines._image_verify import find_bad_files
from gpufeed.pipelines._loader_args import loader_args, refuse_dataloader_arguments
from gpufeed.pipelines._pipeline_session import Session
from gpufeed.pipelines._quarantine import quarantined_ids
from gpufeed.pipelines._sample_loader import CropPolicy, SampleLoader
from gpufeed.pipelines._sampler import PlanStream, StreamBatch
from gpufeed.pipelines._shards import ShardBytes
from gpufeed.pipelines._split_folders import warn_split_root

if TYPE_CHECKING:
    import torch

__all__ = ["CropPolicy", "ImageBatch", "ImageLoader", "find_bad_files"]


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


class ImageLoader(SampleLoader):
    """Batches of decoded, cropped, resized images from an :class:`ImageDataset`.

    Epochs, resume and bad-file handling come from :class:`~gpufeed.pipelines._epochs.EpochLoader`.

    Every argument but ``dataset`` has a default; the shortcuts and how they meet the config
    objects are described in :mod:`gpufeed.pipelines._loader_args`.

    Args:
        dataset: The indexed split, or the path of a class-folder tree or a list file, indexed
            with :meth:`ImageDataset.from_folder` / :meth:`ImageDataset.from_list` (a folder of
            split folders, ``train/`` and ``val/``, is a warning: they would be its classes).
        batch_size: Samples per batch (per rank): ``loader_cfg.batch_size`` (default 64).
        size_px: Output side, or (width, height): ``image_cfg.size_px`` (default 224).
        train: Random-resized crops and flips (and shuffling) when True (default); centre crops
            in sample-id order when False.
        shuffle: Reshuffle every training epoch: ``loader_cfg.shuffle`` (default True).
        num_threads: DALI CPU threads: ``loader_cfg.num_threads`` (default 0: from the cores).
        seed: Seeds order, crop windows and augmentation.
        device: ``"auto"`` (default: the GPU when usable), ``"gpu"``, ``"cpu"``, torch's ``"cuda"``,
            ``"cuda:N"`` or a ``torch.device`` of those, or a :class:`gpufeed.device.DeviceChoice`.
        image_cfg: :class:`gpufeed.config.ImagePipelineConfig` for full control.
        loader_cfg: :class:`gpufeed.config.LoaderConfig` for full control. Evaluation always keeps
            every sample, so ``drop`` is read as ``partial`` there.
        shard_id, num_shards: This rank's shard (see :mod:`gpufeed.pipelines._sampler`); default:
            ``torch.distributed``'s rank and world size when it is initialised, else the whole split.
        augment: Colour jitter, grayscale and flips to apply inside the DALI graph when training
            (:class:`~gpufeed.pipelines._augment.LoaderAugment`); ``None`` or empty: none.
        classes: The class names in label order, for a path: indexed with them, so a validation
            split labels each class as training does (``classes=train_loader.dataset.classes``).
            With an :class:`ImageDataset`, they must equal its ``classes``.
        num_workers, drop_last, pin_memory: torch ``DataLoader``'s; refused (None only), each with
            gpufeed's equivalent: ``num_threads``, ``LoaderConfig(last_batch=...)``, none needed.

    Raises:
        ValueError: An argument is out of range or not allowed, or a shortcut disagrees with its
            config field (the message names the argument and what is allowed), or ``classes``
            differs from the given dataset's.
        DatasetError: ``train`` and a class of the dataset has no image (an empty class folder,
            or one of other formats only), named with its folder.
    """

    _reads_pipelines = True  # loader.pipelines: several pipelines in turn (pipelines/_alternate.py)

    def __init__(
        self,
        dataset: ImageDataset | str | Path,
        batch_size: int | None = None,
        *,
        size_px: int | tuple[int, int] | None = None,
        train: bool = True,
        shuffle: bool | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        device: DeviceChoice | str | torch.device = "auto",
        image_cfg: ImagePipelineConfig | None = None,
        loader_cfg: LoaderConfig | None = None,
        shard_id: int | None = None,
        num_shards: int | None = None,
        augment: LoaderAugment | None = None,
        classes: tuple[str, ...] | list[str] | None = None,
        num_workers: None = None,
        drop_last: None = None,
        pin_memory: None = None,
    ) -> None:
        refuse_dataloader_arguments("ImageLoader", num_workers=num_workers, drop_last=drop_last, pin_memory=pin_memory)
        names = _class_names(classes)
        args = loader_args(
            "ImageLoader",
            dataset,
            dataset_type=ImageDataset,
            index=lambda path: _index_images(path, names),
            train=train,
            device=device,
            loader_cfg=loader_cfg,
            loader_shortcuts={"batch_size": batch_size, "shuffle": shuffle, "num_threads": num_threads},
            media=(ImagePipelineConfig, image_cfg, "image_cfg"),
            media_shortcuts={"size_px": size_px},
            shard_id=shard_id,
            num_shards=num_shards,
        )
        data: ImageDataset = args.dataset
        if names is not None and data.classes != names:
            raise ValueError(
                f"ImageLoader: argument classes={list(names)} differ from the dataset's classes "
                f"{list(data.classes)} ({data.source}); index it with them (ImageDataset.from_folder(path, "
                "classes=...)), give the path instead, or leave classes out"
            )
        announce_split(data, train)  # ignored files in one line; a class with no image to train on is an error
        image_cfg, loader_cfg, device = args.media_cfg, args.loader_cfg, args.device
        shard_id, num_shards = args.shard_id, args.num_shards
        self.dataset = data
        self.image_cfg = image_cfg
        self.augment = augment if train and augment else None
        self._setup_epochs(
            train=train, loader_cfg=loader_cfg, device=device, shard_id=shard_id, num_shards=num_shards, seed=seed
        )
        self.quarantined = quarantined_ids(data.paths, getattr(loader_cfg, "quarantine_file", None), data.source)
        self._leave_out({i: why for i, why in data.problems.items() if i not in self.quarantined}, "file")
        self.skipped.update(self.quarantined)
        self._labels = data.labels
        # Identical on every rank: the index and the quarantine list are deterministic.
        usable = data.usable_ids
        self._usable = usable[~np.isin(usable, list(self.quarantined))] if self.quarantined else usable
        self._require_batches(len(self._usable) - len(self.read_failures), "samples")
        self.crops = CropPolicy.for_split(data.sizes, train, seed, image_cfg, image_cfg.size_px)
        # Encoded once: the feed hands DALI each batch's paths as bytes for fn.io.file.read.
        self._path_table = PathTable(list(data.paths))
        # Tar shards: the feed reads each sample's byte range itself (DALI's file reader reads whole files).
        self._shard_bytes = ShardBytes(list(data.paths)) if data.paths and split_member(data.paths[0]) else None

    # -- EpochLoader hooks --------------------------------------------------------------------
    def _pipeline(
        self,
        stream: PlanStream | StreamSlice,
        *,
        build: bool = True,
        num_threads: int | None = None,
        gpu_options: dict | None = None,
    ):
        """(pipeline, feed) over ``stream``; ``build=False``: defined only (see ``build_image_pipeline``).

        ``gpu_options``: the decoder's arguments when already worked out (several pipelines share them).
        """
        feed = ImageFeed(
            stream,
            self._path_table,
            self._labels,
            self.crops,
            augment=self.augment,
            seed=self.seed,
            reader=self._shard_bytes,
            # DALI asks for prefetch_queue_depth batches at once when it starts, then one per step.
            ahead_batches=self.cfg.prefetch_queue_depth + 1 if getattr(self.cfg, "feed_thread", True) else 0,
        )
        pipe = build_image_pipeline(
            feed,
            size_px=self.image_cfg.size_px,
            batch_size=self.batch_size,
            device_id=self.device.device_id,
            num_threads=num_threads or self.num_threads,
            prefetch_queue_depth=self.cfg.prefetch_queue_depth,
            seed=self.seed,
            gpu_options=gpu_options if gpu_options is not None else self._decoder_options(),
            executor=getattr(self.cfg, "executor", "auto"),
            build=build,
        )
        return pipe, feed

    def _open_session(self, stream: PlanStream) -> Session:
        if self.parallel_pipelines == 1:
            pipe, feed = self._pipeline(stream)
            session = self._iterator_session(pipe, stream, feed)
            session.resources.append(feed)  # its thread stops when the session closes
            return session
        # loader.pipelines: pipeline j decodes plan batches j, j + P, ... and they are read in turn.
        count = self.parallel_pipelines
        threads = max(1, self.num_threads // count)
        options = self._decoder_options()  # sized and logged once for all of them
        parts = [
            self._pipeline(StreamSlice(stream, j, count), num_threads=threads, gpu_options=options)
            for j in range(count)
        ]
        session = Session(RoundRobin([self._outputs_of(pipe) for pipe, _ in parts]), stream)
        session.resources.extend(feed for _, feed in parts)
        return session

    def _batch(self, out: dict, batch: StreamBatch, iteration: int) -> ImageBatch:
        meta = out["meta"]  # on the loader's device
        n = len(batch)
        # A pipeline tags its own iterations: with several, output k is its pipeline's (k // P)-th.
        expected = np.stack([np.full(n, iteration // self.parallel_pipelines), np.arange(n)], axis=1)
        self._row_checks(meta[:, :2], expected)
        return ImageBatch(
            out["images"].permute(0, 3, 1, 2), meta[:, 3].contiguous(), meta[:, 2].contiguous(), meta[:, 4].bool()
        )

    def _suspects(self, batches: list[StreamBatch]) -> list[tuple[int, str, None]]:
        return [(i, self.dataset.paths[i], None) for i in self._batch_ids(batches)]

    def _recheck(self, suspects) -> dict[int, str]:
        by_path = {path: sample_id for sample_id, path, _ in suspects}
        return {by_path[path]: why for path, why in find_bad_files(list(by_path), self.dataset.max_pixels)}


def _class_names(classes) -> tuple[str, ...] | None:
    """``classes`` as a tuple of names, or None; a bare string (one name's letters) or repeats are refused."""
    if classes is None:
        return None
    names = tuple(classes) if isinstance(classes, (list, tuple)) else ()
    if not names or not all(isinstance(n, str) and n for n in names) or len(set(names)) < len(names):
        raise ValueError(
            f"ImageLoader: argument classes={classes!r}: expected a list of distinct class names (non-empty "
            "strings) in label order, e.g. train_loader.dataset.classes"
        )
    return names


def _index_images(path: DataPath, classes: tuple[str, ...] | None) -> ImageDataset:
    """Index the path a loader was given: a list file, else class folders (split folders warned of)."""
    if path.is_file():
        return ImageDataset.from_list(path, classes)
    warn_split_root("ImageLoader", path)
    return ImageDataset.from_folder(path, classes)
