"""``gpufeed bench loader``: the gpufeed image loader against a plain PIL DataLoader.

Both sides do the same work on the same files with the same batch size: random-resized crop to
224 by default, or any ``--size-px`` such as ``352x224`` (the very same windows: both read :func:`gpufeed.pipelines._windows.train_windows`), random flip, uint8
CHW. The DataLoader uses one worker per core; DALI one thread per core. On a GPU machine the
baseline's batches are also copied to the GPU (pinned memory), since feeding the GPU is the job.
Epochs alternate between the two, after one warm-up epoch each, and the medians are reported.
Our loader runs its epochs on one persistent pipeline, as training does (``pipeline_builds`` in
the result says so); the baseline keeps its workers (``persistent_workers``) and reads each epoch's
same windows. ``--vary`` compares gpufeed's loader with itself instead
(:mod:`gpufeed.bench._loader_sweep`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from gpufeed.bench._common import handed_over, machine_facts, median
from gpufeed.bench._loader_sweep import parse_vary, print_sweep_result, run_loader_sweep
from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.core import SizePx, format_table
from gpufeed.device import resolve_device
from gpufeed.pipelines import ImageDataset, ImageLoader, default_num_threads, train_windows

__all__ = [
    "EpochBatches",
    "PilCropDataset",
    "parse_vary",
    "print_loader_result",
    "print_sweep_result",
    "run_loader_bench",
    "run_loader_sweep",
]


class PilCropDataset(torch.utils.data.Dataset[torch.Tensor]):
    """A map-style dataset for torch's DataLoader: PIL decode, crop+resize, flip, uint8 CHW.

    Args:
        windows: Per epoch, the (anchor, shape, flip) arrays of every image; an item is keyed
            ``(epoch, i)`` (or ``i`` for epoch 0), so the workers need no update between epochs.
        size_px: Output size.
    """

    def __init__(self, paths: list[str], windows: list[tuple[np.ndarray, np.ndarray, np.ndarray]], size_px: SizePx):
        self.paths, self.windows = paths, windows
        self.size = size_px

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, key: tuple[int, int] | int) -> torch.Tensor:
        from PIL import Image

        epoch, i = key if isinstance(key, tuple) else (0, key)
        anchor, shape, flip = self.windows[epoch]
        x, y = anchor[i]
        w, h = shape[i]
        # What torchvision's RandomResizedCrop does to a PIL image: crop, then bilinear resize.
        with Image.open(self.paths[i]) as source:
            img = source.convert("RGB").crop((x, y, x + w, y + h)).resize(self.size, Image.Resampling.BILINEAR)
        if flip[i]:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)


class EpochBatches:
    """Batches of ``(epoch, i)`` keys in order for a DataLoader's ``batch_sampler``; set ``epoch`` between passes."""

    def __init__(self, count: int, batch_size: int) -> None:
        self.count, self.batch_size, self.epoch = count, batch_size, 0

    def __len__(self) -> int:
        return -(-self.count // self.batch_size)

    def __iter__(self):
        for start in range(0, self.count, self.batch_size):
            yield [(self.epoch, i) for i in range(start, min(start + self.batch_size, self.count))]


def _time_epoch(batches, to_device=None) -> tuple[float, int]:
    start = time.perf_counter()
    count = 0
    images = None
    for batch in batches:
        images = batch.images if hasattr(batch, "images") else batch
        if to_device is not None:
            images = images.to(to_device, non_blocking=True)
        count += int(images.shape[0])
    handed_over(images)  # both sides: until the last batch is there
    return time.perf_counter() - start, count


def run_loader_bench(
    data: Path,
    *,
    batch_size: int = 64,
    rounds: int = 3,
    size_px: SizePx = SizePx(224, 224),
    device: str = "auto",
    workers: int = 0,
    seed: int = 0,
) -> dict:
    """Run both loaders over the class-folder dataset ``data``; return the figures.

    Args:
        rounds: Timed epochs per loader (after one warm-up each), interleaved.
        size_px: Output size (``--size-px``).
        workers: DataLoader workers and DALI threads; 0 means one per core.
    """
    choice = resolve_device(device)
    workers = workers or default_num_threads()
    dataset = ImageDataset.from_folder(data, progress=True)
    image_cfg = ImagePipelineConfig(size_px=size_px)
    loader_cfg = LoaderConfig(batch_size=batch_size, num_threads=workers, shuffle=False, last_batch="partial")
    ours = ImageLoader(dataset, train=True, image_cfg=image_cfg, loader_cfg=loader_cfg, device=choice, seed=seed)

    # Our loader runs epoch after epoch on one pipeline, as training does (going back to epoch 0
    # each round rebuilt it inside the timing); the baseline gets each epoch's very same windows.
    ids = dataset.usable_ids
    out = image_cfg.size_px
    windows = []
    for epoch in range(rounds + 1):
        w = train_windows(
            dataset.sizes[ids],
            ids,
            seed,
            epoch,
            image_cfg.crop_area,
            image_cfg.crop_aspect_ratio,
            output_aspect=out.width_px / out.height_px,
        )
        windows.append((w.anchor, w.shape, w.flip))
    baseline = PilCropDataset([dataset.paths[i] for i in ids], windows, out)
    batches = EpochBatches(len(ids), batch_size)
    # Spawned, not forked: this process already runs our loader's threads (DALI's pool, the feed), and a
    # child forked while one of them held a lock can wait on it forever (seen once in CI: the baseline's
    # worker never answered). The workers persist, so starting them is in the untimed warm-up epoch.
    dl: torch.utils.data.DataLoader[torch.Tensor] = torch.utils.data.DataLoader(
        baseline,
        batch_sampler=batches,
        num_workers=workers,
        persistent_workers=True,
        pin_memory=choice.is_gpu,
        multiprocessing_context="spawn" if workers else None,
    )
    to_device = choice.torch_device if choice.is_gpu else None

    times: dict[str, list[float]] = {"gpufeed": [], "dataloader_pil": []}
    for epoch in range(rounds + 1):  # epoch 0 warms both up, untimed
        seconds, n = _time_epoch(ours)
        batches.epoch = epoch
        base_seconds, base_n = _time_epoch(dl, to_device)
        if epoch:
            times["gpufeed"].append(n / seconds)
            times["dataloader_pil"].append(base_n / base_seconds)
    ips = {k: median(v) for k, v in times.items()}
    result = {
        "benchmark": "loader",
        "images": len(ids),
        "batch_size": batch_size,
        "size_px": image_cfg.size_px,
        "width_px": out.width_px,
        "height_px": out.height_px,
        "workers": workers,
        "rounds": rounds,
        "pipeline_builds": ours.pipeline_builds,
        "images_per_second": ips,
        "images_per_second_rounds": times,
        "machine": machine_facts(choice),
        "ratio": ips["gpufeed"] / ips["dataloader_pil"],
    }
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
    print(f"gpufeed pipelines built: {result['pipeline_builds']} (one, kept across the {result['rounds'] + 1} epochs)")
    print(f"ratio gpufeed / DataLoader+PIL: {result['ratio']:.2f}x")
