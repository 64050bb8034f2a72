"""Pixel tags: an identity drawn into an image so a test can tell exactly which sample arrived.

A tag is a 2x2 grid of flat colour blocks filling the image's central square. Each block carries a
12-bit word, 4 bits per RGB channel at levels ``16 * v + 8``, so JPEG, chroma subsampling, h264
and resizing (which all keep the interior of a flat block nearly flat) change a level by far less
than the 8 it would take to flip a bit. The four words are::

    [ident & 0xFFF] [ident >> 12]
    [aux]           [checksum(ident, aux)]

``ident`` (24 bits) is the sample index or frame index; ``aux`` (12 bits) the label's colour word
for images or the video id for video frames. A wrong or mixed-up frame fails the checksum rather
than reading as another valid tag.

Reading samples the centre of each quadrant of the central square, which survives the pipelines'
evaluation transforms (resize-shorter-side plus centre crop keeps every quadrant centre inside its
block for crop fractions above 0.6).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CLASS_WORDS", "Tag", "TagError", "draw_tag", "read_tag", "tag_blocks"]

_LEVEL = 16
_OFFSET = 8
IDENT_LIMIT = 1 << 24
AUX_LIMIT = 1 << 12

# Colour words for class labels: saturated, mutually distant colours, so a small network learns
# the class from the tag's lower-left block within a few dozen steps.
CLASS_WORDS = (0xF00, 0x0F0, 0x00F, 0xFF0, 0xF0F, 0x0FF, 0xFFF, 0x888, 0xF80, 0x08F)
"""The word (a 12-bit colour) each class's label is drawn as in a tag, in label order."""


class TagError(ValueError):
    """The pixels do not hold a valid tag (checksum mismatch: a different or damaged sample)."""


@dataclass(frozen=True)
class Tag:
    """What a tag carries: ``ident`` (sample or frame index) and ``aux`` (label word or video id)."""

    ident: int
    aux: int


def _checksum(ident: int, aux: int) -> int:
    w0, w1 = ident & 0xFFF, ident >> 12
    return (w0 * 7 + w1 * 13 + aux * 29 + 0x5A5) & 0xFFF


def _word_rgb(word: int) -> tuple[int, int, int]:
    red, green, blue = (((word >> shift) & 0xF) * _LEVEL + _OFFSET for shift in (8, 4, 0))
    return red, green, blue


def tag_blocks(ident: int, aux: int) -> np.ndarray:
    """The tag's four block colours as a (2, 2, 3) uint8 array."""
    if not 0 <= ident < IDENT_LIMIT:
        raise ValueError(f"tag ident {ident} is out of range [0, {IDENT_LIMIT})")
    if not 0 <= aux < AUX_LIMIT:
        raise ValueError(f"tag aux {aux} is out of range [0, {AUX_LIMIT})")
    words = [ident & 0xFFF, ident >> 12, aux, _checksum(ident, aux)]
    return np.array([_word_rgb(w) for w in words], dtype=np.uint8).reshape(2, 2, 3)


def _central_square(height: int, width: int) -> tuple[int, int, int]:
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side


def draw_tag(image: np.ndarray, ident: int, aux: int) -> np.ndarray:
    """Fill the central square of an HWC uint8 image with the tag (in place; also returned)."""
    top, left, side = _central_square(*image.shape[:2])
    blocks = tag_blocks(ident, aux)
    half = side // 2
    edges = [0, half, side]
    for r in range(2):
        for c in range(2):
            image[top + edges[r] : top + edges[r + 1], left + edges[c] : left + edges[c + 1]] = blocks[r, c]
    return image


def read_tag(image: np.ndarray, layout: str = "HWC") -> Tag:
    """Read the tag from an image (numpy or torch, HWC or CHW, uint8).

    Raises:
        TagError: The checksum does not match, naming the words read.
    """
    arr = image.detach().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    if layout == "CHW":
        arr = np.moveaxis(arr, 0, -1)
    elif layout != "HWC":
        raise ValueError(f"layout {layout!r} is not allowed; allowed: HWC, CHW")
    top, left, side = _central_square(*arr.shape[:2])
    r = max(1, side // 16)
    words = []
    for fy, fx in ((0.25, 0.25), (0.25, 0.75), (0.75, 0.25), (0.75, 0.75)):
        cy, cx = top + int(fy * side), left + int(fx * side)
        patch = arr[cy - r : cy + r + 1, cx - r : cx + r + 1].reshape(-1, arr.shape[-1])
        levels = np.clip(np.rint((np.median(patch, axis=0) - _OFFSET) / _LEVEL), 0, 15).astype(int)
        words.append(int(levels[0]) << 8 | int(levels[1]) << 4 | int(levels[2]))
    ident = words[0] | words[1] << 12
    if _checksum(ident, words[2]) != words[3]:
        raise TagError(f"no valid tag: words {[hex(w) for w in words]} fail the checksum")
    return Tag(ident=ident, aux=words[2])
