"""``gpufeed bench train --task depth``'s DataLoader side: PIL decodes both files of a pair, crops both.

What a careful user writes, doing the same work per sample as gpufeed's
:class:`~gpufeed.pipelines.DenseLoader`: PIL decodes the RGB JPEG and the 16-bit depth PNG, crops
both to the epoch's window (the very windows gpufeed uses:
:func:`gpufeed.pipelines._windows.train_windows`, a pure function of (seed, epoch, id)), resizes
the RGB bilinearly and the depth with nearest neighbour (values kept), flips both, and returns
uint8 HWC RGB and int32 depth. :func:`~gpufeed.bench._train_feeds.dataloader_feed` runs it, and
:func:`dense_batch` makes each collated batch a :class:`~gpufeed.pipelines.DenseBatch` on the
training device, so the same :class:`~gpufeed.train._step.Stepper` consumes either side.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gpufeed.bench._train_feeds import epoch_window, to_device
from gpufeed.pipelines import DenseBatch, PairedDataset
from gpufeed.synth import write_paired_split

__all__ = ["DEPTH_SCALE", "PilDensePairs", "dense_batch", "depth_bench_pairs"]

# The generated pairs' depth: millimetres in the PNGs, metres as the target, 0 = no measurement.
DEPTH_SCALE = 0.001


def depth_bench_pairs(data, cache, count: int, image_size: tuple[int, int]):
    """``(PairedDataset, what it is)``: ``data`` (a paired split root), or ``count`` generated pairs cached under ``cache``."""
    if data:
        dataset = PairedDataset.from_root(data)
        return dataset, f"{len(dataset)} RGB + depth pairs in {data}"
    width, height = image_size
    root = Path(cache) / f"depth-pairs-{width}x{height}-{count}"
    if not (root / "depth").is_dir():
        write_paired_split(root, count, width, height, seed=0, kinds=("depth",))
    dataset = PairedDataset.from_root(root)
    return dataset, f"{len(dataset)} generated {width}x{height} JPEG + 16-bit depth PNG pairs"


class PilDensePairs(torch.utils.data.Dataset):
    """PIL decode of RGB + depth, the epoch's window on both, resize, flip; ``(uint8 (H, W, 3), int32 (H, W), id)``.

    Keys are ``(sample id, epoch)``, as :class:`~gpufeed.bench._train_feeds.PilTrainImages`.
    """

    def __init__(self, dataset, image_cfg, seed: int) -> None:
        self.paths, self.depth, self.sizes = dataset.paths, dataset.maps["depth"], dataset.sizes
        self.image_cfg, self.size, self.seed = image_cfg, image_cfg.size_px, seed

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, key):
        from PIL import Image

        sample_id, epoch = key
        box, flip = epoch_window(self.sizes, sample_id, epoch, self.seed, self.image_cfg)
        with Image.open(self.paths[sample_id]) as img:
            rgb = img.convert("RGB").crop(box).resize(self.size, Image.BILINEAR)
        with Image.open(self.depth[sample_id]) as img:  # mode I;16: nearest keeps the 16-bit values
            depth = img.crop(box).resize(self.size, Image.NEAREST)
        if flip:
            rgb, depth = rgb.transpose(Image.FLIP_LEFT_RIGHT), depth.transpose(Image.FLIP_LEFT_RIGHT)
        depth_values = np.asarray(depth).astype(np.int32)  # uint16 -> int32, as gpufeed's loader hands it
        return torch.from_numpy(np.asarray(rgb).copy()), torch.from_numpy(depth_values), sample_id


def dense_batch(raw, device, valid) -> DenseBatch:
    """A collated batch of :class:`PilDensePairs` as a :class:`~gpufeed.pipelines.DenseBatch` on ``device``."""
    hwc, depth, ids = raw
    images, depth, ids = to_device(device, hwc, depth, ids)
    images = images.permute(0, 3, 1, 2)  # channels_last view, like gpufeed's
    return DenseBatch(images, {"depth": depth}, ids, valid[: len(images)])
