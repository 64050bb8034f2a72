"""gpufeed.models: networks that take uint8 pixels, with their preprocessing facts attached.

``create_model(name, num_classes=...)`` builds any registered network; ``model.spec`` (a
:class:`ModelSpec`) holds mean, std, input size, layout and clip length, and is what checkpoints,
ONNX model cards and the server read.
"""

from gpufeed.models._io import (
    CHECKPOINT_DIR,
    checkpoint_path,
    find_checkpoint,
    list_checkpoints,
    load_model,
    model_state,
)
from gpufeed.models._nets import GpufeedModel
from gpufeed.models._registry import create_model, default_spec, list_models, model_from_spec, register_model
from gpufeed.models._spec import IMAGENET_MEAN, IMAGENET_STD, ModelSpec

__all__ = [
    "CHECKPOINT_DIR",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "GpufeedModel",
    "ModelSpec",
    "checkpoint_path",
    "create_model",
    "default_spec",
    "find_checkpoint",
    "list_checkpoints",
    "list_models",
    "load_model",
    "model_from_spec",
    "model_state",
    "register_model",
]
