"""gpufeed's configuration: YAML read with a bounded safe loader (:mod:`gpufeed.core._yaml`) into frozen dataclasses.

One :class:`Config` holds every section. Each section documents its keys; ``gpufeed config
--describe`` prints them all with types and defaults. Unknown keys, wrong types and values out of
range fail with :class:`ConfigError` naming the key path, the value and what is allowed.

Example::

    cfg = load_config("train.yaml", overrides=["loader.batch_size=32"])
    save_config(cfg, run_dir / "config.yaml")   # the resolved config, saved with the outputs
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

from gpufeed.config._data import (
    DataConfig,
    DatasetConfig,
    ImagePipelineConfig,
    LoaderConfig,
    VideoConfig,
    VideoDecoder,
)
from gpufeed.config._serve import ServeConfig
from gpufeed.config._storage import StorageConfig
from gpufeed.config._train import (
    AUGMENT_OPS,
    LOADER_AUGMENT_OPS,
    AugmentConfig,
    ModelConfig,
    TelemetryConfig,
    TrainConfig,
)
from gpufeed.core import (
    ConfigError,
    SizePx,
    YamlError,
    describe,
    from_mapping,
    option,
    parse_size_px,
    parse_yaml,
    quoted,
    read_yaml,
    to_mapping,
)

__all__ = [
    "AUGMENT_OPS",
    "LOADER_AUGMENT_OPS",
    "AugmentConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "DatasetConfig",
    "ImagePipelineConfig",
    "LoaderConfig",
    "ModelConfig",
    "ServeConfig",
    "SizePx",
    "StorageConfig",
    "TelemetryConfig",
    "TrainConfig",
    "VideoConfig",
    "VideoDecoder",
    "describe_config",
    "load_config",
    "parse_config",
    "parse_size_px",
    "save_config",
]

DeviceName = Literal["auto", "gpu", "cpu"]


def _device_name(value: Any, key: str) -> str:
    """``device``: one of :data:`DeviceName`, or ``cuda``, torch's name for the GPU, read as ``gpu``.

    ``cuda:N`` is refused with what picks a GPU here: each process takes the one of its
    ``LOCAL_RANK`` among ``CUDA_VISIBLE_DEVICES``, so one config serves every rank.
    """
    word = value.strip().lower() if isinstance(value, str) else value
    if word == "cuda":
        return "gpu"
    if isinstance(word, str) and word.startswith("cuda:"):
        raise ConfigError(
            key,
            f"value {quoted(value)} is not allowed: write gpu, and CUDA_VISIBLE_DEVICES={word[5:]} to choose that GPU "
            "(each process takes its LOCAL_RANK's)",
        )
    if word not in get_args(DeviceName):
        raise ConfigError(key, f"value {quoted(value)} is not allowed; allowed: auto, gpu (or cuda), cpu")
    return word


@dataclass(frozen=True)
class Config:
    """The whole gpufeed configuration."""

    device: DeviceName = option(
        "auto", convert=_device_name, doc="auto uses the GPU when CUDA and DALI's GPU ops work; cuda is read as gpu"
    )
    seed: int = option(0, ge=0, le=2**63 - 1, doc="seed for order, crops and weights")
    data: DataConfig = field(default_factory=DataConfig)
    image: ImagePipelineConfig = field(default_factory=ImagePipelineConfig)
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)


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
            ``[1, 2]``), within the same budgets as a config file.
        base_dir: Relative paths in the config are resolved against this folder (the config
            file's folder), so a config works from any working directory; those the overrides set,
            against the working directory, as the shell they were typed in would. ``~`` and
            ``$VAR`` are expanded first.
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
        try:
            value = parse_yaml(raw, f"the value of override {key.strip()}")
        except YamlError as err:
            raise ConfigError(key.strip(), str(err)) from None
        _set_path(tree, key.strip(), value)
    try:
        cfg = from_mapping(Config, tree)
    except ConfigError as err:
        raise _with_elsewhere(err) from None
    if base_dir is None:
        return cfg
    # A path typed on the command line is the shell's: relative to where the command runs.
    typed = frozenset(item.partition("=")[0].strip() for item in overrides)
    return _resolve_paths(cfg, base_dir, typed)


def _with_elsewhere(err: ConfigError) -> ConfigError:
    """An unknown key that another section has (``train.batch_size``) names that one too."""
    if not err.message.startswith("unknown key"):
        return err
    leaf = err.key_path.rpartition(".")[2]
    there = [key for key, *_ in describe_config() if key.rpartition(".")[2] == leaf and key != err.key_path]
    return ConfigError(err.key_path, f"{err.message}; did you mean {' or '.join(there)}?") if there else err


def _deep_copy(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _deep_copy(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_deep_copy(v) for v in tree]
    return tree


def _resolve_paths(obj: Any, base: Path, typed: frozenset[str] = frozenset(), prefix: str = "") -> Any:
    """``obj`` with every path absolute: ``~`` and ``$VAR`` expanded, a relative one resolved against
    ``base`` (the config file's folder), or the working directory for a key under one of ``typed``
    (the ``--set`` keys)."""
    if not dataclasses.is_dataclass(obj) or isinstance(obj, type):
        return obj
    changes: dict[str, Any] = {}
    for fld in dataclasses.fields(obj):
        key = f"{prefix}{fld.name}"
        here = Path.cwd() if any(key == t or key.startswith(f"{t}.") for t in typed) else base
        value = getattr(obj, fld.name)
        if isinstance(value, Path):
            changes[fld.name] = _absolute(value, here)
        elif isinstance(value, tuple) and any(isinstance(v, Path) for v in value):  # data.allowed_roots
            changes[fld.name] = tuple(_absolute(v, here) if isinstance(v, Path) else v for v in value)
        elif dataclasses.is_dataclass(value):
            changes[fld.name] = _resolve_paths(value, base, typed, f"{key}.")
    return dataclasses.replace(obj, **changes) if changes else obj


def _absolute(path: Path, base: Path) -> Path:
    # ~ and $HOME as a shell would expand them: YAML does not, and they became folders named '~'.
    path = Path(os.path.expandvars(os.path.expanduser(path)))
    return path if path.is_absolute() else (base / path).resolve()


def load_config(path: str | Path | None, overrides: tuple[str, ...] | list[str] = ()) -> Config:
    """Read a YAML config file with the bounded safe loader (:func:`gpufeed.core._yaml.read_yaml`) and validate it.

    Args:
        path: The YAML file, or ``None`` for defaults plus overrides.
        overrides: ``dotted.key=value`` strings applied on top of the file.

    Raises:
        ConfigError: For a missing, unparsable or oversized file (or one past the alias budget) and
            for every invalid key or value.
    """
    if path is None:
        return parse_config(None, overrides, base_dir=Path.cwd())
    path = Path(path)
    try:
        data = read_yaml(path, "config file")
    except YamlError as err:
        raise ConfigError("", str(err)) from None
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
