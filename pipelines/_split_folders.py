"""Split folders one level too high: ``DATA/train/`` and ``DATA/val/`` where a split was expected.

People point ``gpufeed check`` (or a config) at the folder holding their splits. As class folders,
``train/`` and ``val/`` would be read as two classes of one image dataset (and trained on as such);
as a video folder it holds no video. :func:`split_folders` recognises the layout, so ``check``
checks each split as its own dataset and warns (:func:`split_warning`), naming the split folders
and the keys to point at them; an image loader given such a folder as its path warns once a
process for it (:func:`warn_split_root`), as ``gpufeed train`` does for ``data.train.root``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from gpufeed.core import DataPath, ObjectPath, data_path
from gpufeed.pipelines._once import first_time

__all__ = ["SPLIT_NAMES", "split_folders", "split_warning", "warn_split_root"]

log = logging.getLogger("gpufeed")


# Folder names that mean a split, not a class (compared in lower case).
SPLIT_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing", "eval", "evaluation")


def _holds_data_below(folder: DataPath) -> bool:
    """True when ``folder`` holds a sub-folder or a non-image file: a split, not a class of images."""
    try:
        entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    except OSError:
        return False
    return any(p.is_dir() or p.suffix.lower() not in (".jpg", ".jpeg", ".png", ".txt") for p in entries)


def split_folders(path: str | Path | ObjectPath) -> list[DataPath]:
    """The split folders of ``path`` when every sub-folder is one (``train/``, ``val/`` ...), else ``[]``.

    A split folder holds class folders, videos or frame stores; a folder of images directly inside
    it is a class (of a dataset whose classes happen to be named so). Split folders beside list
    files of the same names (``train.txt``: ``gpufeed synth``'s ``images/``) are that layout's.
    """
    path = data_path(path)
    try:
        subs: list[DataPath] = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    if not subs or any(p.name.lower() not in SPLIT_NAMES for p in subs):
        return []
    if any((path / f"{p.name}.txt").is_file() for p in subs):
        return []
    return subs if all(_holds_data_below(p) for p in subs) else []


def split_warning(path: str | Path | ObjectPath, splits: list[DataPath]) -> str:
    """What ``check`` says about a folder of split folders: each is checked alone, and where to point the config."""
    names = ", ".join(f"{p.name}/" for p in splits)
    return (
        f"holds the split folders {names}: each is checked as its own dataset. Point the config at each split "
        "(data.train.root / data.val.root for images, video.train / video.val for videos), not at this folder: "
        "read as one image dataset, its split folders would be its classes"
    )


def warn_split_root(owner: str, path: str | Path | ObjectPath) -> bool:
    """Warn, once a process for ``path``, when a loader is given a folder of split folders; True if it is one.

    It trains (two classes, "train" and "val"), so it is a warning and not an error, as in
    ``gpufeed train`` (``gpufeed.train._data.warn_split_folders``); once, since a train and a val
    loader are often built over the same mistaken folder.
    """
    splits = split_folders(path)
    if splits and first_time("split folders", str(path)):
        names = ", ".join(f"{p.name}/" for p in splits)
        log.warning(
            "%s: %s holds the split folders %s, which train as its classes; give the loader each split folder "
            "itself (%s)",
            owner,
            path,
            names,
            ", ".join(str(p) for p in splits),
        )
    return bool(splits)
