"""What is being learned: the batch fields, loss and evaluation metric of each task.

The loop is task-agnostic; a task says which batch field is the input, which the target, how the
loss is computed and what evaluation reports. The task comes from the model: a model whose
:class:`~gpufeed.models.ModelSpec` says ``task: image`` trains as :class:`ImageTask`, ``clip``
as :class:`ClipTask`.

==========  ==============================  ====================================  =======================
task        input                           target                                evaluation
==========  ==============================  ====================================  =======================
image       ``batch.images`` (N,3,S,S) u8   ``batch.labels`` (N,) int64           top-1 accuracy
clip        ``batch.clips`` (N,3,T,H,W) u8  ``batch.centre_labels`` (N,K) f32     per-class and macro F1
==========  ==============================  ====================================  =======================

Rows with ``batch.valid`` false (padding) are left out of the loss and of evaluation. Under DDP,
where ranks may hold different numbers of real rows (``last_batch: pad``), the step weights each
rank's loss by its share of the global batch's real rows (:func:`global_mean_loss`), so the
averaged gradient is that of the mean over all of them, as one process with the whole batch has.
"""

from __future__ import annotations

from typing import TypeVar

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpufeed.train._distributed import all_reduce_sum

__all__ = [
    "Accuracy",
    "ClipTask",
    "ImageTask",
    "MultiLabelF1",
    "Task",
    "accumulate",
    "global_mean_loss",
    "masked_mean",
    "masked_sum",
    "to_channels_last",
]

ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def masked_mean(per_sample: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """Mean of per-sample losses over valid rows, without a host sync (no boolean indexing)."""
    if valid is None:
        return per_sample.mean()
    total, count = masked_sum(per_sample, valid)
    return total / count.clamp_min(1.0)


def masked_sum(per_sample: torch.Tensor, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of per-sample losses over valid rows, number of valid rows), device scalars."""
    weights = torch.ones_like(per_sample) if valid is None else valid.to(per_sample.dtype)
    return (per_sample * weights).sum(), weights.sum()


def accumulate(total: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """``total + row`` on ``row``'s device: a metric's running sums after one more batch.

    A metric's sums start as host zeros. Moving them to a GPU with ``.to`` would be a blocking
    host-to-device copy (the host waits for the device), so sums still untouched on the host start
    from the first batch's own row; from then on they live where the batches do.
    """
    if total.device != row.device and total.device.type == "cpu" and not total.any():
        return row
    return total.to(row.device) + row


def _kept_rows(valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """(N,) bool of the rows that count, on ``like``'s device (every row without ``valid``)."""
    if valid is None:
        return torch.ones(like.shape[0], dtype=torch.bool, device=like.device)
    return valid.to(like.device, torch.bool)


def global_mean_loss(total: torch.Tensor, count: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's loss such that DDP's average of the ranks' gradients is that of the global mean.

    DDP averages gradients over ranks equally, so a rank holding fewer real rows (padding) would
    weigh each of them more, and a rank of padding alone would scale the step down. Scaling the
    rank's sum by ``world_size / global count`` makes the average the gradient of
    ``sum over ranks / global count``. The count is summed on the device, in a collective every
    rank issues at the same point of its step; nothing is read back to the host (on NCCL the
    collective is queued on the device's streams and the host goes on, as for DDP's own).

    Args:
        total: This rank's sum of the loss over its counted rows (or pixels).
        count: How many it counted.
        group: The process group DDP averages over (``None``: the default one).
    """
    everyone = count.detach().double()
    dist.all_reduce(everyone, op=dist.ReduceOp.SUM, group=group)
    scale = dist.get_world_size(group) / everyone.clamp_min(1.0)
    return total * scale.to(total.dtype)


class Task:
    """The interface the loop uses. Subclasses set ``name``, ``clips`` and ``primary_metric``."""

    name = "task"
    clips = False  # inputs are (N, 3, T, H, W) clips
    primary_metric = "loss"
    num_classes: int  # outputs of the model; every subclass sets it

    def inputs(self, batch) -> torch.Tensor:
        raise NotImplementedError

    def targets(self, batch) -> torch.Tensor:
        raise NotImplementedError

    def target_fault(self, batch) -> torch.Tensor | None:
        """A device scalar, ``>= 0`` where the batch's targets cannot be trained on (``None``: they always can).

        The step copies it to the host with its loss and reads both after the step, so checking
        a batch never makes the host wait inside a step; :meth:`fault_error` says what is wrong.
        """
        return None

    def row_faults(self, batch) -> torch.Tensor | None:
        """Per row, the :meth:`target_fault` of that row alone (``-1``: usable), a device tensor (N,).

        ``None`` where targets always can be trained on. Evaluation keeps these rather than reading
        each batch's fault (a host wait per batch) and reads them once, after its last batch; the
        error then names the faulty rows of the first batch that had one. This default blames every
        row of such a batch, as :meth:`fault_error` without evidence names the whole batch.
        """
        fault = self.target_fault(batch)
        if fault is None:
            return None
        return fault.expand(self.targets(batch).shape[0])

    def fault_evidence(self, batch):
        """What the step keeps until it is read, for :meth:`fault_error` to explain a fault (``None``: nothing)."""
        return None

    def fault_error(self, fault: int, sample_ids: list[int], evidence=None) -> Exception:
        """The one-line error for a batch whose :meth:`target_fault` was ``fault``.

        Args:
            fault: The value :meth:`target_fault` gave (``>= 0``).
            sample_ids: The batch's sample ids.
            evidence: What :meth:`fault_evidence` kept of the batch.
        """
        return ValueError(f"the targets of the batch of samples {sample_ids} cannot be trained on (fault {fault})")

    def per_sample_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """The training loss: mean over valid rows, computed in float32 even under autocast."""
        return masked_mean(self.per_sample_loss(logits.float(), targets), valid)

    def loss_terms(
        self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(sum, count) whose ratio :meth:`loss` is: what ranks add up for a mean over all of them."""
        return masked_sum(self.per_sample_loss(logits.float(), targets), valid)

    def new_metric(self):
        raise NotImplementedError

    @staticmethod
    def valid(batch) -> torch.Tensor | None:
        return getattr(batch, "valid", None)

    def input_format(self, model) -> torch.memory_format | None:
        """The memory format inputs take under ``train.channels_last`` (``None``: as they come).

        Inputs get the format of the convolutions that read them when the ranks match: image
        batches (4-d) for 2-D networks, clips (5-d) for 3-D ones. A clip that a 2-D network
        reshapes into stacked frames is left alone.
        """
        has_3d = any(p.dim() == 5 for p in model.parameters())
        if self.clips:
            return torch.channels_last_3d if has_3d else None
        return None if has_3d else torch.channels_last


def to_channels_last(model: ModuleT) -> ModuleT:
    """Convolution weights in channels_last (2-D) or channels_last_3d (3-D), in place.

    Done per convolution rather than with ``model.to(memory_format=...)``, which would also try
    to convert the clip models' 5-d normalisation buffers to the 2-D format and fail.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            # Module.to takes memory_format at run time; torch's overloads leave it out.
            module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        elif isinstance(module, torch.nn.Conv3d):
            module.to(memory_format=torch.channels_last_3d)  # type: ignore[call-overload]
    return model


class Accuracy:
    """Top-1 accuracy and mean loss over valid rows, summed over ranks by :meth:`compute`."""

    def __init__(self) -> None:
        self._sums = torch.zeros(3, dtype=torch.float64)  # correct, count, loss sum

    def update(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        # Padding rows are weighed out, not indexed out: a boolean index (its size is the number of
        # real rows) and a count made from a host value would each make the host wait for the GPU.
        kept = _kept_rows(valid, targets)
        # A padding row's label is never read: one past the classes would fail cross-entropy.
        losses = F.cross_entropy(logits.float(), torch.where(kept, targets, 0), reduction="none")
        correct = ((logits.argmax(dim=1) == targets) & kept).sum().double()
        row = torch.stack([correct, kept.sum().double(), torch.where(kept, losses, 0.0).double().sum()])
        self._sums = accumulate(self._sums, row)

    def compute(self) -> dict:
        correct, count, loss_sum = all_reduce_sum(self._sums.clone()).tolist()
        if count == 0:
            return {"samples": 0, "loss": None, "accuracy": None}
        return {"samples": int(count), "loss": loss_sum / count, "accuracy": correct / count}


class MultiLabelF1:
    """Per-class F1 of multi-label logits (a class is predicted when its sigmoid is above 0.5).

    F1 of a class = 2 TP / (2 TP + FP + FN); ``None`` for a class that is neither present nor
    predicted anywhere (undefined), and ``macro_f1`` averages the defined ones. Counts are summed
    over ranks by :meth:`compute`.
    """

    def __init__(self, num_classes: int, labels: tuple[str, ...] = ()) -> None:
        self.num_classes = num_classes
        self.labels = tuple(labels) or tuple(str(k) for k in range(num_classes))
        self._counts = torch.zeros(3, num_classes, dtype=torch.float64)  # tp, fp, fn per class
        self._totals = torch.zeros(2, dtype=torch.float64)  # samples, loss sum

    def update(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        if logits.shape != targets.shape or logits.dim() != 2 or logits.shape[1] != self.num_classes:
            raise ValueError(
                f"multi-label logits {tuple(logits.shape)} and targets {tuple(targets.shape)} must both be "
                f"(N, {self.num_classes})"
            )
        # Padding rows are weighed out, not indexed out (a boolean index makes the host wait for the GPU).
        kept = _kept_rows(valid, targets)
        predicted = logits.float() > 0.0  # sigmoid(x) > 0.5
        actual = targets > 0.5
        predicted_kept, actual_kept = predicted & kept[:, None], actual & kept[:, None]
        counts = torch.stack(
            [(predicted_kept & actual).sum(0), (predicted_kept & ~actual).sum(0), (actual_kept & ~predicted).sum(0)]
        )
        losses = F.binary_cross_entropy_with_logits(logits.float(), targets.float(), reduction="none").mean(1)
        totals = torch.stack([kept.sum().double(), torch.where(kept, losses, 0.0).double().sum()])
        self._counts = accumulate(self._counts, counts.double())
        self._totals = accumulate(self._totals, totals)

    def compute(self) -> dict:
        tp, fp, fn = all_reduce_sum(self._counts.clone()).cpu()
        samples, loss_sum = all_reduce_sum(self._totals.clone()).tolist()
        per_class = {}
        for k, label in enumerate(self.labels):
            denominator = float(2 * tp[k] + fp[k] + fn[k])
            per_class[label] = float(2 * tp[k]) / denominator if denominator > 0 else None
        defined = [v for v in per_class.values() if v is not None]
        return {
            "samples": int(samples),
            "loss": loss_sum / samples if samples else None,
            "macro_f1": sum(defined) / len(defined) if defined else None,
            "f1": per_class,
        }


class ImageTask(Task):
    """Single-label image classification: cross-entropy (with optional label smoothing), accuracy."""

    name = "image"
    clips = False
    primary_metric = "accuracy"

    def __init__(self, num_classes: int, labels: tuple[str, ...] = (), label_smoothing: float = 0.0) -> None:
        self.num_classes = num_classes
        self.labels = tuple(labels)
        self.label_smoothing = label_smoothing

    def inputs(self, batch) -> torch.Tensor:
        return batch.images

    def targets(self, batch) -> torch.Tensor:
        return batch.labels

    def per_sample_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing, reduction="none")

    def new_metric(self) -> Accuracy:
        return Accuracy()


class ClipTask(Task):
    """Multi-label clips: BCE-with-logits on the centre frame's labels, per-class F1.

    A clip model (``clip_resnet18``, ``r3d_small``) learns the behaviours active at each clip's
    centre frame. It reads these fields of a :class:`gpufeed.pipelines.ClipLoader` batch::

        clips          uint8   (N, 3, T, H, W)  on the device
        centre_labels  float32 (N, K)           multi-hot of frame T // 2 (the training target)
        valid          bool    (N,)             False for padding rows
    """

    name = "clip"
    clips = True
    primary_metric = "macro_f1"

    def __init__(self, num_classes: int, labels: tuple[str, ...] = ()) -> None:
        self.num_classes = num_classes
        self.labels = tuple(labels)

    def inputs(self, batch) -> torch.Tensor:
        return batch.clips

    def targets(self, batch) -> torch.Tensor:
        return batch.centre_labels

    def per_sample_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if logits.shape != targets.shape:
            raise ValueError(
                f"clip logits {tuple(logits.shape)} do not match centre_labels {tuple(targets.shape)}: "
                "the model's num_classes must equal the number of behaviours"
            )
        return F.binary_cross_entropy_with_logits(logits, targets.float(), reduction="none").mean(dim=1)

    def new_metric(self) -> MultiLabelF1:
        return MultiLabelF1(self.num_classes, self.labels)
