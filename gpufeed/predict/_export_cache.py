"""The export ``gpufeed predict`` makes of a checkpoint to score it on onnxruntime: made once, kept, checked.

On a CPU onnxruntime runs an exported graph (normalisation inside, each convolution fused with its
batch norm) in about 20 % less CPU time than PyTorch's eager mode runs the checkpoint, and its
threads sleep rather than spin while they wait, which on a busy machine makes it several times
faster. So ``predict`` with a checkpoint exports it first (``runtime`` ``auto`` or ``onnx``,
:mod:`._model`), through :func:`gpufeed.models.export_model`, the very export ``gpufeed export``
runs, with its checks (the ONNX checker, onnxruntime against PyTorch at every batch size).

**The cache.** An export is kept in a folder of the cache (:func:`default_export_cache`: the
``GPUFEED_EXPORT_CACHE_DIR`` environment variable, else ``$XDG_CACHE_HOME/gpufeed/exports``, else
``~/.cache/gpufeed/exports``), named by a digest of its key (:func:`export_key`): the checkpoint's
content (SHA-256 of the file, not its name or time, so a copied or renamed checkpoint is found and
a checkpoint overwritten in place is not), the export's settings (batch sizes, precision, opset)
and the versions of gpufeed, torch and onnx that made it. A second ``predict`` with the same
checkpoint finds the folder and exports nothing.

**Never trusted blindly.** The export is written into a hidden folder beside its place
(``.<key>.tmp-<pid>``) and renamed into place only once complete, its key file written last; an
entry is used only when its key file holds the same key, its card reads, and ``model.onnx``'s
SHA-256 is the one its card recorded. Anything else (a truncated graph, a damaged card, a folder
half-copied by hand) is logged in one line and exported again over it. A killed export's hidden
folder is removed by a later run once its process is gone and it has lain untouched for ten minutes.

**Bounded.** A load from the cache records the entry's use, and after a new export lands the least
recently used entries beyond the limit are removed (never the one just made, nor one another
process is loading): :mod:`._cache_entries`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpufeed import __version__
from gpufeed.core import process_alive, write_json
from gpufeed.models import (
    ONNX_FILE,
    ModelCard,
    ModelCardError,
    default_batch_sizes,
    export_model,
    read_model_card,
)
from gpufeed.predict._cache_entries import (
    KEY_FILE,
    entry_name,
    export_cache_max_bytes,
    hold_entry,
    prune_export_cache,
    record_use,
    removal_aside,
)

__all__ = ["ENV_EXPORT_CACHE", "CachedExport", "cached_export", "default_export_cache", "export_key", "held_export"]

log = logging.getLogger("gpufeed.predict")

ENV_EXPORT_CACHE = "GPUFEED_EXPORT_CACHE_DIR"
_PRECISION = "fp32"  # parity with PyTorch fp32 within 1e-3 relative; fp16 would change the numbers
_OPSET = 18
_STALE_S = 600.0


def default_export_cache() -> Path:
    """The folder exports are kept in: ``$GPUFEED_EXPORT_CACHE_DIR``, else the user's cache folder."""
    chosen = os.environ.get(ENV_EXPORT_CACHE)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gpufeed" / "exports"


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in blocks (a checkpoint may be hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_key(checkpoint_sha256: str, batch_sizes: tuple[int, ...]) -> dict:
    """What an export depends on: the checkpoint's content, the export's settings, the software that made it."""
    import onnx
    import torch

    return {
        "checkpoint_sha256": checkpoint_sha256,
        "batch_sizes": list(batch_sizes),
        "precision": _PRECISION,
        "opset": _OPSET,
        "gpufeed": __version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
    }


_entry_name = entry_name  # the tests' name for it


@dataclass(frozen=True)
class CachedExport:
    """An export found in the cache or made now.

    Attributes:
        folder: The model folder (``model.onnx``, ``model_card.json``, the key file).
        card: Its model card.
        export_s: Seconds the export took now (0.0 when it was found in the cache).
        rebuilt: Why an entry that was there could not be used (``None``: none was there, or it was used).
    """

    folder: Path
    card: ModelCard
    export_s: float = 0.0
    rebuilt: str | None = None


def _entry_problem(folder: Path, key: dict) -> str | None:
    """Why the cache entry at ``folder`` cannot be used for ``key``, or ``None`` when it can."""
    try:
        held = json.loads((folder / KEY_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"its {KEY_FILE} is unreadable ({type(err).__name__})"
    if held != key:
        return f"its {KEY_FILE} holds another key"
    try:
        card = read_model_card(folder)
    except (ModelCardError, ValueError, TypeError, KeyError) as err:
        return f"its model card is unusable: {str(err).splitlines()[0][:160]}"
    if tuple(card.batch_sizes) != tuple(key["batch_sizes"]):
        return f"its card lists batch sizes {list(card.batch_sizes)}, not {key['batch_sizes']}"
    if not card.onnx_sha256 or file_sha256(folder / ONNX_FILE) != card.onnx_sha256:
        return f"its {ONNX_FILE} is not the file its card recorded (SHA-256 differs)"
    return None


def _remove_stale_builds(cache_dir: Path, name: str) -> None:
    """Hidden build folders of ``name`` left by killed exports (process gone, untouched for ten minutes)."""
    prefix = f".{name}.tmp-"
    for entry in cache_dir.glob(f"{prefix}*"):
        pid = entry.name[len(prefix) :]
        if not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
            continue
        try:
            if time.time() - entry.stat().st_mtime >= _STALE_S:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def _move_into_place(building: Path, folder: Path, key: dict) -> Path:
    """Rename the finished build over ``folder`` (an unusable entry there is set aside first).

    Another process may have finished the same export meanwhile: its entry, when usable, wins and
    ours is removed (the two are the same export).
    """
    if folder.exists():
        if _entry_problem(folder, key) is None:
            shutil.rmtree(building, ignore_errors=True)
            return folder
        aside = removal_aside(folder)  # a prune removes it if this process dies before the rmtree
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(folder, aside)
        shutil.rmtree(aside, ignore_errors=True)
    try:
        os.rename(building, folder)
    except OSError:  # another process renamed its entry in between
        shutil.rmtree(building, ignore_errors=True)
        problem = _entry_problem(folder, key)
        if problem is not None:
            raise OSError(f"the export cache entry {folder} appeared while exporting, and {problem}") from None
    return folder


def cached_export(
    checkpoint: str | Path, batch_size: int, cache_dir: str | Path | None = None, device=None
) -> CachedExport:
    """:func:`held_export`, released at once (the entry may be removed by a later prune)."""
    with held_export(checkpoint, batch_size, cache_dir, device) as export:
        return export


@contextlib.contextmanager
def held_export(
    checkpoint: str | Path,
    batch_size: int,
    cache_dir: str | Path | None = None,
    device=None,
    max_bytes: float | None = None,
) -> Iterator[CachedExport]:
    """The ONNX export of ``checkpoint`` from the cache, made (and kept) when missing or unusable.

    The entry is held in use for the block (no pruner removes it while its sessions load), its
    use recorded; after a new export the cache is pruned to ``max_bytes``.

    Args:
        checkpoint: The checkpoint file.
        batch_size: The largest batch size (the export runs at :func:`~gpufeed.models.default_batch_sizes`
            of it, as ``gpufeed export --batch-size`` does).
        cache_dir: The cache folder (default: :func:`default_export_cache`).
        device: :class:`~gpufeed.device.DeviceChoice` for the export's parity check (default: CPU).
        max_bytes: The cache's bound after a new export (default: :func:`._cache_entries.export_cache_max_bytes`).

    Raises:
        ExportError: The export failed its checks (nothing is kept).
        OSError: The cache folder cannot be written.
    """
    checkpoint = Path(checkpoint)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_export_cache()
    key = export_key(file_sha256(checkpoint), default_batch_sizes(batch_size))
    name = _entry_name(key)
    folder = cache_dir / name
    rebuilt = None
    with contextlib.ExitStack() as held:
        if folder.exists():
            held.enter_context(hold_entry(folder))
            rebuilt = _entry_problem(folder, key)
            if rebuilt is None:
                log.info("predict: the export of %s is in the cache (%s)", checkpoint, folder)
                record_use(folder, checkpoint)
                yield CachedExport(folder, read_model_card(folder))
                return
            held.close()
            log.warning(
                "predict: the cached export %s cannot be used (%s); exporting %s again", folder, rebuilt, checkpoint
            )
        seconds = _export_into(checkpoint, batch_size, cache_dir, key, device, held)
        limit = export_cache_max_bytes() if max_bytes is None else max_bytes
        try:
            prune_export_cache(cache_dir, limit, keep={name})
        except OSError as err:  # the export is made and held: scoring goes on
            log.warning("predict: cannot prune the export cache %s (%s)", cache_dir, err.strerror or err)
        yield CachedExport(folder, read_model_card(folder), seconds, rebuilt)


def _export_into(
    checkpoint: Path, batch_size: int, cache_dir: Path, key: dict, device, held: contextlib.ExitStack
) -> float:
    """Export ``checkpoint`` into its entry (held in ``held`` from before its rename); the seconds it took."""
    name = _entry_name(key)
    folder = cache_dir / name
    cache_dir.mkdir(parents=True, exist_ok=True)
    _remove_stale_builds(cache_dir, name)
    building = cache_dir / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    log.info("predict: exporting %s for onnxruntime, once: kept in %s", checkpoint, folder)
    started = time.perf_counter()
    try:
        export_model(
            checkpoint,
            building,
            batch_size=batch_size,
            precision=_PRECISION,
            opset=_OPSET,
            name=checkpoint.stem,
            device=device,
        )
        record_use(building, checkpoint)  # the freshest entry from the moment it appears
        held.enter_context(hold_entry(building))  # the lock moves with the folder's rename
        write_json(building / KEY_FILE, key, atomic=True)  # last: a folder without it is no entry
        _move_into_place(building, folder, key)
        held.enter_context(hold_entry(folder))  # another process's entry may have won the race
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    seconds = time.perf_counter() - started
    log.info("predict: exported %s in %.1f s", checkpoint, seconds)
    return seconds
