"""``gpufeed bench loader``: the gpufeed image loader against a plain PIL DataLoader.

Both sides do the same work on the same files with the same batch size: random-resized crop to
224 by default, or any ``--size-px`` such as ``352x224`` (the very same windows: both read :func:`gpufeed.pipelines._windows.train_windows`), random flip, uint8
CHW. The DataLoader uses one worker per core; DALI one thread per core. On a GPU machine the
baseline's batches are also copied to the GPU (pinned memory), since feeding the GPU is the job.
Epochs alternate between the two, after one warm-up epoch each, and the medians are reported.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from gpufeed._files import write_json
from gpufeed._size import SizePx, parse_size_px
from gpufeed._text import format_table
from gpufeed.bench._common import machine_facts, median
from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.device import resolve_device
from gpufeed.pipelines import ImageDataset, ImageLoader
from gpufeed.pipelines._epochs import default_num_threads
from gpufeed.pipelines._windows import train_windows

__all__ = ["PilCropDataset", "make_bench_images", "run_loader_bench"]


def make_bench_images(folder: Path, count: int, width: int, height: int, seed: int = 0) -> Path:
    """Photo-like JPEGs (smooth shapes plus sensor-like noise, quality 90) in ``folder/photos/``.

    Reused when already present with the same parameters.
    """
    from PIL import Image
    from tqdm import tqdm

    target = folder / f"bench-{width}x{height}-{count}-{seed}"
    photos = target / "photos"
    done = target / ".complete"
    if done.exists():
        return target
    photos.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for i in tqdm(range(count), desc="bench images", unit="img", leave=False):
        base = np.zeros((height, width, 3), np.float32)
        for _ in range(6):
            cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.1, 0.5) * width
            blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
            base += blob[..., None] * rng.uniform(0, 255, 3)
        base = base / max(base.max(), 1.0) * 220 + rng.normal(0, 6, base.shape)
        Image.fromarray(np.clip(base, 0, 255).astype(np.uint8)).save(photos / f"{i:06d}.jpg", quality=90)
    done.touch()
    return target


class PilCropDataset:
    """A map-style dataset for torch's DataLoader: PIL decode, crop+resize, flip, uint8 CHW."""

    def __init__(
        self, paths: list[str], anchor: np.ndarray, shape: np.ndarray, flip: np.ndarray, size_px: SizePx | int
    ):
        self.paths, self.anchor, self.shape, self.flip = paths, anchor, shape, flip
        self.size = parse_size_px(size_px)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        import torch
        from PIL import Image

        x, y = self.anchor[i]
        w, h = self.shape[i]
        # What torchvision's RandomResizedCrop does to a PIL image: crop, then bilinear resize.
        with Image.open(self.paths[i]) as img:
            img = img.convert("RGB").crop((x, y, x + w, y + h)).resize(self.size, Image.BILINEAR)
        if self.flip[i]:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)


def _time_epoch(batches, to_device=None) -> tuple[float, int]:
    start = time.perf_counter()
    count = 0
    for batch in batches:
        images = batch.images if hasattr(batch, "images") else batch
        if to_device is not None:
            images = images.to(to_device, non_blocking=True)
        count += int(images.shape[0])
    if to_device is not None and to_device.type == "cuda":
        import torch

        torch.cuda.synchronize(to_device)
    return time.perf_counter() - start, count


def run_loader_bench(
    data: Path,
    *,
    batch_size: int = 64,
    rounds: int = 3,
    size_px: SizePx | int | tuple[int, int] = 224,
    device: str = "auto",
    workers: int = 0,
    seed: int = 0,
) -> dict:
    """Run both loaders over the class-folder dataset ``data``; return the figures.

    Args:
        rounds: Timed epochs per loader (after one warm-up each), interleaved.
        size_px: Output size: one number (square) or (width, height).
        workers: DataLoader workers and DALI threads; 0 means one per core.
    """
    import torch

    choice = resolve_device(device)
    workers = workers or default_num_threads()
    dataset = ImageDataset.from_folder(data, progress=True)
    image_cfg = ImagePipelineConfig(size_px=size_px)
    loader_cfg = LoaderConfig(batch_size=batch_size, num_threads=workers, shuffle=False, last_batch="partial")
    ours = ImageLoader(dataset, train=True, image_cfg=image_cfg, loader_cfg=loader_cfg, device=choice, seed=seed)

    ids = dataset.usable_ids
    out = image_cfg.output_size
    windows = train_windows(
        dataset.sizes[ids],
        ids,
        seed,
        0,
        image_cfg.crop_area,
        image_cfg.crop_aspect_ratio,
        output_aspect=out.width_px / out.height_px,
    )
    baseline = PilCropDataset([dataset.paths[i] for i in ids], windows.anchor, windows.shape, windows.flip, out)
    dl = torch.utils.data.DataLoader(
        baseline, batch_size=batch_size, num_workers=workers, persistent_workers=True, pin_memory=choice.is_gpu
    )
    to_device = choice.torch_device if choice.is_gpu else None

    def ours_epoch():
        ours.set_epoch(0)  # same windows every round, as the baseline's
        return _time_epoch(ours)

    times = {"gpufeed": [], "dataloader_pil": []}
    ours_epoch()
    _time_epoch(dl, to_device)
    for _ in range(rounds):
        seconds, n = ours_epoch()
        times["gpufeed"].append(n / seconds)
        seconds, n = _time_epoch(dl, to_device)
        times["dataloader_pil"].append(n / seconds)
    result = {
        "benchmark": "loader",
        "images": len(ids),
        "batch_size": batch_size,
        "size_px": image_cfg.size_px,
        "width_px": out.width_px,
        "height_px": out.height_px,
        "workers": workers,
        "rounds": rounds,
        "images_per_second": {k: median(v) for k, v in times.items()},
        "images_per_second_rounds": times,
        "machine": machine_facts(choice),
    }
    result["ratio"] = result["images_per_second"]["gpufeed"] / result["images_per_second"]["dataloader_pil"]
    return result


def print_loader_result(result: dict) -> None:
    ips = result["images_per_second"]
    rows = [[name, value] for name, value in ips.items()]
    print(
        f"loader benchmark: {result['images']} images to {result['width_px']}x{result['height_px']}, batch "
        f"{result['batch_size']}, {result['workers']} workers/threads, "
        f"{result['machine']['device']}"
    )
    print(format_table(["loader", "images/s (median)"], rows))
    print(f"ratio gpufeed / DataLoader+PIL: {result['ratio']:.2f}x")


def main_loader(args) -> int:
    data = args.data or make_bench_images(args.cache, args.images, *args.image_size)
    result = run_loader_bench(
        Path(data),
        batch_size=args.batch_size,
        rounds=args.rounds,
        size_px=args.size_px,
        device=args.device,
        workers=args.workers,
    )
    print_loader_result(result)
    if args.json:
        write_json(args.json, result)
    return 0
