"""Before the first step, every rank agrees on the data and on its share of it.

Each rank reads its own copy of the index (its own file listing, on its own node), so two ranks
can disagree without anyone noticing: a node whose copy of the dataset lacks a folder, a stale
mount, another ``seed`` or ``last_batch`` in one rank's config, a rank resumed from another
checkpoint. Sample ids would then mean different files on different ranks and the shares would
overlap or leave samples out, silently.

:func:`agree_on_data` has every rank write, through the job's store (as the device check does,
:func:`gpufeed.train._distributed.exchange_reports`), its view of each split: a digest of the index
(file names relative to their common folder, sizes, labels, clip slots), the number of samples,
the root, the sampler settings (seed, shuffle, batch size, last-batch policy), where the epoch
stands (epoch, and the segments of a resume on another world size), its shard, and its share of
the current epoch as a count and an order-independent digest of its real rows
(:mod:`gpufeed.pipelines._shares`). Every rank then checks that all views are equal and that the
shares cover the epoch exactly once: the shards are ``0 .. n - 1`` of ``n`` ranks, disjoint, and
together the epoch's samples (all of them under ``pad``, whose padding rows are marked and do not
count; under ``drop`` all but the tail that sits out). Otherwise every rank stops with the same
one-line :class:`~gpufeed.pipelines.DatasetError` naming each rank's view.
"""

from __future__ import annotations

import itertools
import socket
from typing import Any

from gpufeed.pipelines import DatasetError, coverage_problem, share_report
from gpufeed.train._distributed import (
    AGREE_TIMEOUT_S,
    DistInfo,
    ReportTimeout,
    all_gather_objects,
    exchange_reports,
    linger_for_readers,
)

__all__ = ["agree_on_data", "describe_view"]

# Each exchange gets its own keys: every rank makes the same calls in the same order, so each
# rank's own count names them alike (per rank, so ranks simulated in one process count apart).
_EXCHANGES: dict[int, itertools.count] = {}

_SPLIT_NAMES = {"train": "training", "val": "validation"}


def _settings(report: dict) -> str:
    s = report["settings"]
    return f"seed {s['seed']}, shuffle {'on' if s['shuffle'] else 'off'}, batch {s['batch_size']}, last_batch {s['last_batch']}"


def _position(report: dict) -> str:
    position = report["position"]
    resumed = " -> ".join(f"{seg['shards']}" for seg in position["history"])
    return f"epoch {position['epoch'] + 1}" + (f" resumed from {resumed} rank(s)" if resumed else "")


def describe_view(report: dict, *, settings: bool = False, position: bool = False) -> str:
    """One rank's view of a split in words: rank, host, index digest, samples, root (and what else differs)."""
    words = (
        f"rank {report['rank']} on {report['host']}: index {report['index'][:12]}, {report['samples']} samples, "
        f"{report['root']}"
    )
    if settings:
        words += f", {_settings(report)}"
    if position:
        words += f", {_position(report)}"
    return words


def _disagreement(split: str, reports: list[dict]) -> str | None:
    """The one-line error for ranks whose views of ``split`` differ, or ``None``."""
    index = {(r["index"], r["samples"]) for r in reports}
    settings = {repr(sorted(r["settings"].items())) for r in reports}
    position = {repr(r["position"]) for r in reports}
    if len(index) == len(settings) == len(position) == 1:
        return None
    views = "; ".join(describe_view(r, settings=len(settings) > 1, position=len(position) > 1) for r in reports)
    what = ", ".join(
        name for name, values in (("index", index), ("settings", settings), ("position", position)) if len(values) > 1
    )
    return (
        f"the ranks disagree on the {_SPLIT_NAMES.get(split, split)} data ({what}), so their shares would not cover "
        f"each epoch exactly once: {views}. Give every rank the same files (the same dataset at the same relative "
        "paths on every node), the same config and the same run folder"
    )


def _exchange(store, info: DistInfo, topic: str, report: dict, timeout_s: float) -> list[dict]:
    if store is None:  # a process group whose store cannot be reached: its own collective
        return all_gather_objects({"rank": info.rank, "host": socket.gethostname(), **report})
    try:
        return exchange_reports(store, info, topic, report, timeout_s)
    except ReportTimeout as err:
        raise DatasetError(
            f"{err}: a rank that stopped before comparing its data (its own error says why) leaves the others waiting"
        ) from err


def agree_on_data(store, info: DistInfo, loaders: dict[str, Any], timeout_s: float = AGREE_TIMEOUT_S) -> None:
    """Check that every rank reads the same data and that their shares cover each epoch once.

    Args:
        store: The job's store (:func:`gpufeed.train._distributed.job_store`); ``None`` falls back
            to the process group's ``all_gather_object``.
        info: This rank's place in the job.
        loaders: Split name (``"train"``, ``"val"``) -> that split's loader (``None``: no such split).
        timeout_s: Longest wait for the other ranks' reports.

    Raises:
        DatasetError: The views differ, the shares do not cover an epoch once, or ranks did not
            report within ``timeout_s``; every rank raises the same message, naming each rank's view.
    """
    if not info.enabled:
        return
    present = {split: loader for split, loader in loaders.items() if loader is not None}
    report = {"splits": {split: share_report(loader) for split, loader in present.items()}}
    topic = f"data/{next(_EXCHANGES.setdefault(info.rank, itertools.count()))}"
    everyone = _exchange(store, info, topic, report, timeout_s)
    problem = None
    for split, loader in present.items():
        reports = [{"rank": r["rank"], "host": r["host"], **r["splits"].get(split, {})} for r in everyone]
        missing = [r["rank"] for r in reports if "index" not in r]
        if missing:
            problem = f"rank(s) {', '.join(map(str, missing))} have no {_SPLIT_NAMES.get(split, split)} split"
            break
        problem = _disagreement(split, reports)
        if problem is None and (gap := coverage_problem(reports, loader)) is not None:
            views = "; ".join(f"{describe_view(r)}, shard {r['shard'][0]} of {r['shard'][1]}" for r in reports)
            problem = (
                f"the ranks' shares of the {_SPLIT_NAMES.get(split, split)} data do not cover epoch "
                f"{loader.epoch + 1} exactly once: {gap}: {views}"
            )
        if problem is not None:
            break
    if problem is None:
        return
    if store is not None:
        linger_for_readers(store, info, topic, timeout_s)
    raise DatasetError(problem)
