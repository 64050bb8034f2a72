"""gpufeed.models: networks that take uint8 pixels, with their preprocessing facts attached.

``create_model(name, num_classes=...)`` builds any registered network; ``model.spec`` (a
:class:`ModelSpec`) holds mean, std, input size, layout and clip length, and is what checkpoints,
ONNX model cards and the server read. :func:`export_model` writes ``model.onnx`` (uint8 in,
normalisation inside, run at a set of fixed batch sizes) and ``model_card.json`` (:class:`ModelCard`).
"""

from gpufeed.models._card import (
    BATCH_DIM,
    CARD_FILE,
    ONNX_FILE,
    ModelCard,
    ModelCardError,
    check_batch_sizes,
    default_batch_sizes,
    read_model_card,
)
from gpufeed.models._export import ExportError, export_model, parity_inputs, parity_tolerance, resolve_batch_sizes
from gpufeed.models._io import (
    CHECKPOINT_DIR,
    checkpoint_path,
    find_checkpoint,
    list_checkpoints,
    load_model,
    model_state,
    untrained_checkpoint,
)
from gpufeed.models._nets import GpufeedModel
from gpufeed.models._registry import create_model, default_spec, list_models, model_from_spec, register_model
from gpufeed.models._spec import IMAGENET_MEAN, IMAGENET_STD, ModelSpec

__all__ = [
    "BATCH_DIM",
    "CARD_FILE",
    "CHECKPOINT_DIR",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ONNX_FILE",
    "ExportError",
    "GpufeedModel",
    "ModelCard",
    "ModelCardError",
    "ModelSpec",
    "check_batch_sizes",
    "checkpoint_path",
    "create_model",
    "default_batch_sizes",
    "default_spec",
    "export_model",
    "find_checkpoint",
    "list_checkpoints",
    "list_models",
    "load_model",
    "model_from_spec",
    "model_state",
    "parity_inputs",
    "parity_tolerance",
    "read_model_card",
    "register_model",
    "resolve_batch_sizes",
    "untrained_checkpoint",
]
