"""The clip task: multi-label behaviour clips, and the one place that touches the video loader.

A clip model (``clip_resnet18``, ``r3d_small``) learns the behaviours active at each clip's centre
frame: binary cross-entropy with logits against ``centre_labels``, evaluated as per-class F1.

Batches follow the ``ClipBatch`` contract of ``gpufeed.pipelines.ClipLoader`` (the video issue)::

    clips          uint8   (N, 3, T, H, W)  on the device
    frame_labels   float32 (N, T, K)        multi-hot per frame
    centre_labels  float32 (N, K)           multi-hot of frame T // 2 (the training target)
    video_ids      int64   (N,)
    start_frames   int64   (N,)
    valid          bool    (N,)             False for padding rows

and ``ClipLoader`` has the surface of ``ImageLoader``: ``len()``, one epoch per ``for``,
``set_epoch``, ``state_dict()`` / ``load_state_dict()``, ``skipped``, built per rank with
``shard_id`` / ``num_shards`` / ``seed`` from the ``video`` config section. Only
:func:`build_clip_data` below depends on how it is constructed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gpufeed.config import Config, ConfigError
from gpufeed.train.distributed import DistInfo
from gpufeed.train.tasks import MultiLabelF1, Task

__all__ = ["ClipTask", "build_clip_data"]


class ClipTask(Task):
    """Multi-label clips: BCE-with-logits on the centre frame's labels, per-class F1."""

    name = "clip"
    clips = True
    primary_metric = "macro_f1"

    def __init__(self, num_classes: int, labels: tuple[str, ...] = ()) -> None:
        self.num_classes = num_classes
        self.labels = tuple(labels)

    def inputs(self, batch) -> torch.Tensor:
        return batch.clips

    def targets(self, batch) -> torch.Tensor:
        return batch.centre_labels

    def per_sample_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if logits.shape != targets.shape:
            raise ValueError(
                f"clip logits {tuple(logits.shape)} do not match centre_labels {tuple(targets.shape)}: "
                "the model's num_classes must equal the number of behaviours"
            )
        return F.binary_cross_entropy_with_logits(logits, targets.float(), reduction="none").mean(dim=1)

    def new_metric(self) -> MultiLabelF1:
        return MultiLabelF1(self.num_classes, self.labels)


def build_clip_data(cfg: Config, device, dist: DistInfo, augment=None):
    """The clip task and this rank's clip loaders, from the ``video`` config section.

    ``augment`` is the training loader's share of the augmentation (a ``LoaderAugment``, or ``None``).

    Raises:
        DatasetError: ``video.train`` is not set or its videos cannot be used.
        ConfigError: ``model.num_classes`` disagrees with the number of behaviours.
    """
    from gpufeed.pipelines import ClipLoader
    from gpufeed.train.data import TrainData

    if cfg.video.train is None:
        raise ConfigError(
            "video.train", f"model {cfg.model.name!r} is a clip model and needs a folder of training videos"
        )

    def loader(train: bool) -> ClipLoader:
        return ClipLoader.from_config(
            cfg,
            train=train,
            device=device,
            shard_id=dist.rank,
            num_shards=dist.world_size,
            augment=augment if train else None,
        )

    train_loader = loader(True)
    labels = tuple(train_loader.behaviours)
    num_classes = len(labels)
    if cfg.model.num_classes not in (None, num_classes):
        # One logit per behaviour column: BCE compares them one to one with the centre frame's labels.
        raise ConfigError(
            "model.num_classes",
            f"value {cfg.model.num_classes} does not match the {num_classes} behaviours {list(labels)} "
            f"of the videos in {cfg.video.train}; set null to use them",
        )
    return TrainData(
        task=ClipTask(num_classes, labels),
        train=train_loader,
        val=None if cfg.video.val is None else loader(False),
        spec_overrides={
            "num_classes": num_classes,
            "labels": labels,
            "clip_length_frames": cfg.video.clip_length_frames,
            "size_px": cfg.video.size_px,
        },
    )
