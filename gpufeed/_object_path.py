"""Object-store locations (``s3://bucket/prefix/name``) that stand in for :class:`pathlib.Path`.

A dataset root may be a folder or an ``s3://`` URL. The indexes treat a root as a path: they join
names onto it (``root / "rgb"``), ask for ``.name``, ``.suffix`` and ``.parent``, and ask whether
something ``is_dir()`` or ``is_file()``. :class:`ObjectPath` answers the same questions for a key
in a bucket, so an index reads a bucket through the code that reads a folder. ``pathlib`` cannot
hold a URL (``Path("s3://b/k")`` is ``s3:/b/k``), so :func:`data_path` picks the kind from the text.

What is a folder in a bucket: a prefix that some key continues with ``/``. A key is normalised
like a POSIX path (empty and ``.`` parts dropped, ``..`` taken back lexically); a ``..`` that climbs
above the bucket is refused, so an ``ObjectPath`` always names a key of its own bucket.

This module stays light (standard library only): the config parses URLs with it. The reads go
through :mod:`gpufeed._s3`, imported when the first one is made.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, Any, TypeAlias

from gpufeed._text import quoted

if TYPE_CHECKING:
    from gpufeed._s3 import ObjectStat

__all__ = ["OBJECT_SCHEMES", "DataPath", "ObjectPath", "data_path", "is_object_url", "url_scheme"]

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

    @classmethod
    def _make(cls, bucket: str, key: str) -> ObjectPath:
        new = object.__new__(cls)
        object.__setattr__(new, "bucket", bucket)
        object.__setattr__(new, "key", key)
        return new

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ObjectPath is immutable")

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return ObjectPath, (str(self),)  # DALI's worker processes receive paths pickled

    # -- what it names ------------------------------------------------------------------------
    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and (self.bucket, self.key) == (other.bucket, other.key)

    def __hash__(self) -> int:
        return hash(("s3", self.bucket, self.key))

    def __lt__(self, other: ObjectPath) -> bool:
        return (self.bucket, self.key) < (other.bucket, other.key)

    def __truediv__(self, other: str | PurePath) -> ObjectPath:
        return self.joinpath(other)

    def joinpath(self, *parts: str | PurePath) -> ObjectPath:
        """This path with ``parts`` appended (a part starting with ``/`` is still taken as relative)."""
        key = self.key
        for part in parts:
            text = str(part).replace("\\", "/") if isinstance(part, PurePath) else str(part)
            key = posixpath.join(key, text.lstrip("/")) if key else text.lstrip("/")
        return ObjectPath._make(self.bucket, _normal_key(key, f"{self}/{'/'.join(map(str, parts))}"))

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
    def parent(self) -> ObjectPath:
        """The enclosing prefix (the bucket is its own parent, as ``/`` is)."""
        return ObjectPath._make(self.bucket, posixpath.dirname(self.key))

    @property
    def parts(self) -> tuple[str, ...]:
        return (f"s3://{self.bucket}", *(p for p in self.key.split("/") if p))

    def with_name(self, name: str) -> ObjectPath:
        if not self.name:
            raise ValueError(f"{self} has an empty name")
        return self.parent / name

    def with_suffix(self, suffix: str) -> ObjectPath:
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

    def absolute(self) -> ObjectPath:
        return self

    def resolve(self, strict: bool = False) -> ObjectPath:
        """Itself: an object store has no links to resolve (``strict`` is accepted for ``Path``'s signature)."""
        return self

    def expanduser(self) -> ObjectPath:
        return self

    def as_posix(self) -> str:
        return str(self)

    @property
    def url(self) -> str:
        """``s3://bucket/key``."""
        return str(self)

    # -- reads: through gpufeed._s3 -----------------------------------------------------------
    def stat(self) -> ObjectStat:
        """The object's size and version (``st_size``, ``st_mtime_ns``, ``etag``).

        Raises:
            OSError: It does not exist (``FileNotFoundError``) or cannot be reached; the message
                names the URL, never a credential.
        """
        from gpufeed import _s3  # Deferred: boto3 loads only when a bucket is read

        return _s3.stat(self)

    def exists(self) -> bool:
        return self.is_file() or self.is_dir()

    def is_file(self) -> bool:
        """Whether an object has exactly this key."""
        from gpufeed import _s3  # Deferred: boto3 loads only when a bucket is read

        return bool(self.key) and _s3.lookup(self) is not None

    def is_dir(self) -> bool:
        """Whether some key continues this one with ``/`` (the bucket itself: whether it can be listed)."""
        from gpufeed import _s3  # Deferred: boto3 loads only when a bucket is read

        return _s3.has_children(self)

    def iterdir(self) -> Iterator[ObjectPath]:
        """The keys and sub-prefixes one level below this prefix, sorted."""
        from gpufeed import _s3  # Deferred: boto3 loads only when a bucket is read

        folders, files = _s3.list_level(self)
        return iter(sorted([self / name for name in folders] + [self / name for name in files]))

    def read_bytes(self) -> bytes:
        from gpufeed import _s3  # Deferred: boto3 loads only when a bucket is read

        return _s3.read_object(self)

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def open(self, mode: str = "rb"):
        """A read-only, seekable binary file of the object, read by ranges (:class:`gpufeed._ranged.RangedFile`).

        Raises:
            ValueError: A mode other than ``"rb"`` / ``"r"``: objects are read, never written here.
        """
        if mode not in ("rb", "r"):
            raise ValueError(f"{self}: mode {mode!r} is not allowed; objects open read-only ('rb')")
        from gpufeed._ranged import open_ranged  # Deferred: boto3 loads only when a bucket is read

        file = open_ranged(self)
        if mode == "r":
            import io

            return io.TextIOWrapper(file, encoding="utf-8")  # type: ignore[arg-type]  # RangedFile is a RawIOBase
        return file


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


# Where a dataset can be: a local path or a key prefix in a bucket.
DataPath: TypeAlias = Path | ObjectPath


def data_path(value: str | PurePath | ObjectPath) -> DataPath:
    """``value`` as an :class:`ObjectPath` when it is an ``s3://`` URL, else as a :class:`~pathlib.Path`.

    Raises:
        ValueError: A URL of a scheme gpufeed does not read (``gs://``, ``http://``), or a bad S3 URL.
    """
    if isinstance(value, ObjectPath):
        return value
    if isinstance(value, PurePath):
        return Path(value)
    text = str(value)
    scheme = url_scheme(text)
    if scheme is None:
        return Path(text)
    if scheme in OBJECT_SCHEMES:
        return ObjectPath(text)
    raise ValueError(f"{quoted(text)}: {scheme}:// is not read here; supported: local paths and s3://bucket/prefix")
