"""Synthetic paired data for dense targets: RGB JPEGs with 16-bit depth PNGs and 8-bit mask PNGs.

Every value is known from the pixel coordinates, so a test can check any output pixel exactly:

* depth: :func:`synth_depth` ``(x, y)`` = ``1 + (y * width + x) mod 65535`` in the map's own
  pixels, one distinct value per pixel for maps up to 65,535 pixels (256 x 192 is 49,152), except
  a no-data block (value 0) in the top-left corner of every sample;
* mask: class ids 1..3 in rectangles placed per sample on background 0, and an ignore band (255)
  along the bottom rows;
* RGB: red and green ramps of x and y, the rectangles tinted by class, so both targets are
  learnable from the colours.

Layout (``gpufeed synth`` writes it under ``DIR/dense``)::

    ROOT/train/rgb/<id>.jpg   ROOT/train/depth/<id>.png   ROOT/train/mask/<id>.png
    ROOT/val/...              the same for the evaluation split
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

__all__ = ["NO_DATA_BLOCK_PX", "SYNTH_IGNORE_ID", "render_pair", "synth_depth", "write_paired_split"]

NO_DATA_BLOCK_PX = 4  # side of the top-left no-data (depth 0) block
SYNTH_IGNORE_ID = 255
_CLASS_TINTS = ((0, 0, 0), (0, 0, 200), (120, 0, 120), (0, 160, 0))


def synth_depth(width: int, height: int) -> np.ndarray:
    """(height, width) uint16 depth of the synthetic maps: ``1 + (y * width + x) mod 65535``, no-data block 0."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.int64)
    depth = (1 + (yy * width + xx) % 65535).astype(np.uint16)
    depth[:NO_DATA_BLOCK_PX, :NO_DATA_BLOCK_PX] = 0
    return depth


def render_pair(ident: int, width: int, height: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(RGB uint8 HWC, depth uint16 HW, mask uint8 HW) of synthetic sample ``ident``."""
    rng = np.random.default_rng([seed, ident, 21])
    mask = np.zeros((height, width), dtype=np.uint8)
    for class_id in (1, 2, 3):
        w, h = int(rng.integers(width // 6, width // 2)), int(rng.integers(height // 6, height // 2))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        mask[y : y + h, x : x + w] = class_id
    mask[-max(1, height // 16) :, :] = SYNTH_IGNORE_ID
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([xx * 255 // max(width - 1, 1), yy * 255 // max(height - 1, 1), np.full_like(xx, 64)], -1)
    tint = np.asarray(_CLASS_TINTS)[np.where(mask == SYNTH_IGNORE_ID, 0, mask)]
    rgb = np.clip(rgb + tint, 0, 255).astype(np.uint8)
    return rgb, synth_depth(width, height), mask


def write_paired_split(
    root: Path,
    count: int,
    width: int,
    height: int,
    seed: int,
    progress=None,
    kinds: tuple[str, ...] = ("depth", "mask"),
) -> Path:
    """Write ``count`` samples into ``root/rgb/<id>.jpg`` and ``root/<kind>/<id>.png`` per map kind; return ``root``."""
    root = Path(root)
    for kind in ("rgb", *kinds):
        (root / kind).mkdir(parents=True, exist_ok=True)
    for ident in range(count):
        rgb, depth, mask = render_pair(ident, width, height, seed)
        Image.fromarray(rgb).save(root / "rgb" / f"{ident:06d}.jpg", quality=92)
        if "depth" in kinds:
            Image.fromarray(depth).save(root / "depth" / f"{ident:06d}.png")  # mode I;16: a 16-bit grayscale PNG
        if "mask" in kinds:
            Image.fromarray(mask).save(root / "mask" / f"{ident:06d}.png")
        if progress is not None:
            progress.update(1)
    return root
