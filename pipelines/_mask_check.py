"""``gpufeed check --num-classes K``: every mask holding a class id a K-class model cannot train on.

A segmentation run stops at the first batch holding an id at or above ``model.num_classes`` (that
is not ``data.mask_ignore_id``), which may be hours in. Given the class count, ``check`` reads
every usable mask of each paired split (``rgb/`` with ``mask/``) and names each one holding such an
id, with the ids, before training starts. Masks the index or the strict decode already refuse are
left to those findings.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gpufeed.core import DataPath, ObjectPath, data_path, is_object_url, read_bytes
from gpufeed.pipelines._check import CheckReport, Finding
from gpufeed.pipelines._epochs import default_num_threads
from gpufeed.pipelines._image_facts import DEFAULT_MAX_IMAGE_PIXELS
from gpufeed.pipelines._pairs import PairedDataset, is_paired_root

__all__ = ["check_mask_ids", "mask_ids", "mask_roots"]

_LISTED_IDS = 8  # ids quoted per mask; the rest are counted


def mask_roots(path: str | Path | ObjectPath) -> list[DataPath]:
    """The paired splits with masks at ``path``: itself, its sub-folders, or those of its ``dense/``."""
    path = data_path(path)
    if not path.is_dir():
        return []
    candidates: list[DataPath] = [path, *sorted(p for p in path.iterdir() if p.is_dir())]
    if (path / "dense").is_dir():  # a gpufeed synth folder
        candidates += sorted(p for p in (path / "dense").iterdir() if p.is_dir())
    return [p for p in candidates if is_paired_root(p) and (p / "mask").is_dir()]


def mask_ids(path: str | Path) -> np.ndarray | None:
    """The ids present in a single-channel 8-bit mask PNG, ascending; ``None`` when it cannot be read."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(read_bytes(path)) if is_object_url(path) else path) as image:
            if image.mode not in ("L", "P"):
                return None  # not a usable mask: the index names it
            pixels = np.asarray(image)
    except Exception:  # Pillow raises several types for damaged data; the strict decode names it
        return None
    return np.flatnonzero(np.bincount(pixels.ravel(), minlength=256))


def check_mask_ids(
    path: str | Path | ObjectPath,
    num_classes: int,
    *,
    ignore_id: int = 255,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    progress: bool = True,
) -> CheckReport:
    """Name every mask under ``path`` (see :func:`mask_roots`) holding an id outside ``[0, num_classes)``.

    Args:
        num_classes: The model's class count (``model.num_classes``).
        ignore_id: The id excluded from losses (``data.mask_ignore_id``): allowed anywhere.
        max_pixels: Masks whose header declares more pixels are not read (the index refuses them).

    Returns:
        One ``pair`` finding per such mask, on its RGB's path (the path quarantine lists), naming
        the mask, its ids and the allowed range.
    """
    from tqdm import tqdm

    if num_classes < 1:
        raise ValueError(f"num_classes {num_classes} must be >= 1")
    report = CheckReport()
    allowed = f"the {num_classes} classes 0..{num_classes - 1} (ignore id {ignore_id})"
    for root in mask_roots(path):
        dataset = PairedDataset.from_root(root, max_pixels=max_pixels)
        ids = [int(i) for i in dataset.usable_ids]
        masks = [dataset.maps["mask"][i] for i in ids]
        part = CheckReport(sources=[f"mask ids of {dataset.source}"])  # files the pair check counts already
        with ThreadPoolExecutor(max_workers=default_num_threads()) as pool:
            found = pool.map(mask_ids, masks, chunksize=16)
            bar = tqdm(found, total=len(masks), desc="mask ids", unit="mask", disable=not progress, leave=False)
            for i, mask, present in zip(ids, masks, bar, strict=True):
                if present is None:
                    continue
                bad = [int(v) for v in present if v >= num_classes and v != ignore_id]
                if bad:
                    shown = ", ".join(map(str, bad[:_LISTED_IDS])) + (" ..." if len(bad) > _LISTED_IDS else "")
                    why = f"{mask} (paired with it): mask id(s) {shown} outside {allowed}"
                    part.findings.append(Finding(dataset.paths[i], why, "pair"))
        report.merge(part)
    return report
