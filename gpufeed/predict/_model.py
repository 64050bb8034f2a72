"""The model ``gpufeed predict`` scores with: a checkpoint (PyTorch) or an exported model folder (onnxruntime).

Either way a :class:`Predictor` takes uint8 batches (``(N, 3, T, H, W)`` clips or ``(N, 3, H, W)``
images, on the reader's device) and gives float32 logits on the host; its head turns them into
probabilities. An exported model runs on the server's own onnxruntime runner
(:class:`~gpufeed.server._runtime.OnnxRunner`: one session per batch size of its card, a batch run
at the smallest size that holds it, padding rows discarded), so ``predict`` and ``gpufeed serve``
compute the same numbers from the same windows. A checkpoint runs in PyTorch, in evaluation mode.

The clip sampling (``video.stride_frames``, ``video.fit``) comes from where the model does: a
checkpoint's training config, or the card's ``extra.clip_sampling`` (written by export); models
without it read frames 1 apart, stretched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpufeed.models import (
    CARD_FILE,
    ClassifierHead,
    ClipSampling,
    ModelCard,
    ModelSpec,
    TaskHead,
    find_checkpoint,
    load_model,
    read_checkpoint,
    read_model_card,
)
from gpufeed.pipelines import DatasetError
from gpufeed.server import OnnxRunner

__all__ = ["Predictor", "load_predictor"]


@dataclass
class Predictor:
    """A loaded model: its facts and a batch -> logits function.

    Attributes:
        source: What was loaded (checkpoint file or model folder).
        kind: ``checkpoint`` (PyTorch) or ``exported`` (onnxruntime).
        spec: The model's :class:`~gpufeed.models.ModelSpec`.
        labels: Class names in output order (``class_<i>`` where the model names none).
        sampling: How clips were read at training.
        batch_size: Samples per model call (the card's largest batch size for an exported model).
        device: :class:`~gpufeed.device.DeviceChoice` the model runs on.
        card: The model card (exported models), else ``None``.
    """

    source: Path
    kind: str
    spec: ModelSpec
    labels: tuple[str, ...]
    sampling: ClipSampling
    batch_size: int
    device: Any
    card: ModelCard | None = None
    _module: torch.nn.Module | None = None
    _runner: OnnxRunner | None = None
    _buffer: Any = None

    @property
    def head(self) -> TaskHead:
        return self.spec.head

    def class_scores(self, logits: np.ndarray) -> np.ndarray:
        """Probabilities from logits, as the model's head makes them (sigmoid per class, or softmax).

        Raises:
            ValueError: The model is not a classifier (a depth or segmentation model).
        """
        head = self.spec.head
        if not isinstance(head, ClassifierHead):
            raise ValueError(f"{self.spec.name} is a {head.kind} model; predict scores classifiers")
        return head.class_scores(logits)

    def logits(self, batch: torch.Tensor) -> np.ndarray:
        """float32 logits ``(N, C)`` on the host for a uint8 batch (any N)."""
        if self._module is not None:
            with torch.inference_mode():
                out = self._module(batch.to(self.device.torch_device, non_blocking=True))
            return out.float().cpu().numpy()
        rows = [self._run_onnx(batch[i : i + self.batch_size]) for i in range(0, len(batch), self.batch_size)]
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def _run_onnx(self, batch: torch.Tensor) -> np.ndarray:
        runner = self._runner
        assert runner is not None
        n = len(batch)
        size = runner.bucket_for(n)
        buffer = self._buffer[:size]
        if runner.on_gpu:
            buffer[:n].copy_(batch.to(buffer.device))
        else:
            buffer[:n] = batch.cpu().numpy()
        if n < size:
            buffer[n:] = 0  # padding rows, discarded: rows never interact (evaluation-mode batch norm)
        return runner.run(buffer)[:n]

    def describe(self) -> str:
        """One line: what runs where (for the command's first line and logs)."""
        where = self.device.describe()
        if self._runner is not None:
            where += f", onnxruntime {self._runner.providers[0]}"
        else:
            where += ", PyTorch"
        clip = ""
        if self.spec.clip_length_frames:
            clip = (
                f", clips of {self.spec.clip_length_frames} frames {self.sampling.stride_frames} apart "
                f"({self.sampling.fit})"
            )
        return (
            f"{self.spec.name} ({self.spec.head.kind}, {len(self.labels)} classes{clip}) from {self.source} on {where}"
        )


def _labels(spec: ModelSpec) -> tuple[str, ...]:
    return spec.labels or tuple(f"class_{i}" for i in range(spec.num_classes))


def load_predictor(source: str | Path, device, batch_size: int = 0, threads: int = 0) -> Predictor:
    """Load a checkpoint (file or run folder) or an exported model folder (``model_card.json``) for scoring.

    Args:
        source: The checkpoint, run folder or model folder.
        device: :class:`~gpufeed.device.DeviceChoice`.
        batch_size: Samples per call of a checkpoint's model (0: 32 on a GPU, 8 on a CPU); an
            exported model runs at its card's batch sizes.
        threads: onnxruntime intra-op threads of an exported model (0: onnxruntime's default).

    Raises:
        DatasetError: ``source`` is neither (one line naming it).
    """
    source = Path(source)
    if (source / CARD_FILE).is_file():
        card = read_model_card(source)
        runner = OnnxRunner(source, card, device, "auto", threads)
        spec = card.spec
        return Predictor(
            source,
            "exported",
            spec,
            card.labels,
            ClipSampling.from_card(card),
            card.batch_size,
            device,
            card=card,
            _runner=runner,
            _buffer=runner.new_batch(),
        )
    try:
        path = find_checkpoint(source)
    except FileNotFoundError as err:
        raise DatasetError(
            f"{err}; give a checkpoint (.pt), a training run folder or an exported model folder ({CARD_FILE})"
        ) from None
    try:
        state = read_checkpoint(path)
    except ValueError as err:  # not a checkpoint: one line naming the file and why
        raise DatasetError(str(err)) from None
    try:
        module = load_model(state).eval().to(device.torch_device)
    except Exception as err:  # a dict without the keys, or weights that do not fit its spec
        raise DatasetError(f"cannot load a gpufeed model from {path}: {str(err).splitlines()[0][:200]}") from None
    spec = module.spec
    size = batch_size or (32 if device.is_gpu else 8)
    sampling = ClipSampling.from_config(state.get("config"))
    return Predictor(path, "checkpoint", spec, _labels(spec), sampling, size, device, _module=module)
