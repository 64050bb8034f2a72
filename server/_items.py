"""A request's rows as the batcher and a model's lanes take them: encoded images or decoded rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Item", "split_rows"]


@dataclass(frozen=True)
class Item:
    """One row of a request.

    Attributes:
        encoded: Encoded JPEG/PNG bytes (validated), or ``None`` for a decoded row.
        size: (width, height) of the encoded image, as validation read it.
        pixels: A decoded uint8 row of the model's sample shape (a numpy array; a served video's
            window may be a CUDA tensor, already on the model's GPU), or ``None``.
        where: How to name this row in an error message (``"image 1 of input 'image'"``).
        times: Filled by the lane that runs the row: ``input_s`` and ``inference_s`` of its batch
            (Triton's statistics give every inference its batch's times), read when the request is answered.
    """

    encoded: bytes | None = None
    size: tuple[int, int] | None = None
    pixels: Any = None
    where: str = "the image"
    times: dict = field(default_factory=dict, compare=False, repr=False)


def split_rows(items: list[Item], live: list[int]) -> tuple[list[int], list[bytes], list[int], list[np.ndarray]]:
    """Positions and data of the encoded items, then of the decoded ones, among ``live``."""
    encoded, blobs, decoded, pixels = [], [], [], []
    for i in live:
        blob, row = items[i].encoded, items[i].pixels
        if blob is not None:
            encoded.append(i)
            blobs.append(blob)
        elif row is not None:
            decoded.append(i)
            pixels.append(row)
        else:
            raise ValueError(f"{items[i].where} holds neither encoded bytes nor pixels")
    return encoded, blobs, decoded, pixels
