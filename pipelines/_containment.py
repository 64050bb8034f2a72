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
:meth:`~gpufeed.pipelines._store_kinds.FrameStore.link_problem`). Messages quote the path as
written, cut to a few dozen characters, and never anything read from it.

**Object storage.** A root may be ``s3://bucket/prefix``: a named path is then a key, and it must
lie under the prefix of a root (whole key parts: ``s3://b/data`` does not hold ``s3://b/data2``).
The ``absolute`` rule covers a local path or a URL outside every root, the ``parent`` rule ``..``
steps out of the prefix (or above the bucket); an object store has no links. An HDF5 file read
from object storage may have no external link or virtual source at all: HDF5 would look for their
files on the local disk, outside the bucket.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpufeed.core import ObjectPath, is_object_url, media_source, quoted

__all__ = ["ALLOWED_ROOTS_KEY", "Roots", "folder_link_problem", "hdf5_link_problem"]

ALLOWED_ROOTS_KEY = "data.allowed_roots"


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _root_text(folder: str | Path | ObjectPath, local) -> str:
    """A root as the checks compare it: an object's URL, or ``local(folder)`` (absolute or real)."""
    if isinstance(folder, ObjectPath) or is_object_url(folder):
        return str(ObjectPath(str(folder)))
    return local(folder)


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
    def of(cls, root: str | Path | ObjectPath, what: str, allowed: Iterable[str | Path | ObjectPath] = ()) -> Roots:
        """``root`` (described as ``what``) and the ``allowed`` folders (``data.allowed_roots``); either may be ``s3://``."""
        folders = [root, *allowed]
        return cls(
            what,
            tuple(_root_text(f, os.path.abspath) for f in folders),
            tuple(_root_text(f, os.path.realpath) for f in folders),
        )

    @property
    def rule(self) -> str:
        """The rule, for the end of a message: where files must be."""
        more = "or in a folder of" if len(self.lexical) > 1 else "(more folders can be named in"
        return (
            f"files must be inside {self.lexical[0]} {more} {ALLOWED_ROOTS_KEY}{')' if len(self.lexical) == 1 else ''}"
        )

    def problem(self, written: str, base: str | Path | ObjectPath) -> str | None:
        """Why ``written`` (a path as a file names it, relative to ``base``) may not be opened, or ``None``.

        The reason starts with the path as written, cut: ``"'/proc/self/environ', an absolute path
        outside the project; files must be inside /data/mice (more folders ...)"``.
        """
        if isinstance(base, ObjectPath) or is_object_url(base) or is_object_url(written):
            return self._object_problem(written, base)
        joined = os.path.normpath(os.path.join(os.path.abspath(base), written))
        if not any(_inside(joined, root) for root in self.lexical):
            how = "an absolute path outside" if os.path.isabs(written) else "a path whose '..' steps lead outside"
        elif not self.holds_real(joined):
            how = "a path whose symbolic link leads outside"
        else:
            return None
        return f"{quoted(written)}, {how} {self.what}; {self.rule}"

    def _object_problem(self, written: str, base: str | Path | ObjectPath) -> str | None:
        """:meth:`problem` where ``base`` or ``written`` is in object storage (see the module docs)."""
        if is_object_url(written) or os.path.isabs(written):
            how = "a URL outside" if is_object_url(written) else "an absolute path outside"
            try:
                joined = str(ObjectPath(written)) if is_object_url(written) else os.path.normpath(written)
            except ValueError:
                return f"{quoted(written)}, {how} {self.what}; {self.rule}"
        else:
            how = "a path whose '..' steps lead outside"
            try:
                joined = str(ObjectPath(str(base)) / written)
            except ValueError:  # '..' above the bucket
                return f"{quoted(written)}, {how} {self.what}; {self.rule}"
        if any(_inside(joined, root) for root in self.lexical):
            return None
        return f"{quoted(written)}, {how} {self.what}; {self.rule}"

    def holds_real(self, path: str | Path | ObjectPath) -> bool:
        """Whether ``path``, every link resolved, is inside a root (a key: under a root's prefix)."""
        if isinstance(path, ObjectPath) or is_object_url(path):
            return any(_inside(str(ObjectPath(str(path))), root) for root in self.lexical)
        real = os.path.realpath(path)
        return any(_inside(real, root) for root in self.real)


def folder_link_problem(path: Path | ObjectPath, roots: Roots) -> str | None:
    """Why a frame folder reaches outside ``roots`` (a frame that is a link out), or ``None`` (always for a prefix)."""
    if isinstance(path, ObjectPath) or is_object_url(path):
        return None  # an object store has no links
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


def hdf5_link_problem(path: Path | ObjectPath, roots: Roots, dataset_name: str) -> str | None:
    """Why an HDF5 frame file reaches outside ``roots`` (its frames dataset an external link or virtual source out).

    A file in object storage may not link out at all (see the module docs).
    """
    if isinstance(path, ObjectPath) or is_object_url(path):
        return _object_hdf5_link_problem(ObjectPath(str(path)), dataset_name)
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


def _object_hdf5_link_problem(path: ObjectPath, dataset_name: str) -> str | None:
    import h5py

    try:
        with h5py.File(media_source(path), "r") as handle:
            link = handle.get(dataset_name, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                return (
                    f"its '{dataset_name}' dataset is an external link to {quoted(link.filename)}; a file in object "
                    "storage may not link out (HDF5 would open it on the local disk)"
                )
            dataset = handle.get(dataset_name)
            if isinstance(dataset, h5py.Dataset) and dataset.is_virtual:
                return (
                    f"its '{dataset_name}' dataset is virtual; a file in object storage may not read other files "
                    "(HDF5 would open them on the local disk)"
                )
    except (OSError, ValueError):
        return None  # not readable as HDF5: the store's probe names that
    return None
