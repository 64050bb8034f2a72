"""Clips from frame stores: encoded frames in, one image decoder for every frame of every clip.

:class:`StoreFrameFeed` hands a plan batch's clips to DALI frame by frame: the pipeline's batch
is ``batch_size x T`` encoded images, clip after clip, and one ``fn.decoders.image`` (``mixed``:
nvJPEG / the hardware JPEG decoder on a GPU; ``cpu`` otherwise) decodes them all; the loader puts
every ``T`` consecutive frames back together as a (T, H, W, 3) clip, a view, no copy (the graph is
in :mod:`gpufeed.pipelines._store_pipeline`). A clip of 11 frames costs 11 image decodes and no
seeking. Before, the graph stacked ``T`` outputs of ``T`` decoders, one per frame slot: on a GPU
each ``mixed`` decoder owns a thread pool and nvJPEG's per-thread device and pinned buffers
(read in DALI's ``imgcodec/image_decoder.h``), so an 11-frame clip built 11 of them.

The feed runs in DALI's Python worker processes (a parallel ``external_source``) for the clip
loader, so the files are read beside the training thread, not on it; the sequential reader
(:class:`gpufeed.pipelines.VideoFrameReader`, one pipeline per pass over one video) reads them
in its own thread, where starting worker processes for every video would cost more than the reads.

HDF5 stores hold their frames' channels reversed (see :mod:`gpufeed.pipelines._frame_stores`):
after the resize, a set of HDF5 stores reverses the channel axis; when folders and HDF5 files mix,
the feed adds a per-clip 3x3 channel matrix (identity or reversal) for ``fn.coord_transform``.

Each frame's header is read before it is handed on, and a frame declaring more than
``max_pixels`` (``data.max_image_pixels``) is refused undecoded
(:mod:`gpufeed.pipelines._frame_limit`): the store's probe saw frame 0 only.

**On a CPU, stores of JPEG frames** take another decode stage (:class:`ScaledJpegClips`): DALI's
Python worker processes (a parallel ``external_source``, as for PyAV) read each clip's frames and
decode them with libjpeg-turbo (``simplejpeg``) *DCT-scaled*: at 1/2, 1/4 or 1/8 of the stored
size, the smallest of those still at least as large as the output needs (:func:`jpeg_scale_eighths`),
so the inverse DCT, the chroma upsampling and the colour conversion run on a quarter of the pixels
or fewer, and HDF5 frames come out of the decoder with their channels already put back (libjpeg
writes BGR as cheaply as RGB). The worker then fits the clip to the output itself, crop window and
resize in one torch call for all its frames (:class:`~gpufeed.pipelines._clip_resize.ClipResizer`),
and the clip enters the graph after the resize (augment, layout), as PyAV's fitted clips do: DALI's
resize in the loader's process cost about 2 ms of an 11-frame clip (128 px to 112 px), torch's
0.3 ms in the worker. Only where a centre-crop window does not fall on whole decoded pixels does the
(T, h, w, 3) clip enter at the graph's resize (a relative region) as before. DALI's CPU decoder has
no scaled decode; it decodes every frame at full size and the resize then throws most of those
pixels away.

What scaling changes: a 1/2-scaled decode computes each output pixel from the 4x4 lowest DCT
frequencies of its 8x8 block, an ideal low-pass of the block rather than the full decode followed
by the bilinear antialiased resize, so pixels differ from the GPU path's (nvJPEG, full size) by a
few levels at edges and not at all in flat areas; the frames, their order and the crop window are
the same (the tests check the frame tags and bound the pixel difference). The worker's resize is the
same triangle filter as DALI's, rounded its own way: within one level of DALI's resize of the same
decoded clip inside the frame (14-21% of the values one level apart), and on the outermost pixels
on camera-like frames; up to 2-4 levels there on per-pixel noise, where torch renormalises the
filter at the frame's (or window's) edge and DALI repeats the edge pixels (or reads past the
window). PNG frames, and every store on a GPU, take the image-decoder graph above.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from gpufeed.core import WorkerCallback
from gpufeed.pipelines._clip_resize import ClipResizer
from gpufeed.pipelines._frame_limit import refuse_big_frames
from gpufeed.pipelines._frame_sizes import frame_size_problem
from gpufeed.pipelines._frame_stores import FrameBytesReader, describe_bad_frame, stored_colorspace
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS, read_image_facts
from gpufeed.pipelines._image_verify import decode_problem
from gpufeed.pipelines._store_kinds import frame_store

__all__ = [
    "JPEG_SCALE_EIGHTHS",
    "ScaledJpegClips",
    "StoreFrameFeed",
    "StoreRef",
    "jpeg_decode_sizes",
    "jpeg_scale_eighths",
]

# libjpeg-turbo scales by n/8, n = 1..16; only 1/8, 1/4, 1/2 and 1 are faster than a full decode
# (measured with simplejpeg on 256x256 quality-95 frames: 7/8 took 1.8x the full decode's time).
JPEG_SCALE_EIGHTHS = (1, 2, 4, 8)

_IDENTITY = np.eye(3, dtype=np.float32)
_REVERSE = np.ascontiguousarray(_IDENTITY[::-1])


class StoreRef:
    """Where one frame store's frames are: ``path``, ``kind`` (``folder``/``hdf5``), ``frame_name``.

    ``width`` x ``height`` is the size of its frames (frame 0's; 0 when unknown), which names a
    frame of another size when its decode fails; ``frame_store`` is the kind's
    :class:`~gpufeed.pipelines._store_kinds.FrameStore`.
    """

    __slots__ = ("frame_name", "frame_store", "height", "kind", "num_frames", "path", "width")

    def __init__(self, path: str, kind: str, frame_name: str, num_frames: int, width: int = 0, height: int = 0) -> None:
        self.path, self.kind, self.frame_name, self.num_frames = path, kind, frame_name, int(num_frames)
        self.width, self.height = int(width), int(height)
        self.frame_store = frame_store(kind)

    @classmethod
    def from_info(cls, info) -> StoreRef:
        return cls(info.path, info.store, info.frame_name, info.num_frames, info.width, info.height)

    def frame_label(self, index: int) -> str:
        """How messages name frame ``index`` of this store."""
        return self.frame_store.frame_label(self.frame_name, index)


def channel_mode(kinds: set[str]) -> str:
    """How a set of store kinds decodes: ``"rgb"`` (folders), ``"bgr"`` (HDF5: channels reversed) or ``"per_clip"`` (both)."""
    reversed_kinds = {k for k in kinds if frame_store(k).channels_reversed}
    if not reversed_kinds:
        return "rgb"
    return "bgr" if reversed_kinds == kinds else "per_clip"


class StoreFrameFeed(WorkerCallback):
    """Per-sample ``external_source`` callback: one encoded frame of a planned clip per sample.

    The pipeline's batch is the plan batch's clips laid out frame by frame (``batch_size x T``
    samples): sample ``i`` of iteration ``k`` is frame ``t = i % T`` of clip ``j = i // T``, row ``j``
    of ``rows(k)``. It returns that frame's bytes, the clip's tag ``k * batch_size + j`` (int64)
    and, in ``per_clip`` channel mode, the clip's channel matrix. A clip's frames are read together
    (an HDF5 clip's references in one read, :mod:`gpufeed.pipelines._hdf5_heap`) when its first
    frame is asked for and kept until another clip's is: DALI hands each worker process a contiguous
    run of a batch's samples, so a clip is read once, or twice where a run ends inside it.

    Picklable (``rows`` must be), so DALI's worker processes may be forked or spawned; stores are
    opened in each process that reads them.

    Args:
        rows: ``rows(k) -> (video ids, starts)`` of iteration ``k``, ``batch_size`` rows.
        stores: :class:`StoreRef` per video id (``None`` for videos the loader does not read).
        clip_length_frames, stride_frames: Which frames a clip holds from its start.
        batch_size: Clips per iteration.
        mode: :func:`channel_mode` of the stores read.
        max_pixels: A frame whose header declares more is refused before decoding.
        fast_idct: JPEG frames with libjpeg-turbo's fast IDCT on a CPU (``video.jpeg_idct: fast``);
            by default the exact decode, as Pillow's and OpenCV's.
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
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
        fast_idct: bool = False,
    ) -> None:
        self.rows, self.stores, self.max_pixels = rows, stores, max_pixels
        self.offsets = np.arange(clip_length_frames, dtype=np.int64) * stride_frames
        self.batch_size, self.mode, self.fast_idct = batch_size, mode, fast_idct
        self._reader: FrameBytesReader | None = None
        self._rows: tuple[int | None, tuple] = (None, ())
        # (iteration, row), the clip's frames, its channel matrix
        self._clip: tuple[tuple[int, int] | None, list, np.ndarray] = (None, [], _IDENTITY)

    def __getstate__(self):
        state = super().__getstate__()  # the worker that unpickles it dies with this process
        state["_reader"] = None  # open HDF5 files do not travel to worker processes
        state["_rows"], state["_clip"] = (None, ()), (None, [], _IDENTITY)
        return state

    @property
    def clip_length_frames(self) -> int:
        return len(self.offsets)

    @property
    def num_outputs(self) -> int:
        return 3 if self.mode == "per_clip" else 2

    def _read_clip(self, k: int, j: int) -> tuple[tuple[int, int], list, np.ndarray]:
        if self._rows[0] != k:
            self._rows = (k, self.rows(k))
        videos, starts = self._rows[1]
        store = self.stores[int(videos[j])]
        assert store is not None, "the plan only names videos the loader reads, each a store"
        frames = int(starts[j]) + self.offsets
        if self._reader is None:
            self._reader = FrameBytesReader()
        try:
            data = self._reader.read(store.path, store.kind, store.frame_name, frames)
        except Exception as err:  # OSError, h5py's errors ...: name the store, the loader skips or reports it
            raise RuntimeError(f"{store.path}: cannot read frames {frames[0]}..{frames[-1]}: {err}") from None
        refuse_big_frames(store, frames, data, self.max_pixels)
        for index, encoded in zip(frames, data, strict=True):
            # DALI 2.4's image decoder parses the headers of a batch of more than 4 x (threads + 1)
            # images on its thread pool, and a header it cannot parse there crashed the process
            # (measured: 2 runs in 3 with one garbage sample in a batch of 44 at 2 threads) instead of
            # raising; damaged image data after a good header fails the batch cleanly. So every
            # frame's header is checked here first.
            # A frame of another size would be resized on its own into the clip: named instead.
            facts = read_image_facts(encoded.tobytes(), header_only=True)
            where = store.frame_label(int(index))
            if facts.problem:
                raise RuntimeError(f"{store.path}: {describe_bad_frame(encoded.tobytes(), where, facts.problem)}")
            other_size = frame_size_problem(encoded.tobytes(), where, store.width, store.height, facts=facts)
            if other_size:
                raise RuntimeError(f"{store.path}: {other_size}")
        return (k, j), data, (_REVERSE if store.frame_store.channels_reversed else _IDENTITY)

    def __call__(self, sample_info):
        k = int(sample_info.iteration)
        j, t = divmod(int(sample_info.idx_in_batch), self.clip_length_frames)
        if self._clip[0] != (k, j):
            self._clip = self._read_clip(k, j)
        out = (self._clip[1][t], np.array([k * self.batch_size + j], dtype=np.int64))
        return (*out, self._clip[2]) if self.mode == "per_clip" else out

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def jpeg_scale_eighths(width: int, height: int, min_width: int, min_height: int) -> int:
    """The smallest of :data:`JPEG_SCALE_EIGHTHS` (n for a scale of n/8) whose decode is large enough.

    libjpeg-turbo's decode at n/8 is ``ceil(width * n / 8)`` x ``ceil(height * n / 8)``; 8 (the full
    size) when no smaller scale reaches ``min_width`` x ``min_height``.
    """
    for n in JPEG_SCALE_EIGHTHS:
        if math.ceil(width * n / 8) >= min_width and math.ceil(height * n / 8) >= min_height:
            return n
    return 8


def jpeg_decode_sizes(frame_sizes, region_sizes, output) -> np.ndarray:
    """(width, height) each video's JPEG frames decode to, (videos, 2).

    Args:
        frame_sizes: (videos, 2) stored (width, height) of each video's frames.
        region_sizes: (videos, 2) (width, height) of the part of a frame the resize reads (the whole
            frame, or its centre crop), in stored pixels.
        output: The output's :class:`~gpufeed.core._size.SizePx`: the region, decoded, covers it.
    """
    decoded = []
    for (width, height), (region_w, region_h) in zip(np.asarray(frame_sizes), np.asarray(region_sizes), strict=True):
        width, height = int(width), int(height)
        # The whole frame is decoded, so it must be the region's share of the output larger.
        need_w = math.ceil(output.width_px * width / max(float(region_w), 1.0) - 1e-6)
        need_h = math.ceil(output.height_px * height / max(float(region_h), 1.0) - 1e-6)
        n = jpeg_scale_eighths(width, height, need_w, need_h)
        decoded.append((math.ceil(width * n / 8), math.ceil(height * n / 8)))
    return np.array(decoded, dtype=np.int64).reshape(-1, 2)


def _fallback_decode(data: np.ndarray, colorspace: str, size: tuple[int, int]) -> np.ndarray:
    """A frame that is not a JPEG (a PNG in a JPEG store): Pillow, resized to the clip's ``size``."""
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data.tobytes())) as image:
        rgb = image.convert("RGB")
        if rgb.size != size:
            rgb = rgb.resize(size, Image.Resampling.BILINEAR, reducing_gap=None)
        out = np.asarray(rgb)
    return np.ascontiguousarray(out[..., ::-1]) if colorspace == "BGR" else out


class ScaledJpegClips(WorkerCallback):
    """Per-sample callback for DALI's parallel ``external_source``: clips of JPEG stores, decoded scaled.

    Sample ``j`` of iteration ``k`` is row ``j`` of ``rows(k)``; it returns the clip's ``T`` frames
    as one (T, h, w, 3) uint8 RGB array, each decoded by libjpeg-turbo at its store's scale
    (``decoded_sizes``), and the tag ``k * batch_size + j`` (int64). Picklable (``rows`` must be),
    so its worker processes may be forked or spawned; stores are opened in each worker.

    Args:
        rows: ``rows(k) -> (video ids, starts)`` of iteration ``k``, ``batch_size`` rows.
        stores: :class:`StoreRef` per video id (``None`` for videos the loader does not read).
        decoded_sizes: (videos, 2) (width, height) each video's frames are decoded to.
        clip_length_frames, stride_frames: Which frames a clip holds from its start.
        batch_size: Rows per iteration.
        max_pixels: A frame whose header declares more is refused before decoding.
        fast_idct: libjpeg-turbo's fast IDCT (``video.jpeg_idct: fast``); by default the exact
            decode, bit-equal to Pillow's at the same scale.
        resizer: Crops and resizes each decoded clip to the output here, in the worker
            (:class:`~gpufeed.pipelines._clip_resize.ClipResizer`); ``None`` hands over the decoded
            size, for the graph to crop and resize.
    """

    def __init__(
        self,
        rows: Callable[[int], tuple[np.ndarray, np.ndarray]],
        stores: list[StoreRef | None],
        decoded_sizes: np.ndarray,
        *,
        clip_length_frames: int,
        stride_frames: int,
        batch_size: int,
        max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
        fast_idct: bool = False,
        resizer: ClipResizer | None = None,
    ) -> None:
        self.rows, self.stores, self.max_pixels = rows, stores, max_pixels
        self.fast_idct, self.resizer = fast_idct, resizer
        import simplejpeg  # noqa: F401  # imported by the loader's process: forked workers inherit it

        self.decoded_sizes = np.asarray(decoded_sizes, dtype=np.int64)
        self.offsets = np.arange(clip_length_frames, dtype=np.int64) * stride_frames
        self.batch_size = batch_size
        self._reader: FrameBytesReader | None = None
        self._cached: tuple[int | None, tuple] = (None, ())

    def __getstate__(self):
        state = super().__getstate__()
        state["_reader"] = None  # open HDF5 files do not travel to worker processes
        state["_cached"] = (None, ())
        return state

    def __call__(self, sample_info):
        import simplejpeg

        k, j = int(sample_info.iteration), int(sample_info.idx_in_batch)
        if self._cached[0] != k:
            self._cached = (k, self.rows(k))
        videos, starts = self._cached[1]
        video = int(videos[j])
        store = self.stores[video]
        frames = int(starts[j]) + self.offsets
        if self._reader is None:
            self._reader = FrameBytesReader()
        try:
            data = self._reader.read(store.path, store.kind, store.frame_name, frames)
        except Exception as err:  # OSError, h5py's errors ...: name the store, the loader skips or reports it
            raise RuntimeError(f"{store.path}: cannot read frames {frames[0]}..{frames[-1]}: {err}") from None
        refuse_big_frames(store, frames, data, self.max_pixels)  # before Pillow's fallback decodes one whole
        width, height = (int(v) for v in self.decoded_sizes[video])
        # HDF5 frames hold reversed channels: libjpeg writes them back as BGR at no extra cost.
        colorspace = stored_colorspace(store.kind)
        clip = np.empty((len(frames), height, width, 3), dtype=np.uint8)
        for t, encoded in enumerate(data):
            try:
                if encoded[:2].tobytes() == b"\xff\xd8":
                    # min_* pick the scale exactly (see jpeg_scale_eighths); fastdct=False, fastupsample=False
                    # is libjpeg's default decode (accurate integer IDCT, fancy upsampling), bit-equal to
                    # Pillow's (its draft() when scaled) and OpenCV's; buffer= decodes straight into the clip.
                    got = simplejpeg.decode_jpeg(
                        encoded,
                        colorspace=colorspace,
                        fastdct=self.fast_idct,
                        fastupsample=False,
                        min_width=width,
                        min_height=height,
                        strict=False,
                        buffer=clip[t],
                    )
                    if got.shape != clip.shape[1:]:
                        raise ValueError(
                            f"decoded to {got.shape[1]}x{got.shape[0]}, the clip's frames are {width}x{height}"
                        )
                else:
                    clip[t] = _fallback_decode(encoded, colorspace, (width, height))
            except Exception as err:  # simplejpeg's ValueError, Pillow's errors, a frame of another size
                where = store.frame_label(int(frames[t]))
                # Another size than the store's is named as such (libjpeg only says its buffer is too small).
                why = frame_size_problem(encoded.tobytes(), where, store.width, store.height)
                if why is None:
                    problem = decode_problem(encoded.tobytes()) or str(err)
                    why = describe_bad_frame(encoded.tobytes(), where, problem)
                raise RuntimeError(f"{store.path}: {why}") from None
        if self.resizer is not None:
            clip = self.resizer(clip, video)
        return clip, np.array([k * self.batch_size + j], dtype=np.int64)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
