"""ONNX export: uint8 in, normalisation inside, a set of batch sizes, parity checked at each.

``export_model(checkpoint, out_dir, batch_sizes=(1, 2, 4, 8))`` writes ``out_dir/model.onnx`` and
``out_dir/model_card.json``:

* **Graph**: input ``pixels`` uint8 ``spec.input_shape(n)`` (NCHW images, NCTHW clips), output
  ``logits`` float32 ``(n, num_classes)``. With one batch size N the batch dimension is fixed at
  N in the file. With several, it is the symbolic ``batch`` and every runner fixes it per
  onnxruntime session (a free-dimension override), one session per size: each session plans for
  static shapes, as TensorRT and CUDA graphs want, while the file and its weights exist once. The
  server runs each batch on the smallest size that holds it. Normalisation is the graph's first
  three nodes (Cast, Mul, Add), so nobody re-implements it.
* **fp16**: the backbone computes in half precision; normalisation stays in float32 (a uint8
  pixel does not survive ``/ 255`` well in half) and the logits are cast back to float32, so the
  server's handling does not change with precision.
* **Checks**: the ONNX checker (full check, with shape inference), then onnxruntime against the
  float32 PyTorch model on real inputs, once per batch size (a session fixed at that size, as the
  server makes them): synthetic JPEG/PNG images through gpufeed's evaluation pipeline (exactly
  what the server feeds), or rendered behaviour-video frames for clip models. The max absolute
  difference per size is printed and recorded; above the tolerance at any size the export fails
  and leaves no model behind.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gpufeed.core import atomic_path
from gpufeed.models._card import (
    BATCH_DIM,
    MAX_EXPORT_BATCH_SIZE,
    ONNX_FILE,
    PRECISIONS,
    ModelCard,
    check_batch_sizes,
    default_batch_sizes,
)
from gpufeed.models._clip_sampling import ClipSampling
from gpufeed.models._head import Agreement
from gpufeed.models._io import find_checkpoint, load_model, read_checkpoint
from gpufeed.models._nets import GpufeedModel
from gpufeed.models._spec import ModelSpec

__all__ = ["ExportError", "export_model", "parity_inputs", "parity_tolerance", "resolve_batch_sizes"]

log = logging.getLogger("gpufeed")

DEFAULT_OPSET = 18
_MIN_OPSET = 7  # the oldest onnxruntime runs; what the exporter really wrote is checked after export
# Tolerance on |onnx - torch fp32| relative to the logits' scale: max(1, max |logit|) times this.
_RELATIVE_TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2}


class ExportError(RuntimeError):
    """Export failed: the checker rejected the graph, or onnxruntime disagrees with PyTorch."""


class _Exportable(nn.Module):
    """The model as exported: uint8 in, float32 logits out, optionally fp16 inside."""

    def __init__(self, model: GpufeedModel, precision: str) -> None:
        super().__init__()
        self.normalize = model.normalize
        self.backbone = model.backbone.half() if precision == "fp16" else model.backbone
        self.half_precision = precision == "fp16"

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.normalize(pixels)
        if self.half_precision:
            return self.backbone(x.half()).float()
        return self.backbone(x)


def parity_tolerance(precision: str, reference: np.ndarray) -> float:
    """The largest acceptable |onnx - torch| for ``precision`` given the reference logits."""
    scale = max(1.0, float(np.abs(reference).max(initial=0.0)))
    return _RELATIVE_TOLERANCE[precision] * scale


def parity_inputs(
    spec: ModelSpec, batch_size: int, batches: int = 2, data: str | Path | None = None, device=None
) -> tuple[np.ndarray, str]:
    """Real uint8 inputs for the parity check, ``batches * batch_size`` rows, and what they are (the head's)."""
    try:
        return spec.head.parity_inputs(batch_size, batches, data, device)
    except LookupError as err:
        raise ExportError(f"parity data {data or '(synthetic)'}: {err}") from None


def _onnx_session(path: Path, device, batch_size: int | None = None):
    """A session on the CPU (or CUDA) provider; ``batch_size`` fixes a symbolic batch dimension."""
    import onnxruntime as ort

    providers: list[str | tuple[str, dict[str, Any]]] = ["CPUExecutionProvider"]
    if device is not None and device.is_gpu and "CUDAExecutionProvider" in ort.get_available_providers():
        # TF32 would blur the comparison: parity checks the graph, not the GPU's fast math.
        cuda = {"device_id": device.device_id, "use_tf32": 0}
        providers = [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if batch_size is not None:
        options.add_free_dimension_override_by_name(BATCH_DIM, batch_size)
    return ort.InferenceSession(str(path), options, providers=providers)


def _run_in_chunks(session, inputs: np.ndarray, batch_size: int) -> np.ndarray:
    """Logits for every row, ``batch_size`` rows per run; the last chunk is zero-padded, padding dropped."""
    out = []
    for start in range(0, len(inputs), batch_size):
        chunk = inputs[start : start + batch_size]
        if len(chunk) < batch_size:
            chunk = np.concatenate([chunk, np.zeros((batch_size - len(chunk), *chunk.shape[1:]), chunk.dtype)])
        out.append(session.run(["logits"], {"pixels": chunk})[0][: min(batch_size, len(inputs) - start)])
    return np.concatenate(out)


def resolve_batch_sizes(batch_size: int | None, batch_sizes) -> tuple[int, ...]:
    """The batch sizes to export from the two ways of asking (see :func:`export_model`).

    Raises:
        ValueError: Naming the bad value.
    """
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size {batch_size!r} must be an integer >= 1")
    if batch_sizes is None:
        sizes = default_batch_sizes(8 if batch_size is None else batch_size)
    else:
        sizes = check_batch_sizes(batch_sizes)
        if batch_size is not None and sizes[-1] != batch_size:
            raise ValueError(f"batch_sizes {list(sizes)} must end with batch_size {batch_size} (the largest)")
    if sizes[-1] > MAX_EXPORT_BATCH_SIZE:  # parity renders and runs two batches of it on the host
        raise ValueError(f"batch size {sizes[-1]} is above {MAX_EXPORT_BATCH_SIZE}, the largest export takes")
    return sizes


def _torch_export(module: nn.Module, example: torch.Tensor, path: Path, opset: int, dynamic_batch: bool) -> None:
    # The exporter and its optimiser log every pass (and warn about torchvision ops we never use).
    noisy = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in noisy]
    for logger in noisy:
        logger.setLevel(logging.ERROR)
    # A symbolic batch dimension keeps every shape computed from the input (a flatten is
    # Reshape [-1, C], not [N, C]), so one graph is valid at every batch size.
    dynamic = {"pixels": {0: torch.export.Dim(BATCH_DIM, min=1)}} if dynamic_batch else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                (example,),
                str(path),
                input_names=["pixels"],
                output_names=["logits"],
                opset_version=opset,
                dynamo=True,
                external_data=False,
                verbose=False,
                dynamic_shapes=dynamic,
            )
    finally:
        for logger, level in zip(noisy, levels, strict=True):
            logger.setLevel(level)


def _batch_dims(model) -> list:
    """The batch dimension (first) of every graph input and output."""
    return [v.type.tensor_type.shape.dim[0] for v in [*model.graph.input, *model.graph.output]]


def _check_opset(opset: int) -> None:
    import onnx

    newest = onnx.defs.onnx_opset_version()
    if not _MIN_OPSET <= opset <= newest:
        raise ExportError(f"opset {opset} is not one this exporter writes: {_MIN_OPSET} to {newest}")


def _add_metadata(path: Path, spec: ModelSpec, batch_sizes: tuple[int, ...], precision: str, opset: int) -> None:
    import onnx

    model = onnx.load(str(path))
    # The exporter writes opset 18 and converts down where it can; where it cannot it kept 18
    # without a word, and the card recorded the opset asked for.
    written = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if written != opset:
        raise ExportError(f"opset {opset}: torch's exporter wrote opset {written} for this model, not {opset}")
    if len(batch_sizes) > 1:
        dims = _batch_dims(model)
        if any(d.HasField("dim_value") for d in dims):
            raise ExportError(
                f"the exporter fixed the batch dimension of {path.name} at {[d.dim_value for d in dims]}; "
                f"batch sizes {list(batch_sizes)} need a symbolic one"
            )
        for dim in dims:  # one agreed name, which runners fix per session
            dim.dim_param = BATCH_DIM
    onnx.helper.set_model_props(
        model,
        {
            "gpufeed.model_spec": json.dumps(spec.to_dict()),
            "gpufeed.batch_size": str(batch_sizes[-1]),
            "gpufeed.batch_sizes": ",".join(map(str, batch_sizes)),
            "gpufeed.precision": precision,
        },
    )
    model.producer_name = "gpufeed"
    onnx.save(model, str(path))
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as err:
        raise ExportError(f"the ONNX checker rejected {path.name}: {err}") from None


def _load_for_export(source: str | Path) -> tuple[Path, dict, GpufeedModel]:
    """(checkpoint file, its contents, the model in eval mode) of ``source``; a bad file is an :class:`ExportError`."""
    checkpoint = find_checkpoint(source)
    try:
        state = read_checkpoint(checkpoint)
    except ValueError as err:  # not a checkpoint: one line naming the file and why
        raise ExportError(str(err)) from None
    try:
        model = load_model(state).eval()
    except Exception as err:  # a dict without the keys, or weights that do not fit its spec
        raise ExportError(f"cannot load a gpufeed model from {checkpoint}: {err}") from None
    return checkpoint, state, model


def _reference_logits(model: GpufeedModel, inputs: np.ndarray, batch_size: int) -> np.ndarray:
    """The float32 PyTorch model's outputs for every input row, ``batch_size`` rows at a time."""
    with torch.no_grad():
        return np.concatenate(
            [model(torch.from_numpy(inputs[i : i + batch_size])).numpy() for i in range(0, len(inputs), batch_size)]
        )


@dataclass(frozen=True)
class _Parity:
    """The parity check of one export: the inputs, PyTorch fp32's outputs for them and how close onnxruntime must come.

    Attributes:
        inputs: The uint8 input rows (:func:`parity_inputs`) and ``what`` they are, in words.
        reference: The float32 PyTorch model's outputs for them.
        tolerance: The largest acceptable max |diff| (:func:`parity_tolerance`).
        precision: The export's precision (``fp32``, ``fp16``), for the messages.
        agreement: The head's agreement figure (top-1 for classes, per pixel for masks, relative for depth).
    """

    inputs: np.ndarray
    what: str
    reference: np.ndarray
    tolerance: float
    precision: str
    agreement: Agreement

    def measure(self, path: Path, device, sizes: tuple[int, ...]) -> tuple[dict[int, dict], str]:
        """({batch size: its max |diff| and agreement}, the provider): onnxruntime at each size.

        A session per size, fixed at that size when the graph's batch dimension is symbolic
        (several sizes), as the server makes them.
        """
        per_size, provider = {}, ""
        for n in sizes:
            session = _onnx_session(path, device, n if len(sizes) > 1 else None)
            provider = session.get_providers()[0]
            got = _run_in_chunks(session, self.inputs, n)
            del session
            per_size[n] = {
                "max_abs_diff": float(np.abs(got - self.reference).max()),
                self.agreement.key: self.agreement.measure(got, self.reference),
            }
        return per_size, provider

    def check(self, path: Path, device, sizes: tuple[int, ...], *, checkpoint: Path, out_dir: Path) -> dict:
        """Measure the graph at ``path`` at every size, print the figures and return the card's parity record.

        Raises:
            ExportError: The max |diff| at some size is above the tolerance (or not finite).
        """
        per_size, provider = self.measure(path, device, sizes)
        agreement, tolerance = self.agreement, self.tolerance
        max_diff = max(p["max_abs_diff"] for p in per_size.values())  # NaN compares False: checked below
        if any(not np.isfinite(p["max_abs_diff"]) for p in per_size.values()):
            max_diff = float("nan")
        agreed = agreement.worst(p[agreement.key] for p in per_size.values())
        figures = ", ".join(f"batch {n}: {p['max_abs_diff']:.3g}" for n, p in per_size.items())
        print(
            f"parity onnxruntime ({provider}, {self.precision}) vs PyTorch fp32 on {len(self.inputs)} {self.what}: "
            f"max |diff| {max_diff:.3g} ({figures}; tolerance {tolerance:.3g}), {agreement.describe(agreed)}",
            flush=True,
        )
        if not np.isfinite(max_diff) or max_diff > tolerance:
            worst = [n for n, p in per_size.items() if not p["max_abs_diff"] <= tolerance]
            raise ExportError(
                f"onnxruntime disagrees with PyTorch for {checkpoint} at batch size(s) {worst}: max |diff| "
                f"{max_diff:.3g} is above the {self.precision} tolerance {tolerance:.3g}; no model was written to {out_dir}"
            )
        return {
            "max_abs_diff": max_diff,
            "per_batch_size": {str(n): p for n, p in per_size.items()},
            "tolerance": tolerance,
            agreement.key: agreed,
            "samples": len(self.inputs),
            "inputs": self.what,
            "reference": "PyTorch fp32 on the CPU",
            "provider": provider,
        }


def export_model(
    source: str | Path,
    out_dir: str | Path,
    *,
    batch_size: int | None = None,
    batch_sizes=None,
    precision: str = "fp32",
    name: str | None = None,
    opset: int = DEFAULT_OPSET,
    parity_data: str | Path | None = None,
    parity_batches: int = 2,
    device=None,
) -> ModelCard:
    """Export a checkpoint (or a run folder's newest) to ``out_dir`` as ONNX plus a model card.

    Args:
        source: A checkpoint file or a run folder (see :func:`gpufeed.models.find_checkpoint`).
        out_dir: The model folder to write (created; an earlier export there is replaced).
        batch_size: The largest batch size N; alone, the sizes are
            :func:`~gpufeed.models._card.default_batch_sizes` of it (8: 1, 2, 4, 8).
        batch_sizes: Every batch size to run the graph at, strictly ascending (``[8]``: one
            graph fixed at 8). Default: from ``batch_size``, else 1, 2, 4, 8.
        precision: ``fp32`` or ``fp16``.
        name: The model's name in the card; default: ``out_dir``'s folder name.
        parity_data: Images (list file or class folders) for the parity check; default:
            synthetic images. Ignored for clip models.
        parity_batches: Batches of the largest size fed to the parity check.
        device: :class:`~gpufeed.device.DeviceChoice` for the parity inputs' pipeline and the
            onnxruntime session (CUDA provider on a GPU); default: CPU.

    Returns:
        The written :class:`ModelCard`.

    Raises:
        ExportError: The graph fails the ONNX checker, is not of ``opset``, or parity at some batch
            size is above the tolerance; nothing is left in ``out_dir`` then.
        ValueError: Bad ``batch_size``, ``batch_sizes`` or ``precision``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} is not allowed; allowed: {', '.join(PRECISIONS)}")
    sizes = resolve_batch_sizes(batch_size, batch_sizes)
    _check_opset(opset)  # before the parity inputs are made
    largest, dynamic = sizes[-1], len(sizes) > 1
    checkpoint, state, model = _load_for_export(source)
    spec = model.spec
    # How training read its clips (frame gap, fit), which scoring a video must repeat (gpufeed predict,
    # the server's video input): the card carries it, since the spec does not.
    sampling = (
        {"clip_sampling": ClipSampling.from_config(state.get("config")).to_dict()} if spec.head.takes_clips else {}
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = name or out_dir.resolve().name

    inputs, what = parity_inputs(spec, largest, parity_batches, parity_data, device)
    reference = _reference_logits(model, inputs, largest)
    parity = _Parity(inputs, what, reference, parity_tolerance(precision, reference), precision, spec.head.agreement)

    with atomic_path(out_dir / ONNX_FILE) as tmp:
        exportable = _Exportable(copy.deepcopy(model), precision).eval()
        with torch.no_grad():
            _torch_export(exportable, torch.from_numpy(inputs[:largest]), tmp, opset, dynamic)
        _add_metadata(tmp, spec, sizes, precision, opset)
        record = parity.check(tmp, device, sizes, checkpoint=checkpoint, out_dir=out_dir)
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        card = ModelCard(
            name=name,
            spec=spec,
            batch_size=largest,
            batch_sizes=sizes,
            precision=precision,
            opset=opset,
            parity=record,
            source_checkpoint=str(checkpoint),
            onnx_sha256=digest,
            extra={"torch": torch.__version__, "exporter": "torch.onnx.export(dynamo=True)", **sampling},
        )
    card.write(out_dir)
    log.info("exported %s to %s (%s)", checkpoint, out_dir, card.summary())
    return card
