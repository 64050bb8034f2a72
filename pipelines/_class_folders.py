"""Class folders: which files of a split's class folders are read, and which classes are left empty.

Only ``.jpg``, ``.jpeg`` and ``.png`` files are read from class folders; other files are ignored
(``gpufeed check`` lists each), and hidden files and folders (``.DS_Store``, macOS's ``._*``) are
skipped without a word. A class folder of WebP photos, or an empty one, used to train silently as
a class with no sample: two classes, "accuracy 1.000", and a model that can never answer the
empty one. So the walk records each class that ends up without an image and what its folder holds
instead; ``gpufeed check`` reports it as a problem, a training loader refuses it and an
evaluation loader warns (:func:`announce_split`), and a loader logs the files it ignores as one
line with their count, extensions and a few examples.

Why the refusal is the training loader's and not the index's: the index does not know which split
it is. A class that ``data.classes`` names may be missing from the validation split (evaluation
then measures the classes it has), while a class with no training sample cannot be learned.
"""

from __future__ import annotations

import logging
import posixpath
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpufeed.core import DataPath, join, quoted, walk
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._once import first_time

__all__ = ["IMAGE_EXTENSIONS", "ClassFolders", "EmptyClass", "announce_split", "extensions", "walk_class_folders"]

log = logging.getLogger("gpufeed")

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
IMAGE_KINDS = ".jpg/.jpeg/.png"
_EXAMPLES = 3  # paths named in the ignored-files warning; `gpufeed check` lists every one


@dataclass(frozen=True)
class EmptyClass:
    """A class of the split with no image to read.

    Attributes:
        name: The class name.
        folder: Its class folder (which may not exist).
        holds: What the folder holds instead (``"24 other files ignored: .webp"``, ``"it is empty"``);
            ``None`` when there is no such folder (a class named in ``classes`` only).
    """

    name: str
    folder: str
    holds: str | None

    def sentence(self) -> str:
        """One clause naming the class, its folder and what is there instead of images."""
        if self.holds is None:
            return f"class {quoted(self.name)} has no folder {self.folder}"
        return f"class folder {self.folder} holds no {IMAGE_KINDS} image ({self.holds})"


@dataclass
class ClassFolders:
    """What :func:`walk_class_folders` found: the files to index and what was left out."""

    paths: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    problems: dict[int, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    empty: list[EmptyClass] = field(default_factory=list)


def extensions(paths: Sequence[str]) -> str:
    """The extensions of ``paths``, most common first: ``".webp"``, or ``".webp (20), .gif (4)"``."""
    counts = Counter(posixpath.splitext(posixpath.basename(p))[1].lower() or "no extension" for p in paths)
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{ext} ({n})" for ext, n in counts.most_common())


def walk_class_folders(root: DataPath, folders: Sequence[str], names: tuple[str, ...]) -> ClassFolders:
    """Index ``root/<folder>/**`` for each class folder: its images, in sorted order, labelled by ``names``.

    A folder not in ``names`` gives its images an unknown-label problem; a class of ``names`` with
    no image under its folder (or no folder) is recorded in ``empty``.
    """
    found = ClassFolders()
    for folder in folders:
        label = names.index(folder) if folder in names else -1
        first_image, first_ignored, hidden = len(found.paths), len(found.ignored), 0
        for dirpath, dirnames, filenames in walk(root / folder):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith("."):
                    hidden += 1
                    continue
                full = join(dirpath, name)
                if not name.lower().endswith(IMAGE_EXTENSIONS):
                    found.ignored.append(full)
                    continue
                if label < 0:
                    found.problems[len(found.paths)] = (
                        f"unknown label: folder '{folder}' is not one of the classes {list(names)}"
                    )
                found.paths.append(full)
                found.labels.append(label)
        if label >= 0 and len(found.paths) == first_image:
            others = found.ignored[first_ignored:]
            holds = (
                f"{len(others)} other file(s) ignored: {extensions(others)}"
                if others
                else ("only hidden files, which are skipped" if hidden else "it is empty")
            )
            found.empty.append(EmptyClass(folder, join(root, folder), holds))
    found.empty += [EmptyClass(name, join(root, name), None) for name in names if name not in folders]
    found.empty.sort(key=lambda e: names.index(e.name))
    return found


def _ignored_line(ignored: Sequence[str], source: str) -> str:
    shown = ", ".join(ignored[:_EXAMPLES]) + (
        f" and {len(ignored) - _EXAMPLES} more" if len(ignored) > _EXAMPLES else ""
    )
    return (
        f"{len(ignored)} file(s) in {source} are not {IMAGE_KINDS} images and are ignored "
        f"({extensions(ignored)}): {shown}; 'gpufeed check' lists them"
    )


def announce_split(dataset, train: bool) -> None:
    """Say what a loader leaves out of ``dataset`` (an :class:`~gpufeed.pipelines.ImageDataset`).

    Logs one warning for the files ignored for their extension, once a process for a source. A class with no image is an error
    for a training loader (it cannot be learned) and a warning for an evaluation loader when its
    folder exists (a class named in ``classes`` and absent from a validation split is how such a
    split is described, so it passes in silence).

    Raises:
        DatasetError: ``train`` and a class has no image; the message names each such class and its folder.
    """
    role = "train" if train else "eval"
    if dataset.ignored and first_time("ignored files", (dataset.source, tuple(dataset.ignored))):
        log.warning("%s loader: %s", role, _ignored_line(dataset.ignored, dataset.source))
    empty = getattr(dataset, "empty_classes", ())
    if train and empty:
        said = "; ".join(e.sentence() for e in empty)
        raise DatasetError(
            f"{dataset.source}: {len(empty)} class(es) with no image to train on: {said}; a class without "
            f"samples cannot be learned: add {IMAGE_KINDS} images to each (convert other formats), or leave the "
            "class out (remove its folder, or its name from data.classes)"
        )
    present = [e for e in empty if e.holds is not None]
    if present:
        said = "; ".join(e.sentence() for e in present)
        log.warning("%s loader: %s: %s; evaluation measures the other classes", role, dataset.source, said)
