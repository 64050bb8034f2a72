"""``gpufeed bench train``: the same training run fed by gpufeed and by torch's DataLoader.

Both sides train the same model (fresh, same seed) with the same batch size, input size,
augmentation, optimiser, schedule, precision and memory format, through the very
:class:`~gpufeed.train._step.Stepper` that ``gpufeed train`` runs, for the same epochs over the
same samples in the same order. Only the feed differs (see :mod:`gpufeed.bench._train_feeds`):
gpufeed's :class:`~gpufeed.pipelines.ImageLoader` / :class:`~gpufeed.pipelines.ClipLoader`, or a
DataLoader with PIL (images) or PyAV keyframe seeks (clips) doing the same work per sample.

Each step is timed as the trainer times it (:mod:`gpufeed.train._timeline`): loader wait (host
time blocked waiting for the next batch; the DataLoader's includes its copy to the GPU), augment
and compute (CUDA events on a GPU, where each step is read once the next one is queued;
``perf_counter`` on the CPU) and the step's period, which add up to the time trained. A *round*
runs every epoch with both sides, each with a fresh loader and model: interleaved every few steps
where the step is compute-bound by far (``--task depth`` on a CPU), else one side's whole round,
then the other's, the order alternating by round (see :mod:`gpufeed.bench._train_rounds`). Each
chunk pair (or round) is one samples/s ratio, and their median is the headline figure.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

import torch

from gpufeed.bench._dense_feeds import DEPTH_SCALE, PilDensePairs, dense_batch, depth_bench_pairs
from gpufeed.bench._train_feeds import (
    PilTrainImages,
    PyAvSeekClips,
    clip_batch,
    dataloader_feed,
    generated_image_list,
    gpufeed_feed,
)
from gpufeed.bench._train_options import TrainBenchOptions
from gpufeed.bench._train_plot import draw_train_plot as draw_train_plot
from gpufeed.bench._train_report import SIDES, figures
from gpufeed.bench._train_report import print_train_result as print_train_result
from gpufeed.bench._train_rounds import run_rounds
from gpufeed.bench.clips import make_bench_videos, prepared_bench_videos
from gpufeed.config import Config, ConfigError, parse_config
from gpufeed.core import SizePx, progress_bar
from gpufeed.device import resolve_device
from gpufeed.models import create_model
from gpufeed.pipelines import (
    ClipBatch,
    ClipLoader,
    DenseBatch,
    DenseLoader,
    ImageBatch,
    ImageDataset,
    ImageLoader,
    VideoDataset,
    default_num_threads,
    plan_epoch,
)
from gpufeed.train import (
    AugmentPlan,
    ClipTask,
    DepthTask,
    ImageTask,
    Stepper,
    build_optimizer,
    build_scheduler,
    compile_model,
    plan_augmentation,
    refuse_device_geometry,
    resolve_amp,
    to_channels_last,
)

__all__ = ["DEFAULTS", "TrainBenchOptions", "augment_plans", "run_train_bench"]


def _defaults(
    model: str, batch_size: int, size_px: SizePx, epochs: int, rounds: int, chunk_steps: int = 0, **data
) -> dict:
    return {"model": model, "batch_size": batch_size, "size_px": size_px, "epochs": epochs, "rounds": rounds,
            "chunk_steps": chunk_steps, **data}  # fmt: skip


# Per (task, device kind): what a sensible run on that machine looks like (flags override each).
# chunk_steps: sides interleaved every that many steps (0: one side's whole round, then the
# other's); only where the step is compute-bound by far, see gpufeed.bench._train_rounds.
DEFAULTS = {
    ("images", "cpu"): _defaults("smallcnn", 32, SizePx(64, 64), epochs=3, rounds=2, images=512),
    ("images", "gpu"): _defaults("resnet18", 256, SizePx(224, 224), epochs=4, rounds=2, images=4096),
    ("clips", "cpu"): _defaults("r3d_small", 4, SizePx(64, 64), epochs=3, rounds=1, videos=2, seconds=8),
    ("clips", "gpu"): _defaults("r3d_small", 64, SizePx(112, 112), epochs=4, rounds=2, videos=4, seconds=120),
    # Dense depth: 640x480 JPEG + 16-bit PNG pairs (generated), unet_resnet18 at width x height.
    ("depth", "cpu"): _defaults("unet_resnet18", 8, SizePx(128, 96), epochs=2, rounds=2, chunk_steps=4, images=64),
    ("depth", "gpu"): _defaults("unet_resnet18", 64, SizePx(256, 192), epochs=3, rounds=2, images=2048),
}
# Config keys the command's own flags decide, and those flags.
_FLAG_KEYS = {
    "model.name": "--model",
    "loader.batch_size": "--batch-size",
    "image.size_px": "--size-px",
    "video.size_px": "--size-px",
    "video.clip_length_frames": "--clip-length",
    "train.epochs": "--epochs",
    "loader.num_threads": "--workers",
    "device": "--device",
}


def augment_plans(cfg: Config, clips: bool, dtype: torch.dtype | None = None) -> dict[str, AugmentPlan]:
    """Where each side runs ``cfg.augment``, by side name: the same ops on every sample on both sides.

    gpufeed's loader runs the ops placed in its DALI graph (``augment.<op>.where``, as ``gpufeed
    train`` does); a DataLoader cannot, so its side runs that share on the device as the same fused
    torch maths. Every other op runs on the device on both sides.
    """
    return {
        "gpufeed": plan_augmentation(cfg.augment, clips=clips, loader=True, dtype=dtype),
        "dataloader": plan_augmentation(cfg.augment, clips=clips, loader=False, dtype=dtype),
    }


class _Run:
    """Everything both sides share: device, resolved config, data, task, model spec, epoch plans."""

    task: ImageTask | DepthTask | ClipTask
    spec: dict[str, Any]

    def __init__(self, args: TrainBenchOptions) -> None:
        self.task_name = args.task
        self.device = resolve_device(args.device)
        kind = "gpu" if self.device.is_gpu else "cpu"
        defaults = DEFAULTS[(args.task, kind)]
        # Defaults without an argument (chunk_steps) are taken as they are.
        given = {k: getattr(args, k, None) for k in defaults}
        pick: dict[str, Any] = {k: v if given[k] is None else given[k] for k, v in defaults.items()}
        self.pick = pick
        self.epochs, self.rounds = int(pick["epochs"]), int(pick["rounds"])
        self.sides = SIDES if args.baseline else SIDES[:1]  # gpufeed's side comes first
        self.workers = args.workers or default_num_threads()
        self.prefetch_factor = args.prefetch_factor
        self.cfg = _config(args, pick, self.workers)
        self.amp_dtype = resolve_amp(self.cfg.train.amp, self.device)
        self.plans = augment_plans(self.cfg, args.task == "clips", self.amp_dtype)
        if args.task == "images":
            self._images(args)
        elif args.task == "depth":
            for plan in self.plans.values():  # a flip on the device would move the RGB without its map
                refuse_device_geometry(plan.placement)
            self._depth(args)
        else:
            self._clips(args)

    # -- data -----------------------------------------------------------------------------------
    def _images(self, args: TrainBenchOptions) -> None:
        if args.data:
            self.dataset = ImageDataset.from_folder(args.data, progress=True)
            classes = args.classes or len(self.dataset.classes)
            self.data_text = f"{len(self.dataset)} images in {args.data}"
        else:
            classes = args.classes or 1000
            listing = generated_image_list(args.cache, self.pick["images"], args.image_size, classes)
            self.dataset = ImageDataset.from_list(listing, progress=True)
            self.data_text = f"{len(self.dataset)} generated photo-like {args.image_size[0]}x{args.image_size[1]} JPEGs"
        self.data_text += f", {classes} classes"
        self.task = ImageTask(classes)
        self.spec = {"num_classes": classes, "size_px": self.cfg.image.size_px}
        self.keys = [[(i, e) for i in self._plan_ids(e)] for e in range(self.epochs)]

    def _depth(self, args: TrainBenchOptions) -> None:
        self.dataset, self.data_text = depth_bench_pairs(args.data, args.cache, self.pick["images"], args.image_size)
        self.task = DepthTask(DEPTH_SCALE, no_data=0)
        self.spec = {"task": "depth", "num_classes": 1, "size_px": self.cfg.image.size_px, "depth_scale": DEPTH_SCALE}
        self.keys = [[(i, e) for i in self._plan_ids(e)] for e in range(self.epochs)]

    def _plan_ids(self, epoch: int) -> list[int]:
        cfg = self.cfg
        return plan_epoch(
            self.dataset.usable_ids,
            epoch=epoch,
            seed=cfg.seed,
            shuffle=cfg.loader.shuffle,
            shard_id=0,
            num_shards=1,
            batch_size=cfg.loader.batch_size,
            last_batch="drop",
        ).sample_ids.tolist()

    def _clips(self, args: TrainBenchOptions) -> None:
        v = self.cfg.video
        if args.data:
            folder = Path(args.data)
        else:
            videos, seconds = self.pick["videos"], self.pick["seconds"]
            raw = make_bench_videos(args.cache, videos, seconds, 30, args.video_size, args.gop, self.cfg.seed)
            folder = prepared_bench_videos(raw, v.clip_length_frames, v.stride_frames)
        self.dataset = VideoDataset.from_folder(folder, progress=True)
        self.data_text = (
            f"{len(self.dataset)} videos in {args.data}"
            if args.data
            else f"{len(self.dataset)} generated {self.pick['seconds']} s {args.video_size}x{args.video_size} h264 videos "
            "after 'gpufeed prepare'"
        )
        behaviours = tuple(self.dataset.behaviours)
        self.task = ClipTask(len(behaviours), behaviours)
        self.spec = {
            "num_classes": len(behaviours),
            "labels": behaviours,
            "clip_length_frames": v.clip_length_frames,
            "size_px": v.size_px,
        }
        planner = self._gpufeed_loader()
        self.keys = []
        for e in range(self.epochs):
            videos, starts = planner.epoch_clips(e)
            self.keys.append(list(zip(videos.tolist(), starts.tolist(), strict=True)))
        self.centre = planner.geometry.centre_offset
        del planner

    @property
    def clips(self) -> bool:
        return self.task_name == "clips"

    @property
    def steps_per_epoch(self) -> int:
        return len(self.keys[0]) // self.cfg.loader.batch_size

    # -- the two feeds --------------------------------------------------------------------------
    def _gpufeed_loader(self):
        cfg = self.cfg
        common = {
            "train": True,
            "loader_cfg": cfg.loader,
            "device": self.device,
            "seed": cfg.seed,
            "augment": self.plans["gpufeed"].loader,
        }
        if self.clips:
            return ClipLoader(self.dataset, video_cfg=cfg.video, **common)
        if self.task_name == "depth":
            return DenseLoader(self.dataset, image_cfg=cfg.image, **common)
        return ImageLoader(self.dataset, image_cfg=cfg.image, **common)

    def feed(self, side: str):
        """A fresh stream of ``(epoch, batch index, batch)`` for every epoch, fed by ``side``."""
        if side == "gpufeed":
            return gpufeed_feed(self._gpufeed_loader, self.epochs)
        common = {"batch_size": self.cfg.loader.batch_size, "workers": self.workers, "device": self.device}
        common["prefetch_factor"] = self.prefetch_factor
        if self.task_name == "depth":
            pairs = PilDensePairs(self.dataset, self.cfg.image, self.cfg.seed)
            return dataloader_feed(pairs, self.keys, to_batch=dense_batch, **common)
        if self.clips:
            v = self.cfg.video
            dataset = PyAvSeekClips(self.dataset, v.clip_length_frames, v.stride_frames, v.size_px)
            to_batch = functools.partial(clip_batch, behaviours=tuple(self.dataset.behaviours), centre=self.centre)
            return dataloader_feed(dataset, self.keys, to_batch=to_batch, **common)
        return dataloader_feed(PilTrainImages(self.dataset, self.cfg.image, self.cfg.seed), self.keys, **common)

    # -- the step -------------------------------------------------------------------------------
    def stepper(self, augment: torch.nn.Module):
        """A fresh model, optimiser and schedule behind the trainer's :class:`Stepper`, as ``gpufeed train`` builds them."""
        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # the same initial weights on both sides
        spec = dict(self.spec, mean=cfg.model.mean, std=cfg.model.std)
        model = create_model(cfg.model.name, **spec).to(self.device.torch_device)
        memory_format = None
        if cfg.train.channels_last:
            to_channels_last(model)  # in place
            memory_format = self.task.input_format(model)
        compile_model(model, cfg.train.compile)
        optimizer = build_optimizer(model, cfg.train)
        scheduler = build_scheduler(optimizer, self.epochs * self.steps_per_epoch, cfg.train)
        scaler = torch.amp.GradScaler(self.device.torch_device.type, enabled=self.amp_dtype == torch.float16)
        return Stepper(
            model,
            self.task,
            optimizer,
            scheduler,
            augment.to(self.device.torch_device),
            scaler,
            amp_dtype=self.amp_dtype,
            memory_format=memory_format,
            grad_clip_norm=cfg.train.grad_clip_norm,
            on_gpu=self.device.is_gpu,
            cudagraphs=cfg.train.compile == "reduce-overhead",
        )

    def synthetic_batch(self):
        """A batch of the feeds' type and layout with random pixels: warms kernels up, untimed."""
        n, dev = self.cfg.loader.batch_size, self.device.torch_device
        h, w = self.spec["size_px"].hw
        valid = torch.ones(n, dtype=torch.bool, device=dev)
        if self.task_name == "depth":
            images = torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, device=dev).permute(0, 3, 1, 2)
            depth = torch.randint(1, 5000, (n, h, w), dtype=torch.int32, device=dev)
            return DenseBatch(images, {"depth": depth}, torch.arange(n, device=dev), valid)
        if not self.clips:
            images = torch.randint(0, 256, (n, h, w, 3), dtype=torch.uint8, device=dev).permute(0, 3, 1, 2)
            labels = torch.randint(0, self.spec["num_classes"], (n,), device=dev)
            return ImageBatch(images, labels, torch.arange(n, device=dev), valid)
        t, k = self.spec["clip_length_frames"], self.spec["num_classes"]
        clips = torch.randint(0, 256, (n, t, h, w, 3), dtype=torch.uint8, device=dev).permute(0, 4, 1, 2, 3)
        labels = torch.zeros(n, t, k, device=dev)
        ids = torch.zeros(n, dtype=torch.int64, device=dev)
        return ClipBatch(clips, labels, labels[:, t // 2], ids, ids, valid, tuple(self.dataset.behaviours))


def _config(args: TrainBenchOptions, pick: dict, workers: int) -> Config:
    for item in args.overrides:
        key = item.partition("=")[0].strip()
        if key in _FLAG_KEYS:
            raise ConfigError(key, f"this command sets it with {_FLAG_KEYS[key]}, not --set")
    cfg = parse_config(None, args.overrides, base_dir=Path.cwd())
    size = {"size_px": pick["size_px"]}
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, name=pick["model"]),
        train=dataclasses.replace(cfg.train, epochs=pick["epochs"]),
        loader=dataclasses.replace(
            cfg.loader, batch_size=pick["batch_size"], num_threads=workers, shuffle=True, last_batch="drop"
        ),
        image=dataclasses.replace(cfg.image, **size),
        video=dataclasses.replace(cfg.video, clip_length_frames=args.clip_length, **size),
    )


def run_train_bench(
    *,
    task: str = "images",
    device: str = "auto",
    model: str | None = None,
    batch_size: int | None = None,
    size_px: SizePx | None = None,
    epochs: int | None = None,
    rounds: int | None = None,
    workers: int = 0,
    prefetch_factor: int = 4,
    data: Path | None = None,
    classes: int | None = None,
    images: int | None = None,
    image_size: tuple[int, int] = (640, 480),
    videos: int | None = None,
    seconds: int | None = None,
    video_size: int = 256,
    gop: int = 250,
    clip_length: int = 11,
    overrides: tuple[str, ...] = (),
    cache: Path = Path(".cache/bench"),
    baseline: bool = True,
) -> dict:
    """Run the benchmark (arguments: :class:`~gpufeed.bench._train_options.TrainBenchOptions`); return the figures."""
    options = TrainBenchOptions(**locals())  # the arguments, exactly: nothing else is defined yet

    run = _Run(options)
    augmenters = {side: run.plans[side].augmenter for side in run.sides}
    total = run.rounds * len(run.sides) * run.epochs * run.steps_per_epoch
    with progress_bar(total=total, desc="bench train", unit="step", leave=True, dynamic_ncols=True) as bar:
        blocks, pairs, orders = run_rounds(run, augmenters, bar, int(run.pick["chunk_steps"]))
    # Every round, every epoch: the same samples on both sides (and the same clip starts).
    same = "dataloader" in blocks and all(
        sorted(g) == sorted(d)
        for gb, db in zip(blocks["gpufeed"], blocks["dataloader"], strict=True)
        for g, d in zip(gb["ids"], db["ids"], strict=True)
    )
    for side_blocks in blocks.values():
        for block in side_blocks:
            del block["ids"]
    settings = _settings(run, augmenters, orders)
    return figures(run.device, settings, blocks, same if len(run.sides) > 1 else None, pairs)


def _settings(run: _Run, augmenters: dict, orders: list) -> dict:
    cfg = run.cfg
    return {
        "task": run.task_name,
        "sides": list(run.sides),
        "model": cfg.model.name,
        "size_px": run.spec["size_px"],
        "clip_length_frames": run.spec.get("clip_length_frames"),
        "batch_size": cfg.loader.batch_size,
        "epochs": run.epochs,
        "rounds": run.rounds,
        "steps_per_epoch": run.steps_per_epoch,
        "chunk_steps": int(run.pick["chunk_steps"]),
        "order": orders,
        "data": run.data_text,
        "workers": run.workers,
        "prefetch_factor": run.prefetch_factor,
        "pin_memory": run.device.is_gpu,
        "dali_prefetch_queue_depth": cfg.loader.prefetch_queue_depth,
        "amp": str(run.amp_dtype).replace("torch.", "") if run.amp_dtype else "off",
        "channels_last": cfg.train.channels_last,
        "compile": cfg.train.compile,
        "augment": {side: list(getattr(a, "names", [])) for side, a in augmenters.items()},
        "augment_placement": {side: plan.placement for side, plan in run.plans.items()},
        "seed": cfg.seed,
    }
