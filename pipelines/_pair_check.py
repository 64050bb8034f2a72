"""``gpufeed check`` for paired (dense-target) datasets: every pair that would stop or poison training.

Each finding names the RGB and the map: a missing partner, a map of another size than its RGB,
a map that is not a single-channel PNG of an allowed bit depth (depth 8/16-bit, mask 8-bit),
mixed depth bit depths, an unreadable, damaged or undecodable file (every RGB and map whose
structure is whole is strictly decoded), and maps with no RGB partner. Registered in
:data:`gpufeed.pipelines._check.CHECKERS`: ``gpufeed check ROOT`` on a split root (``rgb/`` with
``depth/`` and/or ``mask/``) or on a folder of such splits (``dense/`` of ``gpufeed synth``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from gpufeed.core import progress_bar
from gpufeed.pipelines._check import CHECKERS, CheckReport, Finding
from gpufeed.pipelines._epochs import default_num_threads
from gpufeed.pipelines._image_verify import decode_problem
from gpufeed.pipelines._pairs import PairedDataset, is_paired_root

__all__ = ["check_pairs", "holds_pairs"]


def _splits(path: Path) -> list[Path]:
    if is_paired_root(path):
        return [path]
    return sorted(p for p in path.iterdir() if p.is_dir() and is_paired_root(p)) if path.is_dir() else []


def holds_pairs(path: Path) -> bool:
    """True for a paired split root, or a folder whose sub-folders include one."""
    return bool(_splits(path))


def check_pairs(
    path: Path, progress: bool = True, scale_maps: bool = False, clip_span_frames: int | None = None
) -> CheckReport:
    """Check a paired split root, or every paired split directly under ``path`` (``clip_span_frames``: for videos, unused)."""

    report = CheckReport()
    for root in _splits(path):
        dataset = PairedDataset.from_root(root, scale_maps=scale_maps)
        part = CheckReport(sources=[dataset.source], checked=len(dataset) * (1 + len(dataset.kinds)))
        part.findings += [Finding(dataset.paths[i], why, "pair") for i, why in dataset.problems.items()]
        part.findings += [Finding(line.split(": ", 1)[0], line.split(": ", 1)[1], "pair") for line in dataset.orphans]
        ids = dataset.usable_ids
        todo = [(int(i), dataset.paths[i]) for i in ids]
        todo += [(int(i), dataset.maps[kind][i]) for kind in dataset.kinds for i in ids]
        with ThreadPoolExecutor(max_workers=default_num_threads()) as pool:
            results = pool.map(partial(decode_problem, max_pixels=dataset.max_pixels), [file for _, file in todo])
            bar = progress_bar(
                results, total=len(todo), desc="decoding", unit="file", disable=not progress, leave=False
            )
            for (i, file), why in zip(todo, bar, strict=True):
                if why:
                    rgb = dataset.paths[i]
                    part.findings.append(
                        Finding(rgb, why if file == rgb else f"{file} (paired with it): {why}", "pair")
                    )
        report.merge(part)
    return report


CHECKERS.append((holds_pairs, check_pairs))
