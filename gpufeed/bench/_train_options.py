"""What one ``bench train`` run is asked for: :func:`gpufeed.bench.train.run_train_bench`'s arguments."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufeed.core import SizePx

__all__ = ["TrainBenchOptions"]


@dataclass(frozen=True)
class TrainBenchOptions:
    """The arguments of :func:`~gpufeed.bench.train.run_train_bench`; None means the task and device's default.

    Attributes:
        task: ``images``, ``clips`` or ``depth``.
        device: ``auto``, ``gpu`` or ``cpu``.
        model: A registry name.
        batch_size: Samples per step.
        size_px: Model input size (``--size-px``).
        epochs: Epochs per loader and round.
        rounds: Rounds, each running both loaders, the order alternating.
        workers: DALI threads and DataLoader workers; 0 means one per core.
        prefetch_factor: DataLoader batches prefetched per worker.
        data: Class-folder images (``images``), paired RGB and depth (``depth``) or a video folder
            with label CSVs (``clips``), instead of generated data.
        classes: Classes of the generated images (default 1000; with ``data``: its classes).
        images: Generated JPEGs (or pairs).
        image_size: Generated image size (width, height).
        videos: Generated videos, ``seconds`` long each.
        seconds: Length of each generated video.
        video_size: Generated frame width and height.
        gop: Keyframe interval of the generated videos before ``gpufeed prepare``.
        clip_length: Frames per clip.
        overrides: ``KEY=VALUE`` config keys for both sides (not those the arguments above set).
        cache: Where generated data is kept.
        baseline: Also train fed by the DataLoader (``False``: gpufeed's side alone, for tuning
            gpufeed's settings or a run long enough to hold its start-up to a few percent).
    """

    task: str
    device: str
    model: str | None
    batch_size: int | None
    size_px: SizePx | None
    epochs: int | None
    rounds: int | None
    workers: int
    prefetch_factor: int
    data: Path | None
    classes: int | None
    images: int | None
    image_size: tuple[int, int]
    videos: int | None
    seconds: int | None
    video_size: int
    gop: int
    clip_length: int
    overrides: tuple[str, ...]
    cache: Path
    baseline: bool
