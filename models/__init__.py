"""gpufeed.models: networks that take uint8 pixels, with their preprocessing facts attached.

``create_model(name, num_classes=...)`` builds any registered network; ``model.spec`` (a
:class:`ModelSpec`) holds mean, std, input size, layout and clip length, and is what checkpoints,
ONNX model cards and the server read. ``spec.head`` (a :class:`TaskHead`, one class per task,
registered with :func:`register_head`) says what the task accepts, what it outputs and answers,
and how export checks it. :func:`export_model` writes ``model.onnx`` (uint8 in,
normalisation inside, run at a set of fixed batch sizes) and ``model_card.json`` (:class:`ModelCard`). :func:`score_frames` turns a clip model's window
scores into per-frame probabilities (:class:`WindowPlan`: the windows and the rule), the one
scoring path of ``gpufeed predict`` and the server's video input.

``__all__`` holds what users call, each name listed in the API reference (``docs/api/``);
checkpoint paths, batch-size helpers, parity checks and file names live in the private ``_*``
modules. The names that gpufeed's other packages use are re-exported below ``as`` themselves (not
in the reference; they change with their users), so no package imports another's private modules.
"""

# For gpufeed's own packages: the names they use from this package's private modules, re-exported
# here (``as`` marks a re-export) so no package reaches into another's ``_*`` modules. Not in the
# API reference; they may change with the code that uses them.
from gpufeed.models._card import BATCH_DIM as BATCH_DIM
from gpufeed.models._card import CARD_FILE as CARD_FILE
from gpufeed.models._card import ONNX_FILE as ONNX_FILE
from gpufeed.models._card import ModelCard, ModelCardError, read_model_card
from gpufeed.models._card import default_batch_sizes as default_batch_sizes
from gpufeed.models._clip_sampling import ClipSampling
from gpufeed.models._dense_heads import DenseHead
from gpufeed.models._export import ExportError, export_model
from gpufeed.models._export import parity_tolerance as parity_tolerance
from gpufeed.models._export import resolve_batch_sizes as resolve_batch_sizes
from gpufeed.models._frame_scores import FrameScores, WindowBatch, WindowPlan, WindowScorer, score_frames
from gpufeed.models._frame_scores import gather_clips as gather_clips
from gpufeed.models._head import Outputs, OutputTensor, TaskHead
from gpufeed.models._heads import ClassifierHead, head_for, list_tasks, register_head
from gpufeed.models._io import CHECKPOINT_DIR as CHECKPOINT_DIR
from gpufeed.models._io import checkpoint_path, find_checkpoint, load_model, model_state
from gpufeed.models._io import list_checkpoints as list_checkpoints
from gpufeed.models._io import nonfinite_weights as nonfinite_weights
from gpufeed.models._io import read_checkpoint as read_checkpoint
from gpufeed.models._io import untrained_checkpoint as untrained_checkpoint
from gpufeed.models._nets import GpufeedModel
from gpufeed.models._registry import create_model, list_models, register_model
from gpufeed.models._registry import default_spec as default_spec
from gpufeed.models._sliding_runner import RUN_WINDOWS as RUN_WINDOWS
from gpufeed.models._sliding_runner import SlidingRunner as SlidingRunner
from gpufeed.models._sliding_runner import sliding_runner as sliding_runner
from gpufeed.models._sliding_stem import SlidingStemError as SlidingStemError
from gpufeed.models._sliding_stem import sliding_window_graph as sliding_window_graph
from gpufeed.models._spec import IMAGENET_MEAN as IMAGENET_MEAN
from gpufeed.models._spec import IMAGENET_STD as IMAGENET_STD
from gpufeed.models._spec import ModelSpec

__all__ = [
    "ClassifierHead",
    "ClipSampling",
    "DenseHead",
    "ExportError",
    "FrameScores",
    "GpufeedModel",
    "ModelCard",
    "ModelCardError",
    "ModelSpec",
    "OutputTensor",
    "Outputs",
    "TaskHead",
    "WindowBatch",
    "WindowPlan",
    "WindowScorer",
    "checkpoint_path",
    "create_model",
    "export_model",
    "find_checkpoint",
    "head_for",
    "list_models",
    "list_tasks",
    "load_model",
    "model_state",
    "read_model_card",
    "register_head",
    "register_model",
    "score_frames",
]
