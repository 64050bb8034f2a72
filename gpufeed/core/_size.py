"""Output sizes in pixels: one number for a square, ``[width, height]`` for anything else.

``size_px`` is written the way users think of frames (``[352, 224]``: 352 wide, 224 high, as
DeepEthogram's home-cage videos are); tensors are ``H x W``, and DALI's resize takes ``resize_x``
(width) then ``resize_y`` (height). :class:`SizePx` names both sides so no caller has to remember
which order a pair is in.

``size_px`` is parsed once, where it enters: the config (:mod:`gpufeed.config._data`), a model's
spec as a checkpoint or model card stores it (:mod:`gpufeed.models._spec`) and command-line flags.
From there on a :class:`SizePx` travels: pipelines, training, export, the server and the
benchmarks take it as it is and never re-read it; :meth:`SizePx.config_value` writes it back in
the config's spelling.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from gpufeed.core._schema import ConfigError

__all__ = ["MAX_SIZE_PX", "MIN_SIZE_PX", "SizePx", "parse_size_px"]

MIN_SIZE_PX = 8
MAX_SIZE_PX = 4096


class SizePx(NamedTuple):
    """An output size: ``width_px`` columns by ``height_px`` rows.

    Attributes:
        width_px: Columns (DALI's ``resize_x``, the last axis of an HWC or CHW tensor).
        height_px: Rows (DALI's ``resize_y``).
    """

    width_px: int
    height_px: int

    @property
    def hw(self) -> tuple[int, int]:
        """``(height_px, width_px)``: the order tensor shapes use."""
        return (self.height_px, self.width_px)

    @property
    def is_square(self) -> bool:
        return self.width_px == self.height_px

    def config_value(self) -> int | tuple[int, int]:
        """How ``size_px`` writes this size: one number when square, else ``(width, height)``."""
        return self.width_px if self.is_square else (self.width_px, self.height_px)

    @property
    def label(self) -> str:
        """``224`` for a square, ``352x224`` otherwise: for reports and cache folder names."""
        return str(self.width_px) if self.is_square else f"{self.width_px}x{self.height_px}"

    def __str__(self) -> str:
        return f"{self.width_px}x{self.height_px}"


def _side(value: Any, key: str, whole: Any, which: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"{which} {value!r} in {whole!r} is not an integer number of pixels")
    if not MIN_SIZE_PX <= value <= MAX_SIZE_PX:
        raise ConfigError(
            key, f"{which} {value} in {whole!r} is out of range: each side must be {MIN_SIZE_PX}..{MAX_SIZE_PX} px"
        )
    return value


def parse_size_px(value: Any, key: str = "size_px") -> SizePx:
    """Read a ``size_px`` value: an int (a square), ``[width, height]``, or the text ``"WxH"``.

    The text forms (``"352x224"``, ``"352,224"``, ``"224"``) are for command-line flags such as
    ``gpufeed bench loader --size-px 352x224``.

    Args:
        value: The value as given.
        key: Its key path (``image.size_px``, ``--size-px``), named by every error.

    Returns:
        The size, width first.

    Raises:
        ConfigError: Not an int or a pair of ints, or a side outside 8..4096 px.
    """
    if isinstance(value, SizePx):
        return SizePx(_side(value.width_px, key, value, "width"), _side(value.height_px, key, value, "height"))
    if isinstance(value, str):
        parts = re.split(r"\s*[x,]\s*", value.strip().lower())
        if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
            raise ConfigError(
                key, f"value {value!r} is not a size: give WIDTH (a square) or WIDTHxHEIGHT, e.g. 352x224"
            )
        value = [int(p) for p in parts] if len(parts) == 2 else int(parts[0])
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ConfigError(
                key, f"value {list(value)!r} has {len(value)} items; give [width, height] (2 items) or one number"
            )
        return SizePx(_side(value[0], key, value, "width"), _side(value[1], key, value, "height"))
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"value {value!r} is not a size: give one number (a square) or [width, height]")
    side = _side(value, key, value, "size")
    return SizePx(side, side)
