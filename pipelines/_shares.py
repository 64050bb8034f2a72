"""Ranks' shares of an epoch: resuming on another world size, and proving the shares cover it.

Every loader kind plans its epochs through :mod:`gpufeed.pipelines._sampler`, so both live here
once, for images, clips (clip slots), dense pairs, frame stores and DeepEthogram projects alike.

**Where an epoch stands.** A loader's :meth:`~gpufeed.pipelines._epochs.EpochLoader.state_dict`
names its shard (``shard``: ``[shard_id, num_shards]``), how many entries of that shard's share
it has consumed (``consumed``, counted before exclusions) and the segments earlier world sizes
read of the epoch (``history``). Every rank's state together (a checkpoint holds them all) says
exactly which samples of the epoch's global order have been read.

**Resuming on another world size** (:func:`resharded_state`), or at another batch size: the segment the old ranks read is
appended to the epoch's history, and the new ranks split what remains of the global order as
the sampler documents; files any old rank found bad are left out on every new rank.

**The coverage check** (:func:`share_report`, :func:`coverage_problem`): each rank describes its
view of the data (a digest of the index: file names relative to their common folder, the image
sizes, labels and clip slots that sample ids stand for; the sampler settings; where the epoch
stands) and its share of the current segment (how many rows it reads as real samples, and an
order-independent digest of them). The views must be equal, the shards must be ``0 .. n - 1`` of
``n`` ranks, and the shares' rows must add up to the segment's samples: all of them under
``partial`` and ``pad`` (padding rows are marked invalid and do not count), the first ``n *
((R // n) // batch) * batch`` of the ``R`` remaining under ``drop`` (the rest sit out). Files
found bad while reading are left out later by the rank that finds them; the check is on the plan.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

import numpy as np

from gpufeed.pipelines._sampler import Segment, consumed_in_share, epoch_order, plan_epoch, remaining_order

__all__ = ["coverage_problem", "index_digest", "own_state", "position_state", "resharded_state", "share_report"]


def _sampler_args(loader, epoch: int) -> dict:
    return {
        "epoch": epoch,
        "seed": loader.seed,
        "shuffle": loader.train and loader.cfg.shuffle,
        "batch_size": loader.batch_size,
    }


def position_state(loader, epoch: int, batch: int) -> dict:
    """The ``shard``, ``consumed`` and ``history`` entries of ``loader``'s state at ``(epoch, batch)``."""
    history = loader.history_of(epoch)
    consumed = consumed_in_share(
        loader._plan_ids(),
        **_sampler_args(loader, epoch),
        shard_id=loader.shard_id,
        num_shards=loader.num_shards,
        batch=batch,
        history=history,
        excluded=loader._excluded_plan_ids(),
    )
    return {
        "shard": [loader.shard_id, loader.num_shards],
        "consumed": consumed,
        "history": [segment.to_dict() for segment in history],
    }


def _positions(states: Sequence[dict]) -> str:
    return ", ".join(f"rank {k}: epoch {s.get('epoch')} batch {s.get('batch')}" for k, s in enumerate(states))


def resharded_state(loader, states: Sequence[dict]) -> dict:
    """This loader's state from every rank's, in rank order, saved on any number of ranks.

    The same number of ranks gives this rank's own state back unchanged (an exact resume).

    Raises:
        ValueError: The states do not belong to one job at one position (ranks at different
            epochs or batches, shards out of order, other seeds).
    """
    states = [dict(s) for s in states]
    n = len(states)
    if n == 0:
        raise ValueError("no loader states to resume from: expected one per rank of the run that saved them")
    for k, state in enumerate(states):
        shard = state.get("shard", [k, n])
        if list(shard) != [k, n]:
            raise ValueError(
                f"loader state {k} of {n} belongs to shard {shard[0]} of {shard[1]}: give every rank's state in rank order"
            )
        if state.get("seed", loader.seed) != loader.seed:
            raise ValueError(
                f"loader state {k} was saved with seed {state['seed']}, this loader uses seed {loader.seed}"
            )
    if n == loader.num_shards and all(_same_batch_size(loader, s) for s in states):
        return states[loader.shard_id]
    epoch, batch = int(states[0]["epoch"]), int(states[0]["batch"])
    if any((int(s["epoch"]), int(s["batch"])) != (epoch, batch) for s in states):
        raise ValueError(
            f"the {n} ranks' loader states stand at different places ({_positions(states)}); they cannot be resharded"
        )
    history = [Segment.from_dict(d) for d in states[0].get("history", [])]
    if any([Segment.from_dict(d) for d in s.get("history", [])] != history for s in states):
        raise ValueError("the ranks' loader states hold different histories of their epoch; they cannot be resharded")
    failures = sorted({int(i) for s in states for i in s.get("read_failures", [])})
    merged = {"epoch": epoch, "batch": batch, "seed": loader.seed, "read_failures": failures}
    base = history[-1].batch if history else 0
    if batch == base and not history:  # an epoch boundary: nothing of the epoch was read yet
        return {**merged, "shard": [loader.shard_id, loader.num_shards], "consumed": 0, "history": []}
    consumed = []
    for k, state in enumerate(states):
        if "consumed" not in state:
            if state.get("read_failures"):
                raise ValueError(
                    f"loader state {k} comes from an older gpufeed that did not record how far its share got, and its "
                    f"rank skipped files; resume it on {n} rank(s)"
                )
            # Without exclusions, rows consumed map one to one onto the share's entries.
            state["consumed"] = consumed_in_share(
                loader._plan_ids(),
                **_sampler_args(loader, epoch),
                shard_id=k,
                num_shards=n,
                batch=batch,
                history=history,
            )
        consumed.append(int(state["consumed"]))
    history.append(Segment(n, tuple(consumed), batch))
    return {
        **merged,
        "shard": [loader.shard_id, loader.num_shards],
        "consumed": 0,
        "history": [s.to_dict() for s in history],
    }


def _same_batch_size(loader, state: dict) -> bool:
    return int(state.get("batch_size", loader.batch_size)) == loader.batch_size  # older states: assumed the same


def own_state(loader, state: dict | Sequence[dict]) -> dict:
    """This loader's state, from its own (checked to be its shard's) or from every rank's.

    Raises:
        ValueError: Another seed, another shard's state alone, or rank states that do not stand at one place.
    """
    if isinstance(state, dict) and not _same_batch_size(loader, state):
        if loader.num_shards != 1:
            raise ValueError(
                f"loader state saved at batch size {state['batch_size']}, this loader reads {loader.batch_size}: "
                "give every rank's state, in rank order, to go on at another batch size"
            )
        state = [state]  # one rank: the samples it read are a segment of the epoch, as on a reshard
    if isinstance(state, (list, tuple)):
        state = resharded_state(loader, state)
    if not isinstance(state, dict):
        raise TypeError(f"a loader state is a dict (or a list of every rank's), got {type(state).__name__}")
    missing = [key for key in ("epoch", "batch") if key not in state]
    if missing:
        raise ValueError(
            f"a loader state without {' and '.join(missing)} (its keys: {', '.join(sorted(map(str, state))[:8])}): "
            "give it what loader.state_dict() returned, or every rank's in rank order"
        )
    if state.get("seed", loader.seed) != loader.seed:
        raise ValueError(f"loader state was saved with seed {state['seed']}, this loader uses seed {loader.seed}")
    shard = state.get("shard", [loader.shard_id, loader.num_shards])
    if list(shard) != [loader.shard_id, loader.num_shards]:
        raise ValueError(
            f"loader state of shard {shard[0]} of {shard[1]} given to shard {loader.shard_id} of {loader.num_shards}: "
            "give every rank's state, in rank order, to resume on another number of ranks"
        )
    return state


# -- the coverage check ------------------------------------------------------------------------------
def _mix64(ids: np.ndarray) -> np.ndarray:
    """splitmix64 of each id: sums of these tell multisets of ids apart (a collision is ~2^-64)."""
    z = np.asarray(ids, dtype=np.int64).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def multiset_digest(ids: np.ndarray) -> int:
    """An order-independent digest of a multiset of ids, additive: digest(a + b) = digest(a) + digest(b) mod 2^64."""
    return int(_mix64(ids).sum(dtype=np.uint64))


def _update(digest, value) -> None:
    if isinstance(value, np.ndarray):
        digest.update(str(value.dtype).encode() + str(value.shape).encode())
        digest.update(np.ascontiguousarray(value).tobytes())
    else:
        digest.update(repr(value).encode())
    digest.update(b"\0")


def index_digest(loader) -> str:
    """SHA-256 of what ``loader``'s sample ids stand for (cheap: no file is read).

    File names count relative to their common folder, so ranks that mount the data at different
    places agree; with them the image sizes and labels, frame counts and label tracks of videos,
    and the plan units (usable sample ids, or clip slots) the sampler orders.
    """
    digest = hashlib.sha256()
    data = loader.dataset
    paths = [str(p) for p in data.paths]
    # The common folder of the least and greatest names is every name's (those between share their
    # prefix); os.path.commonpath over all of them takes seconds on a million names.
    first, last = (min(paths), max(paths)) if paths else ("", "")
    try:
        common = os.path.commonpath([first, last]) if first != last else os.path.dirname(first)
    except ValueError:  # absolute and relative names mixed: compare them whole
        common = ""
    root = common.rstrip(os.sep) + os.sep if common else ""

    def relative(names) -> bytes:  # one update for all names: a million files hash in about a second
        return "\0".join(n[len(root) :] if n.startswith(root) else n for n in map(str, names)).encode()

    digest.update(relative(paths))
    for name in ("labels", "sizes", "classes", "behaviours", "maps"):
        value = getattr(data, name, None)
        if isinstance(value, dict):  # a dense pair's map files, by kind
            for kind in sorted(value):
                digest.update(kind.encode() + b"\0" + relative(value[kind]))
        elif isinstance(value, (tuple, list)):
            for item in value:
                _update(digest, item)
        elif value is not None:
            _update(digest, value)
    for info in getattr(data, "infos", ()):
        _update(digest, (info.num_frames, info.width, info.height))
    table = getattr(loader, "table", None)
    if table is not None:  # clip slots: what a clip loader's plan units stand for
        _update(digest, table.slot_video)
        _update(digest, table.slot_start)
    _update(digest, np.asarray(loader._plan_ids(), dtype=np.int64))
    return digest.hexdigest()


def _segment_order(loader) -> tuple[np.ndarray, int]:
    """The current epoch's remaining order and the batch its segment starts at."""
    history = loader.history_of(loader.epoch)
    order = epoch_order(
        loader._plan_ids(), epoch=loader.epoch, seed=loader.seed, shuffle=loader.train and loader.cfg.shuffle
    )
    return remaining_order(order, history), (history[-1].batch if history else 0)


def share_report(loader) -> dict:
    """This rank's view of ``loader``'s data and its share of the current segment (JSON-ready)."""
    order, base = _segment_order(loader)
    plan = plan_epoch(
        loader._plan_ids(),
        **_sampler_args(loader, loader.epoch),
        shard_id=loader.shard_id,
        num_shards=loader.num_shards,
        last_batch=loader.last_batch,
        start_batch=base,
        history=loader.history_of(loader.epoch),
    )
    real = plan.sample_ids[plan.valid]
    return {
        "index": index_digest(loader),
        "samples": len(loader._plan_ids()),
        "root": str(loader.dataset.source),
        "settings": {
            "seed": loader.seed,
            "shuffle": bool(loader.train and loader.cfg.shuffle),
            "batch_size": loader.batch_size,
            "last_batch": loader.last_batch,
        },
        "position": {"epoch": loader.epoch, "history": [s.to_dict() for s in loader.history_of(loader.epoch)]},
        "shard": [loader.shard_id, loader.num_shards],
        "rows": len(real),
        "rows_digest": str(multiset_digest(real)),  # a string: JSON numbers lose bits past 2^53
        "remaining": len(order),
    }


def expected_rows(order: np.ndarray, num_shards: int, batch_size: int, last_batch: str) -> np.ndarray:
    """The samples ``num_shards`` ranks read of a segment's ``order``, each once (see the module docs)."""
    if last_batch == "drop":
        keep = (len(order) // num_shards) // batch_size * batch_size
        return order[: keep * num_shards]
    return order


def coverage_problem(reports: Sequence[dict], loader) -> str | None:
    """What is wrong with the ranks' shares of ``loader``'s current segment, or ``None``.

    Assumes the views agree (same index, settings and position); checks that the shards are
    ``0 .. n - 1`` of ``n = len(reports)`` and that their real rows are the segment's samples,
    each once (as multisets: counts and digests add up).
    """
    n = len(reports)
    shards = sorted(tuple(r["shard"]) for r in reports)
    if shards != [(k, n) for k in range(n)]:
        return f"the ranks' shards are not 0..{n - 1} of {n}"
    order, _ = _segment_order(loader)
    expected = expected_rows(order, n, loader.batch_size, loader.last_batch)
    rows = sum(int(r["rows"]) for r in reports)
    digest = sum(int(r["rows_digest"]) for r in reports) % 2**64
    if rows != len(expected) or digest != multiset_digest(expected):
        per_rank = ", ".join(f"rank {k}: {r['rows']}" for k, r in enumerate(reports))
        return (
            f"the ranks' shares hold {rows} samples ({per_rank}) where the epoch's {len(order)} remaining samples "
            f"call for {len(expected)} distinct ones under last_batch '{loader.last_batch}', or hold other samples"
        )
    return None
