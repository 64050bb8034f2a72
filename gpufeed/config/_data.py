"""Config sections for data: image splits, the image pipeline, the loaders, video clips."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from gpufeed.core import ConfigError, ObjectPath, SizePx, check_ranges, from_mapping, option, parse_size_px, quoted

__all__ = ["DataConfig", "DatasetConfig", "ImagePipelineConfig", "LoaderConfig", "VideoConfig"]

LastBatch = Literal["drop", "partial", "pad"]
OnBadSample = Literal["error", "skip"]
VideoDecoder = Literal["auto", "dali", "pyav"]
VideoFit = Literal["stretch", "centre_crop"]
JpegIdct = Literal["exact", "fast"]
WorkerStart = Literal["auto", "fork", "spawn"]
Executor = Literal["auto", "static", "dynamic"]
DepthInterp = Literal["nearest", "linear"]


@dataclass(frozen=True)
class DatasetConfig:
    """Where one split's images are: class folders under ``root`` or a list file.

    A list file has one ``path label`` per line: the label is the last word, the path everything
    before it (spaces and ``#`` included); a line starting with ``#`` is a comment. Paths are
    relative to the list file's folder unless absolute; a label is a class name or an integer index
    into the classes (``classes.txt`` beside the list file, else ``data.classes``).
    """

    root: Path | ObjectPath | None = option(
        None, doc="folder with one sub-folder of images per class (or s3://bucket/prefix, or a shard folder)"
    )
    list_file: Path | ObjectPath | None = option(None, doc="text file of 'path label' lines (or s3://bucket/key)")

    def __post_init__(self) -> None:
        if (self.root is None) == (self.list_file is None):
            raise ConfigError("", "give exactly one of 'root' (class folders) or 'list_file'")


def _split(value: Any, key_path: str) -> DatasetConfig | None:
    """A split: its mapping, or a bare path short for ``{root: PATH}`` (``train: data/train``, as
    torchvision's ImageFolder and Ultralytics take a folder of class folders)."""
    if isinstance(value, (str, Path)):
        value = {"root": str(value)}
    return None if value is None else from_mapping(DatasetConfig, value, key_path)


@dataclass(frozen=True)
class DataConfig:
    """The image dataset splits, class names, and the largest image the loaders accept."""

    train: DatasetConfig | None = option(
        None, convert=_split, doc="training split: {root: FOLDER} or {list_file: FILE}; a bare FOLDER is its root"
    )
    val: DatasetConfig | None = option(
        None, convert=_split, doc="evaluation split: {root: FOLDER} or {list_file: FILE}; a bare FOLDER is its root"
    )
    classes: tuple[str, ...] | None = option(
        None, doc="class names in label order; default: sorted class folders or classes.txt"
    )
    # The same default as serve.max_image_pixels (gpufeed.pipelines._image_facts.DEFAULT_MAX_IMAGE_PIXELS).
    max_image_pixels: int = option(
        40_000_000,
        ge=1,
        doc="an image whose header declares more pixels (width x height) is a bad file, refused before any "
        "decoding (decompression bombs); the same default as serve.max_image_pixels",
    )
    allowed_roots: tuple[Path | ObjectPath, ...] = option(
        (),
        doc="folders outside a DeepEthogram project (or a paired list file's folder) that its records (or "
        "lines) may name; without them every named file must resolve inside, symbolic links included",
    )
    # Dense targets (a split root with rgb/ and depth/ or mask/, or a list file of 'rgb map ...' lines).
    depth_scale: float = option(1.0, gt=0.0, doc="depth map value x this = the training target (e.g. 0.001: mm to m)")
    depth_no_data: int = option(
        0, ge=0, le=65535, doc="depth map value that means 'no measurement': excluded from losses and metrics"
    )
    mask_ignore_id: int = option(255, ge=0, le=255, doc="mask class id excluded from losses and metrics")
    scale_maps: bool = option(
        False, doc="scale a map whose size differs from its RGB's to the RGB's size; false: such a pair is a bad sample"
    )
    depth_interp: DepthInterp = option(
        "nearest", doc="resampling of depth maps: nearest (exact values, no blending across no-data) or linear"
    )
    map_kinds: tuple[str, ...] | None = option(
        None, doc="kinds of a paired list file's map columns (depth, mask); null: the folder named in each path"
    )

    def __post_init__(self) -> None:
        # A repeated name trained a model with two outputs of one name (predict's CSV had two columns).
        seen = set()
        for name in self.classes or ():
            if name in seen:
                raise ConfigError("classes", f"class {quoted(name)} is named twice; class names must differ")
            seen.add(name)
        for kind in self.map_kinds or ():
            if kind not in ("depth", "mask"):
                raise ConfigError("map_kinds", f"value {quoted(kind)} is not a map kind; allowed: depth, mask")


@dataclass(frozen=True)
class ImagePipelineConfig:
    """What the image pipeline outputs: uint8 (N, 3, height, width) images.

    ``size_px`` is one number for square images or ``[width, height]`` (``[352, 224]``: 352 wide,
    224 high), held as a :class:`~gpufeed.config.SizePx` that the pipelines take as it is. Training uses a random-resized crop (area fraction and aspect ratio drawn per sample,
    as in torchvision, the aspect ratio relative to the output's own) decoded straight from the
    file's region of interest, resized, randomly flipped. Evaluation scales the image so the output
    rectangle, enlarged by ``1 / eval_crop_fraction``, just fits inside it, and takes the centre
    ``width x height`` (done as one region-of-interest decode plus one resize).
    """

    size_px: SizePx = option(
        SizePx(224, 224),
        convert=parse_size_px,
        doc="output size in pixels: one number (square) or [width, height], each side 8..4096",
    )
    crop_area: tuple[float, float] = option(
        (0.08, 1.0), gt=0.0, le=1.0, doc="range of the crop's share of the image area"
    )
    crop_aspect_ratio: tuple[float, float] = option((3 / 4, 4 / 3), gt=0.0, doc="range of the crop's width/height")
    flip: bool = option(True, doc="random horizontal flip when training")
    eval_crop_fraction: float = option(0.875, gt=0.0, le=1.0, doc="centre crop / resized side")

    def __post_init__(self) -> None:
        # YAML is read by ``convert``; this reads Python callers' ``224`` or ``(352, 224)`` (and checks a SizePx).
        object.__setattr__(self, "size_px", parse_size_px(self.size_px))
        check_ranges(self, "crop_area", "crop_aspect_ratio")


@dataclass(frozen=True)
class LoaderConfig:
    """Batching, order, error policy and decoding throughput, shared by the image and clip loaders.

    Each loader builds its DALI pipeline once and feeds it epoch after epoch, so prefetching goes
    on across epoch boundaries.
    """

    batch_size: int = option(64, ge=1, doc="samples per batch (per rank)")
    num_threads: int = option(
        0,
        ge=0,
        doc="DALI CPU threads (and PyAV worker processes); 0: this rank's cores (cores / LOCAL_WORLD_SIZE), 3/4 to train, 1/4 to eval",
    )
    prefetch_queue_depth: int = option(
        2, ge=1, le=16, doc="batches DALI prepares ahead, across epoch boundaries too (each holds a batch in memory)"
    )
    hw_decoder_load: float = option(
        0.9,
        ge=0.0,
        le=1.0,
        doc="GPU only: share of JPEGs (images, dense pairs' RGB, frame stores' frames) decoded by the GPU's hardware "
        "JPEG decoder (A100/H100) in training; the rest "
        "use nvJPEG's CUDA path with CPU threads. Lower it if the hardware decoder is the bottleneck. Evaluation "
        "and serving send every JPEG to it when above 0, none at 0, so an image decodes alike wherever it sits",
    )
    pipelines: int = option(
        1,
        ge=1,
        le=8,
        doc="image loader: DALI pipelines decoding alternate batches, each with its own decoder and "
        "num_threads / pipelines threads (nvImageCodec submits a decoder's hardware-JPEG batches from one "
        "thread); the same batches in the same order. Measure before raising it: gpufeed bench loader "
        "--vary loader.pipelines=1,2. The clip and dense loaders read one",
    )
    executor: Executor = option(
        "auto",
        doc="DALI executor of the loaders' pipelines: auto = static on a GPU, dynamic on a CPU; static or dynamic "
        "forces one, to compare a GPU run's host time per batch: gpufeed bench loader --vary "
        "loader.executor=static,dynamic (dynamic on a GPU: DALI's GPU outputs reach torch without a copy)",
    )
    feed_thread: bool = option(
        True,
        doc="image loader: prepare each batch's inputs (paths, crop windows, colour matrices) on a thread of its "
        "own, ahead of DALI's calls; false: on the thread that iterates the loader, inside next(). The feed "
        "thread holds Python's lock while it works, which the training thread may then wait for (bench train's "
        "next() 'held off'): compare with gpufeed bench train --set loader.feed_thread=false",
    )
    worker_start_method: WorkerStart = option(
        "auto",
        doc="how PyAV clip workers start: auto = spawn when CUDA is already initialised in the process, else fork; "
        "spawn needs scripts to guard their entry point with if __name__ == '__main__'",
    )
    shuffle: bool = option(True, doc="reshuffle the training split every epoch")
    last_batch: LastBatch = option("drop", doc="training: drop the last partial batch, keep it ('partial') or pad it")
    on_bad_sample: OnBadSample = option(
        "error", doc="a file that fails to decode: stop naming it, or skip it and count it"
    )
    quarantine_file: Path | None = option(
        None,
        doc="text file of paths to leave out of every split, one per line ('gpufeed check --quarantine' writes "
        "one); they are counted as skipped, even with on_bad_sample: error",
    )


@dataclass(frozen=True)
class VideoConfig:
    """Behaviour-video clips: uint8 (N, 3, clip_length_frames, height, width) plus per-frame labels.

    ``size_px`` is one number for square frames or ``[width, height]`` (``[352, 224]``), held as a
    :class:`~gpufeed.config.SizePx`.

    A video folder holds ``<name>.mp4`` (or .mkv/.mov/.avi/.webm) files, frame folders
    (``<name>/000000000.png`` ...) or HDF5 files of encoded frames (``<name>.h5``), each with a
    ``<name>.csv`` of per-frame multi-hot labels (header ``frame,<behaviour>...``, or DeepEthogram's
    unnamed index column). ``deepethogram`` reads a DeepEthogram project instead of ``train``/``val``
    and splits its records by ``val_fraction``. A clip starting at frame ``s``
    holds frames ``s, s + stride, ..., s + (clip_length_frames - 1) * stride``, never past the end.
    Training draws a random start per clip slot and epoch; evaluation reads every clip in order.
    """

    train: Path | ObjectPath | None = option(
        None, doc="folder of training videos with their label CSVs (or s3://bucket/prefix, or a shard folder)"
    )
    val: Path | ObjectPath | None = option(None, doc="folder of evaluation videos with their label CSVs (or s3://...)")
    deepethogram: Path | ObjectPath | None = option(
        None,
        doc="a DeepEthogram project folder (project_config.yaml, DATA/<video>/record.yaml) to train on, "
        "instead of train/val",
    )
    val_fraction: float = option(
        0.2, ge=0.0, lt=1.0, doc="share of a DeepEthogram project's records held out for evaluation (seeded split)"
    )
    clip_length_frames: int = option(11, ge=1, le=1024, doc="frames per clip")
    stride_frames: int = option(1, ge=1, le=256, doc="gap between consecutive frames of a clip")
    size_px: SizePx = option(
        SizePx(112, 112),
        convert=parse_size_px,
        doc="output size of every frame in pixels: one number (square) or [width, height], each side 8..4096",
    )
    fit: VideoFit = option(
        "stretch",
        doc="stretch: resize the whole frame; centre_crop: resize the largest central region of the output's "
        "aspect ratio",
    )
    decoder: VideoDecoder = option(
        "auto",
        doc="auto: DALI (NVDEC) on a GPU, on a CPU DALI for VP8/VP9/MJPEG and PyAV keyframe seeks otherwise",
    )
    jpeg_idct: JpegIdct = option(
        "exact",
        doc="JPEG frame stores on a CPU: exact decodes as Pillow and OpenCV do (libjpeg-turbo's accurate integer "
        "IDCT, fancy upsampling); fast: libjpeg-turbo's fast IDCT, about 1.1 levels off on average, up to 12-19",
    )

    def __post_init__(self) -> None:
        # YAML is read by ``convert``; this reads Python callers' ``224`` or ``(352, 224)`` (and checks a SizePx).
        object.__setattr__(self, "size_px", parse_size_px(self.size_px))
