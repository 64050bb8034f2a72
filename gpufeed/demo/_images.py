"""The demo's first stages: the synthetic dataset, its check, and one epoch of each image loader.

Every synthetic image carries its sample id and class word in its pixels, so the evaluation epoch
proves that each image arrived with its own id and label.
"""

from __future__ import annotations

import time
from pathlib import Path

from gpufeed.config import Config
from gpufeed.demo._base import banner
from gpufeed.device import DeviceChoice, resolve_device
from gpufeed.pipelines import ImageDataset, ImageLoader, check_path
from gpufeed.synth import CLASS_WORDS, SynthSpec, read_tag, write_synthetic_dataset

__all__ = ["run_image_demo"]


def run_image_demo(out: Path, cfg: Config) -> DeviceChoice:
    """Write (once) and check the synthetic dataset, then read a training and an evaluation epoch.

    Args:
        out: The demo's run folder; the dataset goes under ``out/data``.
        cfg: The demo's config (:func:`gpufeed.demo.demo_config`).

    Returns:
        The device the loaders ran on, which the later stages use too.

    Raises:
        SystemExit: The dataset fails its check, or an evaluation image carries the wrong pixels.
    """
    banner("synthetic data")
    data = out / "data"
    if not (data / "synth.json").exists():
        write_synthetic_dataset(data, SynthSpec(seed=cfg.seed))
    print(f"dataset: {data}")

    banner("check")
    report = check_path(data, progress=False)
    print(report.table())
    if not report.ok:
        raise SystemExit("the synthetic dataset failed its own check")

    banner("image loader")
    # Resolved here, after the data stages, so a GPU that is asked for and missing fails only now.
    choice = resolve_device(cfg.device)
    print(f"device: {choice.describe()}")
    train = ImageDataset.from_config(cfg.data.train, cfg.data.classes, max_pixels=cfg.data.max_image_pixels)
    loader = ImageLoader(train, train=True, image_cfg=cfg.image, loader_cfg=cfg.loader, device=choice, seed=cfg.seed)
    start, images = time.perf_counter(), 0
    for batch in loader:
        images += len(batch)
    seconds = time.perf_counter() - start
    print(
        f"train epoch: {images} images in {len(loader)} batches of {tuple(batch.images.shape)} "
        f"{batch.images.dtype} on {batch.images.device}: {images / seconds:,.0f} images/s"
    )

    val = ImageDataset.from_config(cfg.data.val, cfg.data.classes, max_pixels=cfg.data.max_image_pixels)
    loader = ImageLoader(val, train=False, image_cfg=cfg.image, loader_cfg=cfg.loader, device=choice, seed=cfg.seed)
    verified = 0
    for batch in loader:
        for image, sample_id, label in zip(batch.images, batch.sample_ids.tolist(), batch.labels.tolist(), strict=True):
            tag = read_tag(image, "CHW")
            if (tag.ident, tag.aux) != (sample_id, CLASS_WORDS[label]):
                raise SystemExit(f"eval sample {sample_id} arrived with the wrong pixels: {tag}")
            verified += 1
    print(f"eval epoch: {verified}/{len(val)} samples verified exactly by the ids and labels drawn in their pixels")
    return choice
