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
from typing import Any, Literal

import yaml

from gpufeed._schema import ConfigError, describe, from_mapping, option, to_mapping

__all__ = [
    "Config",
    "ConfigError",
    "DataConfig",
    "DatasetConfig",
    "ImagePipelineConfig",
    "LoaderConfig",
    "ServeConfig",
    "describe_config",
    "load_config",
    "parse_config",
    "save_config",
]

DeviceName = Literal["auto", "gpu", "cpu"]
LastBatch = Literal["drop", "partial", "pad"]
OnBadSample = Literal["error", "skip"]
ExecutionProvider = Literal["auto", "cpu", "cuda", "tensorrt"]


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
class ServeConfig:
    """The inference server (``gpufeed serve``): address, batching, limits, execution provider.

    Requests are validated, then queued; a model's batcher runs a batch when ``batch_size`` images
    (the model card's fixed size) are waiting or the oldest has waited ``max_delay_ms``.
    """

    host: str = option("127.0.0.1", doc="address to bind; loopback by default, 0.0.0.0 to expose")
    port: int = option(8000, ge=0, le=65535, doc="TCP port; 0 picks a free one")
    max_delay_ms: float = option(5.0, ge=0.0, le=10_000.0, doc="longest wait for a batch to fill")
    queue_capacity: int = option(256, ge=1, doc="images waiting per model before 503 + Retry-After")
    request_timeout_seconds: float = option(30.0, gt=0.0, doc="a request not answered by then gets 504")
    retry_after_seconds: int = option(1, ge=0, doc="Retry-After sent with 503 queue_full")
    max_body_bytes: int = option(16 * 1024 * 1024, ge=1024, doc="larger request bodies get 413")
    max_image_pixels: int = option(40_000_000, ge=1, doc="width x height above this is refused (decompression bombs)")
    max_images_per_request: int = option(64, ge=1, doc="images or tensor rows in one request")
    top_k: int = option(5, ge=1, doc="labels returned by the REST endpoint unless ?top_k= says otherwise")
    execution_provider: ExecutionProvider = option(
        "auto", doc="onnxruntime provider: auto (CUDA on a GPU, else CPU), cpu, cuda, tensorrt"
    )
    tensorrt_cache_dir: Path | None = option(None, doc="where the TensorRT provider caches engines; none: no cache")
    decode_threads: int = option(0, ge=0, doc="DALI CPU threads per model; 0 means one per core")
    inference_threads: int = option(0, ge=0, doc="onnxruntime intra-op threads; 0 means onnxruntime's default")
    warmup_batches: int = option(2, ge=1, doc="full batches run through decode and inference before ready")
    workers_per_model: int = option(
        0, ge=0, le=8, doc="batches in flight per model (2 overlaps decode with inference); 0: 2 on a GPU, 1 on CPU"
    )


@dataclass(frozen=True)
class Config:
    """The whole gpufeed configuration."""

    device: DeviceName = option("auto", doc="auto uses the GPU when CUDA and DALI's GPU ops work")
    seed: int = option(0, ge=0, doc="seed for order, crops and weights")
    data: DataConfig = field(default_factory=DataConfig)
    image: ImagePipelineConfig = field(default_factory=ImagePipelineConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)


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
