"""How a video's frames are shown: its display matrix as quarter turns and a mirror.

A phone held upright records landscape frames and a display matrix saying "turn them a quarter
counterclockwise" (or clockwise); players, OpenCV (and so DeepEthogram's labelling GUI), FFmpeg's
command line and torchcodec show the frames turned. gpufeed hands every frame over as shown too,
so a rotated phone video, its prepared copy and a frame store written from it give the same pixels.

FFmpeg's display matrix ``[a b u; c d v; x y w]`` maps a stored pixel ``(x, y)`` (y down) to
``(a x + c y, b x + d y)`` on screen, up to a shift; its 2x2 part, rounded to the nearest right
angle, is one of eight :class:`Orientation` values: ``turns`` counterclockwise quarter turns, then a
left-right mirror when ``mirrored``. These are exact moves of pixels (no resampling).

Imported by DALI's worker processes (through :mod:`gpufeed.pipelines._frame_fit`): numpy only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["UPRIGHT", "Orientation", "frame_orientation", "orientation_from_matrix"]


class Orientation(NamedTuple):
    """Counterclockwise quarter turns (0-3), then a left-right mirror, that show stored frames as meant."""

    turns: int = 0
    mirrored: bool = False

    @property
    def degrees(self) -> int:
        """The turn in degrees counterclockwise (0, 90, 180, 270)."""
        return self.turns * 90

    @property
    def swaps_sides(self) -> bool:
        """Whether shown frames are the stored ones' height wide and width high."""
        return self.turns % 2 == 1

    def __bool__(self) -> bool:
        return bool(self.turns or self.mirrored)

    def describe(self) -> str:
        """In words, for messages: ``"turned 90 degrees counterclockwise, mirrored"``."""
        parts = [f"turned {self.degrees} degrees counterclockwise"] if self.turns else []
        return ", ".join(parts + (["mirrored left-right"] if self.mirrored else [])) or "upright"

    def apply(self, array: np.ndarray) -> np.ndarray:
        """``array`` (rows, columns, ...) as shown: a view, no copy."""
        shown = np.rot90(array, self.turns) if self.turns else array
        return shown[:, ::-1] if self.mirrored else shown

    def shown_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) on screen of a ``width`` x ``height`` stored frame."""
        return (height, width) if self.swaps_sides else (width, height)


UPRIGHT = Orientation()

# (transpose, flip rows, flip columns) of the screen mapping -> (turns, mirrored); see the module docs.
_FROM_FLIPS = {
    (False, False, False): Orientation(0, False),
    (False, True, True): Orientation(2, False),
    (False, False, True): Orientation(0, True),
    (False, True, False): Orientation(2, True),
    (True, True, False): Orientation(1, False),
    (True, False, True): Orientation(3, False),
    (True, True, True): Orientation(1, True),
    (True, False, False): Orientation(3, True),
}


def orientation_from_matrix(a: float, b: float, c: float, d: float) -> Orientation:
    """The :class:`Orientation` of a display matrix's 2x2 part (``x' = a x + c y``, ``y' = b x + d y``).

    Rounded to the nearest right angle: a matrix whose diagonal outweighs the rest keeps the axes,
    else it swaps them.
    """
    keeps_axes = abs(a) + abs(d) >= abs(b) + abs(c)
    # Otherwise x' follows y and y' follows x: the axes swap (a transpose).
    return _FROM_FLIPS[(False, d < 0, a < 0) if keeps_axes else (True, b < 0, c < 0)]


def frame_orientation(frame) -> Orientation:
    """How a decoded PyAV ``VideoFrame`` is shown: from its display matrix side data, else upright."""
    matrix = frame.side_data.get("DISPLAYMATRIX")
    if matrix is None:
        return UPRIGHT
    m = np.frombuffer(bytes(matrix), dtype=np.int32)  # 3x3, 16.16 fixed point (the last column 2.30)
    if len(m) < 5:
        return UPRIGHT
    return orientation_from_matrix(float(m[0]), float(m[1]), float(m[3]), float(m[4]))
