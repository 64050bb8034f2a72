"""What the clip loader yields: :class:`ClipBatch`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ClipBatch"]


@dataclass(frozen=True)
class ClipBatch:
    """One batch from :class:`ClipLoader`. Tensors live on the loader's device.

    Attributes:
        clips: (N, 3, T, H, W) torch.uint8 RGB ("NCTHW"), in channels_last_3d memory: a permuted
            view of DALI's (N, T, H, W, 3), the layout 3-D convolutions run in.
        frame_labels: (N, T, K) torch.float32 multi-hot label of every frame of each clip (zeros
            for a video without labels, K = 0 when the dataset has none: ``require_labels=False``).
        centre_labels: (N, K) torch.float32 label of each clip's centre frame (index ``T // 2``).
        video_ids: (N,) torch.int64 video ids (positions in the dataset).
        start_frames: (N,) torch.int64 first frame of each clip; frame t is ``start + t * stride``.
        valid: (N,) torch.bool, False for padding rows (``last_batch: pad`` only).
        behaviours: The K label names, in column order.
    """

    clips: torch.Tensor
    frame_labels: torch.Tensor
    centre_labels: torch.Tensor
    video_ids: torch.Tensor
    start_frames: torch.Tensor
    valid: torch.Tensor
    behaviours: tuple[str, ...] = ()

    def __len__(self) -> int:
        return int(self.clips.shape[0])
