"""Which model wrote each output, so a resumed ``gpufeed predict`` keeps only what this model wrote.

An output being there says a run finished it, not which model's numbers it holds. So every output
folder holds a manifest, :data:`MANIFEST_FILE`, written atomically after each output
(:func:`gpufeed.core.write_json`), keyed by the output's file name (an HDF5 output:
``<file>/<group>``, one entry per model group):

.. code-block:: json

    {"format": "gpufeed predict manifest", "version": 1, "outputs": {
      "mouse1_predictions.csv": {
        "model": {"sha256": "93e4...", "of": "checkpoint", "labels": ["groom", "rear"],
                  "stride_frames": 1, "fit": "stretch", "hop_frames": 1},
        "source": "runs/a/checkpoints/ckpt-000000006.pt", "written": "2026-11-26T12:02:15Z"}}}

``model`` is the identity (:func:`model_identity`): the SHA-256 of what was loaded (the checkpoint
file, or an exported folder's ``model.onnx``; weights built in memory: their tensors), the class
names, and for videos the settings that change the numbers (the clip sampling and
``--hop-frames``). What only changes rounding (runtime, device, decoder, batch size) is left out,
so moving a run to another machine keeps its outputs. ``source`` and ``written`` are for people.

An output is kept only when its entry holds this run's identity; else it is scored again, with one
line per reason (:func:`log_rescored`). An entry that differs is removed before its output is
rewritten and the new one recorded after, so a run killed in between leaves an output with no
record (scored again next time), never another model's numbers under this model's record. An
unreadable manifest counts as empty: its outputs are scored again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from gpufeed.core import remove_stale_temps, write_json
from gpufeed.models import ONNX_FILE
from gpufeed.predict._export_cache import file_sha256
from gpufeed.predict._model import Predictor

__all__ = ["MANIFEST_FILE", "NO_RECORD", "Manifests", "explain", "log_rescored", "model_identity", "output_key"]

log = logging.getLogger("gpufeed.predict")

MANIFEST_FILE = ".gpufeed-predict.json"  # hidden: no video or image walk, nor DeepEthogram, takes it for data
_FORMAT = "gpufeed predict manifest"
_VERSION = 1
NO_RECORD = "no record of the model that wrote it"
_NAMES_SHOWN = 3


def model_identity(predictor: Predictor, **settings: Any) -> dict[str, Any]:
    """What an output's numbers depend on: the model's content, its class names, and ``settings``.

    Computed once per run (a checkpoint is hashed whole: about 0.1 s for 45 MB).

    Args:
        predictor: The model.
        **settings: What else changes the numbers (a clip model's sampling and hop), JSON values.
    """
    digest, of = _model_digest(predictor)
    return {"sha256": digest, "of": of, "labels": list(predictor.labels), **settings}


def _model_digest(predictor: Predictor) -> tuple[str, str]:
    """(SHA-256, what it is of): an exported folder's graph, a checkpoint file, else the weights in memory."""
    source = Path(predictor.source)
    if (source / ONNX_FILE).is_file():
        return file_sha256(source / ONNX_FILE), ONNX_FILE
    if source.is_file():
        return file_sha256(source), "checkpoint"
    # A Predictor built in Python: its weights are all there is (a checkpoint under onnxruntime keeps
    # PyTorch only until its first batch, but its source is a file, handled above).
    module = predictor._module if predictor._module is not None else predictor._reference
    digest = hashlib.sha256(type(module).__qualname__.encode())
    if module is not None:
        for name, tensor in sorted(module.state_dict().items()):
            digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest(), "weights"


def output_key(output: Path, group: str | None = None) -> str:
    """An output's key in its folder's manifest: its file name, ``<file>/<group>`` for an HDF5 group."""
    return f"{output.name}/{group}" if group else output.name


def _difference(held: Any, now: dict[str, Any], source: Any) -> str:
    """Why an entry's identity ``held`` is not ``now`` (as "<output> was <this>")."""
    if not isinstance(held, dict):
        return NO_RECORD
    if held.get("sha256") != now["sha256"]:
        return f"written by another model ({source})" if source else "written by another model"
    changed = [f"{k} {held.get(k)!r}, now {v!r}" for k, v in now.items() if held.get(k) != v]
    return "written by this model with other settings (" + "; ".join(changed) + ")"


def _read(path: Path, warn: bool = True) -> dict[str, Any]:
    """A manifest's entries; ``{}`` when it is missing or unreadable (``warn``: one line, its outputs are
    scored again)."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        if warn:
            log.warning("predict: %s is unreadable (%s): its outputs are scored again", path, type(err).__name__)
        return {}
    outputs = document.get("outputs") if isinstance(document, dict) else None
    if not isinstance(outputs, dict) or document.get("format") != _FORMAT:
        if warn:
            log.warning("predict: %s is not a gpufeed predict manifest: its outputs are scored again", path)
        return {}
    return outputs


class Manifests:
    """The manifests of the folders one run writes to, for one model (see the module docs).

    Args:
        identity: The run's :func:`model_identity`.
        source: What was loaded, as the entries name it.
    """

    def __init__(self, identity: dict[str, Any], source: Path | str) -> None:
        self.identity, self.source = identity, str(source)
        self._entries: dict[Path, dict[str, Any]] = {}

    def _folder(self, folder: Path) -> dict[str, Any]:
        if folder not in self._entries:
            self._entries[folder] = _read(folder / MANIFEST_FILE)
        return self._entries[folder]

    def problem(self, output: Path, key: str) -> str | None:
        """Why ``output`` is not this model's (:data:`NO_RECORD`, another model, other settings), or ``None``."""
        entry = self._folder(output.parent).get(key)
        if not isinstance(entry, dict):
            return NO_RECORD
        if entry.get("model") == self.identity:
            return None
        return _difference(entry.get("model"), self.identity, entry.get("source"))

    def forget(self, output: Path, key: str) -> None:
        """Remove ``key``'s entry when another identity wrote it: call before the output is rewritten.

        Raises:
            OSError: The manifest cannot be written (the output must not be rewritten then).
        """
        entry = self._folder(output.parent).get(key)
        if entry is not None and (not isinstance(entry, dict) or entry.get("model") != self.identity):
            self._update(output.parent, key, None)

    def record(self, output: Path, key: str) -> None:
        """Record that this model wrote ``output`` (after it is in place); a failure is one warning."""
        entry = {
            "model": self.identity,
            "source": self.source,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        try:
            self._update(output.parent, key, entry)
        except OSError as err:
            log.warning(
                "predict: cannot record %s in %s (%s): a later run scores it again",
                key,
                output.parent / MANIFEST_FILE,
                err.strerror or err,
            )

    def _update(self, folder: Path, key: str, entry: dict[str, Any] | None) -> None:
        """Set (``None``: remove) ``key`` in the folder's manifest, read afresh so another process's entries stay."""
        path = folder / MANIFEST_FILE
        entries = _read(path, warn=False)  # read afresh: said once already when unreadable
        if entry is None:
            entries.pop(key, None)
        else:
            entries[key] = entry
        remove_stale_temps(path)  # a killed run's half-written manifest
        write_json(path, {"format": _FORMAT, "version": _VERSION, "outputs": entries}, atomic=True)
        self._entries[folder] = entries


def explain(why: str) -> str:
    """A reason from :meth:`Manifests.problem` for a log line (:data:`NO_RECORD` says when that happens)."""
    return f"{why} (written before gpufeed kept {MANIFEST_FILE}, or copied without it)" if why == NO_RECORD else why


def log_rescored(reasons: dict[str, list[str]], part: str = "output", what: str = "video") -> None:
    """One line per reason existing outputs are scored again, naming the first few.

    Args:
        reasons: Why (:meth:`Manifests.problem`) -> the names of the videos (or images) it holds for.
        part: What of each is scored again (``output``, ``row``).
        what: What the names are (``video``, ``image``).
    """
    for why, names in reasons.items():
        shown = ", ".join(names[:_NAMES_SHOWN])
        shown += f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else ""
        count = f"1 {what}" if len(names) == 1 else f"{len(names)} {what}s"
        log.warning("predict: scoring again the %s of %s: %s: %s", part, count, explain(why), shown)
