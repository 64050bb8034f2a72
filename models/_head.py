"""A task head: what one kind of model takes and gives, the one place export, the server and the cards ask.

A :class:`TaskHead` is made for one :class:`~gpufeed.models.ModelSpec` (``spec.head``, picked by
:func:`~gpufeed.models.head_for` from the heads registered in :mod:`gpufeed.models._heads`) and
answers, for that model:

* **what it accepts**: encoded JPEG/PNG images the server decodes (:attr:`TaskHead.accepts_encoded`)
  or only decoded uint8 rows, its input layout and shape (:meth:`TaskHead.input_shape`);
* **what it outputs**: the graph's float32 output (:meth:`TaskHead.output_shape`) and the named
  output tensors a server answers (:meth:`TaskHead.outputs` for the KServe metadata and Triton's
  model configuration, :meth:`TaskHead.output_tensors` for the values, read lazily through
  :class:`Outputs`), what they mean (:attr:`TaskHead.scores`);
* **its REST answer**: top-k classes (:class:`~gpufeed.models._heads.ClassifierHead`) or one map per
  image (:class:`~gpufeed.models._dense_heads.DenseHead`), which the server's REST front encodes;
* **its export parity check**: the inputs fed to PyTorch and onnxruntime
  (:meth:`TaskHead.parity_inputs`) and the agreement figure that means something for the task
  (:attr:`TaskHead.agreement`).

Nothing outside the registry compares a task's name: a new task is one new head class,
registered in one place (``tests/test_task_heads.py`` counts the comparisons left).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from gpufeed.core import SizePx

__all__ = ["Agreement", "OutputTensor", "Outputs", "SpecFacts", "TaskHead"]


class SpecFacts(Protocol):
    """The facts of a :class:`~gpufeed.models.ModelSpec` a head reads (the spec asks its head, so a
    head names what it needs rather than the class)."""

    @property
    def name(self) -> str: ...
    @property
    def task(self) -> str: ...
    @property
    def num_classes(self) -> int: ...
    @property
    def multilabel(self) -> bool: ...
    @property
    def size_px(self) -> SizePx: ...
    @property
    def eval_crop_fraction(self) -> float: ...
    @property
    def clip_length_frames(self) -> int | None: ...
    @property
    def labels(self) -> tuple[str, ...]: ...
    @property
    def depth_scale(self) -> float: ...
    @property
    def map_fill(self) -> int: ...


@dataclass(frozen=True)
class Agreement:
    """One task's export agreement figure: its card ``key``, its words, and whether higher is better.

    ``top1_agreement`` (and ``pixel_agreement``) is the share of rows (pixels) whose
    highest-scoring class is the same; ``depth_rel_diff`` is the mean |onnx - torch| over every
    pixel relative to the mean |depth| (a depth model has one output channel, so a "top-1 class"
    of it agrees by construction).
    """

    key: str
    words: str
    higher_is_better: bool = True

    def measure(self, got: np.ndarray, reference: np.ndarray) -> float:
        """The figure for ``got`` (onnxruntime) against ``reference`` (PyTorch), both (N, C, ...) float."""
        if not self.higher_is_better:  # a relative difference: lower is better
            scale = float(np.abs(reference).mean())
            return float(np.abs(got - reference).mean() / max(scale, 1e-12))
        return float((got.argmax(1) == reference.argmax(1)).mean())

    def worst(self, values) -> float:
        """The worst of several batch sizes' figures."""
        return min(values) if self.higher_is_better else max(values)

    def describe(self, value: float) -> str:
        """The figure as printed after the max difference (``top-1 agreement 100%``)."""
        return f"{self.words} {value:.0%}" if self.higher_is_better else f"{self.words} {value:.3g}"


@dataclass(frozen=True)
class OutputTensor:
    """One named output tensor of a served model.

    Attributes:
        name: Its name in KServe answers (``logits``, ``scores``, ``depth``).
        shape: One row's shape (the batch dimension left out).
        datatype: Its KServe datatype.
    """

    name: str
    shape: tuple[int, ...]
    datatype: str = "FP32"

    def kserve(self) -> dict[str, Any]:
        """The KServe model-metadata entry (``-1``: any number of rows)."""
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape]}


class Outputs(Mapping[str, np.ndarray]):
    """A batch's output tensors by name, each made from the logits by the head when first read.

    The names (iteration order: the head's :meth:`TaskHead.outputs`) are known at once; a tensor
    nobody reads (a KServe request asking for ``logits`` only, a REST map answer) is never computed.

    Attributes:
        logits: The graph's float32 output, one row per item.
    """

    def __init__(self, head: TaskHead, logits: np.ndarray) -> None:
        self.head, self.logits = head, logits
        self._names = tuple(t.name for t in head.outputs())
        self._made: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._made:
            self._made[name] = self.head.tensor(name, self.logits)
        return self._made[name]

    def __contains__(self, name: object) -> bool:  # Mapping's would make the tensor to find out
        return name in self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class TaskHead:
    """What a model of one task takes and gives (see the module docs); subclasses are the tasks.

    A subclass sets the class attributes and implements :meth:`outputs`, :meth:`tensor` and
    :meth:`parity_inputs`, and is registered with :func:`~gpufeed.models.register_head`.

    Attributes:
        task: The :attr:`ModelSpec.task <gpufeed.models.ModelSpec.task>` value it serves.
        kind: Its name in messages (``classification``, ``multi-label``, ``clip``, ``depth``, ``segmentation``).
        multilabel: The ``spec.multilabel`` it serves (``None``: either).
        accepts_encoded: The server decodes JPEG/PNG images for it (else: decoded uint8 rows only).
        takes_clips: Its samples are clips of frames (``NCTHW``), not images.
        accepts_video: The server takes an encoded video for it (REST ``video/*`` bodies, KServe's
            ``video`` BYTES input), decodes it, windows it and answers per-frame scores
            (:meth:`video_outputs`).
        input_layout: ``NCHW`` (images) or ``NCTHW`` (clips).
        classifies: Its rows are class scores: the KServe classification extension and the REST
            top-k answer apply.
        dense: It answers one map per image (depth, segmentation).
        agreement: Its export parity figure.
        spec: The model's spec.
    """

    task: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    multilabel: ClassVar[bool | None] = None
    accepts_encoded: ClassVar[bool] = True
    takes_clips: ClassVar[bool] = False
    accepts_video: ClassVar[bool] = False
    input_layout: ClassVar[str] = "NCHW"
    classifies: ClassVar[bool] = False
    dense: ClassVar[bool] = False
    agreement: ClassVar[Agreement] = Agreement("top1_agreement", "top-1 agreement")

    def __init__(self, spec: SpecFacts) -> None:
        self.spec = spec

    def check(self) -> None:
        """Refuse a spec this task cannot run (``ValueError`` naming the model and the missing fact)."""

    @property
    def spatial_dims(self) -> int:
        """Spatial dimensions of the input: 2 for ``NCHW``, 3 for ``NCTHW``."""
        return len(self.input_layout) - 2

    @property
    def scores(self) -> str:
        """What the output values mean, in words (the model card's ``scores``)."""
        raise NotImplementedError

    def input_shape(self, batch_size: int) -> tuple[int, ...]:
        """The uint8 input shape for ``batch_size`` samples: ``(N, 3, H, W)``."""
        height, width = self.spec.size_px.hw
        return (batch_size, 3, height, width)

    def output_shape(self, batch_size: int) -> tuple[int, ...]:
        """The graph's float32 output shape for ``batch_size`` samples: ``(N, C)``."""
        return (batch_size, self.spec.num_classes)

    def outputs(self) -> tuple[OutputTensor, ...]:
        """The named output tensors a server answers, in order."""
        raise NotImplementedError

    def tensor(self, name: str, logits: np.ndarray) -> np.ndarray:
        """Output tensor ``name`` (one of :meth:`outputs`) of a batch's float32 ``logits``."""
        raise NotImplementedError

    def video_outputs(self) -> tuple[OutputTensor, ...]:
        """The output tensors of a video request (:attr:`accepts_video` heads); none for the others."""
        return ()

    def output_tensors(self, logits: np.ndarray) -> Outputs:
        """Every output tensor of a batch's ``logits``, each made when first read."""
        return Outputs(self, logits)

    def parity_inputs(self, batch_size: int, batches: int, data: str | Path | None, device) -> tuple[np.ndarray, str]:
        """Real uint8 inputs for the export parity check, up to ``batches * batch_size`` rows, and what they are.

        Args:
            batch_size: Rows per batch.
            batches: Batches wanted.
            data: Images (a list file, class folders, or a dense model's paired split); ``None``:
                synthetic ones. Heads whose inputs are not images ignore it.
            device: :class:`~gpufeed.device.DeviceChoice` of the evaluation pipeline (``None``: the CPU).
        """
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec.name!r})"
