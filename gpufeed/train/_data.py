"""From config to task + loaders: what a training run reads and how the model is shaped for it.

The model's preprocessing facts come from the data side, never from a second setting: an image
model's ``size_px`` and ``eval_crop_fraction`` are the image pipeline's ``image.size_px`` and
``image.eval_crop_fraction``; its classes are the dataset's (``model.num_classes`` may only
confirm them or leave room for more). A clip model's classes are the behaviours of its videos,
and its clip length and size the ``video`` section's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from gpufeed.config import Config, ConfigError
from gpufeed.core import is_object_url, quoted
from gpufeed.pipelines import (
    ClipLoader,
    DenseLoader,
    EpochLoader,
    ImageDataset,
    ImageLoader,
    PairedDataset,
    VideoDataset,
    is_paired_root,
    project_dataset,
    split_folders,
)
from gpufeed.train._dense import DENSE_TASKS, DepthTask, SegmentationTask
from gpufeed.train._distributed import DistInfo
from gpufeed.train._tasks import ClipTask, ImageTask, Task

__all__ = ["TrainData", "build_data", "refuse_val_inside_train", "warn_split_folders"]

log = logging.getLogger("gpufeed")


@dataclass
class TrainData:
    """A run's task and loaders.

    Attributes:
        task: Loss, targets and metric of the run.
        train: The training loader (this rank's shard).
        val: The evaluation loader (this rank's shard), or ``None`` without a validation split.
        spec_overrides: :class:`~gpufeed.models.ModelSpec` fields the data decides (classes,
            labels, input size, evaluation crop, clip length).
    """

    task: Task
    train: EpochLoader
    val: EpochLoader | None
    spec_overrides: dict = field(default_factory=dict)


def _num_classes(cfg: Config, found: int) -> int:
    wanted = cfg.model.num_classes
    if wanted is None:
        return found
    if wanted < found:
        raise ConfigError(
            "model.num_classes", f"value {wanted} is smaller than the {found} classes in the data; set null to use them"
        )
    return wanted


def _loader_args(cfg: Config, device, dist: DistInfo, augment, train: bool) -> dict:
    """What both loaders take besides their dataset and media section: one shard of this rank."""
    return {
        "train": train,
        "loader_cfg": cfg.loader,
        "device": device,
        "shard_id": dist.rank,
        "num_shards": dist.world_size,
        "seed": cfg.seed,
        "augment": augment if train else None,
    }


def warn_split_folders(cfg: Config) -> list[str]:
    """Warn (and return the warnings) for an image split root whose class folders are split folders.

    ``data.train.root: photos`` with ``photos/train/`` and ``photos/val/`` trains a model of two
    classes, "train" and "val": it runs, so it is a warning naming the folders, not an error.
    """
    said = []
    for key, split in (("data.train", cfg.data.train), ("data.val", cfg.data.val)):
        root = getattr(split, "root", None)
        splits = split_folders(root) if root is not None else []
        if splits:
            names = ", ".join(f"{p.name}/" for p in splits)
            said.append(
                f"{key}.root {root} holds the split folders {names}, which train as its classes; point "
                "data.train.root and data.val.root at the split folders themselves"
            )
            log.warning("%s", said[-1])
    return said


def refuse_val_inside_train(train_key: str, train_root: Any, val_key: str, val_root: Any) -> None:
    """Refuse a validation root inside the training root: training would read the validation data too.

    ``video.train: ds`` beside ``video.val: ds/val`` trained on the validation videos (a folder's
    videos are found at any depth), and evaluation then scored what the model had seen, silently.
    The same root for both is allowed: a deliberate check that a model can fit its data.

    Raises:
        ConfigError: Naming ``val_key``, both folders and the fix.
    """
    if train_root is None or val_root is None:
        return
    train, val = (str(r) if is_object_url(str(r)) else os.path.abspath(r) for r in (train_root, val_root))
    if val.rstrip("/").startswith(train.rstrip("/") + "/"):
        raise ConfigError(
            val_key,
            f"{val_root} lies inside {train_key} {train_root}, so training would read the validation data too "
            f"and evaluation score what the model has seen; point {train_key} at a folder of training data only",
        )


def _image_data(cfg: Config, device, dist: DistInfo, augment) -> TrainData:
    if cfg.data.train is None:
        raise ConfigError(
            "data.train", "an image model needs a training split: set data.train.root or data.train.list_file"
        )
    warn_split_folders(cfg)
    val_root = getattr(cfg.data.val, "root", None)
    refuse_val_inside_train("data.train.root", cfg.data.train.root, "data.val.root", val_root)
    train_set = ImageDataset.from_config(cfg.data.train, cfg.data.classes, max_pixels=cfg.data.max_image_pixels)
    val_set = (
        ImageDataset.from_config(cfg.data.val, cfg.data.classes, max_pixels=cfg.data.max_image_pixels)
        if cfg.data.val is not None
        else None
    )
    if val_set is not None and val_set.classes != train_set.classes:
        raise ConfigError(
            "data.val",
            f"classes {list(val_set.classes)} of {val_set.source} differ from the training split's "
            f"{list(train_set.classes)}; set data.classes to name them once",
        )
    num_classes = _num_classes(cfg, len(train_set.classes))

    def loader(dataset, train: bool) -> ImageLoader:
        return ImageLoader(dataset, image_cfg=cfg.image, **_loader_args(cfg, device, dist, augment, train))

    labels = train_set.classes if num_classes == len(train_set.classes) else ()
    return TrainData(
        task=ImageTask(num_classes, labels, label_smoothing=cfg.train.label_smoothing),
        train=loader(train_set, True),
        val=loader(val_set, False) if val_set is not None else None,
        spec_overrides={
            "num_classes": num_classes,
            "labels": labels,
            "size_px": cfg.image.size_px,
            "eval_crop_fraction": cfg.image.eval_crop_fraction,
        },
    )


def _clip_data(cfg: Config, device, dist: DistInfo, augment) -> TrainData:
    """The clip task and this rank's clip loaders, from the ``video`` config section.

    Raises:
        DatasetError: ``video.train`` is not set or its videos cannot be used.
        ConfigError: ``model.num_classes`` disagrees with the number of behaviours.
    """
    project = cfg.video.deepethogram
    if project is not None and (cfg.video.train is not None or cfg.video.val is not None):
        raise ConfigError("video.deepethogram", "set either a DeepEthogram project or video.train/video.val, not both")
    refuse_val_inside_train("video.train", cfg.video.train, "video.val", cfg.video.val)
    if cfg.video.train is None and project is None:
        raise ConfigError(
            "video.train",
            f"model {quoted(cfg.model.name)} is a clip model and needs a folder of training videos (or video.deepethogram)",
        )

    def videos(folder, train: bool) -> VideoDataset:
        if project is not None:
            return project_dataset(
                project,
                split="train" if train else "val",
                val_fraction=cfg.video.val_fraction,
                seed=cfg.seed,
                allowed_roots=cfg.data.allowed_roots,
                max_pixels=cfg.data.max_image_pixels,
            )
        return VideoDataset.from_folder(folder, max_pixels=cfg.data.max_image_pixels)

    def loader(dataset: VideoDataset, train: bool) -> ClipLoader:
        return ClipLoader(dataset, video_cfg=cfg.video, **_loader_args(cfg, device, dist, augment, train))

    train_loader = loader(videos(cfg.video.train, True), True)
    labels = tuple(train_loader.behaviours)
    num_classes = len(labels)
    if cfg.model.num_classes not in (None, num_classes):
        # One logit per behaviour column: BCE compares them one to one with the centre frame's labels.
        raise ConfigError(
            "model.num_classes",
            f"value {cfg.model.num_classes} does not match the {num_classes} behaviours {list(labels)} "
            f"of the videos in {cfg.video.train or project}; set null to use them",
        )
    return TrainData(
        task=ClipTask(num_classes, labels),
        train=train_loader,
        val=loader(_val_columns(videos(cfg.video.val, False), labels), False)
        if cfg.video.val is not None or _has_val(cfg)
        else None,
        spec_overrides={
            "num_classes": num_classes,
            "labels": labels,
            "clip_length_frames": cfg.video.clip_length_frames,
            "size_px": cfg.video.size_px,
        },
    )


def _val_columns(val: VideoDataset, behaviours: tuple[str, ...]) -> VideoDataset:
    """The validation videos with their label columns in training's order, matched by name.

    Evaluation compares logit ``k`` with label column ``k``: a column order of its own would score
    the wrong behaviours silently, and other names would fail only after a whole epoch.

    Raises:
        ConfigError: The validation CSVs name other behaviours than training's (``video.val``).
    """
    if not val.behaviours or val.behaviours == behaviours:
        return val  # no usable label file: the loader names the videos and why
    try:
        ordered = val.in_column_order(behaviours)
    except ValueError:  # other behaviours, not another order
        raise ConfigError(
            "video.val",
            f"label columns {list(val.behaviours)} of the videos in {val.source} differ from the training "
            f"videos' {list(behaviours)}; the validation CSVs must name the same behaviours",
        ) from None
    log.info(
        "video.val: label columns of %s are %s, training's %s: matched by name",
        val.source,
        list(val.behaviours),
        list(behaviours),
    )
    return ordered


def _paired_set(cfg: Config, split_cfg, key: str) -> PairedDataset:
    data = cfg.data
    common: dict[str, Any] = {"scale_maps": data.scale_maps, "max_pixels": data.max_image_pixels}
    if split_cfg.root is not None:
        if not is_paired_root(split_cfg.root):
            raise ConfigError(
                f"{key}.root", f"{split_cfg.root} is not a paired split: a dense model needs rgb/ with depth/ or mask/"
            )
        return PairedDataset.from_root(split_cfg.root, **common)
    return PairedDataset.from_list(
        split_cfg.list_file, map_kinds=data.map_kinds, allowed_roots=data.allowed_roots, **common
    )


def _dense_data(cfg: Config, device, dist: DistInfo, augment) -> TrainData:
    """A dense task (depth or segmentation) and this rank's :class:`DenseLoader` s over paired splits."""
    if cfg.data.train is None:
        raise ConfigError("data.train", "a dense model needs a paired training split: set data.train.root")
    train_set = _paired_set(cfg, cfg.data.train, "data.train")
    val_set = _paired_set(cfg, cfg.data.val, "data.val") if cfg.data.val is not None else None
    task_name = cfg.model.task or train_set.task
    needed = "depth" if task_name == "depth" else "mask"
    for split in (train_set, val_set):
        if split is not None and needed not in split.kinds:
            raise ConfigError(
                "model.task", f"value {task_name!r} needs {needed} maps, and {split.source} has {list(split.kinds)}"
            )
    task: Task
    labels: tuple[str, ...]
    if task_name == "depth":
        if cfg.model.num_classes not in (None, 1):
            raise ConfigError("model.num_classes", f"value {cfg.model.num_classes}: a depth model has 1 output")
        task, labels = DepthTask(cfg.data.depth_scale, cfg.data.depth_no_data), ()
        map_facts = {"depth_scale": cfg.data.depth_scale, "map_fill": cfg.data.depth_no_data}
    else:
        labels = tuple(cfg.data.classes or ())
        num_classes = cfg.model.num_classes or len(labels)
        if not num_classes:
            raise ConfigError(
                "model.num_classes",
                "a segmentation model needs its number of classes: set it, or name them in data.classes",
            )
        labels = labels if len(labels) == num_classes else ()
        task = SegmentationTask(num_classes, labels, cfg.data.mask_ignore_id)
        map_facts = {"map_fill": cfg.data.mask_ignore_id}

    def loader(dataset, train: bool) -> DenseLoader:
        return DenseLoader(
            dataset,
            image_cfg=cfg.image,
            depth_interp=cfg.data.depth_interp,
            **_loader_args(cfg, device, dist, augment, train),
        )

    return TrainData(
        task=task,
        train=loader(train_set, True),
        val=loader(val_set, False) if val_set is not None else None,
        spec_overrides={
            "task": task_name,
            **map_facts,
            "num_classes": task.num_classes,
            "labels": labels,
            "size_px": cfg.image.size_px,
            "eval_crop_fraction": cfg.image.eval_crop_fraction,
        },
    )


def build_data(cfg: Config, task_kind: str, device, dist: DistInfo, augment=None) -> TrainData:
    """The task and this rank's loaders for a model whose spec says ``task_kind`` (image | clip | depth | segmentation).

    A dense model (``depth`` or ``segmentation`` by default) gets the task ``model.task`` names,
    or the one its training split's maps imply.

    ``augment``: the training loader's share of the augmentation
    (:attr:`gpufeed.train._augment.AugmentPlan.loader`); the evaluation loader never augments.
    """
    if task_kind == "image":
        return _image_data(cfg, device, dist, augment)
    if task_kind == "clip":
        return _clip_data(cfg, device, dist, augment)
    if task_kind in DENSE_TASKS:
        return _dense_data(cfg, device, dist, augment)
    raise ValueError(f"task {task_kind!r} is not known; known tasks: image, clip, {', '.join(DENSE_TASKS)}")


def _has_val(cfg: Config) -> bool:
    """Whether a DeepEthogram project's split holds records for evaluation."""
    return cfg.video.deepethogram is not None and cfg.video.val_fraction > 0
