"""Dense tasks: per-pixel depth regression and segmentation, with masked losses and metrics.

==============  =============================  ==========================================  =====================
task            target                         loss (valid pixels only)                    evaluation
==============  =============================  ==========================================  =====================
depth           ``batch.maps["depth"]`` (N,H,W)  L1 on ``value x data.depth_scale``          ``abs_rel``, ``rmse``,
                                               (``data.depth_no_data`` pixels excluded)    ``delta1``
segmentation    ``batch.maps["mask"]`` (N,H,W)   cross-entropy (``data.mask_ignore_id``      ``miou``,
                                               pixels excluded)                            ``pixel_accuracy``
==============  =============================  ==========================================  =====================

Padding rows (``batch.valid`` false) are excluded too; under DDP with padding the losses are
means over the global batch's counted pixels (see :mod:`gpufeed.train._tasks`). Metrics are sums over pixels (and a
confusion matrix for segmentation) reduced over ranks, then: ``abs_rel`` = mean |pred - true| /
true, ``rmse`` = sqrt(mean (pred - true)^2), ``delta1`` = share of pixels with max(pred / true,
true / pred) < 1.25; ``miou`` = mean over classes present in the targets or predictions of
TP / (TP + FP + FN), ``pixel_accuracy`` = correct / counted pixels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpufeed.config import ConfigError
from gpufeed.train._distributed import all_reduce_sum
from gpufeed.train._mask_ids import MaskIdError, find_bad_mask_ids
from gpufeed.train._tasks import Task, accumulate

__all__ = [
    "DENSE_TASKS",
    "DepthMetrics",
    "DepthTask",
    "SegmentationMetrics",
    "SegmentationTask",
    "refuse_device_geometry",
]

DENSE_TASKS = ("depth", "segmentation")
_DELTA = 1.25
_EPS = 1e-6


# Ops that only change pixel values, never where a pixel is: safe on the device, where the maps never go.
_VALUE_ONLY_OPS = ("color_jitter", "grayscale", "gaussian_blur", "erasing")


def refuse_device_geometry(placement: dict[str, str]) -> None:
    """Refuse an augmentation plan that moves pixels on the device, away from the maps.

    The dense loader applies its flips to the RGB and its maps together; a flip (or any other
    geometric op) on the training device would move the RGB alone.

    Raises:
        ConfigError: Naming the op's ``where`` key.
    """
    for op, where in placement.items():
        if where != "loader" and op not in _VALUE_ONLY_OPS:
            raise ConfigError(
                f"augment.{op}.where",
                f"value {where!r}: a dense model's geometry must move its maps too, which only the loader does; "
                f"set it to loader (ops that only change values, {list(_VALUE_ONLY_OPS)}, may run anywhere)",
            )


def _row_mask(valid: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """(N, 1, 1) bool of the rows that count (all of them without ``valid``)."""
    if valid is None:
        return torch.ones(like.shape[0], 1, 1, dtype=torch.bool, device=like.device)
    return valid.view(-1, 1, 1).to(like.device)


class DepthTask(Task):
    """Depth maps: L1 in the target's unit over measured pixels; abs_rel, rmse, delta1.

    Args:
        depth_scale: Map value x this = the target (``data.depth_scale``, e.g. 0.001 for mm to m).
        no_data: Map value of pixels without a measurement (``data.depth_no_data``).
    """

    name = "depth"
    clips = False
    primary_metric = "abs_rel"
    num_classes = 1
    labels = ()

    def __init__(self, depth_scale: float = 1.0, no_data: int = 0) -> None:
        self.depth_scale, self.no_data = float(depth_scale), int(no_data)

    def inputs(self, batch) -> torch.Tensor:
        return batch.images

    def targets(self, batch) -> torch.Tensor:
        return batch.maps["depth"]

    def pixels(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None):
        """(prediction, target, counted) float maps (N, H, W) in the target's unit."""
        prediction = logits.float()[:, 0]
        counted = (targets != self.no_data) & _row_mask(valid, targets)
        return prediction, targets.float() * self.depth_scale, counted

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        total, count = self.loss_terms(logits, targets, valid)
        return total / count.clamp_min(1.0)

    def loss_terms(
        self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(L1 summed over counted pixels, their number)."""
        prediction, target, counted = self.pixels(logits, targets, valid)
        weights = counted.float()
        return ((prediction - target).abs() * weights).sum(), weights.sum()

    def new_metric(self) -> DepthMetrics:
        return DepthMetrics(self)


class DepthMetrics:
    """Sums over counted pixels, reduced over ranks by :meth:`compute` (see the module docs)."""

    def __init__(self, task: DepthTask) -> None:
        self.task = task
        # pixels, |d| / t, d^2, within delta, loss sum (|d|), samples
        self._sums = torch.zeros(6, dtype=torch.float64)

    def update(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        prediction, target, counted = self.task.pixels(logits, targets, valid)
        # Only positive targets have a ratio; a no-data value other than 0 leaves 0 out here too.
        counted = counted & (target > 0)
        weights = counted.double()
        diff = (prediction - target).double()
        safe_t = torch.where(counted, target, torch.ones_like(target)).double()
        safe_p = prediction.double().clamp_min(_EPS)
        ratio = torch.maximum(safe_p / safe_t, safe_t / safe_p)
        rows = _row_mask(valid, targets).sum().double()
        row = torch.stack(
            [
                weights.sum(),
                (diff.abs() / safe_t * weights).sum(),
                (diff.square() * weights).sum(),
                ((ratio < _DELTA).double() * weights).sum(),
                (diff.abs() * weights).sum(),
                rows,
            ]
        )
        self._sums = accumulate(self._sums, row)

    def compute(self) -> dict:
        pixels, rel, sq, within, abs_sum, samples = all_reduce_sum(self._sums.clone()).tolist()
        if pixels == 0:
            return {"samples": int(samples), "pixels": 0, "loss": None, "abs_rel": None, "rmse": None, "delta1": None}
        return {
            "samples": int(samples),
            "pixels": int(pixels),
            "loss": abs_sum / pixels,
            "abs_rel": rel / pixels,
            "rmse": math.sqrt(sq / pixels),
            "delta1": within / pixels,
        }


class SegmentationTask(Task):
    """Segmentation masks: cross-entropy over pixels whose id is not ``ignore_id``; miou, pixel_accuracy.

    Args:
        num_classes: Output channels; every mask id except ``ignore_id`` must be below it.
        labels: Class names (``data.classes``), or empty.
        ignore_id: The mask id excluded from loss and metrics (``data.mask_ignore_id``).
    """

    name = "segmentation"
    clips = False
    primary_metric = "miou"

    def __init__(self, num_classes: int, labels: tuple[str, ...] = (), ignore_id: int = 255) -> None:
        self.num_classes, self.labels, self.ignore_id = num_classes, tuple(labels), int(ignore_id)

    def inputs(self, batch) -> torch.Tensor:
        return batch.images

    def targets(self, batch) -> torch.Tensor:
        """The masks as int64 ids; an id outside the classes counts as the ignore id (see :meth:`target_fault`).

        Nothing is read back here: an id past the classes would be a device-side assert in the
        loss, so it is set aside on the device, and the step reports it when it is read.
        """
        mask = batch.maps["mask"].long()
        outside = (mask >= self.num_classes) & (mask != self.ignore_id)
        return torch.where(outside, self.ignore_id, mask)

    def target_fault(self, batch) -> torch.Tensor:
        """The largest mask id outside the classes (ignore id aside) as a device scalar, or -1 if there is none."""
        mask = batch.maps["mask"].long()
        largest = torch.where(mask != self.ignore_id, mask, -1).amax()
        return torch.where(largest >= self.num_classes, largest, -1)

    def row_faults(self, batch) -> torch.Tensor:
        """Per row, the largest mask id outside the classes (ignore id aside), or -1: what :meth:`target_fault` is per batch."""
        mask = batch.maps["mask"].long()
        largest = torch.where(mask != self.ignore_id, mask, -1).flatten(1).amax(dim=1)
        return torch.where(largest >= self.num_classes, largest, -1)

    def fault_evidence(self, batch) -> torch.Tensor:
        """The batch's masks, kept until the step is read so a fault can name the rows that hold it."""
        return batch.maps["mask"]

    def fault_error(self, fault: int, sample_ids: list[int], evidence=None) -> Exception:
        """A :class:`MaskIdError` naming the samples whose masks hold an id past the classes.

        Only on this error path are the masks read back (``evidence``), to name exactly the rows
        that hold such an id rather than the whole batch.
        """
        if evidence is not None and sample_ids:
            found = find_bad_mask_ids(evidence.long(), torch.tensor(sample_ids), self.num_classes, self.ignore_id)
            if found is not None:
                return found
        return MaskIdError(fault, sample_ids, self.num_classes, self.ignore_id)

    def _ignored(self, targets: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
        """Targets with padding rows set to the ignore id too."""
        return torch.where(_row_mask(valid, targets), targets, torch.full_like(targets, self.ignore_id))

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        total, count = self.loss_terms(logits, targets, valid)
        return total / count.clamp_min(1.0)

    def loss_terms(
        self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cross-entropy summed over counted pixels, their number)."""
        targets = self._ignored(targets, valid)
        losses = F.cross_entropy(logits.float(), targets, ignore_index=self.ignore_id, reduction="none")
        counted = (targets != self.ignore_id).float()
        return (losses * counted).sum(), counted.sum()

    def new_metric(self) -> SegmentationMetrics:
        return SegmentationMetrics(self)


class SegmentationMetrics:
    """A confusion matrix over counted pixels and the loss sum, reduced over ranks by :meth:`compute`."""

    def __init__(self, task: SegmentationTask) -> None:
        self.task = task
        k = task.num_classes
        self._confusion = torch.zeros(k * k, dtype=torch.float64)
        self._totals = torch.zeros(2, dtype=torch.float64)  # loss sum, samples

    def update(self, logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor | None = None) -> None:
        task, k = self.task, self.task.num_classes
        targets = task._ignored(targets, valid)
        counted = targets != task.ignore_id
        losses = F.cross_entropy(logits.float(), targets, ignore_index=task.ignore_id, reduction="none")
        totals = torch.stack([(losses * counted).sum().double(), _row_mask(valid, targets).sum().double()])
        self._confusion = accumulate(self._confusion, _confusion(targets * k + logits.argmax(dim=1), counted, k))
        self._totals = accumulate(self._totals, totals)

    def compute(self) -> dict:
        k = self.task.num_classes
        confusion = all_reduce_sum(self._confusion.clone()).cpu().view(k, k)
        loss_sum, samples = all_reduce_sum(self._totals.clone()).tolist()
        pixels = float(confusion.sum())
        true_pos = confusion.diag()
        union = confusion.sum(0) + confusion.sum(1) - true_pos
        names = self.task.labels or tuple(str(c) for c in range(k))
        iou = {names[c]: float(true_pos[c] / union[c]) if union[c] > 0 else None for c in range(k)}
        defined = [v for v in iou.values() if v is not None]
        return {
            "samples": int(samples),
            "pixels": int(pixels),
            "loss": loss_sum / pixels if pixels else None,
            "miou": sum(defined) / len(defined) if defined else None,
            "pixel_accuracy": float(true_pos.sum()) / pixels if pixels else None,
            "iou": iou,
        }


def _confusion(cells: torch.Tensor, counted: torch.Tensor, k: int) -> torch.Tensor:
    """The k x k confusion counts (float64, flat) of the counted pixels' cells (N, H, W) (``target x k + predicted``).

    Neither a boolean index nor ``bincount``: on a GPU the first sizes its output by the number of
    counted pixels and the second by its input's largest value (it reads its min and max back),
    so each would make the host wait for the device. Uncounted pixels go to a bin past the k x k
    cells that is dropped, and each row counts into bins of its own, so that the device's atomic
    adds spread over N x (k x k + 1) bins instead of queueing on a few (the counts are integers in
    float64: their order does not change them).
    """
    bins = k * k + 1
    rows = torch.arange(cells.shape[0], device=cells.device).view(-1, 1, 1) * bins
    index = (torch.where(counted, cells, k * k) + rows).flatten()
    ones = torch.ones((), dtype=torch.float64, device=cells.device).expand(index.shape)
    per_row = torch.zeros(cells.shape[0] * bins, dtype=torch.float64, device=cells.device).index_add_(0, index, ones)
    return per_row.view(-1, bins).sum(0)[:-1]
