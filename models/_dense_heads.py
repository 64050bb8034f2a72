"""Heads of dense models (depth, segmentation): an image in, one map per output channel out.

==============  ===========================================  =======================================
task            output tensors (FP32)                        REST map (:meth:`DenseHead.map_values`)
==============  ===========================================  =======================================
depth           ``depth`` ``[N, H, W]`` in the training      16-bit depth codes of ``depth /
                target's unit (the model's raw output)       depth_scale``: the training maps'
                                                             values, never the no-data value
segmentation    ``scores`` ``[N, C, H, W]`` (softmax over    8-bit argmax class ids
                C) and ``logits`` ``[N, C, H, W]``
==============  ===========================================  =======================================

**Depth codes.** A depth map's values are ``round(depth / depth_scale)`` clipped to 0..65535,
and the no-data value (``data.depth_no_data``, 0 unless set) means "not measured". A prediction
never takes it (:func:`depth_codes`): one that would is written as the next code away from it
(towards the prediction; inwards at the ends of the range), so with no-data 0 every negative
or sub-half-unit prediction reads 1, the smallest measured depth; a NaN prediction reads no-data.
A reader can take the no-data value as "outside the model's window or no prediction" and every
other code as a prediction.

A map placed back at an input's size is resized to the model's crop window there
(:meth:`DenseHead.resize_map`): bilinear for depth (then coded again, so a blend of two codes never
lands on no-data), nearest for class ids (never a blend of two ids; output pixel u takes map
pixel ``floor((u + 0.5) * model / window)``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from gpufeed.models._head import Agreement, OutputTensor, TaskHead
from gpufeed.models._parity import image_inputs

__all__ = ["DenseHead", "DepthHead", "SegmentationHead", "depth_codes"]


def depth_codes(depth_units: np.ndarray, no_data: int) -> np.ndarray:
    """Depth in map units (``depth / depth_scale``) as uint16 map codes that never equal ``no_data``.

    ``round`` and clip to 0..65535; a code equal to ``no_data`` moves one code away from it,
    towards the prediction (up at 0, down at 65535); NaN becomes ``no_data`` (see the module docs).
    """
    units = np.asarray(depth_units, dtype=np.float32)
    # No-data at an end of the range (0, the default, or 65535): the clip's range leaves it out, in one pass.
    low, high = (1, 65535) if no_data == 0 else (0, 65534) if no_data == 65535 else (0, 65535)
    codes = np.rint(units)
    np.clip(codes, low, high, out=codes)
    if low == 0 and high == 65535:
        hit = codes == no_data
        if hit.any():
            codes[hit] = np.where(units[hit] >= no_data, no_data + 1, no_data - 1)
    nan = np.isnan(units)
    if nan.any():
        codes[nan] = no_data
    return codes.astype(np.uint16)


class DenseHead(TaskHead):
    """A dense model: output ``(N, C, H, W)`` maps at the model's input size; REST answers one map per image.

    Attributes:
        map_key: The map's key in the REST JSON answer (``depth``, ``mask``).
    """

    dense = True
    map_key: ClassVar[str] = ""

    def output_shape(self, batch_size: int) -> tuple[int, ...]:
        """The graph's float32 output shape: ``(N, C, H, W)``."""
        return (batch_size, self.spec.num_classes, *self.spec.size_px.hw)

    def map_values(self, row: np.ndarray) -> np.ndarray:
        """One output row ``(C, H, W)`` as the stored values of its map at the model's size."""
        raise NotImplementedError

    def resize_map(self, values: np.ndarray, width: int, height: int) -> np.ndarray:
        """Map values resized to ``width`` x ``height`` (the model's crop window in an input image)."""
        raise NotImplementedError

    def map_facts(self) -> dict[str, Any]:
        """What a reader of the REST answer needs to read its maps (unit or class names)."""
        raise NotImplementedError

    def parity_inputs(self, batch_size: int, batches: int, data: str | Path | None, device):
        """The evaluation pipeline's images; a paired split gives its RGB images, never its maps."""
        return image_inputs(self.spec, batch_size, batches, data, device, paired=True)


class DepthHead(DenseHead):
    """Depth: one output channel in the training target's unit (``map value x data.depth_scale``)."""

    task = "depth"
    kind = "depth"
    map_key = "depth"
    agreement = Agreement("depth_rel_diff", "depth mean |diff| / mean |depth|", higher_is_better=False)

    @property
    def scores(self) -> str:
        return "depth per pixel, in the training target's unit (map value x data.depth_scale)"

    def outputs(self) -> tuple[OutputTensor, ...]:
        return (OutputTensor("depth", self.spec.size_px.hw),)

    def tensor(self, name: str, logits: np.ndarray) -> np.ndarray:
        return np.asarray(logits, dtype=np.float32)[:, 0]

    def map_values(self, row: np.ndarray) -> np.ndarray:
        """uint16 depth codes of ``row[0] / depth_scale`` (:func:`depth_codes`, no-data ``map_fill``)."""
        return depth_codes(row[0] / self.spec.depth_scale, self.spec.map_fill)

    def resize_map(self, values: np.ndarray, width: int, height: int) -> np.ndarray:
        """Bilinear in float, then back to codes: a blend of two codes never lands on no-data."""
        image = Image.fromarray(values.astype(np.float32), mode="F")
        resized = np.asarray(image.resize((width, height), Image.Resampling.BILINEAR))
        return depth_codes(resized, self.spec.map_fill)

    def map_facts(self) -> dict[str, Any]:
        return {"depth_scale": self.spec.depth_scale}


class SegmentationHead(DenseHead):
    """Segmentation: class scores per pixel, the argmax is the mask id."""

    task = "segmentation"
    kind = "segmentation"
    map_key = "mask"
    agreement = Agreement("pixel_agreement", "pixel class agreement")

    @property
    def scores(self) -> str:
        return "class scores per pixel: softmax over classes, argmax is the mask id"

    def outputs(self) -> tuple[OutputTensor, ...]:
        shape = (self.spec.num_classes, *self.spec.size_px.hw)
        return (OutputTensor("scores", shape), OutputTensor("logits", shape))

    def tensor(self, name: str, logits: np.ndarray) -> np.ndarray:
        logits = np.asarray(logits, dtype=np.float32)
        if name == "logits":
            return logits
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (shifted / shifted.sum(axis=1, keepdims=True)).astype(np.float32)

    def map_values(self, row: np.ndarray) -> np.ndarray:
        """uint8 argmax class ids."""
        return row.argmax(axis=0).astype(np.uint8)

    def resize_map(self, values: np.ndarray, width: int, height: int) -> np.ndarray:
        """Nearest: output pixel u takes map pixel ``floor((u + 0.5) * model / window)``."""
        rows = ((2 * np.arange(height) + 1) * values.shape[0]) // (2 * height)
        cols = ((2 * np.arange(width) + 1) * values.shape[1]) // (2 * width)
        return values[np.ix_(rows, cols)]

    def map_facts(self) -> dict[str, Any]:
        return {"labels": list(self.spec.labels)}
