"""What the image and dense loaders share: one dataset sample per plan unit, cropped by a :class:`CropPolicy`.

:class:`~gpufeed.pipelines.ImageLoader` (an image and its label) and
:class:`~gpufeed.pipelines.DenseLoader` (an image and its target maps) both plan over the
dataset's usable sample ids, leave out the ids whose files failed to read, crop every sample with
the same windows, and read DALI's outputs through one reader (``DALIGenericIterator`` on a CPU, the
reader of ``loader.executor`` on a GPU); this module holds those parts once. The clip loader plans
over clip slots instead and has its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from gpufeed.pipelines._decoder_options import gpu_decoder_options
from gpufeed.pipelines._epochs import EpochLoader
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._next_phases import timed_pipeline
from gpufeed.pipelines._pipeline_session import Session, gpu_outputs
from gpufeed.pipelines._sampler import PlanStream, StreamBatch
from gpufeed.pipelines._windows import Windows, eval_windows, train_windows

__all__ = ["CropPolicy", "SampleLoader"]

log = logging.getLogger("gpufeed")


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

    @classmethod
    def for_split(cls, sizes, train: bool, seed: int, image_cfg, size: tuple[int, int]) -> CropPolicy:
        """The policy ``image_cfg`` (crop area, ratio, flip, eval crop) gives a split of ``sizes`` at output (width, height)."""
        c = image_cfg
        width, height = size
        return cls(
            np.asarray(sizes),
            train,
            seed,
            c.crop_area,
            c.crop_aspect_ratio,
            c.flip,
            c.eval_crop_fraction,
            width / height,
        )

    def __call__(self, ids: np.ndarray, epoch: int) -> Windows:
        sizes = self.sizes[ids]
        if self.train:
            return train_windows(
                sizes, ids, self.seed, epoch, self.crop_area, self.crop_aspect_ratio, self.flip, self.output_aspect
            )
        return eval_windows(sizes, self.eval_crop_fraction, self.output_aspect)


class SampleLoader(EpochLoader):
    """An :class:`EpochLoader` whose plan units are the dataset's usable sample ids (``self._usable``)."""

    _usable: np.ndarray

    def _plan_ids(self) -> np.ndarray:
        return self._usable

    def _excluded_plan_ids(self) -> list[int]:
        return sorted(self.read_failures)

    def _require_batches(self, usable: int, what: str) -> None:
        """Fail at construction when this shard's first epoch would have no batch at all."""
        if self._plan(0).num_batches == 0:
            raise DatasetError(
                f"shard {self.shard_id} of {self.num_shards} gets no batches: {usable} usable {what} in "
                f"{self.dataset.source}, batch_size {self.batch_size}, last_batch '{self.last_batch}'. "
                "Use a smaller batch_size, or a partial last batch: loader.last_batch: partial in a config, "
                'LoaderConfig(last_batch="partial") as loader_cfg in Python.'
            )

    def _decoder_options(self) -> dict:
        """The ``mixed`` RGB decoder's arguments (:func:`gpu_decoder_options`): ``loader.hw_decoder_load``
        in training, all or nothing in evaluation (the server's), nvJPEG's buffers sized for the
        usable samples' images."""
        usable = self._usable
        sizes = np.asarray(self.dataset.sizes)[usable] if len(usable) else np.ones((1, 2), dtype=np.int64)
        options, self.decoder_memory = gpu_decoder_options(
            sizes, getattr(self.cfg, "hw_decoder_load", 0.9), train=self.train, num_threads=self.num_threads
        )
        if self.device.is_gpu:
            log.info("%s loader: %s", "train" if self.train else "eval", self.decoder_memory)
        return options

    def _outputs_of(self, pipe, outputs: tuple[str, ...] = ()):
        """The iterator over ``pipe``'s outputs ``images, meta, *outputs`` (meta on the loader's device)."""
        from nvidia.dali.plugin.pytorch import DALIGenericIterator

        if self.device.is_gpu:  # the reader of its executor (loader.executor)
            return gpu_outputs(pipe, ["images", "meta", *outputs], self.device.torch_device)
        # No reader and no size: the iterator runs as long as the feed does, epoch after epoch; on
        # the static executor (loader.executor: static) it copies each output out, as on a GPU.
        timed_pipeline(pipe)  # NEXT_PHASES, as the GPU readers do
        return DALIGenericIterator(pipe, ["images", "meta", *outputs], auto_reset=False, prepare_first_batch=False)

    def _iterator_session(self, pipe, stream: PlanStream, feed, outputs: tuple[str, ...] = ()) -> Session:
        """The iterator over ``pipe`` (:meth:`_outputs_of`) as a session."""
        return Session(self._outputs_of(pipe, outputs), stream, feed=feed)

    @staticmethod
    def _batch_ids(batches: list[StreamBatch]) -> list[int]:
        """The distinct sample ids of ``batches``, in order: the rows a failure may come from."""
        return list(dict.fromkeys(int(i) for batch in batches for i in batch.sample_ids))
