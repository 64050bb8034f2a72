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

**Atomic writes**: the dict is serialised into a hidden temporary file beside the target,
flushed and ``fsync``'d, then renamed over the target and the folder ``fsync``'d, so a checkpoint
file either is complete or does not exist: killing the process at any moment (even ``kill -9``
mid-write) leaves the previous checkpoints loadable. Only then are checkpoints beyond ``keep``
pruned, oldest first. A write that fails (a full disk) removes its temporary file and raises; the
checkpoints already there are untouched, and the session reports the failure with the newest of
them (:mod:`gpufeed.train._preflight`).

**In the background** (:class:`CheckpointWriter`, the session's): the training thread copies the
state's tensors into host buffers kept from one checkpoint to the next (pinned for device tensors,
copied behind the step on its stream, not waited for) and trains on; a thread serialises, writes,
syncs, renames and prunes. One write at a time: the next checkpoint waits for the previous one and
raises its failure; the session also waits at the end of the run. A kill during a write loses the
steps trained while it ran too. A checkpoint larger than the free space is refused before the copy.

**Resume** takes the newest checkpoint that loads; one that does not (a damaged disk) is
reported and the one before it is tried. Stale temporary files of killed writes are removed.

For tests of crash safety, the environment variable ``GPUFEED_CHECKPOINT_CHUNK_DELAY_MS`` makes
each 256 KiB chunk of a write pause that long, so a test can kill a process mid-write.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import io
import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from gpufeed.core import atomic_path, temp_path
from gpufeed.models import CHECKPOINT_DIR, checkpoint_path, list_checkpoints

__all__ = [
    "CheckpointWriteFailed",
    "CheckpointWriter",
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
    delay_s = float(os.environ.get(_DELAY_ENV, "0") or 0) / 1e3
    with atomic_path(path, sync_dir=True) as tmp, open(tmp, "wb") as fh:
        if delay_s:
            _write_slowly(payload, fh, delay_s)
        else:
            # Straight into the file: a serialised copy in memory would double the state's footprint.
            out = _KeepsWriteErrors(fh)
            try:
                torch.save(payload, out)
            except RuntimeError:
                if out.error is None:
                    raise
                raise out.error from None
    if keep is not None:
        prune_checkpoints(run_dir, keep)
    return path


def _write_slowly(payload: dict, fh: IO[bytes], delay_s: float) -> None:
    """The test delay: serialised first, then written in 256 KiB chunks with a pause after each."""
    buffer = io.BytesIO()
    torch.save(payload, buffer)  # a file object, as torch.save(payload, fh): the same bytes
    data = buffer.getbuffer()
    try:
        for start in range(0, len(data), _CHUNK_BYTES):
            fh.write(data[start : start + _CHUNK_BYTES])
            fh.flush()
            time.sleep(delay_s)
    finally:
        del data


class _KeepsWriteErrors:
    """``fh``, keeping the ``OSError`` of a failed write: torch.save reports one as "unexpected pos", no errno."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._fh.write(data)
        except OSError as err:
            self.error = self.error or err
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fh, name)


class CheckpointWriteFailed(Exception):
    """A checkpoint written in the background failed: ``path`` was not written, ``error`` says why."""

    def __init__(self, path: Path, error: BaseException) -> None:
        super().__init__(f"cannot write checkpoint {path}: {_first_line(error)}")
        self.path = path
        self.error = error


class CheckpointWriter:
    """Writes checkpoints on a background thread from host copies taken on the caller's thread.

    The thread issues no collective and touches no device but to wait for the copies' event; it is
    not a daemon, so an interpreter that exits without :meth:`wait` still lets the write finish.
    """

    def __init__(self) -> None:
        self._buffers: list[torch.UntypedStorage] = []  # one per storage of the state, reused
        self._thread: threading.Thread | None = None
        self._path: Path | None = None
        self._error: BaseException | None = None

    @property
    def writing(self) -> Path | None:
        """The checkpoint submitted and not waited for yet, or ``None``."""
        return self._path if self._thread is not None else None

    def submit(self, payload: dict, run_dir: Path, step: int, keep: int | None = None) -> Path:
        """Copy ``payload``'s tensors to the host, then write it as the checkpoint of ``step`` in the background.

        Returns:
            The path the checkpoint will have (:meth:`wait` says when it has it).

        Raises:
            CheckpointWriteFailed: The previous write failed; this one is not started.
            OSError: ``ENOSPC``: the file system has less room than the state's bytes (nothing copied).
        """
        self.wait()  # one write at a time: the buffers its snapshot lives in are free again after it
        path = checkpoint_path(run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = _tensors(payload)
        _refuse_without_room(path, tensors)
        memo, events = self._host_copies(tensors)
        snapshot = copy.deepcopy(payload, memo)  # the containers (and the state dicts' _metadata), host tensors in
        self._path, self._error = path, None
        self._thread = threading.Thread(
            target=self._write, args=(snapshot, events, run_dir, step, keep), name=f"gpufeed checkpoint {step}"
        )
        self._thread.start()
        return path

    def wait(self) -> Path | None:
        """Wait for the write in flight; its path once it is on disk, ``None`` if there was none.

        Raises:
            CheckpointWriteFailed: The write failed (the checkpoints already on disk are untouched).
        """
        if self._thread is None:
            return None
        self._thread.join()  # cleared after: an interrupted join leaves the write to be waited for again
        self._thread = None
        path, error, self._path, self._error = self._path, self._error, None, None
        assert path is not None
        if error is not None:
            raise CheckpointWriteFailed(path, error) from error
        return path

    def _host_copies(self, tensors: list[torch.Tensor]) -> tuple[dict[int, Any], list]:
        """Host copies of ``tensors`` by ``id`` (a ``deepcopy`` memo), and the CUDA events marking them done.

        Each storage is copied whole, once, and the tensors rebuilt on the copies with their offsets
        and strides: ``torch.save`` writes the same storages and views it would have from the originals.
        """
        storages: dict[tuple, torch.UntypedStorage] = {}
        memo: dict[int, Any] = {}
        for tensor in tensors:
            if tensor.layout != torch.strided or tensor.is_quantized:  # none in gpufeed's state: a plain copy
                memo[id(tensor)] = tensor.detach().to("cpu", copy=True)
                continue
            source = tensor.untyped_storage()
            key = (tensor.device, source._cdata)  # what torch.save tells storages apart by
            host = storages.get(key)
            if host is None:
                host = storages[key] = self._host_storage(source, len(storages))
            memo[id(tensor)] = torch.empty(0, dtype=tensor.dtype).set_(
                host, tensor.storage_offset(), tensor.size(), tensor.stride()
            )
        del self._buffers[len(storages) :]
        # Recorded behind the copies on the step's stream: the next step's kernels queue after them, so
        # the state stays as it was at this step; only the writer thread waits, asleep (blocking events).
        cuda = {device for device, _ in storages if device.type == "cuda"}
        return memo, [torch.cuda.current_stream(d).record_event(torch.cuda.Event(blocking=True)) for d in cuda]

    def _host_storage(self, source: torch.UntypedStorage, slot: int) -> torch.UntypedStorage:
        """``source``'s bytes in host buffer ``slot``, kept while its size holds (pinned for a CUDA source).

        Kept rather than allocated per checkpoint: fresh memory costs a page fault per 4 KiB on its
        first write, as much as the copy itself or more (a ResNet-18 state on a VM: 80-960 ms against 50).
        """
        while len(self._buffers) <= slot:
            self._buffers.append(torch.UntypedStorage(0))
        pin = source.device.type == "cuda"  # pinned: an asynchronous copy (a CPU source's slot may be plain)
        if self._buffers[slot].nbytes() != source.nbytes() or (pin and not self._buffers[slot].is_pinned()):
            self._buffers[slot] = torch.empty(source.nbytes(), dtype=torch.uint8, pin_memory=pin).untyped_storage()
        self._buffers[slot].copy_(source, non_blocking=True)
        return self._buffers[slot]

    def _write(self, snapshot: dict, events: list, run_dir: Path, step: int, keep: int | None) -> None:
        try:
            for event in events:
                event.synchronize()
            save_checkpoint(snapshot, run_dir, step, keep)
        except BaseException as err:  # kept for wait(), which raises it on the training thread
            self._error = err


def _tensors(tree: Any) -> list[torch.Tensor]:
    """The distinct tensors in ``tree`` (nested dicts, lists and tuples), in order."""
    found: dict[int, torch.Tensor] = {}
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, torch.Tensor):
            found.setdefault(id(node), node)
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, (list, tuple)):
            stack.extend(reversed(node))
    return list(found.values())


def _refuse_without_room(path: Path, tensors: list[torch.Tensor]) -> None:
    """``ENOSPC`` now for a checkpoint bigger than the free space, not from the thread an interval later.

    The file holds every storage whole, uncompressed; free blocks are counted with those reserved
    for root, so no write that would fit is refused.
    """
    storages = {(t.device, t.untyped_storage()._cdata): t.untyped_storage().nbytes() for t in tensors}
    stats = os.statvfs(path.parent)
    if sum(storages.values()) > stats.f_bfree * stats.f_frsize:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


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
            reason = _first_line(err)
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
