"""Crop windows: which region of each source image becomes the output, and whether it flips.

Windows are a pure function of (seed, epoch, sample id): a counter-based hash supplies each
sample's random numbers, so a crop never depends on batch composition, worker count, device or
where a run was resumed. The training window follows torchvision's ``RandomResizedCrop``
(10 tries at a random area and log-uniform aspect ratio, then a centre-crop fallback); the
evaluation window is the centre region that "scale the image until the output size / fraction
just fits, then centre-crop the output size" would keep (for a square output: resize the shorter
side to size / fraction, centre-crop size). For a non-square output (``size_px: [width, height]``)
both keep the output's shape: the training aspect-ratio range is relative to ``width / height``
(so ``3/4..4/3`` still means "up to a third squashed or stretched"), and the evaluation window
has the output's aspect ratio, so evaluation never distorts. The PIL baseline of ``gpufeed bench loader`` uses these same
windows, so both sides do identical work.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Windows", "eval_windows", "hash_uniforms", "train_windows"]

_TRIES = 10
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Windows:
    """Per-sample crop windows in the decoded image's pixels (EXIF orientation applied, as DALI decodes).

    Attributes:
        anchor: (N, 2) int32 (x, y) of the window's top-left corner.
        shape: (N, 2) int32 (width, height) of the window.
        flip: (N,) uint8, 1 where the sample is mirrored left-right.
    """

    anchor: np.ndarray
    shape: np.ndarray
    flip: np.ndarray

    def __len__(self) -> int:
        return len(self.flip)

    def select(self, i: int) -> Windows:
        """The window of sample ``i`` alone."""
        return Windows(self.anchor[i : i + 1], self.shape[i : i + 1], self.flip[i : i + 1])

    def roi(self) -> tuple[np.ndarray, np.ndarray]:
        """(roi_start, roi_end) in (y, x) order over the decoded window, flip folded in.

        DALI's resize mirrors when ``roi_end < roi_start``, so the flip costs no extra pass.
        """
        w = self.shape[:, 0].astype(np.float32)
        h = self.shape[:, 1].astype(np.float32)
        f = self.flip.astype(np.float32)
        zeros = np.zeros_like(w)
        return np.stack([zeros, w * f], axis=1), np.stack([h, w * (1.0 - f)], axis=1)


def _mix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser: a fast, well-distributed 64-bit hash (uint64 wraps on purpose).
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def hash_uniforms(seed: int, epoch: int, ids: np.ndarray, draws: int, stream: int = 0) -> np.ndarray:
    """(len(ids), draws) float64 uniforms in [0, 1), a pure function of (seed, epoch, id, draw, stream).

    ``stream`` separates independent uses of the same (seed, epoch, id): the crop windows use
    stream 0, the loader's colour augmentation its own, so neither's draws depend on the other's.
    """
    with np.errstate(over="ignore"):
        key = _mix(np.asarray(np.uint64(seed) * _GOLDEN + np.uint64(epoch)))  # a 0-d array: the same bits
        if stream:
            key = _mix(key ^ (np.uint64(stream) * _M2))
        base = _mix(key ^ (np.asarray(ids, dtype=np.uint64) * _GOLDEN))
        counters = np.arange(1, draws + 1, dtype=np.uint64) * _GOLDEN
        bits = _mix(base[:, None] + counters[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def train_windows(
    sizes: np.ndarray,
    ids: np.ndarray,
    seed: int,
    epoch: int,
    area: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: bool = True,
    output_aspect: float = 1.0,
) -> Windows:
    """Random-resized-crop windows for the samples ``ids`` whose decoded (width, height) are ``sizes``.

    ``output_aspect`` is the output's width / height: the window's aspect-ratio range is ``ratio``
    times it, so a window of aspect ``output_aspect`` is resized without distortion.
    """
    ratio = (ratio[0] * output_aspect, ratio[1] * output_aspect)
    width = sizes[:, 0].astype(np.float64)
    height = sizes[:, 1].astype(np.float64)
    u = hash_uniforms(seed, epoch, ids, 4 * _TRIES + 1)
    log_lo, log_hi = np.log(ratio[0]), np.log(ratio[1])
    target = (width * height)[:, None] * (area[0] + (area[1] - area[0]) * u[:, 0:_TRIES])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, _TRIES : 2 * _TRIES])
    w = np.rint(np.sqrt(target * aspect))
    h = np.rint(np.sqrt(target / aspect))
    fits = (w > 0) & (h > 0) & (w <= width[:, None]) & (h <= height[:, None])
    found = fits.any(axis=1)
    first = fits.argmax(axis=1)
    rows = np.arange(len(ids))
    # Fallback as in torchvision: the largest centred crop whose aspect ratio is within range.
    in_ratio = width / height
    fb_w = np.where(in_ratio < ratio[0], width, np.where(in_ratio > ratio[1], np.rint(height * ratio[1]), width))
    fb_h = np.where(in_ratio < ratio[0], np.rint(width / ratio[0]), height)
    cw = np.where(found, w[rows, first], fb_w)
    ch = np.where(found, h[rows, first], fb_h)
    ux = u[rows, 2 * _TRIES + first]
    uy = u[rows, 3 * _TRIES + first]
    x = np.where(found, np.floor(ux * (width - cw + 1)), np.floor((width - cw) / 2))
    y = np.where(found, np.floor(uy * (height - ch + 1)), np.floor((height - ch) / 2))
    flips = (u[:, -1] < 0.5) if flip else np.zeros(len(ids), dtype=bool)
    return Windows(
        anchor=np.stack([x, y], axis=1).astype(np.int32),
        shape=np.stack([cw, ch], axis=1).astype(np.int32),
        flip=flips.astype(np.uint8),
    )


def eval_windows(sizes: np.ndarray, crop_fraction: float, output_aspect: float = 1.0) -> Windows:
    """Centre windows of aspect ``output_aspect`` (width / height) covering ``crop_fraction`` of the fit.

    The window is what "scale until the output enlarged by ``1 / crop_fraction`` just fits inside
    the image, then centre-crop the output" keeps; for a square output the centre square of side
    ``crop_fraction * shorter side``.
    """
    width, height = sizes[:, 0].astype(np.int64), sizes[:, 1].astype(np.int64)
    # The output is wider than the image (relative to height): the width binds, else the height.
    width_binds = width < height * output_aspect
    full_w = np.where(width_binds, width, height * output_aspect)
    full_h = np.where(width_binds, width / output_aspect, height)
    win_w = np.clip(np.rint(full_w * crop_fraction), 1, width).astype(np.int64)
    win_h = np.clip(np.rint(full_h * crop_fraction), 1, height).astype(np.int64)
    x, y = (width - win_w) // 2, (height - win_h) // 2
    return Windows(
        anchor=np.stack([x, y], axis=1).astype(np.int32),
        shape=np.stack([win_w, win_h], axis=1).astype(np.int32),
        flip=np.zeros(len(sizes), dtype=np.uint8),
    )
