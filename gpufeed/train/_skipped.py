"""What a run left out of its data, and how it says so.

The loaders leave a file out when ``loader.quarantine_file`` lists it, or, with
``loader.on_bad_sample: skip``, when it cannot be used (found by the index before reading, or by a
failed decode while reading). Each loader keeps ``skipped`` (sample or video id -> reason) and
``quarantined`` (the ids the list removed). At the end of a run this module gathers them into

* ``summary.json``'s ``skipped``: per split (``train``, ``val``), ``count``, ``quarantined`` and
  ``files`` (path -> reason), the union over ranks;
* one line under the summary table, and a warning in the log when anything was skipped.

``gpufeed_train_skipped_samples_total`` counts the same training files as they are found (a
skipped video counts once, like an image).
"""

from __future__ import annotations

import logging

__all__ = ["empty_epoch", "merge_skipped", "report_skipped", "skipped_files", "skipped_line"]

log = logging.getLogger("gpufeed")

SPLITS = ("train", "val")


def _name(paths, sample_id: int) -> str:
    """The file of a sample id (its number, for a loader without a dataset index)."""
    return paths[sample_id] if sample_id < len(paths) else f"sample {sample_id}"


def _loader_skipped(loader) -> dict:
    if loader is None:
        return {"files": {}, "quarantined": []}
    dataset = getattr(loader, "dataset", None)
    paths = getattr(dataset, "paths", None) or ()
    skipped = getattr(loader, "skipped", {})
    return {
        "files": {_name(paths, i): why for i, why in sorted(skipped.items())},
        "quarantined": sorted(_name(paths, i) for i in getattr(loader, "quarantined", {})),
    }


def _first_few(files: dict[str, str], shown: int = 3) -> tuple[str, int]:
    """``"path: reason; ..."`` of the first ``shown`` skipped files, and how many are left unnamed."""
    return "; ".join(f"{path}: {why}" for path, why in list(files.items())[:shown]), max(0, len(files) - shown)


def skipped_files(data) -> dict:
    """This rank's skipped files per split: ``{split: {"files": {path: reason}, "quarantined": [path]}}``."""
    return {"train": _loader_skipped(data.train), "val": _loader_skipped(data.val)}


def merge_skipped(per_rank: list[dict]) -> dict:
    """Union of :func:`skipped_files` over ranks: ``{split: {"count", "quarantined", "files"}}``."""
    merged = {}
    for split in SPLITS:
        files: dict[str, str] = {}
        quarantined: set[str] = set()
        for rank in per_rank:
            files.update(rank[split]["files"])
            quarantined.update(rank[split]["quarantined"])
        merged[split] = {"count": len(files), "quarantined": len(quarantined), "files": dict(sorted(files.items()))}
    return merged


def skipped_line(skipped: dict, clips: bool) -> str:
    """One line for under the summary table: how many files each split left out, and why."""
    unit = "video(s)" if clips else "sample(s)"
    parts = []
    for split, name in (("train", "training"), ("val", "evaluation")):
        entry = skipped[split]
        if entry["count"]:
            unusable = entry["count"] - entry["quarantined"]
            why = [f"{entry['quarantined']} quarantined"] if entry["quarantined"] else []
            why += [f"{unusable} unusable, loader.on_bad_sample: skip"] if unusable else []
            parts.append(f"{entry['count']} {name} {unit} ({'; '.join(why)})")
    if not parts:
        return f"skipped: 0 {'videos' if clips else 'samples'}"
    return "skipped: " + ", ".join(parts) + "; each file and reason is in summary.json"


def report_skipped(skipped: dict, clips: bool) -> None:
    """Log a warning naming a few of the skipped files when anything was left out."""
    for split in SPLITS:
        files = skipped[split]["files"]
        if not files:
            continue
        shown, left = _first_few(files)
        more = f" (and {left} more)" if left else ""
        log.warning(
            "skipped %d %s %s that cannot be used or are quarantined: %s%s",
            len(files),
            "training" if split == "train" else "evaluation",
            "video(s)" if clips else "sample(s)",
            shown,
            more,
        )


def empty_epoch(loader, epoch: int) -> str:
    """The line that stops a run whose training loader has no batch left for ``epoch``.

    Files skipped as bad while reading leave every later epoch too: with all of them gone a run
    went on through its epochs without a step, and ended as if it had finished.
    """
    skipped = _loader_skipped(loader)["files"]
    shown, left = _first_few(skipped)
    more = f" and {left} more" if left else ""
    return (
        f"epoch {epoch + 1} has no training batch: {len(skipped)} sample(s) were skipped ({shown}{more}); "
        "run 'gpufeed check' on data.train, fix or remove the files, and train again"
    )
