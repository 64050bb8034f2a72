"""Checks before the first step: the run folder is writable and has room for checkpoints.

A run that cannot save should fail in its first seconds, not after hours of training. Before any
step, :class:`~gpufeed.train._session.Session` therefore

* creates the run folder and its ``checkpoints/`` folder and writes, flushes, ``fsync``'s and
  deletes a small probe file in each (:func:`ensure_writable`): a read-only file system, a missing
  permission or a path under a regular file fails here, naming the folder and the OS reason;
* estimates one checkpoint's size from the model's state and the optimiser's moments
  (:func:`estimate_checkpoint_bytes`) and refuses to start unless the file system has room for the
  next two checkpoint writes plus the step logs of the remaining steps (:func:`space_problem`);
  the error names the folder, the free bytes and the needed bytes. When there is room for two but
  not for ``train.keep_checkpoints + 1`` (the peak while a write replaces the oldest) it warns.

During the run, a write that still fails (the disk filled up meanwhile) is turned into a clear
error by :func:`write_failure_message`; checkpoint writes are atomic, so the newest checkpoint on
disk stays loadable and ``--resume`` continues from it once there is room.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import IO

import torch

from gpufeed.models import model_state
from gpufeed.train._distributed import broadcast_object
from gpufeed.train._errors import TrainError

__all__ = [
    "CHECKPOINT_OVERHEAD_BYTES",
    "STEP_LOG_LINE_BYTES",
    "disk_full",
    "ensure_writable",
    "estimate_checkpoint_bytes",
    "first_missing",
    "free_bytes",
    "hold_run_folder",
    "remove_unstarted_run",
    "space_needed",
    "space_problem",
    "write_failure_message",
]

log = logging.getLogger("gpufeed")

# Loader positions, RNG states, scheduler, config and zip framing of a checkpoint: measured about
# 25 KiB for one rank; 64 KiB leaves room for several ranks' states.
CHECKPOINT_OVERHEAD_BYTES = 64 * 1024
# Zip entry, alignment and pickle bytes per optimiser state tensor (measured about 830 for AdamW).
_PER_TENSOR_BYTES = 512
# A step record is about 260 bytes of JSON; sample ids add about 8 bytes per sample.
STEP_LOG_LINE_BYTES = 320
_PROBE_BYTES = 4096
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def free_bytes(folder: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding ``folder``."""
    return int(shutil.disk_usage(folder).free)


def disk_full(err: OSError) -> bool:
    """True for 'no space left' and 'quota exceeded'."""
    return err.errno in _FULL_ERRNOS


def ensure_writable(folder: Path) -> None:
    """Create ``folder`` if needed and prove a file can be written, synced and removed in it.

    Root ignores permission bits, so only a real write tells; ``fsync`` makes a file system that
    accepts data into its cache but cannot store it fail here too.

    Raises:
        TrainError: Naming the folder and the OS reason.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TrainError(
            f"cannot create the run folder {folder}: {err.strerror or err}"
            f"{f' ({err.filename})' if err.filename and str(err.filename) != str(folder) else ''}. "
            "Choose a writable --out folder"
        ) from None
    probe = folder / f".gpufeed-write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as fh:
            fh.write(b"\0" * _PROBE_BYTES)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as err:
        if disk_full(err):
            raise TrainError(
                f"the run folder {folder} is on a full file system ({err.strerror}): "
                f"{_human(free_bytes(folder))} free. Free some space or choose another --out folder"
            ) from None
        raise TrainError(
            f"the run folder {folder} is not writable: {err.strerror or err}. Choose a writable --out folder"
        ) from None
    finally:
        # When the write failed, that said why; a probe that cannot also be removed adds nothing.
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


class _CountingSink:
    """A write-only file that only counts bytes, so sizing a checkpoint allocates nothing."""

    def __init__(self) -> None:
        self.size = 0

    def write(self, data) -> int:
        n = memoryview(data).nbytes
        self.size += n
        return n

    def flush(self) -> None:
        pass


# What a run writes into its folder before its first step; a folder holding only these (and empty
# logs) is one this run made and never started in.
RUN_LOCK = ".gpufeed-run.lock"  # held by a training's rank 0 while it runs (see hold_run_folder)
_SCAFFOLDING = re.compile(
    r"(checkpoints|config\.yaml|metrics-rank\d+\.addr|(steps|eval)(-rank\d+)?\.jsonl|" + re.escape(RUN_LOCK) + ")"
)


def first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` not there yet (``path`` itself or one above it); None if it exists."""
    missing = None
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing = folder
    return missing


def remove_unstarted_run(run_dir: Path, made_from: Path | None = None) -> bool:
    """Remove a run folder that a failed start made and left holding only its scaffolding.

    A start that fails (a dataset error, a bad key found late) left ``runs/<model>-<date>`` behind
    with an empty ``checkpoints/`` and a dead metrics address, one per attempt. Anything else in
    it (a checkpoint, a step record, a file of the user's) keeps the folder.

    Args:
        run_dir: The run folder.
        made_from: The outermost folder the start made for it (:func:`first_missing`, taken before),
            such as ``runs/`` on a first run: each folder between it and the run folder goes too
            when nothing else is in it.

    Returns:
        Whether the run folder was removed.
    """
    run_dir = Path(run_dir)
    try:
        entries = list(run_dir.iterdir())
        if not all(_SCAFFOLDING.fullmatch(p.name) for p in entries):
            return False
        if any(any(p.iterdir()) if p.is_dir() else p.suffix == ".jsonl" and p.stat().st_size for p in entries):
            return False  # a checkpoint, or a step already logged
        shutil.rmtree(run_dir)
    except OSError:  # gone already, or not ours to remove: the error that stopped the start says more
        return False
    for folder in run_dir.parents:
        if made_from is None or not folder.is_relative_to(made_from):
            break
        try:
            folder.rmdir()  # only when empty: another run may have started beside this one
        except OSError:
            break
    return True


def estimate_checkpoint_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """About how many bytes one training checkpoint of this model and optimiser takes on disk.

    The model part is exact (serialised into a byte counter). The optimiser's state is exact when it
    exists (after a resume); before the first step it is estimated as AdamW's two moments per
    trainable parameter (same size as the parameter), plus framing. Measured within 5% above the real
    size for smallcnn; the estimate errs on the large side.
    """
    sink = _CountingSink()
    torch.save(model_state(model), sink)  # type: ignore[arg-type]  # save needs only write() and flush()
    total = sink.size
    if optimizer.state:
        sink = _CountingSink()
        torch.save(optimizer.state_dict(), sink)  # type: ignore[arg-type]  # as above
        total += sink.size
    else:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.requires_grad:
                    total += 2 * param.numel() * param.element_size() + 3 * _PER_TENSOR_BYTES
    return total + CHECKPOINT_OVERHEAD_BYTES


def space_needed(checkpoint_bytes: int, existing: list[int], keep: int, writes: int = 2) -> int:
    """Free bytes the next ``writes`` checkpoint writes need, given the sizes of those on disk.

    A write adds a whole new file before the oldest beyond ``keep`` is pruned, so the peak is
    simulated write by write; checkpoints already on disk that pruning removes make room.
    """
    on_disk = list(existing)
    start = peak = sum(on_disk)
    for _ in range(writes):
        on_disk.append(checkpoint_bytes)
        peak = max(peak, sum(on_disk))
        on_disk = on_disk[-keep:]
    return max(0, peak - start)


def space_problem(
    run_dir: Path,
    checkpoint_bytes: int,
    existing: list[int],
    keep: int,
    log_bytes: int,
) -> str | None:
    """Why the run folder lacks room for two more checkpoints and the logs, or ``None`` (warns when tight).

    Args:
        run_dir: The run folder.
        checkpoint_bytes: One checkpoint's estimated size.
        existing: Sizes of the checkpoints already in the run folder, oldest first.
        keep: ``train.keep_checkpoints``.
        log_bytes: Estimated growth of the step logs over the remaining steps.
    """
    free = free_bytes(run_dir)
    need = space_needed(checkpoint_bytes, existing, keep) + log_bytes + CHECKPOINT_OVERHEAD_BYTES
    if free < need:
        return (
            f"not enough free space for this run in {run_dir}: {free:,} bytes ({_human(free)}) free, "
            f"{need:,} bytes ({_human(need)}) needed for two checkpoints of about {_human(checkpoint_bytes)} "
            f"and {_human(log_bytes)} of step logs. Free some space or choose another --out folder"
        )
    peak = space_needed(checkpoint_bytes, existing, keep, writes=keep + 1) + log_bytes
    if free < peak:
        log.warning(
            "%s has %s free: room for the next checkpoints, but keeping %d checkpoints of about %s needs %s at the "
            "peak of a write; the run will stop with an error if the disk fills (its newest checkpoint stays usable)",
            run_dir,
            _human(free),
            keep,
            _human(checkpoint_bytes),
            _human(peak),
        )
    return None


def write_failure_message(err: OSError, run_dir: Path, newest: Path | None, what: str) -> str:
    """A one-paragraph explanation of a failed write during training (``what``), and what to do next."""
    try:
        free = f"; {_human(free_bytes(run_dir))} free in {run_dir}"
    except OSError:
        free = ""
    kept = (
        f"The newest checkpoint, {newest}, is intact: make room, then continue with --resume"
        if newest is not None
        else "No checkpoint was written yet: make room and start again"
    )
    return f"cannot write {what}: {err.strerror or err}{free}. {kept}"


def hold_run_folder(run_dir: Path, is_main: bool) -> IO[str] | None:
    """Lock ``run_dir`` for this training (rank 0 holds it; every rank learns the outcome).

    A second ``gpufeed train --resume --out RUN`` beside a running one was accepted, and both wrote
    checkpoints into one folder. The lock is the kernel's (``flock``): a killed run's is gone with
    its process, so it never needs clearing by hand. Close the returned file to release it.

    Raises:
        TrainError: Another training holds the folder (naming its process, host and start).
    """
    handle, problem = None, None
    if is_main:
        handle = open(run_dir / RUN_LOCK, "a+", encoding="utf-8")  # noqa: SIM115  # held for the run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            handle, problem = None, f"{run_dir} is in use by another training ({holder}): give another --out, or wait"
        else:
            handle.seek(0)
            handle.truncate()
            handle.write(f"PID {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            handle.flush()
    if (problem := broadcast_object(problem)) is not None:
        raise TrainError(problem)
    return handle
