"""The task heads registry: one head class per task, registered in one place, picked from a model's spec.

=================  ==============  ===========  ================  =====================================
head               ``spec.task``   multilabel   accepts           outputs (FP32)
=================  ==============  ===========  ================  =====================================
classification     ``image``       no           JPEG/PNG, NCHW    ``logits``, ``scores`` (softmax) [N, C]
multi-label        ``image``       yes          JPEG/PNG, NCHW    ``logits``, ``scores`` (sigmoid) [N, C]
clip               ``clip``        either       NCTHW rows,       ``logits``, ``scores`` [N, C]; a video:
                                                    encoded video     ``scores`` [frames, C], ``window_*``
depth              ``depth``       —            JPEG/PNG, NCHW    ``depth`` [N, H, W]
segmentation       ``segmentation`` —           JPEG/PNG, NCHW    ``scores``, ``logits`` [N, C, H, W]
=================  ==============  ===========  ================  =====================================

:func:`head_for` picks a spec's head (``ModelSpec.head`` asks it); :func:`register_head` adds one.
The classifier heads are here; the dense ones in :mod:`gpufeed.models._dense_heads`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gpufeed.models._dense_heads import DepthHead, SegmentationHead
from gpufeed.models._head import OutputTensor, SpecFacts, TaskHead
from gpufeed.models._parity import clip_inputs, image_inputs

__all__ = [
    "ClassificationHead",
    "ClassifierHead",
    "ClipHead",
    "MultiLabelHead",
    "head_for",
    "list_tasks",
    "register_head",
    "sigmoid",
    "softmax",
]


def softmax(logits: np.ndarray) -> np.ndarray:
    """float32 probabilities over the last axis (classes)."""
    logits = np.asarray(logits, dtype=np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """float32 probability of each class on its own."""
    logits = np.asarray(logits, dtype=np.float32)
    return (1.0 / (1.0 + np.exp(-logits))).astype(np.float32)


class ClassifierHead(TaskHead):
    """Class scores per sample: ``logits`` and ``scores`` ``[N, C]``; the REST answer is the top k classes."""

    classifies = True

    @property
    def scores(self) -> str:
        return "softmax over classes"

    def class_scores(self, logits: np.ndarray) -> np.ndarray:
        """Probabilities from logits (:func:`softmax`; multi-label heads: :func:`sigmoid`)."""
        return softmax(logits)

    def outputs(self) -> tuple[OutputTensor, ...]:
        classes = (self.spec.num_classes,)
        return (OutputTensor("logits", classes), OutputTensor("scores", classes))

    def tensor(self, name: str, logits: np.ndarray) -> np.ndarray:
        return logits if name == "logits" else self.class_scores(logits)

    def rest_answer(self, model_name: str, scores: np.ndarray, top_k: int, labels: tuple[str, ...]) -> dict[str, Any]:
        """The REST answer: per image its ``top_k`` classes by score (ties: lower index first).

        ``{"model", "multilabel", "predictions": [{"image", "top_k": [{"label", "index", "score"}]}]}``.
        """
        predictions = []
        for i, row in enumerate(scores):
            top = np.argsort(-row, kind="stable")[:top_k]
            predictions.append(
                {"image": i, "top_k": [{"label": labels[j], "index": int(j), "score": float(row[j])} for j in top]}
            )
        return {"model": model_name, "multilabel": self.spec.multilabel, "predictions": predictions}

    def parity_inputs(self, batch_size: int, batches: int, data: str | Path | None, device):
        """Images through the evaluation pipeline: synthetic ones, or those of ``data``."""
        return image_inputs(self.spec, batch_size, batches, data, device)


class ClassificationHead(ClassifierHead):
    """An image classifier: one class per image, softmax scores."""

    task = "image"
    kind = "classification"
    multilabel = False


class MultiLabelHead(ClassifierHead):
    """An image tagger: any number of classes per image, a sigmoid score each."""

    task = "image"
    kind = "multi-label"
    multilabel = True

    @property
    def scores(self) -> str:
        return "sigmoid per class"

    def class_scores(self, logits: np.ndarray) -> np.ndarray:
        return sigmoid(logits)


class ClipHead(ClassifierHead):
    """A clip model: ``(N, 3, T, H, W)`` decoded rows in (no encoded images), class scores per clip out.

    Its scores are sigmoids per class when ``spec.multilabel`` (behaviours, the default of the
    registered clip networks), else a softmax over classes. The server also takes an encoded video
    for it and answers per-frame scores (:meth:`video_outputs`; the windows and the rule:
    :mod:`gpufeed.models._frame_scores`).
    """

    task = "clip"
    kind = "clip"
    accepts_encoded = False
    takes_clips = True
    accepts_video = True
    input_layout = "NCTHW"

    def video_outputs(self) -> tuple[OutputTensor, ...]:
        """A video's answer: ``scores`` ``[frames, C]`` (each frame's mean over the windows covering it),
        and, when asked, ``window_scores`` ``[windows, C]`` with ``window_starts`` ``[windows]`` (INT64,
        each window's first frame)."""
        classes = (self.spec.num_classes,)
        return (
            OutputTensor("scores", classes),
            OutputTensor("window_scores", classes),
            OutputTensor("window_starts", (), "INT64"),
        )

    def check(self) -> None:
        if not self.spec.clip_length_frames:
            raise ValueError(f"model {self.spec.name!r}: a clip model needs clip_length_frames")

    @property
    def scores(self) -> str:
        return "sigmoid per class" if self.spec.multilabel else "softmax over classes"

    def class_scores(self, logits: np.ndarray) -> np.ndarray:
        return sigmoid(logits) if self.spec.multilabel else softmax(logits)

    def input_shape(self, batch_size: int) -> tuple[int, ...]:
        """``(N, 3, T, H, W)``."""
        height, width = self.spec.size_px.hw
        assert self.spec.clip_length_frames is not None, "check() refuses a clip model without it"
        return (batch_size, 3, self.spec.clip_length_frames, height, width)

    def parity_inputs(self, batch_size: int, batches: int, data: str | Path | None, device):
        """Rendered synthetic behaviour-video frames (``data`` is not used)."""
        return clip_inputs(self.spec, batch_size, batches)


# spec.task -> its heads, each for one value of spec.multilabel or for either (multilabel None).
_HEADS: dict[str, list[type[TaskHead]]] = {}


def register_head(head: type[TaskHead]) -> type[TaskHead]:
    """Add a task head class (a decorator too): models whose spec says ``head.task`` get it.

    Raises:
        ValueError: The class names no task, or the task (and its ``multilabel``) has a head already.
    """
    if not head.task or not head.kind:
        raise ValueError(f"head {head.__name__} must set task and kind")
    for known in _HEADS.get(head.task, []):
        if None in (known.multilabel, head.multilabel) or known.multilabel == head.multilabel:
            raise ValueError(
                f"task {head.task!r} (multilabel {head.multilabel}) already has head {known.__name__}; "
                f"cannot register {head.__name__}"
            )
    _HEADS.setdefault(head.task, []).append(head)
    return head


def list_tasks() -> list[str]:
    """The tasks a :class:`~gpufeed.models.ModelSpec` may name, sorted."""
    return sorted(_HEADS)


def head_for(spec: SpecFacts) -> TaskHead:
    """The head of a model: the registered one for ``spec.task`` (and ``spec.multilabel``), made for ``spec``.

    Raises:
        ValueError: No head serves the spec's task, naming the known ones.
    """
    for head in _HEADS.get(spec.task, ()):
        if head.multilabel is None or head.multilabel == spec.multilabel:
            return head(spec)
    raise ValueError(f"model {spec.name!r}: task {spec.task!r} is not known; known tasks: {', '.join(list_tasks())}")


for _head in (ClassificationHead, MultiLabelHead, ClipHead, DepthHead, SegmentationHead):
    register_head(_head)
