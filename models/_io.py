"""Weights on disk: the checkpoint contract shared by training (writes) and export (reads).

A checkpoint is a ``torch.save``'d dict holding at least ``"model"`` (a state dict) and
``"model_spec"`` (:meth:`ModelSpec.to_dict`); training adds optimiser, scheduler, loader and RNG
state beside them. A run folder keeps them as ``<run>/checkpoints/ckpt-<step, 9 digits>.pt``.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from gpufeed.core import SizePx
from gpufeed.models._nets import GpufeedModel
from gpufeed.models._registry import create_model, model_from_spec
from gpufeed.models._spec import ModelSpec

__all__ = [
    "CHECKPOINT_DIR",
    "checkpoint_path",
    "find_checkpoint",
    "list_checkpoints",
    "load_model",
    "model_state",
    "read_checkpoint",
    "untrained_checkpoint",
]

CHECKPOINT_DIR = "checkpoints"


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of ``step`` lives in a run folder."""
    return Path(run_dir) / CHECKPOINT_DIR / f"ckpt-{step:09d}.pt"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """A run's checkpoints, oldest first (temporary files of interrupted writes are not listed)."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    return sorted(folder.glob("ckpt-[0-9]*.pt")) if folder.is_dir() else []


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint file as given, or the newest one in a run folder.

    Raises:
        FileNotFoundError: Naming the path and what was looked for.
    """
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        found = list_checkpoints(path)
        if found:
            return found[-1]
        raise FileNotFoundError(f"no checkpoint in {path}: expected {path / CHECKPOINT_DIR}/ckpt-<step>.pt")
    raise FileNotFoundError(f"checkpoint {path} does not exist")


def read_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """A checkpoint file's dict, loaded with ``torch.load(weights_only=True)`` (no code from the file runs).

    Raises:
        ValueError: One line naming the file and why it is no checkpoint (empty, not a PyTorch file,
            a pickled object rather than tensors and plain values, not a dict), in place of torch's
            several paragraphs, which end in advice to load with ``weights_only=False``.
    """
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch.load raises several types for files that are not checkpoints
        raise ValueError(f"{path} is not a gpufeed checkpoint: {_load_failure(Path(path), err)}") from None
    if not isinstance(state, dict):
        raise ValueError(
            f"{path} is not a gpufeed checkpoint: it holds a {type(state).__name__}, not the dict gpufeed train saves"
        )
    return state


def _load_failure(path: Path, err: Exception) -> str:
    """Why ``torch.load(path, weights_only=True)`` failed, in a few words (torch's detail line, cut)."""
    if path.is_file() and path.stat().st_size == 0:
        return "the file is empty (0 bytes)"
    text = str(err)
    found = re.search(r"Unsupported global: GLOBAL (\S+)", text)
    if found:  # e.g. torch.save(model): the file rebuilds objects by calling their code
        return (
            f"it holds a pickled object ({found.group(1)[:100]}), not tensors and plain values; gpufeed reads "
            "checkpoints with torch.load(weights_only=True), which runs no code from a file"
        )
    detail = text.split("WeightsUnpickler error:", 1)[-1] if isinstance(err, pickle.UnpicklingError) else text
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    return f"torch.load cannot read it as a PyTorch file ({type(err).__name__}: {lines[0][:120] if lines else 'no detail'})"


def model_state(model: torch.nn.Module) -> dict:
    """The part of a checkpoint that rebuilds the model: its spec and its weights."""
    module: Any = getattr(model, "module", model)  # unwrap DDP
    module = getattr(module, "_orig_mod", module)  # unwrap torch.compile
    return {"model_spec": module.spec.to_dict(), "model": module.state_dict()}


def load_model(source: str | Path | dict, map_location: str | torch.device = "cpu") -> GpufeedModel:
    """Rebuild a model (architecture from its spec, then weights) from a checkpoint or run folder.

    Raises:
        ValueError: The file is not a gpufeed checkpoint (it names the file and why: unreadable, a
            bare ``state_dict``, or the missing keys), or its weights hold NaN or inf (naming the first tensors that do).
    """
    where: str | Path
    if isinstance(source, dict):
        state, where = source, "checkpoint dict"
    else:
        where = find_checkpoint(source)
        state = read_checkpoint(where, map_location)
    missing = [key for key in ("model", "model_spec") if key not in state]
    if missing and state and all(isinstance(value, torch.Tensor) for value in state.values()):
        raise ValueError(
            f"{where} is not a gpufeed checkpoint: it is a bare state_dict ({len(state)} tensors, no model_spec to "
            "rebuild the network from), as torch.save(model.state_dict(), path) writes; save "
            "torch.save(gpufeed.models.model_state(model), path) instead, which adds the spec"
        )
    if missing:
        raise ValueError(f"{where} is not a gpufeed checkpoint: missing {', '.join(missing)}")
    model = model_from_spec(ModelSpec.from_dict(state["model_spec"]))
    model.load_state_dict(state["model"])
    names, count = nonfinite_weights(model)
    if count:  # it would answer NaN for every input, which export's parity check blamed on onnxruntime
        more = f" and {count - len(names)} more" if count > len(names) else ""
        raise ValueError(
            f"its weights hold NaN or inf ({', '.join(names)}{more}): the run that wrote it had diverged; "
            "take an earlier checkpoint"
        )
    return model


def nonfinite_weights(model: torch.nn.Module, most: int = 3) -> tuple[list[str], int]:
    """The first ``most`` floating-point parameters and buffers of ``model`` holding NaN or inf, and their count.

    In the checkpoint's order (module by module). One ``isfinite().all()`` per tensor on its
    device, read back once for all of them (one host wait on a GPU).
    """
    named = [(name, t) for name, t in model.state_dict(keep_vars=True).items() if t.is_floating_point()]
    if not named:
        return [], 0
    with torch.no_grad():
        finite = torch.stack([torch.isfinite(t.detach()).all() for _, t in named]).tolist()  # the one host read
    bad = [name for (name, _), ok in zip(named, finite, strict=True) if not ok]
    return bad[:most], len(bad)


def untrained_checkpoint(
    out: str | Path, classes: tuple[str, ...], size_px: SizePx, architecture: str = "resnet18"
) -> Path:
    """A checkpoint of a freshly initialised model, written as training writes one.

    For exporting and serving a model without training one first (the server benchmark, tests).
    The weights come from seed 0, so the same arguments write the same checkpoint.

    Args:
        out: The folder that receives the run folder ``untrained/``.
        classes: The class labels, one output per class.
        size_px: The model's input size.
        architecture: A registered model name.

    Returns:
        The checkpoint file, ``out/untrained/checkpoints/ckpt-000000000.pt``.
    """
    torch.manual_seed(0)
    model = create_model(architecture, num_classes=len(classes), size_px=size_px, labels=tuple(classes))
    path = checkpoint_path(Path(out) / "untrained", 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**model_state(model), "step": 0}, path)
    return path
