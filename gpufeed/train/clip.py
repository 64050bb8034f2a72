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
``shard_id`` / ``num_shards`` / ``seed``. Only :func:`build_clip_data` below depends on how it is
constructed and configured (the ``video`` config section belongs to the video pipeline).
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


def build_clip_data(cfg: Config, device, dist: DistInfo):
    """The clip task and this rank's clip loaders, from the ``video`` config section.

    Raises:
        ConfigError: The config has no ``video`` section, or this gpufeed has no ``ClipLoader``.
    """
    from gpufeed.train.data import TrainData, _num_classes

    video_cfg = getattr(cfg, "video", None)
    if video_cfg is None:
        raise ConfigError("video", f"model {cfg.model.name!r} is a clip model and needs the 'video' config section")
    try:
        from gpufeed.pipelines import ClipLoader
    except ImportError:
        raise ConfigError(
            "model.name",
            f"model {cfg.model.name!r} is a clip model, but this gpufeed has no gpufeed.pipelines.ClipLoader",
        ) from None

    # Wiring to the video loader, written against the contract before that loader existed: its
    # constructor, the behaviour names (``labels``), the evaluation split (``video_cfg.val``: null
    # for none) and the clip geometry (``clip_length_frames``, ``size_px``) are read only here.
    def loader(train: bool):
        return ClipLoader(
            video_cfg,
            train=train,
            loader_cfg=cfg.loader,
            device=device,
            shard_id=dist.rank,
            num_shards=dist.world_size,
            seed=cfg.seed,
        )

    train_loader = loader(True)
    labels = tuple(getattr(train_loader, "labels", ()) or ())
    num_classes = _num_classes(cfg, len(labels)) if labels else cfg.model.num_classes
    if num_classes is None:
        raise ConfigError("model.num_classes", "the clip loader does not name its behaviours: set the number here")
    return TrainData(
        task=ClipTask(num_classes, labels if len(labels) == num_classes else ()),
        train=train_loader,
        val=None if getattr(video_cfg, "val", "") is None else loader(False),
        spec_overrides={
            "num_classes": num_classes,
            "labels": labels if len(labels) == num_classes else (),
            "clip_length_frames": video_cfg.clip_length_frames,
            "size_px": video_cfg.size_px,
        },
    )
