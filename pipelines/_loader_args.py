"""The loaders' constructor arguments: shortcuts, config objects, the device and the shard.

Every loader can be built like torch's ``DataLoader``::

    loader = ImageLoader("photos/train", batch_size=32, size_px=224, train=True)

A path is indexed with the dataset's usual constructor, ``device`` defaults to ``"auto"`` and
every other setting to the config's default. The shortcuts (``batch_size``, ``shuffle``,
``num_threads``, ``size_px``, ``clip_length_frames``...) are the config fields of the same name;
the config objects (``loader_cfg``, ``image_cfg``, ``video_cfg``) are still accepted for full
control, and a shortcut given together with a config that holds another value is an error rather
than a silent choice of one of them. Each shortcut is checked exactly as the YAML config key is
(type, range, allowed values), and the error names the argument.

The shard: ``shard_id``/``num_shards`` when given, else the rank and world size of
``torch.distributed`` when it is initialised, else the whole dataset. A process launched as one
of several ranks (``WORLD_SIZE`` > 1) that has not initialised ``torch.distributed``, or a call
giving only one of the two, is an error: reading the whole dataset on every rank is never what
such a run wants.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufeed.config import LoaderConfig
from gpufeed.core import ConfigError, ObjectPath, data_path, from_mapping
from gpufeed.device import DeviceChoice, resolve_device

__all__ = ["LoaderArgs", "loader_args", "refuse_dataloader_arguments"]

DEVICE_NAMES = ("auto", "gpu", "cpu")
_LOADER_FIELDS = ("batch_size", "shuffle", "num_threads")


@dataclass(frozen=True)
class LoaderArgs:
    """What a loader's ``__init__`` works from, every argument resolved.

    Attributes:
        dataset: The indexed dataset (a path was indexed).
        media_cfg: The image or video config section, shortcuts applied.
        loader_cfg: :class:`gpufeed.config.LoaderConfig`, shortcuts applied.
        device: Where the pipeline runs.
        shard_id, num_shards: This process's shard.
    """

    dataset: Any
    media_cfg: Any
    loader_cfg: LoaderConfig
    device: DeviceChoice
    shard_id: int
    num_shards: int


def _with_shortcuts(owner: str, cls: type, cfg: Any, cfg_name: str, shortcuts: dict[str, Any]) -> Any:
    """``cfg`` (or the defaults of ``cls``) with the given shortcuts set, each checked as its config key."""
    given = {name: value for name, value in shortcuts.items() if value is not None}
    if cfg is None:
        cfg = cls()
    elif not isinstance(cfg, cls):
        raise TypeError(f"{owner}: {cfg_name} must be a gpufeed.config.{cls.__name__}, got {type(cfg).__name__}")
    if not given:
        return cfg
    try:
        checked = from_mapping(cls, given)
    except ConfigError as err:
        name = err.key_path.split(".")[0].split("[")[0]
        raise ValueError(f"{owner}: argument {name}={given[name]!r}: {err.message}") from None
    values = {name: getattr(checked, name) for name in given}
    default = cls()
    for name, value in values.items():
        held = getattr(cfg, name)
        # A config left at the default for this field does not disagree: only a chosen value does.
        if held != value and held != getattr(default, name):
            raise ValueError(
                f"{owner}: argument {name}={given[name]!r} disagrees with {cfg_name}.{name}={_written(held)!r}; "
                f"give one of them (or the same value in both)"
            )
    return dataclasses.replace(cfg, **values)


def resolve_shard(owner: str, shard_id: int | None, num_shards: int | None) -> tuple[int, int]:
    """(shard_id, num_shards): as given, else from ``torch.distributed``, else (0, 1); see the module docs."""
    for name, value in (("shard_id", shard_id), ("num_shards", num_shards)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{owner}: argument {name}={value!r}: expected an integer or None")
    if shard_id is not None and num_shards is not None:
        if not 0 <= shard_id < num_shards:
            raise ValueError(
                f"{owner}: argument shard_id={shard_id} is out of range for num_shards={num_shards}: "
                f"allowed 0..{num_shards - 1}"
            )
        return shard_id, num_shards
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        if shard_id is not None:  # and num_shards is None
            if not 0 <= shard_id < world:
                raise ValueError(
                    f"{owner}: argument shard_id={shard_id} is out of range for torch.distributed's world size "
                    f"{world}: allowed 0..{world - 1}"
                )
            return shard_id, world
        if num_shards is None:
            return rank, world
        if rank >= num_shards:
            raise ValueError(
                f"{owner}: argument num_shards={num_shards} leaves torch.distributed's rank {rank} without a "
                f"shard: give num_shards > {rank}, or shard_id too"
            )
        return rank, num_shards
    env_world = os.environ.get("WORLD_SIZE", "1")
    if shard_id is None and num_shards is None and env_world.strip() in ("", "0", "1"):
        return 0, 1
    asked = (
        f"only {'shard_id' if num_shards is None else 'num_shards'} was given"
        if shard_id is not None or num_shards is not None
        else f"this process is one of WORLD_SIZE={env_world} ranks"
    )
    raise ValueError(
        f"{owner}: {asked}, so the loader takes this rank's shard from torch.distributed, which is not "
        "initialised; call torch.distributed.init_process_group() before building the loader, or give both "
        "shard_id and num_shards (shard_id=0, num_shards=1: the whole dataset)"
    )


def resolve_loader_device(owner: str, device: Any) -> DeviceChoice:
    """A :class:`DeviceChoice` from ``"auto"``, ``"gpu"``, ``"cpu"``, torch's names or a choice already made.

    torch's spellings are read as what they mean, since a torch habit is no reason to fail: ``"cuda"``
    and ``torch.device("cuda")`` are ``gpu``; ``"cuda:1"`` / ``torch.device("cuda", 1)`` the GPU of
    index 1; ``torch.device("cpu")`` is ``cpu``.
    """
    if isinstance(device, DeviceChoice):
        return device
    if device is None:
        device = "auto"
    index = None
    named = _torch_device_name(device)
    if named is not None:
        device, index = named
    if not isinstance(device, str) or device not in DEVICE_NAMES:
        raise ValueError(
            f"{owner}: argument device={device!r} is not allowed; allowed: {', '.join(map(repr, DEVICE_NAMES))}, "
            "'cuda', 'cuda:N', a torch.device of those, or a gpufeed.device.DeviceChoice"
        )
    return resolve_device(device) if index is None else resolve_device(device, local_rank=index)


def _torch_device_name(device: Any) -> tuple[str, int | None] | None:
    """``(gpufeed's name, CUDA index or None)`` of torch's ``"cuda"``/``"cuda:N"``/``torch.device``; else None."""
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind != "cuda" or (index and not index.isdigit()):
            return None
        return "gpu", int(index) if index else None
    import torch

    if not isinstance(device, torch.device) or device.type not in ("cuda", "cpu"):
        return None
    return ("gpu", device.index) if device.type == "cuda" else ("cpu", None)


# torch DataLoader arguments people bring along, and what gpufeed does instead (one line each).
_DATALOADER_HABITS = {
    "num_workers": "DALI's threads decode here: give num_threads=N (0, the default: from the cores)",
    "drop_last": 'give loader_cfg=LoaderConfig(last_batch="drop") (or "partial", "pad"); evaluation keeps every sample',
    "pin_memory": "not needed: batches arrive on the loader's device (the GPU when there is one); leave it out",
}


def refuse_dataloader_arguments(owner: str, **given: Any) -> None:
    """Refuse torch ``DataLoader`` arguments a loader has no use for, naming gpufeed's equivalent.

    The loaders take them as keyword-only parameters defaulting to None, so that passing one fails
    in one line rather than as Python's bare "unexpected keyword argument".

    Raises:
        ValueError: One of them was given (anything but None).
    """
    for name, value in given.items():
        if value is not None:
            raise ValueError(
                f"{owner}: argument {name}={value!r} is torch DataLoader's, not gpufeed's: {_DATALOADER_HABITS[name]}"
            )


def loader_args(
    owner: str,
    dataset: Any,
    *,
    dataset_type: type,
    index,
    train: Any,
    device: Any,
    loader_cfg: Any,
    loader_shortcuts: dict[str, Any],
    media: tuple[type, Any, str] | None,
    media_shortcuts: dict[str, Any],
    shard_id: int | None,
    num_shards: int | None,
) -> LoaderArgs:
    """Resolve a loader's arguments (see the module docs).

    Args:
        owner: The loader's name, for error messages.
        dataset: A ``dataset_type`` or a path, which ``index(path)`` indexes.
        media: (config class, the config given or None, its argument name), e.g.
            ``(ImagePipelineConfig, image_cfg, "image_cfg")``.

    Raises:
        ValueError: An argument is out of range, not allowed, or disagrees with its config field.
        TypeError: ``dataset`` or a config object is of the wrong type.
    """
    if not isinstance(train, bool):
        raise ValueError(f"{owner}: argument train={train!r}: expected True (training) or False (evaluation)")
    if loader_shortcuts.get("shuffle") and not train:
        raise ValueError(
            f"{owner}: argument shuffle=True applies to training only; train=False reads every sample in order"
        )
    size = media_shortcuts.get("size_px")
    if isinstance(size, str):  # the config's text form ("352x224") is for command-line flags only
        raise ValueError(f"{owner}: argument size_px={size!r}: expected an integer or (width, height), not text")
    loader = _with_shortcuts(owner, LoaderConfig, loader_cfg, "loader_cfg", loader_shortcuts)
    media_cfg = _with_shortcuts(owner, media[0], media[1], media[2], media_shortcuts) if media else None
    shard = resolve_shard(owner, shard_id, num_shards)
    if isinstance(dataset, (str, Path, ObjectPath)):
        dataset = index(data_path(dataset))
    elif not isinstance(dataset, dataset_type):
        raise TypeError(
            f"{owner}: dataset must be a {dataset_type.__name__} or the path of a folder or list file, "
            f"got {type(dataset).__name__}"
        )
    return LoaderArgs(dataset, media_cfg, loader, resolve_loader_device(owner, device), *shard)


def _written(value):
    """``value`` as a config file writes it: a :class:`~gpufeed.config.SizePx` as ``224`` or ``(352, 224)``."""
    return value.config_value() if hasattr(value, "config_value") else value
