"""A run's checkpoint contents: what a session's checkpoint holds, and how a resume puts it back.

:func:`checkpoint_payload` is the dict a :class:`~gpufeed.train._session.Session` hands to
:func:`~gpufeed.train._checkpoint.save_checkpoint` (its keys are the layout
:mod:`gpufeed.train._checkpoint` documents); :func:`restore_run` loads one into a session being set
up: the model (refused when the checkpoint holds another), optimiser, scheduler, scaler, every
rank's loader position (re-split on another number of ranks), the random generators and the step,
and logs which settings changed since.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from gpufeed import __version__
from gpufeed.config import ConfigError
from gpufeed.core import SizePx, to_mapping
from gpufeed.models import ModelSpec, model_state
from gpufeed.train._checkpoint import restore_rng, threads_mismatch
from gpufeed.train._errors import TrainError
from gpufeed.train._optim import build_scheduler, load_optimizer_state, schedule_progress

__all__ = ["checkpoint_payload", "restore_run"]

log = logging.getLogger("gpufeed")


def _flatten(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def _shown(value) -> str:
    """A spec value as the config writes it (``96``, ``352x224`` for a size), not its Python repr."""
    return value.label if isinstance(value, SizePx) else repr(value)


def checkpoint_payload(session, position: dict, gathered: list[dict]) -> dict:
    """What ``session``'s checkpoint holds, rank 0's ``position`` and every rank's ``gathered`` loader and RNG state."""
    s = session
    return {
        **model_state(s.model),
        "optimizer": s.optimizer.state_dict(),
        "scheduler": s.scheduler.state_dict(),
        "schedule": {"total_steps": s.total_steps, "anchor": list(s.schedule_anchor) if s.schedule_anchor else None},
        "scaler": s.scaler.state_dict() if s.scaler.is_enabled() else None,
        "step": s.step,
        "epoch": int(position["epoch"]),  # the loader's: the next epoch once this one's batches are done
        "loader": [g["loader"] for g in gathered],
        "rng": [g["rng"] for g in gathered],
        "threads": [g["threads"] for g in gathered],
        "world_size": s.dist.world_size,
        "config": to_mapping(s.cfg),
        "gpufeed": __version__,
    }


def restore_run(session, path: Path, state: dict) -> None:
    """Put checkpoint ``state`` (read from ``path``) back into ``session``, which has its model, optimiser and loaders.

    Raises:
        TrainError: The checkpoint holds another model, or its loader positions cannot be re-split
            over this run's ranks.
        ConfigError: The config's ``seed`` differs from the checkpoint's.
    """
    s = session
    cfg, rank = s.cfg, s.dist.rank
    saved_spec = ModelSpec.from_dict(state["model_spec"])
    if saved_spec != s.model.spec:
        diff = [
            f"{k}: {_shown(getattr(saved_spec, k))} -> {_shown(getattr(s.model.spec, k))}"
            for k in saved_spec.__dataclass_fields__
            if getattr(saved_spec, k) != getattr(s.model.spec, k)
        ]
        raise TrainError(f"{path} holds a different model than this config builds ({'; '.join(diff)})")
    saved_world = int(state.get("world_size", 1))
    loader_states = list(state["loader"])
    if int(loader_states[0].get("seed", cfg.seed)) != cfg.seed:
        raise ConfigError("seed", f"value {cfg.seed} differs from the seed {loader_states[0]['seed']} of {path}")
    s.model.load_state_dict(state["model"])
    load_optimizer_state(s.optimizer, state["optimizer"])
    s.scheduler.load_state_dict(state["scheduler"])
    if state.get("scaler") and s.scaler.is_enabled():
        s.scaler.load_state_dict(state["scaler"])
    try:
        # Every rank's state: on another number of ranks the epoch's remaining samples are re-split.
        s.data.train.load_state_dict(loader_states)
    except ValueError as err:
        raise TrainError(f"{path} cannot be resumed on {s.dist.world_size} rank(s): {err}") from None
    if saved_world != s.dist.world_size:
        log.info(
            "resuming %s, written by %d rank(s), on %d: the rest of epoch %d is re-split over the new ranks",
            path,
            saved_world,
            s.dist.world_size,
            int(loader_states[0]["epoch"]) + 1,
        )
    rng = state.get("rng") or []
    own, reseed = resume_generators(rng, rank, s.device.is_gpu)
    if rng:
        restore_rng(own if own is not None else rng[0])
    fresh = cfg.seed + 1 + rank + (int(state["step"]) << 20)
    if reseed == "all":  # a rank the checkpoint has no generators for draws its own, not rank 0's
        torch.manual_seed(fresh)
    elif reseed == "cuda":  # written on a CPU: every rank's device generator would be at cfg.seed
        torch.cuda.manual_seed(fresh)
    s.step = int(state["step"])
    _resume_schedule(s, state)
    if not s.device.is_gpu and (mismatch := threads_mismatch(path, state.get("threads"), rank, s.dist.world_size)):
        log.warning(mismatch)
    # Read back from the loader: a checkpoint of an earlier version written after an epoch's last
    # step says (epoch e, batch = all of them), which is where epoch e + 1 starts.
    position = s.data.train.state_dict()
    s.epoch = int(position["epoch"])
    s.mid_epoch = int(position["batch"]) > 0
    s.resumed = True
    old = _flatten(state.get("config") or {})
    new = _flatten(json.loads(json.dumps(to_mapping(cfg))))
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    if changed and rank == 0:
        log.info(
            "resumed with changed settings: %s", ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed)
        )
    where = f"in epoch {s.epoch + 1}" if s.mid_epoch else f"{s.epoch} epoch(s) done"  # as the loop's lines count
    log.info("resumed from %s: step %d, %s", path, s.step, where)


def _resume_schedule(s, state: dict) -> None:
    """Rebuild the learning-rate schedule for the steps this run has to go, going on from where it stood.

    On another number of ranks (or with other ``train.epochs``) the run has another number of
    steps to go than the checkpoint's schedule planned: the schedule is anchored at the
    checkpoint's step and progress (:func:`~gpufeed.train._optim.lr_factor`) and ends at this
    run's last step. With the same length to go, a schedule anchored by an earlier resume keeps
    its anchor. A checkpoint without its schedule (written before gpufeed kept it) keeps the
    schedule of this run's length.
    """
    saved = state.get("schedule")
    if not saved:
        return
    cfg = s.cfg.train
    total, planned = s.step + s.data.train.batches_left(cfg.epochs), int(saved["total_steps"])
    old_anchor = tuple(saved["anchor"]) if saved.get("anchor") else None
    if planned == total:
        if old_anchor is None:
            return  # the session's own schedule is the checkpoint's
        anchor = old_anchor
    else:
        first = max(s.step, cfg.warmup_steps)
        anchor = (first, schedule_progress(first, planned, cfg, old_anchor))
    s.total_steps, s.schedule_anchor = total, anchor
    s.scheduler = build_scheduler(s.optimizer, total, cfg, anchor)
    s.scheduler.load_state_dict(state["scheduler"])
    # LambdaLR's constructor set each group's rate to the schedule's at step 0, over the rate the
    # optimizer's state restored, and load_state_dict restores the counters only: the next step
    # would run at that rate while the log showed the checkpoint's.
    step = s.scheduler.last_epoch
    for group, factor in zip(s.optimizer.param_groups, s.scheduler.lr_lambdas, strict=True):
        group["lr"] = group["initial_lr"] * factor(step)
    s.scheduler._last_lr = [group["lr"] for group in s.optimizer.param_groups]
    if planned != total:
        log.info("learning-rate schedule: %d steps to go (the checkpoint's planned %d in all); it goes on from "
                 "%.0f%% of its decay", total - s.step, planned, 100 * anchor[1])  # fmt: skip


def resume_generators(rng: list, rank: int, on_gpu: bool) -> tuple[dict | None, str]:
    """(this rank's saved generators or ``None``, which to seed afresh for it: ``all``, ``cuda`` or ``none``).

    A checkpoint written on a CPU holds no CUDA generator; resumed on GPUs, each rank's device
    generator would then stay where the session's ``manual_seed(cfg.seed)`` left it, the same on
    every rank, and so would every augmentation drawn on the device: the same flips and colours on
    every rank's images.
    """
    own = rng[rank] if rank < len(rng) else None
    if own is None:
        return None, "all"
    return own, ("cuda" if on_gpu and own.get("cuda") is None else "none")
