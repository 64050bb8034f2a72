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

import logging
import os
import re
from dataclasses import dataclass

import numpy as np

from gpufeed.pipelines._dataset import ImageDataset
from gpufeed.pipelines._errors import BAD_FILE_HINT, BadSampleError, DatasetError
from gpufeed.pipelines._image_pipeline import READER_NAME, build_image_pipeline
from gpufeed.pipelines._sampler import EpochPlan, plan_epoch
from gpufeed.pipelines._windows import Windows, eval_windows, train_windows

__all__ = ["ImageBatch", "ImageLoader", "find_bad_files", "quarantined_ids"]

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


def quarantined_ids(paths, quarantine_file, source: str) -> dict[int, str]:
    """Sample ids of ``paths`` that ``loader.quarantine_file`` lists, with the reason (empty without one)."""
    if quarantine_file is None:
        return {}
    from gpufeed.pipelines._quarantine import read_quarantine

    quarantine = read_quarantine(quarantine_file)
    found = {i: quarantine.reason for i in quarantine.ids_in(paths)}
    if found:
        log.info("leaving out %d quarantined file(s) of %s (listed in %s)", len(found), source, quarantine.source)
    return found


def default_num_threads() -> int:
    """One DALI thread per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class ImageLoader:
    """Batches of decoded, cropped, resized images from an :class:`ImageDataset`.

    Args:
        dataset: The indexed split.
        train: Random-resized crops and flips (and ``loader_cfg.shuffle``) when True; centre crops
            in sample-id order when False.
        image_cfg: :class:`gpufeed.config.ImagePipelineConfig`.
        loader_cfg: :class:`gpufeed.config.LoaderConfig`. Evaluation always keeps every sample,
            so ``drop`` is read as ``partial`` there.
        device: :class:`gpufeed.device.DeviceChoice`.
        shard_id, num_shards: This rank's shard (see :mod:`gpufeed.pipelines._sampler`).
        seed: Seeds order and crop windows.
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
    ) -> None:
        self.dataset = dataset
        self.train = train
        self.image_cfg = image_cfg
        self.cfg = loader_cfg
        self.device = device
        self.shard_id, self.num_shards, self.seed = shard_id, num_shards, seed
        self.batch_size = loader_cfg.batch_size
        self.last_batch = loader_cfg.last_batch if train or loader_cfg.last_batch == "pad" else "partial"
        self.num_threads = loader_cfg.num_threads or default_num_threads()
        self.epoch = 0
        self._start_batch = 0
        self.skipped: dict[int, str] = {}  # every sample left out, with why
        self.read_failures: dict[int, str] = {}  # the subset found bad while decoding
        self.quarantined = quarantined_ids(dataset.paths, getattr(loader_cfg, "quarantine_file", None), dataset.source)
        bad = {i: why for i, why in dataset.problems.items() if i not in self.quarantined}
        if bad and loader_cfg.on_bad_sample == "error":
            first = "; ".join(f"{dataset.paths[i]}: {why}" for i, why in list(bad.items())[:5])
            raise DatasetError(
                f"{len(bad)} file(s) in {dataset.source} cannot be used: {first}"
                f"{' ...' if len(bad) > 5 else ''}. {BAD_FILE_HINT}"
            )
        if bad:
            log.warning("skipping %d unusable file(s) in %s (loader.on_bad_sample: skip)", len(bad), dataset.source)
            self.skipped.update(bad)
        self.skipped.update(self.quarantined)
        self._labels = dataset.labels
        # Identical on every rank: the index and the quarantine list are deterministic.
        usable = dataset.usable_ids
        self._usable = usable[~np.isin(usable, list(self.quarantined))] if self.quarantined else usable
        self._check_plan(self._plan(0))

    # -- planning ---------------------------------------------------------------------------
    def _plan(self, start_batch: int) -> EpochPlan:
        return plan_epoch(
            self._usable,
            epoch=self.epoch,
            seed=self.seed,
            shuffle=self.train and self.cfg.shuffle,
            shard_id=self.shard_id,
            num_shards=self.num_shards,
            batch_size=self.batch_size,
            last_batch=self.last_batch,
            start_batch=start_batch,
            excluded=sorted(self.read_failures),
        )

    def _check_plan(self, plan: EpochPlan) -> None:
        if plan.num_batches == 0:
            usable = len(self._usable) - len(self.read_failures)
            raise DatasetError(
                f"shard {self.shard_id} of {self.num_shards} gets no batches: {usable} usable samples in "
                f"{self.dataset.source}, batch_size {self.batch_size}, last_batch '{self.last_batch}'. "
                "Use a smaller batch_size or last_batch: partial."
            )

    def _windows(self, ids: np.ndarray) -> Windows:
        sizes = self.dataset.sizes[ids]
        if self.train:
            c = self.image_cfg
            return train_windows(sizes, ids, self.seed, self.epoch, c.crop_area, c.crop_aspect_ratio, c.flip)
        return eval_windows(sizes, self.image_cfg.eval_crop_fraction)

    # -- the public surface -----------------------------------------------------------------
    def __len__(self) -> int:
        """Batches in the current epoch (all of them, including any already consumed)."""
        return self._plan(0).num_batches

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the beginning of ``epoch``."""
        self.epoch, self._start_batch = epoch, 0

    def state_dict(self) -> dict:
        """Where the loader is: resume with :meth:`load_state_dict` on an identically built loader."""
        return {
            "epoch": self.epoch,
            "batch": self._start_batch,
            "seed": self.seed,
            "read_failures": sorted(self.read_failures),
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed", self.seed) != self.seed:
            raise ValueError(f"loader state was saved with seed {state['seed']}, this loader uses seed {self.seed}")
        self.epoch, self._start_batch = int(state["epoch"]), int(state["batch"])
        for sample_id in state.get("read_failures", []):
            why = "failed to decode before the resume"
            self.read_failures.setdefault(int(sample_id), why)
            self.skipped.setdefault(int(sample_id), why)

    def __iter__(self):
        """Yield the rest of the current epoch, then advance to the next epoch."""
        import torch

        while True:
            plan = self._plan(self._start_batch)
            if len(plan.sample_ids) == 0:
                break
            torch_device = self.device.torch_device
            # Looked up on the CPU (DALI returns positions there), then moved with the batch.
            ids_t = torch.as_tensor(plan.sample_ids)
            labels_t = torch.as_tensor(self._labels[plan.sample_ids])
            valid_t = torch.as_tensor(plan.valid)
            iterator = None
            failed = None
            batch_index = self._start_batch
            while True:
                try:
                    # DALIGenericIterator runs the first batch in its constructor, so build it here.
                    iterator = iterator or self._iterator(plan)
                    out = next(iterator)[0]
                except StopIteration:
                    break
                except RuntimeError as err:
                    failed = err
                    break
                pos = out["positions"].view(-1).long().cpu()
                images = out["images"].permute(0, 3, 1, 2)
                batch = ImageBatch(
                    images,
                    labels_t[pos].to(torch_device, non_blocking=True),
                    ids_t[pos].to(torch_device, non_blocking=True),
                    valid_t[pos].to(torch_device, non_blocking=True),
                )
                batch_index += 1
                self._start_batch = batch_index
                yield batch
            if failed is None:
                break
            self._handle_failure(failed, plan, batch_index)
        self.epoch += 1
        self._start_batch = 0

    # -- internals ----------------------------------------------------------------------------
    def _iterator(self, plan: EpochPlan):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        files = [self.dataset.paths[i] for i in plan.sample_ids]
        pipe = build_image_pipeline(
            files,
            self._windows(plan.sample_ids),
            size_px=self.image_cfg.size_px,
            batch_size=self.batch_size,
            device_id=self.device.device_id,
            num_threads=self.num_threads,
            prefetch_queue_depth=self.cfg.prefetch_queue_depth,
            seed=self.seed,
        )
        return DALIGenericIterator(
            pipe,
            ["images", "positions"],
            reader_name=READER_NAME,
            last_batch_policy=LastBatchPolicy.PARTIAL,
            auto_reset=False,
        )

    def _handle_failure(self, err: RuntimeError, plan: EpochPlan, batch_index: int) -> None:
        """Name the file(s) behind a pipeline failure; skip them or raise :class:`BadSampleError`."""
        first = (batch_index - plan.start_batch) * self.batch_size
        # DALI may have been decoding a few batches ahead when it failed.
        span = plan.sample_ids[first : first + self.batch_size * (self.cfg.prefetch_queue_depth + 1)]
        candidates = [self.dataset.paths[i] for i in span]
        message = str(err)
        named = [p for p in dict.fromkeys(candidates) if re.search(re.escape(p) + r"\b", message)]
        problems = [(p, "DALI failed to decode it") for p in named] or find_bad_files(candidates)
        if not problems:
            raise BadSampleError(
                [(p, "in the failing batch") for p in dict.fromkeys(candidates)],
                detail=f" DALI said: {message.strip().splitlines()[-1] if message.strip() else message}",
            ) from err
        if self.cfg.on_bad_sample == "error":
            raise BadSampleError(problems) from err
        path_to_id = {self.dataset.paths[i]: int(i) for i in span}
        for path, why in problems:
            self.skipped[path_to_id[path]] = why
            self.read_failures[path_to_id[path]] = why
            log.warning("skipping bad sample %s: %s", path, why)
        self._start_batch = batch_index
