"""One factory for every network: ``create_model(name, num_classes=..., **spec_overrides)``."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from torch import nn

from gpufeed.models._nets import GpufeedModel, R3DSmall, ResNet18, SmallCNN, StackedFrameResNet18
from gpufeed.models._spec import ModelSpec
from gpufeed.models._unet import UNetResNet18

__all__ = ["create_model", "default_spec", "list_models", "model_from_spec", "register_model"]


@dataclass(frozen=True)
class _Entry:
    build: Callable[[ModelSpec], nn.Module]
    defaults: dict


_REGISTRY: dict[str, _Entry] = {}


def register_model(name: str, build: Callable[[ModelSpec], nn.Module], **defaults) -> None:
    """Add a network: ``build(spec) -> backbone``; ``defaults`` fill the :class:`ModelSpec`."""
    if name in _REGISTRY:
        raise ValueError(f"model {name!r} is already registered")
    _REGISTRY[name] = _Entry(build, defaults)


def list_models() -> list[str]:
    """The registered network names, sorted: what ``create_model`` and ``model.name`` accept."""
    return sorted(_REGISTRY)


def _unknown(name: str) -> str:
    """The one line for a model name not registered: the likely one first, then every known one."""
    near = difflib.get_close_matches(str(name), list_models(), n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"model {name!r} is not known{hint}; known models: {', '.join(list_models())}"


def default_spec(name: str, **overrides) -> ModelSpec:
    """The :class:`ModelSpec` a model gets unless told otherwise."""
    if name not in _REGISTRY:
        raise ValueError(_unknown(name))
    fields = {"name": name, "num_classes": 1000, **_REGISTRY[name].defaults}
    given = {k: v for k, v in overrides.items() if v is not None}
    if given.get("labels") and "num_classes" not in given:  # one output per label, as written
        given["num_classes"] = len(given["labels"])
    fields.update(given)
    return ModelSpec(**fields)


def model_from_spec(spec: ModelSpec) -> GpufeedModel:
    """Build the network a spec describes (fresh weights); used when loading checkpoints."""
    if spec.name not in _REGISTRY:
        raise ValueError(_unknown(spec.name))
    return GpufeedModel(spec, _REGISTRY[spec.name].build(spec))


def create_model(name: str, **spec_overrides) -> GpufeedModel:
    """A fresh model by registry name, e.g. ``create_model("resnet18", num_classes=4)``.

    Keyword arguments override :class:`ModelSpec` fields (``num_classes``, ``size_px``,
    ``clip_length_frames``, ``labels``, ``mean``, ``std`` ...). ``labels`` without ``num_classes``
    gives one output per label: ``create_model("smallcnn", labels=loader.dataset.classes)``.
    """
    return model_from_spec(default_spec(name, **spec_overrides))


register_model("resnet18", lambda s: ResNet18(s.num_classes), task="image")
register_model("smallcnn", lambda s: SmallCNN(s.num_classes), task="image")
register_model(
    "clip_resnet18",
    # ModelSpec refuses a clip model without clip_length_frames.
    lambda s: StackedFrameResNet18(s.num_classes, cast(int, s.clip_length_frames)),
    task="clip",
    multilabel=True,
    clip_length_frames=11,
    size_px=112,
)
register_model(
    "r3d_small", lambda s: R3DSmall(s.num_classes), task="clip", multilabel=True, clip_length_frames=11, size_px=112
)
# Dense maps: the task (depth or segmentation) and the output channels come from the data and model.task.
register_model("unet_resnet18", lambda s: UNetResNet18(s.num_classes), task="depth", num_classes=1)
