"""gpufeed's configuration: YAML read with ``safe_load`` into frozen dataclasses.

One :class:`Config` holds every section. Each section documents its keys; ``gpufeed config
--describe`` prints them all with types and defaults. Unknown keys, wrong types and values out of
range fail with :class:`ConfigError` naming the key path, the value and what is allowed.

Example::

    cfg = load_config("train.yaml", overrides=["loader.batch_size=32"])
    save_config(cfg, run_dir / "config.yaml")   # the resolved config, saved with the outputs
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from gpufeed._schema import ConfigError, describe, from_mapping, option, to_mapping

__all__ = [
    "AUGMENT_OPS",
    "AugmentConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DatasetConfig",
    "ImagePipelineConfig",
    "LoaderConfig",
    "ModelConfig",
    "TelemetryConfig",
    "TrainConfig",
    "describe_config",
    "load_config",
    "parse_config",
    "save_config",
]

DeviceName = Literal["auto", "gpu", "cpu"]
LastBatch = Literal["drop", "partial", "pad"]
OnBadSample = Literal["error", "skip"]
Schedule = Literal["cosine", "linear", "constant"]
AmpMode = Literal["auto", "bf16", "fp16", "off"]
AugmentOp = Literal["color_jitter", "grayscale", "gaussian_blur", "rotation", "erasing", "horizontal_flip"]
AUGMENT_OPS: tuple[str, ...] = get_args(AugmentOp)


@dataclass(frozen=True)
class DatasetConfig:
    """Where one split's images are: class folders under ``root`` or a list file.

    A list file has one ``path label`` per line (``#`` starts a comment); paths are relative to
    the list file's folder unless absolute; a label is a class name or an integer index into the
    classes (``classes.txt`` beside the list file, else ``data.classes``).
    """

    root: Path | None = option(None, doc="folder with one sub-folder of images per class")
    list_file: Path | None = option(None, doc="text file of 'path label' lines")

    def __post_init__(self) -> None:
        if (self.root is None) == (self.list_file is None):
            raise ConfigError("", "give exactly one of 'root' (class folders) or 'list_file'")


@dataclass(frozen=True)
class DataConfig:
    """The image dataset splits and class names."""

    train: DatasetConfig | None = option(None, doc="training split")
    val: DatasetConfig | None = option(None, doc="evaluation split")
    classes: tuple[str, ...] | None = option(
        None, doc="class names in label order; default: sorted class folders or classes.txt"
    )


@dataclass(frozen=True)
class ImagePipelineConfig:
    """What the image pipeline outputs: uint8 (N, 3, size, size) images.

    Training uses a random-resized crop (area fraction and aspect ratio drawn per sample, as in
    torchvision) decoded straight from the file's region of interest, resized, randomly flipped.
    Evaluation resizes the shorter side to ``size / eval_crop_fraction`` and takes the centre
    ``size`` square (done as one region-of-interest decode plus one resize).
    """

    size_px: int = option(224, ge=8, le=4096, doc="output height and width in pixels")
    crop_area: tuple[float, float] = option(
        (0.08, 1.0), gt=0.0, le=1.0, doc="range of the crop's share of the image area"
    )
    crop_aspect_ratio: tuple[float, float] = option((3 / 4, 4 / 3), gt=0.0, doc="range of the crop's width/height")
    flip: bool = option(True, doc="random horizontal flip when training")
    eval_crop_fraction: float = option(0.875, gt=0.0, le=1.0, doc="centre crop / resized side")

    def __post_init__(self) -> None:
        for name in ("crop_area", "crop_aspect_ratio"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ConfigError(name, f"range {[lo, hi]} is empty: the first value must be <= the second")


@dataclass(frozen=True)
class LoaderConfig:
    """Batching, order and error policy shared by the image and clip loaders."""

    batch_size: int = option(64, ge=1, doc="samples per batch (per rank)")
    num_threads: int = option(0, ge=0, doc="DALI CPU threads; 0 means one per available core")
    prefetch_queue_depth: int = option(2, ge=1, le=16, doc="batches DALI prepares ahead")
    shuffle: bool = option(True, doc="reshuffle the training split every epoch")
    last_batch: LastBatch = option("drop", doc="training: drop the last partial batch, keep it ('partial') or pad it")
    on_bad_sample: OnBadSample = option(
        "error", doc="a file that fails to decode: stop naming it, or skip it and count it"
    )


@dataclass(frozen=True)
class ModelConfig:
    """The network to train.

    Its input size and evaluation crop are not set here: they are the image pipeline's
    ``image.size_px`` and ``image.eval_crop_fraction`` (the video pipeline's for clip models), so
    the model's spec, the pipelines, the export and the server cannot disagree.
    """

    name: str = option("resnet18", doc="registry name: resnet18, smallcnn (images), clip_resnet18, r3d_small (clips)")
    num_classes: int | None = option(None, ge=1, doc="output classes; null: the number of classes in the data")
    mean: tuple[float, float, float] | None = option(
        None, ge=0.0, le=1.0, doc="per-channel mean of [0, 1] pixels, applied inside the model; null: the model's"
    )
    std: tuple[float, float, float] | None = option(
        None, gt=0.0, doc="per-channel std of [0, 1] pixels, applied inside the model; null: the model's"
    )


@dataclass(frozen=True)
class TrainConfig:
    """The training loop: length, optimiser (AdamW), schedule, precision, checkpoints, evaluation."""

    epochs: int = option(10, ge=1, doc="passes over the training split; also the learning-rate schedule's length")
    max_steps: int | None = option(
        None,
        ge=1,
        doc="stop after this many optimizer steps in total (the schedule still spans 'epochs'); null: no limit",
    )
    lr: float = option(1e-3, gt=0.0, doc="peak learning rate of AdamW")
    weight_decay: float = option(0.05, ge=0.0, doc="AdamW decoupled weight decay")
    schedule: Schedule = option("cosine", doc="learning-rate decay after warm-up, over all steps of 'epochs'")
    warmup_steps: int = option(0, ge=0, doc="linear warm-up from 0 to lr over this many steps")
    min_lr_fraction: float = option(0.0, ge=0.0, le=1.0, doc="final learning rate as a fraction of lr")
    amp: AmpMode = option("auto", doc="mixed precision: auto = bf16 on a GPU that has it, else fp16; off on the CPU")
    channels_last: bool = option(True, doc="run convolutions in channels_last memory format")
    grad_clip_norm: float | None = option(None, gt=0.0, doc="clip the gradient norm to this; null: no clipping")
    label_smoothing: float = option(0.0, ge=0.0, lt=1.0, doc="label smoothing of the image cross-entropy")
    checkpoint_every_steps: int = option(
        500, ge=0, doc="also checkpoint every this many steps (always at epoch ends and at the end); 0: never between"
    )
    keep_checkpoints: int = option(3, ge=1, doc="newest checkpoints kept in RUN_DIR/checkpoints")
    eval_every_epochs: int = option(1, ge=0, doc="evaluate on data.val every this many epochs and at the end; 0: never")
    progress: bool = option(True, doc="show a progress bar with throughput and the share of time waiting for data")


@dataclass(frozen=True)
class ColorJitterConfig:
    """Kornia ``ColorJitter``: random brightness, contrast, saturation and hue."""

    p: float = option(0.8, ge=0.0, le=1.0, doc="probability per sample")
    brightness: float = option(0.2, ge=0.0, doc="brightness factor drawn from [1 - b, 1 + b]")
    contrast: float = option(0.2, ge=0.0, doc="contrast factor drawn from [1 - c, 1 + c]")
    saturation: float = option(0.2, ge=0.0, doc="saturation factor drawn from [1 - s, 1 + s]")
    hue: float = option(0.05, ge=0.0, le=0.5, doc="hue shift drawn from [-h, h] (fraction of a turn)")


@dataclass(frozen=True)
class GrayscaleConfig:
    """Kornia ``RandomGrayscale``."""

    p: float = option(0.1, ge=0.0, le=1.0, doc="probability per sample")


@dataclass(frozen=True)
class GaussianBlurConfig:
    """Kornia ``RandomGaussianBlur``."""

    p: float = option(0.2, ge=0.0, le=1.0, doc="probability per sample")
    kernel_size_px: int = option(3, ge=3, doc="odd kernel side in pixels")
    sigma: tuple[float, float] = option((0.1, 1.5), gt=0.0, doc="range of the blur's standard deviation in pixels")

    def __post_init__(self) -> None:
        if self.kernel_size_px % 2 == 0:
            raise ConfigError("kernel_size_px", f"value {self.kernel_size_px} must be odd")
        if self.sigma[0] > self.sigma[1]:
            raise ConfigError("sigma", f"range {list(self.sigma)} is empty: the first value must be <= the second")


@dataclass(frozen=True)
class RotationConfig:
    """Kornia ``RandomRotation`` (bilinear)."""

    p: float = option(0.3, ge=0.0, le=1.0, doc="probability per sample")
    degrees: float = option(10.0, gt=0.0, le=180.0, doc="rotation drawn from [-degrees, degrees]")


@dataclass(frozen=True)
class ErasingConfig:
    """Kornia ``RandomErasing``: a random rectangle set to black."""

    p: float = option(0.25, ge=0.0, le=1.0, doc="probability per sample")
    scale: tuple[float, float] = option((0.02, 0.2), gt=0.0, le=1.0, doc="range of the erased share of the area")
    ratio: tuple[float, float] = option((0.3, 3.3), gt=0.0, doc="range of the erased rectangle's aspect ratio")

    def __post_init__(self) -> None:
        for name in ("scale", "ratio"):
            lo, hi = getattr(self, name)
            if lo > hi:
                raise ConfigError(name, f"range {[lo, hi]} is empty: the first value must be <= the second")


@dataclass(frozen=True)
class HorizontalFlipConfig:
    """Kornia ``RandomHorizontalFlip`` (the image pipeline already flips; useful for clips)."""

    p: float = option(0.5, ge=0.0, le=1.0, doc="probability per sample")


@dataclass(frozen=True)
class AugmentConfig:
    """Augmentations run by Kornia on the training device after the loader, in the order of ``ops``.

    Every op keeps the uint8 contract: pixels go to float [0, 1] for Kornia and come back as
    uint8, so the model sees exactly what it sees when served. Clips get the same parameters on
    every frame of a clip.
    """

    ops: tuple[AugmentOp, ...] = option(("color_jitter",), doc="ops to apply, in order; [] for none")
    color_jitter: ColorJitterConfig = field(default_factory=ColorJitterConfig)
    grayscale: GrayscaleConfig = field(default_factory=GrayscaleConfig)
    gaussian_blur: GaussianBlurConfig = field(default_factory=GaussianBlurConfig)
    rotation: RotationConfig = field(default_factory=RotationConfig)
    erasing: ErasingConfig = field(default_factory=ErasingConfig)
    horizontal_flip: HorizontalFlipConfig = field(default_factory=HorizontalFlipConfig)

    def __post_init__(self) -> None:
        seen = set()
        for op in self.ops:
            if op in seen:
                raise ConfigError("ops", f"op {op!r} is listed twice; list each op once")
            seen.add(op)


@dataclass(frozen=True)
class TelemetryConfig:
    """Per-step timings: Prometheus on a metrics port, JSON lines in the run folder."""

    metrics_host: str = option("127.0.0.1", doc="address the /metrics endpoint binds (127.0.0.1: this machine only)")
    metrics_port: int = option(
        9400, ge=0, le=65535, doc="metrics port of local rank 0 (rank r: port + r); 0: pick free ports"
    )
    linger_seconds: float = option(0.0, ge=0.0, doc="keep serving /metrics this long after training ends")
    record_sample_ids: bool = option(False, doc="also write each step's sample ids to the step log (debugging)")


@dataclass(frozen=True)
class Config:
    """The whole gpufeed configuration."""

    device: DeviceName = option("auto", doc="auto uses the GPU when CUDA and DALI's GPU ops work")
    seed: int = option(0, ge=0, doc="seed for order, crops and weights")
    data: DataConfig = field(default_factory=DataConfig)
    image: ImagePipelineConfig = field(default_factory=ImagePipelineConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    node = tree
    parts = dotted.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(dotted, f"cannot set a key inside {part!r}, which is not a mapping")
        node = child
    node[parts[-1]] = value


def parse_config(data: Any, overrides: tuple[str, ...] | list[str] = (), base_dir: Path | None = None) -> Config:
    """Validate a mapping (plus ``key.path=value`` overrides) into a :class:`Config`.

    Args:
        data: The mapping, e.g. from ``yaml.safe_load``; ``None`` for all defaults.
        overrides: ``dotted.key=value`` strings; each value is parsed as YAML (``32``, ``true``,
            ``[1, 2]``).
        base_dir: Relative paths in the config are resolved against this folder (the config
            file's folder), so a config works from any working directory.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("", f"the config must be a mapping of sections, got {type(data).__name__}")
    tree = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(item, "an override must look like 'section.key=value'")
        _set_path(tree, key.strip(), yaml.safe_load(raw))
    cfg = from_mapping(Config, tree)
    return _resolve_paths(cfg, base_dir) if base_dir is not None else cfg


def _deep_copy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _deep_copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_deep_copy(v) for v in tree]
    return tree


def _resolve_paths(obj: Any, base: Path) -> Any:
    if not dataclasses.is_dataclass(obj):
        return obj
    changes = {}
    for fld in dataclasses.fields(obj):
        value = getattr(obj, fld.name)
        if isinstance(value, Path) and not value.is_absolute():
            changes[fld.name] = (base / value).resolve()
        elif dataclasses.is_dataclass(value):
            changes[fld.name] = _resolve_paths(value, base)
    return dataclasses.replace(obj, **changes) if changes else obj


def load_config(path: str | Path | None, overrides: tuple[str, ...] | list[str] = ()) -> Config:
    """Read a YAML config file with ``yaml.safe_load`` and validate it.

    Args:
        path: The YAML file, or ``None`` for defaults plus overrides.
        overrides: ``dotted.key=value`` strings applied on top of the file.

    Raises:
        ConfigError: For a missing or unparsable file and for every invalid key or value.
    """
    if path is None:
        return parse_config(None, overrides, base_dir=Path.cwd())
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError("", f"cannot read config file {path}: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError("", f"config file {path} is not valid YAML: {err}") from None
    return parse_config(data, overrides, base_dir=path.resolve().parent)


def save_config(cfg: Config, path: str | Path) -> Path:
    """Write the resolved config as YAML (every key, defaults included)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_mapping(cfg), sort_keys=False), encoding="utf-8")
    return path


def describe_config() -> list[tuple[str, str, str, str]]:
    """Rows (key, type, default, description) for every config key."""
    return describe(Config)
