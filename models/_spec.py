"""Preprocessing facts stored with every model: the one source the pipelines, export and server read.

A model's :class:`ModelSpec` says what it takes (uint8, layout, size, clip length), how it
normalises (mean and std, applied *inside* the model), and what it outputs (classes, single- or
multi-label). ``ModelSpec.to_dict`` is what checkpoints and ONNX model cards carry, so nobody
re-derives these numbers. What a task means (its input layout, its outputs, what a server answers)
is its head's to say: ``spec.head`` (:mod:`gpufeed.models._heads`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from gpufeed.core import SizePx, parse_size_px
from gpufeed.models._head import TaskHead
from gpufeed.models._heads import head_for

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ModelSpec"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ModelSpec:
    """What a model takes and gives.

    Attributes:
        name: Registry name, e.g. ``resnet18``.
        task: ``image`` (input ``N,3,H,W``), ``clip`` (input ``N,3,T,H,W``), or a dense task,
            ``depth`` or ``segmentation`` (input ``N,3,H,W``, output maps ``N,C,H,W``): a task a
            head is registered for (:attr:`head`, :func:`~gpufeed.models.register_head`).
        num_classes: Output logits per sample.
        multilabel: Sigmoid per class (behaviour clips) rather than softmax over classes.
        mean, std: Per-channel normalisation on [0, 1] pixels, applied inside the model.
        size_px: Input size the model was built and trained for, as ``image.size_px`` /
            ``video.size_px``. Given as a :class:`~gpufeed.config.SizePx`, one number (a square) or
            ``(width, height)``; held as a ``SizePx``. Checkpoints and model cards store it as
            the config writes it (``224`` or ``[352, 224]``), which :meth:`from_dict` reads back.
        eval_crop_fraction: Evaluation/serving crop: scale the image so the input size enlarged
            by ``1 / fraction`` just fits, then take the centre.
        clip_length_frames: Frames per clip (clip models only).
        labels: Class names in output order (empty: unnamed).
        depth_scale: Depth models: map value x this = the output's unit (``data.depth_scale``);
            served 16-bit PNGs divide by it, so they hold the training maps' values.
        map_fill: Dense models: the map value for "nothing here" (``data.depth_no_data``, or
            ``data.mask_ignore_id`` for segmentation), written outside the crop window when a
            served map is placed back at the input's size.
    """

    name: str
    task: str
    num_classes: int
    multilabel: bool = False
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    size_px: SizePx = SizePx(224, 224)
    eval_crop_fraction: float = 0.875
    clip_length_frames: int | None = None
    labels: tuple[str, ...] = field(default_factory=tuple)
    depth_scale: float = 1.0
    map_fill: int = 0

    def __post_init__(self) -> None:
        # The one place a model's size is read: a card's list, a checkpoint's int or tuple, or a
        # Python caller's value all become the SizePx everything downstream takes.
        try:
            object.__setattr__(self, "size_px", parse_size_px(self.size_px))
        except ValueError as err:  # ConfigError: its message names the value and the allowed sizes
            raise ValueError(f"model {self.name!r}: size_px: {getattr(err, 'message', err)}") from None
        self.head.check()  # an unknown task, or a fact the task needs (a clip model's length)
        if self.labels and len(self.labels) != self.num_classes:
            raise ValueError(f"model {self.name!r}: {len(self.labels)} labels for {self.num_classes} classes")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"model {self.name!r}: std {self.std} must be positive")

    @property
    def head(self) -> TaskHead:
        """The model's task head: what its task takes, outputs and answers (:func:`~gpufeed.models.head_for`)."""
        return head_for(self)

    @property
    def input_layout(self) -> str:
        """``NCHW`` for images, ``NCTHW`` for clips."""
        return self.head.input_layout

    def input_shape(self, batch_size: int) -> tuple[int, ...]:
        """The uint8 input shape for ``batch_size`` samples."""
        return self.head.input_shape(batch_size)

    def output_shape(self, batch_size: int) -> tuple[int, ...]:
        """The float32 output shape for ``batch_size`` samples: ``(N, C)``, or ``(N, C, H, W)`` when dense."""
        return self.head.output_shape(batch_size)

    def with_updates(self, **changes) -> ModelSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        data = asdict(self)
        size = self.size_px.config_value()  # as the config writes it: 224, or [352, 224]
        data["size_px"] = list(size) if isinstance(size, tuple) else size
        data["width_px"], data["height_px"] = self.size_px
        data["input_layout"] = self.input_layout
        return data

    @classmethod
    def from_dict(cls, data: dict) -> ModelSpec:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for key in ("mean", "std", "labels"):
            if key in known and known[key] is not None:
                known[key] = tuple(known[key])
        return cls(**known)
