"""JSON text of an integer map, written by numpy: no Python object per value.

A dense model's REST answer at ``?size=input`` holds one value per input pixel. Written the
ordinary way (``values.tolist()`` then ``json.dumps``) a 7900 x 5000 map became 39.5 million
Python ints (about 1.4 GB of objects) on the way to a 100 MB string, and the allocator kept part
of that after the answer left. :func:`int_map_json` writes the same bytes from the array itself,
a block of rows at a time: per value its decimal digits and one separator in a fixed-width cell,
the unused leading bytes dropped at the end. Its memory is a few arrays of the block's size and
the text itself.
"""

from __future__ import annotations

import functools

import numpy as np

__all__ = ["int_map_json"]

_ROWS_PER_BLOCK = 256  # bounds the temporaries: 256 rows of 8,000 values is 2 M values, 16 MB per int64 array
_COMMA, _OPEN, _CLOSE, _ZERO = ord(","), ord("["), ord("]"), ord("0")


@functools.cache
def _digit_table() -> np.ndarray:
    """(65536, 5) uint8: the decimal digits of 0..65535, right-aligned after zero bytes (320 KB, built once)."""
    values = np.arange(65536, dtype=np.int64)[:, None]
    powers = 10 ** np.arange(4, -1, -1, dtype=np.int64)
    table = (_ZERO + (values // powers) % 10).astype(np.uint8)
    table[(values < powers) & (powers > 1)] = 0
    return table


def _block(block: np.ndarray) -> bytes:
    """``[..],[..],...`` for the rows of ``block`` (no outer brackets).

    Each value is written as ``places`` bytes, its digits right-aligned after zero bytes, then its
    separator; each row gets ``[`` before and ``,`` after; dropping the zero bytes (never a byte
    of JSON text) leaves the text.
    """
    height, width = block.shape
    places = max(1, len(str(int(block.max()))))
    cells = np.empty((height, width, places + 1), dtype=np.uint8)
    if block.dtype.kind == "u" and block.dtype.itemsize <= 2:  # depth and class ids: a table lookup
        cells[..., :places] = _digit_table()[block, 5 - places :]
    else:
        values = block.astype(np.int64).reshape(height, width, 1)
        powers = 10 ** np.arange(places - 1, -1, -1, dtype=np.int64)
        cells[..., :places] = _ZERO + (values // powers) % 10
        cells[..., :places][(values < powers) & (powers > 1)] = 0  # leading zeros: dropped below
    cells[..., places] = _COMMA
    cells[:, -1, places] = _CLOSE
    rows = np.empty((height, width * (places + 1) + 2), dtype=np.uint8)
    rows[:, 0] = _OPEN
    rows[:, 1:-1] = cells.reshape(height, -1)
    rows[:, -1] = _COMMA  # between rows; the block's last is cut below
    text = rows.ravel()
    return text[text != 0][:-1].tobytes()


def int_map_json(values: np.ndarray) -> bytes:
    """JSON of a 2-D array of non-negative integers, exactly ``json.dumps(values.tolist(), separators=(",", ":"))``.

    Args:
        values: (height, width) of an unsigned (or non-negative) integer dtype.

    Raises:
        ValueError: ``values`` is not 2-D, not integers, or holds a negative value.
    """
    values = np.asarray(values)
    if values.ndim != 2 or values.dtype.kind not in "ui":
        raise ValueError(f"int_map_json takes a 2-D integer array, got {values.ndim}-D {values.dtype}")
    if values.size and values.min() < 0:
        raise ValueError("int_map_json takes non-negative integers")
    height, width = values.shape
    if height == 0:
        return b"[]"
    if width == 0:
        return b"[" + b",".join([b"[]"] * height) + b"]"
    blocks = [_block(values[r : r + _ROWS_PER_BLOCK]) for r in range(0, height, _ROWS_PER_BLOCK)]
    return b"[" + b",".join(blocks) + b"]"
