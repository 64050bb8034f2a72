"""Colour jitter, grayscale and flips inside the loader's DALI graph, keyed like the crop windows.

Every per-sample decision and magnitude comes from the counter-based hash that draws the crop
windows (:func:`~gpufeed.pipelines._windows.hash_uniforms`), on a stream of its own
(:data:`AUGMENT_STREAM`), so the parameters are a pure function of (seed, epoch, sample id):
independent of the window draws, of batch composition, thread count, device and of where a run
resumed, and identical on the CPU and the GPU.

The colour ops are all linear in RGB, so a sample's whole colour augmentation is one 3x4 matrix
``[M | T]`` applied to every pixel (``out = M @ rgb + T``, rounded to the nearest level and
saturated to uint8) by ``fn.coord_transform``, one pass over the resized image, on the device
the image is on. With pixels in [0, 255], luma weights ``g = (0.299, 0.587, 0.114)`` and the grey
axis ``1 = (1, 1, 1)``:

=============  ==============================================================================
op             per sample
=============  ==============================================================================
brightness b   ``x -> b x``
contrast c     ``x -> c (x - 127.5) + 127.5`` (about mid-grey, as DALI's ``brightness_contrast``)
saturation s   ``x -> s x + (1 - s) (g . x) 1``
hue h          rotation by ``h`` turns of the chroma plane (YIQ's I and Q) about the grey axis
grayscale      ``x -> (g . x) 1``
=============  ==============================================================================

applied in that order (grayscale commutes with the others). They compose to
``M = a P0 + b P1 + c P2``, ``T = d 1`` with ``P0 = 1 g^T`` (projection on grey), ``P1 = I - P0``
(the chroma part), ``P2`` (a quarter turn of the chroma plane) and four scalars per sample
(:func:`colour_coefficients`). The same function, fed by ``torch.rand`` instead of the hash, is
the training device's fused colour op (``gpufeed.train._augment``), so both places compute the
same maths. :func:`reference_augment` is the numpy reference the tests hold DALI to.

Flips: the image loader folds them into the resize ROI (free); clips use ``fn.flip`` on the
whole sequence. A clip's parameters apply to every one of its frames.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpufeed.pipelines._windows import hash_uniforms

__all__ = [
    "AUGMENT_STREAM",
    "AugmentRows",
    "ColourJitter",
    "LoaderAugment",
    "RowsFeed",
    "apply_augment_nodes",
    "augment_graph",
    "colour_coefficients",
    "colour_matrices",
    "reference_augment",
]

AUGMENT_STREAM = 0xC0102
# Draw k of a sample's hash stream, one fixed slot per parameter, so enabling one op never moves
# another op's draws.
_JITTER_APPLY, _BRIGHTNESS, _CONTRAST, _SATURATION, _HUE, _GRAY_APPLY, _FLIP_APPLY = range(7)
DRAWS = 8

_LUMA = np.array([0.299, 0.587, 0.114])
_YIQ = np.array([_LUMA, [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])
_P0 = np.outer(np.ones(3), _LUMA)
_P1 = np.eye(3) - _P0
_P2 = np.linalg.inv(_YIQ) @ np.array([[0.0, 0.0, 0.0], [0.0, 0.0, -1.0], [0.0, 1.0, 0.0]]) @ _YIQ


def _basis() -> np.ndarray:
    """(4, 12): rows are P0, P1, P2 and the offset column, each as a flattened 3x4 [M | T]."""
    rows = []
    for matrix in (_P0, _P1, _P2):
        rows.append(np.concatenate([matrix, np.zeros((3, 1))], axis=1).ravel())
    rows.append(np.concatenate([np.zeros((3, 3)), np.ones((3, 1))], axis=1).ravel())
    return np.stack(rows)


BASIS = _basis()
MID_GREY = 127.5


@dataclass(frozen=True)
class ColourJitter:
    """Random brightness, contrast, saturation (factors in ``[1 - r, 1 + r]``, floored at 0) and
    hue (a shift in ``[-hue, hue]`` turns), all applied to a sample with probability ``p``."""

    p: float = 0.8
    brightness: float = 0.2
    contrast: float = 0.2
    saturation: float = 0.2
    hue: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"colour jitter probability {self.p} is outside [0, 1]")
        if min(self.brightness, self.contrast, self.saturation) < 0 or not 0.0 <= self.hue <= 0.5:
            raise ValueError(f"colour jitter ranges must be >= 0 (hue in [0, 0.5]), got {self}")


def colour_coefficients(u, jitter: ColourJitter | None, grayscale_p: float | None, xp):
    """The four scalars ``(a, b, c, d)`` of each sample's ``[M | T]`` from its uniforms.

    Written with plain arithmetic and ``xp.cos``/``xp.sin``/``xp.stack`` so that numpy (the
    loader's hash draws) and torch (the device's ``torch.rand`` draws) run the same formula.

    Args:
        u: (n, >= 6) uniforms in [0, 1) (columns as in this module's draw slots).
        jitter: Colour jitter ranges, or ``None`` for none.
        grayscale_p: Probability of grayscale, or ``None`` for none.
        xp: ``numpy`` or ``torch``.

    Returns:
        (n, 4) coefficients over :data:`BASIS`.
    """
    ones = u[:, 0] * 0.0 + 1.0
    bright, contrast, sat, turns = ones, ones, ones, ones * 0.0
    if jitter is not None:
        applied = (u[:, _JITTER_APPLY] < jitter.p) * 1.0

        def factor(column: int, spread: float):
            lo = max(0.0, 1.0 - spread)
            return 1.0 + applied * (lo + (1.0 + spread - lo) * u[:, column] - 1.0)

        bright = factor(_BRIGHTNESS, jitter.brightness)
        contrast = factor(_CONTRAST, jitter.contrast)
        sat = factor(_SATURATION, jitter.saturation)
        turns = applied * jitter.hue * (2.0 * u[:, _HUE] - 1.0)
    if grayscale_p is not None:
        sat = sat * (1.0 - (u[:, _GRAY_APPLY] < grayscale_p) * 1.0)
    gain = bright * contrast
    angle = turns * (2.0 * math.pi)
    return xp.stack([gain, gain * sat * xp.cos(angle), gain * sat * xp.sin(angle), MID_GREY * (1.0 - contrast)], axis=1)


def colour_matrices(coefficients: np.ndarray) -> np.ndarray:
    """(n, 3, 4) float32 ``[M | T]`` per sample from :func:`colour_coefficients`' numpy output."""
    return (np.asarray(coefficients, dtype=np.float64) @ BASIS).reshape(-1, 3, 4).astype(np.float32)


@dataclass(frozen=True)
class AugmentRows:
    """One epoch plan's loader augmentation, row by row in read order.

    Attributes:
        colour: (rows, 3, 4) float32 ``[M | T]`` per row, or ``None`` (no colour op).
        flip: (rows,) bool, True where the row is mirrored left-right, or ``None`` (no flip op).
    """

    colour: np.ndarray | None = None
    flip: np.ndarray | None = None

    def __len__(self) -> int:
        present = self.colour if self.colour is not None else self.flip
        return 0 if present is None else len(present)


@dataclass(frozen=True)
class LoaderAugment:
    """Which augmentations the loader's DALI graph applies, and their ranges.

    Attributes:
        jitter: Colour jitter, or ``None``.
        grayscale_p: Probability of grayscale, or ``None``.
        flip_p: Probability of a left-right flip, or ``None``. On images it toggles the crop
            window's own flip (``image.flip``), so each is an independent coin.
    """

    jitter: ColourJitter | None = None
    grayscale_p: float | None = None
    flip_p: float | None = None

    def __post_init__(self) -> None:
        for name in ("grayscale_p", "flip_p"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} {value} is outside [0, 1]")

    def __bool__(self) -> bool:
        return self.has_colour or self.flip_p is not None

    @property
    def has_colour(self) -> bool:
        return self.jitter is not None or self.grayscale_p is not None

    def uniforms(self, seed: int, epoch: int, ids: np.ndarray) -> np.ndarray:
        """(len(ids), DRAWS) uniforms of the samples ``ids``: their own hash stream."""
        return hash_uniforms(seed, epoch, np.asarray(ids, dtype=np.int64), DRAWS, stream=AUGMENT_STREAM)

    def rows(self, seed: int, epoch: int, ids: np.ndarray) -> AugmentRows:
        """The parameters of the samples ``ids`` (one row each, in that order) in ``epoch``."""
        u = self.uniforms(seed, epoch, ids)
        colour = None
        if self.has_colour:
            colour = colour_matrices(colour_coefficients(u, self.jitter, self.grayscale_p, np))
        flip = None if self.flip_p is None else u[:, _FLIP_APPLY] < self.flip_p
        return AugmentRows(colour=colour, flip=flip)


def reference_augment(pixels: np.ndarray, colour: np.ndarray | None, flip: bool = False) -> np.ndarray:
    """numpy reference of what the graph does to one sample: HWC image or FHWC clip, uint8.

    Colour in float64, rounded half to even and saturated, then the flip (along W). DALI rounds a
    float to an integer half to even on the GPU and half away from zero on the CPU (``ConvertSat``
    in ``dali/core/convert.h``), so at an exact tie of .5 the CPU's pixel may be one level above
    this; with real-valued matrices such ties are rare.
    """
    out = pixels
    if colour is not None:
        matrix = np.asarray(colour, dtype=np.float64)
        out = np.clip(np.rint(pixels.astype(np.float64) @ matrix[:, :3].T + matrix[:, 3]), 0, 255).astype(np.uint8)
    if flip:
        out = out[..., ::-1, :]
    return out


class RowsFeed:
    """Batch-mode ``external_source`` callback: per-row columns, batch by batch, in plan order.

    Pads exactly as the readers pad their last batch (repeating the final row), also for a batch
    DALI may ask for past the end while prefetching, so rows stay aligned with the samples.
    """

    def __init__(self, columns: list[np.ndarray], batch_size: int) -> None:
        self._columns = columns
        self._batch_size = batch_size
        self._count = len(columns[0])
        self._next = 0

    def __call__(self):
        index = np.minimum(np.arange(self._next, self._next + self._batch_size), self._count - 1)
        self._next += self._batch_size
        return [list(column[index]) for column in self._columns]


def apply_augment_nodes(frames, colour=None, flip=None):
    """The graph fragment on parameter nodes: colour (``fn.coord_transform``), then flip (``fn.flip``).

    For pipelines that feed the parameters their own way (a per-sample ``external_source`` reading
    ``SampleInfo``, say): ``colour`` is a float32 (3, 4) ``[M | T]`` per sample, ``flip`` an int32
    scalar per sample (1: mirror), both CPU DataNodes; ``None`` leaves that op out.
    """
    from nvidia.dali import fn, types

    if colour is not None:
        frames = fn.coord_transform(frames, MT=colour, dtype=types.UINT8)
    if flip is not None:
        frames = fn.flip(frames, horizontal=flip)
    return frames


def augment_graph(frames, rows: AugmentRows | None, batch_size: int):
    """The graph fragment fed from a plan's rows: colour then flip, per sample.

    Args:
        frames: uint8 HWC images or FHWC clips (CPU or GPU DataNode), one per plan row.
        rows: The plan's :class:`AugmentRows` (``None`` or empty: ``frames`` unchanged).
        batch_size: The pipeline's batch size (for the parameter feed).

    Returns:
        The augmented DataNode, same layout, dtype and device.
    """
    if rows is None or (rows.colour is None and rows.flip is None):
        return frames
    from nvidia.dali import fn, types

    columns, dtypes = [], []
    if rows.colour is not None:
        columns.append(np.asarray(rows.colour, dtype=np.float32))
        dtypes.append(types.FLOAT)
    if rows.flip is not None:
        columns.append(np.asarray(rows.flip, dtype=np.int32))
        dtypes.append(types.INT32)
    fed = fn.external_source(source=RowsFeed(columns, batch_size), num_outputs=len(columns), batch=True, dtype=dtypes)
    return apply_augment_nodes(
        frames,
        colour=fed[0] if rows.colour is not None else None,
        flip=fed[-1] if rows.flip is not None else None,
    )


class StreamAugmentFeed:
    """Batch-mode ``external_source`` callback: iteration ``k``'s parameters, from plan batch ``stream[k]``.

    For a pipeline built once and fed epoch after epoch (the clip loaders): the parameters of
    each row are a pure function of (seed, epoch, sample id), like the plan itself, so the feed
    needs no state but the iteration it is at.

    Args:
        stream: The plan batches (a :class:`~gpufeed.pipelines._sampler.PlanStream`).
        augment: What to apply.
        seed: The loader's seed.
        fill_to: Rows per iteration when the pipeline's batches are always full (a short plan
            batch is filled by repeating its last row, as the clip sources fill theirs).
        row_order: ``row_order(k)`` -> the plan row of each output row of iteration ``k``, when the
            pipeline's rows are not in plan order; ``None``: plan order.
        repeat: Samples per row: each row's parameters that many times (frame stores lay a clip
            out as ``T`` samples, one per frame).
    """

    def __init__(
        self, stream, augment: LoaderAugment, seed: int, fill_to: int | None = None, row_order=None, repeat: int = 1
    ) -> None:
        self.stream, self.augment, self.seed, self.fill_to = stream, augment, int(seed), fill_to
        self.row_order, self.repeat = row_order, repeat
        self.iteration = 0

    def __call__(self):
        batch = self.stream[self.iteration]
        ids = np.asarray(batch.sample_ids, dtype=np.int64)
        if self.fill_to is not None and len(ids) < self.fill_to:
            ids = np.concatenate([ids, np.full(self.fill_to - len(ids), ids[-1])])
        if self.row_order is not None:  # the rows as the reader outputs them (see _clip_pipeline.reader_order)
            ids = ids[self.row_order(self.iteration)]
        self.iteration += 1
        rows = self.augment.rows(self.seed, batch.epoch, ids)
        columns = []
        if rows.colour is not None:
            columns.append(list(np.repeat(rows.colour.astype(np.float32), self.repeat, axis=0)))
        if rows.flip is not None:
            columns.append(list(np.repeat(rows.flip.astype(np.int32), self.repeat)))
        return columns

    def apply(self, frames):
        """The graph fragment: this feed's parameters applied to ``frames`` (colour, then flip)."""
        from nvidia.dali import fn, types

        dtypes = ([types.FLOAT] if self.augment.has_colour else []) + (
            [types.INT32] if self.augment.flip_p is not None else []
        )
        if not dtypes:
            return frames
        fed = fn.external_source(source=self, num_outputs=len(dtypes), batch=True, dtype=dtypes)
        return apply_augment_nodes(
            frames,
            colour=fed[0] if self.augment.has_colour else None,
            flip=fed[-1] if self.augment.flip_p is not None else None,
        )
