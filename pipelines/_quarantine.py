"""Quarantine lists: files to leave out of every split, as ``gpufeed check --quarantine`` writes them.

A quarantine file holds one path per line; blank lines and lines starting with ``#`` are ignored.
Relative paths are relative to the quarantine file's folder (``gpufeed check`` writes absolute
ones). A dataset file matches an entry when both name the same file: compared as absolute paths,
and again with symlinks in their folders resolved, so a dataset reached through a linked folder
still matches. The loaders (``loader.quarantine_file``) leave matching files out before reading
anything and count them as skipped; a quarantined file is never an error, whatever
``loader.on_bad_sample`` says.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufeed.core import ObjectPath, is_object_url, quoted
from gpufeed.pipelines._errors import DatasetError
from gpufeed.pipelines._list_text import read_list_text

__all__ = ["Quarantine", "quarantined_ids", "read_quarantine"]

log = logging.getLogger("gpufeed")

# `gpufeed check` prints findings as "  [image] path: reason"; a saved table is not a quarantine list.
_TABLE_LINE = re.compile(r"^\s*\[[a-z]+\] ")


def _real_dir_form(path: str, cache: dict[str, str]) -> str:
    """``path`` with its folder's symlinks resolved (one realpath per folder, not per file)."""
    folder, name = os.path.split(path)
    real = cache.get(folder)
    if real is None:
        real = cache[folder] = os.path.realpath(folder)
    return os.path.join(real, name)


@dataclass(frozen=True)
class Quarantine:
    """The files a quarantine list names.

    Attributes:
        source: The quarantine file.
        entries: The listed paths, absolute and normalised, in file order.
    """

    source: str
    entries: tuple[str, ...]

    @property
    def reason(self) -> str:
        """Why a matching sample is left out, as the loaders record it."""
        return f"quarantined: listed in {self.source}"

    def ids_in(self, paths: Sequence[str]) -> list[int]:
        """Positions in ``paths`` (a dataset's files) of the files this list names."""
        if not self.entries:
            return []
        cache: dict[str, str] = {}
        listed = set(self.entries) | {_real_dir_form(p, cache) for p in self.entries if not is_object_url(p)}
        found = []
        for i, path in enumerate(paths):
            if is_object_url(path):  # a key: no links to resolve, its text is its identity
                if str(ObjectPath(path)) in listed:
                    found.append(i)
                continue
            absolute = os.path.normpath(os.path.abspath(path))
            if absolute in listed or _real_dir_form(absolute, cache) in listed:
                found.append(i)
        return found


def read_quarantine(path: str | Path) -> Quarantine:
    """Read a quarantine list (see the module docs).

    Raises:
        DatasetError: The file is missing, unreadable or not text, or a line is not a path (a
            control character, or a line of ``gpufeed check``'s printed table); the message names
            the file, the line and what is wrong.
    """
    path = Path(path)
    where = f"quarantine file {path} (loader.quarantine_file)"
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise DatasetError(f"{where} {what}; 'gpufeed check DATA --quarantine {path}' writes one")
    try:
        text = read_list_text(path)  # a Windows editor's byte-order mark dropped
    except UnicodeDecodeError as err:
        raise DatasetError(f"{where} is not UTF-8 text (byte {err.start}): expected one path per line") from None
    except OSError as err:
        raise DatasetError(f"{where} cannot be read: {err.strerror or err}") from None
    base = path.resolve().parent
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        if any(ord(c) < 32 for c in entry):
            raise DatasetError(f"{path}:{number}: not a path (it holds a control character): {quoted(entry)}")
        if _TABLE_LINE.match(line) and not os.path.exists(entry):
            raise DatasetError(
                f"{path}:{number}: looks like a line of 'gpufeed check' output ({entry[:60]!r}), not a path; "
                "write the list with 'gpufeed check DATA --quarantine FILE'"
            )
        if is_object_url(entry):
            try:
                entries.append(str(ObjectPath(entry)))
            except ValueError as err:
                raise DatasetError(f"{path}:{number}: {err}") from None
            continue
        full = entry if os.path.isabs(entry) else os.path.join(base, entry)
        entries.append(os.path.normpath(full))
    return Quarantine(str(path), tuple(entries))


def quarantined_ids(paths: Sequence[str], quarantine_file, source: str) -> dict[int, str]:
    """Ids (positions in ``paths``) that ``loader.quarantine_file`` lists, with the reason (empty without one)."""
    if quarantine_file is None:
        return {}
    quarantine = read_quarantine(quarantine_file)
    found = {i: quarantine.reason for i in quarantine.ids_in(paths)}
    if found:
        log.info("leaving out %d quarantined file(s) of %s (listed in %s)", len(found), source, quarantine.source)
    return found
