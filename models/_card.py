"""The model card: what ``gpufeed export`` writes beside ``model.onnx`` and the server reads.

A model folder (``MODEL_DIR``) holds::

    model.onnx          uint8 input, normalisation inside, float32 logits out
    model_card.json     this card (format "gpufeed-model-card", version 1)

The card carries every preprocessing fact the server needs (input name, shape, layout, size,
crop fraction, clip length, labels), the batch sizes the graph is run at (``batch_sizes``,
ascending; the last is the largest, ``batch_size``), the facts a reader wants (precision, opset,
mean/std, parity with PyTorch per batch size, the source checkpoint) and the full
:class:`~gpufeed.models.ModelSpec`.

A card that lists one batch size N goes with a graph whose batch dimension is fixed at N (cards
written before batch sizes came in hold only ``batch_size`` and read as exactly that). A card
that lists several goes with a graph whose batch dimension is symbolic; whoever runs it fixes
that dimension to one listed size per onnxruntime session (a free-dimension override), so each
session still sees static shapes, as TensorRT engines and CUDA graphs want.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufeed.core import write_json
from gpufeed.models._spec import ModelSpec

__all__ = [
    "BATCH_DIM",
    "CARD_FILE",
    "CARD_FORMAT",
    "MAX_EXPORT_BATCH_SIZE",
    "ONNX_FILE",
    "ModelCard",
    "ModelCardError",
    "check_batch_sizes",
    "default_batch_sizes",
    "read_model_card",
]

CARD_FILE = "model_card.json"
ONNX_FILE = "model.onnx"
CARD_FORMAT = "gpufeed-model-card"
CARD_VERSION = 1
PRECISIONS = ("fp32", "fp16")
# The symbolic batch dimension of a graph exported for several batch sizes: each onnxruntime
# session fixes it to one of them (SessionOptions.add_free_dimension_override_by_name).
BATCH_DIM = "batch"


class ModelCardError(ValueError):
    """A model card is missing, unreadable or inconsistent; the message names the file and field."""


# Export's parity check renders and runs two batches of the largest size on the host: 2 x 4096
# ResNet-18 inputs at 224 px hold some 13 GB of activations. A larger load takes more replicas.
MAX_EXPORT_BATCH_SIZE = 4096


def default_batch_sizes(largest: int) -> tuple[int, ...]:
    """Powers of two below ``largest``, then ``largest``: 8 -> (1, 2, 4, 8), 12 -> (1, 2, 4, 8, 12).

    Each formed batch runs at the smallest of these that holds it, so a lone request pays for
    one row and a batch of k at most for 2k - 1 rows.
    """
    if largest < 1:
        raise ValueError(f"the largest batch size {largest} must be >= 1")
    sizes, n = [], 1
    while n < largest:
        sizes.append(n)
        n *= 2
    return (*sizes, largest)


def check_batch_sizes(sizes, what: str = "batch_sizes") -> tuple[int, ...]:
    """``sizes`` as a tuple if it is a non-empty, strictly ascending list of integers >= 1.

    Raises:
        ValueError: Naming ``what`` and the bad value.
    """
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise ValueError(f"{what} must be a list of integers, got {sizes!r}")
    sizes = tuple(sizes)
    if not sizes:
        raise ValueError(f"{what} must list at least one batch size")
    for n in sizes:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"{what} {list(sizes)}: {n!r} is not an integer >= 1")
    if any(b <= a for a, b in itertools.pairwise(sizes)):
        raise ValueError(f"{what} {list(sizes)} must be strictly ascending, e.g. [1, 2, 4, 8]")
    return sizes


@dataclass(frozen=True)
class ModelCard:
    """The facts about one exported model.

    Attributes:
        name: The model's name (``--name``; defaults to the model folder's name).
        spec: The network's :class:`ModelSpec` (architecture, task, size, mean/std, labels ...).
        batch_size: The largest batch size N (the last of ``batch_sizes``).
        batch_sizes: Every batch size the graph is run at, ascending (default: ``(batch_size,)``,
            a graph with its batch dimension fixed at N).
        precision: ``fp32`` or ``fp16`` (fp16 computes in half precision; input stays uint8 and
            the output float32).
        opset: ONNX opset of the graph.
        input_name, output_name: Graph input (uint8, ``spec.input_shape(n)``) and output
            (float32 logits ``(n, num_classes)``; a dense model's ``(n, num_classes, H, W)`` maps) for a
            batch of n, one of ``batch_sizes``.
        parity: How the ONNX output compared with PyTorch's at export: ``max_abs_diff`` (the
            worst over every batch size), the task's agreement figure (``top1_agreement`` for
            image and clip models, ``pixel_agreement`` for segmentation, ``depth_rel_diff`` for
            depth: :mod:`gpufeed.models._parity`), ``per_batch_size`` (``{"n": {"max_abs_diff",
            <that figure>}}``), ``tolerance``, ``samples``, ``inputs`` (what was fed).
        source_checkpoint: The checkpoint it was exported from, as given.
        onnx_sha256: Digest of ``model.onnx``, to tell exports apart.
        extra: Anything else recorded (versions, export time).
    """

    name: str
    spec: ModelSpec
    batch_size: int
    precision: str = "fp32"
    opset: int = 18
    input_name: str = "pixels"
    output_name: str = "logits"
    parity: dict = field(default_factory=dict)
    source_checkpoint: str = ""
    onnx_sha256: str = ""
    extra: dict = field(default_factory=dict)
    batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ModelCardError(f"model card {self.name!r}: batch_size {self.batch_size} must be >= 1")
        try:
            sizes = check_batch_sizes(self.batch_sizes or (self.batch_size,))
        except ValueError as err:
            raise ModelCardError(f"model card {self.name!r}: {err}") from None
        if sizes[-1] != self.batch_size:
            raise ModelCardError(
                f"model card {self.name!r}: the largest of batch_sizes {list(sizes)} must equal batch_size "
                f"{self.batch_size}"
            )
        object.__setattr__(self, "batch_sizes", sizes)
        if self.precision not in PRECISIONS:
            raise ModelCardError(
                f"model card {self.name!r}: precision {self.precision!r} is not allowed; allowed: {', '.join(PRECISIONS)}"
            )

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The input shape at the largest batch size N: ``(N, 3, H, W)`` or ``(N, 3, T, H, W)``."""
        return self.spec.input_shape(self.batch_size)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """One sample's shape (the input shape without the batch dimension)."""
        return self.input_shape[1:]

    @property
    def labels(self) -> tuple[str, ...]:
        """Class names in output order (``class_<i>`` where the spec names none)."""
        return self.spec.labels or tuple(f"class_{i}" for i in range(self.spec.num_classes))

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "format": CARD_FORMAT,
            "format_version": CARD_VERSION,
            "name": self.name,
            "architecture": spec.name,
            "task": spec.task,
            "multilabel": spec.multilabel,
            "batch_size": self.batch_size,
            "batch_sizes": list(self.batch_sizes),
            "precision": self.precision,
            "opset": self.opset,
            "input": {
                "name": self.input_name,
                "dtype": "uint8",
                "shape": list(self.input_shape),
                "layout": spec.input_layout,
                "color": "RGB",
            },
            "output": {"name": self.output_name, "dtype": "float32", "shape": list(spec.output_shape(self.batch_size))},
            "size_px": spec.to_dict()["size_px"],
            "width_px": spec.size_px.width_px,
            "height_px": spec.size_px.height_px,
            "eval_crop_fraction": spec.eval_crop_fraction,
            "clip_length_frames": spec.clip_length_frames,
            "num_classes": spec.num_classes,
            "labels": list(spec.labels),
            "normalization": {
                "inside_model": True,
                "formula": "(pixels / 255 - mean) / std",
                "mean": list(spec.mean),
                "std": list(spec.std),
            },
            "preprocessing": self._preprocessing(),
            "scores": spec.head.scores,
            "parity": dict(self.parity),
            "source_checkpoint": self.source_checkpoint,
            "onnx_file": ONNX_FILE,
            "onnx_sha256": self.onnx_sha256,
            "model_spec": spec.to_dict(),
            "extra": dict(self.extra),
        }

    def _preprocessing(self) -> str:
        """The card's one-line account of what is done to the pixels before the model (for people)."""
        spec = self.spec
        size = f"{spec.size_px.width_px}x{spec.size_px.height_px} (width x height)"
        sampling = self.extra.get("clip_sampling")
        if spec.head.takes_clips and isinstance(sampling, dict):
            fit = (
                f"resize each frame to {size}, aspect not kept"
                if sampling.get("fit", "stretch") == "stretch"
                else f"centre-crop each frame to the aspect of {size}, resize to it"
            )
            return (
                f"decode every frame RGB in order, {fit}; windows of {spec.clip_length_frames} frames "
                f"{sampling.get('stride_frames', 1)} apart, uint8 {spec.input_layout}"
            )
        return (
            f"decode RGB, scale so that {size} / eval_crop_fraction just fits inside the image, "
            f"centre-crop width_px x height_px, uint8 {spec.input_layout}"
        )

    @classmethod
    def from_dict(cls, data: Any, where: str = "model card") -> ModelCard:
        """Rebuild a card, checking the fields the server relies on.

        Raises:
            ModelCardError: Naming ``where`` and the bad or missing field.
        """
        if not isinstance(data, dict):
            raise ModelCardError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if data.get("format") != CARD_FORMAT:
            raise ModelCardError(f"{where}: field 'format' is {data.get('format')!r}, expected {CARD_FORMAT!r}")
        if data.get("format_version") != CARD_VERSION:
            raise ModelCardError(
                f"{where}: field 'format_version' is {data.get('format_version')!r}; this gpufeed reads {CARD_VERSION}"
            )
        for key in ("name", "model_spec", "batch_size", "input", "output"):
            if key not in data:
                raise ModelCardError(f"{where}: required field {key!r} is missing")
        try:
            spec = ModelSpec.from_dict(data["model_spec"])
        except (TypeError, ValueError) as err:
            raise ModelCardError(f"{where}: field 'model_spec' is invalid: {err}") from None
        batch_size = data["batch_size"]
        if not isinstance(batch_size, int) or isinstance(batch_size, bool):
            raise ModelCardError(f"{where}: field 'batch_size' must be an integer, got {batch_size!r}")
        try:  # cards written before batch sizes came in hold batch_size alone
            batch_sizes = check_batch_sizes(data.get("batch_sizes", [batch_size]), "field 'batch_sizes'")
        except ValueError as err:
            raise ModelCardError(f"{where}: {err}") from None
        if batch_sizes[-1] != batch_size:
            raise ModelCardError(
                f"{where}: field 'batch_sizes' {list(batch_sizes)} must end with batch_size {batch_size}"
            )
        card = cls(
            name=str(data["name"]),
            spec=spec,
            batch_size=batch_size,
            batch_sizes=batch_sizes,
            precision=data.get("precision", "fp32"),
            opset=int(data.get("opset", 18)),
            input_name=str(data["input"].get("name", "pixels")),
            output_name=str(data["output"].get("name", "logits")),
            parity=dict(data.get("parity", {})),
            source_checkpoint=str(data.get("source_checkpoint", "")),
            onnx_sha256=str(data.get("onnx_sha256", "")),
            extra=dict(data.get("extra", {})),
        )
        declared = data["input"].get("shape")
        if declared is not None and list(declared) != list(card.input_shape):
            raise ModelCardError(
                f"{where}: field 'input.shape' {declared} disagrees with model_spec and batch_size {list(card.input_shape)}"
            )
        return card

    def write(self, model_dir: str | Path) -> Path:
        return write_json(Path(model_dir) / CARD_FILE, self.to_dict())

    def summary(self) -> dict:
        """A short dict for logs: name, architecture, input shape, precision."""
        return {
            "name": self.name,
            "architecture": self.spec.name,
            "input": f"{self.input_name} uint8 {list(self.input_shape)} {self.spec.input_layout}",
            "batch_sizes": list(self.batch_sizes),
            "precision": self.precision,
        }


def read_model_card(model_dir: str | Path) -> ModelCard:
    """Read ``MODEL_DIR/model_card.json``.

    Raises:
        ModelCardError: The folder, card or ``model.onnx`` is missing, or the card is invalid.
    """
    model_dir = Path(model_dir)
    path = model_dir / CARD_FILE
    # A checkpoint or a training run where an exported model goes: say how to make one from it.
    export = f"export it first: gpufeed export {model_dir} --out MODEL_DIR, and give MODEL_DIR"
    if model_dir.is_file() and model_dir.suffix == ".pt":
        raise ModelCardError(f"{model_dir} is a checkpoint, not an exported model folder: {export}")
    if not model_dir.is_dir():
        raise ModelCardError(f"model folder {model_dir} does not exist or is not a folder")
    if not path.is_file() and (model_dir / "checkpoints").is_dir():
        raise ModelCardError(f"{model_dir} is a training run folder, not an exported model folder: {export}")
    if not path.is_file():
        raise ModelCardError(f"{path} is missing: a model folder needs {CARD_FILE} and {ONNX_FILE} (gpufeed export)")
    if not (model_dir / ONNX_FILE).is_file():
        raise ModelCardError(f"{model_dir / ONNX_FILE} is missing (the card {path} is there)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelCardError(f"{path} is not readable JSON: {err}") from None
    return ModelCard.from_dict(data, where=str(path))
