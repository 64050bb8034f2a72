"""Paths a data file names must stay inside the data's own folder, or a folder the user allowed.

A DeepEthogram project's ``record.yaml`` and a paired list file name other files. Read as they
are, ``/proc/self/environ``, ``../../secrets.csv`` or a symbolic link out of the folder would be
opened, and any error quoting them would print what they hold. So a named path must resolve inside
one of the :class:`Roots`: the project (or the list file's folder) and the folders of the config
key ``data.allowed_roots``. Each path is judged twice, and the first rule it breaks is named:

* ``absolute``: an absolute path outside every root;
* ``parent``: ``..`` steps lead outside every root (judged on the text, before any link);
* ``link``: the path is inside as written, but a symbolic link on the way leads outside (judged
  on the real path, every link resolved).

Inside a frame store the same holds for what the store itself points to: a frame folder's files
that are links, an HDF5 file's external links and virtual-dataset sources
(:func:`folder_link_problem`, :func:`hdf5_link_problem`, asked by each kind's
:meth:`~gpufeed.pipelines._frame_stores.FrameStore.link_problem`). Messages quote the path as written, cut to a few dozen characters,
and never anything read from it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufeed._text import quoted

__all__ = ["ALLOWED_ROOTS_KEY", "Roots", "folder_link_problem", "hdf5_link_problem"]

ALLOWED_ROOTS_KEY = "data.allowed_roots"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclass(frozen=True)
class Roots:
    """The folders named files may be in: ``(as written, absolute)`` and ``(every link resolved)``.

    Attributes:
        what: How messages call the first root (``"the project"``).
        lexical: Each root made absolute, links kept.
        real: Each root with every link resolved.
    """

    what: str
    lexical: tuple[str, ...]
    real: tuple[str, ...]

    @classmethod
    def of(cls, root: str | Path, what: str, allowed: Iterable[str | Path] = ()) -> Roots:
        """``root`` (described as ``what``) and the ``allowed`` folders (``data.allowed_roots``)."""
        folders = [root, *allowed]
        return cls(
            what,
            tuple(os.path.abspath(f) for f in folders),
            tuple(os.path.realpath(f) for f in folders),
        )

    @property
    def rule(self) -> str:
        """The rule, for the end of a message: where files must be."""
        more = "or in a folder of" if len(self.lexical) > 1 else "(more folders can be named in"
        return (
            f"files must be inside {self.lexical[0]} {more} {ALLOWED_ROOTS_KEY}{')' if len(self.lexical) == 1 else ''}"
        )

    def problem(self, written: str, base: str | Path) -> str | None:
        """Why ``written`` (a path as a file names it, relative to ``base``) may not be opened, or ``None``.

        The reason starts with the path as written, cut: ``"'/proc/self/environ', an absolute path
        outside the project; files must be inside /data/mice (more folders ...)"``.
        """
        joined = os.path.normpath(os.path.join(os.path.abspath(base), written))
        if not any(_inside(joined, root) for root in self.lexical):
            how = "an absolute path outside" if os.path.isabs(written) else "a path whose '..' steps lead outside"
        elif not self.holds_real(joined):
            how = "a path whose symbolic link leads outside"
        else:
            return None
        return f"{quoted(written)}, {how} {self.what}; {self.rule}"

    def holds_real(self, path: str | Path) -> bool:
        """Whether ``path``, every link resolved, is inside a root."""
        real = os.path.realpath(path)
        return any(_inside(real, root) for root in self.real)


def folder_link_problem(path: Path, roots: Roots) -> str | None:
    """Why a frame folder reaches outside ``roots`` (a frame that is a link out), or ``None``."""
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_symlink() and not roots.holds_real(entry.path):
                    return (
                        f"frame {quoted(entry.name)} is a symbolic link that leads outside {roots.what}; {roots.rule}"
                    )
    except OSError as err:
        return f"the frame folder cannot be listed: {err.strerror or err}"
    return None


def hdf5_link_problem(path: Path, roots: Roots, dataset_name: str) -> str | None:
    """Why an HDF5 frame file reaches outside ``roots`` (its frames dataset an external link or virtual source out)."""
    import h5py

    def outside(name: str) -> bool:
        # HDF5 looks an external file up beside the file that links to it (then elsewhere): judge it there.
        return name not in (".", "") and not roots.holds_real(os.path.join(path.parent, name))

    try:
        with h5py.File(path, "r") as handle:
            link = handle.get(dataset_name, getlink=True)
            if isinstance(link, h5py.ExternalLink) and outside(link.filename):
                return (
                    f"its '{dataset_name}' dataset is an external link to {quoted(link.filename)}, outside "
                    f"{roots.what}; {roots.rule}"
                )
            if isinstance(link, h5py.ExternalLink):
                return None  # inside: the store's own probe opens and judges the target
            dataset = handle.get(dataset_name)
            if isinstance(dataset, h5py.Dataset) and dataset.is_virtual:
                for source in dataset.virtual_sources():
                    if outside(source.file_name):
                        return (
                            f"its '{dataset_name}' dataset is virtual, reading {quoted(source.file_name)}, outside "
                            f"{roots.what}; {roots.rule}"
                        )
    except (OSError, ValueError):
        return None  # not readable as HDF5: the store's probe names that
    return None
