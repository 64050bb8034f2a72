"""Object-store locations (``s3://bucket/prefix/name``) that stand in for :class:`pathlib.Path`.

A dataset root may be a folder or an ``s3://`` URL. The indexes treat a root as a path: they join
names onto it (``root / "rgb"``), ask for ``.name``, ``.suffix`` and ``.parent``. :class:`ObjectPath`
answers those for a key in a bucket; ``pathlib`` cannot hold a URL (``Path("s3://b/k")`` is
``s3:/b/k``). The questions that read the bucket (``is_dir()``, ``read_text()``, ``open()``) are
:class:`gpufeed.core._storage.S3Path`'s, a subclass, which :func:`gpufeed.core._storage.data_path` makes.

What is a folder in a bucket: a prefix that some key continues with ``/``. A key is normalised
like a POSIX path (empty and ``.`` parts dropped, ``..`` taken back lexically); a ``..`` that climbs
above the bucket is refused, so an ``ObjectPath`` always names a key of its own bucket.

This module stays light (standard library only) and reads nothing: the config parses URLs with it.
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
from pathlib import PurePath, PurePosixPath
from typing import Any, Self

from gpufeed.core._text import quoted

__all__ = ["OBJECT_SCHEMES", "ObjectPath", "is_object_url", "key_problem", "nameable_key", "url_scheme"]

OBJECT_SCHEMES = ("s3",)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# S3's bucket naming rules (the common subset every S3-compatible server accepts).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def url_scheme(text: str) -> str | None:
    """The scheme of ``text`` when it is written as a URL (``"s3"`` for ``s3://b/k``), else ``None``."""
    match = _SCHEME.match(text)
    return match.group(1).lower() if match else None


def is_object_url(value: object) -> bool:
    """Whether ``value`` is an :class:`ObjectPath` or a string naming one (``s3://...``)."""
    return isinstance(value, ObjectPath) or (isinstance(value, str) and url_scheme(value) in OBJECT_SCHEMES)


class ObjectPath:
    """A key (or a prefix, standing for a folder) in an S3 bucket, used where a :class:`~pathlib.Path` is.

    Args:
        url: ``s3://bucket`` or ``s3://bucket/key``.

    Raises:
        ValueError: Not an ``s3://`` URL, a bucket name S3 refuses, or a ``..`` above the bucket.
    """

    __slots__ = ("bucket", "key")
    bucket: str
    key: str

    def __init__(self, url: str) -> None:
        scheme = url_scheme(url)
        if scheme not in OBJECT_SCHEMES:
            raise ValueError(f"{quoted(url)} is not an object-store URL; supported: s3://bucket/prefix")
        rest = url[len(scheme) + 3 :]
        bucket, _, key = rest.partition("/")
        if not _BUCKET.match(bucket):
            raise ValueError(
                f"{quoted(url)}: {quoted(bucket)} is not a bucket name (3-63 lowercase letters, digits, '.' and '-')"
            )
        object.__setattr__(self, "bucket", bucket)
        object.__setattr__(self, "key", _normal_key(key, url))

    def _make(self, bucket: str, key: str) -> Self:
        new = object.__new__(type(self))  # a subclass joins into its own kind (gpufeed.core._storage.S3Path)
        object.__setattr__(new, "bucket", bucket)
        object.__setattr__(new, "key", key)
        return new

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ObjectPath is immutable")

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return type(self), (str(self),)  # DALI's worker processes receive paths pickled

    # -- what it names ------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and (self.bucket, self.key) == (other.bucket, other.key)

    def __hash__(self) -> int:
        return hash(("s3", self.bucket, self.key))

    def __lt__(self, other: ObjectPath) -> bool:
        return (self.bucket, self.key) < (other.bucket, other.key)

    def __truediv__(self, other: str | PurePath) -> Self:
        return self.joinpath(other)

    def joinpath(self, *parts: str | PurePath) -> Self:
        """This path with ``parts`` appended (a part starting with ``/`` is still taken as relative)."""
        key = self.key
        for part in parts:
            text = str(part).replace("\\", "/") if isinstance(part, PurePath) else str(part)
            key = posixpath.join(key, text.lstrip("/")) if key else text.lstrip("/")
        return self._make(self.bucket, _normal_key(key, f"{self}/{'/'.join(map(str, parts))}"))

    @property
    def name(self) -> str:
        """The last part of the key (``""`` for the bucket itself)."""
        return posixpath.basename(self.key)

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix if self.name else ""

    @property
    def suffixes(self) -> list[str]:
        return PurePosixPath(self.name).suffixes if self.name else []

    @property
    def stem(self) -> str:
        return PurePosixPath(self.name).stem if self.name else ""

    @property
    def parent(self) -> Self:
        """The enclosing prefix (the bucket is its own parent, as ``/`` is)."""
        return self._make(self.bucket, posixpath.dirname(self.key))

    @property
    def parts(self) -> tuple[str, ...]:
        return (f"s3://{self.bucket}", *(p for p in self.key.split("/") if p))

    def with_name(self, name: str) -> Self:
        if not self.name:
            raise ValueError(f"{self} has an empty name")
        return self.parent / name

    def with_suffix(self, suffix: str) -> Self:
        return self.with_name(str(PurePosixPath(self.name).with_suffix(suffix)))

    def relative_to(self, other: ObjectPath | str) -> PurePosixPath:
        """The key below ``other``, as a relative POSIX path.

        Raises:
            ValueError: This path is not inside ``other``.
        """
        base = other if isinstance(other, ObjectPath) else ObjectPath(str(other))
        if not self.is_relative_to(base):
            raise ValueError(f"{self} is not inside {base}")
        return PurePosixPath(self.key[len(base.key) :].lstrip("/") or ".")

    def is_relative_to(self, other: ObjectPath) -> bool:
        """Whether this path is ``other`` or lies under it (whole key parts, not a prefix of a name)."""
        if not isinstance(other, ObjectPath) or other.bucket != self.bucket:
            return False
        return not other.key or self.key == other.key or self.key.startswith(other.key + "/")

    def is_absolute(self) -> bool:
        return True

    def absolute(self) -> Self:
        return self

    def resolve(self, strict: bool = False) -> Self:
        """Itself: an object store has no links to resolve (``strict`` is accepted for ``Path``'s signature)."""
        return self

    def expanduser(self) -> Self:
        return self

    def as_posix(self) -> str:
        return str(self)

    @property
    def url(self) -> str:
        """``s3://bucket/key``."""
        return str(self)


def key_problem(key: str) -> str | None:
    """What keeps a stored key from being named by an :class:`ObjectPath`, or ``None`` when nothing does.

    S3 stores ``data//a.mp4`` and ``videos/../../x.mp4`` as ordinary keys, but an ``ObjectPath``
    normalises its key (see the module docs), so such a key would be read as another object (or, in
    a listing, as the prefix itself or a folder outside it). Listings skip these keys.

    Returns:
        ``"has an empty part"``, ``"has a '.' part"`` or ``"has a '..' part"``.
    """
    parts = key.split("/")
    if "" in parts:
        return "has an empty part"
    if "." in parts:
        return "has a '.' part"
    if ".." in parts:
        return "has a '..' part"
    return None


log = logging.getLogger("gpufeed")
_warned: set[tuple[str, str]] = set()  # (bucket, key) of the unnameable keys already named in a warning
_warned_lock = threading.Lock()
# A bucket written by a tool that doubles slashes can hold millions of such keys: past this many,
# one more line says so and the rest go unnamed (the set, and the log, stay bounded).
_WARNED_MAX = 1000


def nameable_key(bucket: str, key: str, kind: str = "key") -> bool:
    """Whether a listed ``key`` (``kind`` ``"key prefix"``: a common prefix, its ``/`` kept) can be read as itself.

    If not, it is named once in a warning: S3 stores such a key, but an :class:`ObjectPath` of it
    would name another object (:func:`key_problem`), so listings leave it out.
    """
    problem = key_problem(key.removesuffix("/") if kind != "key" else key)
    if problem is None:
        return True
    with _warned_lock:
        first = (bucket, key) not in _warned and len(_warned) <= _WARNED_MAX
        if first:
            _warned.add((bucket, key))
        last = first and len(_warned) > _WARNED_MAX
    if last:
        log.warning("more keys gpufeed cannot address (as %s of s3://%s); skipped, not named", quoted(key), bucket)
    elif first:
        log.warning("%s %s of s3://%s %s; gpufeed cannot address it, skipped", kind, quoted(key), bucket, problem)
    return False


def _normal_key(key: str, url: str) -> str:
    parts: list[str] = []
    for part in key.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise ValueError(f"{quoted(url)}: '..' climbs above the bucket")
            parts.pop()
            continue
        parts.append(part)
    return "/".join(parts)
