"""Synthetic JPEG/PNG classification data whose pixels name the sample and its label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from gpufeed.synth._tags import CLASS_WORDS, draw_tag

__all__ = ["CLASS_NAMES", "IMAGE_SIZES", "render_image", "write_image_split"]

# (width, height): landscape, portrait, square and a larger one, so the pipelines meet mixed sizes.
IMAGE_SIZES = ((96, 72), (72, 96), (80, 80), (128, 96))
"""The (width, height) sizes the synthetic images cycle through."""
CLASS_NAMES = ("amber", "birch", "cedar", "daisy", "ember", "fjord", "glade", "heath", "indigo", "juniper")
"""The image classes, in label order."""


def render_image(ident: int, label: int, width: int, height: int, seed: int) -> np.ndarray:
    """An HWC uint8 image: textured margins and, in its central square, the tag (ident, label)."""
    rng = np.random.default_rng([seed, ident])
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([(xx * 255 // max(width - 1, 1)), (yy * 255 // max(height - 1, 1)), np.full_like(xx, 96)], -1)
    noise = rng.integers(-12, 13, size=(height, width, 3))
    image = np.clip(base + noise, 0, 255).astype(np.uint8)
    return draw_tag(image, ident, CLASS_WORDS[label])


def write_image_split(
    out_dir: Path,
    split: str,
    classes: tuple[str, ...],
    per_class: int,
    seed: int,
    progress=None,
) -> list[tuple[str, int]]:
    """Write ``out_dir/split/<class>/<ident>.{jpg,png}`` and return (relative path, label) rows.

    Sample ``ident`` counts up over sorted classes then files, which is exactly the order the
    gpufeed dataset index assigns sample ids, so ``read_tag(image).ident`` equals the sample id.
    Even idents are JPEG (quality 92), odd ones PNG.
    """
    rows = []
    ident = 0
    for label, name in enumerate(classes):
        class_dir = out_dir / split / name
        class_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(per_class):
            width, height = IMAGE_SIZES[ident % len(IMAGE_SIZES)]
            pixels = render_image(ident, label, width, height, seed)
            ext = "jpg" if ident % 2 == 0 else "png"
            path = class_dir / f"{ident:06d}.{ext}"
            if ext == "jpg":
                Image.fromarray(pixels).save(path, quality=92)
            else:
                Image.fromarray(pixels).save(path)
            rows.append((f"{split}/{name}/{path.name}", label))
            ident += 1
            if progress is not None:
                progress.update(1)
    return rows
