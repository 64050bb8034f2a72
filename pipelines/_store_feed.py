"""Clips from frame stores: encoded frames in, DALI's image decoder, frames stacked into a clip.

The graph has the images' shape, once per frame of a clip: an ``external_source`` hands over the
encoded bytes of each of the clip's ``T`` frames as ``T`` outputs, each goes through
``fn.decoders.image`` (``mixed``: nvJPEG / the hardware JPEG decoder on a GPU; ``cpu`` otherwise)
and ``fn.stack`` makes the (T, H, W, 3) "FHWC" clip the rest of the clip graph (crop window,
resize, augment, layout) takes. A clip of 11 frames costs 11 image decodes and no seeking.

HDF5 stores hold their frames' channels reversed (see :mod:`gpufeed.pipelines._frame_stores`):
after the resize, a set of HDF5 stores reverses the channel axis; when folders and HDF5 files mix,
the feed adds a per-clip 3x3 channel matrix (identity or reversal) for ``fn.coord_transform``.

The feed reads bytes only, in the pipeline's own thread: reading a few small files per clip costs
far less than decoding them, which DALI's threads do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpufeed.pipelines._frame_stores import HDF5_CHANNELS_REVERSED, FrameBytesReader

__all__ = ["StoreClipFeed", "StoreRef", "decode_store_clips"]

_IDENTITY = np.eye(3, dtype=np.float32)
_REVERSE = np.ascontiguousarray(_IDENTITY[::-1])


class StoreRef:
    """Where one frame store's frames are: ``path``, ``kind`` (``folder``/``hdf5``), ``frame_name``."""

    __slots__ = ("frame_name", "kind", "num_frames", "path")

    def __init__(self, path: str, kind: str, frame_name: str, num_frames: int) -> None:
        self.path, self.kind, self.frame_name, self.num_frames = path, kind, frame_name, int(num_frames)

    @classmethod
    def from_info(cls, info) -> StoreRef:
        return cls(info.path, info.store, info.frame_name, info.num_frames)


def channel_mode(kinds: set[str]) -> str:
    """How a set of stores decodes: ``"rgb"`` (folders), ``"bgr"`` (HDF5) or ``"per_clip"`` (both)."""
    reversed_kinds = {k for k in kinds if k == "hdf5" and HDF5_CHANNELS_REVERSED}
    if not reversed_kinds:
        return "rgb"
    return "bgr" if reversed_kinds == kinds else "per_clip"


class StoreClipFeed:
    """Per-sample ``external_source`` callback: the encoded frames of each planned clip.

    Sample ``j`` of iteration ``k`` is row ``j`` of ``rows(k)``; it returns the ``T`` frames'
    bytes, the tag ``k * batch_size + j`` (int64) and, in ``per_clip`` channel mode, the clip's
    channel matrix.

    Args:
        rows: ``rows(k) -> (video ids, starts)`` of iteration ``k``, ``batch_size`` rows.
        stores: :class:`StoreRef` per video id.
        clip_length_frames, stride_frames: Which frames a clip holds from its start.
        batch_size: Rows per iteration.
        mode: :func:`channel_mode` of the stores read.
    """

    def __init__(
        self,
        rows: Callable[[int], tuple[np.ndarray, np.ndarray]],
        stores: list[StoreRef | None],
        *,
        clip_length_frames: int,
        stride_frames: int,
        batch_size: int,
        mode: str,
    ) -> None:
        self.rows, self.stores = rows, stores
        self.offsets = np.arange(clip_length_frames, dtype=np.int64) * stride_frames
        self.batch_size, self.mode = batch_size, mode
        self.reader = FrameBytesReader()
        self._cached: tuple[int | None, tuple] = (None, ())
        self.frames_read = 0

    @property
    def num_outputs(self) -> int:
        return len(self.offsets) + (2 if self.mode == "per_clip" else 1)

    def __call__(self, sample_info):
        k, j = int(sample_info.iteration), int(sample_info.idx_in_batch)
        if self._cached[0] != k:
            self._cached = (k, self.rows(k))
        videos, starts = self._cached[1]
        store = self.stores[int(videos[j])]
        frames = int(starts[j]) + self.offsets
        try:
            data = self.reader.read(store.path, store.kind, store.frame_name, frames)
        except Exception as err:  # OSError, h5py's errors ...: name the store, the loader skips or reports it
            raise RuntimeError(f"{store.path}: cannot read frames {frames[0]}..{frames[-1]}: {err}") from None
        self.frames_read += len(data)
        out = (*data, np.array([k * self.batch_size + j], dtype=np.int64))
        if self.mode == "per_clip":
            out += (_REVERSE if store.kind == "hdf5" and HDF5_CHANNELS_REVERSED else _IDENTITY,)
        return out

    def close(self) -> None:
        self.reader.close()


def decode_store_clips(feed: StoreClipFeed, on_gpu: bool):
    """The decode stage for frame stores, inside a pipeline definition.

    Returns:
        (frames "FHWC", tag, restore): ``restore(frames)`` puts HDF5 channels back; the graph calls
        it after the resize, where a clip holds far fewer pixels (decoding straight to BGR costs
        the CPU decoder 20-50% of its throughput, measured).
    """
    from nvidia.dali import fn, types

    t = len(feed.offsets)
    dtypes = [types.UINT8] * t + [types.INT64] + ([types.FLOAT] if feed.mode == "per_clip" else [])
    outputs = fn.external_source(source=feed, num_outputs=feed.num_outputs, batch=False, dtype=dtypes)
    # libjpeg-turbo's fast integer IDCT: measured 1.5x the CPU decoder's JPEG throughput (256x256,
    # quality 95, shared 2-core machine) for pixels within a level or two of the exact IDCT.
    fast: dict[str, Any] = {} if on_gpu else {"use_fast_idct": True}
    decoded = [
        fn.decoders.image(encoded, device="mixed" if on_gpu else "cpu", output_type=types.RGB, **fast)
        for encoded in outputs[:t]
    ]
    frames = fn.stack(*decoded, axis=0, axis_name="F")

    def restore(fitted):
        if feed.mode == "bgr":
            return fitted[:, :, :, ::-1]
        if feed.mode == "per_clip":
            return fn.coord_transform(fitted, M=outputs[t + 1], dtype=types.UINT8)
        return fitted

    return frames, outputs[t], restore
