"""The export parity check's inputs and figures, in each task's own terms.

The check compares onnxruntime's outputs with PyTorch's on real inputs (:mod:`gpufeed.models._export`);
besides the max absolute difference it prints one agreement figure, which must mean something for
the task (:func:`agreement_for`):

==============  ===================  ======================================================================
task            card key             figure
==============  ===================  ======================================================================
image, clip     ``top1_agreement``   share of rows whose highest-scoring class is the same
segmentation    ``pixel_agreement``  share of pixels whose highest-scoring class is the same
depth           ``depth_rel_diff``   mean |onnx - torch| over every pixel, relative to the mean |depth|
==============  ===================  ======================================================================

A depth model has one output channel, so a "top-1 class" of it agrees by construction. Inputs
count only the rows the data has: padding rows of the last batch are dropped
(:func:`valid_rows`), and a paired split (``rgb/`` with ``depth/`` or ``mask/``) gives a dense
model its RGB images through the dense evaluation pipeline (:func:`dense_inputs`), never its maps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.pipelines import DenseLoader, PairedDataset

__all__ = ["Agreement", "agreement_for", "dense_inputs", "valid_rows"]


@dataclass(frozen=True)
class Agreement:
    """One task's agreement figure: its card ``key``, its words, and whether higher is better."""

    key: str
    words: str
    higher_is_better: bool = True

    def measure(self, got: np.ndarray, reference: np.ndarray) -> float:
        """The figure for ``got`` (onnxruntime) against ``reference`` (PyTorch), both (N, C, ...) float."""
        if self.key == "depth_rel_diff":
            scale = float(np.abs(reference).mean())
            return float(np.abs(got - reference).mean() / max(scale, 1e-12))
        return float((got.argmax(1) == reference.argmax(1)).mean())

    def worst(self, values) -> float:
        """The worst of several batch sizes' figures."""
        return min(values) if self.higher_is_better else max(values)

    def describe(self, value: float) -> str:
        """The figure as printed after the max difference (``top-1 agreement 100%``)."""
        return f"{self.words} {value:.0%}" if self.higher_is_better else f"{self.words} {value:.3g}"


_AGREEMENTS = {
    "segmentation": Agreement("pixel_agreement", "pixel class agreement"),
    "depth": Agreement("depth_rel_diff", "depth mean |diff| / mean |depth|", higher_is_better=False),
}
_TOP1 = Agreement("top1_agreement", "top-1 agreement")


def agreement_for(task: str) -> Agreement:
    """The agreement figure of a model's ``task`` (``image``, ``clip``, ``depth``, ``segmentation``)."""
    return _AGREEMENTS.get(task, _TOP1)


def valid_rows(batch) -> np.ndarray:
    """A batch's images (N, 3, H, W) uint8 on the host, without its padding rows."""
    images = batch.images.contiguous().cpu().numpy()
    return images[batch.valid.cpu().numpy().astype(bool)]


def dense_inputs(root: Path, size, eval_crop_fraction: float, batch_size: int, batches: int, device):
    """Up to ``batch_size * batches`` RGB images of a paired split, through the dense evaluation pipeline.

    Returns:
        (uint8 NCHW images, what they are), only the images the split has.
    """
    loader = DenseLoader(
        PairedDataset.from_root(root),
        train=False,
        image_cfg=ImagePipelineConfig(size_px=size, eval_crop_fraction=eval_crop_fraction),
        loader_cfg=LoaderConfig(batch_size=batch_size, last_batch="pad", num_threads=2, on_bad_sample="skip"),
        device=device,
        shard_id=0,
        num_shards=1,
    )
    out = []
    for batch in loader:
        out.append(valid_rows(batch))
        if len(out) == batches:
            break
    return np.concatenate(out), f"RGB images of the paired split {root}"
