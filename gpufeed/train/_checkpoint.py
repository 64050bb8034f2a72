"""Training checkpoints: atomic writes, crash-safe resume, RNG state.

Layout (the contract of :mod:`gpufeed.models._io`): ``RUN_DIR/checkpoints/ckpt-<step:09d>.pt``, a
``torch.save``'d dict loadable with ``weights_only=True`` holding

=================  ===========================================================================
key                what
=================  ===========================================================================
``model``          the model's state dict (DDP and compile wrappers removed)
``model_spec``     :meth:`gpufeed.models.ModelSpec.to_dict`: architecture and preprocessing facts
``optimizer``      AdamW state
``scheduler``      learning-rate schedule state
``scaler``         fp16 gradient scaler state, or ``None``
``step``           optimizer steps completed
``epoch``          epoch in progress (or next to start) when written
``loader``         one ``loader.state_dict()`` per rank, in rank order (where reading resumes)
``rng``            one dict per rank: python, numpy, torch CPU and current-GPU generator states
``threads``        each rank's CPU threads (``torch.get_num_threads()``): a resume with another
                   count is warned of, as its CPU results differ in the last bits
``world_size``     ranks that wrote it
``config``         the resolved config (a mapping, as ``config.yaml`` holds it)
``gpufeed``        the gpufeed version
=================  ===========================================================================

**Atomic writes**: the dict is serialised in memory, written to a hidden temporary file beside
the target, flushed and ``fsync``'d, then renamed over the target and the folder ``fsync``'d, so a
checkpoint file either is complete or does not exist: killing the process at any moment (even
``kill -9`` mid-write) leaves the previous checkpoints loadable and loses at most one checkpoint
interval. Only then are checkpoints beyond ``keep`` pruned, oldest first. A write that fails (a
full disk) removes its temporary file and raises; the checkpoints already there are untouched, and
the session reports the failure with the newest of them (:mod:`gpufeed.train._preflight`).

**Resume** takes the newest checkpoint that loads; one that does not (a damaged disk) is
reported and the one before it is tried. Stale temporary files of killed writes are removed.

For tests of crash safety, the environment variable ``GPUFEED_CHECKPOINT_CHUNK_DELAY_MS`` makes
each 256 KiB chunk of a write pause that long, so a test can kill a process mid-write.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import random
import time
from pathlib import Path

import numpy as np
import torch

from gpufeed.core import atomic_path, temp_path
from gpufeed.models import CHECKPOINT_DIR, checkpoint_path, list_checkpoints

__all__ = [
    "capture_rng",
    "load_latest_checkpoint",
    "param_digest",
    "prune_checkpoints",
    "remove_stale_temp_files",
    "restore_rng",
    "save_checkpoint",
    "temp_path",
    "threads_mismatch",
]

log = logging.getLogger("gpufeed")

_CHUNK_BYTES = 256 * 1024
_DELAY_ENV = "GPUFEED_CHECKPOINT_CHUNK_DELAY_MS"


def save_checkpoint(payload: dict, run_dir: Path, step: int, keep: int | None = None) -> Path:
    """Write ``payload`` atomically as the checkpoint of ``step``; prune to the newest ``keep``.

    Returns:
        The checkpoint's path.
    """
    path = checkpoint_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    data = buffer.getbuffer()
    delay_s = float(os.environ.get(_DELAY_ENV, "0") or 0) / 1e3
    try:
        # Chunked rather than write_atomic, so the test delay can pause between chunks.
        with atomic_path(path, sync_dir=True) as tmp, open(tmp, "wb") as fh:
            for start in range(0, len(data), _CHUNK_BYTES):
                fh.write(data[start : start + _CHUNK_BYTES])
                if delay_s:
                    fh.flush()
                    time.sleep(delay_s)
    finally:
        del data
    if keep is not None:
        prune_checkpoints(run_dir, keep)
    return path


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` checkpoints; returns the deleted paths."""
    found = list_checkpoints(run_dir)
    doomed = found[: max(0, len(found) - keep)]
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed


def remove_stale_temp_files(run_dir: Path) -> list[Path]:
    """Remove temporary files left by writes that were killed; returns what was removed."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    stale = sorted(folder.glob(".ckpt-*.pt.tmp-*")) if folder.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
        log.info("removed %s, left by an interrupted checkpoint write", path)
    return stale


def load_latest_checkpoint(run_dir: Path) -> tuple[Path, dict] | None:
    """The newest checkpoint of ``run_dir`` that loads, with its contents; ``None`` if there is none.

    Raises:
        ValueError: Checkpoints exist but none of them loads (each one's reason is given).
    """
    found = list_checkpoints(run_dir)
    failures = []
    for path in reversed(found):
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several types for damaged files; all mean "unusable"
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            log.warning("checkpoint %s cannot be loaded (%s); trying the one before it", path, reason)
            failures.append(f"{path.name}: {reason}")
            continue
        missing = [k for k in ("model", "model_spec", "optimizer", "step", "loader") if k not in state]
        if missing:
            failures.append(f"{path.name}: not a gpufeed training checkpoint (missing {', '.join(missing)})")
            continue
        return path, state
    if failures:
        raise ValueError(f"no loadable checkpoint in {Path(run_dir) / CHECKPOINT_DIR}: {'; '.join(failures)}")
    return None


def capture_rng() -> dict:
    """This process's random generator states, in a form ``torch.load(weights_only=True)`` accepts."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        # The current device's generator only: asking for all of them would open a CUDA context on
        # every GPU from every rank, and a CPU run must not touch CUDA at all.
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() and torch.cuda.is_initialized() else None,
    }
    return state


def restore_rng(state: dict) -> None:
    """Put back the generator states captured by :func:`capture_rng`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])  # the current device's, as captured


def threads_mismatch(path: Path, saved: list[int] | None, rank: int, world_size: int) -> str | None:
    """Why a CPU resume from ``path`` will not be bit-identical, or ``None``: another CPU thread count.

    CPU kernels split their reductions (convolution and batch-norm gradients) by thread count, so
    one step computed with another count gives other last bits; the default count follows the
    cores the process may use (its CPU affinity), so a run moved to other cores changes it.

    Args:
        saved: The checkpoint's ``threads`` (one per rank), or ``None`` for an older checkpoint.
    """
    if not saved:
        return None
    theirs = saved[rank] if len(saved) == world_size else saved[0]
    ours = torch.get_num_threads()
    if theirs == ours:
        return None
    return (
        f"{path} was written by a run computing with {theirs} CPU threads, this one has {ours}: the results will "
        f"differ from an uninterrupted run's in the last bits (set OMP_NUM_THREADS={theirs} to continue it exactly)"
    )


def param_digest(model: torch.nn.Module) -> str:
    """SHA-256 over a model's parameters and buffers (names and values, in order): equal digests, equal models."""
    digest = hashlib.sha256()
    bare = getattr(model, "module", model)
    for name, param in [*bare.named_parameters(), *bare.named_buffers()]:
        digest.update(name.encode())
        digest.update(param.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
