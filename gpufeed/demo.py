"""``gpufeed demo``: the main job end to end on the embedded synthetic dataset.

Stages run in order, each printing what it did; the resolved config is saved in the run folder.
Everything is generated here, so the demo needs no downloads and runs the same on a laptop CPU
(DALI's CPU mode) and on a GPU machine.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gpufeed.config import Config, parse_config, save_config

__all__ = ["DEMO_CONFIG", "demo_config", "run_demo"]

log = logging.getLogger("gpufeed")

# The embedded default. Paths are relative to the run folder.
DEMO_CONFIG = {
    "device": "auto",
    "seed": 0,
    "data": {
        "train": {"list_file": "data/images/train.txt"},
        "val": {"list_file": "data/images/val.txt"},
    },
    "image": {"size_px": 64},
    "loader": {"batch_size": 16, "last_batch": "drop"},
    "video": {"train": "data/videos", "val": "data/videos", "size_px": 64},
}


def demo_config(out: Path, device: str = "auto") -> Config:
    """The demo's config, with paths under ``out``."""
    return parse_config(DEMO_CONFIG, overrides=[f"device={device}"], base_dir=Path(out).resolve())


def _banner(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run_demo(out: str | Path, device: str = "auto") -> Config:
    """Run every demo stage into ``out``; return the resolved config."""
    from gpufeed.device import resolve_device
    from gpufeed.pipelines import ImageDataset, ImageLoader, check_path
    from gpufeed.synth import CLASS_WORDS, SynthSpec, read_tag, write_synthetic_dataset

    out = Path(out)
    cfg = demo_config(out, device)
    save_config(cfg, out / "config.yaml")

    _banner("synthetic data")
    data = out / "data"
    if not (data / "synth.json").exists():
        write_synthetic_dataset(data, SynthSpec(seed=cfg.seed))
    print(f"dataset: {data}")

    _banner("check")
    report = check_path(data, progress=False)
    print(report.table())
    if not report.ok:
        raise SystemExit("the synthetic dataset failed its own check")

    _banner("image loader")
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

    from gpufeed.video_demo import run_clip_demo

    run_clip_demo(cfg, choice)

    from gpufeed.models import find_checkpoint
    from gpufeed.train.demo import run_train_demo

    image_run = run_train_demo(out, cfg)
    run_train_demo(out, cfg, model="clip_resnet18")

    _banner("serving")
    from gpufeed.server._demo import run_serve_demo

    run_serve_demo(cfg, out, choice, find_checkpoint(image_run))

    _banner("monitoring")
    from gpufeed.obs import run_obs_demo

    run_obs_demo(out)
    print(f"\nresolved config saved to {out / 'config.yaml'}")
    return cfg
