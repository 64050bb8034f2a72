"""A mask id at or above a segmentation model's class count: one line naming the mask files.

Cross-entropy with such an id is an index error (a device-side assert on a GPU), so the
segmentation task reads back each batch's largest counted id and stops on one past the classes.
The batch only knows its sample ids; the loop, which knows the loader, turns them into the mask
files (:meth:`MaskIdError.naming`), so the run stops with a :class:`~gpufeed.train._errors.TrainError`
that names the files, the id and the allowed range instead of a traceback with sample indices.
"""

from __future__ import annotations

import torch

from gpufeed.train._errors import TrainError

__all__ = ["MaskIdError", "find_bad_mask_ids"]

_NAMED_FILES = 3  # files named in the message; the rest are counted


class MaskIdError(ValueError):
    """A batch holds a mask id outside ``[0, num_classes)`` that is not the ignore id.

    Attributes:
        mask_id: The largest such id in the batch.
        sample_ids: The samples (positions in the loader's dataset) whose masks hold one.
        num_classes, ignore_id: The task's class count and ignored id.
    """

    def __init__(self, mask_id: int, sample_ids: list[int], num_classes: int, ignore_id: int) -> None:
        self.mask_id, self.sample_ids = int(mask_id), [int(i) for i in sample_ids]
        self.num_classes, self.ignore_id = int(num_classes), int(ignore_id)
        super().__init__(self._message(f"the masks of samples {self.sample_ids}"))

    def _message(self, where: str) -> str:
        k = self.num_classes
        return (
            f"mask id {self.mask_id} in {where} is outside the {k} classes 0..{k - 1} (ignore id {self.ignore_id}, "
            "data.mask_ignore_id); set model.num_classes or data.classes to cover every id, or data.mask_ignore_id. "
            f"'gpufeed check DATA --num-classes {k}' lists every mask with such an id"
        )

    def naming(self, dataset, split: str) -> TrainError:
        """The one-line error naming the mask files of ``dataset`` (a :class:`PairedDataset`)."""
        masks = dataset.maps.get("mask", dataset.paths)
        files = [str(masks[i]) for i in self.sample_ids]
        listed = ", ".join(files[:_NAMED_FILES])
        more = f" and {len(files) - _NAMED_FILES} more" if len(files) > _NAMED_FILES else ""
        return TrainError(self._message(f"{listed}{more} (the {split} split)"))


def find_bad_mask_ids(
    mask: torch.Tensor, sample_ids: torch.Tensor, num_classes: int, ignore_id: int
) -> MaskIdError | None:
    """The error for a batch of masks (N, H, W) holding an id past the classes, or ``None``.

    One reduction is read back per batch (the largest counted id); the rows holding such an id are
    only found when there is one.
    """
    counted = torch.where(mask == ignore_id, torch.zeros_like(mask), mask)
    if not counted.numel() or int(counted.max()) < num_classes:
        return None
    per_row = counted.flatten(1).amax(dim=1)
    rows = (per_row >= num_classes).nonzero().flatten().tolist()
    ids = sample_ids.view(-1).tolist()
    return MaskIdError(int(per_row.max()), [ids[r] for r in rows], num_classes, ignore_id)
