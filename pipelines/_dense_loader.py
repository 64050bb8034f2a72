"""The dense loader: an RGB image and its target maps through one DALI graph, one geometry.

Every sample's RGB and maps get the same crop window, flip and resize, computed once per sample
by the image loader's :class:`~gpufeed.pipelines._sample_loader.CropPolicy` (random-resized crops and
flips from (seed, epoch, sample id) when training, centre crops for evaluation):

==============  =========================================================  ====================
stage           RGB                                                        maps
==============  =========================================================  ====================
feed            path, window anchor/shape, resize ROI over the window      path, resize ROI in
                                                                           the map's pixels
decode          the window only (``image_slice``, nvJPEG on a GPU), EXIF   whole map, as stored
                orientation applied                                        (no re-orientation),
                                                                           dtype kept (uint16),
                                                                           on the CPU, then one
                                                                           copy to the GPU
resize          linear + antialias, the flip folded into the ROI           nearest (masks;
                                                                           depth by default) or
                                                                           linear (depth)
colour          the loader's colour augmentation, when given               never
==============  =========================================================  ====================

A map's ROI is the RGB window in the map's own pixels: the window itself when the sizes match
(the index refuses a mismatch unless ``data.scale_maps``), scaled by map size / RGB size when
``scale_maps`` is set, so the map is scaled to the RGB's size and cropped in the same resample.
DALI's nearest-neighbour resize takes source pixel ``floor(roi_start + (i + 0.5) * (roi_end -
roi_start) / out)``, so a nearest map is exact: every output pixel is a source value
(``tests/test_dense_loader.py`` checks every pixel against that location).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gpufeed.config import ImagePipelineConfig, LoaderConfig
from gpufeed.core import SizePx
from gpufeed.device import DeviceChoice
from gpufeed.pipelines._augment import LoaderAugment, apply_augment_nodes
from gpufeed.pipelines._executor import executor_args
from gpufeed.pipelines._image_pipeline import PathTable, decode_window, feed_windows, read_encoded
from gpufeed.pipelines._image_verify import find_bad_files
from gpufeed.pipelines._loader_args import loader_args, refuse_dataloader_arguments
from gpufeed.pipelines._pairs import PairedDataset
from gpufeed.pipelines._pipeline_session import Session
from gpufeed.pipelines._sample_loader import CropPolicy, SampleLoader
from gpufeed.pipelines._sampler import PlanStream, StreamBatch
from gpufeed.pipelines._windows import Windows

if TYPE_CHECKING:
    import torch

__all__ = ["DEPTH_INTERPS", "DenseBatch", "DenseLoader", "map_rois"]

DEPTH_INTERPS = ("nearest", "linear")


@dataclass(frozen=True)
class DenseBatch:
    """One batch from :class:`DenseLoader`.

    Attributes:
        images: (N, 3, H, W) torch.uint8 RGB, channels_last memory format, on the loader's device.
        maps: Map kind -> (N, H, W) tensor on the same device: ``depth`` uint8 (8-bit maps) or int32 (16-bit
            maps, values kept exactly: DALI's torch bridge has no uint16), ``mask`` uint8 class ids.
        sample_ids: (N,) torch.int64 positions in the dataset index.
        valid: (N,) torch.bool, False for padding rows (``last_batch: pad`` only).
    """

    images: torch.Tensor
    maps: dict
    sample_ids: torch.Tensor
    valid: torch.Tensor

    def __len__(self) -> int:
        return int(self.images.shape[0])


def map_rois(windows: Windows, rgb_sizes: np.ndarray, map_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(roi_start, roi_end), (y, x) float32, of each window (flip folded in) in its map's pixels.

    A map of another size than its RGB (``data.scale_maps``) gets the window scaled by map size
    over RGB size on each axis.
    """
    scale = map_sizes.astype(np.float64) / np.maximum(rgb_sizes, 1)
    x0 = windows.anchor[:, 0].astype(np.float64)
    y0 = windows.anchor[:, 1].astype(np.float64)
    w, h = windows.shape[:, 0].astype(np.float64), windows.shape[:, 1].astype(np.float64)
    flip = windows.flip.astype(bool)
    x_start = np.where(flip, x0 + w, x0) * scale[:, 0]
    x_end = np.where(flip, x0, x0 + w) * scale[:, 0]
    start = np.stack([y0 * scale[:, 1], x_start], axis=1)
    end = np.stack([(y0 + h) * scale[:, 1], x_end], axis=1)
    return start.astype(np.float32), end.astype(np.float32)


class DenseFeed:
    """Batch-mode ``external_source`` callback: RGB and map inputs of the stream's next plan batch."""

    def __init__(self, stream: PlanStream, dataset: PairedDataset, windows, augment=None, seed: int = 0) -> None:
        self.stream, self.dataset, self.windows, self.augment, self.seed = stream, dataset, windows, augment, seed
        self.kinds = dataset.kinds
        self.rgb = PathTable(list(dataset.paths))
        self.maps = {kind: PathTable(list(dataset.maps[kind])) for kind in self.kinds}
        self.iteration = 0

    @property
    def has_colour(self) -> bool:
        return self.augment is not None and self.augment.has_colour

    @property
    def num_outputs(self) -> int:
        return 7 + 4 * len(self.kinds) + int(self.has_colour)

    def __call__(self):
        k = self.iteration
        batch = self.stream[k]
        self.iteration = k + 1
        ids = batch.sample_ids
        # Flips are geometry: the maps' ROIs below take the augmentation's toggled flips too.
        windows, colour = feed_windows(self.windows, self.augment, self.seed, ids, batch.epoch)
        roi_start, roi_end = windows.roi()
        meta = np.stack([np.full(len(ids), k), np.arange(len(ids)), ids, batch.valid.astype(np.int64)], axis=1)
        out = [*self.rgb.gather(ids), windows.anchor.astype(np.int32), windows.shape.astype(np.int32)]
        out += [roi_start.astype(np.float32), roi_end.astype(np.float32), meta.astype(np.int64)]
        for kind in self.kinds:
            start, end = map_rois(windows, self.dataset.sizes[ids], self.dataset.map_sizes[kind][ids])
            out += [*self.maps[kind].gather(ids), start, end]
        return (*out, *colour)


def decode_map(paths, lengths, roi_start, roi_end, *, bits: int, nearest: bool, size: tuple[int, int], on_gpu: bool):
    """Graph fragment: one map kind's batch decoded whole, as stored, and resized over its ROI to ``size``.

    Args:
        paths, lengths: The maps' zero-padded paths (:meth:`~gpufeed.pipelines._image_pipeline.PathTable.gather`).
        roi_start, roi_end: The RGB window in the map's pixels (:func:`map_rois`).
        bits: The maps' bit depth (8 or 16): the decoded dtype, values unscaled.
        nearest: Nearest-neighbour resampling (masks; depth by default), else linear.
        size: Output (width, height).
        on_gpu: Resize on the GPU (the decode stays on the CPU).

    Returns:
        The maps at ``size``, channels last: uint8, or int32 for 16-bit maps (values exact).
    """
    from nvidia.dali import fn, types

    width, height = size
    dtype = types.UINT16 if bits == 16 else types.UINT8
    # adjust_orientation=False: a PNG map is in stored pixels, whatever metadata it carries.
    # Decoded on the CPU (nvJPEG has no PNG path, and a CPU decode keeps a 16-bit map's dtype on
    # any DALI build) and copied to the GPU once, whole, where the resize then runs.
    decoded = fn.decoders.image(
        read_encoded(paths, lengths),
        device="cpu",
        output_type=types.ANY_DATA,
        dtype=dtype,
        adjust_orientation=False,
    )
    if on_gpu:
        decoded = decoded.gpu()
    resized = fn.resize(
        decoded,
        size=(height, width),
        roi_start=roi_start,
        roi_end=roi_end,
        roi_relative=False,
        interp_type=types.INTERP_NN if nearest else types.INTERP_LINEAR,
        antialias=False,
        dtype=dtype,
    )
    # DALI's torch bridge has no uint16: widen a 16-bit map to int32 (exact) before it leaves.
    return fn.cast(resized, dtype=types.INT32) if bits == 16 else resized


def build_dense_pipeline(
    feed: DenseFeed,
    *,
    size: tuple[int, int],
    map_bits: dict[str, int],
    depth_interp: str,
    batch_size: int,
    device_id: int | None,
    num_threads: int,
    prefetch_queue_depth: int,
    seed: int,
    gpu_options: dict | None = None,
    executor: str = "auto",
    build: bool = True,
):
    """Build the dense DALI pipeline: outputs ``(images, meta, *maps)`` (maps in ``feed.kinds`` order, meta on the device).

    Args:
        size: Output (width, height) of the RGB and every map.
        map_bits: Bit depth per map kind: the decoded dtype (uint8 or uint16, values unscaled).
        depth_interp: ``nearest`` or ``linear`` resampling of depth maps (masks are always nearest).
        gpu_options: The RGB's ``mixed`` decoder arguments (the loader's ``_decoder_options``, as the
            image loader's); ``None`` on the CPU.
        executor: ``loader.executor`` (:func:`~gpufeed.pipelines._executor.executor_args`).
        build: Build it (False: the graph alone, to inspect).
    """
    from nvidia.dali import fn, pipeline_def, types

    on_gpu = device_id is not None
    width, height = size

    @pipeline_def(enable_conditionals=False)
    def dense_graph():
        dtypes = [types.UINT8, types.INT32, types.INT32, types.INT32, types.FLOAT, types.FLOAT, types.INT64]
        dtypes += [types.UINT8, types.INT32, types.FLOAT, types.FLOAT] * len(feed.kinds)
        dtypes += [types.FLOAT] * int(feed.has_colour)
        outs = fn.external_source(
            source=feed,
            num_outputs=feed.num_outputs,
            batch=True,
            dtype=dtypes,
            ndim=[1] * (feed.num_outputs - int(feed.has_colour)) + [2] * int(feed.has_colour),
        )
        paths, lengths, anchor, shape, roi_start, roi_end, meta = outs[:7]
        # The RGB goes through the image loader's own fragment: the same decode and resample.
        encoded = read_encoded(paths, lengths)
        window = (anchor, shape, roi_start, roi_end)
        images = decode_window(encoded, *window, size_px=SizePx(width, height), on_gpu=on_gpu, gpu_options=gpu_options)
        if feed.has_colour:  # colour on the RGB only: a map's values are targets, never augmented
            images = apply_augment_nodes(images, colour=outs[-1])
        maps = [
            decode_map(
                *outs[7 + 4 * j : 11 + 4 * j],
                bits=map_bits[kind],
                nearest=kind == "mask" or depth_interp == "nearest",
                size=size,
                on_gpu=on_gpu,
            )
            for j, kind in enumerate(feed.kinds)
        ]
        # On a GPU the rows' tags go out on the device only: a pinned host output is handed over after
        # the host waits for its iteration's GPU work (pipelines/_row_checks.py).
        return (images, meta.gpu() if on_gpu else meta, *maps)

    pipe = dense_graph(
        batch_size=batch_size,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=prefetch_queue_depth,
        seed=seed,
        **executor_args(on_gpu, executor),
    )
    if build:
        pipe.build()
    return pipe


class DenseLoader(SampleLoader):
    """Batches of RGB images and their target maps, cropped together, from a :class:`PairedDataset`.

    Epochs, resume (``state_dict``) and bad-file handling are the image loader's
    (:class:`~gpufeed.pipelines._epochs.EpochLoader`); a pair with a problem is left out or stops
    the loader per ``loader.on_bad_sample``, its message naming both files.

    Every argument but ``dataset`` has a default; shortcuts and config objects as for
    :class:`~gpufeed.pipelines.ImageLoader` (:mod:`gpufeed.pipelines._loader_args`).

    Args:
        dataset: The indexed paired split, or a split root (``rgb/`` with ``depth/`` and/or
            ``mask/``) or a paired list file, indexed with :class:`PairedDataset`'s constructors.
        batch_size, shuffle, num_threads: ``loader_cfg``'s fields; ``size_px``: ``image_cfg``'s.
        train: Random-resized crops and flips (and shuffling) when True (default); centre crops otherwise.
        image_cfg: :class:`gpufeed.config.ImagePipelineConfig` (crop area, ratio, flip, eval crop).
        loader_cfg: :class:`gpufeed.config.LoaderConfig`.
        device: ``"auto"`` (default), ``"gpu"``, ``"cpu"`` or a :class:`gpufeed.device.DeviceChoice`.
        size: Output (width, height); default ``image_cfg.size_px`` (``image.size_px``).
        depth_interp: ``nearest`` (default: exact values, no blending with no-data pixels) or
            ``linear`` resampling of depth maps.
        shard_id, num_shards, seed, augment, num_workers, drop_last, pin_memory: As for
            :class:`~gpufeed.pipelines.ImageLoader` (the last three are refused, naming gpufeed's
            equivalent); augmentation flips move the maps too, its colour ops touch the RGB only.
    """

    def __init__(
        self,
        dataset: PairedDataset | str | Path,
        batch_size: int | None = None,
        *,
        size_px: int | tuple[int, int] | None = None,
        train: bool = True,
        shuffle: bool | None = None,
        num_threads: int | None = None,
        seed: int = 0,
        device: DeviceChoice | str = "auto",
        image_cfg: ImagePipelineConfig | None = None,
        loader_cfg: LoaderConfig | None = None,
        size: tuple[int, int] | None = None,
        depth_interp: str = "nearest",
        shard_id: int | None = None,
        num_shards: int | None = None,
        augment: LoaderAugment | None = None,
        num_workers: None = None,
        drop_last: None = None,
        pin_memory: None = None,
    ) -> None:
        refuse_dataloader_arguments("DenseLoader", num_workers=num_workers, drop_last=drop_last, pin_memory=pin_memory)
        args = loader_args(
            "DenseLoader",
            dataset,
            dataset_type=PairedDataset,
            index=lambda path: PairedDataset.from_list(path) if path.is_file() else PairedDataset.from_root(path),
            train=train,
            device=device,
            loader_cfg=loader_cfg,
            loader_shortcuts={"batch_size": batch_size, "shuffle": shuffle, "num_threads": num_threads},
            media=(ImagePipelineConfig, image_cfg, "image_cfg"),
            media_shortcuts={"size_px": size_px},
            shard_id=shard_id,
            num_shards=num_shards,
        )
        data: PairedDataset = args.dataset
        image_cfg, loader_cfg, device = args.media_cfg, args.loader_cfg, args.device
        shard_id, num_shards = args.shard_id, args.num_shards
        if depth_interp not in DEPTH_INTERPS:
            raise ValueError(f"depth_interp {depth_interp!r}: expected one of {list(DEPTH_INTERPS)}")
        self.dataset = data
        self.image_cfg = image_cfg
        width, height = size if size is not None else image_cfg.size_px
        self.size = (width, height)
        self.depth_interp = depth_interp
        self.augment = augment if train and augment else None
        self._setup_epochs(
            train=train, loader_cfg=loader_cfg, device=device, shard_id=shard_id, num_shards=num_shards, seed=seed
        )
        self._leave_out(dict(data.problems), "pair")
        self._usable = data.usable_ids
        self._require_batches(len(self._usable), "pairs")
        self.crops = CropPolicy.for_split(data.sizes, train, seed, image_cfg, self.size)

    def _open_session(self, stream: PlanStream) -> Session:
        pipe, feed = self._pipeline(stream)
        return self._iterator_session(pipe, stream, feed, feed.kinds)

    def _pipeline(self, stream: PlanStream, *, build: bool = True) -> tuple:
        """The DALI pipeline over ``stream`` and its feed (``build=False``: the graph alone, to inspect)."""
        feed = DenseFeed(stream, self.dataset, self.crops, augment=self.augment, seed=self.seed)
        pipe = build_dense_pipeline(
            feed,
            size=self.size,
            map_bits=self.dataset.map_bits,
            depth_interp=self.depth_interp,
            batch_size=self.batch_size,
            device_id=self.device.device_id,
            num_threads=self.num_threads,
            prefetch_queue_depth=self.cfg.prefetch_queue_depth,
            seed=self.seed,
            gpu_options=self._decoder_options() if self.device.is_gpu else None,
            executor=getattr(self.cfg, "executor", "auto"),
            build=build,
        )
        return pipe, feed

    def _batch(self, out: dict, batch: StreamBatch, iteration: int) -> DenseBatch:
        meta = out["meta"]  # on the loader's device
        n = len(batch)
        self._row_checks(meta[:, :2], np.stack([np.full(n, iteration), np.arange(n)], axis=1))
        maps = {kind: out[kind][..., 0] for kind in self.dataset.kinds}
        return DenseBatch(out["images"].permute(0, 3, 1, 2), maps, meta[:, 2].contiguous(), meta[:, 3].bool())

    def _suspects(self, batches: list[StreamBatch]) -> list[tuple[int, str, None]]:
        ids = self._batch_ids(batches)
        files = [(i, self.dataset.paths[i], None) for i in ids]
        return files + [(i, self.dataset.maps[kind][i], None) for i in ids for kind in self.dataset.kinds]

    def _recheck(self, suspects) -> dict[int, str]:
        bad = dict(find_bad_files([path for _, path, _ in suspects], self.dataset.max_pixels))
        return {i: f"{path}: {bad[path]}" for i, path, _ in suspects if path in bad}
