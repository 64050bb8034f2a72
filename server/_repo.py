"""Model repositories: a folder of model folders, or one model folder, each written by ``gpufeed export``.

::

    REPO/                      gpufeed serve --model-repo REPO
      cats/model.onnx          served as "cats" (the folder name is the model name)
      cats/model_card.json
      behaviour/...

    MODEL_DIR/                 gpufeed serve --model MODEL_DIR
      model.onnx               served under the card's "name"
      model_card.json

Folders whose names start with ``.`` or ``_`` are ignored; every other sub-folder of a repository
must be a valid model folder, and the server refuses to start otherwise (naming the folder and
the problem), so a typo never silently serves fewer models than intended.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

from gpufeed.models import CARD_FILE, ONNX_FILE, ModelCard, ModelCardError, read_model_card

__all__ = ["MODEL_NAME_PATTERN", "ModelEntry", "ModelRepoError", "load_repository"]

log = logging.getLogger("gpufeed.server")

# Names appear in URLs and as metric label values: keep them plain.
MODEL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class ModelRepoError(ValueError):
    """The model repository or a model folder in it cannot be served (the message says why)."""


@dataclass(frozen=True)
class ModelEntry:
    """A model to serve: its served name, folder and card."""

    name: str
    dir: Path
    card: ModelCard


def _entry(name: str, folder: Path) -> ModelEntry:
    if not MODEL_NAME_PATTERN.match(name):
        raise ModelRepoError(
            f"model name {name!r} (from {folder}) is not allowed: use letters, digits, '_', '.', '-' "
            "(at most 64, starting with a letter or digit)"
        )
    try:
        card = read_model_card(folder)
    except ModelCardError as err:
        raise ModelRepoError(str(err)) from None
    return ModelEntry(name, folder, card)


def load_repository(repo: str | Path | None = None, model: str | Path | None = None) -> list[ModelEntry]:
    """The models to serve, from a repository folder or a single model folder (exactly one).

    Raises:
        ModelRepoError: Missing folders, invalid cards, bad names, an empty repository, or both
            or neither argument given.
    """
    if model is not None and repo is None:
        folder = Path(model)
        try:
            card = read_model_card(folder)
        except ModelCardError as err:
            raise ModelRepoError(str(err)) from None
        return [_entry(card.name, folder)]
    if repo is None or model is not None:
        raise ModelRepoError("give exactly one of a model repository (--model-repo) or a model folder (--model)")
    root = Path(repo)
    if not root.is_dir():
        raise ModelRepoError(f"model repository {root} does not exist or is not a folder")
    if (root / CARD_FILE).is_file():
        raise ModelRepoError(
            f"{root} is a model folder, not a repository of them: serve it with --model {root}, "
            "or put it in a sub-folder of the repository"
        )
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    # A folder with neither file is not a model (notes/, a copy's scratch): one warning, not a
    # refusal, since on a shared volume one stray folder would stop every replica. A folder with
    # one of them is a model gone wrong, and _entry refuses it.
    strays = [f for f in folders if not (f / CARD_FILE).exists() and not (f / ONNX_FILE).exists()]
    if strays:
        log.warning(
            "model repository %s: %s hold(s) neither %s nor %s and are not served",
            root, ", ".join(f"{f.name}/" for f in strays), CARD_FILE, ONNX_FILE,
        )  # fmt: skip
    folders = [f for f in folders if f not in strays]
    if not folders:
        raise ModelRepoError(f"model repository {root} holds no model folders (each needs {CARD_FILE} and {ONNX_FILE})")
    return [_entry(folder.name, folder) for folder in folders]
